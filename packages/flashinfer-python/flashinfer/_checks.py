"""Argument checks shared by the public ops.

Each raises ``ValueError`` naming the argument, what was expected and what was received. Ops run
their shape/dtype checks first and the device check last, so every check can be exercised on CPU
tensors without a GPU, and nothing compiles before the arguments are known to be good.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional, Sequence

import torch

from .utils import device_support_pdl

HALF_DTYPES = (torch.float16, torch.bfloat16)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
#: ``backend=`` of the ops that cubins serve: "auto" is the JIT module, "cubin" the kernel binary
#: of the pinned release, loaded through the CUDA driver. Here and not in flashinfer.artifacts,
#: whose import (the repository client) the first call on the default backend must not pay for.
BACKENDS = ("auto", "cubin")


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(x: object, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_cuda(x: torch.Tensor, name: str) -> None:
    check_cuda_device(x.device, name)


def check_cuda_device(device: torch.device, name: str) -> None:
    if device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got a tensor on {device}")


def check_same_device(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str) -> None:
    if a.device != b.device:
        raise ValueError(f"{b_name} must be on {a.device} like {a_name}, got {b.device}")


def check_dtype(x: torch.Tensor, name: str, allowed: Sequence[torch.dtype]) -> None:
    if x.dtype not in allowed:
        raise ValueError(f"{name} must be {_names(allowed)}, got {str(x.dtype).replace('torch.', '')}")


def check_same_dtype(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str) -> None:
    if a.dtype != b.dtype:
        raise ValueError(f"{b_name} must have the dtype of {a_name} ({a.dtype}), got {b.dtype}")


def check_ndim(x: torch.Tensor, name: str, allowed: Sequence[int]) -> None:
    if x.dim() not in allowed:
        want = " or ".join(f"{n}-D" for n in allowed)
        raise ValueError(f"{name} must be {want}, got shape {tuple(x.shape)}")


def check_shape(x: torch.Tensor, name: str, shape: Sequence[int]) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")


def check_last_dim_contiguous(x: torch.Tensor, name: str) -> None:
    if x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension, got strides {tuple(x.stride())}"
        )


def check_out(
    out: torch.Tensor,
    name: str,
    *,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Check a caller-given output tensor against the shape, dtype and device it must have."""
    check_tensor(out, name)
    check_shape(out, name, shape)
    if out.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"{name} must be on {device}, got {out.device}")


#: torch.device -> PDL default, filled by resolve_pdl (a dict lookup is the whole per-call cost).
_PDL_DEFAULT: Dict[torch.device, bool] = {}


def resolve_pdl(enable_pdl: Optional[bool], device: torch.device) -> bool:
    """``None`` means on iff the device supports Programmatic Dependent Launch (SM90+)."""
    if enable_pdl is None:
        pdl = _PDL_DEFAULT.get(device)
        if pdl is None:
            pdl = device_support_pdl(device)
            if isinstance(device, torch.device) and device.index is not None:  # a tensor's
                _PDL_DEFAULT[device] = pdl
        return pdl
    return bool(enable_pdl)


class ModuleFunctions:
    """The FFI functions of one JIT module, each looked up once.

    ``fns(name)`` (the checked path) loads the module through ``get_module`` on first use and
    remembers the function; ``fns.loaded`` holds only what such calls have fetched, so a fast
    path that finds its function there never compiles or loads anything.

    The fast paths of the small ops rest on one rule: **the binding checks everything the
    Python checks do** (every check is repeated in ``csrc/<op>.cu`` with a typed error). A fast
    path calls the binding directly with the arguments as given; if anything raises, the op
    runs its checked path from the start, which raises the same error as before (or, for input
    the fast path does not take, e.g. int64 metadata or a non-viewable output, does the
    conversion). Nothing is launched before the binding's checks pass, so the retry is safe.
    """

    def __init__(self, get_module: Callable[[], Any]) -> None:
        self._get_module = get_module
        self.loaded: Dict[str, Any] = {}

    def __call__(self, name: str) -> Any:
        fn = self.loaded.get(name)
        if fn is None:
            fn = self.loaded[name] = getattr(self._get_module(), name)
        return fn


def check_backend(backend: str, allowed: Sequence[str] = BACKENDS) -> str:
    """``backend`` if it is one of ``allowed`` (the op's vocabulary: :data:`BACKENDS` for the
    ops that cubins serve, ``flashinfer.attention.runtime.BACKENDS`` for attention)."""
    if backend not in allowed:
        names = {"auto": "'auto' (the JIT-compiled module)",
                 "cubin": "'cubin' (the verified kernel binary of the pinned artifact release)"}
        raise ValueError(f"backend must be "
                         f"{' or '.join(names.get(b, repr(b)) for b in allowed)}, got {backend!r}")
    return backend



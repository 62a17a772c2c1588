"""``flashinfer.activation``: gated activations, ``act(x[..., :d]) * x[..., d:]``.

The gate-up projection of a gated MLP (SwiGLU, GeGLU) produces ``[x | gate]`` in one tensor;
these ops apply the activation to the first half, multiply by the second half and write half the
width, in one pass over memory.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from ._checks import (
    HALF_DTYPES,
    ModuleFunctions,
    check_backend,
    check_cuda,
    check_dtype,
    check_same_device,
    check_same_dtype,
    check_tensor,
    resolve_pdl,
)
from .api_logging import flashinfer_api
from .jit.activation import gen_activation_module

__all__ = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]


@functools.cache
def get_activation_module():
    return gen_activation_module().build_and_load()


_fns = ModuleFunctions(lambda: get_activation_module())


def _check_out_shape(input: torch.Tensor, out: torch.Tensor) -> None:
    # The contract (and FlashInfer) raise AssertionError here; raised explicitly rather than
    # with `assert` so that `python -O` keeps the check.
    if out.dim() != input.dim():
        raise AssertionError(
            f"out must have the rank of input ({input.dim()}), got shape {tuple(out.shape)}"
        )
    if out.shape[:-1] != input.shape[:-1]:
        raise AssertionError(
            f"out must have the leading dims of input {tuple(input.shape[:-1])}, "
            f"got shape {tuple(out.shape)}"
        )
    if 2 * out.shape[-1] != input.shape[-1]:
        raise AssertionError(
            f"out.shape[-1] must be input.shape[-1] // 2 = {input.shape[-1] // 2}, "
            f"got shape {tuple(out.shape)}"
        )


def _as_rows(t: torch.Tensor, rows: int, cols: int) -> Optional[torch.Tensor]:
    """``t`` as a (rows, cols) view with a contiguous last dim, or None if no view exists."""
    try:
        t2 = t.view(rows, cols)
    except RuntimeError:  # leading dims that no single row stride describes
        return None
    return t2 if cols <= 1 or t2.stride(1) == 1 else None


def _act_and_mul(
    op: str,
    input: torch.Tensor,
    out: Optional[torch.Tensor],
    enable_pdl: Optional[bool],
    backend: str = "auto",
) -> torch.Tensor:
    fn = _fns.loaded.get(op)
    if fn is not None and backend == "auto":  # fast path: the binding's checks (ModuleFunctions)
        try:
            shape = input.shape
            if len(shape) == 2:  # (rows, 2d): the binding's own layout, no view needed
                o = input.new_empty((shape[0], shape[1] // 2)) if out is None else out
                fn(o, input, resolve_pdl(enable_pdl, input.device))
                return o
        except Exception:
            pass  # the checked path raises the error
    check_backend(backend)
    check_tensor(input, "input")
    check_dtype(input, "input", HALF_DTYPES)
    if input.dim() == 0:
        raise ValueError("input must have at least 1 dimension (..., 2 * d), got a 0-D tensor")
    if input.shape[-1] * input.element_size() % 16 != 0:
        raise ValueError("The pointers must be multiple of 16 bytes.")
    if out is not None:
        check_tensor(out, "out")
        _check_out_shape(input, out)
        check_same_dtype(input, "input", out, "out")
        check_same_device(input, "input", out, "out")
    check_cuda(input, "input")

    d = input.shape[-1] // 2
    rows = math.prod(input.shape[:-1])
    if out is None:
        out = torch.empty((*input.shape[:-1], d), dtype=input.dtype, device=input.device)
    if rows == 0 or d == 0:
        return out
    # The kernel takes one row stride per tensor. Sliced rows (x[:, :2d] of a wider tensor) and
    # flattenable leading dims stay views; anything else is copied (input) or staged (out).
    x2 = _as_rows(input, rows, 2 * d)
    if x2 is None:
        x2 = input.reshape(rows, 2 * d).contiguous()
    y2 = _as_rows(out, rows, d)
    staged = y2 is None
    if staged:
        y2 = torch.empty((rows, d), dtype=out.dtype, device=out.device)
    pdl = resolve_pdl(enable_pdl, input.device)
    if backend == "cubin":
        from .artifacts import kernels as cubin

        cubin.act_and_mul(op, y2, x2, pdl)
    else:
        _fns(op)(y2, x2, pdl)
    if staged:
        out.copy_(y2.view(out.shape))
    return out


# [silu_and_mul_api.begin]
@flashinfer_api
def silu_and_mul(
    input: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """SiLU-gated product (SwiGLU): ``silu(input[..., :d]) * input[..., d:]``.

    Parameters
    ----------
    input : torch.Tensor
        ``(..., 2 * d)``, float16 or bfloat16, on a CUDA device; ``input.shape[-1] * itemsize``
        must be a multiple of 16 bytes. Leading dims may be strided.
    out : torch.Tensor, optional
        ``(..., d)`` with the leading dims and dtype of ``input``; written and returned.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+. Never changes results.
    backend : str
        ``"auto"`` (default): the JIT-compiled module; ``"cubin"``: the kernel binary of the
        pinned artifact release, loaded through the CUDA driver (no nvcc; same results).

    Returns
    -------
    torch.Tensor
        ``(..., d)``, dtype of ``input``: ``x / (1 + exp(-x)) * gate`` with ``x, gate`` the two
        halves, computed in float32 and rounded once. ``out`` when given.

    Raises
    ------
    ValueError
        ``"The pointers must be multiple of 16 bytes."`` if ``input.shape[-1] * itemsize % 16``;
        a non-half dtype; a CPU tensor; ``out`` of another dtype or device.
    AssertionError
        ``out`` of another rank, other leading dims, or a last dim other than ``d``.

    Examples
    --------
    >>> x = torch.randn(8, 2 * 11008, dtype=torch.bfloat16, device="cuda")
    >>> y = flashinfer.silu_and_mul(x)  # (8, 11008)
    """
    return _act_and_mul("silu_and_mul", input, out, enable_pdl, backend)
# [silu_and_mul_api.end]


@flashinfer_api
def gelu_and_mul(
    input: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """GELU-gated product (GeGLU, exact GELU): ``gelu(input[..., :d]) * input[..., d:]``.

    ``gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2)))``. Shapes, dtypes and errors as
    :func:`silu_and_mul`.

    Parameters
    ----------
    input : torch.Tensor
        ``(..., 2 * d)``, float16 or bfloat16, CUDA; ``input.shape[-1] * itemsize % 16 == 0``.
    out : torch.Tensor, optional
        ``(..., d)``, same dtype; written and returned.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+.
    backend : str
        ``"auto"`` (default): the JIT-compiled module; ``"cubin"``: the kernel binary of the
        pinned artifact release, loaded through the CUDA driver (no nvcc; same results).

    Returns
    -------
    torch.Tensor
        ``(..., d)``, dtype of ``input`` (float32 math, one rounding).

    Examples
    --------
    >>> x = torch.randn(8, 2 * 4096, dtype=torch.float16, device="cuda")
    >>> y = flashinfer.gelu_and_mul(x)  # (8, 4096)
    """
    return _act_and_mul("gelu_and_mul", input, out, enable_pdl, backend)


@flashinfer_api
def gelu_tanh_and_mul(
    input: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """GELU-gated product, tanh approximation: ``gelu_tanh(input[..., :d]) * input[..., d:]``.

    ``gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``, as
    ``torch.nn.functional.gelu(x, approximate="tanh")``. Shapes, dtypes and errors as
    :func:`silu_and_mul`.

    Parameters
    ----------
    input : torch.Tensor
        ``(..., 2 * d)``, float16 or bfloat16, CUDA; ``input.shape[-1] * itemsize % 16 == 0``.
    out : torch.Tensor, optional
        ``(..., d)``, same dtype; written and returned.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+.
    backend : str
        ``"auto"`` (default): the JIT-compiled module; ``"cubin"``: the kernel binary of the
        pinned artifact release, loaded through the CUDA driver (no nvcc; same results).

    Returns
    -------
    torch.Tensor
        ``(..., d)``, dtype of ``input`` (float32 math, one rounding).

    Examples
    --------
    >>> x = torch.randn(8, 2 * 4096, dtype=torch.bfloat16, device="cuda")
    >>> y = flashinfer.gelu_tanh_and_mul(x)  # (8, 4096)
    """
    return _act_and_mul("gelu_tanh_and_mul", input, out, enable_pdl, backend)

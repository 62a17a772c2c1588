"""The ops served from cubins: kernel selection by manifest variant, parameter packing, launch.

Each function here is the cubin twin of a C++ host launcher: it applies the same launch rule
(:mod:`.rules`) to pick the same kernel instantiation and geometry, fills the kernel's parameter
buffer by field name from the manifest's layout, and launches through the driver on torch's
current stream. Callers (``flashinfer.norm``, ``flashinfer.activation``) have validated the
arguments already.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .errors import NotInManifestError
from .loader import loader
from .manifest import FileEntry, ParamLayout
from .resolve import get_cubin, load_manifest, pinned_release
from .rules import act_and_mul as act_rule
from .rules import fold_heads, norm_rows, row_strides, strides_aligned

_FORMATS = {"ptr": "Q", "u64": "Q", "i64": "q", "i32": "i", "u32": "I", "f32": "f"}
_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


_SIZES = {"ptr": 8, "u64": 8, "i64": 8, "i32": 4, "u32": 4, "f32": 4}
# (id(layout), names in the caller's order) -> (layout, one struct for them, their order by offset).
# Launchers pass the same names in the same order on every call, so a launch packs its buffer
# with one pack_into instead of a lookup and a pack per field (a third of the cubin path's host
# time per call before).
_PACKERS: dict[tuple[int, tuple[str, ...]], tuple[ParamLayout, struct.Struct, tuple[int, ...]]] = {}


def _packer(layout: ParamLayout, names: tuple[str, ...]) -> tuple[struct.Struct, tuple[int, ...]]:
    key = (id(layout), names)
    hit = _PACKERS.get(key)
    if hit is not None and hit[0] is layout:  # the id of a collected layout may be reused
        return hit[1], hit[2]
    known = {f.name: f for f in layout.fields}
    for name in names:
        if name not in known:
            raise KeyError(f"parameter layout has no field {name!r} (fields: {sorted(known)})")
    order = tuple(sorted(range(len(names)), key=lambda i: known[names[i]].offset))
    fmt, pos = "<", 0
    for i in order:
        f = known[names[i]]
        fmt += "x" * (f.offset - pos) + _FORMATS[f.type]
        pos = f.offset + _SIZES[f.type]
    packer = struct.Struct(fmt)
    _PACKERS[key] = (layout, packer, order)
    return packer, order


def pack_params(layout: ParamLayout, values: Mapping[str, Any]) -> ctypes.Array:
    """The kernel's parameter buffer: named fields set, everything else (padding, unused
    pointers such as a plain RMSNorm's residual) zero. An unknown name is an error, not a no-op."""
    buf = (ctypes.c_uint8 * layout.size)()
    packer, order = _packer(layout, tuple(values))
    given = tuple(values.values())
    packer.pack_into(buf, 0, *[given[i] for i in order])
    return buf


def arch_candidates(major: int, minor: int) -> list[str]:
    """Manifest archs whose cubins run on a device of compute capability major.minor, best
    first: arch-specific (``9.0a``, exact match only), family (``10.0f``), then plain SASS of the
    same major and an equal or lower minor (binary compatible)."""
    out = [f"{major}.{minor}a"]
    for m in range(minor, -1, -1):
        out += [f"{major}.{m}f", f"{major}.{m}"]
    return out


@dataclass(frozen=True)
class CubinKernel:
    """A kernel loaded on one device."""

    entry: FileEntry
    device: int
    function: Any

    def launch(self, grid, block, values: Mapping[str, Any], stream: int, pdl: bool) -> None:
        kernel = self.entry.kernel
        params = pack_params(kernel.params, values)
        loader().launch(
            self.function, self.device, grid, block, stream, params,
            [off for off, _ in kernel.params.args], kernel.dynamic_smem, pdl, kernel.name,
        )


_KERNELS: dict[tuple, CubinKernel] = {}
_LOCK = threading.Lock()


def loaded() -> list[CubinKernel]:
    """The kernels this process has loaded, in the order it loaded them."""
    with _LOCK:
        return list(_KERNELS.values())


def clear_cache() -> None:
    """Forget the loaded kernels (use :func:`flashinfer.artifacts.clear_caches`, which also
    forgets the manifests and the loader's modules)."""
    with _LOCK:
        _KERNELS.clear()


def kernel(family: str, variant: Mapping[str, Any], device: torch.device) -> CubinKernel:
    """The cubin kernel of ``family`` with ``variant`` for ``device`` (loaded once, cached)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (family, tuple(sorted(variant.items())), index)
    k = _KERNELS.get(key)
    if k is not None:
        return k
    with _LOCK:
        k = _KERNELS.get(key)
        if k is not None:
            return k
        manifest = load_manifest(pinned_release())
        major, minor = torch.cuda.get_device_capability(index)
        for arch in arch_candidates(major, minor):
            found = [
                e for e in manifest.kernels(family, arch)
                if all(e.kernel.variant.get(n) == v for n, v in variant.items())
            ]
            if found:
                break
        else:
            archs = sorted({e.arch for e in manifest.files if e.kernel and e.kernel.family == family})
            raise NotInManifestError(
                f"artifact release {manifest.release} has no {family} kernel {dict(variant)} for "
                f"compute capability {major}.{minor} (it has archs {archs}); use backend='auto' "
                "(the JIT) on this GPU"
            )
        blob = get_cubin(found[0].path)
        k = CubinKernel(found[0], index, loader().function(blob, index))
        _KERNELS[key] = k
        return k


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


@functools.lru_cache(maxsize=64)
def _inv_hidden(hidden: int) -> float:
    # 1.f / float(hidden) in float32 arithmetic, as the C++ launcher computes it.
    return float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(hidden, dtype=torch.float32))


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def rmsnorm(
    out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float,
    weight_offset: float, enable_pdl: bool,
) -> None:
    """norm.cuh ``RMSNorm<T>`` through the cubins: input/out ``(B, H)`` or ``(B, N, H)``."""
    batch, hidden = input.shape[0], input.shape[-1]
    heads = input.shape[1] if input.dim() == 3 else 1
    rows = batch * heads
    heads, (in_s, out_s) = fold_heads(
        heads, row_strides(input.shape, input.stride()), row_strides(out.shape, out.stride())
    )
    elem = input.element_size()
    aligned = (
        input.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0
        and strides_aligned(in_s, elem, 16) and strides_aligned(out_s, elem, 16)
    )
    plan = norm_rows(rows, hidden, elem, aligned, fused=False)
    if plan is None:
        return
    k = kernel("rmsnorm", {"dtype": _DTYPES[input.dtype], "access": plan.access,
                           "vecs": plan.vecs}, input.device)
    k.launch((plan.grid,), (plan.block,), {
        "input": input.data_ptr(), "input_strides.outer": in_s[0], "input_strides.inner": in_s[1],
        "out": out.data_ptr(), "out_strides.outer": out_s[0], "out_strides.inner": out_s[1],
        "weight": weight.data_ptr(), "rows": rows, "heads": heads, "hidden": hidden,
        "group": plan.group, "inv_hidden": _inv_hidden(hidden), "eps": eps,
        "weight_offset": weight_offset,
    }, _stream(input.device), enable_pdl)


def fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    weight_offset: float, enable_pdl: bool,
) -> None:
    """norm.cuh ``FusedAddRMSNorm<T>`` through the cubins: in place on ``(B, H)`` tensors."""
    rows, hidden = input.shape
    in_s = row_strides(input.shape, input.stride())
    res_s = row_strides(residual.shape, residual.stride())
    elem = input.element_size()
    aligned = (
        input.data_ptr() % 16 == 0 and residual.data_ptr() % 16 == 0
        and weight.data_ptr() % 16 == 0 and strides_aligned(in_s, elem, 16)
        and strides_aligned(res_s, elem, 16)
    )
    plan = norm_rows(rows, hidden, elem, aligned, fused=True)
    if plan is None:
        return
    # Rows too long for registers take the rmsnorm family's loop kernel, fused by the residual.
    family = "fused_add_rmsnorm" if plan.vecs else "rmsnorm"
    k = kernel(family, {"dtype": _DTYPES[input.dtype], "access": plan.access, "vecs": plan.vecs},
               input.device)
    k.launch((plan.grid,), (plan.block,), {
        "input": input.data_ptr(), "input_strides.outer": in_s[0], "input_strides.inner": in_s[1],
        "out": input.data_ptr(), "out_strides.outer": in_s[0], "out_strides.inner": in_s[1],
        "residual": residual.data_ptr(), "residual_strides.outer": res_s[0],
        "residual_strides.inner": res_s[1], "weight": weight.data_ptr(), "rows": rows,
        "heads": 1, "hidden": hidden, "group": plan.group, "inv_hidden": _inv_hidden(hidden),
        "eps": eps, "weight_offset": weight_offset,
    }, _stream(input.device), enable_pdl)


def act_and_mul(op: str, out: torch.Tensor, input: torch.Tensor, enable_pdl: bool) -> None:
    """activation.cuh ``ActAndMul<Act, T>`` through the cubins: input ``(rows, 2d)``, out
    ``(rows, d)``, each with its own row stride and a contiguous last dim."""
    rows, d = out.shape
    index = input.device.index if input.device.index is not None else torch.cuda.current_device()
    plan = act_rule(
        input.data_ptr(), out.data_ptr(), rows, d, input.stride(0), out.stride(0),
        input.element_size(), _sm_count(index),
    )
    if plan is None:
        return
    g = plan.geometry
    k = kernel(op, {"dtype": _DTYPES[input.dtype], "access": plan.access}, input.device)
    k.launch((plan.grid,), (g.threads_x, g.rows_per_block), {
        "input": input.data_ptr(), "out": out.data_ptr(), "rows": rows, "d": d,
        "vecs_per_row": plan.vecs_per_row, "in_stride": input.stride(0),
        "out_stride": out.stride(0), "col_chunks": g.col_chunks, "num_tiles": g.num_tiles,
    }, _stream(input.device), enable_pdl)

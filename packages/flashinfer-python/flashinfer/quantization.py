"""``flashinfer.quantization``: bit packing with ``numpy.packbits`` semantics.

Used to pack boolean attention masks eight to a byte (``packbits``), or one request's mask at a
time in a batch (``segment_packbits``).
"""

from __future__ import annotations

import functools
from typing import Tuple

import torch

from ._checks import (
    INDEX_DTYPES,
    check_cuda,
    check_dtype,
    check_ndim,
    check_same_device,
    check_tensor,
)
from .api_logging import flashinfer_api
from .jit.quantization import gen_quantization_module

__all__ = ["packbits", "segment_packbits"]

_BITORDERS = ("big", "little")

# The kernels read each element as an integer of its width and test (bits & mask) != 0. For IEEE
# floats the mask drops the sign bit, so -0.0 packs as 0 and NaN as 1, exactly as .to(torch.bool).
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_ALL_BITS = -1
_FLOAT_MASKS = {
    torch.float16: 0x7FFF,
    torch.bfloat16: 0x7FFF,
    torch.float32: 0x7FFF_FFFF,
    torch.float64: 0x7FFF_FFFF_FFFF_FFFF,
    torch.complex64: 0x7FFF_FFFF_7FFF_FFFF,  # nonzero iff the real or the imaginary part is
}
for _name, _mask in (("float8_e4m3fn", 0x7F), ("float8_e5m2", 0x7F)):
    if hasattr(torch, _name):  # their 0x80 is -0.0 (the "fnuz" variants use it for NaN)
        _FLOAT_MASKS[getattr(torch, _name)] = _mask
_INT_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
# Reinterpreted as the signed type of their width (DLPack export of these is not universal).
_WIDE_UNSIGNED = {getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)}


@functools.cache
def get_quantization_module():
    return gen_quantization_module().build_and_load()


def _check_bitorder(bitorder: str) -> bool:
    """True for "little"; ValueError unless "big" or "little"."""
    if bitorder not in _BITORDERS:
        raise ValueError(f"bitorder must be 'big' or 'little', got {bitorder!r}")
    return bitorder == "little"


def _as_bits(x: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """A contiguous 1-D integer tensor with x's elements' bits, and the nonzero mask."""
    x = x.contiguous()
    if x.dtype in _INT_DTYPES:
        return x, _ALL_BITS
    if x.dtype in _WIDE_UNSIGNED:
        return x.view(_INT_OF_WIDTH[x.element_size()]), _ALL_BITS
    if x.dtype in _FLOAT_MASKS:
        return x.view(_INT_OF_WIDTH[x.element_size()]), _FLOAT_MASKS[x.dtype]
    # Anything else (complex128, fnuz / e8m0 floats, ...): let torch decide what is nonzero.
    return x.to(torch.bool), _ALL_BITS


# [packbits_api.begin]
@flashinfer_api
def packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    """Pack the truth values of ``x`` eight to a byte, as ``numpy.packbits``.

    Parameters
    ----------
    x : torch.Tensor
        1-D, any dtype, on a CUDA device; element ``i`` counts as 1 iff ``x[i] != 0`` (i.e.
        ``x.to(torch.bool)``: ``-0.0`` is 0, NaN is 1). Tensors of more dims are flattened, like
        numpy's default ``axis=None``.
    bitorder : str
        ``"big"`` (default): ``x[8j]`` is the most significant bit of byte ``j``;
        ``"little"``: ``x[8j]`` is bit 0.

    Returns
    -------
    torch.Tensor
        ``((n + 7) // 8,)`` uint8, ``n = x.numel()``; the last byte is zero-padded.

    Examples
    --------
    >>> x = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1], dtype=torch.bool, device="cuda")
    >>> flashinfer.packbits(x)  # tensor([176, 128], dtype=torch.uint8)
    >>> flashinfer.packbits(x, bitorder="little")  # tensor([13, 1], dtype=torch.uint8)
    """
    check_tensor(x, "x")
    little = _check_bitorder(bitorder)
    check_cuda(x, "x")
    n = x.numel()
    y = torch.empty(((n + 7) // 8,), dtype=torch.uint8, device=x.device)
    if n == 0:
        return y
    bits, mask = _as_bits(x.reshape(-1))
    get_quantization_module().packbits(y, bits, mask, little)
    return y
# [packbits_api.end]


@flashinfer_api
def segment_packbits(
    x: torch.Tensor, indptr: torch.Tensor, bitorder: str = "big"
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pack each segment ``x[indptr[i]:indptr[i+1]]`` on its own, as :func:`packbits`.

    Each segment is padded to whole bytes, so segment ``i`` occupies
    ``y[indptr_new[i]:indptr_new[i+1]]``, with
    ``indptr_new[i+1] - indptr_new[i] = (len_i + 7) // 8``.

    Parameters
    ----------
    x : torch.Tensor
        1-D, any dtype (truth value ``x != 0``), CUDA.
    indptr : torch.Tensor
        ``(num_segments + 1,)`` int32 or int64 on ``x``'s device, non-decreasing, with
        ``0 <= indptr[0]`` and ``indptr[-1] <= x.numel()``.
    bitorder : str
        ``"big"`` (default) or ``"little"``, as in :func:`packbits`.

    Returns
    -------
    y : torch.Tensor
        ``(indptr_new[-1],)`` uint8, the packed segments back to back.
    indptr_new : torch.Tensor
        ``(num_segments + 1,)`` int32, ``indptr_new[0] = 0``.

    Notes
    -----
    The size of ``y`` depends on ``indptr``'s values, so this synchronizes with the device once
    (it cannot be captured in a CUDA graph).

    Examples
    --------
    >>> x = torch.ones(10, dtype=torch.bool, device="cuda")
    >>> indptr = torch.tensor([0, 3, 3, 10], dtype=torch.int32, device="cuda")
    >>> y, indptr_new = flashinfer.segment_packbits(x, indptr)
    >>> # y = [224, 254], indptr_new = [0, 1, 1, 2]
    """
    check_tensor(x, "x")
    check_tensor(indptr, "indptr")
    check_ndim(x, "x", (1,))
    check_ndim(indptr, "indptr", (1,))
    check_dtype(indptr, "indptr", INDEX_DTYPES)
    if indptr.numel() == 0:
        raise ValueError("indptr must have at least 1 element (num_segments + 1), got 0")
    little = _check_bitorder(bitorder)
    check_cuda(x, "x")
    check_same_device(x, "x", indptr, "indptr")

    num_segments = indptr.numel() - 1
    if num_segments == 0:
        return (
            torch.empty((0,), dtype=torch.uint8, device=x.device),
            torch.zeros((1,), dtype=torch.int32, device=x.device),
        )
    bounds = indptr.to(torch.int64)
    seglen = bounds[1:] - bounds[:-1]
    indptr_new64 = torch.zeros_like(bounds)
    torch.cumsum((seglen + 7) // 8, 0, out=indptr_new64[1:])
    # One device sync for the output size and the data-dependent checks together.
    total, min_len, first, last = torch.stack(
        [indptr_new64[-1], seglen.min(), bounds[0], bounds[-1]]
    ).tolist()
    if min_len < 0:
        raise ValueError("indptr must be non-decreasing")
    if first < 0 or last > x.numel():
        raise ValueError(
            f"indptr must lie within [0, x.numel()] = [0, {x.numel()}], got [{first}, {last}]"
        )
    if total > torch.iinfo(torch.int32).max:
        raise ValueError(
            f"the packed output has {total} bytes, more than int32 indptr_new can address"
        )
    indptr_new = indptr_new64.to(torch.int32)
    y = torch.empty((total,), dtype=torch.uint8, device=x.device)
    if total > 0:
        bits, mask = _as_bits(x)
        get_quantization_module().segment_packbits(
            y, bits, indptr.contiguous(), indptr_new, mask, little
        )
    return y, indptr_new

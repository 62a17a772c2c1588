"""``flashinfer.rope``: rotary position embedding (RoPE) of q and k.

Layout: ``q (nnz, Hq, D)`` and ``k (nnz, Hk, D)``, float16 or bfloat16, contiguous in the last
dimension, any row and head stride (slices of a packed QKV tensor work without copies). Channels
``[0, rotary_dim)`` are rotated in pairs; channels ``[rotary_dim, D)`` pass through unchanged
(copied by the out-of-place variants).

Pairing: ``interleave=False`` (GPT-NeoX, "rotate half") pairs channel ``i`` with
``i + rotary_dim/2``; ``interleave=True`` (GPT-J) pairs ``2i`` with ``2i+1``. Pair ``i`` of a token
at position ``p`` rotates by ``theta_i = float32(p) * freq_i`` (float32 product)::

    x' = x * cos(theta_i) - y * sin(theta_i)
    y' = y * cos(theta_i) + x * sin(theta_i)

with ``freq_i = rope_theta ** (-2i / rotary_dim) / rope_scale`` rounded once to float32, or its
Llama-3.1 smoothing. The math is float32; each output is rounded once to the input dtype.

Positions come from ``pos_ids (nnz,)``, or from ``indptr (B+1,)``/``offsets (B,)``: request ``b``
owns rows ``indptr[b]:indptr[b+1]`` and row ``j`` of it sits at ``offsets[b] + j - indptr[b]``.
Index tensors are int32 or int64 (``indptr`` and ``offsets`` share one dtype). Rows outside
``[indptr[0], indptr[B])`` are left unrotated.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from ._checks import (
    HALF_DTYPES,
    INDEX_DTYPES,
    ModuleFunctions,
    check_cuda,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
    resolve_pdl,
)
from .api_logging import flashinfer_api
from .jit.rope import gen_rope_module

#: Largest rotary_dim the kernels take (the frequency table travels in the kernel parameters).
MAX_ROTARY_DIM = 512

__all__ = [
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
]


@functools.cache
def get_rope_module():
    return gen_rope_module().build_and_load()


_fns = ModuleFunctions(lambda: get_rope_module())


# --------------------------------------------------------------------------------------------
# Validation (every check runs before the device check, so all of them work on CPU tensors)
# --------------------------------------------------------------------------------------------


def _check_qk(q: torch.Tensor, k: torch.Tensor, q_name: str = "q", k_name: str = "k") -> None:
    check_tensor(q, q_name)
    check_tensor(k, k_name)
    check_ndim(q, q_name, (3,))
    check_ndim(k, k_name, (3,))
    check_dtype(q, q_name, HALF_DTYPES)
    check_same_dtype(q, q_name, k, k_name)
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"{k_name} must have shape ({q.shape[0]}, num_kv_heads, {q.shape[2]}) to match "
            f"{q_name} {tuple(q.shape)}, got {tuple(k.shape)}"
        )
    check_last_dim_contiguous(q, q_name)
    check_last_dim_contiguous(k, k_name)
    check_same_device(q, q_name, k, k_name)


def _resolve_rotary_dim(rotary_dim: Optional[int], head_dim: int) -> int:
    if rotary_dim is None:
        rotary_dim = head_dim
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise ValueError(f"rotary_dim must be an int or None, got {rotary_dim!r}")
    if not (0 < rotary_dim <= head_dim) or rotary_dim % 2 != 0:
        raise ValueError(
            f"rotary_dim must be even and in (0, head_dim={head_dim}], got {rotary_dim}"
        )
    if rotary_dim > MAX_ROTARY_DIM:
        raise ValueError(f"rotary_dim must be at most {MAX_ROTARY_DIM}, got {rotary_dim}")
    return rotary_dim


def _check_index(
    x: torch.Tensor, name: str, length: int, like: torch.Tensor, like_name: str = "q"
) -> torch.Tensor:
    check_tensor(x, name)
    check_ndim(x, name, (1,))
    check_dtype(x, name, INDEX_DTYPES)
    check_shape(x, name, (length,))
    check_same_device(like, like_name, x, name)
    return x.contiguous()


def _check_indptr_offsets(
    indptr: torch.Tensor, offsets: torch.Tensor, q: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    check_tensor(indptr, "indptr")
    check_ndim(indptr, "indptr", (1,))
    if indptr.shape[0] < 1:
        raise ValueError(
            f"indptr must have batch_size + 1 >= 1 entries, got shape {tuple(indptr.shape)}"
        )
    batch_size = indptr.shape[0] - 1
    indptr = _check_index(indptr, "indptr", batch_size + 1, q)
    offsets = _check_index(offsets, "offsets", batch_size, q)
    check_same_dtype(indptr, "indptr", offsets, "offsets")
    return indptr, offsets


def _check_freq(rope_scale: float, rope_theta: float) -> Tuple[float, float]:
    rope_scale, rope_theta = float(rope_scale), float(rope_theta)
    if rope_scale == 0.0:
        raise ValueError("rope_scale must be nonzero, got 0")
    if not rope_theta > 0.0:
        raise ValueError(f"rope_theta must be positive, got {rope_theta}")
    return rope_scale, rope_theta


def _outputs(
    q: torch.Tensor, k: torch.Tensor, inplace: bool
) -> Tuple[torch.Tensor, torch.Tensor]:
    if inplace:
        return q, k
    return torch.empty_like(q), torch.empty_like(k)


# --------------------------------------------------------------------------------------------
# Shared drivers
# --------------------------------------------------------------------------------------------

# Llama-3.1 parameters that make the frequency schedule the plain one (ignored when off).
_NO_LLAMA31 = (False, 1.0, 4.0, 8192.0)


def _fast_rope(name, q, k, index, rotary_dim, interleave, rope_scale, rope_theta, llama31,
               inplace):
    """The fast path of the q/k entry points (``ModuleFunctions``): the binding checks every
    argument. Returns False (nothing launched) when the checked path must run."""
    fn = _fns.loaded.get(name)
    if fn is None or not (rotary_dim is None or type(rotary_dim) is int):
        return False
    try:
        q_out, k_out = (q, k) if inplace else (torch.empty_like(q), torch.empty_like(k))
        fn(q, k, q_out, k_out, *index, q.shape[2] if rotary_dim is None else rotary_dim,
           bool(interleave), float(rope_scale), float(rope_theta), *llama31,
           resolve_pdl(None, q.device))
    except Exception:
        return False  # the checked path raises the error
    return None if inplace else (q_out, k_out)


def _rope_indptr(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, llama31,
                 inplace):
    out = _fast_rope("apply_rope_indptr", q, k, (indptr, offsets), rotary_dim, interleave,
                     rope_scale, rope_theta, llama31, inplace)
    if out is not False:
        return out
    _check_qk(q, k)
    rotary_dim = _resolve_rotary_dim(rotary_dim, q.shape[2])
    indptr, offsets = _check_indptr_offsets(indptr, offsets, q)
    rope_scale, rope_theta = _check_freq(rope_scale, rope_theta)
    check_cuda(q, "q")
    q_out, k_out = _outputs(q, k, inplace)
    _fns("apply_rope_indptr")(
        q, k, q_out, k_out, indptr, offsets, rotary_dim, bool(interleave), rope_scale,
        rope_theta, *llama31, resolve_pdl(None, q.device),
    )
    return None if inplace else (q_out, k_out)


def _rope_pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, llama31,
                  inplace):
    out = _fast_rope("apply_rope_pos_ids", q, k, (pos_ids,), rotary_dim, interleave, rope_scale,
                     rope_theta, llama31, inplace)
    if out is not False:
        return out
    _check_qk(q, k)
    rotary_dim = _resolve_rotary_dim(rotary_dim, q.shape[2])
    pos_ids = _check_index(pos_ids, "pos_ids", q.shape[0], q)
    rope_scale, rope_theta = _check_freq(rope_scale, rope_theta)
    check_cuda(q, "q")
    q_out, k_out = _outputs(q, k, inplace)
    _fns("apply_rope_pos_ids")(
        q, k, q_out, k_out, pos_ids, rotary_dim, bool(interleave), rope_scale, rope_theta,
        *llama31, resolve_pdl(None, q.device),
    )
    return None if inplace else (q_out, k_out)


def _llama31(low_freq_factor, high_freq_factor, old_context_len):
    return (True, float(low_freq_factor), float(high_freq_factor), float(old_context_len))


def _view_heads(x: torch.Tensor, name: str, head_size: int) -> torch.Tensor:
    """``x.view(nnz, -1, head_size)``, as a ValueError when the layout does not allow it.

    The head count is spelled out so that an empty batch (nnz = 0) views too.
    """
    heads = (x.shape[1] if x.dim() == 2 else x.shape[1] * x.shape[2]) // head_size
    try:
        return x.view(x.shape[0], heads, head_size)
    except RuntimeError as e:
        raise ValueError(
            f"{name} of shape {tuple(x.shape)} and strides {tuple(x.stride())} cannot be viewed "
            f"as (nnz, -1, head_size={head_size}): {e}"
        ) from None


def _rope_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, inplace):
    check_tensor(cos_sin_cache, "cos_sin_cache")
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError("cos_sin_cache should be float32")
    check_tensor(query, "query")
    check_tensor(key, "key")
    if isinstance(head_size, bool) or not isinstance(head_size, int) or head_size <= 0:
        raise ValueError(f"head_size must be a positive int, got {head_size!r}")
    check_ndim(cos_sin_cache, "cos_sin_cache", (2,))
    check_last_dim_contiguous(cos_sin_cache, "cos_sin_cache")
    for x, name in ((query, "query"), (key, "key")):
        check_ndim(x, name, (2, 3))
        if (x.shape[1] if x.dim() == 2 else x.shape[1] * x.shape[2]) % head_size != 0:
            raise ValueError(
                f"{name} rows must hold a whole number of heads of head_size={head_size}, "
                f"got shape {tuple(x.shape)}"
            )
    if key.shape[0] != query.shape[0]:
        raise ValueError(
            f"key must have {query.shape[0]} rows like query, got shape {tuple(key.shape)}"
        )
    q = _view_heads(query, "query", head_size)
    k = _view_heads(key, "key", head_size)
    _check_qk(q, k, "query", "key")
    rotary_dim = cos_sin_cache.shape[1]
    if rotary_dim % 2 != 0 or not (0 < rotary_dim <= head_size) or rotary_dim > MAX_ROTARY_DIM:
        raise ValueError(
            f"cos_sin_cache.shape[1] (rotary_dim) must be even and in (0, "
            f"min(head_size={head_size}, {MAX_ROTARY_DIM})], got shape {tuple(cos_sin_cache.shape)}"
        )
    positions = _check_index(positions, "positions", q.shape[0], q, "query")
    check_same_device(q, "query", cos_sin_cache, "cos_sin_cache")
    check_cuda(q, "query")
    if inplace:
        q_out, k_out = q, k
    else:
        query_out, key_out = torch.empty_like(query), torch.empty_like(key)
        q_out = _view_heads(query_out, "query_out", head_size)
        k_out = _view_heads(key_out, "key_out", head_size)
    get_rope_module().apply_rope_cos_sin_cache(
        q, k, q_out, k_out, cos_sin_cache, positions, not bool(is_neox), resolve_pdl(None, q.device)
    )
    return None if inplace else (query_out, key_out)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

@flashinfer_api
def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE on a ragged batch whose positions come from ``indptr`` and ``offsets``.

    Parameters
    ----------
    q : torch.Tensor
        ``(nnz, num_q_heads, head_dim)``, float16 or bfloat16, last dim contiguous, any row and
        head stride.
    k : torch.Tensor
        ``(nnz, num_k_heads, head_dim)``, dtype of ``q``, last dim contiguous.
    indptr : torch.Tensor
        ``(batch_size + 1,)`` int32 or int64: request ``b`` owns rows ``indptr[b]:indptr[b+1]``.
    offsets : torch.Tensor
        ``(batch_size,)``, dtype of ``indptr``: position of the first row of each request.
    rotary_dim : int, optional
        Channels ``[0, rotary_dim)`` are rotated, the rest copied; None means ``head_dim``.
    interleave : bool
        False: NeoX pairs ``(i, i + rotary_dim/2)``; True: GPT-J pairs ``(2i, 2i+1)``.
    rope_scale : float
        Divides every frequency (position interpolation).
    rope_theta : float
        Base of the frequencies ``rope_theta ** (-2i/rotary_dim)``.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        New ``q_rope``, ``k_rope`` shaped like ``q`` and ``k``. Row ``j`` of request ``b`` is
        rotated for position ``offsets[b] + j - indptr[b]``.

    Examples
    --------
    >>> q = torch.randn(12, 32, 128, dtype=torch.float16, device="cuda")
    >>> k = torch.randn(12, 8, 128, dtype=torch.float16, device="cuda")
    >>> indptr = torch.tensor([0, 5, 12], dtype=torch.int32, device="cuda")
    >>> offsets = torch.tensor([100, 0], dtype=torch.int32, device="cuda")
    >>> q_rope, k_rope = flashinfer.apply_rope(q, k, indptr, offsets)
    """
    return _rope_indptr(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta,
                        _NO_LLAMA31, inplace=False)


@flashinfer_api
def apply_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """:func:`apply_rope`, writing the result into ``q`` and ``k``; returns None.

    Examples
    --------
    >>> flashinfer.apply_rope_inplace(q, k, indptr, offsets)
    """
    return _rope_indptr(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta,
                        _NO_LLAMA31, inplace=True)


@flashinfer_api
def apply_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE with one position per row.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(nnz, num_q_heads, head_dim)`` and ``(nnz, num_k_heads, head_dim)``, float16 or
        bfloat16, same dtype, last dim contiguous, any row and head stride.
    pos_ids : torch.Tensor
        ``(nnz,)`` int32 or int64: the position of each row.
    rotary_dim, interleave, rope_scale, rope_theta
        As in :func:`apply_rope`.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        New ``q_rope``, ``k_rope``.

    Examples
    --------
    >>> pos_ids = torch.arange(12, dtype=torch.int32, device="cuda")
    >>> q_rope, k_rope = flashinfer.apply_rope_pos_ids(q, k, pos_ids)
    """
    return _rope_pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                         _NO_LLAMA31, inplace=False)


@flashinfer_api
def apply_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """:func:`apply_rope_pos_ids`, writing into ``q`` and ``k``; returns None.

    Examples
    --------
    >>> flashinfer.apply_rope_pos_ids_inplace(q, k, pos_ids)
    """
    return _rope_pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                         _NO_LLAMA31, inplace=True)


_LLAMA31_DOC = """
    The Llama-3.1 schedule blends the scaled and unscaled frequency of each pair::

        smooth = clamp(freq * old_context_len / (2 pi (high_freq_factor - low_freq_factor))
                       - low_freq_factor / (high_freq_factor - low_freq_factor), 0, 1)
        freq'  = (1 - smooth) * freq / rope_scale + smooth * freq

    with ``freq = rope_theta ** (-2i / rotary_dim)`` (computed in double, rounded once).
"""


@flashinfer_api
def apply_llama31_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope` with the Llama-3.1 frequency schedule; returns new ``(q, k)``.

    Examples
    --------
    >>> q_rope, k_rope = flashinfer.apply_llama31_rope(q, k, indptr, offsets)
    """
    return _rope_indptr(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta,
                        _llama31(low_freq_factor, high_freq_factor, old_context_len),
                        inplace=False)


@flashinfer_api
def apply_llama31_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """:func:`apply_llama31_rope`, writing into ``q`` and ``k``; returns None.

    Examples
    --------
    >>> flashinfer.apply_llama31_rope_inplace(q, k, indptr, offsets)
    """
    return _rope_indptr(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta,
                        _llama31(low_freq_factor, high_freq_factor, old_context_len),
                        inplace=True)


@flashinfer_api
def apply_llama31_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope_pos_ids` with the Llama-3.1 frequency schedule; returns new ``(q, k)``.

    Examples
    --------
    >>> q_rope, k_rope = flashinfer.apply_llama31_rope_pos_ids(q, k, pos_ids)
    """
    return _rope_pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                         _llama31(low_freq_factor, high_freq_factor, old_context_len),
                         inplace=False)


@flashinfer_api
def apply_llama31_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """:func:`apply_llama31_rope_pos_ids`, writing into ``q`` and ``k``; returns None.

    Examples
    --------
    >>> flashinfer.apply_llama31_rope_pos_ids_inplace(q, k, pos_ids)
    """
    return _rope_pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                         _llama31(low_freq_factor, high_freq_factor, old_context_len),
                         inplace=True)


for _f in (apply_llama31_rope, apply_llama31_rope_inplace, apply_llama31_rope_pos_ids,
           apply_llama31_rope_pos_ids_inplace):
    _f.__doc__ = (_f.__doc__ or "") + _LLAMA31_DOC
del _f


@flashinfer_api
def apply_rope_with_cos_sin_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE with precomputed cos/sin (the vLLM / SGLang interface).

    Parameters
    ----------
    positions : torch.Tensor
        ``(nnz,)`` int32 or int64: the position of each row, in ``[0, max_pos)`` (rows outside
        are left unrotated).
    query : torch.Tensor
        ``(nnz, num_q_heads * head_size)`` or ``(nnz, num_q_heads, head_size)``, float16 or
        bfloat16, viewable as ``(nnz, -1, head_size)`` (last dim contiguous).
    key : torch.Tensor
        ``(nnz, num_k_heads * head_size)`` or 3-D, dtype of ``query``.
    head_size : int
        Channels per head.
    cos_sin_cache : torch.Tensor
        ``(max_pos, rotary_dim)`` **float32**: row ``p`` is ``[cos(p f_0..) | sin(p f_0..)]``,
        ``rotary_dim/2`` values each. Channels ``[rotary_dim, head_size)`` pass through.
    is_neox : bool
        True: NeoX pairs ``(i, i + rotary_dim/2)``; False: GPT-J pairs ``(2i, 2i+1)``.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        New ``query_out``, ``key_out`` shaped like ``query`` and ``key``.

    Examples
    --------
    >>> inv = 1e4 ** (-torch.arange(0, 128, 2, device="cuda") / 128)
    >>> ang = torch.arange(4096, device="cuda")[:, None] * inv
    >>> cache = torch.cat([ang.cos(), ang.sin()], dim=-1).float()
    >>> query = torch.randn(12, 32 * 128, dtype=torch.bfloat16, device="cuda")
    >>> key = torch.randn(12, 8 * 128, dtype=torch.bfloat16, device="cuda")
    >>> positions = torch.arange(12, device="cuda")
    >>> q_out, k_out = flashinfer.apply_rope_with_cos_sin_cache(positions, query, key, 128, cache)
    """
    return _rope_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox,
                               inplace=False)


@flashinfer_api
def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """:func:`apply_rope_with_cos_sin_cache`, writing into ``query`` and ``key``; returns None.

    Examples
    --------
    >>> flashinfer.apply_rope_with_cos_sin_cache_inplace(positions, query, key, 128, cache)
    """
    return _rope_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox,
                               inplace=True)

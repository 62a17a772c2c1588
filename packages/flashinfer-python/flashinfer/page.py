"""``flashinfer.page``: paged KV-cache helpers.

The paged cache is one tensor or a ``(k, v)`` tuple (see :func:`append_paged_kv_cache`), in
layout ``"NHD"`` (pages, slots, heads, head_dim) or ``"HND"`` (pages, heads, slots, head_dim).
Request ``b`` owns the pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` in order, the last one
filled to ``kv_last_page_len[b]`` (in ``[1, page_size]``; 0 only for a request with no pages), so
its length is ``(pages_b - 1) * page_size + kv_last_page_len[b]``; the token at position ``p``
is slot ``p % page_size`` of its page ``p // page_size``. Metadata is int32 (int64 is converted).

:func:`_unpack_paged_kv_cache` is shared with the attention wrappers.
"""

from __future__ import annotations

import functools
import operator
from typing import Optional, Sequence, Tuple, Union

import torch

from ._checks import (
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
from .jit.page import gen_page_module

__all__ = ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"]

#: kv_layout name -> the layout code the kernels take.
KV_LAYOUTS = {"NHD": 0, "HND": 1}

#: Cache (and appended K/V) dtypes: the append is a copy, so any 1-, 2- or 4-byte float works;
#: float16 / bfloat16 rows into an fp8 cache are cast (:func:`append_paged_kv_cache`).
CACHE_DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)
_INDEX_DTYPES = (torch.int32, torch.int64)

PagedKVCache = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


@functools.cache
def get_page_module():
    return gen_page_module().build_and_load()


_fns = ModuleFunctions(lambda: get_page_module())


# --------------------------------------------------------------------------------------------
# The paged-cache argument (shared with decode / prefill)
# --------------------------------------------------------------------------------------------


def _check_kv_layout(kv_layout: str) -> int:
    """The layout code of ``kv_layout``; ``KeyError`` unless it is ``"NHD"`` or ``"HND"``."""
    if not isinstance(kv_layout, str) or kv_layout not in KV_LAYOUTS:
        raise KeyError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    return KV_LAYOUTS[kv_layout]


def _add_page_dim(x: torch.Tensor, kv_layout: str) -> torch.Tensor:
    """A 3-D ``[P, H, D]`` cache (page size 1, page dim left out) as the 4-D view of the layout."""
    return x.unsqueeze(1 if kv_layout == "NHD" else 2)


def _unpack_paged_kv_cache(
    paged_kv_cache: PagedKVCache, kv_layout: str
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The K and V caches of a paged-cache argument, each as a 4-D view (no copy).

    Parameters
    ----------
    paged_kv_cache : torch.Tensor or (torch.Tensor, torch.Tensor)
        One tensor ``[P, 2, page_size, H, D]`` (NHD) / ``[P, 2, H, page_size, D]`` (HND) with
        K at ``[:, 0]`` and V at ``[:, 1]``; or a tuple (or list) ``(k, v)`` of 4-D tensors
        ``[P, page_size, H, D]`` / ``[P, H, page_size, D]``, which may have different strides
        (and, for attention with ``head_dim_vo != head_dim_qk``, different head dims). A missing
        page dim (a 4-D tensor ``[P, 2, H, D]``, or 3-D ``[P, H, D]`` in the tuple) means
        page_size 1.
    kv_layout : str
        ``"NHD"`` or ``"HND"``.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``k_cache``, ``v_cache``: ``[P, page_size, H, D]`` (NHD) or ``[P, H, page_size, D]``
        (HND) views of the caller's memory.

    Raises
    ------
    KeyError
        ``kv_layout`` is not ``"NHD"`` or ``"HND"``.
    TypeError
        ``paged_kv_cache`` is neither a tensor nor a pair of tensors.
    ValueError
        A tensor of the wrong rank, a 5-D (or 4-D) tensor whose dim 1 is not 2, a tuple that is
        not a pair, or K and V of different ranks or page counts.
    """
    _check_kv_layout(kv_layout)
    if isinstance(paged_kv_cache, torch.Tensor):
        x = paged_kv_cache
        if x.dim() not in (4, 5) or x.shape[1] != 2:
            raise ValueError(
                "paged_kv_cache as one tensor must be 5-D [num_pages, 2, page_size, num_heads, "
                "head_dim] (NHD; HND swaps page_size and num_heads) or 4-D [num_pages, 2, "
                f"num_heads, head_dim] (page_size 1), got shape {tuple(x.shape)}"
            )
        k, v = x.unbind(1)
        if x.dim() == 4:
            k, v = _add_page_dim(k, kv_layout), _add_page_dim(v, kv_layout)
        return k, v
    if not isinstance(paged_kv_cache, (tuple, list)):
        raise TypeError(
            "paged_kv_cache must be a torch.Tensor or a (k_cache, v_cache) tuple, got "
            f"{type(paged_kv_cache).__name__}"
        )
    if len(paged_kv_cache) != 2:
        raise ValueError(
            f"paged_kv_cache as a tuple must be (k_cache, v_cache), got {len(paged_kv_cache)} items"
        )
    k, v = paged_kv_cache
    check_tensor(k, "paged_kv_cache[0] (k_cache)")
    check_tensor(v, "paged_kv_cache[1] (v_cache)")
    for x, name in ((k, "k_cache"), (v, "v_cache")):
        if x.dim() not in (3, 4):
            raise ValueError(
                f"{name} must be 4-D [num_pages, page_size, num_heads, head_dim] (NHD; HND swaps "
                f"page_size and num_heads) or 3-D [num_pages, num_heads, head_dim] (page_size "
                f"1), got shape {tuple(x.shape)}"
            )
    if k.dim() != v.dim() or k.shape[0] != v.shape[0]:
        raise ValueError(
            "k_cache and v_cache must have the same rank and number of pages, got shapes "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k.dim() == 3:
        k, v = _add_page_dim(k, kv_layout), _add_page_dim(v, kv_layout)
    return k, v


def _paged_kv_dims(cache: torch.Tensor, kv_layout: str) -> Tuple[int, int, int, int]:
    """``(num_pages, page_size, num_heads, head_dim)`` of a 4-D cache view of ``kv_layout``."""
    if kv_layout == "NHD":
        return cache.shape[0], cache.shape[1], cache.shape[2], cache.shape[3]
    return cache.shape[0], cache.shape[2], cache.shape[1], cache.shape[3]


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _index(x: torch.Tensor, name: str, length: Optional[int], like: torch.Tensor,
           like_name: str) -> torch.Tensor:
    """A 1-D int32 metadata tensor on ``like``'s device (int64 converted, made contiguous)."""
    check_tensor(x, name)
    check_ndim(x, name, (1,))
    check_dtype(x, name, _INDEX_DTYPES)
    if length is not None:
        check_shape(x, name, (length,))
    check_same_device(like, like_name, x, name)
    return x.to(torch.int32).contiguous()


def _indptr(x: torch.Tensor, name: str, like: torch.Tensor, like_name: str) -> torch.Tensor:
    check_tensor(x, name)
    check_ndim(x, name, (1,))
    if x.shape[0] < 1:
        raise ValueError(f"{name} must have batch_size + 1 >= 1 entries, got shape {tuple(x.shape)}")
    return _index(x, name, None, like, like_name)


def _int_arg(value: object, name: str, minimum: int, what: str) -> int:
    """``value`` as an int (any integer type but bool) of at least ``minimum``, else ValueError."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be {what}, got {value!r}") from None
    if n < minimum:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return n


def _check_out_index(x: torch.Tensor, name: str, nnz: int, device: torch.device) -> None:
    check_tensor(x, name)
    check_shape(x, name, (nnz,))
    if x.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {str(x.dtype).replace('torch.', '')}")
    if x.device != device:
        raise ValueError(f"{name} must be on {device} like append_indptr, got {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {tuple(x.stride())}")


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def get_seq_lens(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Sequence lengths of a paged cache: ``clamp(pages_b - 1, 0) * page_size + last_page_len_b``.

    Plain torch arithmetic: works on CPU and GPU tensors, in their dtype. The values are
    checked where they are host data (CPU tensors): reading GPU values would synchronize the
    device, so GPU metadata is trusted (the append kernel skips rows it cannot place).

    Parameters
    ----------
    kv_indptr : torch.Tensor
        ``(batch_size + 1,)``: request ``b`` owns pages ``kv_indptr[b]:kv_indptr[b+1]``.
    kv_last_page_len : torch.Tensor
        ``(batch_size,)``: entries in the last page of each request.
    page_size : int
        Slots per page, positive.

    Returns
    -------
    torch.Tensor
        ``(batch_size,)`` sequence lengths.

    Raises
    ------
    ValueError
        A bad shape, ``page_size < 1``; on CPU tensors also a decreasing ``kv_indptr`` or a
        ``kv_last_page_len`` outside ``[0, page_size]``.

    Examples
    --------
    >>> kv_indptr = torch.tensor([0, 3, 4, 4], dtype=torch.int32)
    >>> kv_last_page_len = torch.tensor([13, 8, 0], dtype=torch.int32)
    >>> flashinfer.get_seq_lens(kv_indptr, kv_last_page_len, 16)
    tensor([45,  8,  0], dtype=torch.int32)
    """
    check_tensor(kv_indptr, "kv_indptr")
    check_tensor(kv_last_page_len, "kv_last_page_len")
    check_ndim(kv_indptr, "kv_indptr", (1,))
    check_shape(kv_last_page_len, "kv_last_page_len", (kv_indptr.shape[0] - 1,))
    page_size = _int_arg(page_size, "page_size", 1, "a positive int")
    pages = kv_indptr[1:] - kv_indptr[:-1]
    if pages.device.type == "cpu":
        _check_host_page_table(kv_indptr, pages, kv_last_page_len, page_size)
    return torch.clamp(pages - 1, min=0) * page_size + kv_last_page_len


def _check_host_page_table(kv_indptr: torch.Tensor, pages: torch.Tensor,
                           kv_last_page_len: torch.Tensor, page_size: int) -> None:
    """Values of CPU page-table metadata: indptr non-decreasing, last_page_len in [0, page_size]."""
    if pages.numel() and bool((pages < 0).any()):
        b = int((pages < 0).nonzero()[0, 0])
        raise ValueError(
            f"kv_indptr must be non-decreasing, got kv_indptr[{b}] = {int(kv_indptr[b])} > "
            f"kv_indptr[{b + 1}] = {int(kv_indptr[b + 1])}"
        )
    bad = (kv_last_page_len < 0) | (kv_last_page_len > page_size)
    if bad.numel() and bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"kv_last_page_len must be in [0, page_size={page_size}], got "
            f"kv_last_page_len[{b}] = {int(kv_last_page_len[b])}"
        )


@flashinfer_api
def get_batch_indices_positions(
    append_indptr: torch.Tensor,
    seq_lens: torch.Tensor,
    nnz: int,
    batch_indices: Optional[torch.Tensor] = None,
    positions: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Ragged append offsets to (request, position) pairs: a CSR-to-COO conversion.

    Entry ``i`` of request ``b`` (``append_indptr[b] <= i < append_indptr[b+1]``) appends the
    token at position ``seq_lens[b] - append_len_b + (i - append_indptr[b])``, where
    ``append_len_b = append_indptr[b+1] - append_indptr[b]`` and ``seq_lens`` counts the tokens
    *after* the append. Entries ``i < nnz`` outside every request get batch index ``-1``
    (which :func:`append_paged_kv_cache` skips) and keep their position (0 when allocated here).

    Parameters
    ----------
    append_indptr : torch.Tensor
        ``(batch_size + 1,)`` int32 (int64 converted).
    seq_lens : torch.Tensor
        ``(batch_size,)`` int32 or int64, on ``append_indptr``'s device.
    nnz : int
        Entries to produce, normally ``append_indptr[-1]`` (a larger value pads with -1).
    batch_indices, positions : torch.Tensor, optional
        Preallocated int32 ``(nnz,)`` contiguous outputs on ``append_indptr``'s device.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``batch_indices`` and ``positions``, int32 ``(nnz,)``.

    Examples
    --------
    >>> append_indptr = torch.tensor([0, 1, 3, 6, 10], dtype=torch.int32, device="cuda")
    >>> seq_lens = torch.tensor([5, 5, 5, 5], dtype=torch.int32, device="cuda")
    >>> flashinfer.get_batch_indices_positions(append_indptr, seq_lens, 10)
    (tensor([0, 1, 1, 2, 2, 2, 3, 3, 3, 3], device='cuda:0', dtype=torch.int32),
     tensor([4, 3, 4, 2, 3, 4, 1, 2, 3, 4], device='cuda:0', dtype=torch.int32))
    """
    check_tensor(append_indptr, "append_indptr")
    append_indptr = _indptr(append_indptr, "append_indptr", append_indptr, "append_indptr")
    batch_size = append_indptr.shape[0] - 1
    seq_lens = _index(seq_lens, "seq_lens", batch_size, append_indptr, "append_indptr")
    nnz = _int_arg(nnz, "nnz", 0, "a non-negative int")
    device = append_indptr.device
    if batch_indices is not None:
        _check_out_index(batch_indices, "batch_indices", nnz, device)
    if positions is not None:
        _check_out_index(positions, "positions", nnz, device)
    check_cuda(append_indptr, "append_indptr")
    zero_unused = positions is None
    if batch_indices is None:
        batch_indices = torch.empty(nnz, dtype=torch.int32, device=device)
    if positions is None:
        positions = torch.empty(nnz, dtype=torch.int32, device=device)
    if nnz > 0:
        get_page_module().get_batch_indices_positions(
            batch_indices, positions, append_indptr, seq_lens, zero_unused,
            resolve_pdl(None, device),
        )
    return batch_indices, positions


def _check_append_rows(key: torch.Tensor, value: torch.Tensor) -> None:
    check_tensor(key, "append_key")
    check_tensor(value, "append_value")
    check_ndim(key, "append_key", (3,))
    check_dtype(key, "append_key", CACHE_DTYPES)
    check_shape(value, "append_value", key.shape)
    check_same_dtype(key, "append_key", value, "append_value")
    check_same_device(key, "append_key", value, "append_value")
    check_last_dim_contiguous(key, "append_key")
    check_last_dim_contiguous(value, "append_value")


_HALF = (torch.float16, torch.bfloat16)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _check_caches(key: torch.Tensor, caches: Sequence[torch.Tensor], kv_layout: str) -> None:
    """Both caches hold append_key's dtype (or an fp8 one for half rows), heads and head_dim,
    with one page size."""
    _, page_size, heads, head_dim = _paged_kv_dims(caches[0], kv_layout)
    for cache, name in zip(caches, ("k_cache", "v_cache")):
        _, p, h, d = _paged_kv_dims(cache, kv_layout)
        if (p, h, d) != (page_size, key.shape[1], key.shape[2]):
            raise ValueError(
                f"{name} must have page_size {page_size}, num_heads {key.shape[1]} and head_dim "
                f"{key.shape[2]} (those of append_key, kv_layout={kv_layout!r}), got shape "
                f"{tuple(cache.shape)}"
            )
        if cache.dtype != caches[0].dtype:
            raise ValueError(f"v_cache must have k_cache's dtype ({caches[0].dtype}), got "
                             f"{cache.dtype}")
        if cache.dtype != key.dtype and not (key.dtype in _HALF and cache.dtype in _FP8):
            raise ValueError(f"{name} must have the dtype of append_key ({key.dtype}), or an "
                             f"fp8 dtype for float16/bfloat16 rows, got {cache.dtype}")
        check_same_device(key, "append_key", cache, name)
        check_last_dim_contiguous(cache, name)


@flashinfer_api
def append_paged_kv_cache(
    append_key: torch.Tensor,
    append_value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    paged_kv_cache: PagedKVCache,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    kv_layout: str = "NHD",
) -> None:
    """Write ragged K/V rows into a paged cache, in place.

    Row ``t`` goes to request ``b = batch_indices[t]``: page
    ``kv_indices[kv_indptr[b] + positions[t] // page_size]``, slot ``positions[t] % page_size``.
    The page table must already include the appended tokens. Rows with a negative batch index
    (padding from :func:`get_batch_indices_positions`) or a position beyond the request's pages
    are skipped.

    Parameters
    ----------
    append_key, append_value : torch.Tensor
        ``(nnz, num_kv_heads, head_dim)``, the cache's dtype (float16, bfloat16, float32 or
        fp8 e4m3/e5m2), or float16/bfloat16 into an fp8 cache: a plain cast (no scale; divide by
        ``k_scale`` / ``v_scale`` first where the cache is calibrated), rounded to nearest even
        and saturated to the fp8 type's largest finite value (448 for e4m3, 57344 for e5m2;
        ``torch``'s ``.to()`` does not saturate), NaN kept. Last dim contiguous, leading strides
        free (slices of a packed QKV).
    batch_indices, positions : torch.Tensor
        ``(nnz,)`` int32 (int64 converted), e.g. from :func:`get_batch_indices_positions`.
    paged_kv_cache : torch.Tensor or (torch.Tensor, torch.Tensor)
        One tensor ``[P, 2, page_size, H, D]`` (NHD) / ``[P, 2, H, page_size, D]`` (HND) with K at
        ``[:, 0]`` and V at ``[:, 1]``, or a tuple ``(k_cache, v_cache)`` of 4-D
        ``[P, page_size, H, D]`` / ``[P, H, page_size, D]`` tensors (K and V may have different
        strides); page dims may be strided views. A missing page dim means page_size 1.
    kv_indices : torch.Tensor
        ``(kv_indptr[-1],)`` int32: page ids, any order.
    kv_indptr : torch.Tensor
        ``(batch_size + 1,)`` int32.
    kv_last_page_len : torch.Tensor
        ``(batch_size,)`` int32 (only its length is used here).
    kv_layout : str
        ``"NHD"`` or ``"HND"`` (else ``KeyError``).

    Examples
    --------
    >>> k = torch.randn(10, 8, 128, dtype=torch.float16, device="cuda")
    >>> v = torch.randn(10, 8, 128, dtype=torch.float16, device="cuda")
    >>> cache = torch.zeros(4, 2, 16, 8, 128, dtype=torch.float16, device="cuda")
    >>> kv_indptr = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    >>> kv_indices = torch.tensor([3, 0], dtype=torch.int32, device="cuda")
    >>> kv_last_page_len = torch.tensor([4, 6], dtype=torch.int32, device="cuda")
    >>> append_indptr = torch.tensor([0, 4, 10], dtype=torch.int32, device="cuda")
    >>> seq_lens = flashinfer.get_seq_lens(kv_indptr, kv_last_page_len, 16)
    >>> bi, pos = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, 10)
    >>> flashinfer.append_paged_kv_cache(k, v, bi, pos, cache, kv_indices, kv_indptr,
    ...                                  kv_last_page_len)
    """
    fn = _fns.loaded.get("append_paged_kv_cache")
    if fn is not None:  # fast path: the binding's checks (ModuleFunctions)
        try:
            if isinstance(paged_kv_cache, torch.Tensor):
                if paged_kv_cache.dim() != 5:  # 4-D [P, 2, H, D]: page size 1, needs a view
                    raise TypeError
                k_cache = v_cache = paged_kv_cache  # the binding takes [:, 0] and [:, 1] itself
            elif isinstance(paged_kv_cache, (tuple, list)):
                k_cache, v_cache = paged_kv_cache
            else:
                raise TypeError
            fn(k_cache, v_cache, append_key, append_value, batch_indices, positions, kv_indices,
               kv_indptr, kv_last_page_len, KV_LAYOUTS[kv_layout],
               resolve_pdl(None, append_key.device))
            return
        except Exception:
            pass  # the checked path raises the error (or converts int64 / strided metadata)
    layout = _check_kv_layout(kv_layout)
    _check_append_rows(append_key, append_value)
    k_cache, v_cache = _unpack_paged_kv_cache(paged_kv_cache, kv_layout)
    _check_caches(append_key, (k_cache, v_cache), kv_layout)
    nnz = append_key.shape[0]
    batch_indices = _index(batch_indices, "batch_indices", nnz, append_key, "append_key")
    positions = _index(positions, "positions", nnz, append_key, "append_key")
    kv_indptr = _indptr(kv_indptr, "kv_indptr", append_key, "append_key")
    kv_indices = _index(kv_indices, "kv_indices", None, append_key, "append_key")
    kv_last_page_len = _index(kv_last_page_len, "kv_last_page_len", kv_indptr.shape[0] - 1,
                              append_key, "append_key")
    check_cuda(append_key, "append_key")
    if nnz == 0:
        return
    _fns("append_paged_kv_cache")(
        k_cache, v_cache, append_key, append_value, batch_indices, positions, kv_indices,
        kv_indptr, kv_last_page_len, layout, resolve_pdl(None, append_key.device),
    )


#: The public name of the paged-cache unpacking the attention wrappers share.
unpack_paged_kv_cache = _unpack_paged_kv_cache

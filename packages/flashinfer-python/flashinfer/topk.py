"""``flashinfer.topk``: radix top-k selection and the fused index transforms of sparse attention.

One CTA per row runs a radix select over the order-preserving integer key of each value
(``include/flashinfer/topk.cuh``): one walk over the row builds an 11-bit histogram and stashes
in shared memory the keys at or above a bin chosen from the row's first tile; the remaining
bits (and, for ties at the k-th value, the index as the tie-break asks) are resolved over the
stash alone. When the first tile misleads the stash (e.g. rows sorted by value), a second,
ordered walk over the row takes over. Every call is CUDA-graph capturable (no host
synchronization, no data-dependent host work) and deterministic: the selected set and its order
are a pure function of the input.

Order of keys: ``-inf`` < finite < ``+inf`` < NaN (every NaN is one key, the largest, as
``torch.topk`` orders it); ``-0.0`` and ``+0.0`` are equal. Values are returned bit-exactly.
"""

from __future__ import annotations

import functools
import operator
from enum import IntEnum
from typing import Optional, Tuple

import torch

from ._checks import FLOAT_DTYPES, check_cuda, check_dtype, check_ndim, check_tensor
from .api_logging import flashinfer_api
from .jit.topk import gen_topk_module

__all__ = [
    "TopKTieBreak",
    "top_k",
    "topk",
    "top_k_page_table_transform",
    "top_k_ragged_transform",
]

#: k up to this is gathered and sorted in shared memory; larger sorted calls sort with torch.
_MAX_KERNEL_SORT_K = 2048
#: Row indices are int32 and 2**31 - 1 marks padding inside the kernel's sort.
_MAX_LEN = (1 << 31) - 2


class TopKTieBreak(IntEnum):
    """Which of the elements equal to the k-th largest value are selected.

    - ``NONE`` (0): no promise (here: the smaller indices, deterministically).
    - ``SMALL`` (1), alias ``SMALLER``: prefer smaller indices.
    - ``LARGE`` (2), alias ``LARGER``: prefer larger indices.
    """

    NONE = 0
    SMALL = 1
    LARGE = 2
    SMALLER = 1
    LARGER = 2

    def __str__(self) -> str:
        return self.name.lower()

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}.{self.name}"

    def __format__(self, format_spec: str) -> str:
        return format(str(self), format_spec)


@functools.cache
def get_topk_module():
    return gen_topk_module().build_and_load()


def _check_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        try:
            k = operator.index(k)  # numpy / torch integer scalars
        except TypeError:
            raise TypeError(f"k must be an int, got {type(k).__name__}") from None
    if k <= 0:
        raise ValueError(f"k must be a positive int, got {k}")
    if k > _MAX_LEN:
        raise ValueError(f"k must be at most {_MAX_LEN}, got {k}")
    return int(k)


def _check_flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _check_tie_break(tie_break: object) -> int:
    if isinstance(tie_break, bool) or not isinstance(tie_break, int):
        raise TypeError(f"tie_break must be an int or TopKTieBreak, got {type(tie_break).__name__}")
    if tie_break not in (0, 1, 2):
        raise ValueError(
            f"tie_break must be 0 (TopKTieBreak.NONE), 1 (SMALL) or 2 (LARGE), got {tie_break}"
        )
    return int(tie_break)


def _check_scores(input: torch.Tensor) -> None:
    check_tensor(input, "input")
    check_ndim(input, "input", (2,))
    check_dtype(input, "input", FLOAT_DTYPES)
    if input.shape[1] > 1 and input.stride(1) != 1:
        raise ValueError(
            f"input must be contiguous in its last dimension, got strides {tuple(input.stride())}"
        )
    if input.shape[1] > _MAX_LEN:
        raise ValueError(f"input.shape[1] must be at most {_MAX_LEN}, got {input.shape[1]}")


def _check_row_vector(input: torch.Tensor, v: object, name: str) -> torch.Tensor:
    """A ``(num_rows,)`` int32 tensor on ``input``'s device (made contiguous)."""
    check_tensor(v, name)
    check_ndim(v, name, (1,))
    if v.shape[0] != input.shape[0]:
        raise ValueError(
            f"{name} must have shape ({input.shape[0]},) (one entry per row of input), "
            f"got {tuple(v.shape)}"
        )
    if v.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {str(v.dtype).replace('torch.', '')}")
    if v.device != input.device:
        raise ValueError(f"{name} must be on {input.device} like input, got {v.device}")
    return v.contiguous()


def _check_index_out(input: torch.Tensor, out: object, k: int, name: str) -> torch.Tensor:
    check_tensor(out, name)
    want = (input.shape[0], k)
    if tuple(out.shape) != want:
        raise ValueError(f"{name} must have shape {want}, got {tuple(out.shape)}")
    if out.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {str(out.dtype).replace('torch.', '')}")
    if out.device != input.device:
        raise ValueError(f"{name} must be on {input.device} like input, got {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return out


def _check_modes(deterministic: object, tie_break: object, dsa_graph_safe: object) -> int:
    # Every path here is deterministic and graph safe, so both flags are promises this
    # implementation always keeps; they are still checked, so a typo is not silently accepted.
    _check_flag(deterministic, "deterministic")
    _check_flag(dsa_graph_safe, "dsa_graph_safe")
    return _check_tie_break(tie_break)


# [top_k_api.begin]
@flashinfer_api
def top_k(
    input: torch.Tensor,
    k: int,
    sorted: bool = False,
    deterministic: bool = False,
    tie_break: int = TopKTieBreak.NONE,
    dsa_graph_safe: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""The ``k`` largest elements of each row (radix select; a drop-in for ``torch.topk``).

    Parameters
    ----------
    input : torch.Tensor
        ``(batch_size, d)``, float32, float16 or bfloat16, on a CUDA device; the last dim
        contiguous, the row stride arbitrary.
    k : int
        How many to select per row, ``1 <= k <= d`` (``k > d`` is a ``ValueError``, as in
        ``torch.topk``).
    sorted : bool
        False (default): the selected elements in an unspecified but deterministic order.
        True: descending by value, equal values by ascending index (``torch.topk``'s order).
    deterministic : bool
        Repeatable selection and order for a fixed input. Every call here is deterministic, so
        False gives the same result as True.
    tie_break : int or TopKTieBreak
        Which elements equal to the k-th largest value are kept: ``0`` (``NONE``, no promise;
        here the smaller indices), ``1`` (``SMALL``: smaller indices), ``2`` (``LARGE``: larger
        indices). It chooses the set, not the order.
    dsa_graph_safe : bool
        Require a CUDA-graph-safe path. Every path here is (no host synchronization, no
        allocation that depends on the data), so it changes nothing.

    Returns
    -------
    values : torch.Tensor
        ``(batch_size, k)``, the dtype of ``input``. NaN counts as the largest value.
    indices : torch.Tensor
        ``(batch_size, k)`` int64, the column of each value.

    Examples
    --------
    >>> logits = torch.randn(4, 32000, device="cuda")
    >>> values, indices = flashinfer.top_k(logits, 256)
    >>> values, indices = flashinfer.top_k(logits, 256, sorted=True)  # as torch.topk
    """
    _check_scores(input)
    k = _check_k(k)
    _check_flag(sorted, "sorted")
    tie = _check_modes(deterministic, tie_break, dsa_graph_safe)
    if k > input.shape[1]:
        raise ValueError(f"k must be at most input.shape[1] ({input.shape[1]}), got {k}")
    check_cuda(input, "input")
    b = input.shape[0]
    values = torch.empty(b, k, dtype=input.dtype, device=input.device)
    indices = torch.empty(b, k, dtype=torch.int64, device=input.device)
    if b == 0:
        return values, indices
    kernel_sorts = sorted and k <= _MAX_KERNEL_SORT_K
    get_topk_module().top_k(input, values, indices, k, kernel_sorts, tie)
    if sorted and not kernel_sorts:
        # Equal values leave the kernel in ascending index order, so a stable sort keeps
        # torch.topk's tie order.
        values, perm = torch.sort(values, dim=-1, descending=True, stable=True)
        indices = torch.gather(indices, -1, perm)
    return values, indices
# [top_k_api.end]


#: Alias, as upstream.
topk = top_k


@flashinfer_api
def top_k_page_table_transform(
    input: torch.Tensor,
    src_page_table: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    row_to_batch: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    tie_break: int = TopKTieBreak.NONE,
    dsa_graph_safe: bool = False,
    row_starts: Optional[torch.Tensor] = None,
    page_table_row_starts: Optional[torch.Tensor] = None,
    *,
    page_size: int = 1,
    out: Optional[torch.Tensor] = None,
    out_raw_indices: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    r"""Fused top-k selection and page-table lookup (the second stage of sparse attention).

    For the ``j``-th index ``idx`` selected in row ``i`` (relative to ``row_starts[i]``)::

        page = src_page_table[b, page_table_row_starts[i] + idx // page_size]
        out[i, j] = page * page_size + idx % page_size

    with ``b = row_to_batch[i]`` (default ``i``). If ``lengths[i] <= k`` every index
    ``0 .. lengths[i] - 1`` is selected, in order; unused positions are ``-1``.

    Parameters
    ----------
    input : torch.Tensor
        Scores ``(num_rows, max_len)``, float32, float16 or bfloat16; last dim contiguous.
    src_page_table : torch.Tensor
        ``(batch_size, max_page_table_length)`` int32, last dim contiguous. Entries used must be
        non-negative and ``page * page_size + offset`` must fit int32 (not checked). A lookup
        outside the table writes ``-1``.
    lengths : torch.Tensor
        ``(num_rows,)`` int32: the scores of row ``i`` are
        ``input[i, row_starts[i] : row_starts[i] + lengths[i]]`` (clamped to the row).
    k : int
        Positive; may exceed ``max_len``.
    row_to_batch : torch.Tensor, optional
        ``(num_rows,)`` int32 batch index of each row.
    deterministic, tie_break, dsa_graph_safe
        As in :func:`top_k`.
    row_starts : torch.Tensor, optional
        ``(num_rows,)`` int32 start of each row's window in ``input`` (default 0).
    page_table_row_starts : torch.Tensor, optional
        ``(num_rows,)`` int32 start of each row's window in the page table, in entries (default
        ``row_starts``; required when ``page_size > 1`` and ``row_starts`` is given).
    page_size : int
        Score positions per page-table entry, a power of two ``<= 2**30`` (default 1).
    out, out_raw_indices : torch.Tensor, optional
        Contiguous ``(num_rows, k)`` int32 buffers; ``out_raw_indices`` receives the selected
        indices before the lookup (``-1`` padding too).

    Returns
    -------
    torch.Tensor
        ``(num_rows, k)`` int32 (``out`` when given).

    Examples
    --------
    >>> scores = torch.randn(8, 4096, device="cuda", dtype=torch.float16)
    >>> table = torch.randint(0, 1000, (8, 4096), device="cuda", dtype=torch.int32)
    >>> lengths = torch.full((8,), 4096, device="cuda", dtype=torch.int32)
    >>> pages = flashinfer.top_k_page_table_transform(scores, table, lengths, 256)
    """
    _check_scores(input)
    k = _check_k(k)
    tie = _check_modes(deterministic, tie_break, dsa_graph_safe)
    check_tensor(src_page_table, "src_page_table")
    check_ndim(src_page_table, "src_page_table", (2,))
    if src_page_table.dtype != torch.int32:
        raise ValueError(f"src_page_table must be int32, got {src_page_table.dtype}")
    if src_page_table.device != input.device:
        raise ValueError(
            f"src_page_table must be on {input.device} like input, got {src_page_table.device}"
        )
    if isinstance(page_size, bool) or not isinstance(page_size, int):
        raise TypeError(f"page_size must be an int, got {type(page_size).__name__}")
    if page_size <= 0 or page_size > 1 << 30 or page_size & (page_size - 1):
        raise ValueError(
            f"page_size must be a positive power of two no greater than 2**30, got {page_size}"
        )
    if page_size > 1 and row_starts is not None and page_table_row_starts is None:
        raise ValueError("page_table_row_starts is required with page_size > 1 and row_starts")
    lengths = _check_row_vector(input, lengths, "lengths")
    opt = {}
    for name, v in (("row_to_batch", row_to_batch), ("row_starts", row_starts),
                    ("page_table_row_starts", page_table_row_starts)):
        opt[name] = None if v is None else _check_row_vector(input, v, name)
    if opt["page_table_row_starts"] is None:
        opt["page_table_row_starts"] = opt["row_starts"]
    if out is not None:
        _check_index_out(input, out, k, "out")
    if out_raw_indices is not None:
        _check_index_out(input, out_raw_indices, k, "out_raw_indices")
        if out is not None and out.untyped_storage().data_ptr() == \
                out_raw_indices.untyped_storage().data_ptr():
            raise ValueError("out_raw_indices must not overlap out")
    check_cuda(input, "input")
    if src_page_table.shape[1] > 1 and src_page_table.stride(1) != 1:
        src_page_table = src_page_table.contiguous()
    if out is None:
        out = torch.empty(input.shape[0], k, dtype=torch.int32, device=input.device)
    if input.shape[0] == 0:
        return out
    get_topk_module().top_k_page_table_transform(
        input, out, out_raw_indices, src_page_table, lengths, opt["row_to_batch"],
        opt["row_starts"], opt["page_table_row_starts"], k, page_size.bit_length() - 1, tie,
    )
    return out


@flashinfer_api
def top_k_ragged_transform(
    input: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    deterministic: bool = False,
    tie_break: int = TopKTieBreak.NONE,
    dsa_graph_safe: bool = False,
    row_starts: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    r"""Fused top-k selection and offset (ragged KV layout of sparse attention).

    ``out[i, j] = idx + offsets[i]`` for the ``j``-th index ``idx`` selected in row ``i``
    (relative to ``row_starts[i]``). If ``lengths[i] <= k`` every index ``0 .. lengths[i] - 1``
    is selected, in order; unused positions are ``-1`` (no offset added).

    Parameters
    ----------
    input : torch.Tensor
        Scores ``(num_rows, max_len)``, float32, float16 or bfloat16; last dim contiguous.
    offsets : torch.Tensor
        ``(num_rows,)`` int32 added to each selected index.
    lengths : torch.Tensor
        ``(num_rows,)`` int32 valid length of each row (clamped to the row).
    k : int
        Positive; may exceed ``max_len``.
    deterministic, tie_break, dsa_graph_safe
        As in :func:`top_k`.
    row_starts : torch.Tensor, optional
        ``(num_rows,)`` int32 start of each row's window in ``input`` (default 0).

    Returns
    -------
    torch.Tensor
        ``(num_rows, k)`` int32.

    Examples
    --------
    >>> scores = torch.randn(8, 4096, device="cuda", dtype=torch.float16)
    >>> offsets = torch.arange(0, 8 * 4096, 4096, device="cuda", dtype=torch.int32)
    >>> lengths = torch.full((8,), 4096, device="cuda", dtype=torch.int32)
    >>> idx = flashinfer.top_k_ragged_transform(scores, offsets, lengths, 256)
    """
    _check_scores(input)
    k = _check_k(k)
    tie = _check_modes(deterministic, tie_break, dsa_graph_safe)
    offsets = _check_row_vector(input, offsets, "offsets")
    lengths = _check_row_vector(input, lengths, "lengths")
    starts = None if row_starts is None else _check_row_vector(input, row_starts, "row_starts")
    check_cuda(input, "input")
    out = torch.empty(input.shape[0], k, dtype=torch.int32, device=input.device)
    if input.shape[0] == 0:
        return out
    get_topk_module().top_k_ragged_transform(input, out, offsets, lengths, starts, k, tie)
    return out

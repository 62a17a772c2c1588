"""Merging attention states (the public names are re-exported by :mod:`flashinfer.cascade`).

An attention state over a set of keys is ``(v, s)``: ``v`` the attention output (the softmax-
weighted sum of the values) and ``s`` its **base-2** log-sum-exp, ``s = log2(sum_j exp(logit_j))``
(natural logsumexp / ln 2), float32, ``-inf`` for an empty set. States over disjoint key sets
merge exactly into the state over their union::

    s = log2(2**s_a + 2**s_b)
    v = 2**(s_a - s) * v_a + 2**(s_b - s) * v_b

(computed around ``max(s_a, s_b)``: no overflow for any finite ``s``). A state with ``s = -inf``
has weight 0 and its ``v`` is ignored; merging only empty states gives ``v = 0``, ``s = -inf``.
The math is float32, each output rounded once to ``v``'s dtype. This is how cascade attention
combines a shared prefix with each request's own keys, and how split-KV attention combines its
chunks (``include/flashinfer/cascade.cuh``, ``MergeStatesVarlen``, launched from C++).
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from .._checks import (
    FLOAT_DTYPES,
    check_cuda,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
    check_out,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
    resolve_pdl,
)
from ..api_logging import flashinfer_api
from ..jit.cascade import gen_cascade_module

__all__ = ["merge_state", "merge_state_in_place", "merge_states"]

#: Longest head row the kernels take (one thread per vector of a row, see cascade.cuh).
MAX_HEAD_DIM = 1024


@functools.cache
def get_cascade_module():
    return gen_cascade_module().build_and_load()


#: Bindings the checked paths have fetched (so a fast path that finds one compiles nothing).
_LOADED: dict = {}


def _check_v(v: torch.Tensor, name: str, ndim: int) -> None:
    check_tensor(v, name)
    check_ndim(v, name, (ndim,))
    check_dtype(v, name, FLOAT_DTYPES)
    check_last_dim_contiguous(v, name)
    if v.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"{name}.shape[-1] (head_dim) must be at most {MAX_HEAD_DIM}, got "
                         f"shape {tuple(v.shape)}")


def _check_like(v: torch.Tensor, v_name: str, x: torch.Tensor, name: str) -> None:
    """``x`` has ``v``'s shape, dtype and device, last dim contiguous."""
    check_tensor(x, name)
    check_shape(x, name, v.shape)
    check_same_dtype(v, v_name, x, name)
    check_same_device(v, v_name, x, name)
    check_last_dim_contiguous(x, name)


def _lse(s: torch.Tensor, name: str, shape, v: torch.Tensor, v_name: str) -> torch.Tensor:
    """``s`` checked against ``shape`` and ``v``'s device, as float32 (the same tensor if it is
    float32 already)."""
    check_tensor(s, name)
    check_shape(s, name, shape)
    if not s.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor (float32 expected), got {s.dtype}")
    check_same_device(v, v_name, s, name)
    return s.to(torch.float32)


@flashinfer_api
def merge_state(
    v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Merge two attention states over disjoint key sets.

    ``s = log2(2**s_a + 2**s_b)``, ``v = 2**(s_a - s) * v_a + 2**(s_b - s) * v_b``.

    Parameters
    ----------
    v_a, v_b : torch.Tensor
        ``(seq_len, num_heads, head_dim)``, float16 or bfloat16 (float32 also accepted), same
        dtype; last dim contiguous, leading strides free.
    s_a, s_b : torch.Tensor
        ``(seq_len, num_heads)`` base-2 log-sum-exps, float32 (other float dtypes are cast).

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        The merged ``v`` (``v_a``'s shape and dtype, contiguous) and ``s`` (float32).

    Examples
    --------
    >>> va = torch.randn(2048, 32, 128, dtype=torch.float16, device="cuda")
    >>> sa = torch.randn(2048, 32, dtype=torch.float32, device="cuda")
    >>> vb = torch.randn(2048, 32, 128, dtype=torch.float16, device="cuda")
    >>> sb = torch.randn(2048, 32, dtype=torch.float32, device="cuda")
    >>> v, s = flashinfer.merge_state(va, sa, vb, sb)
    >>> v.shape, s.shape
    (torch.Size([2048, 32, 128]), torch.Size([2048, 32]))
    """
    binding = _LOADED.get("merge_state")
    if binding is not None and type(v_a) is torch.Tensor and v_a.is_cuda:
        # Fast path (the module is loaded): the binding checks everything the checked path
        # below does, with the same typed errors; what it refuses (or a float s it would take
        # after a cast, or head_dim 0) goes through the checked path, which raises or handles
        # it. Nothing is launched before the binding's checks pass.
        shape = v_a.shape
        if len(shape) == 3 and shape[2]:
            device = v_a.device
            v = torch.empty(shape, dtype=v_a.dtype, device=device)
            s = torch.empty(shape[:2], dtype=torch.float32, device=device)
            try:
                binding(v, s, v_a, s_a, v_b, s_b, resolve_pdl(None, device))
                return v, s
            except (TypeError, ValueError):
                pass
    _check_v(v_a, "v_a", 3)
    _check_like(v_a, "v_a", v_b, "v_b")
    s_a = _lse(s_a, "s_a", v_a.shape[:2], v_a, "v_a")
    s_b = _lse(s_b, "s_b", v_a.shape[:2], v_a, "v_a")
    check_cuda(v_a, "v_a")
    v = torch.empty(v_a.shape, dtype=v_a.dtype, device=v_a.device)
    s = torch.empty(v_a.shape[:2], dtype=torch.float32, device=v_a.device)
    if v.numel() > 0:
        binding = _LOADED["merge_state"] = get_cascade_module().merge_state
        binding(v, s, v_a, s_a, v_b, s_b, resolve_pdl(None, v.device))
    elif s.numel() > 0:  # head_dim 0: only the log-sum-exps are defined
        torch.logaddexp2(s_a, s_b, out=s)
    return v, s


@flashinfer_api
def merge_state_in_place(
    v: torch.Tensor,
    s: torch.Tensor,
    v_other: torch.Tensor,
    s_other: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
) -> None:
    r"""Merge ``(v_other, s_other)`` into ``(v, s)``, in place.

    Parameters
    ----------
    v : torch.Tensor
        ``(seq_len, num_heads, head_dim)``, float16 or bfloat16 (float32 also accepted), last dim
        contiguous; overwritten with the merged output.
    s : torch.Tensor
        ``(seq_len, num_heads)``, **float32**, overwritten with the merged log-sum-exp. It is
        converted with ``s.to(torch.float32)`` first (as FlashInfer does), so an ``s`` of another
        dtype is read but its update lands in a temporary copy and is lost.
    v_other : torch.Tensor
        ``v``'s shape and dtype.
    s_other : torch.Tensor
        ``(seq_len, num_heads)``, float32 (other float dtypes are cast).
    mask : torch.Tensor, optional
        ``(seq_len,)`` bool on ``v``'s device: rows with False are left untouched (useful
        under CUDA graphs, where the set of rows to merge changes between replays).

    Examples
    --------
    >>> v = torch.randn(2048, 32, 128, dtype=torch.float16, device="cuda")
    >>> s = torch.randn(2048, 32, dtype=torch.float32, device="cuda")
    >>> v_other = torch.randn(2048, 32, 128, dtype=torch.float16, device="cuda")
    >>> s_other = torch.randn(2048, 32, dtype=torch.float32, device="cuda")
    >>> flashinfer.merge_state_in_place(v, s, v_other, s_other)
    """
    _check_v(v, "v", 3)
    _check_like(v, "v", v_other, "v_other")
    s = _lse(s, "s", v.shape[:2], v, "v")
    s_other = _lse(s_other, "s_other", v.shape[:2], v, "v")
    if mask is not None:
        check_tensor(mask, "mask")
        check_shape(mask, "mask", (v.shape[0],))
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be bool, got {mask.dtype}")
        check_same_device(v, "v", mask, "mask")
        mask = mask.contiguous()
    check_cuda(v, "v")
    if v.numel() > 0:
        get_cascade_module().merge_state_in_place(
            v, s, v_other, s_other, mask, resolve_pdl(None, v.device)
        )
    elif s.numel() > 0:  # head_dim 0: only the log-sum-exps change
        merged = torch.logaddexp2(s, s_other)
        s.copy_(merged if mask is None else torch.where(mask[:, None], merged, s))


@flashinfer_api
def merge_states(v: torch.Tensor, s: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Merge ``num_states`` attention states per (row, head).

    ``s_merged = log2(sum_i 2**s[:, i])``, ``v_merged = sum_i 2**(s[:, i] - s_merged) v[:, i]``.

    Parameters
    ----------
    v : torch.Tensor
        ``(seq_len, num_states, num_heads, head_dim)``, float16 or bfloat16 (float32 also
        accepted), last dim contiguous, leading strides free.
    s : torch.Tensor
        ``(seq_len, num_states, num_heads)``, float32 (other float dtypes are cast).

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``v_merged (seq_len, num_heads, head_dim)`` in ``v``'s dtype, ``s_merged
        (seq_len, num_heads)`` float32. With ``num_states == 0``: zeros and ``-inf``.

    Examples
    --------
    >>> v = torch.randn(2048, 100, 32, 128, dtype=torch.float16, device="cuda")
    >>> s = torch.randn(2048, 100, 32, dtype=torch.float32, device="cuda")
    >>> v_merged, s_merged = flashinfer.merge_states(v, s)
    >>> v_merged.shape, s_merged.shape
    (torch.Size([2048, 32, 128]), torch.Size([2048, 32]))
    """
    _check_v(v, "v", 4)
    s = _lse(s, "s", v.shape[:3], v, "v")
    check_cuda(v, "v")
    seq_len, _, num_heads, head_dim = v.shape
    v_merged = torch.empty(seq_len, num_heads, head_dim, dtype=v.dtype, device=v.device)
    s_merged = torch.empty(seq_len, num_heads, dtype=torch.float32, device=v.device)
    if v_merged.numel() > 0:
        get_cascade_module().merge_states(v_merged, s_merged, v, s, resolve_pdl(None, v.device))
    elif s_merged.numel() > 0:  # head_dim 0: only the log-sum-exps are defined
        torch.logsumexp(s * _LN2, dim=1, out=s_merged)
        s_merged.div_(_LN2)
    return v_merged, s_merged


_LN2 = 0.6931471805599453


def merge_states_varlen(
    v_part: torch.Tensor,
    lse_part: torch.Tensor,
    indptr: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    return_lse: bool = True,
    enable_pdl: Optional[bool] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Test and benchmark entry to the split-KV reduction (``MergeStatesVarlen``), which the
    attention kernels launch from C++.

    Row ``r`` merges the parts ``v_part[indptr[r]:indptr[r+1]]`` (float32 ``[P, H, D]``,
    contiguous) with ``lse_part`` (float32 ``[P, H]``); an empty range gives 0 and ``-inf``.
    ``out`` is ``(len(indptr) - 1, H, D)`` of ``out_dtype`` (row and head strides free, last
    dim contiguous); ``lse`` float32 ``(rows, H)`` contiguous, when ``return_lse``.
    """
    check_tensor(v_part, "v_part")
    check_ndim(v_part, "v_part", (3,))
    if v_part.dtype != torch.float32 or not v_part.is_contiguous():
        raise ValueError(f"v_part must be contiguous float32, got {v_part.dtype}, strides "
                         f"{tuple(v_part.stride())}")
    parts, heads, head_dim = v_part.shape
    check_tensor(lse_part, "lse_part")
    check_shape(lse_part, "lse_part", (parts, heads))
    if lse_part.dtype != torch.float32 or not lse_part.is_contiguous():
        raise ValueError("lse_part must be contiguous float32")
    check_tensor(indptr, "indptr")
    check_ndim(indptr, "indptr", (1,))
    if indptr.dtype != torch.int32 or indptr.shape[0] < 1:
        raise ValueError(f"indptr must be int32 with >= 1 entries, got {indptr.dtype} "
                         f"{tuple(indptr.shape)}")
    rows = indptr.shape[0] - 1
    device = v_part.device
    if out is None:
        out = torch.empty(rows, heads, head_dim, dtype=out_dtype, device=device)
    check_out(out, "out", shape=(rows, heads, head_dim), dtype=out.dtype, device=device)
    check_last_dim_contiguous(out, "out")
    if return_lse and lse is None:
        lse = torch.empty(rows, heads, dtype=torch.float32, device=device)
    if lse is not None:
        check_out(lse, "lse", shape=(rows, heads), dtype=torch.float32, device=device)
    check_cuda(v_part, "v_part")
    if out.numel() > 0:
        get_cascade_module().merge_states_varlen(
            out, lse, v_part, lse_part, indptr.contiguous(), resolve_pdl(enable_pdl, device)
        )
    return out, lse

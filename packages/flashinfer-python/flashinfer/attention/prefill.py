"""Prefill attention over a batch of requests: :class:`BatchPrefillWithPagedKVCacheWrapper`
(paged KV cache) and :class:`BatchPrefillWithRaggedKVCacheWrapper` (ragged K/V), both plan once
per batch and run per layer (:class:`.wrapper.BatchAttentionBase`). The semantics are those of
:mod:`.single`."""

from __future__ import annotations

from typing import Optional, Union

import torch

from ..page import unpack_paged_kv_cache
from . import runtime as rt
from .wrapper import (
    BatchAttentionBase,
    check_given_lens,
    check_given_max,
    check_head_dim,
    check_page_ids,
    host_ints,
    legacy_forwards,
    lens_from_indptr,
    paged_kv_lens,
    refuse_unsupported,
)


class BatchPrefillWithPagedKVCacheWrapper(BatchAttentionBase):
    """Prefill attention over a paged KV cache for a batch of requests (plan once, run per layer).

    The cache is one 5-D tensor ``[pages, 2, page_size, Hkv, D]`` (NHD) /
    ``[pages, 2, Hkv, page_size, D]`` (HND) or a ``(k, v)`` tuple of 4-D tensors; the page table
    is ``paged_kv_indptr [B+1]``, ``paged_kv_indices`` and ``paged_kv_last_page_len [B]``.
    """

    _paged = True

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf: Optional[torch.Tensor] = None,
                 paged_kv_indptr_buf: Optional[torch.Tensor] = None,
                 paged_kv_indices_buf: Optional[torch.Tensor] = None,
                 paged_kv_last_page_len_buf: Optional[torch.Tensor] = None,
                 custom_mask_buf: Optional[torch.Tensor] = None,
                 mask_indptr_buf: Optional[torch.Tensor] = None, backend: str = "auto",
                 jit_args: Optional[list] = None, jit_kwargs: Optional[dict] = None) -> None:
        refuse_unsupported("BatchPrefillWithPagedKVCacheWrapper", jit_args=jit_args,
                           jit_kwargs=jit_kwargs)
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        if use_cuda_graph and any(b is None for b in (qo_indptr_buf, paged_kv_indptr_buf,
                                                      paged_kv_indices_buf,
                                                      paged_kv_last_page_len_buf)):
            raise ValueError("use_cuda_graph=True needs qo_indptr_buf, paged_kv_indptr_buf, "
                             "paged_kv_indices_buf and paged_kv_last_page_len_buf")
        self._bufs = {"qo_indptr": qo_indptr_buf, "kv_indptr": paged_kv_indptr_buf,
                      "kv_indices": paged_kv_indices_buf,
                      "kv_last_page_len": paged_kv_last_page_len_buf,
                      "custom_mask": custom_mask_buf, "mask_indptr": mask_indptr_buf}

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor,
             paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int,
             head_dim_vo: Optional[int] = None, custom_mask: Optional[torch.Tensor] = None,
             packed_custom_mask: Optional[torch.Tensor] = None, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             sm_scale: Optional[float] = None, window_left: int = -1,
             logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type: Union[str, torch.dtype] = "float16",
             kv_data_type: Optional[Union[str, torch.dtype]] = None,
             o_data_type: Optional[Union[str, torch.dtype]] = None, non_blocking: bool = True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len: int = 0,
             max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None,
             max_token_per_sequence=None, max_sequence_kv=None,
             fixed_split_size: Optional[int] = None, disable_split_kv: bool = False) -> None:
        """Schedule the batch; see the class docstring for the metadata layout.
        ``seq_lens`` / ``seq_lens_q`` (per-request KV / query lengths) and
        ``max_token_per_sequence`` / ``max_sequence_kv`` (their maxima), which FlashInfer takes
        for other backends, are checked against the indptr arrays."""
        plan_args = dict(locals())
        refuse_unsupported("plan", use_fp16_qk_reduction=use_fp16_qk_reduction,
                           prefix_len_ptr=prefix_len_ptr,
                           token_pos_in_items_ptr=token_pos_in_items_ptr,
                           token_pos_in_items_len=token_pos_in_items_len,
                           max_item_len_ptr=max_item_len_ptr, block_tables=block_tables)
        check_head_dim(head_dim_qk, head_dim_vo)
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self._set_options(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                          head_dim=head_dim_qk, head_dim_vo=head_dim_vo,
                          pos_encoding_mode=pos_encoding_mode,
                          sm_scale=sm_scale, window_left=window_left,
                          logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
                          rope_theta=rope_theta, q_data_type=q_data_type,
                          kv_data_type=kv_data_type, o_data_type=o_data_type)
        page_indptr = host_ints(paged_kv_indptr, "paged_kv_indptr")
        self._num_page_ids = page_indptr[-1] if page_indptr else 0
        self._max_page_id = check_page_ids(paged_kv_indices, page_indptr[-1] if page_indptr else 0,
                                           "paged_kv_indices")
        kv_lens = paged_kv_lens(page_indptr,
                                host_ints(paged_kv_last_page_len, "paged_kv_last_page_len"),
                                page_size)
        self._page_size = page_size
        qo_lens = lens_from_indptr(host_ints(qo_indptr, "qo_indptr"), "qo_indptr")
        check_given_lens(seq_lens, kv_lens, "seq_lens", "KV lengths")
        check_given_lens(seq_lens_q, qo_lens, "seq_lens_q", "query lengths")
        check_given_max(max_token_per_sequence, qo_lens, "max_token_per_sequence")
        check_given_max(max_sequence_kv, kv_lens, "max_sequence_kv")
        _, _, self._kv_indices, self._kv_last_page_len = self._plan_prefill(
            qo_lens, kv_lens, [
                (self._bufs.get("qo_indptr"), qo_indptr, "qo_indptr"),
                (self._bufs["kv_indptr"], paged_kv_indptr, "paged_kv_indptr"),
                (self._bufs["kv_indices"], paged_kv_indices, "paged_kv_indices"),
                (self._bufs["kv_last_page_len"], paged_kv_last_page_len,
                 "paged_kv_last_page_len")],
            custom_mask, packed_custom_mask, causal, num_qo_heads, num_kv_heads, head_dim_qk,
            non_blocking, fixed_split_size, disable_split_kv, self._bufs, kv_begins=page_indptr)
        self._remember_plan(plan_args)

    begin_forward = plan

    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale: Optional[float] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl: Optional[bool] = None,
            window_left: Optional[int] = None, sinks: Optional[torch.Tensor] = None, **extra):
        """``q (qo_indptr[-1], Hq, head_dim_qk)`` -> output ``(.., Hq, head_dim_vo)`` (and the
        lse when ``return_lse``). The cache's v has head_dim_vo (a ``(k, v)`` tuple where it
        differs from head_dim_qk). ``sinks``: attention sinks, ``(Hq,)`` float32
        (``check_sinks``): each row's softmax sum gains ``exp(sinks[h])`` with no value row; the
        lse includes it."""
        kw = self._legacy_run_args(args, dict(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                              out=out, lse=lse, return_lse=return_lse))
        self._check_run_common(q, kw["out"], kw["lse"], kw["return_lse"], window_left, extra)
        if self._plan.num_rows and q.shape[0] < self._plan.num_rows and not self._use_cuda_graph:
            raise ValueError(f"q must have qo_indptr[-1] = {self._plan.num_rows} rows, got "
                             f"{q.shape[0]}")
        k, v = unpack_paged_kv_cache(paged_kv_cache, self._kv_layout)
        self._check_kv_dtype(k, v)
        return self._launch(q, k, v, kw["out"], kw["lse"], kw["return_lse"], enable_pdl,
                            kw["q_scale"], kw["k_scale"], kw["v_scale"], sinks)

    forward, forward_return_lse = legacy_forwards(
        ("q", "paged_kv_cache"),
        ("causal", "pos_encoding_mode", "use_fp16_qk_reduction", "k_scale", "v_scale",
         "window_left", "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta"))


class BatchPrefillWithRaggedKVCacheWrapper(BatchAttentionBase):
    """Prefill attention over ragged K/V: request b's keys are rows
    ``kv_indptr[b]:kv_indptr[b+1]`` of ``k (nnz_kv, Hkv, D)`` (HND: ``(Hkv, nnz_kv, D)``)."""

    _paged = False

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf: Optional[torch.Tensor] = None,
                 kv_indptr_buf: Optional[torch.Tensor] = None,
                 custom_mask_buf: Optional[torch.Tensor] = None,
                 mask_indptr_buf: Optional[torch.Tensor] = None, backend: str = "auto",
                 jit_args: Optional[list] = None, jit_kwargs: Optional[dict] = None) -> None:
        refuse_unsupported("BatchPrefillWithRaggedKVCacheWrapper", jit_args=jit_args,
                           jit_kwargs=jit_kwargs)
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        if use_cuda_graph and (qo_indptr_buf is None or kv_indptr_buf is None):
            raise ValueError("use_cuda_graph=True needs qo_indptr_buf and kv_indptr_buf")
        self._bufs = {"qo_indptr": qo_indptr_buf, "kv_indptr": kv_indptr_buf,
                      "custom_mask": custom_mask_buf, "mask_indptr": mask_indptr_buf}
        self._kv_indices = self._kv_last_page_len = None

    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, num_qo_heads: int,
             num_kv_heads: int, head_dim_qk: int, head_dim_vo: Optional[int] = None,
             custom_mask: Optional[torch.Tensor] = None,
             packed_custom_mask: Optional[torch.Tensor] = None, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             window_left: int = -1, logits_soft_cap: Optional[float] = None,
             sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type: Union[str, torch.dtype] = "float16",
             kv_data_type: Optional[Union[str, torch.dtype]] = None,
             o_data_type: Optional[Union[str, torch.dtype]] = None, non_blocking: bool = True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len: int = 0,
             max_item_len_ptr=None, fixed_split_size: Optional[int] = None,
             disable_split_kv: bool = False, v_indptr=None, o_indptr=None) -> None:
        """Schedule the batch (note: ``window_left, logits_soft_cap, sm_scale`` come in another
        order than in the paged wrapper's plan, as in FlashInfer)."""
        plan_args = dict(locals())
        refuse_unsupported("plan", use_fp16_qk_reduction=use_fp16_qk_reduction,
                           prefix_len_ptr=prefix_len_ptr,
                           token_pos_in_items_ptr=token_pos_in_items_ptr,
                           token_pos_in_items_len=token_pos_in_items_len,
                           max_item_len_ptr=max_item_len_ptr, v_indptr=v_indptr,
                           o_indptr=o_indptr)
        check_head_dim(head_dim_qk, head_dim_vo)
        self._set_options(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                          head_dim=head_dim_qk, head_dim_vo=head_dim_vo,
                          pos_encoding_mode=pos_encoding_mode,
                          sm_scale=sm_scale, window_left=window_left,
                          logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
                          rope_theta=rope_theta, q_data_type=q_data_type,
                          kv_data_type=kv_data_type, o_data_type=o_data_type)
        kv_lens = lens_from_indptr(host_ints(kv_indptr, "kv_indptr"), "kv_indptr")
        self._kv_nnz = sum(kv_lens)
        qo_lens = lens_from_indptr(host_ints(qo_indptr, "qo_indptr"), "qo_indptr")
        self._plan_prefill(qo_lens, kv_lens, [
            (self._bufs.get("qo_indptr"), qo_indptr, "qo_indptr"),
            (self._bufs["kv_indptr"], kv_indptr, "kv_indptr")],
            custom_mask, packed_custom_mask, causal, num_qo_heads, num_kv_heads, head_dim_qk,
            non_blocking, fixed_split_size, disable_split_kv, self._bufs)
        self._remember_plan(plan_args)

    begin_forward = plan

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args,
            q_scale: Optional[float] = None, k_scale: Optional[float] = None,
            v_scale: Optional[float] = None, o_scale: Optional[float] = None,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl: Optional[bool] = None,
            sinks: Optional[torch.Tensor] = None, **extra):
        """``q (qo_indptr[-1], Hq, head_dim_qk)``, ``k (kv_indptr[-1], Hkv, head_dim_qk)``,
        ``v (kv_indptr[-1], Hkv, head_dim_vo)`` -> output ``(.., Hq, head_dim_vo)``. ``sinks``:
        as the paged wrapper's (an addition: FlashInfer's ragged ``run`` has none)."""
        kw = self._legacy_run_args(args, dict(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                              out=out, lse=lse, return_lse=return_lse))
        self._check_run_common(q, kw["out"], kw["lse"], kw["return_lse"], None, extra)
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor) or x.dim() != 3:
                raise ValueError(f"{name} must be a 3-D tensor")
        nnz = k.shape[0] if self._kv_layout == "NHD" else k.shape[1]
        if nnz < self._kv_nnz:
            raise ValueError(f"k must hold kv_indptr[-1] = {self._kv_nnz} rows, got {nnz}")
        self._check_kv_dtype(k, v)
        o_scale = rt.check_scale(o_scale, "o_scale")
        v_scale = rt.check_scale(kw["v_scale"], "v_scale")
        v_scale_total = v_scale if o_scale is None else (v_scale or 1.0) * o_scale
        return self._launch(q, k, v, kw["out"], kw["lse"], kw["return_lse"], enable_pdl,
                            kw["q_scale"], kw["k_scale"], v_scale_total, sinks)

    forward, forward_return_lse = legacy_forwards(
        ("q", "k", "v"),
        ("causal", "pos_encoding_mode", "use_fp16_qk_reduction", "window_left",
         "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta"))

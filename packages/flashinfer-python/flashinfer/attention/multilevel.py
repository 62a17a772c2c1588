"""Multi-level cascade attention: a batch whose requests share KV prefixes (a system prompt,
a beam's common history) runs one paged prefill per level and merges the per-level states.

Level i groups the query rows by ``qo_indptr_arr[i]`` (``[0, total_q]``: one prefix shared by
every row) and reads that level's pages; the outputs are combined with
:func:`flashinfer.merge_state_in_place` (base-2 lse). ``causal`` applies only to the last
level, where each request's own keys are.
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence, Union

import torch

from .merge import merge_state_in_place
from .prefill import BatchPrefillWithPagedKVCacheWrapper


class MultiLevelCascadeAttentionWrapper:
    """One :class:`~flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper` per level, sharing
    the float workspace (levels run one after another on the stream)."""

    def __init__(self, num_levels: int, float_workspace_buffer: torch.Tensor,
                 kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf_arr: Optional[Sequence[torch.Tensor]] = None,
                 paged_kv_indptr_buf_arr: Optional[Sequence[torch.Tensor]] = None,
                 paged_kv_indices_buf_arr: Optional[Sequence[torch.Tensor]] = None,
                 paged_kv_last_page_len_buf_arr: Optional[Sequence[torch.Tensor]] = None) -> None:
        if num_levels < 1:
            raise ValueError(f"num_levels must be >= 1, got {num_levels}")
        bufs = (qo_indptr_buf_arr, paged_kv_indptr_buf_arr, paged_kv_indices_buf_arr,
                paged_kv_last_page_len_buf_arr)
        if use_cuda_graph and any(b is None or len(b) != num_levels for b in bufs):
            raise ValueError("use_cuda_graph=True needs the four buffer lists, one buffer per level")
        self._num_levels = num_levels
        self._use_cuda_graph = use_cuda_graph
        self._wrappers = [
            BatchPrefillWithPagedKVCacheWrapper(
                float_workspace_buffer, kv_layout, use_cuda_graph,
                *(b[i] if b is not None else None for b in bufs))
            for i in range(num_levels)
        ]

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor,
                               int_workspace_buffers: Sequence[Optional[torch.Tensor]]) -> None:
        for w, int_ws in zip(self._wrappers, int_workspace_buffers):
            w.reset_workspace_buffer(float_workspace_buffer, int_ws)

    def plan(self, qo_indptr_arr: Sequence[torch.Tensor], paged_kv_indptr_arr: Sequence[torch.Tensor],
             paged_kv_indices_arr: Sequence[torch.Tensor],
             paged_kv_last_page_len: Sequence[torch.Tensor], num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             sm_scale: Optional[float] = None, window_left: int = -1,
             logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type: Union[str, torch.dtype] = "float16",
             kv_data_type: Optional[Union[str, torch.dtype]] = None) -> None:
        """Plan every level; the lists have one entry per level."""
        arrays = (qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr,
                  paged_kv_last_page_len)
        for name, arr in zip(("qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_indices_arr",
                              "paged_kv_last_page_len"), arrays):
            if len(arr) != self._num_levels:
                raise ValueError(f"{name} must have {self._num_levels} entries (one per level), "
                                 f"got {len(arr)}")
        for level, w in enumerate(self._wrappers):
            w.plan(qo_indptr_arr[level], paged_kv_indptr_arr[level], paged_kv_indices_arr[level],
                   paged_kv_last_page_len[level], num_qo_heads, num_kv_heads, head_dim, page_size,
                   causal=causal and level == self._num_levels - 1,
                   pos_encoding_mode=pos_encoding_mode,
                   use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                   window_left=window_left, logits_soft_cap=logits_soft_cap,
                   rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                   kv_data_type=kv_data_type)

    begin_forward = plan

    def run(self, q: torch.Tensor, paged_kv_cache) -> torch.Tensor:
        """``q (total_q, Hq, D)`` -> the attention over all levels' keys, ``(total_q, Hq, D)``."""
        out, lse = self._wrappers[0].run(q, paged_kv_cache, return_lse=True)
        for w in self._wrappers[1:]:
            o_level, lse_level = w.run(q, paged_kv_cache, return_lse=True)
            merge_state_in_place(out, lse, o_level, lse_level)
        return out

    def forward(self, q: torch.Tensor, paged_kv_cache, causal: bool = False,
                pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                sm_scale: Optional[float] = None, window_left: int = -1,
                logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
                rope_theta: Optional[float] = None) -> torch.Tensor:
        """Deprecated (use ``run``): these options (defaults included) replace the planned ones
        of every level (``causal`` of the last), then the levels run."""
        warnings.warn("forward is deprecated; use plan() and run()", DeprecationWarning,
                      stacklevel=2)
        options = dict(pos_encoding_mode=pos_encoding_mode,
                       use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                       window_left=window_left, logits_soft_cap=logits_soft_cap,
                       rope_scale=rope_scale, rope_theta=rope_theta)
        for level, w in enumerate(self._wrappers):
            w._apply_legacy_options(causal=causal and level == self._num_levels - 1, **options)
        return self.run(q, paged_kv_cache)

    def end_forward(self) -> None:
        """Kept for compatibility; does nothing."""

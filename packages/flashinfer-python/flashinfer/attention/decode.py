"""Decode attention over a batch of requests: one query token per request over a paged KV
cache, planned once per batch and run per layer.

Both values of ``use_tensor_cores`` run the tensor-core kernel, with the query heads of each KV
head packed as the rows of one MMA tile (all of a KV head's query heads read each key once):
decode is bound by reading the KV cache, and that kernel reads it at close to the GPU's read
bandwidth (the decode cases' percent of the read ceiling are in benchmarks/results/), so a
CUDA-core kernel would add code and no speed. The flag is accepted for API compatibility; the
semantics are those of :mod:`.single`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional, Union

import torch

from ..page import unpack_paged_kv_cache
from .wrapper import (
    BatchAttentionBase,
    check_head_dim,
    check_page_ids,
    host_ints,
    make_variant,
    paged_kv_lens,
)

# Keyword-only plan arguments in the order older releases accepted them positionally.
_PLAN_ORDER = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type",
               "kv_data_type", "o_data_type", "data_type", "sm_scale", "rope_scale",
               "rope_theta", "non_blocking", "block_tables", "seq_lens", "fixed_split_size",
               "disable_split_kv", "q_len_per_req", "window_right")


@functools.lru_cache(maxsize=64)
def _arange(n: int) -> torch.Tensor:
    """0..n-1 as int32 on the host (decode's qo_indptr: one query per request); not written."""
    return torch.arange(n, dtype=torch.int32)


class BatchDecodeWithPagedKVCacheWrapper(BatchAttentionBase):
    """Decode attention over a paged KV cache for a batch of requests.

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        Byte buffer for split-KV partial states (~128 MB), 16-byte aligned.
    kv_layout : str
        ``"NHD"`` or ``"HND"``.
    use_cuda_graph : bool
        Metadata is copied into the three caller buffers at ``plan``; the batch size is frozen to
        ``len(paged_kv_last_page_len_buffer)`` and a captured ``run`` stays valid across plans.
    use_tensor_cores : bool
        Accepted for compatibility: both values run the tensor-core kernel (module docstring).
    """

    _paged = True
    # Every request is one query tile, so later plans of the fixed batch have the same tiles
    # (splits aside): no headroom. Idle CTAs are not free: at twice the items the captured
    # 64 x 4096 decode measured 353.3 vs 349.1 us (H100, benchmarks/tuning/graph_decode.py), and
    # with 16 idle CTAs still 353.5.
    _graph_item_headroom = 1

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False,
                 paged_kv_indptr_buffer: Optional[torch.Tensor] = None,
                 paged_kv_indices_buffer: Optional[torch.Tensor] = None,
                 paged_kv_last_page_len_buffer: Optional[torch.Tensor] = None,
                 backend: str = "auto", jit_args: Optional[list] = None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        if use_cuda_graph:
            for name, buf in (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                              ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                              ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)):
                if not isinstance(buf, torch.Tensor):
                    raise ValueError(f"use_cuda_graph=True requires {name}")
            self._fixed_batch = len(paged_kv_last_page_len_buffer)
        self._use_tensor_cores = use_tensor_cores
        self._bufs = {"kv_indptr": paged_kv_indptr_buffer, "kv_indices": paged_kv_indices_buffer,
                      "kv_last_page_len": paged_kv_last_page_len_buffer}
        self._mask = self._mask_indptr = None

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *args,
             pos_encoding_mode: str = "NONE", window_left: int = -1,
             logits_soft_cap: Optional[float] = None,
             q_data_type: Union[str, torch.dtype, None] = "float16",
             kv_data_type: Optional[Union[str, torch.dtype]] = None,
             o_data_type: Optional[Union[str, torch.dtype]] = None,
             data_type: Optional[Union[str, torch.dtype]] = None,
             sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, non_blocking: bool = True,
             block_tables: Optional[torch.Tensor] = None, seq_lens: Optional[torch.Tensor] = None,
             fixed_split_size: Optional[int] = None, disable_split_kv: bool = False,
             q_len_per_req: int = 1, window_right: int = 0) -> None:
        """Schedule one decode step: ``indptr [B+1]``, ``indices`` (page ids, any order),
        ``last_page_len [B]`` (int32, CPU or GPU)."""
        if args:
            warnings.warn("passing plan() options positionally is deprecated; use keywords",
                          DeprecationWarning, stacklevel=2)
            if len(args) > len(_PLAN_ORDER):
                raise TypeError(f"plan() takes at most {7 + len(_PLAN_ORDER)} positional arguments")
            loc = locals()
            values = {name: loc[name] for name in _PLAN_ORDER}
            values.update(zip(_PLAN_ORDER, args))
            return self.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads,
                             head_dim, page_size, **values)
        if q_len_per_req != 1:
            raise ValueError(f"q_len_per_req must be 1 for this wrapper, got {q_len_per_req}")
        if window_right not in (0, -1):
            raise ValueError(f"window_right must be 0, got {window_right}")
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        check_head_dim(head_dim)
        self._set_options(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                          head_dim=head_dim, pos_encoding_mode=pos_encoding_mode,
                          sm_scale=sm_scale, window_left=window_left,
                          logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
                          rope_theta=rope_theta, q_data_type=q_data_type,
                          kv_data_type=kv_data_type, o_data_type=o_data_type,
                          data_type=data_type)
        page_indptr = host_ints(indptr, "indptr")
        self._max_page_id = check_page_ids(indices, page_indptr[-1] if page_indptr else 0,
                                           "indices")
        kv_lens = paged_kv_lens(page_indptr, host_ints(last_page_len, "last_page_len"),
                                page_size)
        batch = len(kv_lens)
        if self._use_cuda_graph and batch != self._fixed_batch:
            raise ValueError(f"CUDA-graph mode: the batch size is fixed to {self._fixed_batch} "
                             f"(len(paged_kv_last_page_len_buffer)), got {batch}")
        self._batch = batch
        self._variant = make_variant(self._q_dtype, self._o_dtype, head_dim, "none",
                                 pos_encoding_mode, paged=True)
        plan, buf = self._schedule([1] * batch, kv_lens, num_qo_heads, num_kv_heads, head_dim,
                                   False, fixed_split_size, disable_split_kv, page_indptr)
        # qo_indptr right after the plan, whose length graph mode fixes: at a fixed address,
        # which a captured run keeps reading.
        self._qo_indptr, self._kv_indptr, self._kv_indices, self._kv_last_page_len = \
            self._set_plan(plan, buf, [
                (None, _arange(batch + 1), "qo_indptr"),
                (self._bufs["kv_indptr"], indptr, "indptr"),
                (self._bufs["kv_indices"], indices, "indices"),
                (self._bufs["kv_last_page_len"], last_page_len, "last_page_len")], non_blocking)

    begin_forward = plan

    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale: Optional[float] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl: Optional[bool] = None,
            window_left: Optional[int] = None, q_len_per_req: Optional[int] = None, **extra):
        """``q (B, Hq, D)`` -> ``(B, Hq, D)``, or ``(out, lse (B, Hq) float32)``."""
        kw = self._legacy_run_args(args, dict(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                              out=out, lse=lse, return_lse=return_lse))
        self._check_run_common(q, kw["out"], kw["lse"], kw["return_lse"], window_left, extra)
        if q.shape[0] != self._batch:
            raise ValueError(f"q must have one row per request ({self._batch}), got {q.shape[0]}")
        if q_len_per_req not in (None, 1):
            raise ValueError(f"q_len_per_req must be 1, got {q_len_per_req}")
        k, v = unpack_paged_kv_cache(paged_kv_cache, self._kv_layout)
        self._check_kv_dtype(k)
        return self._launch(q, k, v, kw["out"], kw["lse"], kw["return_lse"], enable_pdl,
                            kw["q_scale"], kw["k_scale"], kw["v_scale"])

    def forward(self, q, paged_kv_cache, pos_encoding_mode: str = "NONE", **kwargs):
        warnings.warn("forward is deprecated; use plan() and run()", DeprecationWarning,
                      stacklevel=2)
        self._check_legacy_options(kwargs, pos_encoding_mode=pos_encoding_mode)
        return self.run(q, paged_kv_cache, **kwargs)

    def forward_return_lse(self, q, paged_kv_cache, pos_encoding_mode: str = "NONE", **kwargs):
        warnings.warn("forward_return_lse is deprecated; use plan() and run_return_lse()",
                      DeprecationWarning, stacklevel=2)
        self._check_legacy_options(kwargs, pos_encoding_mode=pos_encoding_mode)
        return self.run(q, paged_kv_cache, return_lse=True, **kwargs)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """:class:`BatchDecodeWithPagedKVCacheWrapper` with ``use_cuda_graph=True``."""

    def __init__(self, workspace_buffer: torch.Tensor, indptr_buffer: torch.Tensor,
                 indices_buffer: torch.Tensor, last_page_len_buffer: torch.Tensor,
                 kv_layout: str = "NHD", use_tensor_cores: bool = False) -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True,
                         use_tensor_cores=use_tensor_cores,
                         paged_kv_indptr_buffer=indptr_buffer,
                         paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer)

"""Decode attention over a batch of requests: one query token per request over a paged KV
cache (or ``q_len_per_req`` of them, causal among themselves: speculative decoding), planned
once per batch and run per layer.

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
from . import runtime as rt
from .wrapper import (
    BatchAttentionBase,
    check_given_lens,
    check_head_dim,
    check_page_ids,
    host_ints,
    legacy_forwards,
    lens_from_indptr,
    make_variant,
    paged_kv_lens,
    refuse_unsupported,
)

# Keyword-only plan arguments in the order older releases accepted them positionally.
_PLAN_ORDER = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type",
               "kv_data_type", "o_data_type", "data_type", "sm_scale", "rope_scale",
               "rope_theta", "non_blocking", "block_tables", "seq_lens", "fixed_split_size",
               "disable_split_kv", "q_len_per_req", "window_right")


@functools.lru_cache(maxsize=64)
def _qo_indptr(batch: int, q_len: int) -> torch.Tensor:
    """0, q_len, ..., batch * q_len as int32 on the host (decode's qo_indptr: q_len query rows
    per request); not written."""
    return torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32)


def check_q_len_per_req(q_len_per_req, use_tensor_cores: bool) -> int:
    """``q_len_per_req`` of a decode plan: an int >= 1; more than 1 needs the tensor-core path,
    as upstream's (both paths are the tensor-core kernel here, but a wrapper that would fail
    upstream should fail here too)."""
    if isinstance(q_len_per_req, bool) or not isinstance(q_len_per_req, int) or q_len_per_req < 1:
        raise ValueError(f"q_len_per_req must be an int >= 1, got {q_len_per_req!r}")
    if q_len_per_req > 1 and not use_tensor_cores:
        raise ValueError(f"q_len_per_req={q_len_per_req} needs tensor-core decode: construct the "
                         "wrapper with use_tensor_cores=True")
    return q_len_per_req


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
        refuse_unsupported("BatchDecodeWithPagedKVCacheWrapper", jit_args=jit_args)
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
        self._q_len_per_req = 1  # query rows per request of the current plan

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    # -- what vLLM's own fast plan (``fast_plan_decode``) reads from a graph-mode wrapper -----
    @property
    def _fixed_batch_size(self) -> int:
        return self._fixed_batch if self._use_cuda_graph else 0

    @property
    def _float_workspace_buffer(self) -> torch.Tensor:
        return self._ws.float_ws

    @property
    def _int_workspace_buffer(self) -> torch.Tensor:
        return self._ws.int_ws

    @property
    def _pin_memory_int_workspace_buffer(self) -> None:
        """None: this wrapper stages its plans through its own pinned blocks."""
        return None

    @property
    def _cached_module(self) -> "_EnginePlan":
        """The object whose ``plan(*args)`` vLLM calls with FlashInfer's module arguments
        after writing the page table into the graph buffers (``_EnginePlan``)."""
        return _EnginePlan(self)

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
        ``last_page_len [B]`` (int32, CPU or GPU). ``q_len_per_req > 1`` (tensor cores only):
        each request brings that many query rows, ``q (B * q_len_per_req, Hq, D)``, row j of a
        request seeing its first ``kv_len - q_len_per_req + j + 1`` keys (causal, bottom-right
        aligned); every request needs ``kv_len >= q_len_per_req``. In CUDA-graph mode it is
        frozen by the first plan, like the batch size."""
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
        plan_args = dict(locals())
        refuse_unsupported("plan", block_tables=block_tables)
        check_q_len_per_req(q_len_per_req, self._use_tensor_cores)
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
        self._plan_batch(plan_args, indptr, indices, last_page_len, kv_lens, page_indptr,
                         seq_lens, num_qo_heads, num_kv_heads, head_dim, pos_encoding_mode,
                         fixed_split_size, disable_split_kv, non_blocking, q_len_per_req)

    def _plan_batch(self, plan_args, indptr, indices, last_page_len, kv_lens, page_indptr,
                    seq_lens, num_qo_heads, num_kv_heads, head_dim, pos_encoding_mode,
                    fixed_split_size, disable_split_kv, non_blocking, q_len=1) -> None:
        """The part of ``plan`` after the host metadata is read (``fast_decode_plan`` shares
        it): schedule, stage, remember the arguments. ``q_len`` > 1 (checked by the caller):
        a causal prefill of ``q_len`` rows per request over its keys."""
        check_given_lens(seq_lens, kv_lens, "seq_lens", "KV lengths")
        self._num_page_ids = page_indptr[-1] if page_indptr else 0
        batch = len(kv_lens)
        if self._use_cuda_graph and batch != self._fixed_batch:
            raise ValueError(f"CUDA-graph mode: the batch size is fixed to {self._fixed_batch} "
                             f"(len(paged_kv_last_page_len_buffer)), got {batch}")
        if self._use_cuda_graph and self._plan is not None and q_len != self._q_len_per_req:
            raise ValueError(f"CUDA-graph mode: q_len_per_req is fixed by the first plan to "
                             f"{self._q_len_per_req}, got {q_len}; use one wrapper per value")
        if q_len > 1 and min(kv_lens, default=q_len) < q_len:
            raise ValueError(f"q_len_per_req={q_len} needs kv_len >= q_len_per_req for every "
                             f"request (the new tokens are in the KV cache), got a request of "
                             f"kv_len {min(kv_lens)}")
        self._batch = batch
        self._variant = make_variant(self._q_dtype, self._o_dtype, head_dim,
                                     "causal" if q_len > 1 else "none", pos_encoding_mode,
                                     paged=True, kv_dtype=self._kv_dtype)
        plan, buf = self._schedule([q_len] * batch, kv_lens, num_qo_heads, num_kv_heads,
                                   head_dim, q_len > 1, fixed_split_size, disable_split_kv,
                                   page_indptr)
        self._q_len_per_req = q_len
        # qo_indptr right after the plan, whose length graph mode fixes: at a fixed address,
        # which a captured run keeps reading.
        self._qo_indptr, self._kv_indptr, self._kv_indices, self._kv_last_page_len = \
            self._set_plan(plan, buf, [
                (None, _qo_indptr(batch, q_len), "qo_indptr"),
                (self._bufs["kv_indptr"], indptr, "indptr"),
                (self._bufs["kv_indices"], indices, "indices"),
                (self._bufs["kv_last_page_len"], last_page_len, "last_page_len")], non_blocking)
        self._remember_plan(plan_args)

    begin_forward = plan

    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale: Optional[float] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl: Optional[bool] = None,
            window_left: Optional[int] = None, sinks: Optional[torch.Tensor] = None,
            q_len_per_req: Optional[int] = None, **extra):
        """``q (B * q_len_per_req, Hq, D)`` -> ``(B * q_len_per_req, Hq, D)``, or ``(out, lse
        (.., Hq) float32)``. ``sinks``: attention sinks, ``(Hq,)`` float32: each row's softmax
        sum gains ``exp(sinks[h])`` with no value row; the lse includes it. ``q_len_per_req``
        here is deprecated (pass it to ``plan``): it must be the planned one, and q's rows
        ``B * q_len_per_req``."""
        kw = self._legacy_run_args(args, dict(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                              out=out, lse=lse, return_lse=return_lse))
        self._check_run_common(q, kw["out"], kw["lse"], kw["return_lse"], window_left, extra)
        planned = self._q_len_per_req
        if q_len_per_req is not None:
            warnings.warn("run(q_len_per_req=...) is deprecated; pass it to plan()",
                          DeprecationWarning, stacklevel=2)
            if q.shape[0] != self._batch * q_len_per_req:
                raise ValueError(f"q.shape[0] ({q.shape[0]}) must be batch_size * q_len_per_req "
                                 f"({self._batch} * {q_len_per_req})")
        if q.shape[0] != self._batch * planned:
            raise ValueError(f"q must have batch_size * q_len_per_req = {self._batch} * "
                             f"{planned} rows (q_len_per_req as planned), got {q.shape[0]}")
        k, v = unpack_paged_kv_cache(paged_kv_cache, self._kv_layout)
        self._check_kv_dtype(k, v)
        return self._launch(q, k, v, kw["out"], kw["lse"], kw["return_lse"], enable_pdl,
                            kw["q_scale"], kw["k_scale"], kw["v_scale"], sinks)

    forward, forward_return_lse = legacy_forwards(
        ("q", "paged_kv_cache"),
        ("pos_encoding_mode", "q_scale", "k_scale", "v_scale", "window_left",
         "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta"))


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


def fast_decode_plan(self: BatchDecodeWithPagedKVCacheWrapper, indptr: torch.Tensor,
                     indices: torch.Tensor, last_page_len: torch.Tensor, num_qo_heads: int,
                     num_kv_heads: int, head_dim: int, page_size: int,
                     pos_encoding_mode: str = "NONE", window_left: int = -1,
                     logits_soft_cap: Optional[float] = None,
                     q_data_type: Optional[Union[str, torch.dtype]] = None,
                     kv_data_type: Optional[Union[str, torch.dtype]] = None,
                     data_type: Optional[Union[str, torch.dtype]] = None,
                     sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                     rope_theta: Optional[float] = None, non_blocking: bool = True,
                     fixed_split_size: Optional[int] = None, disable_split_kv: bool = False,
                     q_len_per_req: int = 1,
                     global_override_indptr_cpu: Optional[torch.Tensor] = None) -> None:
    """``BatchDecodeWithPagedKVCacheWrapper.plan`` for engines that bind it onto a wrapper
    (``wrapper.begin_forward = functools.partial(fast_decode_plan, wrapper)``) to plan CUDA-graph
    decode steps: the same plan, without the reads back from the device it can avoid.

    ``global_override_indptr_cpu``: the host copy of ``indptr`` (the page counts are read from
    it, not from the device). ``last_page_len`` on the device is not read back when
    ``page_size`` is 1 (every non-empty request's last page then holds one token); page ids on
    the device are never read back. Metadata tensors that already are the wrapper's CUDA-graph
    buffers (an engine writes ``_paged_kv_indices_buf`` in place) are not copied; others are
    copied into them, so a captured ``run`` replays the new batch.
    """
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper):
        raise TypeError(f"fast_decode_plan needs a BatchDecodeWithPagedKVCacheWrapper, got "
                        f"{type(self).__name__}")
    check_q_len_per_req(q_len_per_req, self._use_tensor_cores)
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    check_head_dim(head_dim)
    if q_data_type is None:  # the KV dtype where it is a half one, else float16
        kv = rt.parse_dtype(kv_data_type or data_type, "kv_data_type")
        q_data_type = kv if kv in (torch.float16, torch.bfloat16) else torch.float16
    self._set_options(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                      pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale,
                      window_left=window_left, logits_soft_cap=logits_soft_cap,
                      rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                      kv_data_type=kv_data_type, o_data_type=None, data_type=data_type)
    host_indptr = indptr if global_override_indptr_cpu is None else global_override_indptr_cpu
    page_indptr = host_ints(host_indptr, "indptr" if global_override_indptr_cpu is None
                            else "global_override_indptr_cpu")
    if global_override_indptr_cpu is not None and isinstance(indptr, torch.Tensor) and \
            indptr.numel() != len(page_indptr):
        raise ValueError(f"global_override_indptr_cpu must have indptr's {indptr.numel()} "
                         f"entries, got {len(page_indptr)}")
    self._max_page_id = check_page_ids(indices, page_indptr[-1] if page_indptr else 0, "indices")
    if page_size == 1 and isinstance(last_page_len, torch.Tensor) and last_page_len.is_cuda:
        kv_lens = lens_from_indptr(page_indptr, "indptr")
        if last_page_len.dim() != 1 or last_page_len.shape[0] != len(kv_lens):
            raise ValueError(f"last_page_len must have {len(kv_lens)} entries (one per "
                             f"request), got {tuple(last_page_len.shape)}")
    else:
        kv_lens = paged_kv_lens(page_indptr, host_ints(last_page_len, "last_page_len"),
                                page_size)
    plan_args = dict(indptr=host_indptr, indices=indices, last_page_len=last_page_len,
                     num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     page_size=page_size, pos_encoding_mode=pos_encoding_mode,
                     window_left=window_left, logits_soft_cap=logits_soft_cap,
                     q_data_type=q_data_type, kv_data_type=kv_data_type, data_type=data_type,
                     sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
                     non_blocking=non_blocking, fixed_split_size=fixed_split_size,
                     disable_split_kv=disable_split_kv, q_len_per_req=q_len_per_req)
    self._plan_batch(plan_args, indptr, indices, last_page_len, kv_lens, page_indptr, None,
                     num_qo_heads, num_kv_heads, head_dim, pos_encoding_mode, fixed_split_size,
                     disable_split_kv, non_blocking, q_len_per_req)


class _EnginePlan:
    """``wrapper._cached_module.plan(...)`` as vLLM's ``fast_plan_decode`` calls it in CUDA-graph
    mode, after copying indptr and last_page_len into the wrapper's buffers and the page ids
    into ``_paged_kv_indices_buf``: the batch is planned again from the host lengths it passes
    (FlashInfer's module ``plan`` arguments), reading the metadata from those buffers. Returns
    None (vLLM keeps it as ``_plan_info``, which nothing here reads)."""

    def __init__(self, wrapper: BatchDecodeWithPagedKVCacheWrapper) -> None:
        self._w = wrapper

    def plan(self, float_workspace_buffer, int_workspace_buffer, pinned_int_workspace_buffer,
             qo_indptr_host, indptr_host, kv_lens_host, total_num_rows, batch_size,
             num_qo_heads, num_kv_heads, page_size, is_cuda_graph_enabled, head_dim_qk,
             head_dim_vo, causal, window_left, fixed_split_size=-1, disable_split_kv=False,
             num_colocated_ctas=0) -> None:
        w = self._w
        if w._plan is None:
            raise RuntimeError("plan() must be called before _cached_module.plan()")
        if float_workspace_buffer is not w._ws.float_ws or \
                int_workspace_buffer is not w._ws.int_ws or pinned_int_workspace_buffer is not None:
            raise ValueError("_cached_module.plan() must be given this wrapper's workspace "
                             "buffers (_float_workspace_buffer, _int_workspace_buffer, "
                             "_pin_memory_int_workspace_buffer)")
        if not w._use_cuda_graph or is_cuda_graph_enabled is not True:
            raise ValueError("_cached_module.plan() plans CUDA-graph wrappers only; call plan()")
        q_len = w._q_len_per_req  # fixed in graph mode by the first plan
        if bool(causal) != (q_len > 1):
            raise ValueError(f"causal must be {q_len > 1} for decode with q_len_per_req={q_len} "
                             f"(as planned), got {causal}")
        if head_dim_vo != head_dim_qk:
            raise ValueError(f"head_dim_vo must equal head_dim_qk ({head_dim_qk}), got "
                             f"{head_dim_vo}")
        if num_colocated_ctas:
            raise NotImplementedError("num_colocated_ctas is not supported by this "
                                      "implementation")
        if host_ints(qo_indptr_host, "qo_indptr") != \
                list(range(0, batch_size * q_len + 1, q_len)) or \
                total_num_rows != batch_size * q_len:
            raise ValueError(f"decode plans q_len_per_req={q_len} query rows per request: "
                             f"qo_indptr must be 0, {q_len}, ..., {batch_size * q_len} and "
                             f"total_num_rows {batch_size * q_len}")
        page_indptr = host_ints(indptr_host, "indptr")
        pages = lens_from_indptr(page_indptr, "indptr")
        kv_lens = host_ints(kv_lens_host, "kv_lens")
        if len(pages) != batch_size or len(kv_lens) != batch_size:
            raise ValueError(f"indptr and the KV lengths must describe batch_size={batch_size} "
                             f"requests, got {len(pages)} and {len(kv_lens)}")
        bad = [(n, k) for n, k in zip(pages, kv_lens)
               if not ((n - 1) * page_size < k <= n * page_size if n else k == 0)]
        if bad:
            raise ValueError(f"KV length {bad[0][1]} does not fit {bad[0][0]} pages of "
                             f"{page_size}")
        check_head_dim(head_dim_qk)
        w._set_options(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim_qk, pos_encoding_mode=w._pos_encoding_mode,
                       sm_scale=w._sm_scale, window_left=window_left,
                       logits_soft_cap=w._logits_soft_cap, rope_scale=w._rope_scale,
                       rope_theta=w._rope_theta, q_data_type=w._q_dtype,
                       kv_data_type=w._kv_dtype, o_data_type=w._o_dtype)
        bufs = w._bufs
        w._max_page_id = -1  # page ids on the device: not read back
        plan_args = {**w._plan_args, "indptr": indptr_host, "indices": bufs["kv_indices"],
                     "last_page_len": bufs["kv_last_page_len"], "num_qo_heads": num_qo_heads,
                     "num_kv_heads": num_kv_heads, "head_dim": head_dim_qk,
                     "page_size": page_size, "window_left": window_left,
                     "fixed_split_size": fixed_split_size, "disable_split_kv": disable_split_kv,
                     "seq_lens": None, "block_tables": None}
        w._plan_batch(plan_args, bufs["kv_indptr"], bufs["kv_indices"], bufs["kv_last_page_len"],
                      kv_lens, page_indptr, None, num_qo_heads, num_kv_heads, head_dim_qk,
                      w._pos_encoding_mode, fixed_split_size, disable_split_kv, True, q_len)

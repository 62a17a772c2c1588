"""Prefill attention: one request (:func:`single_prefill_with_kv_cache`) and batches over a paged
(:class:`BatchPrefillWithPagedKVCacheWrapper`) or ragged (:class:`BatchPrefillWithRaggedKVCacheWrapper`)
KV cache.

Semantics (api-contract sections 7 and 9): ``logit = sm_scale * q.k`` (``sm_scale`` defaults to
``1/sqrt(head_dim)``), optionally soft-capped ``c * tanh(logit / c)`` and ALiBi-biased; causal
masks are bottom-right aligned (row i of a request sees keys ``j <= kv_len - qo_len + i``);
``window_left = w`` keeps keys ``j >= kv_len - qo_len + i - w``; rows that see no key give 0 and
lse ``-inf``. Every lse is base 2: ``log2(sum_j exp(logit_j))``.

Batch wrappers follow plan/run: ``plan`` schedules on the host once per batch
(:mod:`flashinfer.attention_plan`) and uploads the plan into the wrapper's int workspace;
``run`` allocates nothing but its output (unless given ``out``/``lse``) and can be captured in a
CUDA graph.
"""

from __future__ import annotations

import functools
import itertools
import operator
import warnings
from typing import Any, Optional, Sequence, Union

import torch

from . import attention_runtime as rt
from ._checks import check_cuda, resolve_pdl
from .api_logging import flashinfer_api
from .attention_plan import CTAS_PER_SM, AttentionPlan, schedule
from .jit.attention import HEAD_DIMS, AttentionVariant
from .page import _unpack_paged_kv_cache

_UNSUPPORTED_RUN = ("sinks", "kv_cache_sf", "skip_softmax_threshold_scale_factor",
                    "uses_spcompress")


def _check_head_dim(head_dim: int, head_dim_vo: Optional[int] = None) -> None:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    if head_dim_vo is not None and head_dim_vo != head_dim:
        raise ValueError(f"head_dim_vo must equal head_dim_qk ({head_dim}), got {head_dim_vo}")


def _check_heads(num_qo_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads <= 0 or num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads})")


def _host_ints(x: torch.Tensor, name: str) -> list[int]:
    if not isinstance(x, torch.Tensor) or x.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32, got {rt.dtype_name(x.dtype)}")
    return x.detach().to("cpu", torch.int64).tolist()


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device`` without waiting for the GPU's queue: a pageable
    ``.to(device)`` synchronizes the stream, a copy out of pinned memory does not (torch's
    caching host allocator keeps the pinned block until the copy is done)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _check_single_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """k and v of a single-request call: 3-D, q's (half) dtype."""
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    rt.check_half(q.dtype, "q")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"k and v must have q's dtype ({rt.dtype_name(q.dtype)}), got "
                         f"{rt.dtype_name(k.dtype)} and {rt.dtype_name(v.dtype)}")


def _lens_from_indptr(indptr: list[int], name: str) -> list[int]:
    if len(indptr) < 1 or indptr[0] != 0:
        raise ValueError(f"{name} must start with 0, got {indptr[:4]}")
    lens = list(map(operator.sub, indptr[1:], indptr))  # per-request loops run in C: plan
    if min(lens, default=0) < 0:                         # runs once per decode step
        raise ValueError(f"{name} must be non-decreasing")
    return lens


def paged_kv_lens(indptr: list[int], last_page_len: list[int], page_size: int) -> list[int]:
    """kv_len of each request: (pages - 1) * page_size + last_page_len (0 pages -> 0)."""
    pages = _lens_from_indptr(indptr, "paged_kv_indptr")
    if len(last_page_len) != len(pages):
        raise ValueError(f"paged_kv_last_page_len must have {len(pages)} entries (one per "
                         f"request), got {len(last_page_len)}")
    if min(pages, default=1) > 0 and 1 <= min(last_page_len, default=1) and \
            max(last_page_len, default=1) <= page_size:  # no empty request, all in range
        return list(map(operator.add, map(operator.mul, pages, itertools.repeat(page_size)),
                        map(operator.sub, last_page_len, itertools.repeat(page_size))))
    bad = [last for n, last in zip(pages, last_page_len) if n and not 1 <= last <= page_size]
    if bad:
        raise ValueError(f"paged_kv_last_page_len entries must be in [1, page_size={page_size}]"
                         f" for non-empty requests, got {bad[0]}")
    return [(n - 1) * page_size + last if n else 0 for n, last in zip(pages, last_page_len)]


def _pack_mask(custom_mask: Optional[torch.Tensor], packed_custom_mask: Optional[torch.Tensor],
               qo_lens: Sequence[int], kv_lens: Sequence[int],
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed bits uint8 on ``device``, byte offset of each request int32 on the host):
    row-major [qo_len, kv_len] bits per request, little-endian, each request byte-aligned (the
    ``segment_packbits`` layout)."""
    sizes = [q * k for q, k in zip(qo_lens, kv_lens)]
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + (n + 7) // 8)
    if packed_custom_mask is None:
        flat = custom_mask.reshape(-1)
        if flat.numel() != sum(sizes):
            raise ValueError(f"custom_mask must hold sum(qo_len * kv_len) = {sum(sizes)} entries, "
                             f"got {flat.numel()}")
        flat = flat.to(device=device, dtype=torch.bool)
        from .quantization import segment_packbits

        bit_indptr = _upload(torch.tensor([0] + list(itertools.accumulate(sizes)),
                                          dtype=torch.int32), device)
        packed, _ = segment_packbits(flat, bit_indptr, bitorder="little")
    else:
        packed = packed_custom_mask.reshape(-1).to(device=device, dtype=torch.uint8)
        if packed.numel() < offsets[-1]:
            raise ValueError(f"packed_custom_mask must hold {offsets[-1]} bytes, got {packed.numel()}")
    return packed, torch.tensor(offsets, dtype=torch.int32)


@functools.cache
def _num_sms(device: torch.device) -> int:
    return rt.num_sms(device.index if device.index is not None else torch.cuda.current_device())


def _variant(q_dtype: torch.dtype, o_dtype: torch.dtype, head_dim: int, mask_mode: str,
             pos_encoding_mode: str, paged: bool) -> AttentionVariant:
    return AttentionVariant(rt.dtype_name(q_dtype), rt.dtype_name(o_dtype), head_dim, mask_mode,
                            pos_encoding_mode, paged)


@flashinfer_api
def single_prefill_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale_q: Optional[torch.Tensor] = None,
    scale_k: Optional[torch.Tensor] = None,
    scale_v: Optional[torch.Tensor] = None,
    o_dtype: Optional[torch.dtype] = None,
    custom_mask: Optional[torch.Tensor] = None,
    packed_custom_mask: Optional[torch.Tensor] = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    backend: str = "auto",
    return_lse: bool = False,
    kv_cache_sf: Optional[torch.Tensor] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Attention of one request's queries over its keys.

    Parameters
    ----------
    q : torch.Tensor
        ``(qo_len, num_qo_heads, head_dim)``, fp16 or bf16, last dim contiguous.
    k, v : torch.Tensor
        ``(kv_len, num_kv_heads, head_dim)`` (NHD) or ``(num_kv_heads, kv_len, head_dim)`` (HND),
        q's dtype; any leading strides (K and V may differ).
    custom_mask : torch.Tensor, optional
        ``(qo_len, kv_len)`` bool, True = attend; overrides ``causal``. Or ``packed_custom_mask``
        (``packbits(mask.flatten(), "little")``).
    causal : bool
        Bottom-right aligned causal mask.
    return_lse : bool
        Also return the base-2 log-sum-exp ``(qo_len, num_qo_heads)`` float32.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        ``(qo_len, num_qo_heads, head_dim)`` in ``o_dtype`` (default q's), and the lse.

    Examples
    --------
    >>> q = torch.randn(128, 32, 128, dtype=torch.bfloat16, device="cuda")
    >>> k = torch.randn(512, 8, 128, dtype=torch.bfloat16, device="cuda")
    >>> o = single_prefill_with_kv_cache(q, k, k, causal=True)  # doctest: +SKIP
    """
    layout = rt.check_kv_layout(kv_layout)
    rt.check_pos_encoding(pos_encoding_mode)
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q must be a 3-D tensor, got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    _check_single_kv(q, k, v)
    if kv_cache_sf is not None or scale_q is not None or scale_k is not None or scale_v is not None:
        raise ValueError("FP8 scale tensors are not supported (q, k and v must be fp16 or bf16)")
    qo_len, num_qo_heads, head_dim = q.shape
    kv_len = k.shape[0] if layout == 0 else k.shape[1]
    num_kv_heads = k.shape[1] if layout == 0 else k.shape[0]
    _check_head_dim(head_dim, v.shape[-1])
    if k.shape[-1] != head_dim or v.shape != k.shape:
        raise ValueError(f"k and v must have shape {tuple(k.shape)} with head_dim {head_dim}, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    _check_heads(num_qo_heads, num_kv_heads)
    if custom_mask is not None and tuple(custom_mask.shape) != (qo_len, kv_len):
        raise ValueError(f"custom_mask must have shape {(qo_len, kv_len)}, got "
                         f"{tuple(custom_mask.shape)}")
    o_dtype = rt.parse_dtype(o_dtype, "o_dtype") or q.dtype
    rt.check_half(o_dtype, "o_dtype")
    check_cuda(q, "q")
    return _single(q, k, v, layout, custom_mask, packed_custom_mask, causal, pos_encoding_mode,
                   sm_scale, k_scale, v_scale, window_left, logits_soft_cap, rope_scale,
                   rope_theta, return_lse, o_dtype, fixed_split_size=None, backend=backend)


def _single(q, k, v, layout, custom_mask, packed_custom_mask, causal, pos_encoding_mode,
            sm_scale, k_scale, v_scale, window_left, logits_soft_cap, rope_scale, rope_theta,
            return_lse, o_dtype, fixed_split_size, paged_k=None, backend="auto"):
    """Shared by single prefill and single decode: one request through the batch kernel."""
    device = q.device
    qo_len, num_qo_heads, head_dim = q.shape
    kv_len = k.shape[0] if layout == 0 else k.shape[1]
    num_kv_heads = k.shape[1] if layout == 0 else k.shape[0]
    use_mask = custom_mask is not None or packed_custom_mask is not None
    mask_mode = "custom" if use_mask else ("causal" if causal else "none")
    variant = _variant(q.dtype, o_dtype, head_dim, mask_mode, pos_encoding_mode, paged=False)
    plan, buf = schedule([qo_len], [kv_len], group_size=num_qo_heads // num_kv_heads,
                         num_kv_heads=num_kv_heads, head_dim=head_dim, num_sms=_num_sms(device),
                         causal=mask_mode == "causal", kv_chunk_size=fixed_split_size,
                         sm90=rt.use_sm90(device, variant, backend))
    # One upload: the plan, the two indptrs, and (split KV) the merge counters, all 0.
    counters = plan.item_capacity * num_kv_heads if plan.split_kv else 0
    dev = torch.cat([buf, torch.tensor([0, qo_len, 0, kv_len], dtype=torch.int32),
                     torch.zeros(counters, dtype=torch.int32)])
    dev = _upload(dev, device)
    n = buf.numel()
    partials = None
    if plan.split_kv:
        partials = (torch.empty(plan.num_partials * num_qo_heads * head_dim, dtype=torch.float32,
                                device=device),
                    torch.empty(plan.num_partials * num_qo_heads, dtype=torch.float32,
                                device=device))
    mask = mask_indptr = None
    if use_mask:
        mask, mask_indptr = _pack_mask(custom_mask, packed_custom_mask, [qo_len], [kv_len], device)
        mask_indptr = _upload(mask_indptr, device)
    sm, o_scale = rt.resolve_scales(head_dim, sm_scale, None, k_scale, v_scale)
    rs, rth = rt.rope_defaults(rope_scale, rope_theta)
    o = torch.empty(qo_len, num_qo_heads, head_dim, dtype=o_dtype, device=device)
    lse = torch.empty(qo_len, num_qo_heads, dtype=torch.float32, device=device) if return_lse else None
    module = rt.get_attention_module(variant)
    rt.run_attention(module, plan, dev[:n], q=q, k=k, v=v, o=o, lse=lse, kv_layout=layout,
                     qo_indptr=dev[n:n + 2], kv_indptr=dev[n + 2:n + 4], partials=partials,
                     counters=dev[n + 4:] if counters else None,
                     custom_mask=mask, mask_indptr=mask_indptr,
                     alibi_slopes=rt.alibi_slopes_for(pos_encoding_mode, num_qo_heads, device),
                     sm_scale=sm, softcap=rt.soft_cap(logits_soft_cap), o_scale=o_scale,
                     rope_scale=rs, rope_theta=rth, window_left=window_left,
                     enable_pdl=resolve_pdl(None, device))
    return (o, lse) if return_lse else o


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache,
                                                            return_lse=True)


class _BatchAttentionBase:
    """plan/run machinery shared by the batch prefill and decode wrappers."""

    _paged = True
    # Graph mode: the captured grid has room for this many times the first plan's items (later
    # plans may tile their query rows differently; split KV has its own term).
    _graph_item_headroom = 2

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, backend: str = "auto") -> None:
        self._kv_layout = kv_layout
        self._layout = rt.check_kv_layout(kv_layout)
        self._backend = rt.check_backend(backend)
        self._ws = rt.Workspace(float_workspace_buffer)
        self._use_cuda_graph = use_cuda_graph
        self._plan: Optional[AttentionPlan] = None
        self._launcher: Optional[rt.Launch] = None  # the plan's launch, resolved at its first run
        self._fixed: Optional[dict] = None  # graph mode: launch shape frozen at the first plan

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor,
                               int_workspace_buffer: Optional[torch.Tensor] = None) -> None:
        self._ws.reset(float_workspace_buffer, int_workspace_buffer)
        self._plan = None
        self._launcher = None

    def end_forward(self) -> None:
        """Kept for compatibility; does nothing."""

    def run_return_lse(self, *args, **kwargs):
        """``run(..., return_lse=True)``."""
        return self.run(*args, return_lse=True, **kwargs)

    def _schedule(self, qo_lens, kv_lens, num_qo_heads, num_kv_heads, head_dim, causal,
                  fixed_split_size, disable_split_kv, kv_begins=None):
        """``kv_begins``: paged, each request's first entry of the page ids (``schedule``)."""
        device = self._ws.device
        kwargs: dict[str, Any] = {"sm90": rt.use_sm90(device, self._variant, self._backend),
                                  "kv_begins": kv_begins}
        if self._use_cuda_graph:
            if self._fixed is None:
                first, _ = schedule(qo_lens, kv_lens, group_size=num_qo_heads // num_kv_heads,
                                    num_kv_heads=num_kv_heads, head_dim=head_dim,
                                    num_sms=_num_sms(device), causal=causal, **kwargs)
                # Room for split KV (the CTAs per SM the split heuristic aims for with this
                # shape) where the first plan split or leaves more than half of it empty (a
                # batch of equal lengths splits only then): idle CTAs are not free (H100, a
                # one-wave decode 64 x 4096 with 16 idle ones: 353.5 vs 348.5 us,
                # benchmarks/graph_decode.py).
                slots = CTAS_PER_SM[first.cta] * _num_sms(device)
                split_room = first.split_kv or 2 * first.num_items * num_kv_heads <= slots
                self._fixed = {
                    "cta": first.cta,
                    "item_capacity": max(self._graph_item_headroom * first.num_items,
                                         len(qo_lens),
                                         -(-slots // num_kv_heads) if split_room else 0),
                    "row_capacity": sum(qo_lens),
                }
            # The captured grid has item_capacity CTAs per KV head: later plans fill them.
            kwargs.update(cta=self._fixed["cta"], item_capacity=self._fixed["item_capacity"],
                          force_split=True)
            if sum(qo_lens) > self._fixed["row_capacity"]:
                raise ValueError(f"CUDA-graph mode: the batch has {sum(qo_lens)} query rows, more "
                                 f"than the {self._fixed['row_capacity']} of the first plan")
        plan, buf = schedule(qo_lens, kv_lens, group_size=num_qo_heads // num_kv_heads,
                             num_kv_heads=num_kv_heads, head_dim=head_dim,
                             num_sms=_num_sms(device), causal=causal,
                             kv_chunk_size=fixed_split_size, disable_split_kv=disable_split_kv,
                             **kwargs)
        max_parts = self._ws.max_partials(num_qo_heads, head_dim)
        if plan.split_kv and plan.num_partials > max_parts and not self._use_cuda_graph:
            plan, buf = schedule(qo_lens, kv_lens, group_size=num_qo_heads // num_kv_heads,
                                 num_kv_heads=num_kv_heads, head_dim=head_dim,
                                 num_sms=_num_sms(device), causal=causal, disable_split_kv=True,
                                 sm90=kwargs["sm90"], kv_begins=kv_begins)
        if self._use_cuda_graph:
            # The merge runs over a fixed number of rows: pad merge_indptr with empty ranges.
            rows = self._fixed["row_capacity"]
            if plan.num_rows < rows:
                pad = buf[-1:].expand(rows - plan.num_rows)
                buf = torch.cat([buf, pad])
                plan = AttentionPlan(**{**plan.__dict__, "num_rows": rows})
        return plan, buf

    def _set_plan(self, plan: AttentionPlan, buf: torch.Tensor,
                  metadata: Sequence[tuple[Optional[torch.Tensor], torch.Tensor, str]],
                  non_blocking: bool) -> list[torch.Tensor]:
        """Adopt ``plan``: its buffer and the batch's ``metadata`` ``(graph buffer or None, int
        tensor, name)`` go to the device in one staged copy (``Workspace.stage``); returns the
        metadata's device tensors."""
        self._plan_dev, *views = self._ws.stage([(None, buf, "plan"), *metadata], non_blocking)
        self._plan = plan
        self._launcher = None
        self._scales = rt.resolve_scales(self._head_dim, self._sm_scale, None, None, None)
        return views

    def _check_run_common(self, q: torch.Tensor, out, lse, return_lse, window_left,
                          extra: dict) -> None:
        if self._plan is None:
            raise RuntimeError("plan() must be called before run()")
        for name in _UNSUPPORTED_RUN:
            if extra.get(name) is not None:
                raise ValueError(f"{name} is not supported by this implementation")
        if window_left is not None and window_left != self._window_left:
            raise ValueError(f"window_left must equal the planned value ({self._window_left}), "
                             f"got {window_left}")
        if q.dtype != self._q_dtype:
            raise ValueError(f"q must have the planned q_data_type ({rt.dtype_name(self._q_dtype)}),"
                             f" got {rt.dtype_name(q.dtype)}; pass q_data_type= to plan()")
        shape = (q.shape[0], self._num_qo_heads, self._head_dim)
        if tuple(q.shape) != shape:
            raise ValueError(f"q must have shape {shape}, got {tuple(q.shape)}")
        if out is not None:
            if tuple(out.shape) != shape or out.dtype != self._o_dtype:
                raise ValueError(f"out must have shape {shape} and dtype "
                                 f"{rt.dtype_name(self._o_dtype)}, got {tuple(out.shape)} "
                                 f"{rt.dtype_name(out.dtype)}")
        if lse is not None and (tuple(lse.shape) != shape[:2] or lse.dtype != torch.float32):
            raise ValueError(f"lse must have shape {shape[:2]} and dtype float32, got "
                             f"{tuple(lse.shape)} {rt.dtype_name(lse.dtype)}")

    def _launch(self, q, k, v, out, lse, return_lse, enable_pdl, q_scale, k_scale, v_scale):
        kv_heads = k.shape[-2] if self._layout == 0 else k.shape[-3]
        if kv_heads != self._num_kv_heads:
            raise ValueError(f"the KV cache must have the planned num_kv_heads "
                             f"({self._num_kv_heads}), got {kv_heads}")
        if out is None:
            out = torch.empty(q.shape, dtype=self._o_dtype, device=q.device)
        if lse is None and return_lse:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        launch = self._launcher
        if launch is None:  # the first run of this plan
            launch = self._launcher = self._prepare(q.device)
        sm, o_scale = self._scales if q_scale is None and k_scale is None and v_scale is None \
            else rt.resolve_scales(self._head_dim, self._sm_scale, q_scale, k_scale, v_scale)
        launch(q, k, v, out, lse, sm, self._softcap, o_scale, self._rope_scale, self._rope_theta,
               self._window_left, resolve_pdl(enable_pdl, q.device))
        return (out, lse) if return_lse else out

    def _prepare(self, device: torch.device) -> rt.Launch:
        partials = self._ws.partial_views(self._num_qo_heads, self._head_dim) \
            if self._plan.split_kv else None
        return rt.prepare(
            rt.get_attention_module(self._variant), self._plan, self._plan_dev,
            num_qo_heads=self._num_qo_heads, num_kv_heads=self._num_kv_heads,
            kv_layout=self._layout, qo_indptr=self._qo_indptr, kv_indptr=self._kv_indptr,
            kv_indices=self._kv_indices, kv_last_page_len=self._kv_last_page_len,
            partials=partials, counters=self._ws.counters, custom_mask=self._mask,
            mask_indptr=self._mask_indptr,
            alibi_slopes=rt.alibi_slopes_for(self._pos_encoding_mode, self._num_qo_heads, device))

    def _set_options(self, *, num_qo_heads, num_kv_heads, head_dim, pos_encoding_mode, sm_scale,
                     window_left, logits_soft_cap, rope_scale, rope_theta, q_data_type,
                     kv_data_type, o_data_type, data_type=None) -> None:
        _check_head_dim(head_dim)
        _check_heads(num_qo_heads, num_kv_heads)
        rt.check_pos_encoding(pos_encoding_mode)
        q_dtype = rt.parse_dtype(q_data_type, "q_data_type")
        kv_dtype = rt.parse_dtype(kv_data_type, "kv_data_type")
        legacy = rt.parse_dtype(data_type, "data_type")
        # The deprecated data_type only fills a dtype left as None (so alone it sets the KV one).
        q_dtype = q_dtype or legacy or torch.float16
        kv_dtype = kv_dtype or legacy or q_dtype
        o_dtype = rt.parse_dtype(o_data_type, "o_data_type") or q_dtype
        for name, dt in (("q_data_type", q_dtype), ("kv_data_type", kv_dtype),
                         ("o_data_type", o_dtype)):
            rt.check_half(dt, name)
        if kv_dtype != q_dtype:
            raise ValueError(f"kv_data_type ({rt.dtype_name(kv_dtype)}) must equal q_data_type "
                             f"({rt.dtype_name(q_dtype)})")
        self._num_qo_heads, self._num_kv_heads, self._head_dim = num_qo_heads, num_kv_heads, head_dim
        self._q_dtype, self._kv_dtype, self._o_dtype = q_dtype, kv_dtype, o_dtype
        self._pos_encoding_mode = pos_encoding_mode
        self._sm_scale = sm_scale
        self._window_left = -1 if window_left is None else int(window_left)
        self._softcap = rt.soft_cap(logits_soft_cap)
        self._rope_scale, self._rope_theta = rt.rope_defaults(rope_scale, rope_theta)

    def _check_kv_dtype(self, k: torch.Tensor) -> None:
        if k.dtype != self._kv_dtype:
            raise ValueError(f"the KV cache must have the planned kv_data_type "
                             f"({rt.dtype_name(self._kv_dtype)}), got {rt.dtype_name(k.dtype)}")

    def _legacy_run_args(self, args: tuple, kwargs: dict) -> dict:
        if args:
            warnings.warn("positional arguments after the KV cache in run() are deprecated; "
                          "pass them by keyword", DeprecationWarning, stacklevel=3)
            names = ("q_scale", "k_scale", "v_scale", "out", "lse", "return_lse")
            if len(args) > len(names):
                raise TypeError(f"run() takes at most {len(names)} extra positional arguments")
            for name, value in zip(names, args):
                kwargs[name] = value
        return kwargs

    def _plan_prefill(self, qo_lens, kv_lens, metadata, custom_mask, packed_custom_mask, causal,
                      num_qo_heads, num_kv_heads, head_dim, non_blocking, fixed_split_size,
                      disable_split_kv, bufs, kv_begins=None) -> list[torch.Tensor]:
        """Shared by both prefill wrappers: ``metadata`` (``_set_plan``'s, qo_indptr and
        kv_indptr first) goes to the device with the plan; returns it there."""
        if len(qo_lens) != len(kv_lens):
            raise ValueError(f"qo_indptr describes {len(qo_lens)} requests, the KV metadata "
                             f"{len(kv_lens)}")
        use_mask = custom_mask is not None or packed_custom_mask is not None
        mask_mode = "custom" if use_mask else ("causal" if causal else "none")
        self._mask = None
        if use_mask:
            mask, mask_indptr = _pack_mask(custom_mask, packed_custom_mask, qo_lens, kv_lens,
                                           self._ws.device)
            self._mask = mask
            if bufs.get("custom_mask") is not None:  # graph mode: where the captured run reads
                if mask.numel() > bufs["custom_mask"].numel():
                    raise ValueError(f"custom_mask has {mask.numel()} bytes, its CUDA-graph "
                                     f"buffer only {bufs['custom_mask'].numel()}")
                self._mask = bufs["custom_mask"]
                self._mask[:mask.numel()].copy_(mask, non_blocking=non_blocking)
            metadata = [*metadata, (bufs.get("mask_indptr"), mask_indptr, "mask_indptr")]
        self._variant = _variant(self._q_dtype, self._o_dtype, head_dim, mask_mode,
                                 self._pos_encoding_mode, self._paged)
        plan, buf = self._schedule(qo_lens, kv_lens, num_qo_heads, num_kv_heads, head_dim,
                                   mask_mode == "causal", fixed_split_size, disable_split_kv,
                                   kv_begins)
        views = self._set_plan(plan, buf, metadata, non_blocking)
        self._mask_indptr = views.pop() if use_mask else None
        self._qo_indptr, self._kv_indptr = views[:2]
        return views


class BatchPrefillWithPagedKVCacheWrapper(_BatchAttentionBase):
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
        """Schedule the batch; see the class docstring for the metadata layout."""
        _check_head_dim(head_dim_qk, head_dim_vo)
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self._set_options(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                          head_dim=head_dim_qk, pos_encoding_mode=pos_encoding_mode,
                          sm_scale=sm_scale, window_left=window_left,
                          logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
                          rope_theta=rope_theta, q_data_type=q_data_type,
                          kv_data_type=kv_data_type, o_data_type=o_data_type)
        page_indptr = _host_ints(paged_kv_indptr, "paged_kv_indptr")
        kv_lens = paged_kv_lens(page_indptr,
                                _host_ints(paged_kv_last_page_len, "paged_kv_last_page_len"),
                                page_size)
        self._page_size = page_size
        qo_lens = _lens_from_indptr(_host_ints(qo_indptr, "qo_indptr"), "qo_indptr")
        _, _, self._kv_indices, self._kv_last_page_len = self._plan_prefill(
            qo_lens, kv_lens, [
                (self._bufs.get("qo_indptr"), qo_indptr, "qo_indptr"),
                (self._bufs["kv_indptr"], paged_kv_indptr, "paged_kv_indptr"),
                (self._bufs["kv_indices"], paged_kv_indices, "paged_kv_indices"),
                (self._bufs["kv_last_page_len"], paged_kv_last_page_len,
                 "paged_kv_last_page_len")],
            custom_mask, packed_custom_mask, causal, num_qo_heads, num_kv_heads, head_dim_qk,
            non_blocking, fixed_split_size, disable_split_kv, self._bufs, kv_begins=page_indptr)

    begin_forward = plan

    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale: Optional[float] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl: Optional[bool] = None,
            window_left: Optional[int] = None, **extra):
        """``q (qo_indptr[-1], Hq, D)`` -> output ``(.., Hq, D)`` (and the lse when
        ``return_lse``)."""
        kw = self._legacy_run_args(args, dict(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                              out=out, lse=lse, return_lse=return_lse))
        self._check_run_common(q, kw["out"], kw["lse"], kw["return_lse"], window_left, extra)
        if self._plan.num_rows and q.shape[0] < self._plan.num_rows and not self._use_cuda_graph:
            raise ValueError(f"q must have qo_indptr[-1] = {self._plan.num_rows} rows, got "
                             f"{q.shape[0]}")
        k, v = _unpack_paged_kv_cache(paged_kv_cache, self._kv_layout)
        self._check_kv_dtype(k)
        return self._launch(q, k, v, kw["out"], kw["lse"], kw["return_lse"], enable_pdl,
                            kw["q_scale"], kw["k_scale"], kw["v_scale"])

    def forward(self, q, paged_kv_cache, causal: bool = False, **kwargs):
        """Deprecated: plan() then run()."""
        warnings.warn("forward is deprecated; use plan() and run()", DeprecationWarning,
                      stacklevel=2)
        return self.run(q, paged_kv_cache, **kwargs)

    def forward_return_lse(self, q, paged_kv_cache, causal: bool = False, **kwargs):
        warnings.warn("forward_return_lse is deprecated; use plan() and run_return_lse()",
                      DeprecationWarning, stacklevel=2)
        return self.run(q, paged_kv_cache, return_lse=True, **kwargs)


class BatchPrefillWithRaggedKVCacheWrapper(_BatchAttentionBase):
    """Prefill attention over ragged K/V: request b's keys are rows
    ``kv_indptr[b]:kv_indptr[b+1]`` of ``k (nnz_kv, Hkv, D)`` (HND: ``(Hkv, nnz_kv, D)``)."""

    _paged = False

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf: Optional[torch.Tensor] = None,
                 kv_indptr_buf: Optional[torch.Tensor] = None,
                 custom_mask_buf: Optional[torch.Tensor] = None,
                 mask_indptr_buf: Optional[torch.Tensor] = None, backend: str = "auto",
                 jit_args: Optional[list] = None, jit_kwargs: Optional[dict] = None) -> None:
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
        _check_head_dim(head_dim_qk, head_dim_vo)
        self._set_options(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                          head_dim=head_dim_qk, pos_encoding_mode=pos_encoding_mode,
                          sm_scale=sm_scale, window_left=window_left,
                          logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
                          rope_theta=rope_theta, q_data_type=q_data_type,
                          kv_data_type=kv_data_type, o_data_type=o_data_type)
        kv_lens = _lens_from_indptr(_host_ints(kv_indptr, "kv_indptr"), "kv_indptr")
        self._kv_nnz = sum(kv_lens)
        qo_lens = _lens_from_indptr(_host_ints(qo_indptr, "qo_indptr"), "qo_indptr")
        self._plan_prefill(qo_lens, kv_lens, [
            (self._bufs.get("qo_indptr"), qo_indptr, "qo_indptr"),
            (self._bufs["kv_indptr"], kv_indptr, "kv_indptr")],
            custom_mask, packed_custom_mask, causal, num_qo_heads, num_kv_heads, head_dim_qk,
            non_blocking, fixed_split_size, disable_split_kv, self._bufs)

    begin_forward = plan

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args,
            q_scale: Optional[float] = None, k_scale: Optional[float] = None,
            v_scale: Optional[float] = None, o_scale: Optional[float] = None,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl: Optional[bool] = None, **extra):
        """``q (qo_indptr[-1], Hq, D)``, ``k``/``v (kv_indptr[-1], Hkv, D)`` -> output."""
        kw = self._legacy_run_args(args, dict(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                              out=out, lse=lse, return_lse=return_lse))
        self._check_run_common(q, kw["out"], kw["lse"], kw["return_lse"], None, extra)
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor) or x.dim() != 3:
                raise ValueError(f"{name} must be a 3-D tensor")
        nnz = k.shape[0] if self._layout == 0 else k.shape[1]
        if nnz < self._kv_nnz:
            raise ValueError(f"k must hold kv_indptr[-1] = {self._kv_nnz} rows, got {nnz}")
        self._check_kv_dtype(k)
        v_scale_total = kw["v_scale"] if o_scale is None else (kw["v_scale"] or 1.0) * o_scale
        return self._launch(q, k, v, kw["out"], kw["lse"], kw["return_lse"], enable_pdl,
                            kw["q_scale"], kw["k_scale"], v_scale_total)

    def forward(self, q, k, v, causal: bool = False, **kwargs):
        warnings.warn("forward is deprecated; use plan() and run()", DeprecationWarning,
                      stacklevel=2)
        return self.run(q, k, v, **kwargs)

    def forward_return_lse(self, q, k, v, causal: bool = False, **kwargs):
        warnings.warn("forward_return_lse is deprecated; use plan() and run_return_lse()",
                      DeprecationWarning, stacklevel=2)
        return self.run(q, k, v, return_lse=True, **kwargs)

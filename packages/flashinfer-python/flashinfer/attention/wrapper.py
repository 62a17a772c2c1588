"""What every attention wrapper shares: argument checks, the batch metadata read on the host,
and :class:`BatchAttentionBase`, the plan/run machinery of the batch prefill and decode
wrappers (plan schedules on the host once per batch through :mod:`.plan` and uploads the plan
into the wrapper's int workspace; run allocates nothing but its output and can be captured in
a CUDA graph)."""

from __future__ import annotations

import functools
import inspect
import itertools
import operator
import warnings
from typing import Any, Optional, Sequence

import torch

from .._checks import check_cuda_device, resolve_pdl
from ..jit.attention import AttentionVariant, check_fp8_head_dims, check_head_dims
from . import runtime as rt
from .plan import AttentionPlan, cta_occupancy, schedule

# The options of the deprecated forward() that replace the planned ones.
LEGACY_OPTIONS = ("causal", "pos_encoding_mode", "use_fp16_qk_reduction", "window_left",
                  "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta")
UNSUPPORTED_RUN = ("kv_cache_sf", "skip_softmax_threshold_scale_factor", "uses_spcompress")
# Defaults of the deprecated forward()'s parameters (FlashInfer's; legacy_forwards).
_LEGACY_DEFAULTS = dict(causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                        q_scale=None, k_scale=None, v_scale=None, window_left=-1,
                        logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None)


# Arguments FlashInfer's plan/constructors accept that this implementation cannot honour, with
# the value that means "not used" and why (multi-item scoring, the trtllm-gen backend's page
# table, JIT customization): any other value raises NotImplementedError naming it.
UNSUPPORTED_PLAN = {
    "prefix_len_ptr": (None, "multi-item scoring"),
    "token_pos_in_items_ptr": (None, "multi-item scoring"),
    "token_pos_in_items_len": (0, "multi-item scoring"),
    "max_item_len_ptr": (None, "multi-item scoring"),
    "use_fp16_qk_reduction": (False, "q.k is accumulated in float32"),
    "block_tables": (None, "the trtllm-gen backend's page table; pass indptr/indices"),
    "v_indptr": (None, "separate V/output layouts of the ragged wrapper"),
    "o_indptr": (None, "separate V/output layouts of the ragged wrapper"),
    "jit_args": (None, "JIT-customized attention variants"),
    "jit_kwargs": (None, "JIT-customized attention variants"),
}


def refuse_unsupported(where: str, **given) -> None:
    """``NotImplementedError`` naming the first of ``given`` (names of UNSUPPORTED_PLAN) whose
    value is not the one meaning "not used"."""
    for name, value in given.items():
        default, why = UNSUPPORTED_PLAN[name]
        if value is not default and (isinstance(value, torch.Tensor) or value != default):
            raise NotImplementedError(f"{where}({name}=...) is not supported by this "
                                      f"implementation ({why})")


def legacy_forwards(inputs: tuple[str, ...], options: tuple[str, ...]):
    """FlashInfer's deprecated ``forward`` and ``forward_return_lse`` of one wrapper: both take
    ``inputs`` (q and the KV) and then ``options`` (positional or keyword, in that order, with
    FlashInfer's defaults) and call ``self._forward``: the options, defaults included, replace
    the planned ones, then the batch runs (``_apply_legacy_options``)."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in inputs]
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                 default=_LEGACY_DEFAULTS[n]) for n in options]
    signature = inspect.Signature(params)

    def make(name: str, return_lse: bool, use: str):
        def method(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)  # TypeError for unknown or missing names
            bound.apply_defaults()
            given = bound.arguments
            warnings.warn(f"{name} is deprecated; use plan() and {use}()", DeprecationWarning,
                          stacklevel=2)
            return given["self"]._forward(tuple(given[n] for n in inputs), return_lse, given)

        method.__name__ = method.__qualname__ = name
        method.__signature__ = signature
        method.__doc__ = (f"Deprecated (use ``plan`` and ``{use}``): as in FlashInfer, these "
                          "options (defaults included) replace the planned ones, then the batch "
                          "runs" + (", returning ``(out, lse)``." if return_lse else "."))
        return method

    return make("forward", False, "run"), make("forward_return_lse", True, "run_return_lse")


def check_given_lens(given, derived: Sequence[int], name: str, what: str) -> None:
    """An optional per-request length tensor FlashInfer's plan also accepts (``seq_lens``,
    ``seq_lens_q``): the same lengths the indptr arrays describe, or ``ValueError``."""
    if given is None:
        return
    lens = host_ints(given.reshape(-1) if isinstance(given, torch.Tensor) else given, name)
    if lens != list(derived):
        raise ValueError(f"{name} must equal the {what} the plan's metadata describes "
                         f"({list(derived)[:8]}), got {lens[:8]}")


def check_given_max(given: Optional[int], derived: Sequence[int], name: str) -> None:
    """``max_token_per_sequence`` / ``max_sequence_kv``: a bound, at least the real maximum."""
    if given is not None and given < max(derived, default=0):
        raise ValueError(f"{name} must be at least {max(derived, default=0)}, got {given}")


def check_head_dim(head_dim: int, head_dim_vo: Optional[int] = None) -> int:
    """The head_dim_vo of a supported pair (``jit.attention.check_head_dims``)."""
    return check_head_dims(head_dim, head_dim_vo)


def check_heads(num_qo_heads: int, num_kv_heads: int) -> None:
    if num_qo_heads <= 0 or num_kv_heads <= 0:
        raise ValueError(f"num_qo_heads and num_kv_heads must be positive, got {num_qo_heads} "
                         f"and {num_kv_heads}")
    if num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads})")


def host_ints(x: torch.Tensor, name: str) -> list[int]:
    if not isinstance(x, torch.Tensor) or x.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32, got {rt.dtype_name(x.dtype)}")
    return (x.cpu() if x.is_cuda else x).tolist()  # one device copy at most; ints either way


def check_page_ids(indices: torch.Tensor, used: int, name: str) -> int:
    """The page ids of a plan: at least ``used`` (``indptr[-1]``) int32 entries, none negative
    where they are host data. Returns the largest used id (-1 for ids on the device, which are
    not read back: that would wait for the GPU), which ``run`` checks against the cache."""
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor, got "
                         f"{tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32, got {rt.dtype_name(indices.dtype)}")
    if indices.shape[0] < used:
        raise ValueError(f"{name} must hold indptr[-1] = {used} page ids, got {indices.shape[0]}")
    if indices.is_cuda or used == 0:
        return -1
    lo, hi = torch.aminmax(indices[:used])
    if lo < 0:
        raise ValueError(f"{name} must hold page ids >= 0, got {int(lo)}")
    return int(hi)


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device`` without waiting for the GPU's queue: a pageable
    ``.to(device)`` synchronizes the stream, a copy out of pinned memory does not (torch's
    caching host allocator keeps the pinned block until the copy is done)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def check_single_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """k and v of a single-request call: 3-D, one dtype: q's (half), or fp8."""
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    rt.check_half(q.dtype, "q")
    rt.check_kv_dtype(k.dtype, q.dtype, "k.dtype")
    if v.dtype != k.dtype:
        raise ValueError(f"v must have k's dtype ({rt.dtype_name(k.dtype)}), got "
                         f"{rt.dtype_name(v.dtype)}")
    device = q.device
    if k.device != device or v.device != device:
        raise ValueError(f"k and v must be on q's device ({device}), got {k.device} and "
                         f"{v.device}")


def lens_from_indptr(indptr: list[int], name: str) -> list[int]:
    if len(indptr) < 1 or indptr[0] != 0:
        raise ValueError(f"{name} must start with 0, got {indptr[:4]}")
    lens = list(map(operator.sub, indptr[1:], indptr))  # per-request loops run in C: plan
    if min(lens, default=0) < 0:                         # runs once per decode step
        raise ValueError(f"{name} must be non-decreasing")
    return lens


def paged_kv_lens(indptr: list[int], last_page_len: list[int], page_size: int) -> list[int]:
    """kv_len of each request: (pages - 1) * page_size + last_page_len (0 pages -> 0)."""
    pages = lens_from_indptr(indptr, "paged_kv_indptr")
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


def pack_mask(custom_mask: Optional[torch.Tensor], packed_custom_mask: Optional[torch.Tensor],
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
        from ..quantization import segment_packbits

        bit_indptr = upload(torch.tensor([0] + list(itertools.accumulate(sizes)),
                                          dtype=torch.int32), device)
        packed, _ = segment_packbits(flat, bit_indptr, bitorder="little")
    else:
        packed = packed_custom_mask.reshape(-1).to(device=device, dtype=torch.uint8)
        if packed.numel() < offsets[-1]:
            raise ValueError(f"packed_custom_mask must hold {offsets[-1]} bytes, got {packed.numel()}")
    return packed, torch.tensor(offsets, dtype=torch.int32)


@functools.cache
def device_num_sms(device: torch.device) -> int:
    return rt.num_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=256)
def make_variant(q_dtype: torch.dtype, o_dtype: torch.dtype, head_dim: int, mask_mode: str,
                 pos_encoding_mode: str, paged: bool,
                 kv_dtype: Optional[torch.dtype] = None,
                 head_dim_vo: Optional[int] = None) -> AttentionVariant:
    """The compiled variant of these options (made once: plan() asks per batch); ``kv_dtype``
    None is q's, ``head_dim_vo`` None is ``head_dim``."""
    return AttentionVariant(rt.dtype_name(q_dtype), rt.dtype_name(o_dtype), head_dim, mask_mode,
                            pos_encoding_mode, paged,
                            None if kv_dtype is None else rt.dtype_name(kv_dtype),
                            head_dim_vo=head_dim_vo)


def _check_sm_scale(value):
    if value is not None:
        rt.resolve_scales(1, value, None, None, None)  # positive and finite
    return value


class PlannedScalar:
    """A planned option the launch record holds, under FlashInfer's attribute name (engines read
    ``_sm_scale``, ``_window_left``, ``_logits_soft_cap`` and some write them): setting one
    checks and normalizes it, and a new value makes the next ``run`` build its record again (a
    captured graph keeps the record it was captured with)."""

    def __init__(self, normalize, default) -> None:
        self.normalize, self.default = normalize, default

    def __set_name__(self, owner, name: str) -> None:
        self.name, self.slot = name, "_planned" + name

    def __get__(self, obj, owner=None):
        return self if obj is None else obj.__dict__.get(self.slot, self.default)

    def __set__(self, obj, value) -> None:
        value = self.normalize(value)
        old = obj.__dict__.get(self.slot, self.default)
        if value == old and type(value) is type(old):
            return
        obj.__dict__[self.slot] = value
        obj._launcher = None
        if self.name == "_sm_scale" and getattr(obj, "_plan", None) is not None:
            obj._scales = rt.resolve_scales(obj._head_dim, value, None, None, None)


# key -> (FlashInfer's attribute, the planned device tensor run reads, its dtype, the
# attribute holding how many entries the plan reads, or None where it cannot be replaced)
_BUFFERS = {
    "kv_indices": ("_paged_kv_indices_buf", "_kv_indices", torch.int32, "_num_page_ids"),
    "kv_indptr": ("_paged_kv_indptr_buf", "_kv_indptr", torch.int32, None),
    "kv_last_page_len": ("_paged_kv_last_page_len_buf", "_kv_last_page_len", torch.int32,
                         None),
    "qo_indptr": ("_qo_indptr_buf", "_qo_indptr", torch.int32, None),
    "custom_mask": ("_custom_mask_buf", "_mask", torch.uint8, "_mask_bytes"),
    "mask_indptr": ("_mask_indptr_buf", "_mask_indptr", torch.int32, None),
}


class BatchAttentionBase:
    """plan/run machinery shared by the batch prefill and decode wrappers."""

    _paged = True
    _sm_scale = PlannedScalar(_check_sm_scale, None)  # as given: None = 1/sqrt(head_dim)
    _window_left = PlannedScalar(rt.check_window_left, -1)
    _logits_soft_cap = PlannedScalar(rt.soft_cap, 0.0)  # 0.0 = off, as FlashInfer keeps it
    _rope_scale = PlannedScalar(lambda x: rt.rope_defaults(x, None)[0], 1.0)
    _rope_theta = PlannedScalar(lambda x: rt.rope_defaults(None, x)[1], 1e4)
    # Graph mode: the captured grid has room for this many times the first plan's items (later
    # plans may tile their query rows differently; split KV has its own term).
    _graph_item_headroom = 2

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, backend: str = "auto") -> None:
        rt.check_kv_layout(kv_layout)
        self._kv_layout = kv_layout  # "NHD" or "HND"
        self._backend = rt.check_backend(backend)
        self._ws = rt.Workspace(float_workspace_buffer)
        self._use_cuda_graph = use_cuda_graph
        self._plan: Optional[AttentionPlan] = None
        self._launcher: Optional[rt.Launch] = None  # the plan's launch, resolved at its first run
        self._fixed: Optional[dict] = None  # graph mode: launch shape frozen at the first plan
        self._max_page_id = -1  # the largest planned page id where they were host data

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
        """``kv_begins``: paged, each request's first entry of the page ids (``schedule``).
        ``fixed_split_size`` -1 means none, as in FlashInfer (vLLM passes it)."""
        if fixed_split_size == -1:
            fixed_split_size = None
        device = self._ws.device
        kwargs: dict[str, Any] = {"backend": rt.resolve_backend(device, self._variant,
                                                                self._backend),
                                  "kv_begins": kv_begins, "head_dim_vo": self._head_dim_vo}
        if self._use_cuda_graph:
            if self._fixed is None:
                first, _ = schedule(qo_lens, kv_lens, group_size=num_qo_heads // num_kv_heads,
                                    num_kv_heads=num_kv_heads, head_dim=head_dim,
                                    num_sms=device_num_sms(device), causal=causal, **kwargs)
                # Room for split KV (the CTAs per SM the split heuristic aims for with this
                # shape) where the first plan split or leaves more than half of it empty (a
                # batch of equal lengths splits only then): idle CTAs are not free (H100, a
                # one-wave decode 64 x 4096 with 16 idle ones: 353.5 vs 348.5 us,
                # benchmarks/tuning/graph_decode.py).
                slots = cta_occupancy(first.cta, max(head_dim, self._head_dim_vo)) * \
                    device_num_sms(device)
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
                             num_sms=device_num_sms(device), causal=causal,
                             kv_chunk_size=fixed_split_size, disable_split_kv=disable_split_kv,
                             **kwargs)
        max_parts = self._ws.max_partials(num_qo_heads, self._head_dim_vo)
        if plan.split_kv and plan.num_partials > max_parts and not self._use_cuda_graph:
            plan, buf = schedule(qo_lens, kv_lens, group_size=num_qo_heads // num_kv_heads,
                                 num_kv_heads=num_kv_heads, head_dim=head_dim,
                                 num_sms=device_num_sms(device), causal=causal, disable_split_kv=True,
                                 backend=kwargs["backend"], kv_begins=kv_begins,
                                 head_dim_vo=self._head_dim_vo)
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
        if extra:
            for name, value in extra.items():
                if name not in UNSUPPORTED_RUN:
                    raise TypeError(f"run() got an unexpected keyword argument {name!r}")
                if value is not None:
                    raise NotImplementedError(f"run({name}=...) is not supported by this "
                                              f"implementation")
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
        if q.device != self._ws.device:
            raise ValueError(f"q must be on the workspace's device ({self._ws.device}), got "
                             f"{q.device}")
        if window_left is not None and window_left != self._window_left:
            raise ValueError(f"window_left must equal the planned value ({self._window_left}), "
                             f"got {window_left}")
        if q.dtype != self._q_dtype:
            raise ValueError(f"q must have the planned q_data_type ({rt.dtype_name(self._q_dtype)}),"
                             f" got {rt.dtype_name(q.dtype)}; pass q_data_type= to plan()")
        shape = (q.shape[0], self._num_qo_heads, self._head_dim)
        if tuple(q.shape) != shape:
            raise ValueError(f"q must have shape {shape}, got {tuple(q.shape)}")
        out_shape = (*shape[:2], self._head_dim_vo)
        if out is not None:
            if out.device != q.device:
                raise ValueError(f"out must be on q's device ({q.device}), got {out.device}")
            if tuple(out.shape) != out_shape or out.dtype != self._o_dtype:
                raise ValueError(f"out must have shape {out_shape} and dtype "
                                 f"{rt.dtype_name(self._o_dtype)}, got {tuple(out.shape)} "
                                 f"{rt.dtype_name(out.dtype)}")
        if lse is not None and (tuple(lse.shape) != shape[:2] or lse.dtype != torch.float32):
            raise ValueError(f"lse must have shape {shape[:2]} and dtype float32, got "
                             f"{tuple(lse.shape)} {rt.dtype_name(lse.dtype)}")

    def _launch(self, q, k, v, out, lse, return_lse, enable_pdl, q_scale, k_scale, v_scale,
                sinks=None):
        rt.check_sinks(sinks, self._num_qo_heads, q.device)
        # fp8 scales fold into the record's two scalars (host arithmetic, no device pass).
        sm, o_scale = self._scales if q_scale is None and k_scale is None and v_scale is None \
            else rt.resolve_scales(self._head_dim, self._sm_scale, q_scale, k_scale, v_scale)
        if k.device != q.device or v.device != q.device:
            raise ValueError(f"the KV cache must be on q's device ({q.device}), got {k.device}")
        if k.shape[0] <= self._max_page_id:
            raise ValueError(f"the paged KV cache has {k.shape[0]} pages, the planned "
                             f"page ids reach {self._max_page_id}")
        kv_heads = k.shape[-2] if self._kv_layout == "NHD" else k.shape[-3]
        if kv_heads != self._num_kv_heads:
            raise ValueError(f"the KV cache must have the planned num_kv_heads "
                             f"({self._num_kv_heads}), got {kv_heads}")
        if k.shape[-1] != self._head_dim or v.shape[-1] != self._head_dim_vo:
            raise ValueError(f"k and v must have the planned head dims ({self._head_dim} and "
                             f"{self._head_dim_vo}), got {k.shape[-1]} and {v.shape[-1]}")
        if out is None:
            out = torch.empty(*q.shape[:2], self._head_dim_vo, dtype=self._o_dtype,
                              device=q.device)
        if lse is None and return_lse:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        launch = self._launcher
        if launch is None:  # the first run of this plan: q's device before any device query
            check_cuda_device(q.device, "q")
        pdl = resolve_pdl(enable_pdl, q.device)
        if launch is None:  # the module is fetched (built on first use) from here on
            launch = self._launcher = self._prepare(q.device, pdl)
        launch(q, k, v, out, lse, sm, o_scale, pdl, sinks)
        return (out, lse) if return_lse else out

    def _prepare(self, device: torch.device, enable_pdl: bool) -> rt.Launch:
        partials = self._ws.partial_views(self._num_qo_heads, self._head_dim_vo) \
            if self._plan.split_kv else None
        return rt.prepare(
            rt.get_attention_module(self._variant), self._plan, self._plan_dev,
            num_qo_heads=self._num_qo_heads, num_kv_heads=self._num_kv_heads,
            kv_layout=rt.KV_LAYOUTS[self._kv_layout], qo_indptr=self._qo_indptr, kv_indptr=self._kv_indptr,
            kv_indices=self._kv_indices, kv_last_page_len=self._kv_last_page_len,
            partials=partials, counters=self._ws.counters, custom_mask=self._mask,
            mask_indptr=self._mask_indptr,
            alibi_slopes=rt.alibi_slopes_for(self._pos_encoding_mode, self._num_qo_heads, device),
            sm_scale=self._scales[0], logits_soft_cap=self._logits_soft_cap, o_scale=self._scales[1],
            rope_scale=self._rope_scale, rope_theta=self._rope_theta,
            window_left=self._window_left, enable_pdl=enable_pdl)

    def _set_options(self, *, num_qo_heads, num_kv_heads, head_dim, pos_encoding_mode, sm_scale,
                     window_left, logits_soft_cap, rope_scale, rope_theta, q_data_type,
                     kv_data_type, o_data_type, data_type=None,
                     head_dim_vo: Optional[int] = None) -> None:
        head_dim_vo = check_head_dim(head_dim, head_dim_vo)
        check_heads(num_qo_heads, num_kv_heads)
        rt.check_pos_encoding(pos_encoding_mode)
        q_dtype = rt.parse_dtype(q_data_type, "q_data_type")
        kv_dtype = rt.parse_dtype(kv_data_type, "kv_data_type")
        legacy = rt.parse_dtype(data_type, "data_type")
        # The deprecated data_type only fills a dtype left as None (so alone it sets the KV one).
        q_dtype = q_dtype or legacy or torch.float16
        kv_dtype = kv_dtype or legacy or q_dtype
        o_dtype = rt.parse_dtype(o_data_type, "o_data_type") or q_dtype
        for name, dt in (("q_data_type", q_dtype), ("o_data_type", o_dtype)):
            rt.check_half(dt, name)
        rt.check_kv_dtype(kv_dtype, q_dtype, "kv_data_type")
        check_fp8_head_dims(rt.dtype_name(kv_dtype), head_dim, head_dim_vo)
        self._num_qo_heads, self._num_kv_heads, self._head_dim = num_qo_heads, num_kv_heads, head_dim
        self._head_dim_vo = head_dim_vo
        self._q_dtype, self._kv_dtype, self._o_dtype = q_dtype, kv_dtype, o_dtype
        self._pos_encoding_mode = pos_encoding_mode
        rt.resolve_scales(head_dim, sm_scale, None, None, None)  # checks sm_scale
        rt.check_window_left(window_left)
        rt.soft_cap(logits_soft_cap)
        rt.rope_defaults(rope_scale, rope_theta)
        self._sm_scale, self._window_left, self._logits_soft_cap = (sm_scale, window_left,
                                                                   logits_soft_cap)
        self._rope_scale, self._rope_theta = rope_scale, rope_theta

    def _check_kv_dtype(self, k: torch.Tensor, v: torch.Tensor) -> None:
        for x in (k, v):
            if x.dtype != self._kv_dtype:
                raise ValueError(f"the KV cache must have the planned kv_data_type "
                                 f"({rt.dtype_name(self._kv_dtype)}), got "
                                 f"{rt.dtype_name(x.dtype)}")

    # -- what serving engines read and write on a wrapper (docs/serving-engines.md) ----------
    def _buf_property(key: str):  # noqa: N805 (a helper run at class creation)
        name, planned, dtype, size = _BUFFERS[key]

        def get(self):
            """The graph-mode buffer the engine passed, else what the current plan reads."""
            buf = self._bufs.get(key)
            return buf if buf is not None else getattr(self, planned, None)

        def put(self, value):
            """Before a plan: the buffer plans will use. After one: page ids and the packed mask
            may be replaced (same layout, at least as many entries; runs from now on read the
            new tensor, as FlashInfer's run reads these attributes); the arrays the schedule was
            made from may not (plan again)."""
            if key not in self._bufs:
                raise AttributeError(f"{type(self).__name__} has no {name}")
            current = getattr(self, planned, None) if self._plan is not None else None
            if current is not None:
                if size is None:
                    raise NotImplementedError(f"assigning {name} after plan() is not supported "
                                              f"(the plan was scheduled from it): plan() again")
                need = getattr(self, size, 0)
                if not (isinstance(value, torch.Tensor) and value.dtype == dtype
                        and value.device == self._ws.device and value.dim() == 1
                        and value.is_contiguous() and value.numel() >= need):
                    raise ValueError(f"{name} must be a contiguous 1-D {dtype} tensor on "
                                     f"{self._ws.device} with at least {need} entries, got "
                                     f"{value!r:.80}")
                setattr(self, planned, value)
                if key == "kv_indices":
                    self._max_page_id = -1  # device ids: not read back
                self._launcher = None
            if self._use_cuda_graph:  # later plans stage into it (FlashInfer's plan, too,
                self._bufs[key] = value  # replaces the attribute outside graph mode)

        return property(get, put)

    _paged_kv_indices_buf = _buf_property("kv_indices")
    _paged_kv_indptr_buf = _buf_property("kv_indptr")
    _paged_kv_last_page_len_buf = _buf_property("kv_last_page_len")
    _qo_indptr_buf = _buf_property("qo_indptr")
    _custom_mask_buf = _buf_property("custom_mask")
    _mask_indptr_buf = _buf_property("mask_indptr")
    del _buf_property

    # -- the deprecated entry points -------------------------------------------------------
    def _remember_plan(self, args: dict) -> None:
        """Keep a successful plan's arguments: the deprecated ``forward`` re-plans with them
        when it is given another ``causal`` or ``pos_encoding_mode``."""
        self._plan_args = {k: v for k, v in args.items() if k not in ("self", "args",
                                                                      "__class__")}

    def _forward(self, inputs: tuple, return_lse: bool, given: dict):
        """The deprecated ``forward``/``forward_return_lse``: ``given`` (their arguments)
        replace the planned options, then ``run(*inputs)`` with the scales among them."""
        self._apply_legacy_options(**{name: given[name] for name in LEGACY_OPTIONS
                                      if name in given})
        return self.run(*inputs, return_lse=return_lse,
                        **{name: given[name] for name in ("q_scale", "k_scale", "v_scale")
                           if name in given})

    def _apply_legacy_options(self, *, causal: Optional[bool] = None,
                              pos_encoding_mode: str = "NONE",
                              use_fp16_qk_reduction: bool = False, window_left: int = -1,
                              logits_soft_cap: Optional[float] = None,
                              sm_scale: Optional[float] = None,
                              rope_scale: Optional[float] = None,
                              rope_theta: Optional[float] = None) -> None:
        """What FlashInfer's deprecated ``forward``/``forward_return_lse`` do before they run:
        their options (defaults included) replace the planned ones. Scalars (``sm_scale``,
        ``logits_soft_cap``, ``window_left``, ``rope_scale``, ``rope_theta``) update the plan in
        place (host work only, so a CUDA-graph capture may call it); another ``causal`` or
        ``pos_encoding_mode`` needs another kernel and schedule: the batch is planned again
        with the stored plan arguments (host work that reads the metadata: not during a
        capture). ``causal=None``: the wrapper has none (decode)."""
        if self._plan is None:
            raise RuntimeError("plan() must be called before forward()")
        if use_fp16_qk_reduction:
            raise NotImplementedError("use_fp16_qk_reduction=True is not supported by this "
                                      "implementation (it accumulates q.k in float32)")
        rt.check_pos_encoding(pos_encoding_mode)
        rt.check_window_left(window_left)
        rt.resolve_scales(self._head_dim, sm_scale, None, None, None)
        rt.soft_cap(logits_soft_cap)
        rt.rope_defaults(rope_scale, rope_theta)
        scalars = dict(window_left=window_left, logits_soft_cap=logits_soft_cap,
                       sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        replan = pos_encoding_mode != self._pos_encoding_mode
        if causal is not None and self._mask is None:  # a custom mask overrides causal
            replan |= bool(causal) != (self._variant.mask_mode == "causal")
        if replan:
            extra = {} if causal is None else {"causal": bool(causal)}
            type(self).plan(self, **{**self._plan_args, **scalars, **extra,
                         "pos_encoding_mode": pos_encoding_mode})
            return
        if causal is not None:
            self._causal = bool(causal)
        # Each one that changed makes the next run build its launch record again.
        self._sm_scale, self._logits_soft_cap, self._window_left = (sm_scale, logits_soft_cap,
                                                                   window_left)
        self._rope_scale, self._rope_theta = rope_scale, rope_theta
        self._plan_args.update(scalars)

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
        self._causal = bool(causal)  # as given (a custom mask overrides it), as FlashInfer keeps it
        mask_mode = "custom" if use_mask else ("causal" if causal else "none")
        self._mask = None
        if use_mask:
            mask, mask_indptr = pack_mask(custom_mask, packed_custom_mask, qo_lens, kv_lens,
                                           self._ws.device)
            self._mask_bytes = int(mask_indptr[-1])
            self._mask = mask
            if bufs.get("custom_mask") is not None:  # graph mode: where the captured run reads
                if mask.numel() > bufs["custom_mask"].numel():
                    raise ValueError(f"custom_mask has {mask.numel()} bytes, its CUDA-graph "
                                     f"buffer only {bufs['custom_mask'].numel()}")
                self._mask = bufs["custom_mask"]
                self._mask[:mask.numel()].copy_(mask, non_blocking=non_blocking)
            metadata = [*metadata, (bufs.get("mask_indptr"), mask_indptr, "mask_indptr")]
        self._variant = make_variant(self._q_dtype, self._o_dtype, head_dim, mask_mode,
                                 self._pos_encoding_mode, self._paged, self._kv_dtype,
                                 self._head_dim_vo)
        plan, buf = self._schedule(qo_lens, kv_lens, num_qo_heads, num_kv_heads, head_dim,
                                   mask_mode == "causal", fixed_split_size, disable_split_kv,
                                   kv_begins)
        views = self._set_plan(plan, buf, metadata, non_blocking)
        self._mask_indptr = views.pop() if use_mask else None
        self._qo_indptr, self._kv_indptr = views[:2]
        return views


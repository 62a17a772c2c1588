"""What decode, prefill and cascade share: option parsing, the workspaces, uploading a plan, and
the call into a compiled attention module. Internal; the public API is in ``flashinfer.decode``,
``flashinfer.prefill`` and ``flashinfer.cascade``."""

from __future__ import annotations

import functools
import math
import struct
from array import array
from typing import Any, Optional, Sequence, Union

import torch

from .. import _checks as checks
from ..jit.attention import AttentionVariant
from .plan import AttentionPlan

KV_LAYOUTS = {"NHD": 0, "HND": 1}
POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI")
INT_WORKSPACE_BYTES = 8 << 20
# The int workspace holds a plan and the batch's metadata from int 0 on (Workspace.stage) and,
# in its last MERGE_COUNTERS ints, the split-KV merge counters (item_capacity x num_kv_heads of
# them are used; include/flashinfer/attention/launch.cuh): zeroed with the workspace, left at 0 by
# every launch.
MERGE_COUNTERS = 1 << 17
_DTYPE_NAMES = {
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "float": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
}


def parse_dtype(value: Union[str, torch.dtype, None], name: str) -> Optional[torch.dtype]:
    """A torch dtype from a dtype or its name (``"float16"``, ``"torch.bfloat16"``, ...)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        key = value.removeprefix("torch.")
        if key in _DTYPE_NAMES:
            return _DTYPE_NAMES[key]
    raise ValueError(f"{name} must be a torch.dtype or a dtype name, got {value!r}")


def check_kv_layout(kv_layout: str) -> int:
    if kv_layout not in KV_LAYOUTS:
        raise KeyError(f"kv_layout must be one of {list(KV_LAYOUTS)}, got {kv_layout!r}")
    return KV_LAYOUTS[kv_layout]


def check_pos_encoding(mode: str) -> str:
    if mode not in POS_ENCODING_MODES:
        raise KeyError(f"pos_encoding_mode must be one of {list(POS_ENCODING_MODES)}, got {mode!r}")
    return mode


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


#: KV-cache dtypes besides q's: fp8, converted to q's dtype inside the kernel.
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_half(dtype: torch.dtype, name: str) -> None:
    """q and the output: float16 or bfloat16. fp8 is known but supported only for the KV cache
    (``NotImplementedError``); anything else is ``ValueError``."""
    if dtype in FP8_KV_DTYPES:
        raise NotImplementedError(f"{name}={dtype_name(dtype)} is not supported by this "
                                  f"implementation: fp8 is supported for the KV cache only "
                                  f"(q and the output are float16 or bfloat16)")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"{name} must be float16 or bfloat16, got {dtype_name(dtype)}")


def check_kv_dtype(kv_dtype: torch.dtype, q_dtype: torch.dtype, name: str) -> None:
    """The KV cache: q's dtype, or fp8 (e4m3 / e5m2) under a float16 or bfloat16 q."""
    if kv_dtype != q_dtype and kv_dtype not in FP8_KV_DTYPES:
        raise ValueError(f"{name} must be q's dtype ({dtype_name(q_dtype)}), float8_e4m3fn or "
                         f"float8_e5m2, got {dtype_name(kv_dtype)}")


def check_scale(value: Any, name: str) -> Optional[float]:
    """A calibration scale (``q_scale``, ``k_scale``, ``v_scale``): None or a Python number,
    as FlashInfer's ``run`` takes them; a tensor would have to be read back from the device
    (a host synchronization, impossible under CUDA-graph capture)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float or None, got {type(value).__name__}"
                        + (" (pass a Python float: reading a tensor would synchronize)"
                           if isinstance(value, torch.Tensor) else ""))
    return float(value)


def resolve_scales(head_dim: int, sm_scale: Optional[float], q_scale: Optional[float],
                   k_scale: Optional[float], v_scale: Optional[float]) -> tuple[float, float]:
    """(sm_scale, o_scale): sm_scale defaults to 1/sqrt(head_dim); q_scale and k_scale multiply
    it, v_scale multiplies the output (fp8 calibration scales: the kernel reads the cache as it
    is stored and applies them through these two host-side numbers, no extra pass)."""
    q_scale, k_scale, v_scale = (check_scale(q_scale, "q_scale"), check_scale(k_scale, "k_scale"),
                                 check_scale(v_scale, "v_scale"))
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    if not 0 < scale < math.inf:  # also nan
        raise ValueError(f"sm_scale must be positive and finite, got {sm_scale}")
    for name, s in (("q_scale", q_scale), ("k_scale", k_scale)):
        if s is not None:
            if not 0 < s < math.inf:
                raise ValueError(f"{name} must be positive and finite, got {s}")
            scale *= float(s)
    if v_scale is not None and not math.isfinite(v_scale):
        raise ValueError(f"v_scale must be finite, got {v_scale}")
    return scale, 1.0 if v_scale is None else float(v_scale)


def soft_cap(logits_soft_cap: Optional[float]) -> float:
    if logits_soft_cap is None:
        return 0.0
    if not 0 <= logits_soft_cap < math.inf:  # also nan
        raise ValueError(f"logits_soft_cap must be >= 0 or None, got {logits_soft_cap}")
    return float(logits_soft_cap)


def rope_defaults(rope_scale: Optional[float], rope_theta: Optional[float]) -> tuple[float, float]:
    scale = 1.0 if rope_scale is None else float(rope_scale)
    theta = 1e4 if rope_theta is None else float(rope_theta)
    for name, x in (("rope_scale", scale), ("rope_theta", theta)):
        if not 0 < x < math.inf:
            raise ValueError(f"{name} must be positive and finite, got {x}")
    return scale, theta


@functools.cache
def get_attention_module(variant: AttentionVariant) -> Any:
    return variant.spec().build_and_load()


#: Resolved launches of single-request problems (:mod:`.single`), by problem.
single_launches: dict = {}


def set_module_source(fetch: Any) -> None:
    """From now on fetch each variant's module with ``fetch(variant)`` (tuning tools: builds of
    the same variants with other tuning macros); launches resolved with earlier modules are
    forgotten. A wrapper's plan keeps its launch until its next plan()."""
    global get_attention_module
    get_attention_module = fetch
    single_launches.clear()


@functools.cache
def num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


#: ``backend=`` of the attention ops: "fa2" the tensor-core kernel of every GPU, "fa3" the
#: Hopper kernel, "auto" the Hopper kernel where the GPU and the variant have it.
BACKENDS = ("auto", "fa2", "fa3")


# FlashInfer's other attention backends (Blackwell kernels, cuDNN): named, not provided.
UPSTREAM_ONLY_BACKENDS = ("cutlass", "trtllm-gen", "cudnn", "cute-dsl")


def check_backend(backend: str) -> str:
    if backend in UPSTREAM_ONLY_BACKENDS:
        raise NotImplementedError(f"backend={backend!r} is not provided by this implementation "
                                  f"(its backends: {', '.join(map(repr, BACKENDS))})")
    return checks.check_backend(backend, BACKENDS)


def resolve_backend(device: torch.device, variant: AttentionVariant, backend: str) -> str:
    """The kernel family a plan may use, ``"fa2"`` or ``"fa3"``: ``"auto"`` is ``"fa3"`` on a
    compute capability 9.0 GPU for a variant that has the Hopper kernel; ``"fa3"`` insists (and
    says why it cannot); ``"fa2"`` is itself."""
    check_backend(backend)
    if backend == "fa2" or device.type != "cuda":
        return "fa2"
    index = device.index if device.index is not None else torch.cuda.current_device()
    ok = _capability(index) == (9, 0) and variant.has_sm90
    if backend == "fa3" and not ok:
        raise ValueError(f"backend='fa3' (the Hopper kernel) needs a compute capability 9.0 GPU "
                         f"and head_dim 64, 128 or 256 (head_dim_vo equal) or 192 / 128 without "
                         f"pos_encoding_mode='ROPE_LLAMA', with a KV cache of q's dtype; got "
                         f"capability {_capability(index)}, head_dim {variant.head_dim}, "
                         f"head_dim_vo {variant.head_dim_vo}, pos_encoding_mode "
                         f"{variant.pos_encoding!r}, kv dtype {variant.dtype_kv}")
    return "fa3" if ok else "fa2"


def check_window_left(window_left: Optional[int]) -> int:
    """-1 (or None): no window; w >= 0 keeps the w keys before each row's position."""
    if window_left is None:
        return -1
    if not isinstance(window_left, int) or window_left < -1:
        raise ValueError(f"window_left must be an int >= -1 (-1: no window), got {window_left!r}")
    return window_left


class Workspace:
    """The float workspace (split-KV partial states), the int workspace (the plan) and its
    merge counters. ``plan`` writes (``stage``); ``run`` only reads."""

    def __init__(self, float_workspace_buffer: torch.Tensor,
                 int_workspace_buffer: Optional[torch.Tensor] = None) -> None:
        self.reset(float_workspace_buffer, int_workspace_buffer)

    def reset(self, float_workspace_buffer: torch.Tensor,
              int_workspace_buffer: Optional[torch.Tensor] = None) -> None:
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError("float_workspace_buffer must be a torch.Tensor, got "
                            f"{type(float_workspace_buffer).__name__}")
        if float_workspace_buffer.data_ptr() % 16:
            raise ValueError("float_workspace_buffer must be 16-byte aligned")
        self.float_ws = float_workspace_buffer
        self._partials: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.device = float_workspace_buffer.device
        if int_workspace_buffer is None:
            int_workspace_buffer = torch.empty(INT_WORKSPACE_BYTES, dtype=torch.uint8,
                                               device=self.device)
        self.int_ws = int_workspace_buffer
        self._ints = int_workspace_buffer.view(torch.uint8).view(-1).view(torch.int32)
        if self._ints.numel() <= MERGE_COUNTERS:
            raise ValueError(f"int_workspace_buffer must hold more than {MERGE_COUNTERS * 4} "
                             f"bytes, got {self._ints.numel() * 4}")
        # Pinned staging for plan(): two blocks used in turn, each with the event after its
        # latest copies (Workspace.stage).
        self._pinned: list[Optional[torch.Tensor]] = [None, None]
        self._copied: list[Any] = [None, None]
        self._turn = 0
        self.counters = self._ints[-MERGE_COUNTERS:]
        self.counters.zero_()

    @property
    def float_bytes(self) -> int:
        return self.float_ws.numel() * self.float_ws.element_size()

    def max_partials(self, num_qo_heads: int, head_dim: int) -> int:
        return self.float_bytes // (num_qo_heads * (head_dim + 1) * 4)

    def partial_views(self, num_qo_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(o_part, lse_part): float32 views of the float workspace, as many states as fit (made
        once per shape: a plan's first run asks for them every decode step)."""
        key = (num_qo_heads, head_dim)
        if key not in self._partials:
            n = self.max_partials(num_qo_heads, head_dim)
            flat = self.float_ws.view(torch.uint8).view(-1)[: n * num_qo_heads * (head_dim + 1) * 4]
            flat = flat.view(torch.float32)
            self._partials[key] = (flat[: n * num_qo_heads * head_dim],
                                   flat[n * num_qo_heads * head_dim:])
        return self._partials[key]

    @property
    def room(self) -> int:
        """Ints of the int workspace for a plan and its metadata (all but the counters)."""
        return self._ints.numel() - MERGE_COUNTERS

    def stage(self, items: Sequence[tuple[Optional[torch.Tensor], torch.Tensor, str]],
              non_blocking: bool = True) -> list[torch.Tensor]:
        """Put a plan and its batch's metadata on the device: ``items`` are ``(graph buffer or
        None, int tensor, name)``, the plan first; returns each as an int32 device tensor.

        Host tensors without a graph buffer are laid out one after another from int 0 of the
        int workspace and copied in one go out of pinned memory (``_pinned_block``), those with
        one are copied into it from there; a copy per tensor costs each plan tens of
        microseconds, and a blocking pageable one synchronizes the stream. Device tensors are
        used as they are (copied into their graph buffer). What does not fit the workspace is
        copied on its own. In graph mode the plan's length is fixed, so the arrays after it keep
        their addresses (a captured run reads them)."""
        on_device = self.device.type == "cuda"
        # Host tensors are laid out in pinned memory one after another: the workspace's first
        # (the plan at 0, then the rest of its one copy), then those bound for graph buffers.
        ranks = sorted(range(len(items)), key=lambda i: items[i][0] is not None)
        at: dict[int, int] = {}
        parts = []
        end = block = 0
        for i in ranks:
            t = items[i][1]
            n = t.numel()
            if not t.is_cuda and end + n <= self.room:
                at[i] = end
                parts.append(t if t.dim() == 1 else t.reshape(-1))
                end += n
                if items[i][0] is None:
                    block = end
        if 0 not in at:
            raise ValueError(f"the plan needs {items[0][1].numel()} ints, the int workspace has "
                             f"room for {self.room}; plan a smaller batch")
        staged = self._pinned_block(end) if on_device else self._ints
        torch.cat(parts, out=staged[:end])  # and to int32
        if on_device:
            self._ints[:block].copy_(staged[:block], non_blocking=non_blocking)
        out = []
        for i, (buf, t, name) in enumerate(items):
            n = t.numel()
            if buf is None:
                out.append(self._ints[at[i]:at[i] + n] if i in at
                           else t.to(self.device, torch.int32, non_blocking=True))
                continue
            if i not in at and t.is_cuda and t.data_ptr() == buf.data_ptr():
                out.append(buf)  # written in place by the caller (an engine's graph buffer)
                continue
            if n > buf.numel():
                raise ValueError(f"{name} has {n} entries, its CUDA-graph buffer only "
                                 f"{buf.numel()}")
            buf[:n].copy_(staged[at[i]:at[i] + n] if i in at else t.reshape(-1),
                          non_blocking=non_blocking)
            out.append(buf)
        if on_device:
            self._copied[self._turn] = torch.cuda.Event()
            self._copied[self._turn].record()
        return out

    def _pinned_block(self, ints: int) -> torch.Tensor:
        """The next of two pinned blocks, used in turn: a plan waits only for the copies of the
        plan before the previous one (a plan per decode step, the host a step ahead of the GPU,
        never waits). Grown by doubling; a new pinned allocation may synchronize the device."""
        self._turn ^= 1
        block, done = self._pinned[self._turn], self._copied[self._turn]
        if block is None or block.numel() < ints:
            size = max(ints, 4096, 2 * (0 if block is None else block.numel()))
            # Torch's caching host allocator keeps the old block until its copies are done.
            block = self._pinned[self._turn] = torch.empty(size, dtype=torch.int32,
                                                           pin_memory=True)
        elif done is not None:
            done.synchronize()
        return block


# The run-time parameter record: what csrc/attention.cu's ``run`` takes besides q, k, v, o and
# lse, as one int64 host tensor (device addresses as integers, floats as their float64 bits).
# Its layout is stated here and in csrc/attention_utils.h (``RunParam``); the version and the
# length are checked there, and tests/test_attention_layout.py holds the two lists together.
RUN_PARAMS_VERSION = 2
RUN_PARAMS = (
    "version", "length", "device_id", "cta", "grid_x", "kv_layout",
    "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "plan",
    "item_capacity", "split_kv", "cluster_merge", "sm90_tma_q",
    "o_part", "lse_part", "num_rows", "merge_counters",
    "custom_mask", "mask_indptr", "alibi_slopes", "sinks",
    "sm_scale", "logits_soft_cap", "o_scale", "rope_scale", "rope_theta",
    "window_left", "enable_pdl",
)
_SLOT = {name: i for i, name in enumerate(RUN_PARAMS)}
_INDEX_DTYPES = {"qo_indptr": (torch.int32,), "kv_indptr": (torch.int32,),
                 "kv_indices": (torch.int32,), "kv_last_page_len": (torch.int32,),
                 "custom_mask": (torch.uint8,), "mask_indptr": (torch.int32,)}
_FLOATS = ("sm_scale", "logits_soft_cap", "o_scale", "rope_scale", "rope_theta")


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def run_params(**values: Any) -> torch.Tensor:
    """The record as an int64 CPU tensor: tensors by address (None -> 0), floats as bits."""
    rec = array("q", bytes(8 * len(RUN_PARAMS)))
    rec[0], rec[1] = RUN_PARAMS_VERSION, len(RUN_PARAMS)
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            value = value.data_ptr()
        elif value is None:
            value = 0
        elif name in _FLOATS:
            value = _float_bits(value)
        rec[_SLOT[name]] = int(value)
    return torch.frombuffer(rec, dtype=torch.int64)


class Launch:
    """Every launch of one plan: the compiled module and the plan's parameter record, resolved
    once (``prepare``). A call passes q, k, v, o, lse and the record; the per-call values
    (``sm_scale``, ``o_scale``, ``enable_pdl``, the ``sinks`` tensor's address) are the record's
    unless a call changes them (a copy of the record, kept for the next call). Its host time per
    call is what an eager caller pays per layer (benchmarks/host_cost.py)."""

    __slots__ = ("module", "params", "_scalars", "_last", "_keep")

    def __init__(self, module: Any, params: torch.Tensor, scalars: tuple, keep: tuple) -> None:
        self.module = module
        self._keep = keep
        self.params = params
        self._scalars = scalars  # (sm_scale, o_scale, enable_pdl, sinks address) of ``params``
        self._last = (scalars, params)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 lse: Optional[torch.Tensor], sm_scale: float, o_scale: float,
                 enable_pdl: bool, sinks: Optional[torch.Tensor] = None) -> None:
        """``sinks``: float32 (Hq,) on q's device, checked by the caller (``check_sinks``)."""
        scalars = (sm_scale, o_scale, enable_pdl, 0 if sinks is None else sinks.data_ptr())
        if scalars == self._scalars:
            params = self.params
        elif scalars == self._last[0]:
            params = self._last[1]
        else:
            params = self.params.clone()
            params[_SLOT["sm_scale"]] = _float_bits(sm_scale)
            params[_SLOT["o_scale"]] = _float_bits(o_scale)
            params[_SLOT["enable_pdl"]] = int(enable_pdl)
            params[_SLOT["sinks"]] = scalars[3]
            self._last = (scalars, params)
        self.module.run(q, k, v, o, lse, params)


def prepare(module: Any, plan: AttentionPlan, plan_dev: torch.Tensor, *, num_qo_heads: int,
            num_kv_heads: int, kv_layout: int, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
            sm_scale: float, logits_soft_cap: float, o_scale: float, rope_scale: float,
            rope_theta: float, window_left: int, enable_pdl: bool,
            kv_indices: Optional[torch.Tensor] = None,
            kv_last_page_len: Optional[torch.Tensor] = None,
            partials: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
            counters: Optional[torch.Tensor] = None, custom_mask: Optional[torch.Tensor] = None,
            mask_indptr: Optional[torch.Tensor] = None,
            alibi_slopes: Optional[torch.Tensor] = None) -> Launch:
    """The launches of a compiled attention module (and its split-KV merge) for a plan.

    ``counters`` (int32, all 0) lets the kernel merge its own split-KV partial states; with too
    few of them (fewer than ``item_capacity * num_kv_heads``) a merge kernel does it. Every
    tensor must live on ``plan_dev``'s device and outlive the launch (the record holds their
    addresses only)."""
    o_part = lse_part = merge_counters = None
    if plan.split_kv:
        if partials is None:
            raise ValueError("a split-KV plan needs partial-state buffers")
        o_part, lse_part = partials
        room = lse_part.numel() // num_qo_heads
        if plan.num_partials > room:
            raise ValueError(f"the float workspace holds {room} partial states, the plan needs "
                             f"{plan.num_partials}; pass a larger float_workspace_buffer")
        needed = plan.item_capacity * num_kv_heads
        if counters is not None and counters.numel() >= needed:
            merge_counters = counters[:needed]
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr),
                    ("kv_indices", kv_indices), ("kv_last_page_len", kv_last_page_len),
                    ("custom_mask", custom_mask), ("mask_indptr", mask_indptr)):
        if t is not None and (t.device != plan_dev.device or t.dtype not in _INDEX_DTYPES[name]
                              or not t.is_contiguous()):
            raise ValueError(f"{name} must be a contiguous {_INDEX_DTYPES[name][0]} tensor on "
                             f"{plan_dev.device}, got {t.dtype} on {t.device}")
    params = run_params(
        device_id=plan_dev.device.index or 0, cta=plan.cta, grid_x=plan.grid_x,
        kv_layout=kv_layout, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
        kv_last_page_len=kv_last_page_len, plan=plan_dev, item_capacity=plan.item_capacity,
        split_kv=plan.split_kv, cluster_merge=plan.cluster_merge, sm90_tma_q=plan.sm90_tma_q,
        o_part=o_part, lse_part=lse_part, num_rows=plan.num_rows,
        merge_counters=merge_counters, custom_mask=custom_mask, mask_indptr=mask_indptr,
        alibi_slopes=alibi_slopes, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
        o_scale=o_scale, rope_scale=rope_scale, rope_theta=rope_theta,
        window_left=window_left, enable_pdl=enable_pdl)
    # The record holds addresses: the launch keeps what they point to alive.
    keep = (plan_dev, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, o_part, lse_part,
            merge_counters, custom_mask, mask_indptr, alibi_slopes)
    return Launch(module, params, (sm_scale, o_scale, enable_pdl, 0), keep)


@functools.cache
def _alibi_slopes(num_heads: int, device: torch.device) -> torch.Tensor:
    from ..utils import get_alibi_slopes

    return get_alibi_slopes(num_heads).to(device=device, dtype=torch.float32)


def check_sinks(sinks: Optional[torch.Tensor], num_qo_heads: int, device: torch.device) -> None:
    """``run(sinks=)``: None, or one float32 logit per query head on q's device."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor or None, got {type(sinks).__name__}")
    if sinks.dtype != torch.float32:
        raise ValueError(f"sinks must be float32, got {dtype_name(sinks.dtype)}")
    if tuple(sinks.shape) != (num_qo_heads,) or (num_qo_heads > 1 and sinks.stride(0) != 1):
        raise ValueError(f"sinks must be a contiguous tensor of shape ({num_qo_heads},) (one "
                         f"logit per query head), got shape {tuple(sinks.shape)} stride "
                         f"{sinks.stride()}")
    if sinks.device != device:
        raise ValueError(f"sinks must be on q's device ({device}), got {sinks.device}")


def alibi_slopes_for(pos_encoding_mode: str, num_heads: int,
                     device: torch.device) -> Optional[torch.Tensor]:
    return _alibi_slopes(num_heads, device) if pos_encoding_mode == "ALIBI" else None

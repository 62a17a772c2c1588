"""What decode, prefill and cascade share: option parsing, the workspaces, uploading a plan, and
the call into a compiled attention module. Internal; the public API is in ``flashinfer.decode``,
``flashinfer.prefill`` and ``flashinfer.cascade``."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch

from .attention_plan import AttentionPlan
from .jit.attention import AttentionVariant

KV_LAYOUTS = {"NHD": 0, "HND": 1}
POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI")
INT_WORKSPACE_BYTES = 8 << 20
# The int workspace holds a plan and the batch's metadata from int 0 on (Workspace.stage) and,
# in its last MERGE_COUNTERS ints, the split-KV merge counters (item_capacity x num_kv_heads of
# them are used; csrc/attention.cu): zeroed with the workspace, left at 0 by every launch.
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


def check_half(dtype: torch.dtype, name: str) -> None:
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"{name} must be float16 or bfloat16, got {dtype_name(dtype)}"
                         + (" (fp8 KV caches are not supported yet)" if dtype.itemsize == 1 else ""))


def resolve_scales(head_dim: int, sm_scale: Optional[float], q_scale: Optional[float],
                   k_scale: Optional[float], v_scale: Optional[float]) -> tuple[float, float]:
    """(sm_scale, o_scale): sm_scale defaults to 1/sqrt(head_dim); q_scale and k_scale multiply
    it, v_scale multiplies the output."""
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    if scale <= 0:
        raise ValueError(f"sm_scale must be positive, got {scale}")
    for s in (q_scale, k_scale):
        if s is not None:
            scale *= float(s)
    return scale, 1.0 if v_scale is None else float(v_scale)


def soft_cap(logits_soft_cap: Optional[float]) -> float:
    if logits_soft_cap is None:
        return 0.0
    if logits_soft_cap < 0:
        raise ValueError(f"logits_soft_cap must be >= 0 or None, got {logits_soft_cap}")
    return float(logits_soft_cap)


def rope_defaults(rope_scale: Optional[float], rope_theta: Optional[float]) -> tuple[float, float]:
    return (1.0 if rope_scale is None else float(rope_scale),
            1e4 if rope_theta is None else float(rope_theta))


@functools.cache
def get_attention_module(variant: AttentionVariant) -> Any:
    return variant.spec().build_and_load()


@functools.cache
def num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


BACKENDS = ("auto", "fa2", "fa3")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    return backend


def use_sm90(device: torch.device, variant: AttentionVariant, backend: str) -> bool:
    """Whether plans may take the Hopper kernel: ``"auto"`` on a compute capability 9.0 GPU for
    a variant that has it; ``"fa3"`` insists (and says why it cannot); ``"fa2"`` never."""
    check_backend(backend)
    if backend == "fa2" or device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    ok = _capability(index) == (9, 0) and variant.has_sm90
    if backend == "fa3" and not ok:
        raise ValueError(f"backend='fa3' (the Hopper kernel) needs a compute capability 9.0 GPU "
                         f"and head_dim 64 or 128 without pos_encoding_mode='ROPE_LLAMA'; got "
                         f"capability {_capability(index)}, head_dim {variant.head_dim}, "
                         f"pos_encoding_mode {variant.pos_encoding!r}")
    return ok


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


@dataclass(frozen=True)
class Launch:
    """What every launch of one plan passes the compiled module, resolved once (``prepare``):
    ``run`` of a batch wrapper then only checks its tensors and calls the module (its host time
    per call is what an eager caller pays per layer: benchmarks/host_cost.py)."""

    module: Any
    cta: int
    grid_x: int
    # The module's arguments between lse and sm_scale (csrc/attention.cu's run).
    meta: tuple

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 lse: Optional[torch.Tensor], sm_scale: float, softcap: float, o_scale: float,
                 rope_scale: float, rope_theta: float, window_left: int,
                 enable_pdl: bool) -> None:
        self.module.run(self.cta, self.grid_x, q, k, v, o, lse, *self.meta, sm_scale, softcap,
                        o_scale, rope_scale, rope_theta, window_left, enable_pdl)


def prepare(module: Any, plan: AttentionPlan, plan_dev: torch.Tensor, *, num_qo_heads: int,
            num_kv_heads: int, kv_layout: int, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
            kv_indices: Optional[torch.Tensor] = None,
            kv_last_page_len: Optional[torch.Tensor] = None,
            partials: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
            counters: Optional[torch.Tensor] = None, custom_mask: Optional[torch.Tensor] = None,
            mask_indptr: Optional[torch.Tensor] = None,
            alibi_slopes: Optional[torch.Tensor] = None) -> Launch:
    """The launches of a compiled attention module (and its split-KV merge) for a plan.

    ``counters`` (int32, all 0) lets the kernel merge its own split-KV partial states; with too
    few of them (fewer than ``item_capacity * num_kv_heads``) a merge kernel does it."""
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
    meta = (kv_layout, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, plan_dev,
            plan.item_capacity, plan.split_kv, plan.cluster_merge, plan.sm90_tma_q, o_part,
            lse_part, plan.num_rows, merge_counters, custom_mask, mask_indptr, alibi_slopes)
    return Launch(module, plan.cta, plan.grid_x, meta)


def run_attention(module: Any, plan: AttentionPlan, plan_dev: torch.Tensor, *,
                  q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                  lse: Optional[torch.Tensor], kv_layout: int, sm_scale: float, softcap: float,
                  o_scale: float, rope_scale: float, rope_theta: float, window_left: int,
                  enable_pdl: bool, **inputs: Any) -> None:
    """One launch of ``prepare``'s (``inputs``: its keyword arguments) for a plan used once."""
    # KV heads: k is [..., Hkv, D] (NHD) or [..., Hkv, tokens, D] (HND), ragged or paged
    num_kv_heads = k.shape[-2] if kv_layout == 0 else k.shape[-3]
    launch = prepare(module, plan, plan_dev, num_qo_heads=q.shape[1], num_kv_heads=num_kv_heads,
                     kv_layout=kv_layout, **inputs)
    launch(q, k, v, o, lse, sm_scale, softcap, o_scale, rope_scale, rope_theta, window_left,
           enable_pdl)


@functools.cache
def _alibi_slopes(num_heads: int, device: torch.device) -> torch.Tensor:
    from .utils import get_alibi_slopes

    return get_alibi_slopes(num_heads).to(device=device, dtype=torch.float32)


def alibi_slopes_for(pos_encoding_mode: str, num_heads: int,
                     device: torch.device) -> Optional[torch.Tensor]:
    return _alibi_slopes(num_heads, device) if pos_encoding_mode == "ALIBI" else None

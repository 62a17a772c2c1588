"""flashinfer.cascade: merging attention states (bandwidth-bound), and the split-KV reduction.

Target (H100, bf16): merge_state 8192 x 32 x 128 <= 70 us (FlashInfer 0.7.2: 69.2 us), i.e. about
97% of the copy ceiling: bytes_moved = v_a, v_b read + v written (3 x 67.1 MB) and s_a, s_b read
+ s written (3 x 1 MB) = 204.5 MB.

The rest: fp16, head_dim 256, the in-place merge (with and without a row mask), merge_states over
8 states, and MergeStatesVarlen (float32 parts -> bf16, the reduction split-KV attention runs):
one row x 32 heads x 132 or 32 parts (split-KV decode, latency-bound), and many rows of 2 parts.
Kernel variants are compared side by side by tune_cascade.py.
"""

import torch

import flashinfer
from flashinfer.attention.merge import merge_states_varlen
from harness import Case

TARGET = "<= 70 us (FlashInfer 0.7.2: 69.2 us); ~97% of copy bandwidth"


def _v(shape, dtype):
    return torch.randn(shape, dtype=dtype, device="cuda")


def _s(shape):
    return torch.randn(shape, dtype=torch.float32, device="cuda") * 4


def _dt(dtype):
    return str(dtype).replace("torch.", "")


def _merge_state(L, H, D, dtype=torch.bfloat16, target="", published_us=None, l2_flush="read"):
    va, vb = _v((L, H, D), dtype), _v((L, H, D), dtype)
    sa, sb = _s((L, H)), _s((L, H))
    return Case(
        f"merge_state {_dt(dtype)} {L}x{H}x{D}" + (", write flush" if l2_flush == "write" else ""),
        lambda: flashinfer.merge_state(va, sa, vb, sb),
        bytes_moved=3 * va.numel() * va.element_size() + 3 * sa.numel() * 4,
        target=target, published_us=published_us, l2_flush=l2_flush)


def _merge_state_in_place(L, H, D, dtype=torch.bfloat16, masked=False):
    v, vo = _v((L, H, D), dtype), _v((L, H, D), dtype)
    s, so = _s((L, H)), _s((L, H))
    mask = (torch.arange(L, device="cuda") % 2 == 0) if masked else None
    rows = L // 2 if masked else L  # unmasked rows move no data
    per_row = H * D * v.element_size()
    # In place: v, s read and written every call; the values change, the traffic does not.
    return Case(
        f"merge_state_in_place {_dt(dtype)} {L}x{H}x{D}" + (" (half the rows masked)"
                                                            if masked else ""),
        lambda: flashinfer.merge_state_in_place(v, s, vo, so, mask),
        bytes_moved=3 * rows * per_row + 3 * rows * H * 4 + (L if masked else 0))


def _merge_states(L, S, H, D, dtype=torch.bfloat16):
    v, s = _v((L, S, H, D), dtype), _s((L, S, H))
    return Case(
        f"merge_states {_dt(dtype)} {L}x{S}x{H}x{D}",
        lambda: flashinfer.merge_states(v, s),
        bytes_moved=(L * S + L) * H * D * v.element_size() + (L * S + L) * H * 4)


def _varlen(counts, H, D, note):
    indptr = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32,
                          device="cuda")
    parts, rows = int(indptr[-1]), len(counts)
    v, s = _v((parts, H, D), torch.float32), _s((parts, H))
    out = torch.empty(rows, H, D, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(rows, H, dtype=torch.float32, device="cuda")
    return Case(
        f"merge_states_varlen f32->bf16 {note}: {rows} rows x {H} heads x {D}, {parts} parts",
        lambda: merge_states_varlen(v, s, indptr, out=out, lse=lse),
        bytes_moved=parts * H * (D + 1) * 4 + rows * H * (D * 2 + 4) + indptr.numel() * 4)


def cases() -> list[Case]:
    return [
        # The target.
        _merge_state(8192, 32, 128, target=TARGET, published_us=69.2),
        # The same after a dirty (zero_) flush: a third of its bytes are writes, and the up to
        # 50 MB of them still in L2 when it ends are charged to it this way (steady state).
        _merge_state(8192, 32, 128, target=TARGET, published_us=69.2, l2_flush="write"),
        _merge_state(8192, 32, 128, dtype=torch.float16),
        _merge_state(4096, 32, 256),
        _merge_state(8192, 8, 64),
        _merge_state(64, 32, 128),  # decode batch: latency-bound
        _merge_state_in_place(8192, 32, 128),
        _merge_state_in_place(8192, 32, 128, masked=True),
        _merge_states(2048, 8, 32, 128),
        _merge_states(1, 132, 32, 128),
        # Split-KV reduction (MergeStatesVarlen).
        _varlen([132], 32, 128, "split-KV decode, batch 1"),
        _varlen([32], 32, 128, "split-KV decode, batch 1, 32 chunks"),
        _varlen([16] * 64, 32, 128, "batch 64 x 16 chunks"),
        _varlen([2] * 8192, 32, 128, "many rows of 2 parts"),
        _varlen([1, 2] * 2048, 32, 128, "rows of 1-2 parts"),
    ]

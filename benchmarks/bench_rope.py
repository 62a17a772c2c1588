"""flashinfer.rope on bandwidth-bound sizes (Llama-3-8B heads: 32 q / 8 kv, head_dim 128).

bytes_moved = q and k read once + written once (in place or not), plus the positions and, for
the cos/sin cache, the cache rows read (one per token). The target of the pos-ids case is
>= 95% of copy bandwidth.
"""

import torch

import flashinfer
from harness import Case


def _qk(nnz, hq, hk, d, dtype=torch.bfloat16):
    q = torch.randn(nnz, hq, d, dtype=dtype, device="cuda")
    k = torch.randn(nnz, hk, d, dtype=dtype, device="cuda")
    return q, k


def _bytes(q, k, extra=0):
    return 2 * (q.numel() + k.numel()) * q.element_size() + extra


def cases() -> list[Case]:
    out: list[Case] = []
    nnz, hq, hk, d = 16384, 32, 8, 128
    q, k = _qk(nnz, hq, hk, d)
    pos = torch.randint(0, 131072, (nnz,), dtype=torch.int32, device="cuda")
    pos_bytes = pos.numel() * pos.element_size()
    out.append(Case(
        f"apply_rope_pos_ids bf16 {nnz}x{hq}/{hk}x{d}",
        lambda: flashinfer.apply_rope_pos_ids(q, k, pos),
        bytes_moved=_bytes(q, k, pos_bytes), target=">= 95% of copy bandwidth"))
    out.append(Case(
        f"apply_rope_pos_ids_inplace bf16 {nnz}x{hq}/{hk}x{d}",
        lambda: flashinfer.apply_rope_pos_ids_inplace(q, k, pos),
        bytes_moved=_bytes(q, k, pos_bytes)))
    out.append(Case(
        f"apply_rope_pos_ids interleave bf16 {nnz}x{hq}/{hk}x{d}",
        lambda: flashinfer.apply_rope_pos_ids(q, k, pos, interleave=True),
        bytes_moved=_bytes(q, k, pos_bytes)))
    out.append(Case(
        f"apply_llama31_rope_pos_ids bf16 {nnz}x{hq}/{hk}x{d}",
        lambda: flashinfer.apply_llama31_rope_pos_ids(q, k, pos),
        bytes_moved=_bytes(q, k, pos_bytes)))

    # Ragged batch of 32 requests of 512 tokens at nonzero offsets.
    batch = 32
    indptr = torch.arange(0, nnz + 1, nnz // batch, dtype=torch.int32, device="cuda")
    offsets = torch.randint(0, 65536, (batch,), dtype=torch.int32, device="cuda")
    out.append(Case(
        f"apply_rope (indptr, {batch} requests) bf16 {nnz}x{hq}/{hk}x{d}",
        lambda: flashinfer.apply_rope(q, k, indptr, offsets),
        bytes_moved=_bytes(q, k, 8 * (batch + 1))))

    # Partial rotary (half the channels rotated, the rest copied).
    out.append(Case(
        f"apply_rope_pos_ids rotary_dim=64 bf16 {nnz}x{hq}/{hk}x{d}",
        lambda: flashinfer.apply_rope_pos_ids(q, k, pos, rotary_dim=64),
        bytes_moved=_bytes(q, k, pos_bytes)))

    # vLLM style: in place on the q and k column slices of a packed QKV tensor, cos/sin cache.
    qkv = torch.randn(nnz, (hq + 2 * hk) * d, dtype=torch.bfloat16, device="cuda")
    query, key = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d]
    max_pos = 131072
    inv = 5e5 ** (-torch.arange(0, d, 2, dtype=torch.float64, device="cuda") / d)
    ang = torch.arange(max_pos, dtype=torch.float64, device="cuda")[:, None] * inv
    cache = torch.cat([ang.cos(), ang.sin()], dim=-1).float()
    pos64 = pos.long()
    out.append(Case(
        f"apply_rope_with_cos_sin_cache_inplace packed-QKV bf16 {nnz}x{hq}/{hk}x{d}",
        lambda: flashinfer.apply_rope_with_cos_sin_cache_inplace(pos64, query, key, d, cache),
        bytes_moved=2 * (query.numel() + key.numel()) * 2 + nnz * (8 + d * 4)))

    # Other head dims, same bytes.
    for d2, h2 in ((64, 64), (256, 16)):
        q2, k2 = _qk(nnz, h2, h2 // 4, d2)
        out.append(Case(
            f"apply_rope_pos_ids bf16 {nnz}x{h2}/{h2 // 4}x{d2}",
            lambda q2=q2, k2=k2: flashinfer.apply_rope_pos_ids(q2, k2, pos),
            bytes_moved=_bytes(q2, k2, pos_bytes)))

    # Head counts that do not fill whole warps of head rows (28/4, Qwen2-7B-like), and few
    # heads (8/1: 14-token tiles), at the same order of bytes.
    for nnz3, hq3, hk3 in ((16384, 28, 4), (65536, 8, 1)):
        q3, k3 = _qk(nnz3, hq3, hk3, d)
        pos3 = torch.randint(0, 131072, (nnz3,), dtype=torch.int32, device="cuda")
        out.append(Case(
            f"apply_rope_pos_ids bf16 {nnz3}x{hq3}/{hk3}x{d}",
            lambda q3=q3, k3=k3, pos3=pos3: flashinfer.apply_rope_pos_ids(q3, k3, pos3),
            bytes_moved=_bytes(q3, k3, pos3.numel() * pos3.element_size())))

    # Scalar fallback (a head stride of d + 1 elements rules out 16-byte accesses).
    qs = torch.randn(nnz, hq, d + 1, dtype=torch.bfloat16, device="cuda")[..., :d]
    ks = torch.randn(nnz, hk, d + 1, dtype=torch.bfloat16, device="cuda")[..., :d]
    out.append(Case(
        f"apply_rope_pos_ids_inplace (scalar path) bf16 {nnz}x{hq}/{hk}x{d}",
        lambda: flashinfer.apply_rope_pos_ids_inplace(qs, ks, pos),
        bytes_moved=_bytes(qs, ks, pos_bytes)))

    # Decode-sized batch: latency bound.
    qd, kd = _qk(64, hq, hk, d)
    posd = pos[:64].contiguous()
    out.append(Case(
        f"apply_rope_pos_ids_inplace bf16 64x{hq}/{hk}x{d} (decode)",
        lambda: flashinfer.apply_rope_pos_ids_inplace(qd, kd, posd),
        bytes_moved=_bytes(qd, kd, 256)))
    return out

"""Float64 reference attention (explicit softmax, no SDPA) and paged-cache builders shared by the
attention tests."""

from __future__ import annotations

import math
from typing import Optional

import torch

LN2 = math.log(2.0)


def rope_ref(x: torch.Tensor, pos: torch.Tensor, rope_scale=1.0, rope_theta=1e4) -> torch.Tensor:
    """Rotate-half RoPE over the whole head: x (n, H, D), pos (n,)."""
    d = x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64, device=x.device)
    freq = rope_theta ** (-2.0 * i / d) / rope_scale
    ang = pos.double()[:, None, None] * freq[None, None, :]
    c, s = ang.cos(), ang.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def attention_ref(q, k, v, *, causal=False, mask: Optional[torch.Tensor] = None, window_left=-1,
                  sm_scale=None, soft_cap=None, pos_encoding="NONE", rope_scale=1.0,
                  rope_theta=1e4, v_scale=1.0):
    """q (qo, Hq, D), k/v (kv, Hkv, D) NHD -> (o (qo, Hq, D) float64, lse (qo, Hq) base 2)."""
    qo, hq, d = q.shape
    kv, hkv = k.shape[:2]
    g = hq // hkv
    q, k, v = q.double(), k.double(), v.double()
    qpos = torch.arange(qo, device=q.device) + (kv - qo)
    kpos = torch.arange(kv, device=q.device)
    if pos_encoding == "ROPE_LLAMA":
        q = rope_ref(q, qpos, rope_scale, rope_theta)
        k = rope_ref(k, kpos, rope_scale, rope_theta)
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    logits = torch.einsum("qhd,khd->hqk", q, k) * scale
    if soft_cap:
        logits = soft_cap * torch.tanh(logits / soft_cap)
    if pos_encoding == "ALIBI":
        from flashinfer.utils import get_alibi_slopes

        slopes = get_alibi_slopes(hq).double().to(q.device)
        logits = logits + slopes[:, None, None] * (kpos[None, None, :] - qpos[None, :, None])
    allowed = torch.ones(qo, kv, dtype=torch.bool, device=q.device)
    if mask is not None:
        allowed = mask.to(q.device).bool()
    else:
        if causal:
            allowed &= kpos[None, :] <= qpos[:, None]
    if window_left >= 0:
        allowed &= kpos[None, :] >= qpos[:, None] - window_left
    logits = logits.masked_fill(~allowed[None], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # -inf for empty rows
    p = torch.exp(logits - lse[..., None]).nan_to_num(0.0)
    o = torch.einsum("hqk,khd->qhd", p, v) * v_scale
    return o, (lse / LN2).transpose(0, 1)


def make_paged(kv_lens, page_size, hkv, d, dtype, device, layout="NHD", tuple_form=False,
               gen=None):
    """A random paged cache holding len(kv_lens) sequences with pages in shuffled order.

    Returns (cache, indptr, indices, last_page_len, [(k_i, v_i) NHD per request])."""
    pages = [max(0, math.ceil(n / page_size)) for n in kv_lens]
    total = sum(pages) + 3
    perm = torch.randperm(total, generator=gen)[: sum(pages)]
    shape = (total, page_size, hkv, d) if layout == "NHD" else (total, hkv, page_size, d)
    k_cache = torch.randn(shape, generator=gen).to(dtype).to(device)
    v_cache = torch.randn(shape, generator=gen).to(dtype).to(device)
    indptr = [0]
    for p in pages:
        indptr.append(indptr[-1] + p)
    last = [(n - (p - 1) * page_size) if p else 0 for n, p in zip(kv_lens, pages)]
    seqs = []
    for b, n in enumerate(kv_lens):
        ids = perm[indptr[b]: indptr[b + 1]].to(device)
        kk, vv = k_cache[ids], v_cache[ids]
        if layout == "HND":
            kk, vv = kk.transpose(1, 2), vv.transpose(1, 2)
        seqs.append((kk.reshape(-1, hkv, d)[:n], vv.reshape(-1, hkv, d)[:n]))
    if tuple_form:
        # V with other strides than K: a slice of a wider tensor.
        wide = torch.zeros(shape[:-1] + (d * 2,), dtype=dtype, device=device)
        wide[..., :d] = v_cache
        cache = (k_cache, wide[..., :d])
    else:
        cache = torch.stack([k_cache, v_cache], dim=1)
    i32 = dict(dtype=torch.int32, device=device)
    return (cache, torch.tensor(indptr, **i32), perm.to(**i32),
            torch.tensor(last, **i32), seqs)

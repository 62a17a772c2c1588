"""float64 reference of the attention-state merges (base-2 LSEs) and the inputs that exercise
them: shared by tests/test_cascade.py and benchmarks/tuning/tune_cascade.py."""

from __future__ import annotations

import math

import torch


def ref_merge(v: torch.Tensor, s: torch.Tensor, dim: int):
    """Merge the states along `dim` of v (.., D) and s (..): float64 (v, s); empty states
    (s = -inf) contribute nothing, whatever their v holds."""
    v, s = v.double(), s.double()
    if s.shape[dim] == 0:  # nothing to merge: v = 0, s = -inf
        return v.sum(dim=dim), torch.full_like(s.sum(dim=dim), -math.inf)
    m = s.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp2(s - m)  # 0 for s = -inf
    d = w.sum(dim=dim)
    wv = torch.where(w[..., None] > 0, w[..., None] * v, torch.zeros_like(v))
    out = wv.sum(dim=dim) / torch.where(d > 0, d, torch.ones_like(d))[..., None]
    lse = torch.where(d > 0, m.squeeze(dim) + torch.log2(d), torch.full_like(d, -math.inf))
    return out, lse


def rand_lse(shape, empty_frac=0.0, scale=4.0, offset=0.0, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    s = torch.randn(shape, device=device, generator=g) * scale + offset
    if empty_frac > 0:
        s[torch.rand(shape, device=device, generator=g) < empty_frac] = -math.inf
    return s


def poison_empty(v: torch.Tensor, s: torch.Tensor) -> None:
    """Put inf/NaN in the v of empty states: they must be ignored."""
    bad = torch.isneginf(s)[..., None].expand_as(v)
    junk = torch.full_like(v, math.inf)
    junk[..., ::2] = math.nan
    v[bad] = junk[bad]

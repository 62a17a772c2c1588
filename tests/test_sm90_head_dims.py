"""The Hopper kernel (``backend="fa3"``, CTA shape 3) at head_dim 256 and at head_dim_qk 192 /
head_dim_vo 128 (MLA prefill) against the float64 reference: ragged and paged, fp16 and bf16,
causal or not, GQA 1/4/8, awkward lengths (one token, empty requests, q shorter and longer than
kv, lengths off the 64- and 96-key tiles), split KV, soft cap, window, sinks, custom mask,
ALiBi, lse; K/V tiles that read past the requests. Every GPU test asserts that the plan chose
the Hopper kernel. CPU: which variants have it."""

from __future__ import annotations

import pytest
import torch
from attention_ref import attention_ref
from test_attention_head_dims import _paged  # (k, v) caches of two head dims
from test_attention_spec_sinks import sink_ref  # attention_ref with sinks folded in

import flashinfer
import flashinfer.attention.runtime as rt
from flashinfer.jit.attention import AttentionVariant

TOL = {torch.float16: dict(atol=4e-3, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
# (head_dim_qk, head_dim_vo): Gemma-style 256 and DeepSeek-style MLA prefill.
HEADS = [(256, 256), (192, 128)]

needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a compute capability 9.0 GPU (the Hopper kernel)")


def _hopper(fn):
    return pytest.mark.gpu(needs_sm90(fn))


def _ws(mb=256):
    return torch.empty(mb << 20, dtype=torch.uint8, device="cuda")


def _cum(xs):
    return torch.tensor([0] + torch.tensor(xs).cumsum(0).tolist(), dtype=torch.int32)


def _randn(gen, dtype, *shape):
    return torch.randn(*shape, generator=gen).to(dtype).cuda()


def _check(o, lse, q, seqs, qi, dtype, sinks=None, **kw):
    """Each request (rows qi[b]:qi[b+1] over its (k, v)) against the reference, lse too."""
    for b, (k, v) in enumerate(seqs):
        s, e = int(qi[b]), int(qi[b + 1])
        if s == e:
            continue
        ro, rl = sink_ref(q[s:e], k, v, sinks, **kw)
        torch.testing.assert_close(o[s:e].double(), ro, **TOL[dtype])
        if lse is not None:
            finite = torch.isfinite(rl)
            assert torch.equal(torch.isfinite(lse[s:e]), finite), "lse -inf rows differ"
            torch.testing.assert_close(lse[s:e][finite].double(), rl[finite], atol=2e-3,
                                       rtol=1e-3)


def _ragged(qo_lens, kv_lens, hq, hkv, dqk, dvo, dtype, gen, pad=0):
    """q, k, v (NHD; k and v with ``pad`` NaN / inf rows past the last request), the indptrs
    and each request's (k, v)."""
    q = _randn(gen, dtype, sum(qo_lens), hq, dqk)
    k = _randn(gen, dtype, sum(kv_lens) + pad, hkv, dqk)
    v = _randn(gen, dtype, sum(kv_lens) + pad, hkv, dvo)
    if pad:
        k[sum(kv_lens):], v[sum(kv_lens):] = float("nan"), float("nan")
        k[sum(kv_lens)::3], v[sum(kv_lens)::3] = float("inf"), -float("inf")
    qi, ki = _cum(qo_lens), _cum(kv_lens)
    seqs = [(k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]]) for b in range(len(kv_lens))]
    return q, k, v, qi, ki, seqs


def _run_ragged(q, k, v, qi, ki, hq, hkv, dqk, dvo, dtype, layout="NHD", run_kw=None, **plan_kw):
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws(), layout, backend="fa3")
    w.plan(qi.cuda(), ki.cuda(), hq, hkv, dqk, dvo, q_data_type=dtype, **plan_kw)
    assert w._plan.cta == 3, w._plan
    out = torch.full((q.shape[0], hq, dvo), float("nan"), dtype=dtype, device="cuda")
    o, lse = w.run(q, k, v, out=out, return_lse=True, **(run_kw or {}))
    assert o is out
    return o, lse


# Lengths: one token, an empty request, q shorter than kv, q longer than kv (causal rows that
# see no key), lengths on and off the 64- and 96-key tiles, one request of several tiles.
QO_LENS, KV_LENS = [1, 77, 0, 260, 9, 130, 300], [1, 77, 5, 300, 40, 50, 1111]


@_hopper
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_ragged(heads, dtype, causal, group):
    gen = torch.Generator().manual_seed(heads[0] + 2 * group + causal)
    dqk, dvo = heads
    hkv = 2
    hq = hkv * group
    q, k, v, qi, ki, seqs = _ragged(QO_LENS, KV_LENS, hq, hkv, dqk, dvo, dtype, gen)
    o, lse = _run_ragged(q, k, v, qi, ki, hq, hkv, dqk, dvo, dtype, causal=causal)
    _check(o, lse, q, seqs, qi, dtype, causal=causal)


# The 128-key tiles' halves (where an item's keys end against each consumer warpgroup's 64
# rows: the half-tile paths tried in benchmarks/notes/sm90-dynamic-claims.md, eighth session).
# Causal at group 1: the first warpgroup's last tile on the diagonal (qo = kv on and off 128),
# prefixes that shift the diagonal by 64 and by other amounts, a request whose second
# warpgroup has no row (qo 64, 40); group 2 (64 rows are 32 positions); non-causal: keys
# ending in the lower half of the last tile (130, 190, 64). K/V past the last request: NaN.
HALF_QO = [256, 384, 200, 100, 64, 40, 129, 1, 130]
HALF_KV = [256, 384, 264, 164, 64, 40, 190, 64, 130]


@_hopper
@pytest.mark.parametrize("heads", [(64, 64), (128, 128), (192, 128)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 2])
def test_tile_halves(heads, causal, group):
    gen = torch.Generator().manual_seed(heads[0] + 3 * group + causal)
    dqk, dvo = heads
    q, k, v, qi, ki, seqs = _ragged(HALF_QO, HALF_KV, 2 * group, 2, dqk, dvo,
                                    torch.bfloat16, gen, pad=70)
    o, lse = _run_ragged(q, k, v, qi, ki, 2 * group, 2, dqk, dvo, torch.bfloat16, causal=causal)
    _check(o, lse, q, seqs, qi, torch.bfloat16, causal=causal)


@_hopper
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("causal", [False, True])
def test_batch_of_one(heads, causal):
    """Batch 1: a single request of many query tiles (the persistent grid takes it
    item-major)."""
    gen = torch.Generator().manual_seed(7 + causal)
    dqk, dvo = heads
    q, k, v, qi, ki, seqs = _ragged([1000], [1333], 16, 8, dqk, dvo, torch.bfloat16, gen)
    o, lse = _run_ragged(q, k, v, qi, ki, 16, 8, dqk, dvo, torch.bfloat16, causal=causal)
    _check(o, lse, q, seqs, qi, torch.bfloat16, causal=causal)


@_hopper
@pytest.mark.parametrize("qo_lens", [[1000], QO_LENS * 3], ids=["one request", "21 requests"])
def test_claims_are_reset_for_every_run_and_graph_replay(qo_lens):
    """The persistent CTAs claim their (item, KV head) units through two counters in the plan
    header (more units than CTAs here), which the last CTA resets: every eager run and every
    replay of a captured run starts from 0, takes every unit once (the same output, bit for
    bit, matching the reference) and leaves 0 behind."""
    gen = torch.Generator().manual_seed(len(qo_lens))
    dqk, dvo, hq, hkv, dtype = 192, 128, 32, 4, torch.bfloat16
    q, k, v, qi, ki, seqs = _ragged(qo_lens, qo_lens, hq, hkv, dqk, dvo, dtype, gen)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws(), backend="fa3")
    w.plan(qi.cuda(), ki.cuda(), hq, hkv, dqk, dvo, causal=True, q_data_type=dtype)
    assert w._plan.cta == 3 and w._plan.num_items * hkv > w._plan.grid_x, w._plan
    assert w._plan_dev[2:4].tolist() == [0, 0]
    out = torch.empty(q.shape[0], hq, dvo, dtype=dtype, device="cuda")
    first = None
    for _ in range(3):
        out.fill_(float("nan"))
        w.run(q, k, v, out=out)
        assert w._plan_dev[2:4].tolist() == [0, 0]
        if first is None:
            first = out.clone()
            _check(out, None, q, seqs, qi, dtype, causal=True)
        assert torch.equal(out, first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, k, v, out=out)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert w._plan_dev[2:4].tolist() == [0, 0]
        assert torch.equal(out, first)


OPTIONS = {
    "soft cap": dict(plan=dict(logits_soft_cap=20.0), ref=dict(soft_cap=20.0)),
    "window": dict(plan=dict(window_left=90), ref=dict(window_left=90)),
    "sinks": dict(sinks=True),
    "sinks, soft cap, window, HND, scale": dict(
        sinks=True, layout="HND", plan=dict(logits_soft_cap=30.0, window_left=33, sm_scale=0.05),
        ref=dict(soft_cap=30.0, window_left=33, sm_scale=0.05)),
}


@_hopper
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("option", OPTIONS)
def test_ragged_options(heads, option):
    gen = torch.Generator().manual_seed(len(option) + heads[0])
    dqk, dvo = heads
    opt = OPTIONS[option]
    hq, hkv, dtype = 8, 2, torch.bfloat16
    q, k, v, qi, ki, seqs = _ragged(QO_LENS, KV_LENS, hq, hkv, dqk, dvo, dtype, gen)
    sinks = (torch.rand(hq, generator=gen) * 6 - 3).cuda() if opt.get("sinks") else None
    layout = opt.get("layout", "NHD")
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(),
                                             v.transpose(0, 1).contiguous())
    o, lse = _run_ragged(q, kk, vv, qi, ki, hq, hkv, dqk, dvo, dtype, layout,
                         run_kw=dict(sinks=sinks) if sinks is not None else None, causal=True,
                         **opt.get("plan", {}))
    _check(o, lse, q, seqs, qi, dtype, sinks, causal=True, **opt.get("ref", {}))


@_hopper
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_ragged_kv_tiles_past_the_requests(heads, causal, layout):
    """Ragged K/V come through TMA tensor maps over the whole buffer: a last tile reads past its
    request into the next one's keys, or past the last request into rows never filled (NaN and
    inf here), which must not reach the output; the output is poisoned first."""
    gen = torch.Generator().manual_seed(heads[0] + 2 * causal + (layout == "HND"))
    dqk, dvo = heads
    hq, hkv, dtype = 8, 2, torch.bfloat16
    q, k, v, qi, ki, seqs = _ragged([200, 1, 130, 77], [300, 129, 130, 1000], hq, hkv, dqk, dvo,
                                    dtype, gen, pad=300)
    if layout == "HND":
        k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    o, lse = _run_ragged(q, k, v, qi, ki, hq, hkv, dqk, dvo, dtype, layout, causal=causal)
    assert torch.isfinite(o).all()
    _check(o, lse, q, seqs, qi, dtype, causal=causal)


@_hopper
@pytest.mark.parametrize("heads", HEADS)
def test_split_kv(heads):
    """A fixed split: each item writes a partial state of head_dim_vo columns, merged after."""
    gen = torch.Generator().manual_seed(heads[0] + 1)
    dqk, dvo = heads
    q, k, v, qi, ki, seqs = _ragged([700, 129, 1, 300], [2000, 129, 3000, 300], 16, 4, dqk, dvo,
                                    torch.bfloat16, gen)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws(), backend="fa3")
    w.plan(qi.cuda(), ki.cuda(), 16, 4, dqk, dvo, causal=True, q_data_type=torch.bfloat16,
           fixed_split_size=512)
    assert w._plan.cta == 3 and w._plan.split_kv
    o, lse = w.run(q, k, v, return_lse=True)
    _check(o, lse, q, seqs, qi, torch.bfloat16, causal=True)


def _run_paged(qo_lens, kv_lens, page, hq, hkv, heads, dtype, gen, run_kw=None, **plan_kw):
    """A paged prefill on the Hopper kernel over a (k, v) cache with pages in shuffled order
    and partial last pages: (o, lse, q, [(k_b, v_b)], qo_indptr)."""
    dqk, dvo = heads
    cache, indptr, indices, last, seqs = _paged(kv_lens, page, hkv, dqk, dvo, dtype, gen)
    qi = _cum(qo_lens)
    q = _randn(gen, dtype, sum(qo_lens), hq, dqk)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), "NHD", backend="fa3")
    w.plan(qi, indptr, indices, last, hq, hkv, dqk, page, head_dim_vo=dvo, q_data_type=dtype,
           **plan_kw)
    assert w._plan.cta == 3
    o, lse = w.run(q, cache, return_lse=True, **(run_kw or {}))
    assert o.shape == (sum(qo_lens), hq, dvo)
    return o, lse, q, seqs, qi


@_hopper
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("page", [1, 3, 16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged(heads, page, causal, dtype):
    """The cp.async producer gathers K (head_dim_qk wide) and V (head_dim_vo wide) rows page by
    page: page sizes that do not divide its 16- or 24-key warp slices, partial last pages, an
    empty request, several items per CTA."""
    gen = torch.Generator().manual_seed(heads[0] * 10 + page + 2 * causal)
    qo_lens, kv_lens = [300, 129, 0, 1, 650, 40], [1000, 129, 7, 1, 700, 33]
    o, lse, q, seqs, qi = _run_paged(qo_lens, kv_lens, page, 16, 4, heads, dtype, gen,
                                     causal=causal)
    _check(o, lse, q, seqs, qi, dtype, causal=causal)


@_hopper
@pytest.mark.parametrize("heads", HEADS)
def test_paged_sinks_window_soft_cap(heads):
    gen = torch.Generator().manual_seed(heads[0] + 5)
    hq, dtype = 8, torch.bfloat16
    sinks = (torch.rand(hq, generator=gen) * 6 - 3).cuda()
    o, lse, q, seqs, qi = _run_paged([200, 65, 1], [500, 65, 300], 16, hq, 1, heads, dtype, gen,
                                     run_kw=dict(sinks=sinks), causal=True, window_left=100,
                                     logits_soft_cap=25.0)
    _check(o, lse, q, seqs, qi, dtype, sinks, causal=True, window_left=100, soft_cap=25.0)


@_hopper
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("causal", [False, True])
def test_single_prefill(heads, causal):
    gen = torch.Generator().manual_seed(heads[0] + causal)
    dqk, dvo = heads
    dtype = torch.bfloat16
    q, k = _randn(gen, dtype, 333, 16, dqk), _randn(gen, dtype, 517, 4, dqk)
    v = _randn(gen, dtype, 517, 4, dvo)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, backend="fa3",
                                                     return_lse=True)
    _check(o, lse, q, [(k, v)], [0, 333], dtype, causal=causal)


@_hopper
def test_head_dim_256_custom_mask_and_alibi():
    """The options the Hopper kernel takes at head_dim 128 hold at 256: a custom mask and
    ALiBi (single prefill, which plans the Hopper kernel for > 64 packed rows)."""
    gen = torch.Generator().manual_seed(256)
    dtype = torch.float16
    q, k, v = (_randn(gen, dtype, n, h, 256) for n, h in ((200, 8), (301, 2), (301, 2)))
    mask = torch.rand(200, 301, generator=gen) > 0.3
    mask[:, 0] = True
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask.cuda(), backend="fa3")
    torch.testing.assert_close(o.double(), attention_ref(q, k, v, mask=mask)[0], **TOL[dtype])
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, pos_encoding_mode="ALIBI",
                                                backend="fa3")
    ref = attention_ref(q, k, v, causal=True, pos_encoding="ALIBI")[0]
    torch.testing.assert_close(o.double(), ref, **TOL[dtype])


# ---- CPU ------------------------------------------------------------------------------------

def test_which_variants_have_the_hopper_kernel():
    """has_sm90 (the Python side of launch.cuh's kHasSm90; tests/test_package_layout.py and
    tests/test_attention_head_dims.py compare the two on compiled modules)."""
    def has(qk, vo=None, **kw):
        return AttentionVariant("bfloat16", "bfloat16", qk, head_dim_vo=vo, **kw).has_sm90

    assert has(64) and has(128) and has(256) and has(192, 128)
    assert has(256, mask_mode="custom") and has(256, pos_encoding="ALIBI")
    assert has(192, 128, paged=False, mask_mode="causal")
    assert not has(512)  # O would be 256 registers per thread (prefill_sm90.cuh)
    assert not has(256, pos_encoding="ROPE_LLAMA")
    assert not has(256, dtype_kv="float8_e4m3fn")


def test_fa3_refuses_head_dim_512_naming_what_it_takes(monkeypatch):
    monkeypatch.setattr(rt, "_capability", lambda index: (9, 0))
    v = AttentionVariant("bfloat16", "bfloat16", 512)
    with pytest.raises(ValueError, match=r"head_dim 64, 128 or 256 .*192 / 128.*head_dim 512"):
        rt.resolve_backend(torch.device("cuda", 0), v, "fa3")
    for qk, vo in HEADS:
        w = AttentionVariant("bfloat16", "bfloat16", qk, head_dim_vo=vo)
        assert rt.resolve_backend(torch.device("cuda", 0), w, "auto") == "fa3"

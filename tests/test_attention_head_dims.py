"""head_dim 512 (decode and prefill) and head_dim_vo != head_dim_qk (192 / 128, MLA prefill):
GPU tests against the float64 reference (tests/attention_ref.py), CPU tests of what is refused."""

from __future__ import annotations

import math

import pytest
import torch
from attention_ref import attention_ref

import flashinfer
import flashinfer.attention.runtime as rt
from flashinfer.attention.plan import cta_occupancy, schedule, tile_rows
from flashinfer.jit.attention import AttentionVariant
from flashinfer.testing import cuda_graph_of

TOL = {torch.float16: dict(atol=4e-3, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _ws(device="cuda", mb=256):
    return torch.empty(mb << 20, dtype=torch.uint8, device=device)


def _close(o, ref, dtype):
    torch.testing.assert_close(o.double(), ref, **TOL[dtype])


def _lse_close(lse, ref):
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite].double(), ref[finite], atol=2e-3, rtol=1e-3)


def _cum(xs):
    return torch.tensor([0] + torch.tensor(xs).cumsum(0).tolist(), dtype=torch.int32)


def _randn(gen, dtype, *shape):
    return torch.randn(*shape, generator=gen).to(dtype).cuda()


def _check_requests(o, lse, q, seqs, qi, dtype, causal):
    """Each request (its q rows qi[b]:qi[b+1] over its (k, v)) against the reference."""
    for b, (k, v) in enumerate(seqs):
        if qi[b + 1] == qi[b]:
            continue
        ro, rl = attention_ref(q[qi[b]:qi[b + 1]], k, v, causal=causal)
        _close(o[qi[b]:qi[b + 1]], ro, dtype)
        if lse is not None:
            _lse_close(lse[qi[b]:qi[b + 1]], rl)


def _paged(kv_lens, page, hkv, dqk, dvo, dtype, gen):
    """A (k, v) paged cache (NHD; K and V of their own head dims) with pages in shuffled order:
    (cache, indptr, indices, last_page_len, [(k_b, v_b)])."""
    pages = [-(-n // page) for n in kv_lens]
    total = sum(pages) + 2
    perm = torch.randperm(total, generator=gen)[:sum(pages)]
    k_cache = _randn(gen, dtype, total, page, hkv, dqk)
    v_cache = _randn(gen, dtype, total, page, hkv, dvo)
    indptr = _cum(pages)
    seqs = []
    for b, n in enumerate(kv_lens):
        ids = perm[indptr[b]:indptr[b + 1]].cuda()
        seqs.append((k_cache[ids].reshape(-1, hkv, dqk)[:n], v_cache[ids].reshape(-1, hkv, dvo)[:n]))
    last = torch.tensor([n - (p - 1) * page if p else 0 for n, p in zip(kv_lens, pages)],
                        dtype=torch.int32)
    return (k_cache, v_cache), indptr, perm.to(torch.int32), last, seqs


# ---- head_dim 512 -------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kv_len", [1, 77, 5000])
def test_single_decode_head_dim_512(dtype, kv_len):
    gen = torch.Generator().manual_seed(kv_len)
    hq, hkv, d = 8, 2, 512
    q = _randn(gen, dtype, hq, d)
    k, v = _randn(gen, dtype, kv_len, hkv, d), _randn(gen, dtype, kv_len, hkv, d)
    o, lse = flashinfer.single_decode_with_kv_cache(q, k, v, return_lse=True)
    ro, rl = attention_ref(q[None], k, v)
    _close(o, ro[0], dtype)
    _lse_close(lse, rl[0])


@pytest.mark.gpu
@pytest.mark.parametrize("fixed_split_size", [None, 64])
def test_batch_decode_head_dim_512(fixed_split_size):
    """GQA 4, odd lengths, an empty request, page 16, pages shuffled; split KV forced too (each
    chunk's CTA writes a partial state of all 512 columns, 256 from each of its two groups of
    warps)."""
    gen = torch.Generator().manual_seed(512)
    dtype, hq, hkv, d, page = torch.bfloat16, 16, 4, 512, 16
    kv_lens = [1, 0, 300, 4097, 33]
    cache, indptr, indices, last, seqs = _paged(kv_lens, page, hkv, d, d, dtype, gen)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype,
           fixed_split_size=fixed_split_size)
    if fixed_split_size is not None:
        assert w._plan.split_kv
    q = _randn(gen, dtype, len(kv_lens), hq, d)
    o, lse = w.run(q, cache, return_lse=True)
    assert o.shape == (len(kv_lens), hq, d)
    _check_requests(o, lse, q, seqs, list(range(len(kv_lens) + 1)), dtype, False)


@pytest.mark.gpu
def test_cuda_graph_decode_head_dim_512_replan():
    gen = torch.Generator().manual_seed(7)
    dtype, hq, hkv, d, page, batch = torch.bfloat16, 8, 2, 512, 16, 3
    second, first = [2500, 1, 40], [10, 1, 30]
    cache, indptr2, indices2, last2, seqs2 = _paged(second, page, hkv, d, d, dtype, gen)
    bufs = [torch.empty(n, dtype=torch.int32, device="cuda") for n in (batch + 1, 400, batch)]
    w = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(_ws(), *bufs, "NHD", True)
    pages = [-(-n // page) for n in first]
    indices = torch.cat([indices2[indptr2[b]:indptr2[b] + pages[b]] for b in range(batch)])
    last = torch.tensor([n - (p - 1) * page for n, p in zip(first, pages)], dtype=torch.int32)
    q = _randn(gen, dtype, batch, hq, d)
    out = torch.empty_like(q)
    w.plan(_cum(pages), indices, last, hq, hkv, d, page, q_data_type=dtype)
    graph = cuda_graph_of(lambda: w.run(q, cache, out=out))
    graph.replay()
    _check_requests(out, None, q, [(k[:n], v[:n]) for (k, v), n in zip(seqs2, first)],
                    list(range(batch + 1)), dtype, False)
    w.plan(indptr2, indices2, last2, hq, hkv, d, page, q_data_type=dtype)
    graph.replay()
    _check_requests(out, None, q, seqs2, list(range(batch + 1)), dtype, False)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_single_prefill_head_dim_512(causal):
    gen = torch.Generator().manual_seed(int(causal))
    dtype, hq, hkv, d = torch.float16, 8, 2, 512
    q = _randn(gen, dtype, 37, hq, d)
    k, v = _randn(gen, dtype, 129, hkv, d), _randn(gen, dtype, 129, hkv, d)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True)
    ro, rl = attention_ref(q, k, v, causal=causal)
    _close(o, ro, dtype)
    _lse_close(lse, rl)


@pytest.mark.gpu
def test_single_prefill_head_dim_512_rope():
    """In-kernel RoPE at 512: the rotated channel pairs (i, i + 256) lie in the two column
    groups' Q and K tiles, which the kernel rotates across both groups."""
    gen = torch.Generator().manual_seed(21)
    dtype, hq, hkv, d = torch.float16, 8, 2, 512
    q = _randn(gen, dtype, 37, hq, d)
    k, v = _randn(gen, dtype, 129, hkv, d), _randn(gen, dtype, 129, hkv, d)
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True,
                                                pos_encoding_mode="ROPE_LLAMA")
    _close(o, attention_ref(q, k, v, causal=True, pos_encoding="ROPE_LLAMA")[0], dtype)


@pytest.mark.gpu
def test_batch_decode_head_dim_512_rope():
    """RoPE on the decode shape (two key streams, each a warp of both column groups)."""
    gen = torch.Generator().manual_seed(22)
    dtype, hq, hkv, d, page = torch.float16, 8, 2, 512, 16
    kv_lens = [70, 1, 300]
    cache, indptr, indices, last, seqs = _paged(kv_lens, page, hkv, d, d, dtype, gen)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype,
           pos_encoding_mode="ROPE_LLAMA")
    q = _randn(gen, dtype, len(kv_lens), hq, d)
    o = w.run(q, cache)
    for b, (k, v) in enumerate(seqs):
        _close(o[b:b + 1], attention_ref(q[b:b + 1], k, v, pos_encoding="ROPE_LLAMA")[0], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_prefill_head_dim_512(causal):
    gen = torch.Generator().manual_seed(11)
    dtype, hq, hkv, d = torch.bfloat16, 8, 2, 512
    qo_lens, kv_lens = [1, 100, 0, 131, 17], [1, 100, 7, 300, 10]
    q = _randn(gen, dtype, sum(qo_lens), hq, d)
    k, v = _randn(gen, dtype, sum(kv_lens), hkv, d), _randn(gen, dtype, sum(kv_lens), hkv, d)
    qi, ki = _cum(qo_lens), _cum(kv_lens)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws())
    w.plan(qi, ki, hq, hkv, d, causal=causal, q_data_type=dtype)
    o, lse = w.run(q, k, v, return_lse=True)
    seqs = [(k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]]) for b in range(len(kv_lens))]
    _check_requests(o, lse, q, seqs, qi, dtype, causal)


@pytest.mark.gpu
def test_paged_prefill_head_dim_512():
    gen = torch.Generator().manual_seed(13)
    dtype, hq, hkv, d, page = torch.bfloat16, 8, 1, 512, 16
    qo_lens, kv_lens = [5, 0, 64, 1], [40, 3, 64, 1]
    cache, indptr, indices, last, seqs = _paged(kv_lens, page, hkv, d, d, dtype, gen)
    qi = _cum(qo_lens)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws())
    w.plan(qi, indptr, indices, last, hq, hkv, d, page, causal=True, q_data_type=dtype)
    q = _randn(gen, dtype, sum(qo_lens), hq, d)
    o = w.run(q, cache)
    _check_requests(o, None, q, seqs, qi, dtype, True)


# ---- head_dim_qk 192, head_dim_vo 128 ---------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(16, 16), (16, 4)])
def test_ragged_prefill_192_128(dtype, causal, heads):
    """MLA prefill as vLLM and SGLang run it (MHA, 192-wide q/k, 128-wide v): odd lengths, an
    empty request, a request of one token; GQA too. The output has head_dim_vo columns."""
    gen = torch.Generator().manual_seed(192)
    hq, hkv = heads
    qo_lens, kv_lens = [1, 77, 0, 260, 9], [1, 77, 5, 300, 40]
    q = _randn(gen, dtype, sum(qo_lens), hq, 192)
    k = _randn(gen, dtype, sum(kv_lens), hkv, 192)
    v = _randn(gen, dtype, sum(kv_lens), hkv, 128)
    qi, ki = _cum(qo_lens), _cum(kv_lens)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws())
    w.plan(qi.cuda(), ki.cuda(), hq, hkv, head_dim_qk=192, head_dim_vo=128, causal=causal,
           q_data_type=dtype, sm_scale=1.0 / math.sqrt(192))
    out = torch.full((sum(qo_lens), hq, 128), float("nan"), dtype=dtype, device="cuda")
    lse = torch.empty(sum(qo_lens), hq, dtype=torch.float32, device="cuda")
    o, lse_out = w.run(q, k, v, out=out, lse=lse, return_lse=True)
    assert o is out and lse_out is lse
    seqs = [(k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]]) for b in range(len(kv_lens))]
    _check_requests(o, lse, q, seqs, qi, dtype, causal)


@pytest.mark.gpu
def test_ragged_prefill_192_128_split_kv():
    """Chunks of the keys written as partial states of 128 columns and merged."""
    gen = torch.Generator().manual_seed(3)
    dtype, hq, hkv = torch.bfloat16, 4, 4
    qo_lens, kv_lens = [3, 1], [700, 1025]
    q = _randn(gen, dtype, sum(qo_lens), hq, 192)
    k = _randn(gen, dtype, sum(kv_lens), hkv, 192)
    v = _randn(gen, dtype, sum(kv_lens), hkv, 128)
    qi, ki = _cum(qo_lens), _cum(kv_lens)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws())
    w.plan(qi, ki, hq, hkv, 192, 128, causal=True, q_data_type=dtype, fixed_split_size=256)
    assert w._plan.split_kv
    o, lse = w.run_return_lse(q, k, v)
    seqs = [(k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]]) for b in range(len(kv_lens))]
    _check_requests(o, lse, q, seqs, qi, dtype, True)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_paged_prefill_192_128(causal):
    gen = torch.Generator().manual_seed(21)
    dtype, hq, hkv, page = torch.bfloat16, 8, 2, 16
    qo_lens, kv_lens = [7, 0, 50, 1], [33, 2, 50, 17]
    cache, indptr, indices, last, seqs = _paged(kv_lens, page, hkv, 192, 128, dtype, gen)
    qi = _cum(qo_lens)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws())
    w.plan(qi, indptr, indices, last, hq, hkv, 192, page, head_dim_vo=128, causal=causal,
           q_data_type=dtype)
    q = _randn(gen, dtype, sum(qo_lens), hq, 192)
    o, lse = w.run(q, cache, return_lse=True)
    assert o.shape == (sum(qo_lens), hq, 128)
    _check_requests(o, lse, q, seqs, qi, dtype, causal)


@pytest.mark.gpu
def test_single_prefill_192_128():
    gen = torch.Generator().manual_seed(5)
    dtype = torch.bfloat16
    q, k = _randn(gen, dtype, 45, 8, 192), _randn(gen, dtype, 61, 8, 192)
    v = _randn(gen, dtype, 61, 8, 128)
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    _close(o, attention_ref(q, k, v, causal=True)[0], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("qk,vo", [(512, 512), (192, 128)])
def test_cta_shapes_of_the_wide_heads_match_the_plan(qk, vo):
    """plan.py's tile of each CTA shape is what launch.cuh compiled; the eight-stream decode
    shape (5) exists at neither head dim, the Hopper kernel (3) at 192 / 128 but not 512."""
    variant = AttentionVariant("bfloat16", "bfloat16", qk, "causal", "NONE", False,
                               head_dim_vo=vo)
    module = rt.get_attention_module(variant)
    for cta in range(6):
        absent = cta == 5 or (cta == 3 and not variant.has_sm90)
        assert module.cta_tile_q(cta) == (0 if absent else tile_rows(cta, qk)), cta
    assert variant.has_sm90 == (qk == 192)


# ---- CPU: what is refused, and the variants --------------------------------------------------

HQ, HKV = 8, 2


@pytest.fixture
def no_compile(monkeypatch):
    def refuse(variant):
        raise AssertionError("validation must fail before the module is fetched")

    monkeypatch.setattr(rt, "get_attention_module", refuse)
    monkeypatch.setattr("flashinfer.attention.wrapper.device_num_sms", lambda device: 132)


def _ragged(head_dim_qk, head_dim_vo=None, **kw):
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws("cpu", 1))
    w.plan(torch.tensor([0, 3, 4], dtype=torch.int32), torch.tensor([0, 20, 40], dtype=torch.int32),
           HQ, HKV, head_dim_qk, head_dim_vo, q_data_type=torch.float16, **kw)
    return w


def _paged_prefill(head_dim_qk, head_dim_vo=None):
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws("cpu", 1))
    w.plan(torch.tensor([0, 3, 4], dtype=torch.int32), torch.tensor([0, 2, 3], dtype=torch.int32),
           torch.tensor([4, 0, 2], dtype=torch.int32), torch.tensor([5, 16], dtype=torch.int32),
           HQ, HKV, head_dim_qk, 16, head_dim_vo=head_dim_vo, q_data_type=torch.float16)
    return w


def _decode(head_dim):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws("cpu", 1))
    w.plan(torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([4, 0, 2], dtype=torch.int32),
           torch.tensor([5, 16], dtype=torch.int32), HQ, HKV, head_dim, 16,
           q_data_type=torch.float16)
    return w


UNSUPPORTED_HEAD_DIM = r"head_dim must be one of \(64, 128, 256, 512\) \(or head_dim_qk/head_dim_vo 192/128\), got"


@pytest.mark.parametrize("plan", [_ragged, _paged_prefill, _decode])
@pytest.mark.parametrize("head_dim", [96, 1024, 192])
def test_unsupported_head_dims_name_the_supported_ones(no_compile, plan, head_dim):
    """192 alone too: head_dim_vo defaults to head_dim_qk, and 192/192 has no kernel."""
    with pytest.raises(ValueError, match=UNSUPPORTED_HEAD_DIM + f" {head_dim}"):
        plan(head_dim)


@pytest.mark.parametrize("plan", [_ragged, _paged_prefill])
@pytest.mark.parametrize("qk,vo", [(128, 256), (128, 64), (192, 192), (192, 64), (512, 128),
                                   (256, 128)])
def test_unsupported_head_dim_pairs_are_refused(no_compile, plan, qk, vo):
    """head_dim_vo > head_dim_qk, or any pair but 192/128: refused, naming the pairs."""
    with pytest.raises(ValueError, match=rf"head_dim_vo must equal head_dim_qk \({qk}\) or form "
                                         r"one of the pairs head_dim_qk/head_dim_vo 192/128, "
                                         rf"got {vo}"):
        plan(qk, vo)


def test_supported_pairs_plan_on_cpu(no_compile):
    for qk, vo in ((192, 128), (512, None), (512, 512), (64, 64)):
        w = _ragged(qk, vo)
        assert (w._head_dim, w._head_dim_vo) == (qk, vo or qk)
        assert w._variant.head_dim_vo == (vo or qk)
    assert _decode(512)._head_dim_vo == 512


def test_run_checks_head_dims_before_compiling(no_compile):
    w = _ragged(192, 128)
    q = torch.randn(4, HQ, 192).half()
    k, v = torch.randn(40, HKV, 192).half(), torch.randn(40, HKV, 128).half()
    with pytest.raises(ValueError, match=r"k and v must have the planned head dims \(192 and "
                                         r"128\), got 192 and 192"):
        w.run(q, k, k)
    with pytest.raises(ValueError, match=r"out must have shape \(4, 8, 128\)"):
        w.run(q, k, v, out=torch.empty(4, HQ, 192).half())
    with pytest.raises(ValueError, match=r"q must have shape \(4, 8, 192\)"):
        w.run(q[..., :128], k, v)
    p = _paged_prefill(192, 128)
    cache = torch.randn(5, 2, 16, HKV, 192).half()  # one tensor: V as wide as K
    with pytest.raises(ValueError, match="k and v must have the planned head dims"):
        p.run(q, cache)


def test_single_prefill_checks_v(no_compile, monkeypatch):
    monkeypatch.setattr("flashinfer.attention.single.check_cuda", lambda x, name: None)
    q, k = torch.randn(3, HQ, 192).half(), torch.randn(40, HKV, 192).half()
    with pytest.raises(ValueError, match="head_dim_vo must equal head_dim_qk"):
        flashinfer.single_prefill_with_kv_cache(q, k, torch.randn(40, HKV, 64).half())
    with pytest.raises(ValueError, match=r"k and v must have shape \(40, 2\)"):
        flashinfer.single_prefill_with_kv_cache(q, k, torch.randn(41, HKV, 128).half())
    with pytest.raises(ValueError, match=UNSUPPORTED_HEAD_DIM):
        flashinfer.single_decode_with_kv_cache(torch.randn(HQ, 96).half(),
                                               *(torch.randn(40, HKV, 96).half(),) * 2)


def test_variants_of_the_wide_heads():
    v = AttentionVariant("bfloat16", "bfloat16", 192, "causal", "NONE", False, head_dim_vo=128)
    assert v.name == "attention_ragged_bf16_obf16_d192_causal_none_vo128"
    assert v.has_sm90  # K tiles 192 wide, V tiles 128 (prefill_sm90.cuh)
    assert "-DFI_HEAD_DIM_VO=128" in v.spec().extra_cuda_cflags
    w = AttentionVariant("float16", "float16", 512, "none", "NONE", True)
    assert w.head_dim_vo == 512 and w.name == "attention_paged_f16_of16_d512_none_none"
    assert w == AttentionVariant("float16", "float16", 512, head_dim_vo=512)
    assert not w.has_sm90  # its O would be 256 registers per thread: FA2
    assert AttentionVariant("float16", "float16", 128).has_sm90
    with pytest.raises(ValueError, match="head_dim_vo must equal head_dim_qk"):
        AttentionVariant("float16", "float16", 128, head_dim_vo=192)
    names = {s.name for s in flashinfer.aot.registered_specs()}
    for layout in ("paged", "ragged"):
        for mask in ("none", "causal"):
            assert f"attention_{layout}_bf16_obf16_d512_{mask}_none" in names
            assert f"attention_{layout}_f16_of16_d192_{mask}_none_vo128" in names


def test_the_plan_counts_one_cta_per_sm_at_512():
    """At head_dim 512 one CTA (two groups of warps over the output columns) runs each (item,
    KV head) and one CTA fits an SM: a batch that fills every SM once is not split further, a
    smaller one is."""
    assert [cta_occupancy(0, d) for d in (64, 128, 256, 512)] == [2, 2, 2, 1]
    args = dict(group_size=4, num_kv_heads=8, num_sms=132)
    narrow, _ = schedule([1] * 16, [8192] * 16, head_dim=256, **args)
    wide, _ = schedule([1] * 16, [8192] * 16, head_dim=512, **args)
    assert narrow.split_kv and not wide.split_kv
    small, _ = schedule([1] * 4, [8192] * 4, head_dim=512, **args)
    assert small.split_kv and small.num_items * 8 <= 132

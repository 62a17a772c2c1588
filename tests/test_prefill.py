"""flashinfer.prefill: single and batch (paged, ragged) prefill against a float64 reference."""

from __future__ import annotations

import pytest
import torch
from attention_ref import attention_ref, make_paged

import flashinfer

TOL = {torch.float16: dict(atol=4e-3, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _close(out, ref, dtype):
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])


def _lse_close(lse, ref):
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), finite), "lse -inf rows differ"
    torch.testing.assert_close(lse[finite].double(), ref[finite], atol=2e-3, rtol=1e-3)


def _qkv(qo, kv, hq, hkv, d, dtype, gen, layout="NHD"):
    q = torch.randn(qo, hq, d, generator=gen).to(dtype).cuda()
    k = torch.randn(kv, hkv, d, generator=gen).to(dtype).cuda()
    v = torch.randn(kv, hkv, d, generator=gen).to(dtype).cuda()
    return q, k, v


# ----------------------------------------------------------------------------------------------
# CPU: validation happens before anything compiles.


def test_single_prefill_validation_errors():
    q = torch.randn(4, 8, 128, dtype=torch.float16)
    k = torch.randn(6, 2, 128, dtype=torch.float16)
    with pytest.raises(KeyError):
        flashinfer.single_prefill_with_kv_cache(q, k, k, kv_layout="NHW")
    with pytest.raises(KeyError):
        flashinfer.single_prefill_with_kv_cache(q, k, k, pos_encoding_mode="ROPE")
    with pytest.raises(ValueError, match="head_dim"):
        flashinfer.single_prefill_with_kv_cache(q[..., :96], k[..., :96], k[..., :96])
    with pytest.raises(ValueError, match="multiple"):
        flashinfer.single_prefill_with_kv_cache(q[:, :7], k[:, :2], k[:, :2])
    with pytest.raises(ValueError, match="dtype"):
        flashinfer.single_prefill_with_kv_cache(q, k.float(), k.float())
    with pytest.raises(ValueError, match="custom_mask"):
        flashinfer.single_prefill_with_kv_cache(q, k, k, custom_mask=torch.ones(3, 3, dtype=bool))
    with pytest.raises(ValueError, match="CUDA"):
        flashinfer.single_prefill_with_kv_cache(q, k, k)


def test_batch_wrappers_validate_on_cpu():
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    with pytest.raises(KeyError):
        flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "XYZ")
    with pytest.raises(ValueError, match="use_cuda_graph"):
        flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True)
    with pytest.raises(ValueError, match="use_cuda_graph"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True)
    with pytest.raises(ValueError, match="16-byte"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws[1:], "NHD")
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws)
    with pytest.raises(RuntimeError, match="plan"):
        w.run(torch.zeros(1, 1, 64), torch.zeros(1, 1, 64), torch.zeros(1, 1, 64))


# ----------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qo_len,kv_len", [(1, 1), (7, 33), (128, 128), (300, 517), (1, 1000),
                                           (65, 17), (17, 2049)])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("backend", ["auto", "fa2"])  # auto: the Hopper kernel on an H100
def test_single_prefill(dtype, head_dim, causal, qo_len, kv_len, group, backend):
    gen = torch.Generator().manual_seed(qo_len * 7 + kv_len)
    q, k, v = _qkv(qo_len, kv_len, 4 * group, 4, head_dim, dtype, gen)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True,
                                                     backend=backend)
    ro, rl = attention_ref(q, k, v, causal=causal)
    _close(o, ro, dtype)
    _lse_close(lse, rl)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_prefill_hnd_and_strided_views(layout):
    """Packed-QKV views (row stride 3x) and K/V with different strides."""
    gen = torch.Generator().manual_seed(1)
    qo, kv, hq, hkv, d = 37, 211, 8, 2, 128
    qkv = torch.randn(kv, hq + 2 * hkv, d, generator=gen).half().cuda()
    q = qkv[-qo:, :hq]
    k = qkv[:, hq:hq + hkv]
    v = torch.randn(kv, hkv, 2 * d, generator=gen).half().cuda()[..., :d]
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
    o = flashinfer.single_prefill_with_kv_cache(q, kk, vv, causal=True, kv_layout=layout)
    ro, _ = attention_ref(q, k, v, causal=True)
    _close(o, ro, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("opts", [
    dict(window_left=31), dict(window_left=0, causal=True), dict(soft_cap=30.0, causal=True),
    dict(sm_scale=0.3), dict(pos_encoding="ROPE_LLAMA", causal=True),
    dict(pos_encoding="ROPE_LLAMA", rope_scale=2.0, rope_theta=5e5),
    dict(pos_encoding="ALIBI", causal=True), dict(v_scale=0.5),
])
def test_single_prefill_options(opts):
    gen = torch.Generator().manual_seed(2)
    q, k, v = _qkv(45, 300, 8, 2, 128, torch.float16, gen)
    kw = dict(opts)
    kw["logits_soft_cap"] = kw.pop("soft_cap", None)
    kw["pos_encoding_mode"] = kw.pop("pos_encoding", "NONE")
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, **kw)
    ro, _ = attention_ref(q, k, v, soft_cap=kw["logits_soft_cap"],
                          pos_encoding=kw["pos_encoding_mode"],
                          **{x: y for x, y in opts.items() if x not in ("soft_cap", "pos_encoding")})
    _close(o, ro, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True])
def test_single_prefill_custom_mask(packed):
    gen = torch.Generator().manual_seed(3)
    q, k, v = _qkv(33, 77, 8, 4, 128, torch.bfloat16, gen)
    mask = torch.rand(33, 77, generator=gen) > 0.5
    mask[5] = False  # a row with no key: 0 output, lse -inf
    kw = dict(custom_mask=mask.cuda())
    if packed:
        kw = dict(packed_custom_mask=flashinfer.packbits(mask.flatten().cuda(), "little"))
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, return_lse=True, causal=True, **kw)
    ro, rl = attention_ref(q, k, v, mask=mask)
    _close(o, ro, torch.bfloat16)
    _lse_close(lse, rl)
    assert torch.all(o[5] == 0) and torch.all(lse[5] == float("-inf"))


@pytest.mark.gpu
def test_causal_rows_without_keys_and_huge_negative_logits():
    gen = torch.Generator().manual_seed(4)
    d = 128
    q, k, v = _qkv(40, 16, 4, 4, d, torch.float32, gen)
    q[..., 0] = -2.5e5 * d ** 0.5  # every logit near -2.5e5
    k[..., 0] = 1.0
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    ro, rl = attention_ref(q, k, v, causal=True)
    # qo_len 40 > kv_len 16: the first 24 rows see no key.
    assert torch.all(o[:24] == 0) and torch.all(torch.isinf(lse[:24]))
    assert not torch.isnan(o).any()
    # fp32 holds a logit near -2.5e5 to ~0.03 (and the dot product accumulates at that
    # magnitude), so the weights are exact to a few percent only: what is tested is that masked
    # keys (-inf) never leak in and visible ones are not lost, as a finite mask value would.
    torch.testing.assert_close(o.double(), ro, atol=0.1, rtol=0.1)
    torch.testing.assert_close(lse[24:].double(), rl[24:], atol=0.05, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 5, 16, 64])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("tuple_form", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["auto", "fa2"])
def test_batch_paged_prefill(page_size, layout, tuple_form, causal, backend):
    gen = torch.Generator().manual_seed(page_size)
    dtype, hq, hkv, d = torch.bfloat16, 16, 4, 128
    kv_lens = [37, 0, 1, 300, 129, 64]
    qo_lens = [5, 0, 1, 300, 17, 80]  # last: qo_len > kv_len
    cache, indptr, indices, last, seqs = make_paged(kv_lens, page_size, hkv, d, dtype, "cuda",
                                                    layout, tuple_form, gen)
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(qo_lens), hq, d, generator=gen).to(dtype).cuda()
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), layout, backend=backend)
    w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, page_size, causal=causal,
           q_data_type=dtype)
    o, lse = w.run(q, cache, return_lse=True)
    for b in range(len(kv_lens)):
        s, e = qo_indptr[b], qo_indptr[b + 1]
        if e == s:
            continue
        ro, rl = attention_ref(q[s:e], *seqs[b], causal=causal)
        _close(o[s:e], ro, dtype)
        _lse_close(lse[s:e], rl)


def _ragged_batch(qo_lens, kv_lens, hq, hkv, d, dtype, gen):
    """q, k, v (ragged, NHD, on the GPU) and the int32 qo / kv indptrs (on the CPU)."""
    q = torch.randn(sum(qo_lens), hq, d, generator=gen).to(dtype).cuda()
    k = torch.randn(sum(kv_lens), hkv, d, generator=gen).to(dtype).cuda()
    v = torch.randn(sum(kv_lens), hkv, d, generator=gen).to(dtype).cuda()

    def cum(xs):
        return torch.tensor([0] + torch.tensor(xs).cumsum(0).tolist(), dtype=torch.int32)

    return q, k, v, cum(qo_lens), cum(kv_lens)


def _check_ragged(o, lse, q, k, v, qi, ki, dtype, **ref_kw):
    """Each request of a ragged batch against the reference (its lse too, when given)."""
    for b in range(len(qi) - 1):
        if qi[b + 1] == qi[b]:
            continue
        ro, rl = attention_ref(q[qi[b]:qi[b + 1]], k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]],
                               **ref_kw)
        _close(o[qi[b]:qi[b + 1]], ro, dtype)
        if lse is not None:
            _lse_close(lse[qi[b]:qi[b + 1]], rl)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_batch_ragged_prefill(dtype, head_dim, causal):
    gen = torch.Generator().manual_seed(head_dim)
    hq, hkv = 8, 1
    qo_lens, kv_lens = [1, 100, 0, 257, 31], [1, 100, 7, 300, 10]
    q, k, v, qi, ki = _ragged_batch(qo_lens, kv_lens, hq, hkv, head_dim, dtype, gen)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(qi.cuda(), ki.cuda(), hq, hkv, head_dim, causal=causal, q_data_type=dtype)
    out = torch.full_like(q, float("nan"))
    o = w.run(q, k, v, out=out)
    assert o is out
    _check_ragged(o, None, q, k, v, qi, ki, dtype, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("out_kind", ["contiguous", "row-strided view", "one head, stride 3"])
def test_fa2_output_rows_through_shared_memory_or_not(out_kind):
    """The FA2 prefill shapes write whole 16-byte chunks of output rows (through shared memory)
    where out's row strides are multiples of 8 elements, and 4-byte pairs otherwise (a head dim
    of size 1 may have any stride: 3 here): right on uneven requests (an empty one, q shorter
    than kv, a tile past the request's rows), GQA group 4 (1 for the one-head case), lse too."""
    gen = torch.Generator().manual_seed(5)
    hq, hkv = (1, 1) if out_kind == "one head, stride 3" else (8, 2)
    d, dtype = 128, torch.bfloat16
    qo_lens, kv_lens = [1, 0, 300, 1100, 77], [1, 64, 700, 1100, 77]
    q, k, v, qi, ki = _ragged_batch(qo_lens, kv_lens, hq, hkv, d, dtype, gen)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), backend="fa2")
    w.plan(qi.cuda(), ki.cuda(), hq, hkv, d, causal=True, q_data_type=dtype)
    n = q.shape[0]
    if out_kind == "contiguous":
        out = torch.full_like(q, float("nan"))
    elif out_kind == "row-strided view":
        out = torch.full((n, hq + 2, d), float("nan"), dtype=dtype, device="cuda")[:, 1:hq + 1]
    else:
        out = torch.full((n * d,), float("nan"), dtype=dtype, device="cuda").as_strided(
            (n, 1, d), (d, 3, 1))
    o, lse = w.run(q, k, v, out=out, return_lse=True)
    assert o is out
    _check_ragged(o, lse, q, k, v, qi, ki, dtype, causal=True)


@pytest.mark.gpu
def test_batch_prefill_replan_custom_mask_then_causal():
    gen = torch.Generator().manual_seed(5)
    hq, hkv, d, dtype = 8, 8, 128, torch.bfloat16
    qo_lens, kv_lens = [9, 20], [30, 20]
    q = torch.randn(29, hq, d, generator=gen).to(dtype).cuda()
    k = torch.randn(50, hkv, d, generator=gen).to(dtype).cuda()
    v = torch.randn(50, hkv, d, generator=gen).to(dtype).cuda()
    qi = torch.tensor([0, 9, 29], dtype=torch.int32)
    ki = torch.tensor([0, 30, 50], dtype=torch.int32)
    masks = [torch.rand(q_, k_, generator=gen) > 0.3 for q_, k_ in zip(qo_lens, kv_lens)]
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(qi, ki, hq, hkv, d, custom_mask=torch.cat([m.flatten() for m in masks]).cuda(),
           q_data_type=dtype)
    o = w.run(q, k, v)
    for b in range(2):
        ro, _ = attention_ref(q[qi[b]:qi[b + 1]], k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]],
                              mask=masks[b])
        _close(o[qi[b]:qi[b + 1]], ro, dtype)
    w.plan(qi, ki, hq, hkv, d, causal=True, q_data_type=dtype)
    o = w.run(q, k, v)
    for b in range(2):
        ro, _ = attention_ref(q[qi[b]:qi[b + 1]], k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]],
                              causal=True)
        _close(o[qi[b]:qi[b + 1]], ro, dtype)


@pytest.mark.gpu
def test_run_rejects_unplanned_dtype():
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    qi = torch.tensor([0, 4], dtype=torch.int32)
    w.plan(qi, qi, 4, 4, 64)  # q_data_type defaults to float16
    x = torch.randn(4, 4, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="q_data_type"):
        w.run(x, x, x)


@pytest.mark.gpu
def test_long_prefill_against_reference():
    gen = torch.Generator().manual_seed(6)
    q, k, v = _qkv(512, 16384, 8, 2, 128, torch.bfloat16, gen)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    ro, rl = attention_ref(q, k, v, causal=True)
    _close(o, ro, torch.bfloat16)
    _lse_close(lse, rl)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_multilevel_cascade_matches_flat_attention(causal):
    """Level 0: one prefix shared by every request; level 1: each request's own pages."""
    gen = torch.Generator().manual_seed(9)
    dtype, hq, hkv, d, page = torch.float16, 8, 2, 128, 16
    prefix, own, qo = 100, [33, 1, 64], [3, 1, 20]
    cache, indptr, indices, last, seqs = make_paged([prefix] + own, page, hkv, d, dtype, "cuda",
                                                    "NHD", False, gen)
    total = sum(qo)
    q = torch.randn(total, hq, d, generator=gen).to(dtype).cuda()
    i32 = dict(dtype=torch.int32)
    qo_indptr = torch.tensor([0] + torch.tensor(qo).cumsum(0).tolist(), **i32)
    levels = (
        [torch.tensor([0, total], **i32), qo_indptr],
        [indptr[:2] - indptr[0], indptr[1:] - indptr[1]],
        [indices[: indptr[1]], indices[indptr[1]:]],
        [last[:1], last[1:]],
    )
    w = flashinfer.MultiLevelCascadeAttentionWrapper(
        2, torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(*levels, hq, hkv, d, page, causal=causal, q_data_type=dtype)
    o = w.run(q, cache)
    for b in range(len(own)):
        s, e = qo_indptr[b], qo_indptr[b + 1]
        k = torch.cat([seqs[0][0], seqs[b + 1][0]])
        v = torch.cat([seqs[0][1], seqs[b + 1][1]])
        ro, _ = attention_ref(q[s:e], k, v, causal=causal)
        _close(o[s:e], ro, dtype)


# ----------------------------------------------------------------------------------------------
# The Hopper kernel (cta 3): chosen by "auto" on compute capability 9.0 for rows > 64.

needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a compute capability 9.0 GPU (the Hopper kernel)")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("split", [None, 512])
def test_hopper_kernel_persistent_grid_and_split_kv(head_dim, split):
    """More (item, head) pairs than SMs, so each CTA loops over several items (its producer runs
    ahead into the next); with a fixed split the items write partial states that get merged."""
    gen = torch.Generator().manual_seed(head_dim + (split or 0))
    qo_lens, kv_lens = [700, 129, 1, 1500, 65], [2000, 129, 3000, 1500, 4000]
    q, k, v, qi, ki = _ragged_batch(qo_lens, kv_lens, 16, 2, head_dim, torch.bfloat16, gen)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), backend="fa3")
    w.plan(qi.cuda(), ki.cuda(), 16, 2, head_dim, causal=True, q_data_type=torch.bfloat16,
           fixed_split_size=split)
    assert w._plan.cta == 3 and w._plan.split_kv == (split is not None)
    o, lse = w.run(q, k, v, return_lse=True)
    _check_ragged(o, lse, q, k, v, qi, ki, torch.bfloat16, causal=True)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("tuple_form", [False, True])
def test_hopper_kernel_paged_gathers(head_dim, page_size, tuple_form):
    """The Hopper kernel's producer gathers K and V rows page by page (one address per row and
    tile, eight lanes per 128-byte half row): page sizes that do not divide its 32-key warp
    slices, V with other strides than K, several items per CTA, partial last tiles."""
    gen = torch.Generator().manual_seed(head_dim * 100 + page_size * 2 + int(tuple_form))
    dtype, hq, hkv = torch.bfloat16, 16, 4
    kv_lens, qo_lens = [1000, 129, 1, 700, 33], [300, 129, 1, 650, 40]
    cache, indptr, indices, last, seqs = make_paged(kv_lens, page_size, hkv, head_dim, dtype,
                                                    "cuda", "NHD", tuple_form, gen)
    qi = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(qo_lens), hq, head_dim, generator=gen).to(dtype).cuda()
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD", backend="fa3")
    w.plan(qi, indptr, indices, last, hq, hkv, head_dim, page_size, causal=True,
           q_data_type=dtype)
    assert w._plan.cta == 3
    o, lse = w.run(q, cache, return_lse=True)
    for b, (kk, vv) in enumerate(seqs):
        ro, rl = attention_ref(q[qi[b]:qi[b + 1]], kk, vv, causal=True)
        _close(o[qi[b]:qi[b + 1]], ro, dtype)
        _lse_close(lse[qi[b]:qi[b + 1]], rl)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_hopper_kernel_ragged_kv_tiles_past_the_requests(head_dim, causal, layout):
    """Ragged K/V come through TMA tensor maps over the whole buffer: a last tile reads past its
    request into the next request's keys, or past the last request into rows the caller never
    filled (NaN and inf here, in a buffer longer than the batch), which must not reach the
    output (0 x NaN); lengths not multiples of the 128-key tile, several items per CTA."""
    gen = torch.Generator().manual_seed(head_dim + 2 * causal + (layout == "HND"))
    hq, hkv, dtype = 8, 2, torch.bfloat16
    qo_lens, kv_lens = [200, 1, 130, 77], [300, 129, 130, 1000]
    q, k, v, qi, ki = _ragged_batch(qo_lens, kv_lens, hq, hkv, head_dim, dtype, gen)
    pad = torch.full((300, hkv, head_dim), float("nan"), dtype=dtype, device="cuda")
    pad[::3] = float("inf")
    kb, vb = torch.cat([k, pad]), torch.cat([v, -pad])
    if layout == "HND":  # (Hkv, tokens, D)
        kb, vb = kb.transpose(0, 1).contiguous(), vb.transpose(0, 1).contiguous()
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda"), layout, backend="fa3")
    w.plan(qi.cuda(), ki.cuda(), hq, hkv, head_dim, causal=causal, q_data_type=dtype)
    assert w._plan.cta == 3
    o, lse = w.run(q, kb, vb, return_lse=True)
    assert torch.isfinite(o).all()
    _check_ragged(o, lse, q, k, v, qi, ki, dtype, causal=causal)


@pytest.mark.gpu
@needs_sm90
def test_hopper_kernel_matches_fa2_bitwise_free_of_nan_on_many_shapes():
    """fa3 and fa2 agree (to rounding) on every request of a mixed batch, window and soft cap
    included, and neither writes NaN into rows past the requests (output poisoned first)."""
    gen = torch.Generator().manual_seed(11)
    qo_lens, kv_lens = [1, 17, 0, 64, 65, 130, 333], [1, 40, 5, 64, 65, 200, 1000]
    q, k, v, qi, ki = _ragged_batch(qo_lens, kv_lens, 8, 8, 128, torch.float16, gen)
    outs = []
    for backend in ("fa3", "fa2"):
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            torch.empty(64 << 20, dtype=torch.uint8, device="cuda"), backend=backend)
        w.plan(qi.cuda(), ki.cuda(), 8, 8, 128, causal=True, q_data_type=torch.float16,
               window_left=100, logits_soft_cap=20.0)
        out = torch.full_like(q, float("nan"))
        outs.append(w.run(q, k, v, out=out))
        assert not torch.isnan(out).any()
    torch.testing.assert_close(outs[0], outs[1], atol=4e-3, rtol=1e-2)
    _check_ragged(outs[0], None, q, k, v, qi, ki, torch.float16, causal=True, window_left=100,
                  soft_cap=20.0)


@pytest.mark.gpu
@needs_sm90
def test_hopper_kernel_under_cuda_graph_replan():
    """A captured paged prefill stays correct after a re-plan with other lengths."""
    gen = torch.Generator().manual_seed(12)
    hq, hkv, d, page, dtype = 16, 4, 128, 16, torch.bfloat16
    first = ([300, 129], [400, 129])
    second = ([100, 250], [1000, 250])
    max_pages = sum((k_ + page - 1) // page for k_ in second[1]) + 8
    bufs = dict(qo_indptr_buf=torch.empty(3, dtype=torch.int32, device="cuda"),
                paged_kv_indptr_buf=torch.empty(3, dtype=torch.int32, device="cuda"),
                paged_kv_indices_buf=torch.empty(max_pages, dtype=torch.int32, device="cuda"),
                paged_kv_last_page_len_buf=torch.empty(2, dtype=torch.int32, device="cuda"))
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), "NHD", use_cuda_graph=True,
        **bufs)
    rows = sum(first[0])
    q = torch.empty(rows, hq, d, dtype=dtype, device="cuda")
    out = torch.empty_like(q)
    plans = [make_paged(kv_lens, page, hkv, d, dtype, "cuda", "NHD", False, gen) + (qo_lens,)
             for qo_lens, kv_lens in (first, second)]
    # The captured run reads one cache tensor: each plan's pages are copied into it.
    big = torch.empty((max(c[0].shape[0] for c in plans),) + tuple(plans[0][0].shape[1:]),
                      dtype=dtype, device="cuda")
    graph = None
    for cache, indptr, indices, last, seqs, qo_lens in plans:
        big[: cache.shape[0]].copy_(cache)
        qo_indptr = torch.tensor([0, qo_lens[0], sum(qo_lens)], dtype=torch.int32)
        w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, page, causal=True,
               q_data_type=dtype)
        assert w._plan.cta == 3
        q.copy_(torch.randn(rows, hq, d, generator=gen).to(dtype))
        if graph is None:
            w.run(q, big, out=out)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                w.run(q, big, out=out)
        graph.replay()
        torch.cuda.synchronize()
        for b in range(2):
            s0 = 0 if b == 0 else qo_lens[0]
            ro, _ = attention_ref(q[s0:s0 + qo_lens[b]], *seqs[b], causal=True)
            _close(out[s0:s0 + qo_lens[b]], ro, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_fa2_split_kv_merged_in_the_kernel(causal):
    """The FA2 128-row shape (the plan's for long queries at head_dim 128) with split KV: the
    last CTA of each (request, row tile, KV head) merges 128 packed rows of partial states; a
    request shorter than one chunk writes its output directly; under the causal mask the first
    row tiles of the last request see none of its later chunks (empty partial states). Twice,
    so the second launch finds the counters at 0. (test_every_fa2_cta_shape_on_any_batch
    forces the other shapes.)"""
    gen = torch.Generator().manual_seed(int(causal))
    dtype, hq, hkv, d = torch.float16, 8, 2, 128
    qo_lens, kv_lens = [40, 3, 16, 300], [3000, 100, 700, 300]
    q, k, v, qi, ki = _ragged_batch(qo_lens, kv_lens, hq, hkv, d, dtype, gen)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), backend="fa2")
    w.plan(qi.cuda(), ki.cuda(), hq, hkv, d, causal=causal, q_data_type=dtype,
           fixed_split_size=256)
    assert w._plan.split_kv and w._plan.cta == 2
    for _ in range(2):
        o, lse = w.run(q, k, v, return_lse=True)
        _check_ragged(o, lse, q, k, v, qi, ki, dtype, causal=causal)
        assert int(w._ws.counters.abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("cta", [0, 1, 2, 4, 5])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("split", [None, 256])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_fa2_cta_shape_on_any_batch(monkeypatch, cta, causal, split, head_dim):
    """Each FA2 CTA shape forced on a batch the plan would not give it: requests of many row
    tiles for the 16-row shapes (0, 4, 5), one-row requests for the 128-row one, with and
    without split KV (merged in the kernel) and the causal mask. A head_dim 256 module has no
    shape 5 and says so."""
    import functools

    import flashinfer.attention.wrapper as wrapper

    monkeypatch.setattr(wrapper, "schedule", functools.partial(wrapper.schedule, cta=cta))
    gen = torch.Generator().manual_seed(cta * 10 + head_dim)
    dtype, hq, hkv = torch.bfloat16, 8, 2
    qo_lens, kv_lens = [1, 37, 0, 130, 5], [700, 37, 9, 1030, 5]
    q, k, v, qi, ki = _ragged_batch(qo_lens, kv_lens, hq, hkv, head_dim, dtype, gen)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(qi.cuda(), ki.cuda(), hq, hkv, head_dim, causal=causal, q_data_type=dtype,
           fixed_split_size=split, disable_split_kv=split is None)
    assert w._plan.cta == cta and w._plan.split_kv == (split is not None)
    if cta == 5 and head_dim > 128:
        with pytest.raises(ValueError, match=r"cta 5 \(eight key streams\) takes head_dim <= 128"):
            w.run(q, k, v)
        return
    o, lse = w.run(q, k, v, return_lse=True)
    _check_ragged(o, lse, q, k, v, qi, ki, dtype, causal=causal)
    assert int(w._ws.counters.abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
def test_prefill_metadata_on_the_host_or_the_device(paged):
    """Host metadata is staged in one copy, device metadata copied as it is: same output."""
    gen = torch.Generator().manual_seed(12)
    dtype, hq, hkv, d, page = torch.float16, 8, 2, 128, 16
    qo_lens, kv_lens = [3, 0, 40, 17], [100, 9, 40, 300]
    qi = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(qo_lens), hq, d, generator=gen).to(dtype).cuda()
    outs = []
    for where in ("cuda", "cpu"):
        w_ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        if paged:
            cache, indptr, indices, last, seqs = make_paged(kv_lens, page, hkv, d, dtype, "cuda",
                                                            "NHD", False,
                                                            torch.Generator().manual_seed(1))
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(w_ws, "NHD")
            w.plan(qi.to(where), indptr.to(where), indices.to(where), last.to(where), hq, hkv,
                   d, page, causal=True, q_data_type=dtype)
            outs.append(w.run(q, cache))
        else:
            _, k, v, _, ki = _ragged_batch(qo_lens, kv_lens, hq, hkv, d, dtype,
                                           torch.Generator().manual_seed(1))
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(w_ws)
            w.plan(qi.to(where), ki.to(where), hq, hkv, d, causal=True, q_data_type=dtype)
            outs.append(w.run(q, k, v))
    assert torch.equal(outs[0], outs[1])
    if paged:
        for b, (kk, vv) in enumerate(seqs):
            ro, _ = attention_ref(q[qi[b]:qi[b + 1]], kk, vv, causal=True)
            _close(outs[1][qi[b]:qi[b + 1]], ro, dtype)
    else:
        _check_ragged(outs[1], None, q, k, v, qi, ki, dtype, causal=True)

"""fp8 KV caches (float8_e4m3fn, float8_e5m2) under float16 / bfloat16 q: batch and single decode,
paged and ragged prefill, the CUDA-graph decode wrapper, and append_paged_kv_cache casting half
rows into an fp8 cache.

Reference: attention_ref (float64) on the dequantized cache (the fp8 values as float64) with
``sm_scale * q_scale * k_scale`` and the output times ``v_scale``. The kernel converts every fp8
value exactly to q's dtype and accumulates in float32, so the tolerance is the half path's:
float16 atol 4e-3 / rtol 1e-2, bfloat16 atol 2e-2 / rtol 2e-2 (the softmax weights are rounded to
q's dtype before P.V), scaled by |v_scale| where it is not 1.
"""

from __future__ import annotations

import math

import pytest
import torch
from attention_ref import attention_ref, make_paged

import flashinfer
from flashinfer.attention import plan as attention_plan
from flashinfer.attention import runtime as attention_runtime
from flashinfer.jit.attention import AttentionVariant, fp8_kv_variants, precompiled_variants

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
TOL = {torch.float16: dict(atol=4e-3, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _ws(device="cuda", mb=128):
    return torch.empty(mb << 20, dtype=torch.uint8, device=device)


def _to_fp8(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x cast to fp8 (values kept in range: randn times 2 stays well inside both types)."""
    return x.to(dtype)


def _fp8_paged(kv_lens, page, hkv, d, kv_dtype, layout="NHD", tuple_form=False, gen=None):
    """make_paged's cache in fp8, and each request's K/V dequantized (float64, NHD)."""
    cache, indptr, indices, last, seqs = make_paged(kv_lens, page, hkv, d, torch.float32, "cuda",
                                                    layout, False, gen)
    cache8 = _to_fp8(cache * 2, kv_dtype)
    k8, v8 = cache8[:, 0], cache8[:, 1]
    if tuple_form:  # V with other strides than K: a slice of a wider fp8 tensor
        wide = torch.zeros(v8.shape[:-1] + (2 * d,), dtype=torch.uint8, device="cuda")
        wide[..., :d] = v8.view(torch.uint8)
        cache8 = (k8.contiguous(), wide[..., :d].view(kv_dtype))
    deq = [(_to_fp8(k * 2, kv_dtype).double(), _to_fp8(v * 2, kv_dtype).double())
           for k, v in seqs]
    return cache8, indptr, indices, last, deq


def _check(o, lse, q, seqs, dtype, qo_indptr=None, v_scale=1.0, **ref_kw):
    tol = {k: v * max(1.0, abs(v_scale)) for k, v in TOL[dtype].items()}
    for b, (k, v) in enumerate(seqs):
        lo, hi = (b, b + 1) if qo_indptr is None else (qo_indptr[b], qo_indptr[b + 1])
        ro, rl = attention_ref(q[lo:hi], k, v, v_scale=v_scale, **ref_kw)
        torch.testing.assert_close(o[lo:hi].double(), ro, **tol)
        if lse is not None:
            finite = torch.isfinite(rl)
            assert torch.equal(torch.isfinite(lse[lo:hi]), finite)
            torch.testing.assert_close(lse[lo:hi][finite].double(), rl[finite], atol=2e-3,
                                       rtol=1e-3)


FORCED = {"auto": None, "two key streams": 4, "eight key streams": 5}


@pytest.fixture(params=list(FORCED))
def decode_shape(request, monkeypatch):
    """Each 16-row decode CTA shape, forced for every 16-row batch (None: the plan's own)."""
    forced = FORCED[request.param]
    if forced is not None:
        choose = attention_plan.choose_cta
        monkeypatch.setattr(attention_plan, "choose_cta", lambda rows, head_dim, *a, **kw:
                            (4 if forced == 5 and head_dim > 128 else forced) if rows <= 16
                            else choose(rows, head_dim, *a, **kw))
    return forced


# -- CPU: variants and validation -----------------------------------------------------------

@pytest.fixture
def cpu_plans(monkeypatch):
    """plan() on a CPU workspace: the scheduler's SM count without asking a GPU."""
    import flashinfer.attention.wrapper as wrapper

    monkeypatch.setattr(wrapper, "device_num_sms", lambda device: 132)


def test_fp8_variant_name_flags_and_no_hopper_kernel_on_cpu():
    v = AttentionVariant("bfloat16", "bfloat16", 128, "none", "NONE", True, "float8_e4m3fn")
    assert v.name == "attention_paged_bf16_kve4m3_obf16_d128_none_none"
    assert "-DFI_DTYPE_KV=2" in v.spec().extra_cuda_cflags
    assert not v.has_sm90  # fp8 K/V runs on the FA2 kernel (launch.cuh says why)
    half = AttentionVariant("bfloat16", "bfloat16", 128)
    assert half.dtype_kv == "bfloat16" and half.name == "attention_paged_bf16_obf16_d128_none_none"
    assert half == AttentionVariant("bfloat16", "bfloat16", 128, dtype_kv="bfloat16")
    assert "-DFI_DTYPE_KV=1" in half.spec().extra_cuda_cflags
    e5 = AttentionVariant("float16", "float16", 64, paged=False, dtype_kv="float8_e5m2")
    assert "-DFI_DTYPE_KV=3" in e5.spec().extra_cuda_cflags and "kve5m2" in e5.name
    with pytest.raises(ValueError, match="dtype_kv"):
        AttentionVariant("float16", "float16", 128, dtype_kv="bfloat16")
    with pytest.raises(ValueError, match="dtype_kv"):
        AttentionVariant("float16", "float16", 128, dtype_kv="float32")


def test_fp8_e4m3_decode_and_prefill_are_precompiled_on_cpu():
    registered = set(precompiled_variants())
    for dtype in ("float16", "bfloat16"):
        for paged, mask in ((True, "none"), (True, "causal"), (False, "none"), (False, "causal")):
            assert AttentionVariant(dtype, dtype, 128, mask, "NONE", paged,
                                    "float8_e4m3fn") in registered
    assert all(v.dtype_kv == "float8_e4m3fn" and v.head_dim == 128 for v in fp8_kv_variants())


def _decode_plan(w, kv_dtype=E4M3, q_dtype=torch.float16, **kw):
    indptr = torch.tensor([0, 2], dtype=torch.int32)
    w.plan(indptr, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32),
           8, 2, 128, 16, q_data_type=q_dtype, kv_data_type=kv_dtype, **kw)


@pytest.mark.parametrize("kv_dtype", [E4M3, E5M2, "float8_e4m3fn", "torch.float8_e5m2"])
def test_plan_takes_an_fp8_kv_data_type_on_cpu(kv_dtype, cpu_plans):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws("cpu", 2))
    _decode_plan(w, kv_dtype, torch.bfloat16)
    assert w._variant.dtype_kv in ("float8_e4m3fn", "float8_e5m2")
    assert w._variant.dtype_q == "bfloat16" and w._variant.dtype_o == "bfloat16"
    # The deprecated data_type alone names the KV dtype (q keeps plan's default, float16).
    w2 = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws("cpu", 2))
    w2.plan(torch.tensor([0, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([5], dtype=torch.int32), 8, 2, 128, 16, data_type=E5M2)
    assert (w2._q_dtype, w2._kv_dtype, w2._o_dtype) == (torch.float16, E5M2, torch.float16)


@pytest.mark.parametrize("make", [
    lambda ws: flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws),
    lambda ws: flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws),
])
def test_prefill_plan_rejects_fp8_q_and_other_kv_dtypes_on_cpu(make, cpu_plans):
    w = make(_ws("cpu", 2))
    qi = torch.tensor([0, 4], dtype=torch.int32)

    def plan(**kw):
        if isinstance(w, flashinfer.BatchPrefillWithRaggedKVCacheWrapper):
            w.plan(qi, qi, 4, 2, 128, **kw)
        else:
            w.plan(qi, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                   torch.tensor([4], dtype=torch.int32), 4, 2, 128, 16, **kw)

    plan(q_data_type=torch.float16, kv_data_type=E4M3)
    assert w._variant.dtype_kv == "float8_e4m3fn"
    with pytest.raises(NotImplementedError, match="q_data_type=float8_e4m3fn"):
        plan(q_data_type=E4M3, kv_data_type=E4M3)
    with pytest.raises(NotImplementedError, match="o_data_type=float8_e5m2"):
        plan(q_data_type=torch.float16, kv_data_type=E4M3, o_data_type=E5M2)
    with pytest.raises(ValueError, match="kv_data_type must be q's dtype"):
        plan(q_data_type=torch.float16, kv_data_type=torch.bfloat16)
    with pytest.raises(ValueError, match="kv_data_type must be q's dtype"):
        plan(q_data_type=torch.float16, kv_data_type=torch.float32)


def test_decode_run_checks_the_cache_dtype_and_the_scales_on_cpu(cpu_plans):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws("cpu", 2))
    _decode_plan(w, E4M3, torch.float16)
    q = torch.randn(1, 8, 128, dtype=torch.float16)
    cache8 = torch.zeros(2, 2, 16, 2, 128, dtype=E4M3)
    with pytest.raises(ValueError, match="planned kv_data_type .float8_e4m3fn., got float16"):
        w.run(q, cache8.to(torch.float16))
    with pytest.raises(ValueError, match="got float8_e5m2"):
        w.run(q, (cache8[:, 0], cache8[:, 1].to(torch.float32).to(E5M2)))
    with pytest.raises(ValueError, match="planned q_data_type"):
        w.run(q.to(torch.bfloat16), cache8)
    for name in ("q_scale", "k_scale", "v_scale"):
        with pytest.raises(TypeError, match=f"{name} must be a float or None, got Tensor"):
            w.run(q, cache8, **{name: torch.tensor(0.5)})
        with pytest.raises(TypeError, match=f"{name} must be a float or None, got str"):
            w.run(q, cache8, **{name: "0.5"})
    for name in ("q_scale", "k_scale"):
        with pytest.raises(ValueError, match=f"{name} must be positive and finite"):
            w.run(q, cache8, **{name: 0.0})
    with pytest.raises(ValueError, match="v_scale must be finite"):
        w.run(q, cache8, v_scale=math.nan)


def test_ragged_run_checks_k_and_v_dtypes_and_o_scale_on_cpu(cpu_plans):
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws("cpu", 2))
    qi = torch.tensor([0, 4], dtype=torch.int32)
    w.plan(qi, qi, 4, 2, 128, q_data_type=torch.bfloat16, kv_data_type=E5M2)
    q = torch.randn(4, 4, 128, dtype=torch.bfloat16)
    k = torch.zeros(4, 2, 128, dtype=E5M2)
    with pytest.raises(ValueError, match="planned kv_data_type .float8_e5m2., got float8_e4m3fn"):
        w.run(q, k, k.to(torch.float32).to(E4M3))
    with pytest.raises(TypeError, match="o_scale must be a float or None"):
        w.run(q, k, k, o_scale=torch.tensor(1.0))


def test_fp8_at_head_dim_512_and_192_128_is_refused_on_cpu(cpu_plans):
    """fp8 K/V takes head_dim 64, 128 and 256 (v's equal): 512 and 192/128 are refused by name
    before anything compiles (the kernel static_asserts the same)."""
    msg = "fp8 KV cache .* head_dim \\(64, 128, 256\\)"
    with pytest.raises(NotImplementedError, match=msg):
        AttentionVariant("bfloat16", "bfloat16", 512, dtype_kv="float8_e4m3fn")
    with pytest.raises(NotImplementedError, match=msg):
        AttentionVariant("bfloat16", "bfloat16", 192, paged=False, dtype_kv="float8_e5m2",
                         head_dim_vo=128)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws("cpu", 2))
    with pytest.raises(NotImplementedError, match=msg):
        w.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
               torch.tensor([5], dtype=torch.int32), 8, 2, 512, 16, q_data_type=torch.bfloat16,
               kv_data_type=E4M3)
    r = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws("cpu", 2))
    qi = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="got head_dim 192, head_dim_vo 128"):
        r.plan(qi, qi, 4, 2, 192, 128, q_data_type=torch.bfloat16, kv_data_type=E4M3)
    q = torch.randn(8, 512, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=msg):
        flashinfer.single_decode_with_kv_cache(q, torch.zeros(16, 2, 512, dtype=E4M3),
                                               torch.zeros(16, 2, 512, dtype=E4M3))
    qp = torch.randn(4, 8, 192, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=msg):
        flashinfer.single_prefill_with_kv_cache(qp, torch.zeros(16, 2, 192, dtype=E4M3),
                                                torch.zeros(16, 2, 128, dtype=E4M3))


def test_single_ops_validate_fp8_inputs_on_cpu():
    q = torch.randn(8, 128, dtype=torch.float16)
    k8 = torch.zeros(16, 2, 128, dtype=E4M3)
    with pytest.raises(NotImplementedError, match="q=float8_e4m3fn"):
        flashinfer.single_decode_with_kv_cache(q.to(E4M3), k8, k8)
    with pytest.raises(ValueError, match="v must have k's dtype"):
        flashinfer.single_decode_with_kv_cache(q, k8, k8.to(torch.float16))
    with pytest.raises(ValueError, match="k.dtype must be q's dtype"):
        flashinfer.single_decode_with_kv_cache(q, k8.float(), k8.float())
    with pytest.raises(TypeError, match="k_scale must be a float"):
        flashinfer.single_decode_with_kv_cache(q, k8, k8, k_scale=torch.tensor(2.0))
    qp = torch.randn(4, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="v_scale must be a float"):
        flashinfer.single_prefill_with_kv_cache(qp, k8, k8, v_scale=[1.0])
    with pytest.raises(NotImplementedError, match="o_dtype=float8_e4m3fn"):
        flashinfer.single_prefill_with_kv_cache(qp, k8, k8, o_dtype=E4M3)


def test_fast_decode_plan_defaults_q_to_float16_under_an_fp8_cache_on_cpu(cpu_plans):
    from flashinfer.decode import fast_decode_plan

    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws("cpu", 2))
    fast_decode_plan(w, torch.tensor([0, 2], dtype=torch.int32),
                     torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32),
                     8, 2, 128, 16, kv_data_type=E4M3)
    assert (w._q_dtype, w._kv_dtype) == (torch.float16, E4M3)


def test_append_rejects_other_casts_on_cpu():
    rows = torch.randn(3, 2, 128, dtype=torch.float32)
    k = torch.zeros(2, 16, 2, 128, dtype=E4M3)
    i32 = lambda *x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    args = (i32(0, 0, 0), i32(0, 1, 2), (k, k.clone()), i32(0), i32(0, 1), i32(3))
    with pytest.raises(ValueError, match="k_cache must have the dtype of append_key"):
        flashinfer.append_paged_kv_cache(rows, rows, *args)
    with pytest.raises(ValueError, match="v_cache must have k_cache's dtype"):
        flashinfer.append_paged_kv_cache(rows.half(), rows.half(), *args[:2],
                                         (k, k.float().to(E5M2)), *args[3:])


# -- GPU -------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("q_dtype, kv_dtype, head_dim, group", [
    (torch.float16, E4M3, 128, 4), (torch.bfloat16, E4M3, 128, 4), (torch.float16, E5M2, 128, 1),
    (torch.bfloat16, E5M2, 128, 8), (torch.bfloat16, E4M3, 64, 4), (torch.float16, E4M3, 256, 2),
])
def test_batch_decode_fp8(q_dtype, kv_dtype, head_dim, group, decode_shape):
    gen = torch.Generator().manual_seed(1)
    hkv, page = 2, 16
    kv_lens = [1, 17, 300, 2049, 64]
    cache, indptr, indices, last, seqs = _fp8_paged(kv_lens, page, hkv, head_dim, kv_dtype,
                                                    gen=gen)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, hkv * group, hkv, head_dim, page, q_data_type=q_dtype,
           kv_data_type=kv_dtype)
    if decode_shape is not None:
        assert w._plan.cta == (4 if decode_shape == 5 and head_dim > 128 else decode_shape)
    q = torch.randn(len(kv_lens), hkv * group, head_dim, generator=gen).to(q_dtype).cuda()
    o, lse = w.run(q, cache, return_lse=True)
    assert o.dtype == q_dtype
    _check(o, lse, q, seqs, q_dtype)
    # Calibration scales: k_scale (and q_scale) fold into the logits, v_scale into the output.
    o2 = w.run(q, cache, q_scale=0.5, k_scale=1.5, v_scale=0.25)
    _check(o2, None, q, seqs, q_dtype, sm_scale=0.75 / math.sqrt(head_dim), v_scale=0.25)


@pytest.mark.gpu
@pytest.mark.parametrize("q_dtype, kv_dtype, q_mult", [
    (torch.bfloat16, E4M3, 3e4), (torch.bfloat16, E5M2, 1e-3), (torch.float16, E4M3, 1.0)])
@pytest.mark.parametrize("kv_lens", [[9000], [0, 1, 16, 17, 4111], [33, 33, 33]])
def test_fp8_decode_converted_in_registers(q_dtype, kv_dtype, q_mult, kv_lens, decode_shape):
    """The decode shapes at head_dim 128 convert fp8 K/V in registers and compute S in fp16: a
    bfloat16 q past fp16's range (|q| up to ~1e5, scaled into it by a power of two) or tiny,
    batch 1 (split KV and its merge), empty and one-key requests, lengths at page edges."""
    gen = torch.Generator().manual_seed(len(kv_lens) + int(q_mult > 1))
    hkv, group, d, page = 2, 4, 128, 16
    cache, indptr, indices, last, seqs = _fp8_paged(kv_lens, page, hkv, d, kv_dtype, gen=gen)
    sm_scale = 1.0 / (q_mult * math.sqrt(d))
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, hkv * group, hkv, d, page, q_data_type=q_dtype,
           kv_data_type=kv_dtype, sm_scale=sm_scale)
    q = (torch.randn(len(kv_lens), hkv * group, d, generator=gen) * q_mult).to(q_dtype).cuda()
    assert q.abs().max().item() > 65504 or q_mult <= 1
    o, lse = w.run(q, cache, return_lse=True)
    assert torch.isfinite(o).all()
    tol = TOL[q_dtype]
    for b, (k, v) in enumerate(seqs):
        if not kv_lens[b]:
            assert torch.all(o[b] == 0) and torch.all(lse[b] == float("-inf"))
            continue
        ro, rl = attention_ref(q[b:b + 1], k, v, sm_scale=sm_scale)
        torch.testing.assert_close(o[b:b + 1].double(), ro, **tol)
        torch.testing.assert_close(lse[b:b + 1].double(), rl, atol=2e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("layout, tuple_form", [("NHD", True), ("HND", False)])
@pytest.mark.parametrize("opts", [dict(), dict(window_left=40), dict(logits_soft_cap=5.0)])
def test_batch_decode_fp8_options(layout, tuple_form, opts):
    gen = torch.Generator().manual_seed(2)
    q_dtype, kv_dtype, hkv, group, d, page = torch.bfloat16, E4M3, 4, 4, 128, 16
    kv_lens = [7, 333, 1024, 4100]
    cache, indptr, indices, last, seqs = _fp8_paged(kv_lens, page, hkv, d, kv_dtype, layout,
                                                    tuple_form, gen)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), layout)
    w.plan(indptr, indices, last, hkv * group, hkv, d, page, q_data_type=q_dtype,
           kv_data_type=kv_dtype, **opts)
    q = torch.randn(len(kv_lens), hkv * group, d, generator=gen).to(q_dtype).cuda()
    o = w.run(q, cache, k_scale=0.8, v_scale=1.25)
    ref = {"window_left": opts.get("window_left", -1), "soft_cap": opts.get("logits_soft_cap")}
    _check(o, None, q, seqs, q_dtype, sm_scale=0.8 / math.sqrt(d), v_scale=1.25, **ref)


@pytest.mark.gpu
def test_cuda_graph_fp8_decode_capture_replan_replay():
    gen = torch.Generator().manual_seed(3)
    q_dtype, kv_dtype, hq, hkv, d, page, batch = torch.float16, E4M3, 16, 4, 128, 16, 4
    second = [4000, 1, 333, 2048]
    first = [10, 1, 30, 50]
    cache, indptr2, indices2, last2, seqs2 = _fp8_paged(second, page, hkv, d, kv_dtype, gen=gen)
    pages = [-(-n // page) for n in first]
    indices = torch.cat([indices2[indptr2[b]:indptr2[b] + pages[b]] for b in range(batch)])
    indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(first, pages)], dtype=torch.int32)
    seqs = [(k[:n], v[:n]) for (k, v), n in zip(seqs2, first)]
    w = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        _ws(), torch.empty(batch + 1, dtype=torch.int32, device="cuda"),
        torch.empty(1000, dtype=torch.int32, device="cuda"),
        torch.empty(batch, dtype=torch.int32, device="cuda"), "NHD", True)
    q = torch.randn(batch, hq, d, generator=gen).to(q_dtype).cuda()
    out = torch.empty_like(q)
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=q_dtype, kv_data_type=kv_dtype)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        w.run(q, cache, out=out, k_scale=0.5, v_scale=2.0)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, out=out, k_scale=0.5, v_scale=2.0)
    graph.replay()
    sm = 0.5 / math.sqrt(d)
    _check(out, None, q, seqs, q_dtype, sm_scale=sm, v_scale=2.0)
    w.plan(indptr2, indices2, last2, hq, hkv, d, page, q_data_type=q_dtype,
           kv_data_type=kv_dtype)
    graph.replay()
    _check(out, None, q, seqs2, q_dtype, sm_scale=sm, v_scale=2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("q_dtype, kv_dtype", [(torch.bfloat16, E4M3), (torch.float16, E5M2)])
@pytest.mark.parametrize("opts", [dict(causal=True), dict(causal=True, window_left=100),
                                  dict(causal=True, logits_soft_cap=8.0)])
@pytest.mark.parametrize("backend", ["auto", "fa2"])
def test_batch_paged_prefill_fp8(q_dtype, kv_dtype, opts, backend):
    gen = torch.Generator().manual_seed(4)
    hq, hkv, d, page = 8, 2, 128, 16
    qo_lens, kv_lens = [1, 200, 37, 512], [1, 700, 37, 1500]
    cache, indptr, indices, last, seqs = _fp8_paged(kv_lens, page, hkv, d, kv_dtype, "HND",
                                                    gen=gen)
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), "HND", backend=backend)
    w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, page, q_data_type=q_dtype,
           kv_data_type=kv_dtype, **opts)
    assert w._plan.cta != 3  # fp8 K/V: the FA2 kernel, also under "auto" on a Hopper GPU
    q = torch.randn(sum(qo_lens), hq, d, generator=gen).to(q_dtype).cuda()
    o, lse = w.run(q, cache, k_scale=1.25, v_scale=0.5, return_lse=True)
    ref = {"causal": True, "window_left": opts.get("window_left", -1),
           "soft_cap": opts.get("logits_soft_cap")}
    _check(o, lse, q, seqs, q_dtype, qo_indptr.tolist(), sm_scale=1.25 / math.sqrt(d),
           v_scale=0.5, **ref)


@pytest.mark.gpu
@pytest.mark.parametrize("q_dtype, kv_dtype, causal", [(torch.float16, E4M3, True),
                                                       (torch.bfloat16, E5M2, False)])
def test_batch_ragged_prefill_fp8(q_dtype, kv_dtype, causal):
    gen = torch.Generator().manual_seed(5)
    hq, hkv, d = 16, 4, 128
    qo_lens, kv_lens = [5, 130, 64], [9, 400, 64]
    qi = [0] + torch.tensor(qo_lens).cumsum(0).tolist()
    ki = [0] + torch.tensor(kv_lens).cumsum(0).tolist()
    q = torch.randn(qi[-1], hq, d, generator=gen).to(q_dtype).cuda()
    k = (torch.randn(ki[-1], hkv, d, generator=gen) * 2).to(kv_dtype).cuda()
    v = (torch.randn(ki[-1], hkv, d, generator=gen) * 2).to(kv_dtype).cuda()
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws())
    w.plan(torch.tensor(qi, dtype=torch.int32), torch.tensor(ki, dtype=torch.int32), hq, hkv, d,
           causal=causal, q_data_type=q_dtype, kv_data_type=kv_dtype)
    o, lse = w.run(q, k, v, return_lse=True)
    seqs = [(k[ki[b]:ki[b + 1]].double(), v[ki[b]:ki[b + 1]].double()) for b in range(3)]
    _check(o, lse, q, seqs, q_dtype, qi, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_len", [1, 300, 9000])
def test_single_decode_and_prefill_fp8(kv_len):
    gen = torch.Generator().manual_seed(6)
    hq, hkv, d = 8, 2, 128
    k = (torch.randn(kv_len, hkv, d, generator=gen) * 2).to(E5M2).cuda()
    v = (torch.randn(kv_len, hkv, d, generator=gen) * 2).to(E5M2).cuda()
    q = torch.randn(hq, d, generator=gen).to(torch.bfloat16).cuda()
    o = flashinfer.single_decode_with_kv_cache(q, k, v, q_scale=2.0, k_scale=0.5, v_scale=3.0)
    assert o.dtype == torch.bfloat16
    _check(o[None], None, q[None], [(k.double(), v.double())], torch.bfloat16, v_scale=3.0)
    qp = torch.randn(min(kv_len, 64), hq, d, generator=gen).to(torch.bfloat16).cuda()
    op, lse = flashinfer.single_prefill_with_kv_cache(qp, k, v, causal=True, k_scale=0.5,
                                                      return_lse=True)
    _check(op, lse, qp, [(k.double(), v.double())], torch.bfloat16, [0, qp.shape[0]],
           causal=True, sm_scale=0.5 / math.sqrt(d))


@pytest.mark.gpu
@pytest.mark.parametrize("row_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kv_dtype", [E4M3, E5M2])
def test_append_casts_half_rows_into_an_fp8_cache(row_dtype, kv_dtype):
    gen = torch.Generator().manual_seed(7)
    hkv, d, page = 2, 128, 16
    kv_lens = [5, 40]
    nnz = sum(kv_lens)
    k = (torch.randn(nnz, hkv, d, generator=gen) * 3).to(row_dtype).cuda()
    v = (torch.randn(nnz, hkv, d, generator=gen) * 3).to(row_dtype).cuda()
    big = 1e30 if row_dtype == torch.bfloat16 else 6e4
    k[0, 0, :4] = torch.tensor([big, -big, float("nan"), 1e-3], dtype=row_dtype)
    num_pages = 8
    cache = torch.zeros(num_pages, 2, page, hkv, d, dtype=torch.uint8, device="cuda").view(kv_dtype)
    indptr = torch.tensor([0, 1, 4], dtype=torch.int32, device="cuda")
    indices = torch.tensor([6, 0, 3, 5], dtype=torch.int32, device="cuda")
    last = torch.tensor([5, 8], dtype=torch.int32, device="cuda")
    append_indptr = torch.tensor([0, 5, nnz], dtype=torch.int32, device="cuda")
    seq_lens = flashinfer.get_seq_lens(indptr, last, page)
    bi, pos = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    flashinfer.append_paged_kv_cache(k, v, bi, pos, cache, indices, indptr, last)
    fmax = torch.finfo(kv_dtype).max
    for t in range(nnz):
        b = int(bi[t])
        page_id = int(indices[int(indptr[b]) + int(pos[t]) // page])
        slot = int(pos[t]) % page
        for which, rows in ((0, k), (1, v)):
            got = cache[page_id, which, slot]
            # A plain cast, saturating: torch's own cast after clamping to the finite range.
            want = rows[t].float().clamp(-fmax, fmax).to(kv_dtype)
            assert torch.equal(got.view(torch.uint8)[~rows[t].isnan()],
                               want.view(torch.uint8)[~rows[t].isnan()])
            assert got.float()[rows[t].isnan()].isnan().all()
    # And decode over the appended cache reads what was written.
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws())
    w.plan(indptr, indices, last, 4 * hkv, hkv, d, page, q_data_type=row_dtype,
           kv_data_type=kv_dtype)
    q = torch.randn(2, 4 * hkv, d, generator=gen).to(row_dtype).cuda()
    k_ok = k.clone()
    k_ok[0, 0, :4] = 0  # the saturated and NaN entries stay out of the attention check
    cache.view(torch.uint8).zero_()
    flashinfer.append_paged_kv_cache(k_ok, v, bi, pos, cache, indices, indptr, last)
    o = w.run(q, cache)
    seqs = [(k_ok[int(append_indptr[b]):int(append_indptr[b + 1])].to(kv_dtype).double(),
             v[int(append_indptr[b]):int(append_indptr[b + 1])].to(kv_dtype).double())
            for b in range(2)]
    _check(o, None, q, seqs, row_dtype)


@pytest.mark.gpu
def test_fp8_decode_module_is_the_fa2_kernel_and_reports_no_hopper_shape():
    v = AttentionVariant("bfloat16", "bfloat16", 128, "none", "NONE", True, "float8_e4m3fn")
    module = attention_runtime.get_attention_module(v)
    assert module.cta_tile_q(3) == 0
    assert [module.cta_tile_q(c) for c in (0, 1, 2, 4, 5)] == [16, 64, 128, 16, 16]

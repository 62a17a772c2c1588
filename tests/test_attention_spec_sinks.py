"""Issue 21's speculative-decoding and attention-sink options of the attention wrappers.

* ``BatchDecodeWithPagedKVCacheWrapper.plan(..., q_len_per_req=n)``: each request brings n query
  rows (q is ``(batch * n, Hq, D)``), causal among themselves at the end of the request's keys
  (row j sees ``kv_len - n + j + 1`` keys); tensor-core path, CUDA-graph mode too.
* ``run(..., sinks=)`` on the decode and prefill wrappers: a float32 logit per query head that
  joins every row's softmax sum (``exp(sinks[h])``, no value row); the lse includes it.

CPU tests check the plumbing (a fake module records the launch record) and every validation
error; GPU tests compare with the float64 reference of tests/attention_ref.py, the sink folded
in by ``sink_ref``."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import test_serving_engines as engines
import torch
from attention_ref import LN2, attention_ref, make_paged

import flashinfer
import flashinfer.attention.runtime as rt
from flashinfer import fast_decode_plan

HQ, HKV, D, PAGE = 8, 2, 64, 16
# The fixture ``fake``: the compiled module replaced by one that records each run's arguments.
fake = engines.fake


def sink_ref(q, k, v, sinks=None, **kw):
    """attention_ref with attention sinks: (o, lse base 2) of the keys plus, per head h, one
    logit ``sinks[h]`` that adds to the softmax sum and nothing to the output."""
    o, lse = attention_ref(q, k, v, **kw)
    if sinks is None:
        return o, lse
    nat = lse * LN2
    total = torch.logaddexp(nat, sinks.double().to(nat.device)[None, :].expand_as(nat))
    return o * torch.exp(nat - total)[..., None], total / LN2


# ----------------------------------------------------------------------------- CPU plumbing


def _field(rec: torch.Tensor, name: str) -> int:
    return int(rec[rt.RUN_PARAMS.index(name)])


def _i32(x):
    return torch.tensor(x, dtype=torch.int32)


def _ws():
    return torch.empty(1 << 20, dtype=torch.uint8)


def _graph_bufs(batch, pages=16, device="cpu"):
    return dict(use_cuda_graph=True,
                paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=torch.zeros(pages, dtype=torch.int32, device=device),
                paged_kv_last_page_len_buffer=torch.zeros(batch, dtype=torch.int32,
                                                          device=device))


def _decode(q_len=1, tensor_cores=True, **kw):
    """Two requests of 21 and 16 keys (pages 4, 0 | 2)."""
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), use_tensor_cores=tensor_cores,
                                                      **kw)
    w.plan(_i32([0, 2, 3]), _i32([4, 0, 2]), _i32([5, 16]), HQ, HKV, D, PAGE,
           q_data_type=torch.float16, q_len_per_req=q_len)
    return w


def _cache():
    return torch.randn(5, 2, PAGE, HKV, D).half()


def _paged():
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws())
    w.plan(_i32([0, 3, 4]), _i32([0, 2, 3]), _i32([4, 0, 2]), _i32([5, 16]), HQ, HKV, D, PAGE,
           q_data_type=torch.float16)
    return w, (_cache(),)


def _ragged():
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws())
    w.plan(_i32([0, 3, 4]), _i32([0, 20, 40]), HQ, HKV, D, q_data_type=torch.float16)
    return w, (torch.randn(40, HKV, D).half(),) * 2


def _decode_pair():
    return _decode(), (_cache(),)


WRAPPERS = {"decode": _decode_pair, "paged prefill": _paged, "ragged prefill": _ragged}


def _q(w):
    rows = w._batch * w._q_len_per_req if hasattr(w, "_q_len_per_req") else w._plan.num_rows
    return torch.randn(rows, HQ, D).half()


@pytest.mark.parametrize("kind", WRAPPERS)
def test_sinks_reach_the_launch_record(kind, fake):
    """The record carries the sinks' address for the calls that pass them, 0 otherwise."""
    w, kv = WRAPPERS[kind]()
    q = _q(w)
    sinks = torch.randn(HQ)
    w.run(q, *kv)
    assert _field(fake.calls[-1][5], "sinks") == 0
    w.run(q, *kv, sinks=sinks)
    assert _field(fake.calls[-1][5], "sinks") == sinks.data_ptr()
    other = torch.randn(HQ)
    w.run(q, *kv, sinks=other, return_lse=True)
    assert _field(fake.calls[-1][5], "sinks") == other.data_ptr()
    w.run(q, *kv)
    assert _field(fake.calls[-1][5], "sinks") == 0


@pytest.mark.parametrize("kind", WRAPPERS)
@pytest.mark.parametrize("bad,error,match", [
    (torch.randn(HQ).half(), ValueError, "sinks must be float32, got float16"),
    (torch.randn(HQ, dtype=torch.float64), ValueError, "sinks must be float32"),
    (torch.randn(HQ + 1), ValueError, r"sinks must be a contiguous tensor of shape \(8,\)"),
    (torch.randn(1, HQ), ValueError, r"shape \(8,\).*got shape \(1, 8\)"),
    (torch.randn(2 * HQ)[::2], ValueError, r"got shape \(8,\) stride \(2,\)"),
    (torch.empty(HQ, device="meta"), ValueError, "sinks must be on q's device"),
    ([0.0] * HQ, TypeError, "sinks must be a torch.Tensor or None, got list"),
])
def test_sinks_validation(kind, bad, error, match, fake):
    w, kv = WRAPPERS[kind]()
    with pytest.raises(error, match=match):
        w.run(_q(w), *kv, sinks=bad)
    assert not fake.calls  # refused before any launch


def test_decode_q_len_per_req_plan(fake):
    """q_len_per_req=3: a causal plan of 3 rows per request, qo_indptr 0, 3, 6."""
    w = _decode(q_len=3)
    assert w._variant.mask_mode == "causal" and w._plan.num_rows == 6
    assert w._qo_indptr.tolist() == [0, 3, 6]
    q = torch.randn(6, HQ, D).half()
    out = w.run(q, _cache())
    assert out.shape == (6, HQ, D)
    assert _field(fake.calls[-1][5], "qo_indptr") == w._qo_indptr.data_ptr()
    o, lse = w.run(q, _cache(), return_lse=True)
    assert lse.shape == (6, HQ)
    one = _decode(q_len=1)
    assert one._variant.mask_mode == "none" and one._qo_indptr.tolist() == [0, 1, 2]


def test_decode_q_len_per_req_in_run_is_deprecated(fake):
    w = _decode(q_len=2)
    q = torch.randn(4, HQ, D).half()
    with pytest.warns(DeprecationWarning, match="q_len_per_req"):
        w.run(q, _cache(), q_len_per_req=2)
    with pytest.warns(DeprecationWarning), pytest.raises(
            ValueError, match=r"q.shape\[0\] \(4\) must be batch_size \* q_len_per_req \(2 \* 3\)"):
        w.run(q, _cache(), q_len_per_req=3)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="as planned"):
        w.run(torch.randn(2, HQ, D).half(), _cache(), q_len_per_req=1)


@pytest.mark.parametrize("rows", [2, 3, 6])
def test_decode_q_rows_must_match_q_len_per_req(rows, fake):
    w = _decode(q_len=2)
    with pytest.raises(ValueError, match=r"batch_size \* q_len_per_req = 2 \* 2 rows"):
        w.run(torch.randn(rows, HQ, D).half(), _cache())
    assert not fake.calls


def test_decode_q_len_per_req_plan_errors(fake):
    with pytest.raises(ValueError, match="needs tensor-core decode"):
        _decode(q_len=2, tensor_cores=False)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="q_len_per_req must be an int >= 1"):
            _decode(q_len=bad)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), use_tensor_cores=True)
    with pytest.raises(ValueError, match="needs kv_len >= q_len_per_req .* kv_len 3"):
        w.plan(_i32([0, 1, 2]), _i32([0, 1]), _i32([3, 16]), HQ, HKV, D, PAGE,
               q_data_type=torch.float16, q_len_per_req=4)
    with pytest.raises(ValueError, match="needs tensor-core decode"):
        fast_decode_plan(flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws()), _i32([0, 1]),
                         _i32([0]), _i32([16]), HQ, HKV, D, PAGE, q_len_per_req=2)


def test_decode_q_len_per_req_frozen_in_graph_mode(fake):
    w = _decode(q_len=2, **_graph_bufs(2))
    w.plan(_i32([0, 2, 3]), _i32([4, 0, 2]), _i32([9, 16]), HQ, HKV, D, PAGE,
           q_data_type=torch.float16, q_len_per_req=2)  # another batch, same q_len: fine
    with pytest.raises(ValueError, match="q_len_per_req is fixed by the first plan to 2"):
        w.plan(_i32([0, 2, 3]), _i32([4, 0, 2]), _i32([5, 16]), HQ, HKV, D, PAGE,
               q_data_type=torch.float16, q_len_per_req=1)


def test_fast_decode_plan_and_engine_plan_with_q_len_per_req(fake):
    """SGLang's fast_decode_plan and vLLM's _cached_module.plan path plan what plan() plans."""
    ref = _decode(q_len=2, **_graph_bufs(2))
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), use_tensor_cores=True,
                                                      **_graph_bufs(2))
    fast_decode_plan(w, _i32([0, 2, 3]), _i32([4, 0, 2]), _i32([5, 16]), HQ, HKV, D, PAGE,
                     q_data_type=torch.float16, q_len_per_req=2)
    assert w._plan == ref._plan and torch.equal(w._plan_dev, ref._plan_dev)
    assert w._variant == ref._variant and w._qo_indptr.tolist() == [0, 2, 4]
    w._paged_kv_indices_buf[:3].copy_(_i32([1, 3, 2]))
    args = [w._float_workspace_buffer, w._int_workspace_buffer, None, _i32([0, 2, 4]),
            _i32([0, 1, 3]), _i32([7, 30]), 4, 2, HQ, HKV, PAGE, True, D, D, True, -1]
    w._cached_module.plan(*args)
    ref.plan(_i32([0, 1, 3]), _i32([1, 3, 2]), _i32([7, 14]), HQ, HKV, D, PAGE,
             q_data_type=torch.float16, q_len_per_req=2)
    assert w._plan == ref._plan and torch.equal(w._plan_dev, ref._plan_dev)
    with pytest.raises(ValueError, match="causal must be True for decode with q_len_per_req=2"):
        w._cached_module.plan(*args[:14], False, -1)
    with pytest.raises(ValueError, match="qo_indptr must be 0, 2, ..., 4"):
        w._cached_module.plan(*args[:3], _i32([0, 1, 2]), *args[4:6], 2, *args[7:])


@pytest.mark.parametrize("kind", WRAPPERS)
def test_legacy_forward_signatures(kind, fake):
    """forward / forward_return_lse keep FlashInfer's parameters and positional order, warn,
    and refuse unknown names."""
    w, kv = WRAPPERS[kind]()
    inputs = {"decode": ["q", "paged_kv_cache"], "paged prefill": ["q", "paged_kv_cache"],
              "ragged prefill": ["q", "k", "v"]}[kind]
    for method in (w.forward, w.forward_return_lse):
        names = list(inspect.signature(method).parameters)
        assert names[:len(inputs)] == inputs and "sm_scale" in names and "rope_theta" in names
    assert list(inspect.signature(w.forward).parameters)[len(inputs)] == \
        ("pos_encoding_mode" if kind == "decode" else "causal")
    q = _q(w)
    with pytest.warns(DeprecationWarning, match="forward_return_lse is deprecated"):
        o, lse = w.forward_return_lse(q, *kv, sm_scale=0.5)
    assert w._sm_scale == 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError):
            w.forward(q, *kv, sinks=torch.zeros(HQ))
        if kind != "decode":  # positional causal, as upstream's
            w.forward(q, *kv, True)
            assert w._causal is True


# ----------------------------------------------------------------------------- GPU, reference

TOL = {torch.float16: dict(atol=4e-3, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _gws():
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


def _indptr(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _check(o, lse, q, kvs, qo_lens, dtype, sinks=None, **kw):
    """o / lse (sum qo, Hq[, D]) of requests of qo_lens rows against sink_ref per request."""
    row = 0
    for (k, v), n in zip(kvs, qo_lens):
        ro, rl = sink_ref(q[row:row + n], k, v, sinks, **kw)
        torch.testing.assert_close(o[row:row + n].double(), ro, **TOL[dtype])
        if lse is not None:
            got = lse[row:row + n].double()
            finite = torch.isfinite(rl)
            assert torch.equal(torch.isfinite(got), finite)
            torch.testing.assert_close(got[finite], rl[finite], atol=2e-3, rtol=1e-3)
        row += n


def _sinks(hq, gen):
    return (torch.rand(hq, generator=gen) * 6 - 3).cuda()


SPEC_OPTIONS = {
    "plain": {},
    "soft cap, window": dict(logits_soft_cap=30.0, window_left=90),
    "sinks": dict(sinks=True),
    "sinks, soft cap, window, HND": dict(sinks=True, logits_soft_cap=20.0, window_left=33,
                                         layout="HND"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("q_len", [2, 4])
@pytest.mark.parametrize("heads", [(32, 8), (16, 2)])
@pytest.mark.parametrize("option", SPEC_OPTIONS)
def test_decode_q_len_per_req(q_len, heads, option):
    """Multi-token decode against the reference: GQA groups of 4 (16 packed rows: the decode
    shapes) and 8 (32 rows: the 64-row shape), pages shuffled, requests of exactly q_len keys
    and of several thousand (split KV), soft cap, window, sinks, NHD and HND."""
    gen = torch.Generator().manual_seed(100 * q_len + heads[1])
    opts = dict(SPEC_OPTIONS[option])
    layout = opts.pop("layout", "NHD")
    use_sinks = opts.pop("sinks", False)
    hq, hkv = heads
    dtype, d, page = (torch.bfloat16 if hkv == 8 else torch.float16), 128, 16
    kv_lens = [q_len, 37, 2100, 130, 5000]
    cache, indptr, indices, last, kvs = make_paged(kv_lens, page, hkv, d, dtype, "cuda",
                                                   layout=layout, gen=gen)
    q = torch.randn(len(kv_lens) * q_len, hq, d, generator=gen).to(dtype).cuda()
    sinks = _sinks(hq, gen) if use_sinks else None
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_gws(), layout, use_tensor_cores=True)
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype, q_len_per_req=q_len,
           **opts)
    o, lse = w.run(q, cache, sinks=sinks, return_lse=True)
    _check(o, lse, q, kvs, [q_len] * len(kv_lens), dtype, sinks, causal=True,
           window_left=opts.get("window_left", -1), soft_cap=opts.get("logits_soft_cap"))


@pytest.mark.gpu
@pytest.mark.parametrize("use_sinks", [False, True])
def test_decode_q_len_per_req_cuda_graph_replan(use_sinks):
    """CUDA-graph wrapper, q_len_per_req 3: run captured once, then the batch re-planned with
    other page counts and lengths (and the sinks' values changed in place) before each
    replay."""
    gen = torch.Generator().manual_seed(7)
    dtype, hq, hkv, d, page, q_len, batch = torch.bfloat16, 32, 8, 128, 16, 3, 4
    lens = [[3, 40, 700, 16], [2500, 3, 17, 300], [64, 64, 1, 9]]
    lens[2][2] = 3  # every request holds its q_len new tokens
    cache, indptr_all, indices_all, _, seqs = make_paged([max(c) for c in zip(*lens)], page,
                                                         hkv, d, dtype, "cuda", gen=gen)
    bufs = _graph_bufs(batch, indices_all.numel() + 8, "cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_gws(), "NHD", use_tensor_cores=True,
                                                      **bufs)
    sinks = _sinks(hq, gen) if use_sinks else None

    def plan(kv_lens):
        pages = [-(-n // page) for n in kv_lens]
        ids = torch.cat([indices_all[int(indptr_all[b]):int(indptr_all[b]) + pages[b]]
                         for b in range(batch)])
        last = torch.tensor([n - (p - 1) * page for n, p in zip(kv_lens, pages)],
                            dtype=torch.int32)
        w.plan(_indptr(pages), ids, last, hq, hkv, d, page, q_data_type=dtype,
               q_len_per_req=q_len, logits_soft_cap=25.0)

    q = torch.randn(batch * q_len, hq, d, generator=gen).to(dtype).cuda()
    out = torch.empty_like(q)
    lse = torch.empty(batch * q_len, hq, dtype=torch.float32, device="cuda")
    plan(lens[0])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        w.run(q, cache, out=out, lse=lse, sinks=sinks)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, out=out, lse=lse, sinks=sinks)
    for step, kv_lens in enumerate(lens):
        plan(kv_lens)
        if sinks is not None and step:
            sinks.mul_(-1.5)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        kvs = [(k[:n], v[:n]) for (k, v), n in zip(seqs, kv_lens)]
        _check(out, lse, q, kvs, [q_len] * batch, dtype, sinks, causal=True, soft_cap=25.0)
    with pytest.raises(ValueError, match="q_len_per_req is fixed by the first plan"):
        w.plan(_indptr([1] * batch), indices_all[:batch], _i32([16] * batch), hq, hkv, d, page,
               q_data_type=dtype, q_len_per_req=1)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["decode", "decode split", "decode graph", "paged fa2",
                                  "paged auto", "paged auto split", "ragged fa2", "ragged auto"])
def test_sinks_against_the_reference(case):
    """Sinks on every kernel path: decode (one request split over the SMs: cluster merge; the
    CUDA-graph wrapper: counted merge), paged and ragged prefill on the FA2 kernel and, where
    the GPU has it, the Hopper kernel (whose split rows go through the merge kernel); causal
    with a request of more rows than keys (rows that see no key: output 0, lse = the sink),
    GQA, soft cap and window."""
    gen = torch.Generator().manual_seed(sum(map(ord, case)))
    dtype, hq, hkv, d, page = torch.bfloat16, 32, 8, 128, 16
    sinks = _sinks(hq, gen)
    kind, _, variant = case.partition(" ")
    opts = dict(logits_soft_cap=40.0) if "fa2" in case else dict(window_left=300)
    if kind == "decode":
        kv_lens = [9000] if variant == "split" else [1, 300, 2049, 17, 4096]
        qo_lens = [1] * len(kv_lens)
        cache, indptr, indices, last, kvs = make_paged(kv_lens, page, hkv, d, dtype, "cuda",
                                                       gen=gen)
        bufs = _graph_bufs(len(kv_lens), indices.numel(), "cuda") if variant == "graph" else {}
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_gws(), "NHD", **bufs)
        w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype, **opts)
        inputs = (cache,)
        causal = False
    else:
        backend = "fa2" if "fa2" in case else "auto"
        qo_lens, kv_lens = ([100], [9000]) if variant == "split" else \
            ([40, 300, 1, 129], [10, 700, 64, 129])
        causal = True
        if kind == "paged":
            cache, indptr, indices, last, kvs = make_paged(kv_lens, page, hkv, d, dtype, "cuda",
                                                           gen=gen)
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_gws(), "NHD", backend=backend)
            w.plan(_indptr(qo_lens), indptr, indices, last, hq, hkv, d, page, causal=True,
                   q_data_type=dtype, **opts)
            inputs = (cache,)
        else:
            kvs = [(torch.randn(n, hkv, d, generator=gen).to(dtype).cuda(),
                    torch.randn(n, hkv, d, generator=gen).to(dtype).cuda()) for n in kv_lens]
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_gws(), backend=backend)
            w.plan(_indptr(qo_lens), _indptr(kv_lens), hq, hkv, d, causal=True,
                   q_data_type=dtype, **opts)
            inputs = (torch.cat([k for k, _ in kvs]), torch.cat([v for _, v in kvs]))
    if variant == "split":
        assert w._plan.split_kv, w._plan
    q = (torch.randn(sum(qo_lens), hq, d, generator=gen) * 2).to(dtype).cuda()
    o, lse = w.run(q, *inputs, sinks=sinks, return_lse=True)
    ref_kw = dict(causal=causal, window_left=opts.get("window_left", -1),
                  soft_cap=opts.get("logits_soft_cap"))
    _check(o, lse, q, kvs, qo_lens, dtype, sinks, **ref_kw)
    # The same wrapper without sinks is the plain reference again (the launch record resets).
    o2, lse2 = w.run(q, *inputs, return_lse=True)
    row = 0
    for (k, v), n in zip(kvs, qo_lens):
        ro, _ = attention_ref(q[row:row + n], k, v, **ref_kw)
        torch.testing.assert_close(o2[row:row + n].double(), ro, **TOL[dtype])
        row += n
    # Sinks of -inf add nothing.
    o3 = w.run(q, *inputs, sinks=torch.full((hq,), -math.inf, device="cuda"))
    torch.testing.assert_close(o3, o2, atol=1e-3, rtol=0)

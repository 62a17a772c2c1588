"""flashinfer.decode: single and batch decode (both use_tensor_cores values, CUDA graphs)."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from attention_ref import attention_ref, make_paged

import flashinfer
from flashinfer.attention import plan as attention_plan
from flashinfer.attention import runtime as attention_runtime

TOL = {torch.float16: dict(atol=4e-3, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _ws(mb=128):
    return torch.empty(mb << 20, dtype=torch.uint8, device="cuda")


FORCED = {"auto": None, "two key streams": 4, "eight key streams": 5}


@pytest.fixture(params=list(FORCED))
def decode_shape(request, monkeypatch):
    """Runs a test with the CTA shape the plan picks, then with each other 16-row decode shape
    forced for every 16-row batch (the plan picks them by the batch's CTA count). Returns the
    shape the plan must have, given the one the plan picks by itself at that head_dim."""
    forced = FORCED[request.param]

    def shape(head_dim: int) -> int:  # no eight-stream shape at head_dim 256
        return 4 if forced == 5 and head_dim > 128 else forced

    if forced is not None:
        choose = attention_plan.choose_cta
        monkeypatch.setattr(attention_plan, "choose_cta", lambda rows, head_dim, *a, **kw:
                            shape(head_dim) if rows <= 16 else choose(rows, head_dim, *a, **kw))
    return lambda auto, head_dim=128: auto if forced is None else shape(head_dim)


def _small_batch_cta(head_dim: int) -> int:
    """The plan's own shape for a decode batch of at most one CTA per SM."""
    return 5 if head_dim <= 128 else 0


def _check(o, lse, q, seqs, dtype, **kw):
    for b, (k, v) in enumerate(seqs):
        ro, rl = attention_ref(q[b:b + 1], k, v, **kw)
        torch.testing.assert_close(o[b].double(), ro[0], **TOL[dtype])
        if lse is not None:
            finite = torch.isfinite(rl[0])
            assert torch.equal(torch.isfinite(lse[b]), finite)
            torch.testing.assert_close(lse[b][finite].double(), rl[0][finite], atol=2e-3,
                                       rtol=1e-3)


def test_decode_plan_positional_options_warn_on_cpu():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    with pytest.raises(KeyError):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                   torch.tensor([1], dtype=torch.int32), 4, 4, 128, 16, "ROPE")
    with pytest.warns(DeprecationWarning):
        with pytest.raises(KeyError):
            w.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                   torch.tensor([1], dtype=torch.int32), 4, 4, 128, 16, "BAD")


def test_decode_single_validation_on_cpu():
    q = torch.randn(8, 128, dtype=torch.float16)
    k = torch.randn(10, 2, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="2-D"):
        flashinfer.single_decode_with_kv_cache(q[None], k, k)
    with pytest.raises(ValueError, match="CUDA"):
        flashinfer.single_decode_with_kv_cache(q, k, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("use_tensor_cores", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_batch_decode(dtype, head_dim, group, use_tensor_cores, page_size, decode_shape):
    gen = torch.Generator().manual_seed(head_dim + group + page_size)
    hkv = 2
    kv_lens = [1, 0, 17, 513, 64, 1000, 3]
    cache, indptr, indices, last, seqs = make_paged(kv_lens, page_size, hkv, head_dim, dtype,
                                                    "cuda", "NHD", False, gen)
    q = torch.randn(len(kv_lens), hkv * group, head_dim, generator=gen).to(dtype).cuda()
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD",
                                                      use_tensor_cores=use_tensor_cores)
    w.plan(indptr, indices, last, hkv * group, hkv, head_dim, page_size, q_data_type=dtype)
    assert w._plan.cta == decode_shape(_small_batch_cta(head_dim), head_dim)
    o, lse = w.run(q, cache, return_lse=True)
    _check(o, lse, q, seqs, dtype)
    assert torch.all(o[1] == 0) and torch.all(lse[1] == float("-inf"))  # the empty request


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("opts", [dict(), dict(window_left=20), dict(logits_soft_cap=20.0),
                                  dict(pos_encoding_mode="ROPE_LLAMA"),
                                  dict(pos_encoding_mode="ALIBI")])
def test_batch_decode_options(layout, opts, decode_shape):
    gen = torch.Generator().manual_seed(7)
    dtype, hq, hkv, d, page = torch.float16, 8, 2, 128, 16
    kv_lens = [100, 33, 1, 257]
    cache, indptr, indices, last, seqs = make_paged(kv_lens, page, hkv, d, dtype, "cuda",
                                                    layout, True, gen)
    q = torch.randn(4, hq, d, generator=gen).to(dtype).cuda()
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), layout)
    w.plan(indptr, indices, last, hq, hkv, d, page, **opts)
    assert w._plan.cta == decode_shape(5)
    o = w.run(q, cache)
    _check(o, None, q, seqs, dtype, window_left=opts.get("window_left", -1),
           soft_cap=opts.get("logits_soft_cap"), pos_encoding=opts.get("pos_encoding_mode", "NONE"))


@pytest.mark.gpu
@pytest.mark.parametrize("kv_len", [1, 31, 2048, 4096, 131072])
def test_single_decode(kv_len):
    gen = torch.Generator().manual_seed(kv_len)
    dtype = torch.bfloat16
    q = torch.randn(32, 128, generator=gen).to(dtype).cuda()
    k = torch.randn(kv_len, 8, 128, generator=gen).to(dtype).cuda()
    v = torch.randn(kv_len, 8, 128, generator=gen).to(dtype).cuda()
    o, lse = flashinfer.single_decode_with_kv_cache(q, k, v, return_lse=True)
    ro, rl = attention_ref(q[None], k, v)
    torch.testing.assert_close(o.double(), ro[0], **TOL[dtype])
    torch.testing.assert_close(lse.double(), rl[0], atol=2e-3, rtol=1e-3)
    o2 = flashinfer.single_decode_with_kv_cache(q, k.transpose(0, 1), v.transpose(0, 1), "HND")
    torch.testing.assert_close(o2.double(), ro[0], **TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 512])
def test_tensor_core_and_cuda_core_decode_agree(batch):
    gen = torch.Generator().manual_seed(batch)
    dtype, hq, hkv, d, page = torch.bfloat16, 32, 8, 128, 16
    kv_lens = torch.randint(0, 300, (batch,), generator=gen).tolist()
    cache, indptr, indices, last, seqs = make_paged(kv_lens, page, hkv, d, dtype, "cuda", "NHD",
                                                    False, gen)
    q = torch.randn(batch, hq, d, generator=gen).to(dtype).cuda()
    outs = []
    for tc in (False, True):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", use_tensor_cores=tc)
        w.plan(indptr, indices, last, hq, hkv, d, page, data_type=dtype, q_data_type=dtype)
        outs.append(w.run(q, cache, return_lse=True))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-3, rtol=1e-3)
    _check(outs[1][0][:8], outs[1][1][:8], q[:8], seqs[:8], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_cuda_graph_capture_replan_replay(use_tensor_cores, decode_shape):
    gen = torch.Generator().manual_seed(8)
    dtype, hq, hkv, d, page, batch = torch.float16, 16, 4, 128, 16, 5
    max_pages = 600
    indptr_buf = torch.empty(batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.empty(max_pages, dtype=torch.int32, device="cuda")
    last_buf = torch.empty(batch, dtype=torch.int32, device="cuda")
    w = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        _ws(), indptr_buf, indices_buf, last_buf, "NHD", use_tensor_cores)
    assert w.is_cuda_graph_enabled
    q = torch.randn(batch, hq, d, generator=gen).to(dtype).cuda()
    out = torch.empty_like(q)
    # One cache (the captured run holds its pointer); the first plan uses a prefix of each
    # request's pages, the second (with a long sequence that splits) all of them.
    second = [4000, 1, 40, 333, 2048]
    first = [10, 1, 30, 40, 50]
    cache, indptr2, indices2, last2, seqs2 = make_paged(second, page, hkv, d, dtype, "cuda",
                                                        "NHD", False, gen)
    pages = [-(-n // page) for n in first]
    indices = torch.cat([indices2[indptr2[b]:indptr2[b] + pages[b]] for b in range(batch)])
    indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(first, pages)], dtype=torch.int32)
    seqs = [(k[:n], v[:n]) for (k, v), n in zip(seqs2, first)]
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype)
    assert w._plan.cta == decode_shape(5)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        w.run(q, cache, out=out)  # warm-up (compiles, allocates) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, out=out)
    graph.replay()
    _check(out, None, q, seqs, dtype)
    w.plan(indptr2, indices2, last2, hq, hkv, d, page, q_data_type=dtype)
    assert w._plan.cta == decode_shape(5)  # the captured shape
    graph.replay()
    _check(out, None, q, seqs2, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("group", [4, 8])
def test_split_kv_merged_in_the_kernel(group, decode_shape):
    """Split KV merged by the last CTA of each request (no merge kernel): many chunks (a count
    that is not a multiple of the merge's unroll), one-chunk and empty requests, eight packed
    rows per tile (more (row, column) pairs than threads); run twice, since the counters must
    be back at 0 for the second launch, and checked against the reference both times."""
    gen = torch.Generator().manual_seed(group)
    dtype, hkv, d, page = torch.bfloat16, 2, 128, 16
    hq = hkv * group
    kv_lens = [5000, 1, 0, 2049, 300]
    cache, indptr, indices, last, seqs = make_paged(kv_lens, page, hkv, d, dtype, "cuda", "NHD",
                                                    False, gen)
    q = torch.randn(len(kv_lens), hq, d, generator=gen).to(dtype).cuda()
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD")
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype, fixed_split_size=256)
    assert w._plan.split_kv and w._plan.cta == decode_shape(5)
    for _ in range(2):
        o, lse = w.run(q, cache, return_lse=True)
        _check(o, lse, q, seqs, dtype)
        assert torch.all(o[2] == 0) and torch.all(lse[2] == float("-inf"))
        assert int(w._ws.counters.abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("kv_len, group, head_dim, page", [
    (257, 4, 128, 16),     # two chunks, the second of one key
    (1000, 1, 64, 1),      # four chunks; a packed tile of 1 row of 16, page size 1
    (2000, 8, 128, 16),    # eight chunks, 16 packed rows, a ragged last page
    (2047, 4, 64, 7),      # eight chunks, odd page size
    (5000, 1, 64, 1),      # 16 chunks: more than an H100 wave of clusters holds (fallback)
    (32771, 8, 128, 16),
    (131072, 4, 128, 64),
])
def test_batch_one_split_merged_within_a_cluster(kv_len, group, head_dim, page):
    """Batch-1 split decode: the chunks' CTAs of each KV head merge in a thread-block cluster
    where one wave holds the clusters (then the float workspace, filled with NaN, keeps it,
    since no partial state goes there), the counted merge otherwise; lse and v_scale included,
    twice (nothing to reset between launches)."""
    gen = torch.Generator().manual_seed(kv_len)
    dtype, hkv = torch.bfloat16, 8  # 132 SMs / 8 heads: at most 16 chunks (a cluster's most)
    cache, indptr, indices, last, seqs = make_paged([kv_len], page, hkv, head_dim, dtype,
                                                    "cuda", "NHD", True, gen)
    q = torch.randn(1, hkv * group, head_dim, generator=gen).to(dtype).cuda()
    ws = _ws()
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, indices, last, hkv * group, hkv, head_dim, page, q_data_type=dtype)
    assert w._plan.cta == 5 and w._plan.split_kv and w._plan.cluster_merge
    ws.view(torch.float32).fill_(float("nan"))
    for _ in range(2):
        o, lse = w.run(q, cache, return_lse=True, v_scale=0.5)
        _check(o * 2, lse, q, seqs, dtype)
    # The same launch captured in a CUDA graph (as serving frameworks and the benchmarks run it).
    out, lse_out = torch.empty_like(o), torch.empty_like(lse)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, out=out, lse=lse_out)
    graph.replay()
    _check(out, lse_out, q, seqs, dtype)
    # Where one wave holds the clusters (compute capability 9.0; the GPU's SMs per GPC):
    module = attention_runtime.get_attention_module(w._variant)
    if module.cluster_capacity(5, w._plan.num_items) >= hkv:
        assert torch.isnan(ws.view(torch.float32)).all()
    assert int(w._ws.counters.abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_batch_of_one_wave_takes_two_key_streams(dtype):
    """A batch of three CTAs per SM (no split) takes the two-key-stream shape by itself."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator().manual_seed(sms)
    hq, hkv, d, page = 32, 8, 128, 16
    batch = -(-3 * sms // hkv)
    kv_lens = torch.randint(0, 700, (batch,), generator=gen).tolist()
    kv_lens[0], kv_lens[-1] = 0, 4097
    cache, indptr, indices, last, seqs = make_paged(kv_lens, page, hkv, d, dtype, "cuda", "NHD",
                                                    False, gen)
    q = torch.randn(batch, hq, d, generator=gen).to(dtype).cuda()
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD")
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype, disable_split_kv=True)
    assert w._plan.cta == 4 and not w._plan.split_kv
    o, lse = w.run(q, cache, return_lse=True)
    _check(o, lse, q, seqs, dtype)


@pytest.mark.parametrize("batch, cta, capacity", [
    (64, 4, 64),   # one wave of the two-stream shape, no idle CTAs (they cost time)
    (128, 0, 128),  # every request one item, no headroom
    (20, 0, 20),   # 160 CTAs: more than half of 2 x 132, a batch of equal lengths never splits
    (16, 5, 16),   # 128 CTAs: one per SM for eight key streams, no room to split
    (8, 5, 17),    # 64 CTAs: room to split up to one per SM (132 / 8 items)
    (1, 5, 17),    # the first plan splits
])
def test_decode_graph_capacity_on_cpu(monkeypatch, batch, cta, capacity):
    """The captured grid of a CUDA-graph decode wrapper: the first plan's items (each request is
    one query tile), or what the split heuristic fills where the first plan split or leaves
    more than half of it empty."""
    import flashinfer.attention.wrapper as wrapper

    monkeypatch.setattr(wrapper, "device_num_sms", lambda device: 132)
    pages = 256
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(1 << 20, dtype=torch.uint8), "NHD", use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.empty(batch + 1, dtype=torch.int32),
        paged_kv_indices_buffer=torch.empty(batch * pages, dtype=torch.int32),
        paged_kv_last_page_len_buffer=torch.empty(batch, dtype=torch.int32))
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    indices = torch.arange(batch * pages, dtype=torch.int32)
    last = torch.full((batch,), 16, dtype=torch.int32)
    w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=torch.bfloat16)
    assert w._plan.cta == cta
    assert w._plan.item_capacity == w._plan.grid_x == capacity
    assert w._plan.split_kv  # graph plans always take the split path (one-chunk rows direct)


def test_decode_graph_metadata_keeps_its_addresses_across_plans_on_cpu(monkeypatch):
    """A captured run reads the plan, decode's qo_indptr (staged right after the plan) and the
    caller's buffers: re-plans with other page counts, split or not, keep all their addresses
    and leave the staged values right."""
    import flashinfer.attention.wrapper as wrapper

    monkeypatch.setattr(wrapper, "device_num_sms", lambda device: 132)
    batch = 3
    bufs = dict(paged_kv_indptr_buffer=torch.empty(batch + 1, dtype=torch.int32),
                paged_kv_indices_buffer=torch.empty(4096, dtype=torch.int32),
                paged_kv_last_page_len_buffer=torch.empty(batch, dtype=torch.int32))
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(1 << 20, dtype=torch.uint8), "NHD", use_cuda_graph=True, **bufs)
    seen = set()
    for pages in ([1, 2, 3], [1000, 1, 7], [0, 5, 2]):
        indptr = torch.tensor([0] + list(itertools.accumulate(pages)), dtype=torch.int32)
        indices = torch.arange(sum(pages), dtype=torch.int32).flip(0)
        last = torch.tensor([16, 3, 9], dtype=torch.int32)
        w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=torch.bfloat16)
        seen.add((w._plan_dev.data_ptr(), w._qo_indptr.data_ptr(), w._kv_indptr.data_ptr(),
                  w._kv_indices.data_ptr(), w._kv_last_page_len.data_ptr()))
        assert w._qo_indptr.tolist() == list(range(batch + 1))
        assert torch.equal(w._kv_indptr, indptr) and torch.equal(w._kv_last_page_len, last)
        assert torch.equal(w._kv_indices[:sum(pages)], indices)
    assert len(seen) == 1 and w._kv_indptr.data_ptr() == bufs["paged_kv_indptr_buffer"].data_ptr()


class _FakeModule:
    """Stands in for a compiled attention module on the CPU: records each run's arguments."""

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


def _cpu_decode_wrapper(monkeypatch, batch=3, hkv=2):
    import flashinfer.attention.runtime as rt
    import flashinfer.attention.wrapper as wrapper

    fake = _FakeModule()
    # The device check comes before the module is fetched; the fake module takes CPU tensors.
    monkeypatch.setattr(wrapper, "check_cuda_device", lambda device, name: None)
    monkeypatch.setattr(wrapper, "device_num_sms", lambda device: 132)
    monkeypatch.setattr(rt, "get_attention_module", lambda variant: fake)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    pages = 4

    def plan(kv_pages=pages):
        w.plan(torch.arange(batch + 1, dtype=torch.int32) * kv_pages,
               torch.arange(batch * kv_pages, dtype=torch.int32),
               torch.full((batch,), 16, dtype=torch.int32), 4 * hkv, hkv, 64, 16,
               q_data_type=torch.float16)

    plan()
    cache = torch.randn(batch * 64, 2, 16, hkv, 64).half()
    q = torch.randn(batch, 4 * hkv, 64).half()
    return w, fake, plan, cache, q


def test_decode_run_resolves_its_launch_once_per_plan_on_cpu(monkeypatch):
    """``run`` passes the module q, k, v, o, lse and the plan's parameter record, resolved at the
    plan's first run and reused (an eager caller's host time per layer), a copy where a call
    changes a scale, and a new record after a re-plan."""
    import flashinfer.attention.runtime as rt

    w, fake, plan, cache, q = _cpu_decode_wrapper(monkeypatch)
    out = torch.empty_like(q)
    w.run(q, cache, out=out, enable_pdl=False)
    launch = w._launcher
    w.run(q, cache, out=out, enable_pdl=False, v_scale=2.0)
    assert w._launcher is launch and len(fake.calls) == 2
    first, second = fake.calls
    assert first[0] is q and first[3] is out and first[4] is None  # q, k, v, o, lse
    assert first[5] is launch.params and second[5] is not launch.params

    def field(rec, name):
        value = int(rec[rt.RUN_PARAMS.index(name)])
        if name in ("sm_scale", "o_scale"):
            return torch.tensor([value], dtype=torch.int64).view(torch.float64).item()
        return value

    assert field(first[5], "version") == rt.RUN_PARAMS_VERSION
    assert field(first[5], "length") == len(rt.RUN_PARAMS) == first[5].numel()
    assert (field(first[5], "cta"), field(first[5], "grid_x")) == (w._plan.cta, w._plan.grid_x)
    assert field(first[5], "plan") == w._plan_dev.data_ptr()
    assert field(first[5], "kv_indices") == w._kv_indices.data_ptr()
    assert field(first[5], "sm_scale") == pytest.approx(64 ** -0.5)
    assert field(first[5], "o_scale") == 1.0 and field(second[5], "o_scale") == 2.0
    assert field(first[5], "enable_pdl") == 0
    plan(kv_pages=1)
    assert w._launcher is None
    w.run(q, cache, out=out, enable_pdl=False)
    assert w._launcher is not launch and fake.calls[-1][5] is w._launcher.params


def test_decode_run_rejects_a_cache_with_other_kv_heads_on_cpu(monkeypatch):
    w, fake, _, cache, q = _cpu_decode_wrapper(monkeypatch)
    with pytest.raises(ValueError, match=r"planned num_kv_heads \(2\), got 4"):
        w.run(q, torch.cat([cache, cache], dim=3), enable_pdl=False)
    assert not fake.calls


@pytest.mark.gpu
def test_plan_and_single_calls_do_not_wait_for_the_gpu():
    """With host metadata, plan() (twice in a row) and the single-request functions queue their
    uploads without synchronizing the stream: an event recorded behind ~30 ms of matmuls is
    still pending when they return, and their results are right once the GPU gets there."""
    gen = torch.Generator().manual_seed(3)
    dtype, hq, hkv, d, page = torch.bfloat16, 32, 8, 128, 16
    cache, indptr, indices, last, seqs = make_paged([5000, 77], page, hkv, d, dtype, "cuda",
                                                    "NHD", False, gen)
    indptr, indices, last = indptr.cpu(), indices.cpu(), last.cpu()  # host metadata
    q = torch.randn(2, hq, d, generator=gen).to(dtype).cuda()
    k, v = seqs[0]
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD")

    def calls():
        w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype)
        w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype)
        return (w.run(q, cache), flashinfer.single_decode_with_kv_cache(q[0], k, v),
                flashinfer.single_prefill_with_kv_cache(q[:1].expand(3, -1, -1).contiguous(),
                                                        k, v, causal=True))

    a = torch.randn(4096, 4096, dtype=dtype, device="cuda")
    # The first round builds the modules and lets torch's caching host allocator allocate the
    # pinned blocks the single-request uploads need while earlier ones are in flight (a new
    # pinned allocation synchronizes the device); the second is the steady state.
    for attempt in range(2):
        torch.cuda.synchronize()
        for _ in range(150):
            a @ a
        behind = torch.cuda.Event()
        behind.record()
        batch, single, prefill = calls()
        assert attempt == 0 or not behind.query(), "a call waited for the GPU's queue"
    torch.cuda.synchronize()
    _check(batch, None, q, seqs, dtype)
    _check(single[None], None, q[:1], seqs[:1], dtype)
    ro, _ = attention_ref(q[:1].expand(3, -1, -1), k, v, causal=True)
    torch.testing.assert_close(prefill.double(), ro, **TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("use_cuda_graph", [False, True])
def test_metadata_on_the_host_or_the_device_give_the_same_output(use_cuda_graph):
    """plan() stages host metadata through pinned memory in one copy (into the
    caller's buffers in graph mode) and copies device metadata as it is: same output, for two
    plans of different page counts (the second overwrites the first one's staged metadata; in
    graph mode the run captured after the first plan is replayed after the second)."""
    gen = torch.Generator().manual_seed(11)
    dtype, hq, hkv, d, page = torch.bfloat16, 16, 4, 128, 16
    batch = 4
    q = torch.randn(batch, hq, d, generator=gen).to(dtype).cuda()
    outs = {}
    for where in ("cuda", "cpu"):
        bufs = {}
        if use_cuda_graph:
            bufs = dict(use_cuda_graph=True,
                        paged_kv_indptr_buffer=torch.empty(batch + 1, dtype=torch.int32,
                                                           device="cuda"),
                        paged_kv_indices_buffer=torch.empty(8000, dtype=torch.int32,
                                                            device="cuda"),
                        paged_kv_last_page_len_buffer=torch.empty(batch, dtype=torch.int32,
                                                                  device="cuda"))
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", **bufs)
        # One cache holds both batches' pages (a captured run keeps its pointer).
        first, second = [700, 0, 33, 4000], [1, 17, 5000, 64]
        cache, indptr, indices, last, seqs = make_paged(first + second, page, hkv, d, dtype,
                                                        "cuda", "NHD", False,
                                                        torch.Generator().manual_seed(5))
        out, graph = torch.empty_like(q), None
        for part in (slice(0, batch), slice(batch, 2 * batch)):
            pages = indptr[part.start:part.stop + 1]
            w.plan(pages.sub(pages[0]).to(where), indices[pages[0]:pages[-1]].to(where),
                   last[part].to(where), hq, hkv, d, page, q_data_type=dtype)
            if graph is None and use_cuda_graph:
                w.run(q, cache, out=out)  # warm-up outside the capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    w.run(q, cache, out=out)
            if graph is not None:
                graph.replay()
            else:
                w.run(q, cache, out=out)
            _check(out, None, q, seqs[part], dtype)
            outs.setdefault(part.start, []).append(out.clone())
    for a, b in outs.values():
        assert torch.equal(a, b)

"""Attention (issue 3's table): bf16, 32 query / 8 KV heads, head_dim 128, page size 16.

Decode is bandwidth-bound: bytes_moved = every KV page read once (+ q and out). Prefill is
tensor-core bound: flops = 4 * Sq * Skv * H * D, halved for causal (the visible triangle).
Baselines (`published_us`) are FlashInfer 0.7.2's published H100 figures from the issue.
"""

from __future__ import annotations

import torch

import flashinfer
from harness import Case

HQ, HKV, D, PAGE = 32, 8, 128, 16
DT = torch.bfloat16


def _ws():
    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def _decode(batch, kv_len, use_tensor_cores, baseline, target, split=None, note="",
            layout="NHD", shuffle_pages=False, use_cuda_graph=None, l2_flush="read",
            graph_wrapper=False, enable_pdl=None, kv_dtype=None):
    """Pages in order by default, as FlashInfer's own decode benchmark lays them out
    (benchmarks/bench_batch_decode.py: ``torch.arange(num_blocks)``), the setup of the published
    figures the targets compare with; ``shuffle_pages`` puts them in random order (a long-running
    server's cache), which costs the same bytes ~2-3% more time (benchmarks/probes/read_patterns.py:
    a pure read of them too). NHD. Timed as graph
    replays (harness.Case), as serving frameworks run decode; ``use_cuda_graph=False`` times
    the Python call with CUDA events instead (host launch gaps included). ``graph_wrapper``:
    the wrapper in CUDA-graph mode (caller buffers, a plan of fixed capacity that always splits
    KV, as vLLM and SGLang run it). ``kv_dtype``: the cache's dtype (default q's, bf16; fp8 reads
    half the bytes; run with k_scale and v_scale as engines pass them)."""
    kv_dtype = kv_dtype or DT
    pages = (kv_len + PAGE - 1) // PAGE
    shape = (PAGE, HKV, D) if layout == "NHD" else (HKV, PAGE, D)
    cache = torch.randn(batch * pages, 2, *shape, dtype=DT, device="cuda").to(kv_dtype)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    indices = (torch.randperm(batch * pages, dtype=torch.int32) if shuffle_pages
               else torch.arange(batch * pages, dtype=torch.int32))
    last = torch.full((batch,), kv_len - (pages - 1) * PAGE, dtype=torch.int32)
    bufs = {}
    if graph_wrapper:
        bufs = dict(use_cuda_graph=True,
                    paged_kv_indptr_buffer=torch.empty(batch + 1, dtype=torch.int32,
                                                       device="cuda"),
                    paged_kv_indices_buffer=torch.empty(batch * pages, dtype=torch.int32,
                                                        device="cuda"),
                    paged_kv_last_page_len_buffer=torch.empty(batch, dtype=torch.int32,
                                                              device="cuda"))
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), layout,
                                                      use_tensor_cores=use_tensor_cores, **bufs)
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=DT, fixed_split_size=split,
           kv_data_type=kv_dtype)
    q = torch.randn(batch, HQ, D, dtype=DT, device="cuda")
    out = torch.empty_like(q)
    kv_bytes = batch * kv_len * HKV * D * 2 * kv_dtype.itemsize
    scales = {} if kv_dtype == DT else {"k_scale": 0.5, "v_scale": 2.0}
    tc = "tensor cores" if use_tensor_cores else "CUDA cores"
    if shuffle_pages:
        note += ", pages shuffled"
    return Case(f"batch decode {batch} x kv {kv_len} ({tc}{note})",
                lambda: w.run(q, cache, out=out, enable_pdl=enable_pdl, **scales),
                bytes_moved=kv_bytes + 2 * q.numel() * 2,
                published_us=baseline, target=target, ceiling="read",
                extra=_plan_fields(w),
                use_cuda_graph=use_cuda_graph, l2_flush=l2_flush)


def _plan_fields(w) -> dict:
    """The plan's split, items and CTA shape (none for the peer, whose wrappers differ)."""
    plan = getattr(w, "_plan", None)
    if not hasattr(plan, "cta"):
        return {}
    return {"split": plan.kv_chunk_size, "items": plan.num_items, "cta": plan.cta}


def _causal_flops(qo, kv, hq=HQ, d=D):
    # Visible (q, k) pairs of a bottom-right causal mask, times 4 * H * D.
    pairs = sum(min(kv, kv - qo + i + 1) for i in range(qo)) if qo <= kv else 0
    return 4.0 * pairs * hq * d


def _backend(backend):
    """The keyword and the name suffix of a prefill case's backend (None: the default)."""
    return ({}, "") if backend is None else ({"backend": backend}, f", {backend}")


def _single_prefill(n, baseline, target, backend=None, hq=HQ, hkv=HKV, d=D):
    """``hq``, ``hkv``, ``d``: other head counts and head_dim than the table's (named then)."""
    q = torch.randn(n, hq, d, dtype=DT, device="cuda")
    k = torch.randn(n, hkv, d, dtype=DT, device="cuda")
    v = torch.randn(n, hkv, d, dtype=DT, device="cuda")
    kw, note = _backend(backend)
    if (hq, hkv, d) != (HQ, HKV, D):
        note = f", head_dim {d}, {hq}/{hkv} heads{note}"
    return Case(f"single prefill causal {n}{note}",
                lambda: flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, **kw),
                flops=_causal_flops(n, n, hq, d), published_us=baseline, target=target)


def _single_decode(kv_len, split=None):
    """``single_decode_with_kv_cache`` of one token over kv_len keys (NHD), as graph replays;
    ``split`` (ours only): the keys per chunk instead of the plan's choice."""
    q = torch.randn(HQ, D, dtype=DT, device="cuda")
    k = torch.randn(kv_len, HKV, D, dtype=DT, device="cuda")
    v = torch.randn(kv_len, HKV, D, dtype=DT, device="cuda")
    if split is None:
        fn = lambda: flashinfer.single_decode_with_kv_cache(q, k, v)  # noqa: E731
    else:
        from flashinfer.attention.runtime import resolve_scales
        from flashinfer.attention.single import run_single

        sm, o_scale = resolve_scales(D, None, None, None, None)
        fn = lambda: run_single(q[None], k, v, 0, None, None, False, "NONE", sm,  # noqa: E731
                                o_scale, -1, None, None, None, False, q.dtype, split)
    return Case(f"single decode kv {kv_len}" + (f", chunk {split}" if split else ""), fn,
                bytes_moved=2 * kv_len * HKV * D * 2 + 2 * q.numel() * 2, ceiling="read")


def _ragged_setup(batch, n, hq=HQ, hkv=HKV, d=D, **wrapper_kw):
    """A planned causal ragged prefill of ``batch`` requests of ``n`` tokens: (wrapper, q, k, v,
    out)."""
    q = torch.randn(batch * n, hq, d, dtype=DT, device="cuda")
    k = torch.randn(batch * n, hkv, d, dtype=DT, device="cuda")
    v = torch.randn(batch * n, hkv, d, dtype=DT, device="cuda")
    indptr = torch.arange(batch + 1, dtype=torch.int32) * n
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws(), "NHD", **wrapper_kw)
    w.plan(indptr, indptr, hq, hkv, d, causal=True, q_data_type=DT)
    return w, q, k, v, torch.empty_like(q)


def _paged_setup(batch, n, hq=HQ, hkv=HKV, d=D, **wrapper_kw):
    """A planned causal paged prefill of ``batch`` requests of ``n`` tokens, pages of PAGE in a
    random order: (wrapper, q, cache, out)."""
    pages = n // PAGE
    cache = torch.randn(batch * pages, 2, PAGE, hkv, d, dtype=DT, device="cuda")
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32) * n
    indices = torch.randperm(batch * pages, dtype=torch.int32)
    last = torch.full((batch,), PAGE, dtype=torch.int32)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), "NHD", **wrapper_kw)
    w.plan(qo_indptr, kv_indptr, indices, last, hq, hkv, d, PAGE, causal=True, q_data_type=DT)
    q = torch.randn(batch * n, hq, d, dtype=DT, device="cuda")
    return w, q, cache, torch.empty_like(q)


def _ragged_prefill(batch, n, baseline, target, backend=None, run_kw=None, note=""):
    """``run_kw``: extra keywords of ``run`` (e.g. sinks), named by ``note``."""
    kw, backend_note = _backend(backend)
    w, q, k, v, out = _ragged_setup(batch, n, **kw)
    run_kw = run_kw or {}
    return Case(f"ragged prefill causal {batch} x {n}{backend_note}{note}",
                lambda: w.run(q, k, v, out=out, **run_kw),
                flops=batch * _causal_flops(n, n), published_us=baseline, target=target)


def _paged_prefill(batch, n, baseline, target, backend=None, run_kw=None, note=""):
    """``run_kw``: extra keywords of ``run`` (e.g. sinks), named by ``note``."""
    kw, backend_note = _backend(backend)
    w, q, cache, out = _paged_setup(batch, n, **kw)
    run_kw = run_kw or {}
    return Case(f"paged prefill causal {batch} x {n}{backend_note}{note}",
                lambda: w.run(q, cache, out=out, **run_kw),
                flops=batch * _causal_flops(n, n), published_us=baseline, target=target)


def _with_cta(cta, make, *args):
    """Build a case with the scheduler's CTA shape forced (to compare shapes in one run): the
    wrappers plan with it, and a single-request call resolves its launch with it, kept apart
    from the unforced launch of the same problem."""
    import functools

    import flashinfer.attention.runtime as rt
    import flashinfer.attention.single as single
    import flashinfer.attention.wrapper as wrapper

    modules = (wrapper, single)
    originals = [m.schedule for m in modules]
    launches = {}  # the forced single-request launches

    def force(on: bool) -> None:
        for m, original in zip(modules, originals):
            m.schedule = functools.partial(original, cta=cta) if on else original

    force(True)
    try:
        case = make(*args)
    finally:
        force(False)
    run = case.fn

    def fn():
        force(True)
        kept, rt.single_launches = rt.single_launches, launches
        try:
            return run()
        finally:
            force(False)
            rt.single_launches = kept

    case.fn = fn
    case.name += f" [cta {cta}]"
    return case


def cases() -> list[Case]:
    out = []
    for tc in (True, False):
        out += [
            _decode(64, 4096, tc, 362.8, "<= 350 us"),
            _decode(1, 32768, tc, 56.0, "<= 50 us"),
            _decode(128, 8192, tc, 1420.0, "<= 1390 us"),
        ]
    # Pages in random order: the same bytes, a harder pattern for the memory system.
    out += [
        _decode(64, 4096, True, 362.8, "<= 350 us", shuffle_pages=True),
        _decode(1, 32768, True, 56.0, "<= 50 us", shuffle_pages=True),
        _decode(128, 8192, True, 1420.0, "<= 1390 us", shuffle_pages=True),
    ]
    # The same call timed with CUDA events: the host's work per call shows when it exceeds the
    # GPU's.
    out.append(_decode(1, 32768, True, 56.0, "<= 50 us", note=", events",
                       use_cuda_graph=False))
    # After a dirty (zero_) flush: the write-back of 50 MB of the flush's lines is then timed too.
    out.append(_decode(1, 32768, True, 56.0, "<= 50 us", note=", write flush", l2_flush="write"))
    for batch, kv_len, base, target in ((64, 4096, 362.8, "<= 350 us"),
                                        (1, 32768, 56.0, "<= 50 us")):
        out.append(_decode(batch, kv_len, True, base, target, note=", CUDA-graph wrapper",
                           graph_wrapper=True))
    out.append(_decode(64, 4096, True, 362.8, "<= 350 us", note=", write flush",
                       l2_flush="write"))
    # The batches the two- and eight-key-stream shapes (cta 4, 5) are picked for, with the
    # four-stream one beside.
    out.append(_with_cta(0, _decode, 1, 32768, True, 56.0, "<= 50 us"))
    out.append(_with_cta(0, _decode, 64, 4096, True, 362.8, "<= 350 us"))
    out.append(_with_cta(0, _decode, 64, 4096, True, 362.8, "<= 350 us", None, "",
                         "NHD", True))
    for split in (256, 512, 2048):
        out.append(_decode(1, 32768, True, 56.0, "<= 50 us", split, f", chunk {split}"))
    for split in (512, 1024, 2048):
        out.append(_decode(64, 4096, True, 362.8, "<= 350 us", split, f", chunk {split}"))
    out += [
        _single_prefill(16384, 5824.0, "<= 5800 us"),
        _ragged_prefill(16, 1024, 452.0, "<= 450 us"),
        _paged_prefill(8, 2048, 906.0, "<= 900 us"),
        _with_cta(1, _single_prefill, 16384, 5824.0, "<= 5800 us"),
        _with_cta(1, _ragged_prefill, 16, 1024, 452.0, "<= 450 us"),
    ]
    return out

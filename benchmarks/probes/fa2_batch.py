"""Where the FA2 kernel loses on batches of short requests (issue 22: ragged 16 x 1024 and
paged 8 x 2048 trail FlashInfer's fa2 more than single 16384 does, with the same kernel and
the same 4096 CTAs). bf16, 32 / 8 heads, head_dim 128, causal, ``backend="fa2"``. GPU only.

    python benchmarks/probes/fa2_batch.py build [--tests]  (every module below, 16 jobs; or
        the registered attention, cascade and page modules the GPU tests load)
    python benchmarks/probes/fa2_batch.py warmup           (the public cases' modules)
    python benchmarks/probes/fa2_batch.py public OUT.json  (public API only: ours or the peer)
    python benchmarks/probes/fa2_batch.py ours OUT.json    (variants, plan orders, CTA trace)

``public``: 16384 tokens as 1 x 16384, 4 x 4096, 16 x 1024 and 64 x 256 (the same Q and O
bytes, fewer keys per item), and 16 x 1024 as 16 single prefills one after the other.
``ours``: the rows under each build of ``VARIANTS``, the plan's item order (longest first,
or request order as FlashInfer's fa2 takes them) and the 64-row shape; then the trace probe
(common.cuh, PROBE_TRACE): per CTA the time to Q, to the first K tile, the loop per KV tile,
and the epilogue, and how many CTAs an SM held on average over the kernel.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuning"))  # tune_attention
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # attention_ref

import bench_attention as ba  # noqa: E402
import torch  # noqa: E402

import flashinfer  # noqa: E402
import harness  # noqa: E402

TOKENS = 16384
# Each: the tuning macros over the headers' defaults (include/flashinfer/attention/tuning.cuh).
# (The first call also built the output by 4-byte stores, STAGE_O=0, since removed: it lost on
# every row, benchmarks/notes/fa2-batches.md.)
VARIANTS = {"default": ()}
EVENTS = ["entry", "q", "first_k", "loop_done", "streams_done", "written", "counted", "end"]
CTAS = 4096  # kTraceCtas


def _modules():
    from flashinfer.jit.attention import AttentionVariant

    return [AttentionVariant("bfloat16", "bfloat16", 128, "causal", "NONE", False),
            AttentionVariant("bfloat16", "bfloat16", 128, "causal", "NONE", True)]


def _specs(flags, trace=False):
    import tune_attention

    out = tune_attention.specs(flags, _modules())
    if trace:
        out = {v: dataclasses.replace(s, extra_cuda_cflags=s.extra_cuda_cflags
                                      + ("-DFLASHINFER_ATTENTION_PROBE_TRACE=1",))
               for v, s in out.items()}
    return out


def _singles(batch: int, n: int) -> harness.Case:
    """``batch`` single prefills of ``n`` tokens, one launch each (a request as its own call)."""
    qs = [torch.randn(n, ba.HQ, ba.D, dtype=ba.DT, device="cuda") for _ in range(batch)]
    ks = [torch.randn(n, ba.HKV, ba.D, dtype=ba.DT, device="cuda") for _ in range(batch)]
    vs = [torch.randn(n, ba.HKV, ba.D, dtype=ba.DT, device="cuda") for _ in range(batch)]

    def fn():
        for q, k, v in zip(qs, ks, vs):
            flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, backend="fa2")

    return harness.Case(f"{batch} single prefills causal {n}, fa2", fn,
                        flops=batch * ba._causal_flops(n, n))


def public_cases() -> list:
    out = [ba._single_prefill(TOKENS, None, "", "fa2")]
    out += [ba._ragged_prefill(TOKENS // n, n, None, "", "fa2") for n in (4096, 1024, 256)]
    out += [ba._paged_prefill(8, 2048, None, "", "fa2"), _singles(16, 1024),
            ba._single_prefill(8192, None, "", "fa2", 16, 8, 256)]
    return out


def _request_order(make, *args):
    """A case planned with the items in request order (FlashInfer's fa2 order) instead of
    longest first: ``plan.schedule``'s sort replaced by the identity while it plans."""
    import flashinfer.attention.plan as plan

    plan.sorted = lambda it, key=None, reverse=False: list(it)
    try:
        case = make(*args)
    finally:
        del plan.sorted
    case.name += " [request order]"
    return case


def our_cases(variant: str) -> list:
    rows = [lambda: ba._ragged_prefill(16, 1024, None, "", "fa2"),
            lambda: ba._paged_prefill(8, 2048, None, "", "fa2"),
            lambda: ba._single_prefill(TOKENS, None, "", "fa2"),
            lambda: ba._ragged_prefill(64, 256, None, "", "fa2")]
    out = [make() for make in rows]
    if variant == "default":
        out += [_request_order(ba._ragged_prefill, 16, 1024, None, "", "fa2"),
                _request_order(ba._paged_prefill, 8, 2048, None, "", "fa2"),
                ba._with_cta(1, ba._ragged_prefill, 16, 1024, None, "", "fa2"),
                ba._with_cta(1, ba._paged_prefill, 8, 2048, None, "", "fa2")]
    for c in out:
        c.name += f" [{variant}]"
    return out


def check(label: str) -> dict:
    """Relative error against float64 of a causal ragged batch with uneven requests (qo / kv:
    300 / 700, 1 / 1, 1100 / 1100, 0 / 64, 77 / 77), its lse, and of one paged request, under
    the current module source."""
    from attention_ref import attention_ref

    torch.manual_seed(0)
    qo, kv = [300, 1, 1100, 0, 77], [700, 1, 1100, 64, 77]
    q = torch.randn(sum(qo), ba.HQ, ba.D, dtype=ba.DT, device="cuda")
    k = torch.randn(sum(kv), ba.HKV, ba.D, dtype=ba.DT, device="cuda")
    v = torch.randn(sum(kv), ba.HKV, ba.D, dtype=ba.DT, device="cuda")
    qi = torch.tensor([0] + qo, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    ki = torch.tensor([0] + kv, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ba._ws(), "NHD", backend="fa2")
    w.plan(qi, ki, ba.HQ, ba.HKV, ba.D, causal=True, q_data_type=ba.DT)
    o, lse = w.run(q, k, v, return_lse=True)
    errs = {}
    for b in range(len(qo)):
        if not qo[b]:
            continue
        qs, ks = slice(qi[b], qi[b + 1]), slice(ki[b], ki[b + 1])
        ref, ref_lse = attention_ref(q[qs], k[ks], v[ks], causal=True)
        errs[f"ragged {qo[b]}x{kv[b]}"] = ((o[qs].double() - ref).norm() / ref.norm()).item()
        errs[f"lse {qo[b]}x{kv[b]}"] = (lse[qs].double() - ref_lse).abs().max().item()
    ok = all(e < 1e-2 for e in errs.values())
    print(f"check {label}: {errs} {'ok' if ok else 'FAILED'}", flush=True)
    return {"errors": errs, "ok": ok}


def _trace(module, case) -> dict:
    """Per-CTA phases of one launch of ``case`` (stamps of the trace probe), medians of 10."""
    stamps = torch.zeros(CTAS, len(EVENTS) + 1, dtype=torch.int64, device="cuda")
    per: dict = {}
    for i in range(13):
        stamps.zero_()
        torch.cuda.synchronize()
        case.fn()
        torch.cuda.synchronize()
        module.trace_copy(stamps)
        torch.cuda.synchronize()
        if i < 3:
            continue
        s = stamps.cpu().double()
        ran = s[:, 0] > 0
        t = s[ran]
        t0, t1 = t[:, 0].min(), t[:, EVENTS.index("end")].max()
        span = (t1 - t0) / 1e3
        life = (t[:, EVENTS.index("end")] - t[:, 0]) / 1e3

        def d(a, b, t=t):
            return ((t[:, EVENTS.index(b)] - t[:, EVENTS.index(a)]) / 1e3)

        sms = t[:, len(EVENTS)]
        nsm = len(set(sms.tolist()))
        row = {"ctas": float(ran.sum()), "span_us": span.item(),
               "ctas_per_sm_mean": (life.sum() / (nsm * span)).item(),
               "cta_life_median_us": life.median().item(),
               "entry_to_q_median_us": d("entry", "q").median().item(),
               "q_to_first_k_median_us": d("q", "first_k").median().item(),
               "loop_median_us": d("first_k", "loop_done").median().item(),
               "epilogue_median_us": d("loop_done", "end").median().item(),
               "fixed_sum_us": (d("entry", "first_k") + d("loop_done", "end")).sum().item(),
               "loop_sum_us": d("first_k", "loop_done").sum().item()}
        # Gaps on each SM: time with fewer than two CTAs resident, summed over SMs.
        for k, v in row.items():
            per.setdefault(k, []).append(v)
    return {k: round(statistics.median(v), 2) for k, v in per.items()}


def main() -> int:
    cmd = sys.argv[1]
    if cmd == "warmup":  # the public cases' modules (a JIT build on a cold cache)
        for case in public_cases():
            case.fn()
        torch.cuda.synchronize()
        return 0
    if cmd == "build":
        from flashinfer import aot
        from flashinfer.jit.attention import AttentionVariant
        from flashinfer.jit.core import get_module

        todo = [s for f in VARIANTS.values() for s in _specs(f).values()]
        todo += [_specs((), trace=True)[_modules()[0]],
                 AttentionVariant("bfloat16", "bfloat16", 256, "causal", "NONE", False).spec()]
        if "--tests" in sys.argv:  # instead: the modules of the GPU tests, most used first
            todo = [s for s in aot.registered_specs()
                    if s.name.startswith(("attention", "cascade", "page"))]
            todo.sort(key=lambda s: ("_d128_" not in s.name, "custom" in s.name or "rope" in s.name
                                     or "alibi" in s.name, s.name))
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(get_module, todo))
        return 0
    out_path = Path(sys.argv[2])
    result = {"ceilings": harness.measure_ceilings()}
    if cmd == "public":
        result["cases"] = harness.run_cases(public_cases(), result["ceilings"], "attention")
    else:
        import flashinfer.attention.runtime as rt
        from flashinfer.jit.core import get_module

        default_fetch = rt.get_attention_module
        result["cases"] = harness.run_cases(public_cases(), result["ceilings"], "attention")
        for label, flags in VARIANTS.items():
            mods = {v: get_module(s) for v, s in _specs(flags).items()}
            rt.set_module_source(lambda v, mods=mods: mods.get(v) or default_fetch(v))
            result.setdefault("checks", {})[label] = check(label)
            result["cases"] += harness.run_cases(our_cases(label), result["ceilings"],
                                                 "attention")
            harness.write(out_path, harness.record("probe", "fa2-batch", **result))
        traced = _specs((), trace=True)
        mods = {v: get_module(s) for v, s in traced.items()}
        rt.set_module_source(lambda v, mods=mods: mods.get(v) or default_fetch(v))
        ragged = _modules()[0]
        result["trace"] = {}
        for name, make in (("ragged 16 x 1024", lambda: ba._ragged_prefill(16, 1024, None, "",
                                                                         "fa2")),
                           ("single 16384", lambda: ba._single_prefill(TOKENS, None, "", "fa2")),
                           ("ragged 16 x 1024 [request order]",
                            lambda: _request_order(ba._ragged_prefill, 16, 1024, None, "",
                                                   "fa2"))):
            result["trace"][name] = r = _trace(mods[ragged], make())
            print(f"trace {name}: {r}", flush=True)
    harness.write(out_path, harness.record("probe", "fa2-batch", **result))
    for c in result["cases"]:
        print(f"{c['name'][:72]:72s} {c['median_us']:9.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

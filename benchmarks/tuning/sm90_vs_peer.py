"""The Hopper kernel (``backend="fa3"``) against FlashInfer 0.7.2's fa3 on issue 22's rows and the
shapes that must not regress, with variants of ours compiled side by side (the
FLASHINFER_ATTENTION_SM90_* macros of include/flashinfer/attention/tuning.cuh) and the peer timed
in a separate process of the same device call (both packages are named ``flashinfer``). GPU only.

    python benchmarks/tuning/sm90_vs_peer.py ours OUT.json [VARIANT ...]   (builds, checks, times)
    python benchmarks/tuning/sm90_vs_peer.py peer OUT.json [--warmup]      (the peer; --warmup builds)
    python benchmarks/tuning/sm90_vs_peer.py merge RESULT.json --ours A.json --peer B.json
        [--commit C] [--variant NAME]
    python benchmarks/tuning/sm90_vs_peer.py stress VARIANT N   (N replays of the short cases)

Only the public API is used, so the same cases run on either package, and both sides are timed
by this file's `time_case` (not flashinfer.testing, which differs between the packages: the
peer's skips the L2 flush for closures): a CUDA graph of one call, replayed after a read of
256 MiB (a cold L2), CUDA events around each replay, the median of 10-50 replays; a call
that cannot be captured is timed the same way without the graph. A single prefill's host work is
not timed on either side. ``merge`` writes one results record: the chosen variant's rows (default: the
first) as cases with the peer's median, every variant's rows under ``extra``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, schema
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import torch  # noqa: E402

import harness  # noqa: E402

DT = torch.bfloat16

# Variants of ours: macro assignments (FLASHINFER_ATTENTION_ prefixed) and the (head_dim,
# head_dim_vo) pairs whose modules take them (None: every swept module; the others keep the
# default build). "default" is the tree.
VARIANTS = {
    "default": ((), None),
    # The output by 16-byte stores from every lane (before the TMA stores of the staged rows).
    "O by row stores": (("SM90_TMA_STORE=0",), None),
    # setmaxnreg splits (default 88 / 208; the consumers take the rest)
    "producer 40 / consumers 232": (("SM90_PRODUCER_REGS=40",), None),
    "producer 56 / consumers 224": (("SM90_PRODUCER_REGS=56",), None),
    # O rescaled after P_{j-1} V_{j-1} completes (the default at head_dim 128 but paged), or
    # between issuing S_j and P V (the default elsewhere).
    "rescale O after P V": (("SM90_RESCALE_EARLY=0",), ((128, 128), (192, 128))),
    "hd128: rescale O early": (("SM90_RESCALE_EARLY=1",), ((128, 128),)),
    # One Q buffer (192 / 128 and 256 by default) handed back after the item's last S
    # (EARLY_Q), the output staged in shared memory (STAGE_O: default at 192 / 128) or stored
    # from registers (default at 256, whose staging spills in the consumers).
    "hd128: 1 Q buffer, 2 stages, staged output": (("SM90_Q_BUFFERS=1", "SM90_STAGES=2"),
                                                   ((128, 128),)),
    "hd256: 80-key tiles": (("SM90_TILE_KV=80", "SM90_PRODUCER_REGS=72"), ((256, 256),)),
    "hd256: Q buffer back after the epilogue": (("SM90_EARLY_Q=0",), ((256, 256),)),
    "hd256: staged output": (("SM90_STAGE_O=1",), ((256, 256),)),
    "192/128: Q buffer back after the epilogue": (("SM90_EARLY_Q=0",), ((192, 128),)),
    "192/128: output from registers": (("SM90_STAGE_O=0",), ((192, 128),)),
    "192/128: 2 Q buffers, 96-key tiles, late rescale": (
        ("SM90_TILE_KV=96", "SM90_Q_BUFFERS=2", "SM90_RESCALE_EARLY=0"), ((192, 128),)),
    # 192 / 128 on the H100 (its DRAM 3.0 TB/s against the H200's 4.5: the batch's unique
    # bytes alone take ~0.9 ms there), deeper rings for smaller tiles, Q double-buffered or not.
    "192/128: 2 Q buffers, 96-key tiles": (("SM90_TILE_KV=96", "SM90_Q_BUFFERS=2"),
                                           ((192, 128),)),
    "192/128: rescale O after P V": (("SM90_RESCALE_EARLY=0",), ((192, 128),)),
    "192/128: 112-key tiles": (("SM90_TILE_KV=112",), ((192, 128),)),
    "192/128: 80-key tiles, 3 stages": (("SM90_TILE_KV=80",), ((192, 128),)),
    "192/128: 64-key tiles, 4 stages": (("SM90_TILE_KV=64",), ((192, 128),)),
    "192/128: 2 Q buffers, 64-key tiles, 3 stages": (("SM90_TILE_KV=64", "SM90_Q_BUFFERS=2"),
                                                     ((192, 128),)),
    "192/128: producer 56 / consumers 224": (("SM90_PRODUCER_REGS=56",), ((192, 128),)),
}


def _ws():
    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def _flops(qo, kv, hq, d, causal):
    if not causal:
        return 4.0 * qo * kv * hq * d
    pairs = sum(min(kv, kv - qo + i + 1) for i in range(qo)) if qo <= kv else 0
    return 4.0 * pairs * hq * d


def _case(name, fn, flops):
    return harness.Case(name, fn, flops=flops, use_cuda_graph=True)


def time_case(case, flush, budget_ms: float = 200.0, max_reps: int = 50) -> dict:
    """One row: the case's median (and p10 / p90) over CUDA-graph replays, each after a cold-L2
    read of ``flush``."""
    wall = time.monotonic()
    fn = case.fn
    fn()
    torch.cuda.synchronize()
    how = "cuda graph replay, cold L2 (256 MiB read before each)"
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except RuntimeError as err:
        torch.cuda.synchronize()
        how = f"cuda events (capture failed: {str(err).splitlines()[0][:100]}), cold L2"
        run = fn
    run()
    torch.cuda.synchronize()
    times, spent = [], 0.0
    while (spent < budget_ms or len(times) < 10) and len(times) < max_reps:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush.sum()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        spent += times[-1]
    times.sort()
    med = times[len(times) // 2]
    row = {"name": case.name, "group": "attention", "timing": how,
           "median_us": round(med * 1e3, 2), "p10_us": round(times[len(times) // 10] * 1e3, 2),
           "p90_us": round(times[9 * len(times) // 10] * 1e3, 2), "flops": case.flops,
           "TFLOPs": round(case.flops / (med * 1e-3) / 1e12, 1)}
    print(f"{case.name:<58} {row['median_us']:>10.1f} us {row['TFLOPs']:>7.1f} TFLOP/s "
          f"({len(times)} replays, {time.monotonic() - wall:.1f} s)", flush=True)
    return row


def time_cases(built, ceilings=None) -> list:
    flush = torch.randn(64 << 20, device="cuda")  # 256 MiB of float32
    rows = [time_case(c, flush) for c in built]
    if ceilings:
        for r in rows:
            r["pct_of_matmul"] = round(100 * r["TFLOPs"] / ceilings["bf16_matmul_TFLOPs"], 1)
            r["ceiling"] = "matmul"
    return rows


def _single(n, hq=32, hkv=8, d=128, causal=True):
    import flashinfer

    q = torch.randn(n, hq, d, dtype=DT, device="cuda")
    k = torch.randn(n, hkv, d, dtype=DT, device="cuda")
    v = torch.randn(n, hkv, d, dtype=DT, device="cuda")
    name = f"single prefill {'causal' if causal else 'non-causal'} {n}, {hq}/{hkv} heads, hd {d}"
    return _case(name, lambda: flashinfer.single_prefill_with_kv_cache(
        q, k, v, causal=causal, backend="fa3"), _flops(n, n, hq, d, causal))


def _shape(hq, hkv, d):
    """The name suffix of a batch case off the default 32/8 heads at head_dim 128."""
    return "" if (hq, hkv, d) == (32, 8, 128) else f", {hq}/{hkv} heads, hd {d}"


def _sinks(hq, on):
    """run()'s ``sinks=`` keyword (a logit per query head) where ``on``, else nothing."""
    return {"sinks": torch.rand(hq, dtype=torch.float32, device="cuda") * 4 - 2} if on else {}


def _ragged(batch, n, hq=32, hkv=8, d=128, sinks=False):
    import bench_attention as ba

    w, q, k, v, out = ba._ragged_setup(batch, n, hq, hkv, d, backend="fa3")
    kw = _sinks(hq, sinks)
    return _case(f"ragged prefill causal {batch} x {n}{_shape(hq, hkv, d)}"
                 f"{', sinks' if sinks else ''}",
                 lambda: w.run(q, k, v, out=out, **kw), batch * _flops(n, n, hq, d, True))


def _paged(batch, n, hq=32, hkv=8, d=128, sinks=False):
    import bench_attention as ba

    w, q, cache, out = ba._paged_setup(batch, n, hq, hkv, d, backend="fa3")
    kw = _sinks(hq, sinks)
    return _case(f"paged prefill causal {batch} x {n}, page {ba.PAGE}{_shape(hq, hkv, d)}"
                 f"{', sinks' if sinks else ''}",
                 lambda: w.run(q, cache, out=out, **kw), batch * _flops(n, n, hq, d, True))


def _repeat(case):
    """A second row of a case, named apart."""
    return dataclasses.replace(case, name=f"{case.name} (repeat)")


def _mla(batch, n, heads):
    """MLA prefill (DeepSeek): ragged, causal, MHA, q/k 192 wide, v and the output 128. FLOPs:
    2 x pairs x heads x (192 + 128)."""
    import bench_attention as ba

    import flashinfer

    q = torch.randn(batch * n, heads, 192, dtype=DT, device="cuda")
    k = torch.randn(batch * n, heads, 192, dtype=DT, device="cuda")
    v = torch.randn(batch * n, heads, 128, dtype=DT, device="cuda")
    indptr = torch.arange(batch + 1, dtype=torch.int32) * n
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ba._ws(), "NHD", backend="fa3")
    w.plan(indptr, indptr, heads, heads, 192, 128, causal=True, q_data_type=DT)
    out = torch.empty(batch * n, heads, 128, dtype=DT, device="cuda")
    return _case(f"ragged prefill 192/128 causal {batch} x {n}, {heads} heads",
                 lambda: w.run(q, k, v, out=out),
                 batch * _flops(n, n, heads, 1, True) * (192 + 128) / 2)


CASES = [
    lambda: _single(4096), lambda: _single(16384), lambda: _ragged(16, 1024),
    lambda: _ragged(4, 8192), lambda: _paged(8, 2048), lambda: _single(8192, causal=False),
    lambda: _single(8192, d=64), lambda: _single(8192, hq=32, hkv=32),
    lambda: _single(8192, hq=32, hkv=4), lambda: _ragged(64, 256),
    # The wide heads (Gemma: head_dim 256, 16/8 heads; DeepSeek MLA prefill 192 / 128).
    lambda: _single(8192, 16, 8, 256), lambda: _ragged(16, 1024, 16, 8, 256),
    lambda: _paged(8, 2048, 16, 8, 256), lambda: _mla(16, 1024, 128),
    lambda: _single(8192, 16, 8, 256, causal=False),
    # Sinks (issue 21: <= 1.02 x the same case without), ours only; each beside a repeat of
    # the case without sinks, timed right before it, for the run-to-run drift.
    lambda: _repeat(_ragged(16, 1024)), lambda: _ragged(16, 1024, sinks=True),
    lambda: _repeat(_paged(8, 2048)), lambda: _paged(8, 2048, sinks=True),
]
#: The (head_dim, head_dim_vo) of each case (a variant limited to some head dims times only
#: their cases).
CASE_HEADS = {**{i: (128, 128) for i in (*range(10), 15, 16, 17, 18)}, 6: (64, 64),
              10: (256, 256), 11: (256, 256), 12: (256, 256), 13: (192, 128), 14: (256, 256)}

#: The cases a variant other than the default times (those of its head dims): issue 22's short
#: rows, the wide heads, a short-prefill batch.
KEY_CASES = (0, 2, 4, 9, 10, 11, 12, 13, 14)


def cases(which=None):
    """Issue 22's Hopper rows first, then the shapes that must not regress (``which``: indices
    into CASES). A case that cannot be set up or run (a shape a package lacks) is left out
    with a line saying why."""
    torch.manual_seed(0)
    out = []
    for i, make in enumerate(CASES):
        if which is not None and i not in which:
            continue
        try:
            case = make()
            case.fn()  # the first call builds the module
        except Exception as err:  # noqa: BLE001 (reported, and the row is missing)
            print(f"case {i} left out: {type(err).__name__}: {str(err)[:200]}", flush=True)
            continue
        out.append(case)
    torch.cuda.synchronize()
    return out


def check(label: str, heads=None) -> dict:
    """Ours against float64 on shapes that take every new path: ragged K/V tiles past each
    request (NaN past the last one), non-causal, head_dim 64, paged (``heads``: only the
    shapes of those (head_dim, head_dim_vo) pairs, None: all)."""
    from attention_ref import attention_ref

    import flashinfer

    torch.manual_seed(1)
    errs = {}
    qo_lens, kv_lens = [200, 1, 130, 77, 700], [300, 129, 130, 1000, 700]
    for d, dv, causal in ((128, 128, True), (128, 128, False), (64, 64, True),
                          (256, 256, True), (192, 128, True)):
        if heads is not None and (d, dv) not in heads:
            continue
        qi = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
        ki = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
        q = torch.randn(sum(qo_lens), 32, d, dtype=DT, device="cuda")
        k = torch.randn(sum(kv_lens) + 200, 8, d, dtype=DT, device="cuda")
        v = torch.randn(sum(kv_lens) + 200, 8, dv, dtype=DT, device="cuda")
        k[sum(kv_lens):], v[sum(kv_lens):] = float("nan"), float("nan")
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws(), "NHD", backend="fa3")
        w.plan(qi, ki, 32, 8, d, dv, causal=causal, q_data_type=DT)
        o = w.run(q, k, v)
        worst = 0.0
        for b in range(len(qo_lens)):
            ref, _ = attention_ref(q[qi[b]:qi[b + 1]], k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]],
                                   causal=causal)
            worst = max(worst, ((o[qi[b]:qi[b + 1]].double() - ref).norm() / ref.norm()).item())
        errs[f"ragged d{d}/{dv} {'causal' if causal else 'none'}"] = worst
    for d in (128, 256):
        if heads is not None and (d, d) not in heads:
            continue
        case = _paged(2, 1024, 16, 4, d)  # builds the wrapper; check its output once
        o = case.fn()
        errs[f"paged d{d} finite"] = float(not torch.isfinite(o).all())
    ok = all(e < 1e-2 for e in errs.values())
    print(f"check {label}: {errs} {'ok' if ok else 'FAILED'}", flush=True)
    return {"errors": errs, "ok": ok}


#: The swept modules (bf16): (head_dim, head_dim_vo, mask, paged).
SWEPT = ((128, 128, "causal", False), (128, 128, "causal", True), (128, 128, "none", False),
         (64, 64, "causal", False), (256, 256, "causal", False), (256, 256, "causal", True),
         (256, 256, "none", False), (192, 128, "causal", False))


def _specs(variant):
    """The swept modules with a variant's macros where it applies, the default build elsewhere."""
    from flashinfer.jit.attention import AttentionVariant

    flags, heads = variant
    out = {}
    for d, dv, mask, paged in SWEPT:
        m = AttentionVariant("bfloat16", "bfloat16", d, mask, "NONE", paged, head_dim_vo=dv)
        base = m.spec()
        if heads is None or (d, dv) in heads:
            macros = tuple(f"-DFLASHINFER_ATTENTION_{f}" for f in flags
                           if not f.startswith("PLAN_"))
            base = dataclasses.replace(base, extra_cuda_cflags=base.extra_cuda_cflags + macros)
        out[m] = base
    return out


def _use(specs) -> None:
    import flashinfer.attention.runtime as rt
    from flashinfer.jit.core import get_module

    mods = {m: get_module(s) for m, s in specs.items()}
    rt.set_module_source(lambda m: mods[m])


def stress(args) -> int:
    """Replays of the short cases (many items per CTA, every K/V tile through the TMA) and the
    check, to catch a hang or a wrong result that a few timed replays would miss."""
    _use(_specs(VARIANTS[args.variant]))
    print(f"stress {args.variant}: {check(args.variant)}", flush=True)
    for i in (9, 2, 0):  # ragged 64 x 256, ragged 16 x 1024, single 4096
        case = cases([i])[0]
        out = case.fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            case.fn()
        t = time.monotonic()
        for _ in range(args.n):
            graph.replay()
        torch.cuda.synchronize()
        print(f"stress {args.variant}: {case.name} x {args.n} in {time.monotonic() - t:.1f} s, "
              f"finite {bool(torch.isfinite(out).all())}", flush=True)
    return 0


def ours(args) -> int:
    from flashinfer.jit.core import get_module

    names = args.variants or list(VARIANTS)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    specs = _specs
    built = {name: specs(VARIANTS[name]) for name in names}
    t = time.monotonic()
    # Not aot.build_all: its progress lines key on module names, which the variants share.
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(get_module, [s for m in built.values() for s in m.values()]))
    result = {"label": "ours", "device": harness.device_info(),
              "build_s": round(time.monotonic() - t, 1)}
    print(f"built {len(built)} variants in {result['build_s']} s", flush=True)
    # Timed with other builds still running, rows of one call drifted by up to 15% (the A/B
    # of 2026-11-26, benchmarks/notes/sm90-head-dims.md): wait for them where told.
    while args.wait and not Path(args.wait).exists() and time.monotonic() - t < args.wait_s:
        time.sleep(1)
    result["waited_s"] = round(time.monotonic() - t - result["build_s"], 1)
    result["ceilings"] = harness.measure_ceilings()
    print("ceilings", result["ceilings"], flush=True)
    result["variants"] = {}
    wanted = [int(i) for i in args.cases.split(",")] if args.cases else None
    result["rounds"] = args.rounds
    # --rounds N: every variant's cases once per round, the variants in turn within a round
    # (drift over the call falls on all of them alike); each row the median of its rounds.
    for rnd in range(args.rounds):
        for i, name in enumerate(names):
            label = name if name not in names[:i] else f"{name} (repeat {names[:i].count(name)})"
            _use(built[name])
            heads = VARIANTS[name][1]
            if rnd == 0:
                result["variants"][label] = {"flags": list(VARIANTS[name][0]),
                                             "check": check(label, heads), "rounds": []}
            entry = result["variants"][label]
            print(f"== {label}, round {rnd + 1} ({time.monotonic() - t:.0f} s)", flush=True)
            which = wanted if name == "default" else [
                i for i in (wanted or KEY_CASES) if heads is None or CASE_HEADS[i] in heads]
            entry["rounds"].append(time_cases(cases(which), result["ceilings"]))
            entry["rows"] = _median_rows(entry["rounds"], result["ceilings"])
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _median_rows(rounds: list, ceilings=None) -> list:
    """One row per case: the first round's, with the median of every round's median (and the
    per-round medians as ``rounds_us``) where there are several rounds."""
    if len(rounds) == 1:
        return rounds[0]
    out = []
    for row in rounds[0]:
        us = [r["median_us"] for rs in rounds for r in rs if r["name"] == row["name"]]
        med = sorted(us)[len(us) // 2]
        row = {**row, "median_us": med, "rounds_us": us,
               "TFLOPs": round(row["flops"] / (med * 1e-6) / 1e12, 1)}
        if ceilings:
            row["pct_of_matmul"] = round(100 * row["TFLOPs"] / ceilings["bf16_matmul_TFLOPs"], 1)
        out.append(row)
    return out


def peer(args) -> int:
    import flashinfer

    built = cases([int(i) for i in args.cases.split(",")] if args.cases else None)
    if args.warmup:
        return 0
    payload = {"label": "peer", "device": harness.device_info(),
               "flashinfer_version": getattr(flashinfer, "__version__", "?")}
    rounds = [time_cases(built) for _ in range(args.rounds)]
    payload["rows"] = _median_rows(rounds)
    Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")
    return 0


def merge(args) -> int:
    import schema

    ours_ = json.loads(Path(args.ours).read_text())
    peer_ = json.loads(Path(args.peer).read_text())
    prow = {r["name"]: r["median_us"] for r in peer_["rows"]}
    prounds = {r["name"]: r["rounds_us"] for r in peer_["rows"] if "rounds_us" in r}
    variants = ours_["variants"]
    chosen = args.variant or ("default" if "default" in variants else next(iter(variants)))
    table = {}
    for label, entry in variants.items():
        table[label] = {r["name"]: {"us": r["median_us"], "pct_of_matmul": r.get("pct_of_matmul"),
                                    "peer_over_ours": round(prow[r["name"]] / r["median_us"], 3)
                                    if r["name"] in prow else None,
                                    **({"rounds_us": r["rounds_us"]} if "rounds_us" in r else {})}
                        for r in entry["rows"]}
    cases_ = []
    for r in variants[chosen]["rows"]:
        case = {k: v for k, v in r.items() if k in schema.CASE_FIELDS}
        if r["name"] in prow:
            case["peer_us"] = prow[r["name"]]
            case["speedup_vs_peer"] = round(prow[r["name"]] / r["median_us"], 3)
        case["extra"] = {"variant": chosen, **{k: v for k, v in (
            ("rounds_us", r.get("rounds_us")), ("peer_rounds_us", prounds.get(r["name"])))
            if v is not None}}
        cases_.append(case)
    schema.write(args.out, schema.record(
        "sweep", args.topic, ours_["device"], commit=args.commit or None,
        ceilings=ours_["ceilings"], cases=cases_,
        note=f"ours (variant '{chosen}') and FlashInfer {peer_.get('flashinfer_version')} "
             "fa3 in two processes of one device call; CUDA-graph replays, cold L2, median; "
             "every variant of ours under extra.variants (peer / ours ratio per case)",
        variants=table, checks={k: v["check"] for k, v in variants.items()},
        build_s=ours_.get("build_s")))
    names = [r["name"] for r in variants[chosen]["rows"]]
    print(f"{'case':58s} {'peer':>8s} " + " ".join(f"{lbl[:22]:>22s}" for lbl in variants))
    for n in names:
        cells = [f"{table[lbl][n]['us']:9.1f} ({table[lbl][n]['peer_over_ours'] or 0:.2f})"
                 if n in table[lbl] else "-" for lbl in variants]  # a variant's own cases
        print(f"{n[:58]:58s} {prow.get(n, float('nan')):8.1f} " +
              " ".join(f"{c:>22s}" for c in cells))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("ours")
    o.add_argument("out")
    o.add_argument("variants", nargs="*")
    o.add_argument("--wait", default="", help="a file to wait for before timing (other builds)")
    o.add_argument("--wait-s", type=float, default=120.0, help="the longest wait, s")
    o.add_argument("--cases", default="", help="indices into CASES, comma-separated")
    o.add_argument("--rounds", type=int, default=1, help="every variant's cases N times, in turn")
    p = sub.add_parser("peer")
    p.add_argument("out")
    p.add_argument("--warmup", action="store_true")
    p.add_argument("--cases", default="", help="indices into CASES, comma-separated")
    p.add_argument("--rounds", type=int, default=1, help="the cases N times")
    m = sub.add_parser("merge")
    m.add_argument("out")
    m.add_argument("--ours", required=True)
    m.add_argument("--peer", required=True)
    m.add_argument("--commit", default="")
    m.add_argument("--variant", default="")
    m.add_argument("--topic", default="sm90-vs-peer", help="the record's topic (file name end)")
    st = sub.add_parser("stress")
    st.add_argument("variant", choices=list(VARIANTS))
    st.add_argument("n", type=int)
    args = ap.parse_args(argv)
    return {"ours": ours, "peer": peer, "merge": merge, "stress": stress}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

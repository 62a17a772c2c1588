"""Host time per call of small ops and plan/run paths, through the public API only.

    python benchmarks/host_cost.py measure --label ours OUT.json [--cases SUBSTR,...]
    python benchmarks/host_cost.py merge OURS.json PEER.json RESULT.json [--commit C]

``measure`` uses nothing but ``flashinfer``'s public names, so the same file runs against this
package or against the peer (FlashInfer 0.7.2) in a separate process (never both packages in
one process: both are ``flashinfer``). ``merge`` joins two such files into one results file
(device, commit, date, cases with both columns and the ratio ours / peer).

Per case: warm-up, then ``REPS`` repetitions of ``N`` back-to-back calls; ``host_us`` is the
median over repetitions of the wall time per call (no synchronization inside a repetition:
what an eager caller pays per layer; the GPU work of these calls is shorter than their host
work, so the queue never fills). ``gpu_us`` is the GPU time per call of the same call: the
stream is first held by a ~20 ms spin kernel so the host has queued all ``N_GPU`` calls before
the first runs, and CUDA events around them see only the GPU's work (launch gaps excluded).
``plan`` rows have no meaningful GPU time (they are host work plus uploads).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

N, REPS, WARMUP, N_GPU = 1000, 7, 100, 50
N_PLAN = 100  # plans are slower: fewer calls per repetition
HQ, HKV, D, PAGE, DT = 32, 8, 128, 16, torch.bfloat16


def _sync() -> None:
    torch.cuda.synchronize()


def host_us(fn: Callable[[], Any], n: int = N, reps: int = REPS) -> tuple[float, list[float]]:
    for _ in range(min(WARMUP, n)):
        fn()
    _sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
        _sync()
    return statistics.median(times), [round(t, 2) for t in times]


def gpu_us(fn: Callable[[], Any], n: int = N_GPU) -> Optional[float]:
    sleep = getattr(torch.cuda, "_sleep", None)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    vals = []
    for _ in range(3):
        _sync()
        if sleep is not None:
            sleep(40_000_000)  # ~20 ms of spinning at ~2 GHz: the host queues the calls meanwhile
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        vals.append(start.elapsed_time(end) / n * 1e3)
    return statistics.median(vals)


def _public(fi, *paths: str):
    """The first public name found among ``paths`` ("module.name" or "name"), e.g. merge_state
    lives in ``flashinfer.cascade`` and at the top level, depending on the release."""
    import importlib

    for p in paths:
        mod, _, name = p.rpartition(".")
        try:
            obj = importlib.import_module(f"flashinfer.{mod}") if mod else fi
        except ImportError:
            continue
        if hasattr(obj, name):
            return getattr(obj, name)
    raise AttributeError(f"none of {paths} in this flashinfer")


def _rand(*shape, dtype=DT):
    return torch.randn(*shape, dtype=dtype, device="cuda")


def build_cases(fi) -> dict[str, tuple[Callable[[], Any], dict]]:
    """name -> (call, info). Inputs are built once; every call reuses them."""
    cases: dict[str, tuple[Callable[[], Any], dict]] = {}

    # single-request attention
    single_decode = _public(fi, "decode.single_decode_with_kv_cache", "single_decode_with_kv_cache")
    q1, k512, v512 = _rand(HQ, D), _rand(512, HKV, D), _rand(512, HKV, D)
    cases["single_decode_with_kv_cache (kv 512)"] = (lambda: single_decode(q1, k512, v512), {})
    single_prefill = _public(fi, "prefill.single_prefill_with_kv_cache",
                             "single_prefill_with_kv_cache")
    q128, k128, v128 = _rand(128, HQ, D), _rand(128, HKV, D), _rand(128, HKV, D)
    cases["single_prefill_with_kv_cache (128 x 128, causal)"] = (
        lambda: single_prefill(q128, k128, v128, causal=True), {})

    # append 8 tokens, one per request, to a paged cache of 8 requests x 64 pages
    append = _public(fi, "page.append_paged_kv_cache", "append_paged_kv_cache")
    b, pages = 8, 64
    cache = _rand(b * pages, 2, PAGE, HKV, D)
    kv_indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * pages
    kv_indices = torch.randperm(b * pages, device="cuda").to(torch.int32)
    last = torch.full((b,), 5, dtype=torch.int32, device="cuda")
    batch_idx = torch.arange(b, dtype=torch.int32, device="cuda")
    positions = torch.full((b,), (pages - 1) * PAGE + 4, dtype=torch.int32, device="cuda")
    ak, av = _rand(b, HKV, D), _rand(b, HKV, D)
    cases["append_paged_kv_cache (8 tokens)"] = (
        lambda: append(ak, av, batch_idx, positions, cache, kv_indices, kv_indptr, last, "NHD"), {})

    merge_state = _public(fi, "cascade.merge_state", "merge_state")
    va, vb = _rand(1, 32, 128), _rand(1, 32, 128)
    sa, sb = _rand(1, 32, dtype=torch.float32), _rand(1, 32, dtype=torch.float32)
    cases["merge_state (1 x 32 x 128)"] = (lambda: merge_state(va, sa, vb, sb), {})

    fused_add = _public(fi, "norm.fused_add_rmsnorm", "fused_add_rmsnorm")
    rmsnorm = _public(fi, "norm.rmsnorm", "rmsnorm")
    x, r, w = _rand(1, 4096), _rand(1, 4096), _rand(4096)
    cases["fused_add_rmsnorm (1 x 4096)"] = (lambda: fused_add(x, r, w, 1e-6), {})
    cases["rmsnorm (1 x 4096)"] = (lambda: rmsnorm(x, w, 1e-6), {})
    if hasattr(F, "rms_norm"):
        cases["torch F.rms_norm (1 x 4096, reference)"] = (
            lambda: F.rms_norm(x, (4096,), w, 1e-6), {"reference": True})

    silu = _public(fi, "activation.silu_and_mul", "silu_and_mul")
    xa = _rand(1, 28672)
    cases["silu_and_mul (1 x 28672)"] = (lambda: silu(xa), {})

    rope = _public(fi, "rope.apply_rope_pos_ids", "apply_rope_pos_ids")
    rq, rk = _rand(8, HQ, D), _rand(8, HKV, D)
    pos = torch.randint(0, 4096, (8,), dtype=torch.int32, device="cuda")
    cases["apply_rope_pos_ids (8 tokens)"] = (lambda: rope(rq, rk, pos), {})

    small = _rand(128)
    cases["torch.add (one small kernel, reference)"] = (
        lambda: torch.add(small, small), {"reference": True})

    # ragged prefill plan, 4 requests x 128 (host metadata, as serving frameworks pass it)
    ragged_cls = _public(fi, "prefill.BatchPrefillWithRaggedKVCacheWrapper",
                         "BatchPrefillWithRaggedKVCacheWrapper")
    rw = ragged_cls(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")
    indptr4 = torch.arange(5, dtype=torch.int32) * 128
    cases["ragged prefill plan (4 x 128)"] = (
        lambda: rw.plan(indptr4, indptr4, HQ, HKV, D, causal=True, q_data_type=DT),
        {"plan": True})

    # batch decode, 8 requests x 1024 keys (host metadata)
    dec_cls = _public(fi, "decode.BatchDecodeWithPagedKVCacheWrapper",
                      "BatchDecodeWithPagedKVCacheWrapper")
    dw = dec_cls(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")
    dpages = 1024 // PAGE
    d_indptr = torch.arange(b + 1, dtype=torch.int32) * dpages
    d_indices = torch.randperm(b * dpages).to(torch.int32)
    d_last = torch.full((b,), PAGE, dtype=torch.int32)
    dcache = _rand(b * dpages, 2, PAGE, HKV, D)
    dq = _rand(b, HQ, D)

    def dplan():
        dw.plan(d_indptr, d_indices, d_last, HQ, HKV, D, PAGE, q_data_type=DT)

    dplan()
    cases["decode run (batch 8)"] = (lambda: dw.run(dq, dcache), {})
    cases["decode plan (batch 8)"] = (dplan, {"plan": True})
    return cases


def measure(args) -> int:
    import flashinfer as fi

    wanted = [s.strip() for s in args.cases.split(",")] if args.cases else None
    cases = build_cases(fi)
    rows = []
    for name, (fn, info) in cases.items():
        if wanted and not any(w in name for w in wanted):
            continue
        row: dict[str, Any] = {"name": name}
        try:
            fn()  # first call: compiles or loads the module
            _sync()
            n = N_PLAN if info.get("plan") else N
            row["host_us"], row["host_us_reps"] = host_us(fn, n)
            row["host_us"] = round(row["host_us"], 2)
            row["calls_per_rep"] = n
            if not info.get("plan"):
                row["gpu_us"] = round(gpu_us(fn), 2)
        except Exception as e:  # one failing row must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        row.update({k: v for k, v in info.items() if k != "plan"})
        rows.append(row)
        print(f"[{args.label}] {name:52s} host {row.get('host_us', 'ERR')!s:>8} us  "
              f"gpu {row.get('gpu_us', '-')!s:>8} us {row.get('error', '')}", flush=True)
    p = torch.cuda.get_device_properties(0)
    out = {
        "label": args.label,
        "flashinfer_version": getattr(fi, "__version__", "?"),
        "flashinfer_file": str(Path(fi.__file__).parent.name),
        "device": {"name": p.name, "capability": f"{p.major}.{p.minor}",
                   "torch": torch.__version__, "cuda": torch.version.cuda,
                   "cpu": platform.processor() or platform.machine()},
        "method": {"calls_per_rep": N, "plan_calls_per_rep": N_PLAN, "reps": REPS,
                   "warmup": WARMUP, "gpu_calls": N_GPU},
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def merge(args) -> int:
    ours = json.loads(Path(args.ours).read_text())
    peer = json.loads(Path(args.peer).read_text())
    prow = {r["name"]: r for r in peer["rows"]}
    cases = []
    for r in ours["rows"]:
        p = prow.get(r["name"], {})
        case = {"name": r["name"], "host_us": r.get("host_us"), "gpu_us": r.get("gpu_us"),
                "peer_host_us": p.get("host_us"), "peer_gpu_us": p.get("gpu_us")}
        if case["host_us"] and case["peer_host_us"]:
            case["host_ratio_ours_over_peer"] = round(case["host_us"] / case["peer_host_us"], 3)
            case["meets_peer"] = case["host_us"] <= case["peer_host_us"]
        for key in ("error",):
            if key in r:
                case[key] = r[key]
            if key in p:
                case["peer_" + key] = p[key]
        if r.get("reference"):
            case["reference"] = True
        cases.append(case)
    result = {
        "schema": "host-cost/1",
        "device": ours["device"],
        "commit": args.commit or _commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "peer": {"flashinfer_version": peer.get("flashinfer_version")},
        "method": ours.get("method", {}) | {
            "what": "wall time per call of back-to-back calls (median of reps); gpu_us: CUDA "
                    "events around calls queued behind a spin kernel",
            "same_run": "ours and the peer in two processes of one device call"},
        "cases": cases,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for c in cases:
        print(f"{c['name']:52s} ours {c['host_us']!s:>8}  peer {c['peer_host_us']!s:>8}  "
              f"ratio {c.get('host_ratio_ours_over_peer', '-')}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("out")
    m.add_argument("--label", default="ours")
    m.add_argument("--cases", default="", help="comma-separated substrings of case names")
    g = sub.add_parser("merge")
    g.add_argument("ours")
    g.add_argument("peer")
    g.add_argument("out")
    g.add_argument("--commit", default="")
    args = ap.parse_args(argv)
    return measure(args) if args.cmd == "measure" else merge(args)


if __name__ == "__main__":
    sys.exit(main())

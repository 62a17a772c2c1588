"""Host time per call of small ops and plan/run paths, through the public API only.

    python benchmarks/host_cost.py measure --label ours OUT.json [--cases SUBSTR,...]
    python benchmarks/host_cost.py warmup [--cases SUBSTR,...]   (first calls only: JIT builds)
    python benchmarks/host_cost.py merge RESULT.json --ours A.json [B.json] --peer C.json [D.json]

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_compare  # noqa: E402  (the command line and the join, shared with attention_vs_peer)
import schema  # noqa: E402  (benchmarks/schema.py: the results record)

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


Case = tuple[Callable[[], Any], dict]  # (the call, info: {"plan": True} / {"reference": True})


def _single_decode(fi) -> Case:
    f = _public(fi, "decode.single_decode_with_kv_cache", "single_decode_with_kv_cache")
    q, k, v = _rand(HQ, D), _rand(512, HKV, D), _rand(512, HKV, D)
    return lambda: f(q, k, v), {}


def _single_prefill(fi) -> Case:
    f = _public(fi, "prefill.single_prefill_with_kv_cache", "single_prefill_with_kv_cache")
    q, k, v = _rand(128, HQ, D), _rand(128, HKV, D), _rand(128, HKV, D)
    return lambda: f(q, k, v, causal=True), {}


def _append(fi) -> Case:
    """8 tokens, one per request, into a paged cache of 8 requests x 64 pages."""
    f = _public(fi, "page.append_paged_kv_cache", "append_paged_kv_cache")
    b, pages = 8, 64
    cache = _rand(b * pages, 2, PAGE, HKV, D)
    kv_indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * pages
    kv_indices = torch.randperm(b * pages, device="cuda").to(torch.int32)
    last = torch.full((b,), 5, dtype=torch.int32, device="cuda")
    batch_idx = torch.arange(b, dtype=torch.int32, device="cuda")
    positions = torch.full((b,), (pages - 1) * PAGE + 4, dtype=torch.int32, device="cuda")
    k, v = _rand(b, HKV, D), _rand(b, HKV, D)
    return lambda: f(k, v, batch_idx, positions, cache, kv_indices, kv_indptr, last, "NHD"), {}


def _merge_state(fi) -> Case:
    f = _public(fi, "cascade.merge_state", "merge_state")
    va, vb = _rand(1, 32, 128), _rand(1, 32, 128)
    sa, sb = _rand(1, 32, dtype=torch.float32), _rand(1, 32, dtype=torch.float32)
    return lambda: f(va, sa, vb, sb), {}


def _norm_inputs():
    return _rand(1, 4096), _rand(1, 4096), _rand(4096)


def _fused_add_rmsnorm(fi) -> Case:
    f = _public(fi, "norm.fused_add_rmsnorm", "fused_add_rmsnorm")
    x, r, w = _norm_inputs()
    return lambda: f(x, r, w, 1e-6), {}


def _rmsnorm(fi) -> Case:
    f = _public(fi, "norm.rmsnorm", "rmsnorm")
    x, _, w = _norm_inputs()
    return lambda: f(x, w, 1e-6), {}


def _torch_rms_norm(fi) -> Case:
    x, _, w = _norm_inputs()
    return lambda: F.rms_norm(x, (4096,), w, 1e-6), {"reference": True}


def _silu_and_mul(fi) -> Case:
    f = _public(fi, "activation.silu_and_mul", "silu_and_mul")
    x = _rand(1, 28672)
    return lambda: f(x), {}


def _rope(fi) -> Case:
    f = _public(fi, "rope.apply_rope_pos_ids", "apply_rope_pos_ids")
    q, k = _rand(8, HQ, D), _rand(8, HKV, D)
    pos = torch.randint(0, 4096, (8,), dtype=torch.int32, device="cuda")
    return lambda: f(q, k, pos), {}


def _torch_add(fi) -> Case:
    small = _rand(128)
    return lambda: torch.add(small, small), {"reference": True}


def _ragged_plan(fi) -> Case:
    """Ragged prefill plan, 4 requests x 128 (host metadata, as serving frameworks pass it)."""
    cls = _public(fi, "prefill.BatchPrefillWithRaggedKVCacheWrapper",
                  "BatchPrefillWithRaggedKVCacheWrapper")
    w = cls(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")
    indptr = torch.arange(5, dtype=torch.int32) * 128
    return lambda: w.plan(indptr, indptr, HQ, HKV, D, causal=True, q_data_type=DT), {"plan": True}


def _decode_wrapper(fi):
    """A batch decode wrapper of 8 requests x 1024 keys (host metadata) and its plan call."""
    cls = _public(fi, "decode.BatchDecodeWithPagedKVCacheWrapper",
                  "BatchDecodeWithPagedKVCacheWrapper")
    w = cls(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")
    b, pages = 8, 1024 // PAGE
    indptr = torch.arange(b + 1, dtype=torch.int32) * pages
    indices = torch.randperm(b * pages).to(torch.int32)
    last = torch.full((b,), PAGE, dtype=torch.int32)

    def plan():
        w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=DT)

    return w, plan, b * pages


def _decode_run(fi) -> Case:
    w, plan, pages = _decode_wrapper(fi)
    plan()
    cache, q = _rand(pages, 2, PAGE, HKV, D), _rand(8, HQ, D)
    return lambda: w.run(q, cache), {}


def _decode_plan(fi) -> Case:
    _, plan, _ = _decode_wrapper(fi)
    return plan, {"plan": True}


#: name -> factory, in the order of the issue's table (the references after their rows).
CASES: dict[str, Callable[[Any], Case]] = {
    "single_decode_with_kv_cache (kv 512)": _single_decode,
    "single_prefill_with_kv_cache (128 x 128, causal)": _single_prefill,
    "append_paged_kv_cache (8 tokens)": _append,
    "merge_state (1 x 32 x 128)": _merge_state,
    "fused_add_rmsnorm (1 x 4096)": _fused_add_rmsnorm,
    "rmsnorm (1 x 4096)": _rmsnorm,
    "torch F.rms_norm (1 x 4096, reference)": _torch_rms_norm,
    "silu_and_mul (1 x 28672)": _silu_and_mul,
    "apply_rope_pos_ids (8 tokens)": _rope,
    "torch.add (one small kernel, reference)": _torch_add,
    "ragged prefill plan (4 x 128)": _ragged_plan,
    "decode run (batch 8)": _decode_run,
    "decode plan (batch 8)": _decode_plan,
}


def _selected(args) -> tuple[Any, dict]:
    """The flashinfer module and name -> built case of the cases ``--cases`` selects (only
    those are built: a wrapper's plan may compile a module)."""
    import flashinfer as fi

    wanted = [s.strip() for s in args.cases.split(",") if s.strip()] if args.cases else None
    cases = {}
    for name, make in CASES.items():
        if wanted and not any(w in name for w in wanted):
            continue
        try:
            cases[name] = make(fi)
        except Exception as e:  # e.g. a name this release lacks: the row records the error
            err = f"{type(e).__name__}: {e}"[:500]

            def fail(err=err):
                raise RuntimeError(f"case setup failed: {err}")

            cases[name] = (fail, {})
    return fi, cases


def warmup(args) -> int:
    """One call of each selected case (compiles or loads its modules), nothing timed."""
    _, cases = _selected(args)
    failed = 0
    for name, (fn, _) in cases.items():
        t0 = time.perf_counter()
        try:
            fn()
            _sync()
            print(f"warm {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as e:
            failed += 1
            print(f"warm {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 1 if failed else 0


def measure(args) -> int:
    fi, cases = _selected(args)
    rows = []
    for name, (fn, info) in cases.items():
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
                   "cpu": _cpu_name()},
        "method": {"calls_per_rep": N, "plan_calls_per_rep": N_PLAN, "reps": REPS,
                   "warmup": WARMUP, "gpu_calls": N_GPU},
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def _cpu_name() -> str:
    info = Path("/proc/cpuinfo")
    models = [ln.split(":", 1)[1].strip() for ln in (info.read_text().splitlines()
              if info.exists() else []) if ln.startswith("model name")]
    return models[0] if models else platform.machine()


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _schema_case(c: dict) -> dict:
    """One merged row as a results-schema case: host time is the case's time."""
    case = {"name": c["name"], "group": "host", "median_us": c["host_us"],
            "timing": "host wall time per call, back-to-back calls, median of repetitions"}
    if c.get("peer_host_us"):
        case["peer_us"] = c["peer_host_us"]
        case["speedup_vs_peer"] = round(c["peer_host_us"] / c["host_us"], 3)
    case["extra"] = {k: v for k, v in c.items()
                     if k not in ("name", "host_us", "peer_host_us") and v is not None}
    return case


def merge(args) -> int:
    ours, peer, pairs = peer_compare.paired(args.ours, args.peer)
    cases = []
    for r, p in pairs:
        case = {"name": r["name"], "host_us": r.get("host_us"), "gpu_us": r.get("gpu_us"),
                "peer_host_us": p.get("host_us"), "peer_gpu_us": p.get("gpu_us"),
                "host_us_reps": r.get("host_us_reps"), "peer_host_us_reps": p.get("host_us_reps")}
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
    method = ours.get("method", {}) | {
        "what": "wall time per call of back-to-back calls (median of reps); gpu_us: CUDA "
                "events around calls queued behind a spin kernel",
        "same_run": "ours and the peer in two processes of one device call"}
    schema.write(args.out, schema.record(
        "benchmark", "host-cost", ours["device"], commit=args.commit or _commit(),
        cases=[_schema_case(c) for c in cases if c.get("host_us")],
        note="host time per call (not GPU time): ceilings do not apply",
        peer={"flashinfer_version": peer.get("flashinfer_version")}, method=method,
        failed=[c for c in cases if not c.get("host_us")]))
    for c in cases:
        print(f"{c['name']:52s} ours {c['host_us']!s:>8}  peer {c['peer_host_us']!s:>8}  "
              f"ratio {c.get('host_ratio_ours_over_peer', '-')}")
    return 0


def main(argv=None) -> int:
    args = peer_compare.command_line(__doc__, argv)
    return {"measure": measure, "warmup": warmup, "merge": merge}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

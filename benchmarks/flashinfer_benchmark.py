"""One command line for every op's benchmark, with FlashInfer's flags (benchmarks/README.md of
upstream), for our routines (benchmarks/routines.py)::

    python benchmarks/flashinfer_benchmark.py --routine BatchDecodeWithPagedKVCacheWrapper \\
        --backends fa2 fa3 cudnn --batch_size 32 --s_kv 2048 --num_qo_heads 32 \\
        --num_kv_heads 8 --head_dim_qk 128 --head_dim_vo 128 --page_size 16 --refcheck -vv
    python benchmarks/flashinfer_benchmark.py --testlist cases.txt --output_path out.csv

Beyond upstream, the ceilings (copy and read bandwidth, bf16 matmul rate; benchmarks/harness.py)
are measured once per process, first, and every row carries its ceiling and the percent of it.
``--list_routines`` and ``--plan_only`` need no GPU.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import routines  # noqa: E402

CSV_COLUMNS = [
    "routine", "backend", "case_tag", "median_time_ms", "std_time_ms", "p10_time_ms",
    "p90_time_ms", "tflops", "tb_per_sec", "bytes", "flops", "timing", "refcheck", "max_abs_err", "ceiling",
    "ceiling_value", "pct_of_ceiling", "copy_GBps", "read_GBps", "bf16_matmul_TFLOPs", "shape",
    "dtype", "gpu_name", "note", "args", "repro_command", "timer",
]
# timer: "cupti" (kernel time from CUPTI activity records) or "cuda_events" (CUDA events around
# a graph replay or the call; "timing" says which and why)

# flags the repro command never repeats
_NOT_CASE = {"testlist", "output_path", "generate_repro_command", "list_routines", "plan_only",
             "verbose", "record", "commit"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashinfer_benchmark.py", allow_abbrev=False,
        description="Benchmark FlashInfer ops against each other and PyTorch baselines.")
    g = p.add_argument_group("general")
    g.add_argument("--routine", choices=sorted(routines.ROUTINES), default=None)
    g.add_argument("--testlist", default=None, help="a file of command lines, one case each")
    g.add_argument("--backends", nargs="+", default=None,
                   help="ours: fa2 fa3 auto cubin cuda; baselines: torch cudnn flash")
    g.add_argument("--num_iters", type=int, default=30)
    g.add_argument("--dry_run_iters", type=int, default=5)
    g.add_argument("--no_cuda_graph", action="store_true")
    timer = g.add_mutually_exclusive_group()
    timer.add_argument("--use_cuda_events", action="store_true",
                       help="time with CUDA events even where cupti-python is installed")
    timer.add_argument("--use_cupti", action="store_true",
                       help="CUPTI (the default where it works) or stop: no fallback to events")
    g.add_argument("--refcheck", action="store_true")
    g.add_argument("--allow_output_mismatch", action="store_true")
    g.add_argument("--random_seed", type=int, default=42)
    g.add_argument("--output_path", default=None)
    g.add_argument("--case_tag", default=None)
    g.add_argument("--generate_repro_command", action="store_true")
    g.add_argument("-v", "--verbose", action="count", default=0)
    g.add_argument("--enable_pdl", action="store_true")
    g.add_argument("--list_routines", action="store_true", help="print the routines and exit")
    g.add_argument("--record", default=None,
                   help="also write a results record (benchmarks/schema.py) to this path")
    g.add_argument("--commit", default=None, help="the record's commit (default: git's)")
    g.add_argument("--plan_only", action="store_true",
                   help="parse every case and print its repro command; run nothing")
    a = p.add_argument_group("attention / paged cache")
    a.add_argument("--batch_size", type=int, default=1)
    a.add_argument("--s_qo", type=int, default=1)
    a.add_argument("--s_kv", type=int, default=1024)
    a.add_argument("--num_qo_heads", type=int, default=32)
    a.add_argument("--num_kv_heads", type=int, default=8)
    a.add_argument("--head_dim_qk", type=int, default=128)
    a.add_argument("--head_dim_vo", type=int, default=None)
    a.add_argument("--page_size", type=int, default=16)
    a.add_argument("--q_dtype", default="bfloat16")
    a.add_argument("--kv_dtype", default="bfloat16")
    a.add_argument("--causal", action="store_true")
    a.add_argument("--random_actual_seq_len", action="store_true")
    n = p.add_argument_group("norm / activation / rope / merges")
    n.add_argument("--hidden_size", type=int, default=4096)
    n.add_argument("--num_heads", type=int, default=None)
    n.add_argument("--input_dtype", default="bfloat16")
    n.add_argument("--eps", type=float, default=1e-6)
    n.add_argument("--seq_len", type=int, default=128)
    n.add_argument("--head_dim", type=int, default=128)
    n.add_argument("--rotary_dim", type=int, default=None)
    n.add_argument("--rope_scale", type=float, default=1.0)
    n.add_argument("--rope_theta", type=float, default=1e4)
    n.add_argument("--interleave", action="store_true")
    n.add_argument("--low_freq_factor", type=float, default=1.0)
    n.add_argument("--high_freq_factor", type=float, default=4.0)
    n.add_argument("--old_context_len", type=int, default=8192)
    n.add_argument("--num_states", type=int, default=2)
    s = p.add_argument_group("sampling / top-k")
    s.add_argument("--vocab_size", type=int, default=128256)
    s.add_argument("--top_k", type=int, default=50)
    s.add_argument("--top_p", type=float, default=0.9)
    s.add_argument("--min_p", type=float, default=0.1)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--filter_apply_order", choices=["top_k_first", "joint"],
                   default="top_k_first")
    s.add_argument("--num_speculate_tokens", type=int, default=5)
    s.add_argument("--max_len", type=int, default=4096)
    s.add_argument("--num_rows", type=int, default=None)
    return p


def parse_case(argv: Sequence[str]) -> argparse.Namespace:
    """One case's flags (a testlist line may start with ``python3 flashinfer_benchmark.py``)."""
    argv = list(argv)
    while argv and not argv[0].startswith("-"):
        argv.pop(0)
    args = build_parser().parse_args(argv)
    if args.routine is None and not (args.testlist or args.list_routines):
        build_parser().error("one of --routine, --testlist or --list_routines is required")
    if args.routine is not None:
        routine = routines.ROUTINES[args.routine]
        if args.backends is None:
            args.backends = list(routine.default_backends)
        bad = [b for b in args.backends if b not in routine.backends]
        if bad:
            build_parser().error(f"--backends {' '.join(bad)}: {args.routine} takes "
                                 f"{', '.join(routine.backends)}")
        if args.num_iters < 1 or args.dry_run_iters < 0:
            build_parser().error("--num_iters must be >= 1 and --dry_run_iters >= 0")
        if args.num_qo_heads % args.num_kv_heads:
            build_parser().error("--num_qo_heads must be a multiple of --num_kv_heads")
    return args


def read_testlist(path: Path) -> List[argparse.Namespace]:
    """Every case of a testlist: one command line per line; blank lines and ``#`` comments
    skipped."""
    cases = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            cases.append(parse_case(shlex.split(line, comments=True)))
    return cases


def repro_command(args: argparse.Namespace) -> str:
    """The command line that reruns this case: the routine and every flag off its default."""
    defaults = vars(build_parser().parse_args(["--routine", args.routine]))
    parts = ["python3", "benchmarks/flashinfer_benchmark.py", "--routine", args.routine]
    for key, value in vars(args).items():
        if key in _NOT_CASE or key == "routine" or value == defaults.get(key):
            continue
        if key == "backends" and list(value) == list(routines.ROUTINES[args.routine]
                                                     .default_backends):
            continue
        if isinstance(value, bool):
            parts.append(f"--{key}")
        elif isinstance(value, list):
            parts += [f"--{key}", *map(str, value)]
        else:
            parts += [f"--{key}", str(value)]
    if args.verbose:
        parts.append("-" + "v" * args.verbose)
    return " ".join(shlex.quote(p) for p in parts)


def list_routines() -> str:
    lines = []
    for name, r in sorted(routines.ROUTINES.items(), key=lambda kv: (kv[1].group, kv[0])):
        need = f"  (needs {', '.join(r.needs)})" if r.needs else ""
        lines.append(f"{r.group:<10} {name:<40} backends: {' '.join(r.backends)}{need}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


class CuptiRequired(SystemExit):
    """--use_cupti where CUPTI cannot run: stops the whole run, testlist included."""


_TIMER: Dict[str, Any] = {}  # the process's CUPTI verdict and whether it was announced


def cupti_reason() -> Optional[str]:
    """None where CUPTI timing works here, else why not (flashinfer.testing's probe, once)."""
    if "reason" not in _TIMER:
        from flashinfer.testing import cupti_unavailable_reason

        _TIMER["reason"] = cupti_unavailable_reason()
    return _TIMER["reason"]


def _use_cupti(args) -> bool:
    """CUPTI unless --use_cuda_events or it cannot run here (then one message says why, and
    --use_cupti stops the run)."""
    if args.use_cuda_events:
        return False
    reason = cupti_reason()
    if reason is None:
        if not _TIMER.get("told"):
            print("[INFO] timing with CUPTI: each call's kernel time from activity records "
                  "(--use_cuda_events for CUDA events)", flush=True)
        _TIMER["told"] = True
        return True
    if args.use_cupti:
        raise CuptiRequired(f"--use_cupti: CUPTI timing cannot run here: {reason}")
    if not _TIMER.get("told"):
        print(f"[INFO] CUPTI timing is not used: {reason}. Timing with CUDA events"
              + ("" if args.no_cuda_graph else " around CUDA-graph replays"), flush=True)
    _TIMER["told"] = True
    return False


_CEILINGS: Dict[str, Any] = {}


def ceilings() -> Dict[str, Any]:
    if not _CEILINGS:
        import harness

        _CEILINGS.update(harness.measure_ceilings())
        print(f"[INFO] ceilings: copy {_CEILINGS['copy_GBps']:.0f} GB/s, read "
              f"{_CEILINGS['read_GBps']:.0f} GB/s, bf16 matmul "
              f"{_CEILINGS['bf16_matmul_TFLOPs']:.0f} TFLOP/s", flush=True)
    return _CEILINGS


def run_case(args: argparse.Namespace, cupti: Optional[bool] = None) -> List[Dict[str, Any]]:
    """Time every backend of one case; one CSV row per backend."""
    import torch

    from flashinfer.testing import set_seed

    routine = routines.ROUTINES[args.routine]
    for module in routine.needs:
        if importlib.util.find_spec(module) is None:
            print(f"[WARNING] {args.routine}: {module} is not present; skipped", flush=True)
            return [_row(args, b, note=f"{module} not present") for b in args.backends]
    cupti = _use_cupti(args) if cupti is None else cupti
    ceil = ceilings()
    set_seed(args.random_seed)
    repro = repro_command(args)
    print(f"[INFO] Running {args.routine}", flush=True)
    if args.verbose >= 1:
        print(f"[INFO] args = {args}")
    if args.generate_repro_command:
        print(f"[INFO] To reproduce this test case, run the following command: {repro}")
    try:
        built = routine.build(args, args.backends)
    except Exception as e:  # a case that cannot be built (bad sizes, missing module)
        print(f"[ERROR] {args.routine}: {type(e).__name__}: {e}", flush=True)
        return [_row(args, b, note=f"{type(e).__name__}: {e}", repro=repro)
                for b in args.backends]
    if args.verbose >= 2:
        print(f"[VVERBOSE] gpu_name = {torch.cuda.get_device_name()!r}")
        print(f"[VVERBOSE] shape {built.shape} dtype {built.dtype}")
    reference = built.reference() if args.refcheck else None
    rows = []
    for backend in args.backends:
        if backend in built.skipped or backend not in built.fns:
            why = built.skipped.get(backend, "not available for this case")
            print(f"[WARNING] {backend} for {args.routine}: {why}. Skipping.")
            rows.append(_row(args, backend, note=why, repro=repro, built=built))
            continue
        fn = built.fns[backend]
        refcheck, err, note = "", "", ""
        if args.refcheck:
            check_fn = getattr(built, "check_fns", {}).get(backend, fn)
            try:
                ok, worst, note = built.check(check_fn(), reference)
            except Exception as e:
                ok, worst, note = False, float("inf"), f"{type(e).__name__}: {e}"
            refcheck, err = ("pass" if ok else "FAIL"), f"{worst:.4g}"
            if not ok:
                print(f"[ERROR] {backend} output mismatch vs the float32 reference "
                      f"(max abs err {worst:.4g}) {note}", flush=True)
                if not args.allow_output_mismatch:
                    raise SystemExit(f"{args.routine}/{backend}: refcheck failed "
                                     "(--allow_output_mismatch to continue)")
        try:
            times, timing = _time(args, fn, cupti, graph=backend not in built.no_graph)
        except Exception as e:  # e.g. a backend whose kernel cannot load here
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            print(f"[ERROR] {backend} for {args.routine} failed: {why}", flush=True)
            rows.append(_row(args, backend, note=f"{note} {why}".strip(), repro=repro,
                             built=built))
            continue
        rows.append(_timed_row(args, backend, times, timing, built, ceil, refcheck, err, note,
                               repro))
        torch.cuda.empty_cache()
    return rows


def _time(args, fn, cupti: bool, graph: bool = True):
    """(per-call ms, how): CUPTI where it runs (kernel time of eager calls, L2 flushed before
    each), else CUDA events around a CUDA graph of one call per replay, else (--no_cuda_graph, or
    a call that cannot be captured) CUDA events around the call."""
    import harness

    kw = dict(num_iters=args.num_iters, dry_run_iters=args.dry_run_iters)
    if cupti:
        from flashinfer.testing import CuptiUnavailable

        try:
            return (harness.time_ms(fn, use_cuda_graph=False, use_cupti=True, **kw),
                    "cupti (kernel busy time per call, cold L2)")
        except CuptiUnavailable as e:  # this call only: the row says so
            if args.use_cupti:
                raise CuptiRequired(f"--use_cupti: CUPTI failed: {e}") from e
            print(f"[WARNING] CUPTI failed for this call ({e}); CUDA events instead", flush=True)
            times, how = _time(args, fn, False, graph)
            return times, f"{how} (CUPTI failed: {str(e)[:120]})"
    if graph and not args.no_cuda_graph:
        try:
            return harness.time_ms(fn, use_cuda_graph=True, **kw), "cuda graph replay"
        except Exception as e:  # not capturable: time it eagerly
            import torch

            torch.cuda.synchronize()
            how = f"cuda events (graph capture failed: {type(e).__name__})"
            return harness.time_ms(fn, use_cuda_graph=False, **kw), how
    return harness.time_ms(fn, use_cuda_graph=False, **kw), "cuda events"


def _row(args, backend, note="", repro="", built=None) -> Dict[str, Any]:
    row = {c: "" for c in CSV_COLUMNS}
    row.update(routine=args.routine, backend=backend, case_tag=args.case_tag or "", note=note,
               args=" ".join(f"--{k} {v}" for k, v in vars(args).items()
                             if k not in _NOT_CASE and v not in (None, False)),
               repro_command=repro if args.generate_repro_command else "")
    if built is not None:
        row.update(shape=built.shape, dtype=built.dtype)
    for key in ("copy_GBps", "read_GBps", "bf16_matmul_TFLOPs"):
        if key in _CEILINGS:
            row[key] = round(_CEILINGS[key], 1)
    return row


def _timed_row(args, backend, times, timing, built, ceil, refcheck, err, note, repro):
    import torch

    med = statistics.median(times)
    pick = lambda q: sorted(times)[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    row = _row(args, backend, note=note, repro=repro, built=built)
    tflops = built.flops / (med * 1e-3) / 1e12 if built.flops else 0.0
    tbps = built.bytes / (med * 1e-3) / 1e12 if built.bytes else 0.0
    key = {"copy": "copy_GBps", "read": "read_GBps", "matmul": "bf16_matmul_TFLOPs"}[built.ceiling]
    achieved = tflops if built.ceiling == "matmul" else tbps * 1e3
    row.update(median_time_ms=round(med, 5),
               std_time_ms=round(statistics.pstdev(times), 5) if len(times) > 1 else 0.0,
               p10_time_ms=round(pick(0.1), 5), p90_time_ms=round(pick(0.9), 5),
               tflops=round(tflops, 3), tb_per_sec=round(tbps, 4), timing=timing,
               bytes=built.bytes or "", flops=built.flops or "",
               refcheck=refcheck, max_abs_err=err, ceiling=built.ceiling,
               ceiling_value=round(ceil[key], 1),
               pct_of_ceiling=round(100 * achieved / ceil[key], 1),
               gpu_name=torch.cuda.get_device_name(),
               timer="cupti" if timing.startswith("cupti") else "cuda_events")
    print(f"[PERF] {backend:<14} :: median time {med:.3f} ms; std {row['std_time_ms']:.3f} ms; "
          f"achieved tflops {tflops:.3f} TFLOPs/sec; achieved tb_per_sec {tbps:.3f} TB/sec; "
          f"{row['pct_of_ceiling']}% of {built.ceiling}", flush=True)
    return row


def write_csv(path: Path, rows: List[Dict[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)


def record_cases(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The timed rows as results-schema cases (benchmarks/schema.py): group = the routine's
    group, name = routine, backend and shape."""
    cases = []
    for row in rows:
        if row["median_time_ms"] in ("", None):
            continue
        med_us = float(row["median_time_ms"]) * 1e3
        case: Dict[str, Any] = {
            "name": f"{row['routine']} [{row['backend']}] {row['shape']} {row['dtype']}".strip()
                    + (f" ({row['case_tag']})" if row["case_tag"] else ""),
            "group": routines.ROUTINES[row["routine"]].group,
            "median_us": round(med_us, 3), "p10_us": round(float(row["p10_time_ms"]) * 1e3, 3),
            "p90_us": round(float(row["p90_time_ms"]) * 1e3, 3),
            "timing": f"{row['timing']} (flashinfer_benchmark.py)",
            "extra": {"backend": row["backend"], "refcheck": row["refcheck"] or "not run",
                      "max_abs_err": row["max_abs_err"], "repro_command": row["repro_command"]},
        }
        if row["bytes"]:
            gbps = float(row["bytes"]) / (med_us * 1e-6) / 1e9
            case.update(bytes=int(row["bytes"]), GBps=round(gbps, 1),
                        pct_of_copy=round(100 * gbps / float(row["copy_GBps"]), 1),
                        pct_of_read=round(100 * gbps / float(row["read_GBps"]), 1))
        if row["flops"]:
            tflops = float(row["flops"]) / (med_us * 1e-6) / 1e12
            case.update(flops=float(row["flops"]), TFLOPs=round(tflops, 1),
                        pct_of_matmul=round(100 * tflops / float(row["bf16_matmul_TFLOPs"]), 1))
        if f"pct_of_{row['ceiling']}" in case:
            case["ceiling"] = row["ceiling"]
        cases.append(case)
    return cases


def write_record(path: Path, rows: List[Dict[str, Any]], commit: Optional[str],
                 topic: Optional[str] = None) -> None:
    import harness

    topic = topic or Path(path).stem.split("-", 5)[-1]
    rec = harness.record("benchmark", topic, commit=commit, ceilings=dict(_CEILINGS),
                         cases=record_cases(rows),
                         note="benchmarks/flashinfer_benchmark.py: one case per routine and "
                              "backend; ours against PyTorch baselines in the same run")
    harness.write(Path(path), rec)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_case(sys.argv[1:] if argv is None else argv)
    if args.list_routines:
        print(list_routines())
        return 0
    cases = read_testlist(Path(args.testlist)) if args.testlist else [args]
    if args.testlist:  # the command line's output and repro flags apply to every case
        for case in cases:
            case.generate_repro_command |= args.generate_repro_command
            case.verbose = max(case.verbose, args.verbose)
            if args.use_cuda_events or args.use_cupti:  # the command line's timer wins
                case.use_cuda_events, case.use_cupti = args.use_cuda_events, args.use_cupti
    if args.plan_only:
        for case in cases:
            print(repro_command(case))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark (--plan_only and --list_routines run "
              "without one)", file=sys.stderr)
        return 2
    if any(case.use_cupti for case in cases) and cupti_reason() is not None:
        print(f"--use_cupti: CUPTI timing cannot run here: {cupti_reason()}", file=sys.stderr)
        return 2  # before any case runs
    rows: List[Dict[str, Any]] = []
    failed = 0
    for case in cases:
        try:
            rows += run_case(case)
        except CuptiRequired:
            raise
        except SystemExit as e:  # a refcheck failure without --allow_output_mismatch
            print(f"[ERROR] {e}", flush=True)
            failed += 1
            if not args.testlist:
                raise
        if args.output_path:  # after every case, so a crash keeps what was measured
            write_csv(Path(args.output_path), rows)
        if args.record and rows:
            write_record(Path(args.record), rows, args.commit)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The Hopper kernel's variants timed three ways in one process: eager calls between CUDA events
(attention_vs_peer's prefill rows), one-call CUDA-graph replays (sm90_vs_peer's rows) and the
kernel's own duration from CUPTI (eager calls), each after a read flush. Where the eager time
exceeds the CUPTI time, the GPU waited for the host between the events.

    python benchmarks/probes/sm90_eager_vs_graph.py OUT.json [--rounds 3] [--cases 2,4,10,13]
        [variant ...]   (names of benchmarks/tuning/sm90_vs_peer.py's VARIANTS; default:
                         "default" and "O by row stores")
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tuning"))
import sm90_vs_peer as sw  # noqa: E402

import harness  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("variants", nargs="*", default=["default", "O by row stores"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="2,4,10,13")
    a = ap.parse_args()
    from flashinfer.jit.core import get_module

    built = {n: sw._specs(sw.VARIANTS[n]) for n in a.variants}
    t = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(get_module, [s for m in built.values() for s in m.values()]))
    print(f"built {len(built)} variants in {time.monotonic() - t:.0f} s", flush=True)
    which = [int(i) for i in a.cases.split(",")]
    rows: dict = {}
    for rnd in range(a.rounds):
        for n in a.variants:
            sw._use(built[n])
            for case in sw.cases(which):
                case.fn()
                eager = harness._median_ms(case.fn, use_cuda_graph=False)[0] * 1e3
                graph = harness._median_ms(case.fn, use_cuda_graph=True)[0] * 1e3
                try:
                    k = harness.time_ms(case.fn, num_iters=30, dry_run_iters=5,
                                        use_cuda_graph=False, use_cupti=True)
                    cupti = sorted(k)[len(k) // 2] * 1e3
                except Exception as e:  # noqa: BLE001 - no CUPTI: say so, keep the others
                    cupti = None
                    print(f"cupti: {type(e).__name__}: {e}", flush=True)
                r = rows.setdefault(n, {}).setdefault(case.name, {"eager": [], "graph": [],
                                                                   "cupti": []})
                r["eager"].append(round(eager, 2))
                r["graph"].append(round(graph, 2))
                r["cupti"].append(round(cupti, 2) if cupti else None)
                print(f"round {rnd + 1} {n[:20]:<20} {case.name[:52]:<52} eager {eager:8.1f} "
                      f"graph {graph:8.1f} cupti {cupti or 0:8.1f}", flush=True)
    Path(a.out).write_text(json.dumps({"device": harness.device_info(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

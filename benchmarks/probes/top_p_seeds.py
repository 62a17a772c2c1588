"""Top-p and min-p sampling's time over explicit seeds (rows of 128256 fp32, bench_sampling's
inputs): on the direct path a top-p row runs a counting pass only where a candidate falls into
the histogram bin of its threshold, which depends on the seed, so one seed's time says little
(the peer's rejection rounds depend on its draws too). Also p = 1 (no verdict) and plain
sampling, the floors top-p's extra work stands on; with --graph-ops, K seedless calls (the
default generator) captured in one graph, per call: a graph that follows the generator pays
torch's replay prologue once, whatever K.

    python benchmarks/probes/top_p_seeds.py OUT.json [--batches 64,128] [--seeds 8]
        [--graph-ops 1,8]

Times with bench_sampling.time_us (one CUDA-graph replay per timing after an L2 flush, median of
60); prints a line per (op, batch, seed) and writes them as JSON. Runs with whichever
flashinfer is importable (ours, or the peer's on its path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_sampling  # noqa: E402


def _ops(fi, probs):
    """(name, fn(**rng)) for the timed ops on `probs`: rng is seed / offset, or nothing (the
    default generator)."""
    return [
        ("sampling_from_probs", lambda **rng: fi.sampling_from_probs(probs, **rng)),
        ("top_p 1.0", lambda **rng: fi.top_p_sampling_from_probs(probs, 1.0, **rng)),
        ("top_p 0.9", lambda **rng: fi.top_p_sampling_from_probs(probs, 0.9, **rng)),
        ("min_p 0.1", lambda **rng: fi.min_p_sampling_from_probs(probs, 0.1, **rng)),
    ]


#: The ops timed over --seeds seeds (the others over 2) and, with --graph-ops, seedless: their
#: time depends on the draws.
SPREAD = ("top_p 0.9", "min_p 0.1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batches", default="64,128,256")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--graph-ops", default="",
                    help="comma-separated K: also time K seedless calls in one graph (per call)")
    a = ap.parse_args()
    import flashinfer

    rows = []
    for b in map(int, a.batches.split(",")):
        ops = _ops(flashinfer, bench_sampling._inputs(b)[1])
        for name, op in ops:
            times = []
            for seed in range(a.seeds if name in SPREAD else 2):
                us, mode = bench_sampling.time_us(lambda seed=seed, op=op: op(seed=seed, offset=0))
                times.append(round(us, 2))
                rows.append({"op": name, "batch": b, "seed": seed, "median_us": round(us, 2)})
            print(f"{name:<20} {b:4d}  median {statistics.median(times):7.1f} us  "
                  f"min {min(times):7.1f}  max {max(times):7.1f}  {times}", flush=True)
        for k in [int(x) for x in a.graph_ops.split(",") if x]:
            for name, op in ((n, f) for n, f in ops if n in SPREAD):
                us, mode = bench_sampling.time_us(lambda op=op, k=k: [op() for _ in range(k)])
                rows.append({"op": f"{name} generator", "batch": b, "graph_ops": k,
                             "median_us": round(us / k, 2)})
                print(f"{name} generator x{k:<3} {b:4d}  {us / k:7.1f} us a call", flush=True)
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "timing": mode,
                                       "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

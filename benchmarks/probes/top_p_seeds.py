"""Top-p sampling's time over explicit seeds (rows of 128256 fp32, bench_sampling's inputs): on
the direct path a row runs a counting pass only where a candidate falls into the histogram bin
of its threshold, which depends on the seed, so one seed's time says little. Also p = 1 (no
verdict) and plain sampling, the floors top-p's extra work stands on.

    python benchmarks/probes/top_p_seeds.py OUT.json [--batches 64,128] [--seeds 8]

Times with bench_sampling.time_us (one CUDA-graph replay per timing after an L2 flush, median of
60); prints a line per (op, batch, seed) and writes them as JSON.
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
    """(name, fn(seed)) for the timed ops on `probs`."""
    return [
        ("sampling_from_probs", lambda s: fi.sampling_from_probs(probs, seed=s, offset=0)),
        ("top_p 1.0", lambda s: fi.top_p_sampling_from_probs(probs, 1.0, seed=s, offset=0)),
        ("top_p 0.9", lambda s: fi.top_p_sampling_from_probs(probs, 0.9, seed=s, offset=0)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batches", default="64,128,256")
    ap.add_argument("--seeds", type=int, default=8)
    a = ap.parse_args()
    import flashinfer

    rows = []
    for b in map(int, a.batches.split(",")):
        for name, op in _ops(flashinfer, bench_sampling._inputs(b)[1]):
            times = []
            for seed in range(a.seeds if name == "top_p 0.9" else 2):
                us, mode = bench_sampling.time_us(lambda seed=seed, op=op: op(seed))
                times.append(round(us, 2))
                rows.append({"op": name, "batch": b, "seed": seed, "median_us": round(us, 2)})
            print(f"{name:<20} {b:4d}  median {statistics.median(times):7.1f} us  "
                  f"min {min(times):7.1f}  max {max(times):7.1f}  {times}", flush=True)
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "timing": mode,
                                       "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

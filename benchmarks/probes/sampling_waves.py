"""How the sampling kernels' time grows with the batch (rows of 128256 fp32), to tell per-row
latency in waves of resident clusters from bandwidth: each row is held in shared memory by a
cluster of CTAs, so only so many rows are resident at once; if a wave of them loads and then
computes with HBM idle, the time steps up once per wave.

    python benchmarks/probes/sampling_waves.py OUT.json [--ops sampling_from_probs,...]

Times with bench_sampling.time_us (one CUDA-graph replay per timing after an L2 flush, median of
60). Prints one line per (op, batch) and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_sampling  # noqa: E402

BATCHES = (1, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 160, 192, 256)
OPS = {
    "sampling_from_probs": (),
    "min_p_sampling_from_probs": (0.1,),
    "top_p_sampling_from_probs": (0.9,),
    "top_k_sampling_from_probs": (50,),
    "top_k_renorm_probs": (50,),
}


def _call(fn, batch: int, args: tuple):
    """fn(probs, *args) on `batch` rows of bench_sampling's probabilities."""
    _, probs = bench_sampling._inputs(batch)
    return lambda: fn(probs, *args)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    a = ap.parse_args()
    import flashinfer

    rows = []
    for op in a.ops.split(","):
        for b in map(int, a.batches.split(",")):
            us, mode = bench_sampling.time_us(_call(getattr(flashinfer, op), b, OPS[op]))
            rows.append({"op": op, "batch": b, "median_us": round(us, 2)})
            print(f"{op:<28} {b:4d} {us:8.1f} us  {b * 128256 * 4 / us / 1e3:7.0f} GB/s",
                  flush=True)
            torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "timing": mode,
                                       "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

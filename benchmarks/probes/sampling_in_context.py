"""Sampling where engines call it: after another kernel of ours in the same captured graph (our
softmax or top-k renorm lets the next kernel launch early through PDL, so the direct kernels'
clusters meet SMs their predecessor still holds), and on sparse rows (top_k_renorm_probs output,
k nonzeros a row). Rows of 128256 fp32 (bench_sampling's inputs), seed and offset given; times
with bench_sampling.time_us (one CUDA-graph replay per timing after an L2 flush, median of 60).

    python benchmarks/probes/sampling_in_context.py LABEL

Prints one line per case: LABEL, case, us (the sparse cases: one time per seed 0, 1, 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_sampling  # noqa: E402


def main(label: str) -> None:
    import flashinfer as fi

    logits, probs = bench_sampling._inputs(128)

    def top_p(x, s=0):
        return fi.top_p_sampling_from_probs(x, 0.9, seed=s, offset=0)

    def min_p(x, s=0):
        return fi.min_p_sampling_from_probs(x, 0.1, seed=s, offset=0)

    pairs = {
        "top_p alone": lambda: top_p(probs),
        "min_p alone": lambda: min_p(probs),
        "softmax alone": lambda: fi.softmax(logits),
        "softmax + top_p": lambda: top_p(fi.softmax(logits)),
        "softmax + min_p": lambda: min_p(fi.softmax(logits)),
        "top_k_renorm 50 alone": lambda: fi.top_k_renorm_probs(probs, 50),
        "top_k_renorm 1000 + top_p": lambda: top_p(fi.top_k_renorm_probs(probs, 1000)),
    }
    for name, fn in pairs.items():
        print(f"{label:<6} {name:<28} {bench_sampling.time_us(fn)[0]:7.2f} us", flush=True)
    for k in (50, 1000, 20000):
        sparse = fi.top_k_renorm_probs(probs, k)
        torch.cuda.synchronize()
        ops = (("plain", lambda x, s: fi.sampling_from_probs(x, seed=s, offset=0)),
               ("min_p 0.1", min_p), ("top_p 0.9", top_p))
        for name, fn in ops:
            ts = [round(bench_sampling.time_us(lambda s=s, fn=fn, x=sparse: fn(x, s))[0], 1)
                  for s in range(3)]
            print(f"{label:<6} sparse k={k:<6} {name:<10} {ts} us", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ours")

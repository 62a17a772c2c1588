"""Softmax and a same-size copy over batches and vocabularies, one timer
(bench_sampling.time_us: one CUDA-graph replay per timing after an L2 flush, median of 60),
under whichever ``flashinfer`` is first on PYTHONPATH (ours or the peer). The copy (torch) is the
transforms' floor at each shape.

    python benchmarks/probes/softmax_shapes.py LABEL [B,V ...]

Prints one line per shape: LABEL, B, V, softmax us, copy us, softmax % of copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_sampling  # noqa: E402

SHAPES = [(1, 128256), (16, 128256), (32, 128256), (48, 128256), (64, 128256), (100, 128256),
          (128, 128256), (132, 128256), (160, 128256), (256, 128256), (128, 151936),
          (64, 256000)]


def main(label: str, shapes: list[tuple[int, int]]) -> None:
    import flashinfer as fi

    for b, v in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        logits = torch.randn(b, v, device="cuda", generator=g) * 2
        out = torch.empty_like(logits)
        soft, _ = bench_sampling.time_us(lambda x=logits: fi.softmax(x))
        copy, _ = bench_sampling.time_us(lambda x=logits, y=out: y.copy_(x))
        print(f"{label} {b} {v} {soft:.2f} {copy:.2f} {100 * copy / soft:.1f}", flush=True)
        del logits, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    pairs = [tuple(int(x) for x in a.split(",")) for a in sys.argv[2:]]
    main(sys.argv[1], pairs or SHAPES)

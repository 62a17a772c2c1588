"""The (B, V) transforms and a same-size copy over batches and vocabularies, one timer
(bench_sampling.time_us: one CUDA-graph replay per timing after an L2 flush, median of 60),
under whichever ``flashinfer`` is first on PYTHONPATH (ours or the peer). The copy (torch) is the
transforms' floor at each shape.

    python benchmarks/probes/transform_shapes.py LABEL OP[,OP...] [B,V ...] [--low-quarter]

OP: softmax, maskK (top_k_mask_logits, k = K), renormK (top_k_renorm_probs), toppP
(top_p_renorm_probs, p = P / 100). Prints one line per op and shape: LABEL, op, B, V, us, copy us,
% of copy. --low-quarter: every row's first quarter 40 lower (logits; its probabilities ~e^-40
as small), a row whose prefix is unlike the rest (the top-k stream's list overflows).
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


def call(op: str):
    import flashinfer as fi

    if op == "softmax":
        return lambda x: fi.softmax(x), False
    if op.startswith("mask"):
        return lambda x, k=int(op[4:]): fi.top_k_mask_logits(x, k), False
    if op.startswith("renorm"):
        return lambda x, k=int(op[6:]): fi.top_k_renorm_probs(x, k), True
    if op.startswith("topp"):
        return lambda x, p=int(op[4:]) / 100: fi.top_p_renorm_probs(x, p), True
    raise ValueError(f"op must be softmax, maskK, renormK or toppP, got {op!r}")


def main(label: str, ops: list[str], shapes: list[tuple[int, int]], low_quarter: bool) -> None:
    for b, v in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        logits = torch.randn(b, v, device="cuda", generator=g) * 2
        if low_quarter:
            logits[:, : v // 4] -= 40
        probs = torch.softmax(logits, -1)
        out = torch.empty_like(logits)
        copy, _ = bench_sampling.time_us(lambda x=logits, y=out: y.copy_(x))
        for op in ops:
            fn, on_probs = call(op)
            us, _ = bench_sampling.time_us(lambda f=fn, x=probs if on_probs else logits: f(x))
            print(f"{label} {op} {b} {v} {us:.2f} {copy:.2f} {100 * copy / us:.1f}", flush=True)
        del logits, probs, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    args = [a for a in sys.argv[3:] if a != "--low-quarter"]
    pairs = [tuple(int(x) for x in a.split(",")) for a in args]
    main(sys.argv[1], sys.argv[2].split(","), pairs or SHAPES, "--low-quarter" in sys.argv[3:])

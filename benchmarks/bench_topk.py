"""flashinfer.topk: top_k on the issue's shapes and the fused DSA index transforms.

Targets (H100): top_k 128 x 128256 float32 with k = 50 and 1024, and the DSA shape 64 x 65536
with k = 2048: >= 3x torch.topk and >= 1.0x FlashInfer 0.7.2. bytes_moved = the input read once
plus the outputs written once.

Two ways to run it:
- ``benchmarks/run.py --ops topk``: the cases below through the harness (ours and torch.topk).
- ``python benchmarks/bench_topk.py --out X.json [--peer]``: the same shapes with one small timer
  that works for any FlashInfer (CUDA-graph replay of one call after a read of 256 MiB, median of
  many), so this package and the peer, run as two processes in the same GPU call, are timed alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import flashinfer

ROWS, VOCAB, DSA_ROWS, DSA_LEN, DSA_K = 128, 128256, 64, 65536, 2048


def _inputs(rows, d, dtype=torch.float32, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(rows, d, device="cuda", generator=g).to(dtype)


def _dsa_inputs():
    x = _inputs(DSA_ROWS, DSA_LEN, seed=1)
    lengths = torch.full((DSA_ROWS,), DSA_LEN, device="cuda", dtype=torch.int32)
    table = torch.randint(0, 1 << 20, (DSA_ROWS, DSA_LEN), device="cuda", dtype=torch.int32)
    offsets = torch.arange(DSA_ROWS, device="cuda", dtype=torch.int32) * DSA_LEN
    return x, lengths, table, offsets


def specs(with_torch: bool):
    """(name, fn, bytes_moved, target) of every case."""
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        x = _inputs(ROWS, VOCAB, dtype)
        size = x.element_size()
        for k in (50, 1024) if dtype == torch.float32 else (50,):
            moved = x.numel() * size + ROWS * k * (size + 8)
            dt = str(dtype).replace("torch.", "")
            name = f"top_k {dt} {ROWS}x{VOCAB} k={k}"
            tgt = ">= 3x torch.topk, >= 1.0x FlashInfer 0.7.2" if dtype == torch.float32 else ""
            out.append((name, (lambda x=x, k=k: flashinfer.top_k(x, k)), moved, tgt))
            if with_torch:
                out.append((f"torch.topk(sorted=False) {dt} {ROWS}x{VOCAB} k={k}",
                            (lambda x=x, k=k: torch.topk(x, k, dim=-1, sorted=False)), moved, ""))
    x = _inputs(ROWS, VOCAB)
    moved = x.numel() * 4 + ROWS * 1024 * 12
    out.append((f"top_k float32 {ROWS}x{VOCAB} k=1024 sorted",
                lambda x=x: flashinfer.top_k(x, 1024, sorted=True), moved, ""))
    if with_torch:
        out.append((f"torch.topk(sorted=True) float32 {ROWS}x{VOCAB} k=1024",
                    lambda x=x: torch.topk(x, 1024, dim=-1), moved, ""))
    # rows sorted ascending: the first tile misleads the stash, the second (ordered) walk runs
    xs = torch.sort(_inputs(ROWS, VOCAB, seed=3), dim=-1).values
    out.append((f"top_k float32 {ROWS}x{VOCAB} k=1024 (ascending rows: second walk)",
                lambda: flashinfer.top_k(xs, 1024), moved, ""))
    x, lengths, table, offsets = _dsa_inputs()
    shape = f"{DSA_ROWS}x{DSA_LEN} k={DSA_K}"
    moved = x.numel() * 4 + DSA_ROWS * DSA_K * 12
    out.append((f"top_k float32 {shape} (DSA)", lambda: flashinfer.top_k(x, DSA_K), moved,
                ">= 3x torch.topk, >= 1.0x FlashInfer 0.7.2"))
    if with_torch:
        out.append((f"torch.topk(sorted=False) float32 {shape} (DSA)",
                    lambda: torch.topk(x, DSA_K, dim=-1, sorted=False), moved, ""))
    moved = x.numel() * 4 + DSA_ROWS * DSA_K * 8
    out.append((f"top_k_page_table_transform float32 {shape}",
                lambda: flashinfer.top_k_page_table_transform(x, table, lengths, DSA_K), moved,
                ""))
    out.append((f"top_k_ragged_transform float32 {shape}",
                lambda: flashinfer.top_k_ragged_transform(x, offsets, lengths, DSA_K), moved, ""))
    x1 = _inputs(1, 256000, seed=2)
    out.append(("top_k float32 1x256000 k=2048", lambda: flashinfer.top_k(x1, 2048),
                x1.numel() * 4 + 2048 * 12, ""))
    return out


def cases():
    from harness import Case

    return [Case(name, fn, bytes_moved=moved, target=tgt) for name, fn, moved, tgt in specs(True)]


def time_us(fn, iters: int = 60) -> tuple[float, str]:
    """Median microseconds of one call, replayed from a CUDA graph after a 256 MiB read."""
    flush = torch.ones(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    mode = "cuda graph replay, read flush"
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    except Exception as err:  # noqa: BLE001 - report it, then time the call itself
        mode = f"cuda events (capture failed: {str(err).splitlines()[0][:100]})"
        run = fn
    pairs = []
    for _ in range(iters):
        flush.max()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs) * 1e3, mode


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--peer", action="store_true", help="this process imports the peer")
    args = parser.parse_args()
    rows = []
    for name, fn, moved, _ in specs(with_torch=not args.peer):
        try:
            us, mode = time_us(fn)
        except Exception as err:  # noqa: BLE001 - a case the peer cannot run is recorded
            rows.append({"name": name, "error": f"{type(err).__name__}: {str(err)[:200]}"})
            print(f"{name:<60} failed: {rows[-1]['error']}", flush=True)
            continue
        rows.append({"name": name, "median_us": round(us, 2), "bytes": moved,
                     "GBps": round(moved / (us * 1e-6) / 1e9, 1), "timing": mode})
        print(f"{name:<60} {us:9.1f} us", flush=True)
    meta = {"flashinfer": getattr(flashinfer, "__version__", "?"), "peer": args.peer,
            "device": torch.cuda.get_device_name()}
    with open(args.out, "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

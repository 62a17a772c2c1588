"""Do the Hopper kernel's two speed groups on ragged 192/128 (rounds 12% apart, nothing between:
benchmarks/notes/sm90-dynamic-claims.md) follow where the tensors were allocated? Builds the case
anew N times, each after a throw-away allocation of a random size (so the tensors land at other
addresses), times it (one-call graph replays after a read flush, median) and prints the time with
each tensor's address modulo 2 MiB and the workspace's, and the clocks, power and temperature
nvidia-smi reports right after.

    python benchmarks/probes/sm90_alloc_modes.py OUT.json [--n 16] [--heads 128]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import flashinfer  # noqa: E402
import harness  # noqa: E402

DT = torch.bfloat16


def build(batch: int, n: int, heads: int):
    q = torch.randn(batch * n, heads, 192, dtype=DT, device="cuda")
    k = torch.randn(batch * n, heads, 192, dtype=DT, device="cuda")
    v = torch.randn(batch * n, heads, 128, dtype=DT, device="cuda")
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    indptr = torch.arange(batch + 1, dtype=torch.int32) * n
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa3")
    w.plan(indptr, indptr, heads, heads, 192, 128, causal=True, q_data_type=DT)
    out = torch.empty(batch * n, heads, 128, dtype=DT, device="cuda")
    return (lambda: w.run(q, k, v, out=out)), {"q": q, "k": k, "v": v, "out": out, "ws": ws}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--heads", type=int, default=128)
    a = ap.parse_args()
    rng = random.Random(0)
    rows = []
    for i in range(a.n):
        pad = torch.empty(rng.randrange(1, 64) << 20, dtype=torch.uint8, device="cuda")
        fn, t = build(16, 1024, a.heads)
        fn()
        us = harness._median_ms(fn, use_cuda_graph=True)[0] * 1e3
        mods = {name: x.data_ptr() % (2 << 20) for name, x in t.items()}
        clocks = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,"
                                 "temperature.gpu", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip()
        rows.append({"us": round(us, 1), "addr_mod_2MiB": mods, "clocks_after": clocks})
        print(f"{i:2d} {us:8.1f} us  " + " ".join(f"{k}={m:#x}" for k, m in mods.items())
              + f"  [{clocks}]", flush=True)
        del fn, t, pad
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps({"device": harness.device_info(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

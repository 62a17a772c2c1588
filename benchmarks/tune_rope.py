"""Compile RoPE variants side by side (FLASHINFER_ROPE_* macros in rope.cuh) and time them on
the headline shapes, with the copy ceiling and the scale kernel as references in the same run.
Also breaks down the host cost of one small op call. GPU only.

    python benchmarks/tune_rope.py OUT.json
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import flashinfer  # noqa: E402
import flashinfer.rope as rope_api  # noqa: E402
import harness  # noqa: E402
from flashinfer import aot  # noqa: E402
from flashinfer.jit.core import JitSpec, get_module  # noqa: E402

VARIANTS = {
    "256 thr, 4 items, 4 blk/SM, plain": (),
    "128 thr, 4 items, 8 blk/SM, plain": ("THREADS=128", "MIN_BLOCKS_PER_SM=8"),
    "256 thr, 4 items, 4 blk/SM, L2::256B": ("L2_PREFETCH=256",),
    "128 thr, 4 items, 8 blk/SM, L2::256B": ("THREADS=128", "MIN_BLOCKS_PER_SM=8",
                                             "L2_PREFETCH=256"),
    "128 thr, 4 items, 8 blk/SM, L2::128B": ("THREADS=128", "MIN_BLOCKS_PER_SM=8",
                                             "L2_PREFETCH=128"),
    "64 thr, 4 items, 16 blk/SM, plain": ("THREADS=64", "MIN_BLOCKS_PER_SM=16"),
}


def spec(flags) -> JitSpec:
    return JitSpec(name="rope", sources=("rope.cu",),
                   extra_cuda_cflags=tuple(f"-DFLASHINFER_ROPE_{f}" for f in flags))


def shapes():
    out = []
    for nnz, hq, hk, d in ((16384, 32, 8, 128), (65536, 8, 1, 128), (16384, 16, 4, 256)):
        q = torch.randn(nnz, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(nnz, hk, d, dtype=torch.bfloat16, device="cuda")
        pos = torch.randint(0, 32768, (nnz,), dtype=torch.int32, device="cuda")
        nbytes = 2 * (q.numel() + k.numel()) * 2
        out.append((f"pos_ids {nnz}x{hq}/{hk}x{d}", q, k, pos, nbytes))
    return out


def host_breakdown() -> dict:
    x = torch.randn(1, 128, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(128, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(x)
    mod = flashinfer.norm.get_norm_module()

    def per_call_us(fn, n=5000):
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return round((time.perf_counter() - t) / n * 1e6, 2)

    return {
        "rmsnorm(x, w)": per_call_us(lambda: flashinfer.rmsnorm(x, w)),
        "rmsnorm(x, w, out=out, enable_pdl=True)": per_call_us(
            lambda: flashinfer.rmsnorm(x, w, out=out, enable_pdl=True)),
        "module.rmsnorm(out, x, w, eps, True)  (binding + launch only)": per_call_us(
            lambda: mod.rmsnorm(out, x, w, 1e-6, True)),
        "torch.empty_like(x)": per_call_us(lambda: torch.empty_like(x)),
        "torch.mul(x, 2.0)": per_call_us(lambda: torch.mul(x, 2.0)),
    }


def main() -> int:
    result = {"device": harness.device_info(), "ceilings": harness.measure_ceilings()}
    print("ceilings", result["ceilings"], flush=True)
    specs = {name: spec(flags) for name, flags in VARIANTS.items()}
    t = time.monotonic()
    aot.build_all(list(specs.values()), jobs=len(specs))
    print(f"built {len(specs)} variants in {time.monotonic() - t:.0f} s", flush=True)
    cases = shapes()
    x = torch.randn(16384, 8192, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    ref_ms = harness._median_ms(lambda: flashinfer.scale(x, 2.0, out=y))[0]
    result["scale_16384x8192_pct_of_copy"] = round(
        100 * 2 * x.numel() * 2 / (ref_ms * 1e-3) / 1e9 / result["ceilings"]["copy_GBps"], 1)
    rows = []
    for name, s in [*specs.items(), *specs.items()]:  # twice: the spread between repeats
        mod = get_module(s)
        rope_api.get_rope_module = lambda mod=mod: mod
        for label, q, k, pos, nbytes in cases:
            for inplace in (False, True):
                op = (flashinfer.apply_rope_pos_ids_inplace if inplace
                      else flashinfer.apply_rope_pos_ids)
                fn = functools.partial(op, q, k, pos)
                ms = harness._median_ms(fn)[0]
                pct = 100 * nbytes / (ms * 1e-3) / 1e9 / result["ceilings"]["copy_GBps"]
                rows.append({"variant": name, "case": label + (" inplace" if inplace else ""),
                             "us": round(ms * 1e3, 1), "pct_of_copy": round(pct, 1)})
                print(f"{name:<48} {rows[-1]['case']:<34} {rows[-1]['us']:>8} us "
                      f"{rows[-1]['pct_of_copy']:>6}%", flush=True)
    result["rope_variants"] = rows
    result["host_us_per_call"] = host_breakdown()
    print(json.dumps(result["host_us_per_call"], indent=1))
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

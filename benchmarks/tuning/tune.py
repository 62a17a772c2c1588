"""Compile variants of a module side by side (the FLASHINFER_<OP>_* macros in its header) and
time them on the op's headline shapes, with the copy ceiling and the scale kernel as references
in the same run. Also breaks down the host cost of one small op call. GPU only.

    python benchmarks/tuning/tune.py {rope,norm} OUT.json

The cascade merges have their own script, tune_cascade.py (variants, float64 checks, timings).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*

import torch  # noqa: E402

import flashinfer  # noqa: E402
import flashinfer.norm as norm_api  # noqa: E402
import flashinfer.rope as rope_api  # noqa: E402
import harness  # noqa: E402
from flashinfer import aot  # noqa: E402
from flashinfer.jit.core import JitSpec, get_module  # noqa: E402
from flashinfer.jit.norm import gen_norm_module  # noqa: E402
from flashinfer.jit.rope import gen_rope_module  # noqa: E402

VARIANTS = {
    "rope": {
        "default: 128 thr, 4 items, 8 blk/SM, L2::256B": (),
        "256 thr, 4 items, 4 blk/SM": ("THREADS=256", "MIN_BLOCKS_PER_SM=4"),
        "no L2 prefetch hint": ("L2_PREFETCH=0",),
        "evict-first loads and stores": ("STREAMING_LOADS=1", "STREAMING_STORES=1"),
    },
    "norm": {
        "default: evict-first row loads": (),
        "plain row loads": ("STREAMING_LOADS=0",),
    },
}


def spec(op: str, flags) -> JitSpec:
    base = {"rope": gen_rope_module, "norm": gen_norm_module}[op]()
    macros = tuple(f"-DFLASHINFER_{op.upper()}_{f}" for f in flags)
    return dataclasses.replace(base, extra_cuda_cflags=base.extra_cuda_cflags + macros)


def rope_cases():
    out = []
    for nnz, hq, hk, d in ((16384, 32, 8, 128), (65536, 8, 1, 128), (16384, 16, 4, 256)):
        q = torch.randn(nnz, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(nnz, hk, d, dtype=torch.bfloat16, device="cuda")
        pos = torch.randint(0, 32768, (nnz,), dtype=torch.int32, device="cuda")
        nbytes = 2 * (q.numel() + k.numel()) * 2
        for inplace in (False, True):
            op = flashinfer.apply_rope_pos_ids_inplace if inplace else flashinfer.apply_rope_pos_ids
            name = f"pos_ids {nnz}x{hq}/{hk}x{d}" + (" inplace" if inplace else "")
            out.append((name, functools.partial(op, q, k, pos), nbytes))
    return out


def norm_cases():
    out = []
    for shape in ((16384, 8192), (16384, 32, 128), (131072, 8, 64), (64, 8192)):
        x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(shape[-1], dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        out.append((f"rmsnorm {'x'.join(map(str, shape))}",
                    functools.partial(flashinfer.rmsnorm, x, w, out=y), 2 * x.numel() * 2))
    x = torch.randn(16384, 28672, dtype=torch.bfloat16, device="cuda")
    r = torch.randn_like(x)
    w = torch.randn(28672, dtype=torch.bfloat16, device="cuda")
    out.append(("fused_add_rmsnorm 16384x28672",
                functools.partial(flashinfer.fused_add_rmsnorm, x, r, w), 4 * x.numel() * 2))
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
    result = {"ceilings": harness.measure_ceilings()}
    print("ceilings", result["ceilings"], flush=True)
    op, out_path = sys.argv[1], sys.argv[2]
    specs = {name: spec(op, flags) for name, flags in VARIANTS[op].items()}
    t = time.monotonic()
    aot.build_all(list(specs.values()), jobs=len(specs))
    print(f"built {len(specs)} variants in {time.monotonic() - t:.0f} s", flush=True)
    cases = rope_cases() if op == "rope" else norm_cases()
    api = rope_api if op == "rope" else norm_api
    getter = "get_rope_module" if op == "rope" else "get_norm_module"
    x = torch.randn(16384, 8192, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    ref_ms = harness._median_ms(lambda: flashinfer.scale(x, 2.0, out=y))[0]
    result["scale_16384x8192_pct_of_copy"] = round(
        100 * 2 * x.numel() * 2 / (ref_ms * 1e-3) / 1e9 / result["ceilings"]["copy_GBps"], 1)
    rows = []
    for name, s in [*specs.items(), *specs.items()]:  # twice: the spread between repeats
        mod = get_module(s)
        setattr(api, getter, lambda mod=mod: mod)
        for label, fn, nbytes in cases:
            ms = harness._median_ms(fn, use_cuda_graph=True)[0]  # as harness.run_cases
            pct = 100 * nbytes / (ms * 1e-3) / 1e9 / result["ceilings"]["copy_GBps"]
            rows.append({"name": label, "group": op, "median_us": round(ms * 1e3, 1),
                         "bytes": nbytes, "pct_of_copy": round(pct, 1), "ceiling": "copy",
                         "extra": {"variant": name}})
            print(f"{name:<48} {label:<34} {rows[-1]['median_us']:>8} us "
                  f"{rows[-1]['pct_of_copy']:>6}%", flush=True)
    result["host_us_per_call"] = host_breakdown()
    print(json.dumps(result["host_us_per_call"], indent=1))
    harness.write(Path(out_path), harness.record("sweep", f"tune-{op}", cases=rows, **result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

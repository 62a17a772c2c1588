"""fp8 KV decode variants side by side (issue 21's fp8 row): the decode module over an
fp8-e4m3 cache compiled with tuning and probe macros (include/flashinfer/attention/tuning.cuh,
common.cuh), each checked against float64 on the dequantized cache, then timed on batch decode
(32/8 heads, head_dim 128, page 16: 64 x 4096 with the cache in NHD and HND, 128 x 8192,
1 x 32768), with the bf16 decode module and head_dim 512 decode (16 x 8192) beside it and the
read ceiling measured in the same run. GPU only.

    python benchmarks/tuning/fp8_decode.py OUT.json [VARIANT ...]   (a VARIANT names a key of VARIANTS)
    python benchmarks/tuning/fp8_decode.py --build [VARIANT ...]   (compile only)
"""

from __future__ import annotations

import dataclasses
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import bench_attention as ba  # noqa: E402
import torch  # noqa: E402
from attention_ref import attention_ref  # noqa: E402

import flashinfer  # noqa: E402
import flashinfer.attention.runtime as rt  # noqa: E402
import harness  # noqa: E402
from flashinfer.jit.attention import AttentionVariant  # noqa: E402
from flashinfer.jit.core import get_module  # noqa: E402

E4M3 = torch.float8_e4m3fn
FP8 = AttentionVariant("bfloat16", "bfloat16", 128, "none", "NONE", True,
                       dtype_kv="float8_e4m3fn")
BF16 = AttentionVariant("bfloat16", "bfloat16", 128, "none", "NONE", True)
HD512 = AttentionVariant("bfloat16", "bfloat16", 512, "none", "NONE", True)
# name -> (module, macros). Measured and decided (benchmarks/notes/attention-fp8-kv.md): fp8
# K/V converted in registers (was: into a half tile in shared memory), 32-key steps (16, and
# three stages, measured slower or equal); the probes time the loads without the math
# (no compute) and the math without the cache's bytes (no loads).
VARIANTS = {
    "fp8": (FP8, ()),
    "fp8, no compute": (FP8, ("PROBE_NO_COMPUTE=1",)),
    "fp8, no loads": (FP8, ("PROBE_NO_LOADS=1",)),
    "fp8, q in smem, 3 streams x 4 CTAs": (FP8, ("FP8_Q_SMEM=1", "CTA4_WARPS_KV_FP8=3",
                                                 "FP8_MIN_WARPS=12")),
    "fp8, lean": (FP8, ("FP8_LEAN=1",)),
    "fp8, 4 per row, q in smem, 3 streams x 4 CTAs": (FP8, (
        "FP8_LOAD_ROW_THREADS=4", "FP8_Q_SMEM=1", "CTA4_WARPS_KV_FP8=3", "FP8_MIN_WARPS=12")),
    "fp8, 4 per row": (FP8, ("FP8_LOAD_ROW_THREADS=4",)),
    "fp8, 2 per row": (FP8, ("FP8_LOAD_ROW_THREADS=2",)),
    "fp8, q in smem": (FP8, ("FP8_Q_SMEM=1",)),
    "fp8, 3 stages": (FP8, ("CTA0_STAGES=3",)),
    "bf16": (BF16, ()),
    "hd512": (HD512, ()),
    "hd512, no compute": (HD512, ("PROBE_NO_COMPUTE=1",)),
}


def spec(module, flags):
    base = module.spec()
    macros = tuple(f"-DFLASHINFER_ATTENTION_{f}" for f in flags)
    return dataclasses.replace(base, extra_cuda_cflags=base.extra_cuda_cflags + macros)


def check(label: str, kv_dtype) -> dict:
    """Relative error of decode (batch 3, odd lengths, split KV) against float64."""
    torch.manual_seed(0)
    kv_lens, page = [1, 777, 5000], 16
    pages = [(n + page - 1) // page for n in kv_lens]
    cache = torch.randn(sum(pages), 2, page, ba.HKV, ba.D, device="cuda").to(kv_dtype)
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.randperm(sum(pages), dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(kv_lens, pages)], dtype=torch.int32)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ba._ws(), "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, ba.HQ, ba.HKV, ba.D, page, q_data_type=ba.DT,
           kv_data_type=kv_dtype)
    q = torch.randn(len(kv_lens), ba.HQ, ba.D, dtype=ba.DT, device="cuda")
    out = w.run(q, cache)
    worst = 0.0
    for b, n in enumerate(kv_lens):
        rows = indices[indptr[b]:indptr[b + 1]].long().cuda()
        k = cache[rows, 0].double().reshape(-1, ba.HKV, ba.D)[:n]
        v = cache[rows, 1].double().reshape(-1, ba.HKV, ba.D)[:n]
        ref, _ = attention_ref(q[b:b + 1], k, v)
        worst = max(worst, ((out[b:b + 1].double() - ref).norm() / ref.norm()).item())
    print(f"check {label}: {worst:.2e}", flush=True)
    return {"error": worst, "ok": worst < 1e-2}


def cases(module):
    if module is HD512:
        import attention_vs_peer as avp

        return [avp._decode_512(16, 8192, True)]
    kv_dtype = E4M3 if module is FP8 else ba.DT
    note = ", fp8-e4m3 KV" if module is FP8 else ""
    mk = dict(kv_dtype=kv_dtype, note=note)
    # 64 x 4096 with the cache in HND (a KV head's page is 2 KB of contiguous fp8 rows, against
    # 128-byte rows 1 KB apart in NHD): whether the row granularity costs reads.
    hnd = ([ba._decode(64, 4096, True, None, "", layout="HND", kv_dtype=E4M3, note=note + ", HND")]
           if module is FP8 else [])
    return [
        ba._decode(64, 4096, True, None, "", **mk),
        *hnd,
        ba._decode(128, 8192, True, None, "", **mk),
        ba._decode(1, 32768, True, None, "", **mk),
    ]


def main() -> int:
    names = sys.argv[2:] or list(VARIANTS)
    built = {n: spec(*VARIANTS[n]) for n in names}
    t = time.monotonic()

    def build(name):  # a variant that fails to build is reported and left out, not fatal
        try:
            get_module(built[name])
            return None
        except Exception as err:  # noqa: BLE001 (recorded below)
            return f"{type(err).__name__}: {str(err)[-300:]}"

    with ThreadPoolExecutor(max_workers=16) as pool:
        failed = {n: e for n, e in zip(names, pool.map(build, names)) if e}
    for name, err in failed.items():
        print(f"build failed: {name}: {err}", flush=True)
    names = [n for n in names if n not in failed]
    print(f"built {len(names)} variants in {time.monotonic() - t:.0f} s", flush=True)
    if sys.argv[1] == "--build":
        return 0
    out_path = Path(sys.argv[1])
    result = {"ceilings": harness.measure_ceilings()}
    print("ceilings", result["ceilings"], flush=True)
    result["variants"] = {}
    result["build_failed"] = failed
    default_source = rt.get_attention_module
    for name in names:
        module, _ = VARIANTS[name]
        mod = get_module(built[name])
        rt.set_module_source(lambda v, mod=mod, module=module:
                             mod if v == module else default_source(v))
        entry = {"flags": VARIANTS[name][1]}
        if module is not HD512:
            entry["check"] = check(name, E4M3 if module is FP8 else ba.DT)
        print(f"== {name}", flush=True)
        try:  # a variant refused at launch is recorded; the sweep goes on
            entry["cases"] = harness.run_cases(cases(module), result["ceilings"],
                                               group="attention")
        except Exception as err:  # noqa: BLE001
            entry["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            entry["cases"] = []
            print(f"  error: {entry['error']}", flush=True)
        for c in entry["cases"]:
            print(f"  {c['name'][:60]:60s} {c['median_us']:8.1f} us "
                  f"{c.get('pct_of_read', 0):5.1f}% read", flush=True)
        result["variants"][name] = entry
        harness.write(out_path, harness.record("sweep", "fp8-decode", **result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

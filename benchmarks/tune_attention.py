"""Compile variants of the attention module side by side (the FLASHINFER_ATTENTION_* macros of
csrc/attention.cu and include/flashinfer/attention/prefill.cuh), check each against a float64
reference, and time each on issue 3's headline shapes plus decode with other cache layouts (page
order, HND), with the copy and matmul ceilings measured in the same run. GPU only.

    python benchmarks/tune_attention.py OUT.json [VARIANT ...]
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import bench_attention as ba  # noqa: E402
import torch  # noqa: E402
from attention_ref import attention_ref  # noqa: E402

import flashinfer  # noqa: E402
import flashinfer.attention_runtime as rt  # noqa: E402
import harness  # noqa: E402
from flashinfer import aot  # noqa: E402
from flashinfer.jit.attention import AttentionVariant  # noqa: E402
from flashinfer.jit.core import get_module  # noqa: E402

# The Hopper kernel's switches (include/flashinfer/attention/prefill_sm90.cuh); "default" is
# head-major work order with the O epilogue through shared memory, the last one is a810e42.
VARIANTS = {
    "default": (),
    "sm90 item-major": ("SM90_HEAD_MAJOR=0",),
    "sm90 register epilogue": ("SM90_EPILOGUE_SMEM=0",),
    "sm90 item-major, register epilogue": ("SM90_HEAD_MAJOR=0", "SM90_EPILOGUE_SMEM=0"),
}
MODULES = [
    AttentionVariant("bfloat16", "bfloat16", 128, "none", "NONE", True),     # decode
    AttentionVariant("bfloat16", "bfloat16", 128, "causal", "NONE", False),  # single, ragged
    AttentionVariant("bfloat16", "bfloat16", 128, "causal", "NONE", True),   # paged prefill
]


def specs(flags):
    out = {}
    for v in MODULES:
        base = v.spec()
        macros = tuple(f"-DFLASHINFER_ATTENTION_{f}" for f in flags)
        out[v] = dataclasses.replace(base, extra_cuda_cflags=base.extra_cuda_cflags + macros)
    return out


def check(label) -> dict:
    """Relative error of decode (batch 3, odd lengths) and causal prefill against float64."""
    torch.manual_seed(0)
    errs = {}
    # Decode through the paged wrapper, kv lengths 1, 777, 5000.
    kv_lens, page = [1, 777, 5000], 16
    pages = [(n + page - 1) // page for n in kv_lens]
    cache = torch.randn(sum(pages), 2, page, ba.HKV, ba.D, dtype=ba.DT, device="cuda")
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.randperm(sum(pages), dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(kv_lens, pages)], dtype=torch.int32)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ba._ws(), "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, ba.HQ, ba.HKV, ba.D, page, q_data_type=ba.DT)
    q = torch.randn(len(kv_lens), ba.HQ, ba.D, dtype=ba.DT, device="cuda")
    out = w.run(q, cache)
    worst = 0.0
    for b, n in enumerate(kv_lens):
        rows = indices[indptr[b]:indptr[b + 1]].long().cuda()
        k = cache[rows, 0].reshape(-1, ba.HKV, ba.D)[:n]
        v = cache[rows, 1].reshape(-1, ba.HKV, ba.D)[:n]
        ref, _ = attention_ref(q[b:b + 1], k, v)
        worst = max(worst, ((out[b:b + 1].double() - ref).norm() / ref.norm()).item())
    errs["decode"] = worst
    # Causal prefill, qo 300 over kv 700 (bottom-right).
    q = torch.randn(300, ba.HQ, ba.D, dtype=ba.DT, device="cuda")
    k = torch.randn(700, ba.HKV, ba.D, dtype=ba.DT, device="cuda")
    v = torch.randn(700, ba.HKV, ba.D, dtype=ba.DT, device="cuda")
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    ref, _ = attention_ref(q, k, v, causal=True)
    errs["prefill"] = ((o.double() - ref).norm() / ref.norm()).item()
    ok = all(e < 1e-2 for e in errs.values())
    print(f"check {label}: {errs} {'ok' if ok else 'FAILED'}", flush=True)
    return {"errors": errs, "ok": ok}


def cases():
    return [
        ba._decode(1, 32768, True, 56.0, "<= 50 us"),
        ba._single_prefill(16384, 5824.0, "<= 5800 us"),
        ba._ragged_prefill(16, 1024, 452.0, "<= 450 us"),
        ba._paged_prefill(8, 2048, 906.0, "<= 900 us"),
    ]


def main() -> int:
    out_path = Path(sys.argv[1])
    names = sys.argv[2:] or list(VARIANTS)
    result = {"device": harness.device_info(), "ceilings": harness.measure_ceilings()}
    print("ceilings", result["ceilings"], flush=True)
    built = {name: specs(VARIANTS[name]) for name in names}
    t = time.monotonic()
    aot.build_all([s for m in built.values() for s in m.values()], jobs=16)
    result["build_s"] = round(time.monotonic() - t, 1)
    print(f"built {len(names)} variants in {result['build_s']} s", flush=True)
    result["variants"] = {}
    for name in names:
        mods = {v: get_module(s) for v, s in built[name].items()}
        rt.get_attention_module = lambda v, mods=mods: mods[v]
        entry = {"flags": VARIANTS[name], "check": check(name)}
        if entry["check"]["ok"]:
            print(f"== {name}", flush=True)
            entry["cases"] = harness.run_cases(cases(), result["ceilings"])
        result["variants"][name] = entry
        out_path.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

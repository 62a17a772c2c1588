"""The FA2 kernel's prefill tile shapes and single decode's split, compiled side by side (issue
22): each variant is a build of the causal modules with the tuning macros of
include/flashinfer/attention/tuning.cuh, checked against float64 with the plan forced to the
variant's shape, then timed on the FA2 rows (``backend="fa2"``); single decode with the plan's
split and others. GPU only; the peer's rows come from benchmarks/attention_vs_peer.py.

    python benchmarks/tuning/fa2_tiles.py build [--with-tests]   (every variant's modules, 16
        jobs; with the registered attention, cascade and page modules the GPU tests load)
    python benchmarks/tuning/fa2_tiles.py measure OUT.json   (checks and timings)
"""

from __future__ import annotations

import functools
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tune_attention
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import bench_attention as ba  # noqa: E402
import torch  # noqa: E402
import tune_attention  # noqa: E402
from attention_ref import attention_ref  # noqa: E402

import flashinfer  # noqa: E402
import flashinfer.attention.runtime as rt  # noqa: E402
import harness  # noqa: E402
from flashinfer import aot  # noqa: E402
from flashinfer.jit.attention import AttentionVariant  # noqa: E402
from flashinfer.jit.core import get_module  # noqa: E402

# Each: (macros over the headers' defaults, the shapes timed). The default's shape 2 at
# head_dim 128 is 4 warps x 2 MMA tiles x 64 keys at 2 stages (Q 32 KB + 64 KB of K/V: two CTAs
# per SM on an H100's 228 KB, one on an sm_80's 164 KB), the loader 8 threads per K/V row;
# shape 1 is 64 rows x 64 keys at 3 stages (112 KB: one CTA per SM on an sm_80; 2 stages 80 KB,
# two). Only "default" has run (the first call stopped after it:
# benchmarks/notes/fa2-tiles-and-registers.md).
VARIANTS = {
    "default": ((), (1, 2)),
    "loader 16 threads per row": (("LOAD_ROW_THREADS=32",), (1, 2)),
    "cta2 32 keys, 3 stages": (("CTA2_MMA_KV=2", "CTA2_STAGES=3"), (2,)),
    "cta2 8 warps x 1 tile": (("CTA2_WARPS_Q=8", "CTA2_MMA_Q=1"), (2,)),
    "stages 2": (("STAGES=2",), (1,)),
}
# head_dim 256 (shape 1: 64 rows x 32 keys, two stages), default and the one-chunk loader.
VARIANTS_256 = {"default": (), "loader 32 threads per row": ("LOAD_ROW_THREADS=32",)}
MODULES = [
    AttentionVariant("bfloat16", "bfloat16", 128, "causal", "NONE", False),  # single, ragged
    AttentionVariant("bfloat16", "bfloat16", 128, "causal", "NONE", True),   # paged prefill
]
MODULE_256 = AttentionVariant("bfloat16", "bfloat16", 256, "causal", "NONE", False)


def specs(flags, modules=tuple(MODULES)):
    return tune_attention.specs(flags, modules)


def _forced(cta: int, fn, *args, **kwargs):
    """fn(*args, **kwargs) with the plan forced to shape ``cta``."""
    return ba._with_cta(cta, harness.Case, "check", functools.partial(fn, *args, **kwargs)).fn()


def _paged(q, cache, qo, kv, page):
    pages = cache.shape[0]
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ba._ws(), "NHD", backend="fa2")
    w.plan(torch.tensor([0, qo], dtype=torch.int32), torch.tensor([0, pages], dtype=torch.int32),
           torch.arange(pages, dtype=torch.int32),
           torch.tensor([kv - (pages - 1) * page], dtype=torch.int32), ba.HQ, ba.HKV, ba.D, page,
           causal=True, q_data_type=ba.DT)
    return w.run(q, cache)


def check(label: str, cta: int) -> dict:
    """Relative error of causal prefill (qo 300 over kv 700, and 1100 over 1100) with the plan
    forced to shape ``cta``, ragged and paged, against float64."""
    torch.manual_seed(0)
    errs = {}
    for qo, kv in ((300, 700), (1100, 1100)):
        q = torch.randn(qo, ba.HQ, ba.D, dtype=ba.DT, device="cuda")
        k = torch.randn(kv, ba.HKV, ba.D, dtype=ba.DT, device="cuda")
        v = torch.randn(kv, ba.HKV, ba.D, dtype=ba.DT, device="cuda")
        ref, _ = attention_ref(q, k, v, causal=True)
        o = _forced(cta, flashinfer.single_prefill_with_kv_cache, q, k, v, causal=True,
                    backend="fa2")
        errs[f"single {qo}x{kv}"] = ((o.double() - ref).norm() / ref.norm()).item()
        page = 16
        pages = -(-kv // page)
        kp, vp = (torch.zeros(pages * page, ba.HKV, ba.D, dtype=ba.DT, device="cuda")
                  for _ in range(2))
        kp[:kv], vp[:kv] = k, v
        cache = torch.stack([kp.view(pages, page, ba.HKV, ba.D),
                             vp.view(pages, page, ba.HKV, ba.D)], dim=1)
        o = _forced(cta, _paged, q, cache, qo, kv, page)
        errs[f"paged {qo}x{kv}"] = ((o.double() - ref).norm() / ref.norm()).item()
    ok = all(e < 1e-2 for e in errs.values())
    print(f"check {label} [cta {cta}]: {errs} {'ok' if ok else 'FAILED'}", flush=True)
    return {"errors": errs, "ok": ok}


def prefill_cases(cta):
    return [ba._with_cta(cta, ba._single_prefill, 16384, None, "", "fa2"),
            ba._with_cta(cta, ba._ragged_prefill, 16, 1024, None, "", "fa2"),
            ba._with_cta(cta, ba._paged_prefill, 8, 2048, None, "", "fa2")]


def decode_cases():
    """Single decode with the plan's split (eight key streams, 16 chunks of 2048 on an H100) and
    others, beside the batch wrapper's 1 x 32768 (the same kernel over a paged cache)."""
    return [ba._single_decode(32768),
            ba._with_cta(0, ba._single_decode, 32768, 1024),
            ba._with_cta(5, ba._single_decode, 32768, 4096),
            ba._with_cta(5, ba._single_decode, 32768, 1024),
            ba._decode(1, 32768, True, None, "")]


def main() -> int:
    if sys.argv[1] == "build":
        todo = [s for f, _ in VARIANTS.values() for s in specs(f).values()]
        todo += [s for f in VARIANTS_256.values() for s in specs(f, [MODULE_256]).values()]
        if "--with-tests" in sys.argv:
            todo += [s for s in aot.registered_specs()
                     if s.name.startswith(("attention", "cascade", "page"))]
        # Not aot.build_all: its progress counts modules by name, and the variants share names.
        unique = {s.name + str(s.extra_cuda_cflags): s for s in todo}.values()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(get_module, unique))
        return 0
    out_path = Path(sys.argv[2])
    result = {"ceilings": harness.measure_ceilings(), "variants": {}}
    default_fetch = rt.get_attention_module
    for label, (flags, ctas) in VARIANTS.items():
        mods = {v: get_module(s) for v, s in specs(flags).items()}
        rt.set_module_source(lambda v, mods=mods: mods.get(v) or default_fetch(v))
        entry = {"flags": flags, "checks": {}, "cases": []}
        for cta in ctas:
            entry["checks"][cta] = check(label, cta)
            if entry["checks"][cta]["ok"]:
                entry["cases"] += harness.run_cases(prefill_cases(cta), result["ceilings"],
                                                    group="attention")
        if label == "default":
            entry["cases"] += harness.run_cases(decode_cases(), result["ceilings"],
                                                group="attention")
        result["variants"][label] = entry
        harness.write(out_path, harness.record("sweep", "fa2-tiles", **result))
    for label, flags in VARIANTS_256.items():
        mods = {v: get_module(s) for v, s in specs(flags, [MODULE_256]).items()}
        rt.set_module_source(lambda v, mods=mods: mods.get(v) or default_fetch(v))
        label = f"head_dim 256: {label}"
        result["variants"][label] = {"flags": flags, "cases": harness.run_cases(
            [ba._single_prefill(8192, None, "", "fa2", 16, 8, 256)], result["ceilings"],
            group="attention")}
        harness.write(out_path, harness.record("sweep", "fa2-tiles", **result))
    for label, entry in result["variants"].items():
        for c in entry["cases"]:
            print(f"{c['name'][:60]:60s} {label[:44]:44s} {c['median_us']:9.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile variants of the attention module side by side (the FLASHINFER_ATTENTION_* macros of
include/flashinfer/attention/tuning.cuh, and the probes of common.cuh), check each against a float64
reference, and time each on issue 3's headline shapes (the three decode cases and the three
prefill ones), with the copy, read-only and matmul ceilings measured in the same run. GPU only.

    python benchmarks/tuning/tune_attention.py OUT.json [--decode] [--only=SUBSTR] [VARIANT ...]

Variants are keys of VARIANTS (``--decode``: the decode cases only; ``--only``: the cases whose
name contains SUBSTR, given one or more times); "default" twice in the
list gives a repeat of the baseline (the run-to-run spread). The GPU tests run with a variant's
macros through the JIT's extra flags, e.g. FLASHINFER_EXTRA_CUDAFLAGS="-DFLASHINFER_ATTENTION_STAGES=2" (part of the cache key).
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
import graph_decode as gd  # noqa: E402
import torch  # noqa: E402
from attention_ref import attention_ref  # noqa: E402

import flashinfer  # noqa: E402
import flashinfer.attention.runtime as rt  # noqa: E402
import harness  # noqa: E402
from flashinfer.jit.attention import AttentionVariant  # noqa: E402
from flashinfer.jit.core import get_module  # noqa: E402

# The numeric tuning parameters of include/flashinfer/attention/tuning.cuh; "default" is the
# headers' own values. Switches between two finished designs were measured here and removed:
# their results are in benchmarks/notes/attention-ab-switches.md.
VARIANTS = {
    "default": (),
    # setmaxnreg split (producer / consumers; 88 / 208 default since 981a959): the producer
    # spills 116 / 144 bytes at 72 / 216 (D = 128 paged causal), 60 / 52 at 88 / 208.
    "sm90 regs 72/216": ("SM90_PRODUCER_REGS=72",),
    # The two sides of the plan's TMA-Q threshold (benchmarks/tuning/tma_q_sweep.py).
    "sm90 Q by cp.async": ("SM90_TMA_Q=0",),
    "sm90 Q by TMA always": ("SM90_TMA_Q=2",),
    # FA2 prefill shapes (cta 1, 2): K/V tiles in flight per stream (default 3).
    "stages 2": ("STAGES=2",),
    "stages 4": ("STAGES=4",),
    # Decode (cta 0, default since 40b6d25's run: two stages, four key streams, 68 KB of shared
    # memory; ~220 registers per thread allow two CTAs per SM, "3 per SM" caps them at 168).
    # Three stages (the default until then): 100 KB.
    # (A bulk-copy K/V loader, cp.async.bulk per row into padded rows, measured 5% slower on
    # decode at 1d9f7b3; removed, benchmarks/NOTES.md.)
    "cta0 stages 3": ("CTA0_STAGES=3",),
    "cta0 stages 4": ("CTA0_STAGES=4",),
    "cta0 3 per SM": ("CTA0_MIN_BLOCKS=3",),
    "cta0 2 streams x 32 keys": ("CTA0_WARPS_KV=2", "CTA0_MMA_KV=2"),
    # Fewer key streams: more CTAs per SM (registers: two streams four per SM, so batch 64 x 8
    # KV heads runs in one wave; three streams three per SM); eight: one per SM (registers),
    # twice the bytes in flight.
    # (A one-dimensional grid, GRID_1D at cca4158, did not change the cost of idle CTAs at the
    # end of the launch order: benchmarks/NOTES.md. Removed.)
    "cta0 2 streams": ("CTA0_WARPS_KV=2",),
    "cta0 3 streams": ("CTA0_WARPS_KV=3",),
    "cta0 8 streams": ("CTA0_WARPS_KV=8",),
    "cta0 8 streams, stages 3": ("CTA0_WARPS_KV=8", "CTA0_STAGES=3"),
    # Timing probes (include/flashinfer/attention/common.cuh): wrong outputs, so their check
    # fails and their cases run anyway. What the math and the split-KV merge cost a decode.
    "probe: no compute": ("PROBE_NO_COMPUTE=1",),
    "probe: no merge": ("PROBE_NO_MERGE=1",),
    "probe: no compute, no merge": ("PROBE_NO_COMPUTE=1", "PROBE_NO_MERGE=1"),
}
MODULES = [
    AttentionVariant("bfloat16", "bfloat16", 128, "none", "NONE", True),     # decode
    AttentionVariant("bfloat16", "bfloat16", 128, "causal", "NONE", False),  # single, ragged
    AttentionVariant("bfloat16", "bfloat16", 128, "causal", "NONE", True),   # paged prefill
]


def specs(flags, modules=None):
    """The build spec of each of ``modules`` (default: MODULES) with the tuning macros
    ``flags`` (``"STAGES=2"`` -> ``-DFLASHINFER_ATTENTION_STAGES=2``)."""
    out = {}
    for v in MODULES if modules is None else modules:
        base = v.spec()
        macros = tuple(f"-DFLASHINFER_ATTENTION_{f}" for f in flags)
        out[v] = dataclasses.replace(base, extra_cuda_cflags=base.extra_cuda_cflags + macros)
    return out


def check(label) -> dict:
    """Relative error of decode (batch 3, odd lengths: partial last tiles, split KV) and causal
    prefill (the default backend, the Hopper kernel on an H100, and the FA2 kernel's cta 1)
    against float64."""
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
    ref, _ = attention_ref(q, k, v, causal=True)
    for backend in ("auto", "fa2"):
        o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, backend=backend)
        key = "prefill" if backend == "auto" else "prefill fa2"
        errs[key] = ((o.double() - ref).norm() / ref.norm()).item()
    ok = all(e < 1e-2 for e in errs.values())
    print(f"check {label}: {errs} {'ok' if ok else 'FAILED'}", flush=True)
    return {"errors": errs, "ok": ok}


def _after_norm(case, rows: int = 256, hidden: int = 4096):
    """``case`` right after an RMSNorm of ``rows x hidden`` (bf16, PDL on both, one graph
    replay for the pair): a decode's start as in a model, with the kernel before it still
    finishing."""
    x = torch.randn(rows, hidden, dtype=ba.DT, device="cuda")
    weight = torch.randn(hidden, dtype=ba.DT, device="cuda")
    y = torch.empty_like(x)
    run = case.fn

    def fn():
        flashinfer.rmsnorm(x, weight, out=y, enable_pdl=True)
        return run()

    return dataclasses.replace(case, name=f"{case.name} after rmsnorm {rows} x {hidden}", fn=fn,
                               bytes_moved=case.bytes_moved + 2 * x.numel() * 2)


def cases(decode_only: bool = False):
    out = [
        ba._decode(64, 4096, True, 362.8, "<= 350 us"),
        ba._decode(1, 32768, True, 56.0, "<= 50 us"),
        ba._decode(128, 8192, True, 1420.0, "<= 1390 us"),
        ba._decode(64, 4096, True, 362.8, "<= 350 us", shuffle_pages=True),
        ba._decode(1, 32768, True, 56.0, "<= 50 us", shuffle_pages=True),
        ba._decode(128, 8192, True, 1420.0, "<= 1390 us", shuffle_pages=True),
        ba._decode(64, 4096, True, 362.8, "<= 350 us", note=", CUDA-graph wrapper",
                   graph_wrapper=True),
        ba._decode(1, 32768, True, 56.0, "<= 50 us", note=", CUDA-graph wrapper",
                   graph_wrapper=True),
        # Other splits than the plan's (two CTAs per SM: 1 x 32768 in chunks of 1024, 16 x 4096
        # in two chunks per request).
        ba._decode(1, 32768, True, 56.0, "<= 50 us", 2048, ", chunk 2048"),
        ba._decode(1, 32768, True, 56.0, "<= 50 us", 512, ", chunk 512"),
        # Eight chunks per KV head: a cluster of 8 per head fits one wave (the plan's 16 do not).
        ba._decode(1, 32768, True, 56.0, "<= 50 us", 4096, ", chunk 4096"),
        ba._decode(1, 131072, True, None, "", 16384, ", chunk 16384"),
        # Batch-1 decode with the plan's chunks (4, 8, 16, 16, 16: the first two merge within
        # clusters, a wave holds them), and in eight chunks (clusters) against sixteen (counted).
        *[ba._decode(1, n, True, None, "") for n in (1024, 2048, 4096, 8192, 16384)],
        *[ba._decode(1, n, True, None, "", n // 8, f", chunk {n // 8}")
          for n in (4096, 8192, 16384)],
        ba._decode(16, 4096, True, None, ""),
        ba._decode(16, 4096, True, None, "", 0, ", not split"),
        # Longer and wider split batches, with the plan's chunks (two CTAs per SM) and with
        # about one CTA per SM (for shapes that fit one).
        ba._decode(1, 131072, True, None, ""),
        ba._decode(1, 131072, True, None, "", 8192, ", chunk 8192"),
        ba._decode(4, 16384, True, None, ""),
        ba._decode(4, 16384, True, None, "", 4096, ", chunk 4096"),
        # After a kernel that lets it start early (PDL).
        _after_norm(ba._decode(1, 32768, True, None, "")),
        _after_norm(ba._decode(1, 2048, True, None, "")),
        _after_norm(ba._decode(64, 4096, True, None, "")),
        # Idle CTAs (items beyond the plan's, as a CUDA-graph plan's capacity leaves them).
        gd._patched("+2 idle items", capacity_extra=2, graph_wrapper=False),
        gd._patched("+0 idle items", capacity_extra=0, graph_wrapper=False),
        gd._patched("+9 idle items", 8, 1024, capacity_extra=9, graph_wrapper=False,
                    kv_chunk_size=0),
        gd._patched("+0 idle items", 8, 1024, capacity_extra=0, graph_wrapper=False,
                    kv_chunk_size=0),
    ]
    if decode_only:
        return out
    return out + [
        ba._single_prefill(16384, 5824.0, "<= 5800 us"),
        ba._ragged_prefill(16, 1024, 452.0, "<= 450 us"),
        ba._paged_prefill(8, 2048, 906.0, "<= 900 us"),
    ]


def main() -> int:
    out_path = Path(sys.argv[1])
    decode_only = "--decode" in sys.argv[2:]
    only = [a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--only=")]
    names = [a for a in sys.argv[2:] if not a.startswith("--")] or list(VARIANTS)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    result = {"ceilings": harness.measure_ceilings()}  # record() adds the device
    print("ceilings", result["ceilings"], flush=True)
    built = {name: specs(VARIANTS[name]) for name in names}
    t = time.monotonic()
    # Not aot.build_all: its progress lines key on module names, which the variants share.
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(get_module, [s for m in built.values() for s in m.values()]))
    result["build_s"] = round(time.monotonic() - t, 1)
    print(f"built {len(built)} variants in {result['build_s']} s", flush=True)
    result["variants"] = {}
    for i, name in enumerate(names):
        label = name if name not in names[:i] else f"{name} (repeat {names[:i].count(name)})"
        mods = {v: get_module(s) for v, s in built[name].items()}
        rt.set_module_source(lambda v, mods=mods: mods[v])
        entry = {"flags": VARIANTS[name], "check": check(label)}
        if entry["check"]["ok"] or name.startswith("probe:"):
            print(f"== {label}", flush=True)
            chosen = [c for c in cases(decode_only)
                      if not only or any(o in c.name for o in only)]
            entry["cases"] = harness.run_cases(chosen, result["ceilings"], group="attention")
        result["variants"][label] = entry
        # a sweep record: the variants (flags, check, cases) under `extra`
        harness.write(out_path, harness.record("sweep", "tune-attention", **result))
    summary(result)
    return 0


def summary(result: dict) -> None:
    """One line per (case, variant): median and % of the read-only and copy ceilings."""
    c = result["ceilings"]
    print(f"\nceilings: copy {c['copy_GBps']:.0f} GB/s, read {c['read_GBps']:.0f} GB/s "
          f"({c['read_method']}), bf16 matmul {c['bf16_matmul_TFLOPs']:.0f} TFLOP/s")
    rows = [(case["name"], label, case) for label, entry in result["variants"].items()
            for case in entry.get("cases", [])]
    for name, label, case in sorted(rows, key=lambda r: r[0]):
        pct = (f"{case['pct_of_read']:5.1f}% read {case['pct_of_copy']:5.1f}% copy"
               if "pct_of_read" in case else f"{case.get('pct_of_matmul', ''):>5}% matmul")
        print(f"{name[:44]:44s} {label[:30]:30s} {case['median_us']:9.1f} us  {pct}")
    failed = [label for label, entry in result["variants"].items() if not entry["check"]["ok"]]
    if failed:
        print("check FAILED:", failed)


if __name__ == "__main__":
    sys.exit(main())

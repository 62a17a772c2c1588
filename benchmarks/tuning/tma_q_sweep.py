"""Q through the TMA or through cp.async in the Hopper prefill kernel, over items of few and of
many KV tiles: single causal prefills of 1024 to 16384 tokens, ragged and paged batches, and
chunked prefills (a chunk of new tokens over a long cached prefix, as serving frameworks run
long prompts). The plan's choice (AttentionPlan.sm90_tma_q, "default"), cp.async always and
the TMA always (tune_attention's variants) are built side by side and timed in turns, twice,
with the ceilings measured in the same run. GPU only.

    python benchmarks/tuning/tma_q_sweep.py OUT.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*

import bench_attention as ba  # noqa: E402
import torch  # noqa: E402
import tune_attention as ta  # noqa: E402

import flashinfer  # noqa: E402
import flashinfer.attention.runtime as rt  # noqa: E402
import harness  # noqa: E402
from flashinfer import aot  # noqa: E402
from flashinfer.jit.core import get_module  # noqa: E402

VARIANTS = ["default", "sm90 Q by cp.async", "sm90 Q by TMA always"]


def chunked_prefill(batch: int, qo: int, kv: int) -> harness.Case:
    """`batch` requests, each `qo` new tokens (causal, bottom-right) over `kv` keys in pages."""
    pages = kv // ba.PAGE
    cache = torch.randn(batch * pages, 2, ba.PAGE, ba.HKV, ba.D, dtype=ba.DT, device="cuda")
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32) * qo
    indices = torch.randperm(batch * pages, dtype=torch.int32)
    last = torch.full((batch,), ba.PAGE, dtype=torch.int32)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ba._ws(), "NHD")
    w.plan(qo_indptr, kv_indptr, indices, last, ba.HQ, ba.HKV, ba.D, ba.PAGE, causal=True,
           q_data_type=ba.DT)
    q = torch.randn(batch * qo, ba.HQ, ba.D, dtype=ba.DT, device="cuda")
    out = torch.empty_like(q)
    pairs = sum(min(kv, kv - qo + i + 1) for i in range(qo))
    return harness.Case(f"chunked prefill {batch} x {qo} over {kv}",
                        lambda: w.run(q, cache, out=out), flops=batch * 4.0 * pairs * ba.HQ * ba.D)


def cases():
    return [
        *[ba._single_prefill(n, None, "") for n in (1024, 2048, 4096, 8192, 16384)],
        ba._ragged_prefill(64, 256, None, ""),
        ba._ragged_prefill(16, 1024, None, ""),
        ba._ragged_prefill(8, 1024, None, ""),
        ba._ragged_prefill(2, 2048, None, ""),
        ba._ragged_prefill(4, 4096, None, ""),
        ba._paged_prefill(16, 1024, None, ""),
        ba._paged_prefill(8, 2048, None, ""),
        chunked_prefill(4, 1024, 8192),
        chunked_prefill(2, 2048, 32768),
    ]


def main() -> int:
    out_path = Path(sys.argv[1])
    ceilings = harness.measure_ceilings()
    rows_all: list[dict] = []
    built = {name: ta.specs(ta.VARIANTS[name]) for name in VARIANTS}
    aot.build_all([s for m in built.values() for s in m.values()], jobs=16)
    modules = {name: {v: get_module(s) for v, s in m.items()} for name, m in built.items()}
    for round_ in range(2):
        for name in VARIANTS:
            rt.set_module_source(lambda v, mods=modules[name]: mods[v])
            rows = harness.run_cases(cases(), ceilings, group="attention")
            for r in rows:
                r.setdefault("extra", {}).update(variant=name, round=round_)
            rows_all += rows
            harness.write(out_path, harness.record("sweep", "tma-q-sweep", ceilings=ceilings,
                                                   cases=rows_all))
    print("\ncase" + " " * 39 + "  ".join(f"{v[:18]:>18s}" for v in VARIANTS))
    names = list(dict.fromkeys(c["name"] for c in rows_all))
    for name in names:
        cells = []
        for v in VARIANTS:
            times = [r["median_us"] for r in rows_all
                     if r["name"] == name and r["extra"]["variant"] == v]
            cells.append(" / ".join(f"{t:.0f}" for t in times))
        print(f"{name[:42]:42s} " + "  ".join(f"{c:>18s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

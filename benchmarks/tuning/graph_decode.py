"""Why the CUDA-graph decode wrapper is slower than the plain one on a one-wave batch: its plan
differs in two ways (room for twice the first plan's items, so twice the CTAs, half of which
exit at once; and every plan marked split, so the kernel writes through the split-KV path even
for one-chunk requests). Each row changes one of them. GPU only.

    python benchmarks/tuning/graph_decode.py OUT.json [COMMIT]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*

import bench_attention as ba  # noqa: E402

import flashinfer.attention.wrapper as prefill  # noqa: E402  (the wrappers' schedule)
import harness  # noqa: E402


def _patched(name: str, batch: int = 0, kv_len: int = 0, **overrides):
    """A graph-wrapper case whose schedule calls take ``overrides`` (item_capacity as a factor
    of the batch when ``capacity_factor`` is given)."""
    original = prefill.schedule
    factor = overrides.pop("capacity_factor", None)
    extra = overrides.pop("capacity_extra", None)
    graph = overrides.pop("graph_wrapper", True)
    pdl = overrides.pop("enable_pdl", None)

    def schedule(qo_lens, kv_lens, **kw):
        if factor is not None and kw.get("item_capacity") is not None:
            kw["item_capacity"] = factor * len(qo_lens)
        if extra is not None:  # any wrapper: the plan's grid has `extra` idle items per KV head
            kw["item_capacity"] = len(qo_lens) + extra
        kw.update(overrides)
        return original(qo_lens, kv_lens, **kw)

    prefill.schedule = schedule
    try:
        case = ba._decode(batch or BATCH, kv_len or KV, True, None, "",
                          note=f", {'CUDA-graph' if graph else 'plain'} wrapper, {name}",
                          graph_wrapper=graph, enable_pdl=pdl)
    finally:
        prefill.schedule = original
    case.extra["variant"] = name
    return case


BATCH, KV = 64, 4096


def main() -> int:
    out = Path(sys.argv[1])
    ceilings = harness.measure_ceilings()
    cases = []
    for _ in range(2):
        cases += [
            ba._decode(BATCH, KV, True, 362.8, "<= 350 us", graph_wrapper=True),
            _patched("+1 idle item", capacity_extra=1),
            _patched("+2 idle items", capacity_extra=2),
            _patched("+8 idle items", capacity_extra=8),
            _patched("+2 idle items", capacity_extra=2, graph_wrapper=False),
            _patched("+2 idle items, pdl off", capacity_extra=2, graph_wrapper=False,
                     enable_pdl=False),
            _patched("+0 idle items, pdl off", capacity_extra=0, graph_wrapper=False,
                     enable_pdl=False),
        ]
    for _ in range(2):
        cases += [
            ba._decode(BATCH, KV, True, 362.8, "<= 350 us"),
            _patched("default"),
            _patched("capacity = batch", capacity_factor=1),
            _patched("not forced split", force_split=False),
            _patched("capacity = batch, not forced split", capacity_factor=1, force_split=False),
            ba._with_cta(0, functools.partial(ba._decode, graph_wrapper=True), BATCH, KV, True,
                         362.8, "<= 350 us"),
        ]
    results = harness.run_cases(cases, ceilings, group="graph_decode")
    for r in results:
        print(f"{r['name'][:80]:80s} {r['median_us']:8.1f} us  cta {r['extra']['cta']}  "
              f"items {r['extra']['items']}")
    harness.write(out, harness.record("sweep", "graph-decode",
                                      commit=sys.argv[2] if len(sys.argv) > 2 else None,
                                      ceilings=ceilings, cases=results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

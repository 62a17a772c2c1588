"""Where a sampling row's time goes, CTA by CTA: the sampling module built with the trace probe
(FLASHINFER_SAMPLING_PROBE_TRACE, include/flashinfer/sampling_common.cuh), whose thread 0 of
every CTA of the draw set's kernels (plain and min-p sampling) stamps %globaltimer at entry,
chunk loaded, block sums filled, first cluster exchange, refine, second exchange and exit. Each
case runs as bench_sampling times it (one-call CUDA-graph replays after a 256 MB flush); after
every replay the stamps are read back, and per event the earliest, median and latest CTA
(microseconds after the first CTA's entry) are reported as medians over the replays. GPU only;
run in a fresh FLASHINFER_WORKSPACE_BASE (the probe's build must not meet a cached module):

    FLASHINFER_WORKSPACE_BASE=/tmp/trace-ws python benchmarks/probes/trace_sampling.py OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

os.environ["FLASHINFER_EXTRA_CUDAFLAGS"] = (
    os.environ.get("FLASHINFER_EXTRA_CUDAFLAGS", "") + " -DFLASHINFER_SAMPLING_PROBE_TRACE=1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_sampling  # noqa: E402
import torch  # noqa: E402

import flashinfer  # noqa: E402
from flashinfer.sampling import get_sampling_module  # noqa: E402

EVENTS = ["entry", "loaded", "filled", "exchanged", "refined", "prefixed", "end"]
SLOTS, CTAS = len(EVENTS) + 1, 4096  # + the SM id; kTraceSlots, kTraceCtas
REPLAYS = 30
CASES = [("sampling_from_probs", (), 1), ("sampling_from_probs", (), 48),
         ("sampling_from_probs", (), 128), ("min_p_sampling_from_probs", (0.1,), 1),
         ("min_p_sampling_from_probs", (0.1,), 128)]


def trace_case(mod, op: str, args: tuple, rows: int) -> dict:
    _, probs = bench_sampling._inputs(rows)
    fn = getattr(flashinfer, op)
    fn(probs, *args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(probs, *args)
    flush = torch.ones(64 << 20, device="cuda")
    stamps = torch.zeros(CTAS, SLOTS, dtype=torch.int64)
    seen = 0
    per_event = {e: {"first": [], "median": [], "last": []} for e in EVENTS}
    for _ in range(REPLAYS):
        flush.sum()
        graph.replay()
        torch.cuda.synchronize()
        mod.trace_copy(stamps)
        fresh = stamps[stamps[:, 0] > seen]
        seen = int(stamps[:, :SLOTS - 1].max())
        t0 = int(fresh[:, 0].min())
        for i, e in enumerate(EVENTS):
            v = fresh[:, i]
            v = v[v >= t0].double().sub(t0).div(1e3)  # ns -> us; unstamped slots left out
            if len(v):
                per_event[e]["first"].append(float(v.min()))
                per_event[e]["median"].append(float(v.median()))
                per_event[e]["last"].append(float(v.max()))
    out = {"op": op, "rows": rows, "ctas": int(len(fresh))}
    out["events_us"] = {e: {k: round(statistics.median(x), 2) for k, x in d.items() if x}
                        for e, d in per_event.items()}
    return out


def main(path: str) -> None:
    mod = get_sampling_module()
    assert hasattr(mod, "trace_copy"), "the module was not built with the probe (fresh workspace?)"
    results = []
    for op, args, rows in CASES:
        r = trace_case(mod, op, args, rows)
        results.append(r)
        print(f"{op} {rows} rows ({r['ctas']} CTAs): " + ", ".join(
            f"{e} {d.get('first')}/{d.get('median')}/{d.get('last')}"
            for e, d in r["events_us"].items()), flush=True)
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "cases": results}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

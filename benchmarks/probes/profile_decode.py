"""Where the time of a split-KV decode call goes: the kernels of one CUDA-graph replay (attention,
merge) with their durations and the gaps between them, from torch.profiler (CUPTI), after the
same read-pass L2 flush the benchmarks use. GPU only.

    python benchmarks/probes/profile_decode.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*

import bench_attention as ba  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import harness  # noqa: E402
from flashinfer import testing  # noqa: E402

CASES = [(1, 32768), (64, 4096)]
REPLAYS = 20


def profile_case(batch: int, kv_len: int) -> dict:
    case = ba._decode(batch, kv_len, True, None, "")
    graph = testing.cuda_graph_of(case.fn)
    flush = testing._l2_flusher(torch.device("cuda"), "read")
    for _ in range(5):
        flush()
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            flush()
            graph.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                    key=lambda e: e.time_range.start)
    # Per replay: the kernels after each flush kernel (the reduction of the flush buffer).
    runs, current = [], None
    for e in events:
        name = e.name
        if "reduce" in name.lower() or "sum" in name.lower():
            current = []
            runs.append(current)
        elif current is not None:
            current.append((name, e.time_range.start, e.time_range.end))
    rows = {}
    for run in runs:
        if not run:
            continue
        t0 = run[0][1]
        rows.setdefault("span_us", []).append(run[-1][2] - t0)
        for i, (name, start, end) in enumerate(run):
            key = f"{i}: {name[:80]}"
            rows.setdefault(key + " start_us", []).append(start - t0)
            rows.setdefault(key + " dur_us", []).append(end - start)
    out = {k: round(statistics.median(v), 2) for k, v in rows.items()}
    out["split"] = case.extra["split"]
    out["items"] = case.extra["items"]
    return out


def main() -> int:
    profiles = {}
    for batch, kv in CASES:
        profiles[f"decode {batch} x {kv}"] = r = profile_case(batch, kv)
        print(f"decode {batch} x {kv}:", json.dumps(r, indent=1), flush=True)
    harness.write(Path(sys.argv[1]), harness.record("probe", "profile-decode", replays=REPLAYS,
                                                    profiles=profiles))
    return 0


if __name__ == "__main__":
    sys.exit(main())

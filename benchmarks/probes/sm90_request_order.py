"""The Hopper kernel's item order for a batch whose K/V of one KV head outgrows the L2
(plan.SM90_REQUEST_ORDER_BYTES): request by request (the plan's choice there) against longest
first over the whole batch (the plan's choice below it), in interleaved rounds, CUDA-graph
replay after a cold-L2 read (the sweep's timer). GPU only.

    python benchmarks/probes/sm90_request_order.py [ROUNDS] [OUT.json]

The order is the plan's alone (the kernel claims the units in plan order), so both run the same
module: the bound is raised for the longest-first plans.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuning"))  # sm90_vs_peer

import bench_attention as ba  # noqa: E402
import torch  # noqa: E402
from sm90_vs_peer import time_case  # noqa: E402

from flashinfer.attention import plan  # noqa: E402

# (batch, keys a request): ragged causal at 32 / 8 heads, head_dim 128 (bench_attention's).
SHAPES = ((64, 2048), (32, 4096))


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    flush = torch.randn(64 << 20, device="cuda")  # 256 MiB, read before each replay
    bound = plan.SM90_REQUEST_ORDER_BYTES
    cases = {}
    for batch, n in SHAPES:
        for label, limit in (("request by request", bound), ("longest first", 1 << 62)):
            plan.SM90_REQUEST_ORDER_BYTES = limit  # read when the wrapper plans, below
            case = ba._ragged_prefill(batch, n, None, "")
            cases[(case.name, label)] = case
    plan.SM90_REQUEST_ORDER_BYTES = bound
    times: dict = {key: [] for key in cases}
    for _ in range(rounds):
        for key, case in cases.items():
            times[key].append(time_case(case, flush)["median_us"])
    rows = [{"case": name, "order": label, "median_us": statistics.median(us), "rounds_us": us}
            for (name, label), us in times.items()]
    for r in rows:
        print(f"{r['case']:36s} {r['order']:20s} {r['median_us']:9.1f} us  {r['rounds_us']}")
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run benchmark modules and write one JSON with the device, commit and ceilings.

    python benchmarks/run.py --commit SHA --ops norm,activation,rope --out results.json
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", required=True)
    parser.add_argument("--ops", default="tutorial,norm,activation,rope")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark", file=sys.stderr)
        return 2
    payload = {"device": harness.device_info(), "commit": args.commit}
    payload["ceilings"] = harness.measure_ceilings()
    print(f"ceilings: {payload['ceilings']}", flush=True)
    results = {}
    ops = args.ops.split(",")
    if "jit" in ops:
        import bench_jit

        ops.remove("jit")
        payload["jit"] = bench_jit.measure()
        print(f"jit: {payload['jit']}", flush=True)
    for op in ops:
        module = importlib.import_module(f"bench_{op}")
        results[op] = harness.run_cases(module.cases(), payload["ceilings"])
        harness.write(Path(args.out), {**payload, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

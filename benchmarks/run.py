"""Run benchmark modules and write one results record (benchmarks/schema.py): the device,
the commit, the ceilings measured first, every case of every module.

    python benchmarks/run.py --commit SHA --ops norm,activation,rope \
        --out benchmarks/results/<date>-<device>-<commit>-<topic>.json

    python benchmarks/run.py --commit SHA --testlist benchmarks/testlists/all_routines.txt \
        --out benchmarks/results/<date>-<device>-<commit>-cli-routines.json

`--testlist` runs the benchmark CLI's routines (benchmarks/routines.py, the same definitions
`flashinfer_benchmark.py` times) instead of the bench_<op>.py modules, into the same record.
Then `python benchmarks/index.py` regenerates benchmarks/results/INDEX.md.
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
    parser.add_argument("--topic", default=None,
                        help="the record's topic (default: the ops joined by '-')")
    parser.add_argument("--testlist", default=None,
                        help="run these flashinfer_benchmark.py cases instead of --ops")
    args = parser.parse_args()
    if args.testlist:
        import flashinfer_benchmark

        return flashinfer_benchmark.main(["--testlist", args.testlist, "--record", args.out,
                                          "--commit", args.commit])
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark", file=sys.stderr)
        return 2
    ops = args.ops.split(",")
    ceilings = harness.measure_ceilings()
    print(f"ceilings: {ceilings}", flush=True)
    extra = {}
    if "jit" in ops:
        import bench_jit

        ops.remove("jit")
        extra["jit"] = bench_jit.measure()
        print(f"jit: {extra['jit']}", flush=True)
    cases: list[dict] = []
    for op in ops:
        module = importlib.import_module(f"bench_{op}")
        cases += harness.run_cases(module.cases(), ceilings, group=op)
        # written after every module, so a crash keeps what was measured
        harness.write(Path(args.out), harness.record(
            "benchmark", args.topic or "-".join(ops), commit=args.commit,
            ceilings=ceilings, cases=cases, **extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())

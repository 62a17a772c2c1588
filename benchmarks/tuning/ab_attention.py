"""A few attention cases, for comparing two source trees in alternating processes on one GPU
(GPU timings agree between processes; host timings do not):

    for tree in old new old new; do PYTHONPATH=$tree python benchmarks/tuning/ab_attention.py OUT.json; done

Further arguments keep only the cases whose name contains one of them (``prefill``, ``decode``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*

import bench_attention as ba  # noqa: E402

import harness  # noqa: E402


def main() -> int:
    ceilings = harness.measure_ceilings()
    cases = [ba._decode(1, 32768, True, 56.0, "<= 50 us"),
             ba._decode(1, 131072, True, None, ""),
             ba._decode(16, 4096, True, None, ""),
             ba._decode(64, 4096, True, 362.8, "<= 350 us"),
             ba._with_cta(0, ba._decode, 64, 4096, True, 362.8, "<= 350 us"),
             ba._decode(128, 8192, True, 1420.0, "<= 1390 us"),
             ba._ragged_prefill(16, 1024, 452.0, "<= 450 us"),
             ba._paged_prefill(8, 2048, 906.0, "<= 900 us"),
             ba._single_prefill(16384, 5824.0, "<= 5800 us")]
    if len(sys.argv) > 2:
        cases = [c for c in cases if any(word in c.name for word in sys.argv[2:])]
    rows = harness.run_cases(cases, ceilings, group="attention")
    # the tree under test by its folder's name (.../TREE/packages/flashinfer-python/flashinfer)
    tree = Path(ba.flashinfer.__file__).resolve().parents[3].name
    harness.write(Path(sys.argv[1]), harness.record("sweep", "ab-attention", commit=None,
                                                    ceilings=ceilings, cases=rows, tree=tree))
    return 0


if __name__ == "__main__":
    sys.exit(main())

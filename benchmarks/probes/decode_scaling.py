"""Decode time against the bytes it reads: batch 1 over kv lengths 4096 to 131072 (split KV),
fit to t = fixed + bytes / rate, beside the read-only ceiling measured in the same run; and the
large cases in both layouts and page orders. GPU only.

    python benchmarks/probes/decode_scaling.py OUT.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*

import bench_attention as ba  # noqa: E402

import harness  # noqa: E402

KV_LENS = (4096, 8192, 16384, 32768, 65536, 131072)


def fit(points: list[tuple[float, float]]) -> dict:
    """Least squares t = a + b * bytes over (bytes, us) points: a in us, 1 / b in GB/s."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return {"fixed_us": round(my - b * mx, 2), "rate_GBps": round(1e-3 / b, 1)}


def main() -> int:
    out_path = Path(sys.argv[1])
    ceilings = harness.measure_ceilings()
    print("ceilings", ceilings, flush=True)
    cases = [ba._decode(1, n, True, None, "") for n in KV_LENS]
    cases += [ba._decode(64, 4096, True, 362.8, "<= 350 us", layout=layout,
                         shuffle_pages=shuffle, note=f", {layout}")
              for layout in ("NHD", "HND") for shuffle in (True, False)]
    cases += [ba._decode(128, 8192, True, 1420.0, "<= 1390 us", layout="HND", note=", HND")]
    rows = harness.run_cases(cases, ceilings, group="decode-scaling")
    scaling = [(r["bytes"], r["median_us"]) for r in rows[:len(KV_LENS)]]
    fits = {"batch1_fit": fit(scaling), "batch1_fit_from_16384": fit(scaling[2:])}
    print("fit", fits["batch1_fit"], fits["batch1_fit_from_16384"], flush=True)
    harness.write(out_path, harness.record("probe", "decode-scaling", ceilings=ceilings,
                                           cases=rows, **fits))
    return 0


if __name__ == "__main__":
    sys.exit(main())

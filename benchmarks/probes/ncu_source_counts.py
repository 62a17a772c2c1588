"""Where a kernel's instructions go, from Nsight Compute's source page: per opcode, and the
hottest straight-line blocks (consecutive SASS instructions of equal executed count) with their
stall samples. No GPU: it reads the CSV that `SOURCE=1 tools/gpu_ncu_vs_peer.sh` brings back
(`ncu --import REPORT --page source --csv --print-source sass`).

    python benchmarks/probes/ncu_source_counts.py SRC.csv [PEER.csv] [--blocks N]

With a second file (the peer's kernel on the same case) the opcode table gets a column for it.
Retry loops of mbarrier waits show up as 3-instruction blocks (YIELD, SYNCS...TRYWAIT, BRA)
executed millions of times; per-item code as blocks executed (items x warps) times.
"""

from __future__ import annotations

import argparse
import collections
import csv
from pathlib import Path


def load(path: Path) -> list:
    """(offset from the kernel's first instruction, SASS text, executed count, stall samples)."""
    rows = list(csv.reader(path.open()))
    header = next(r for r in rows if "Address" in r and "Source" in r)
    ix = {h: i for i, h in enumerate(header)}
    out = []
    for r in rows[rows.index(header) + 1:]:
        if len(r) < len(header):
            continue
        try:
            addr = int(r[ix["Address"]], 16)
        except ValueError:
            continue
        out.append((addr, r[ix["Source"]].strip(), int(r[ix["Instructions Executed"]] or 0),
                    int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)))
    base = out[0][0] if out else 0
    return [(a - base, s, n, st) for a, s, n, st in out]


def opcode(sass: str) -> str:
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def blocks(ins: list) -> list:
    """Runs of consecutive instructions with the same (nonzero) executed count."""
    out, cur = [], None
    for a, s, n, st in ins:
        if cur and n == cur["n"] and n:
            cur["end"], cur["len"], cur["samples"] = a, cur["len"] + 1, cur["samples"] + st
            cur["ops"][opcode(s)] += 1
        else:
            if cur:
                out.append(cur)
            cur = {"start": a, "end": a, "n": n, "len": 1, "samples": st,
                   "ops": collections.Counter([opcode(s)]), "first": s}
    if cur:
        out.append(cur)
    return sorted(out, key=lambda b: -b["n"] * b["len"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("peer", type=Path, nargs="?")
    ap.add_argument("--blocks", type=int, default=15)
    args = ap.parse_args()
    ours = load(args.src)
    peer = load(args.peer) if args.peer else []
    mine, theirs = _sum_by_op(ours), _sum_by_op(peer)
    print(f"{'opcode':10s} {'M':>8s}" + (f" {'peer M':>8s}" if peer else ""))
    print(f"{'all':10s} {sum(mine.values()) / 1e6:8.1f}"
          + (f" {sum(theirs.values()) / 1e6:8.1f}" if peer else ""))
    for op, _ in (mine + theirs).most_common(30):
        print(f"{op:10s} {mine[op] / 1e6:8.1f}" + (f" {theirs[op] / 1e6:8.1f}" if peer else ""))
    total = sum(n for _, _, n, _ in ours) or 1
    print(f"\nhottest blocks of {args.src.name} (instructions x times executed):")
    for b in blocks(ours)[:args.blocks]:
        share = 100 * b["n"] * b["len"] / total
        print(f"  {b['start']:#07x}-{b['end']:#07x} {b['len']:4d} x {b['n'] / 1e3:9.1f}k "
              f"({share:4.1f}%), {b['samples']:6d} samples: "
              f"{', '.join(f'{k} {v}' for k, v in b['ops'].most_common(5))}; {b['first'][:40]}")
    return 0


def _sum_by_op(ins: list) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for _, s, n, _ in ins:
        out[opcode(s)] += n
    return out


if __name__ == "__main__":
    raise SystemExit(main())

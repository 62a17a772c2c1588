"""What the ours-against-the-peer scripts share (host_cost.py, attention_vs_peer.py): one
command line, and the join of the two sides' measure files by case name.

Each script's ``measure`` uses only ``flashinfer``'s public names, so the same file runs against
this package or against the peer (FlashInfer 0.7.2) in a separate process of one device call
(never both in one process: both are ``flashinfer``); ``merge`` joins the two files::

    python benchmarks/<script>.py measure --label ours OUT.json [--cases SUBSTR,...]
    python benchmarks/<script>.py warmup [--cases SUBSTR,...]     (first calls only: JIT builds)
    python benchmarks/<script>.py merge RESULT.json --ours A.json [...] --peer B.json [...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, received {text!r}")
    return n


def command_line(doc: str, argv: Optional[Sequence[str]] = None,
                 rounds: bool = False) -> argparse.Namespace:
    """The ``measure`` / ``warmup`` / ``merge`` arguments (``args.cmd`` names the command);
    ``rounds``: ``measure`` takes ``--rounds`` (a script that times through median_round)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    cases = dict(default="", help="comma-separated substrings of case names (default: all)")
    m = sub.add_parser("measure")
    m.add_argument("out")
    m.add_argument("--label", default="ours")
    m.add_argument("--cases", **cases)
    if rounds:
        m.add_argument("--rounds", type=_positive, default=1,
                       help="time the case list this many times, interleaved; each row is its "
                            "median round, every round's median in extra.rounds_us (noisy rows)")
    sub.add_parser("warmup").add_argument("--cases", **cases)
    g = sub.add_parser("merge")
    g.add_argument("out")
    g.add_argument("--ours", nargs="+", required=True, help="measure files of this package")
    g.add_argument("--peer", nargs="+", required=True, help="measure files of the peer")
    g.add_argument("--commit", default="")
    return ap.parse_args(argv)


def load_rows(paths: Sequence[str]) -> tuple[dict, list[dict]]:
    """The first file's header and the rows of all files (a later row of one name wins)."""
    head, rows = None, {}
    for p in paths:
        d = json.loads(Path(p).read_text())
        head = head or d
        rows.update({r["name"]: r for r in d["rows"]})
    return head, list(rows.values())


def median_round(rounds: Sequence[list[dict]]) -> list[dict]:
    """Rows timed in several interleaved rounds (lists of the same names in the same order): per
    name the row of the median round by median_us, every round's median in extra.rounds_us."""
    out = []
    for same in zip(*rounds):
        ranked = sorted(same, key=lambda r: r["median_us"])
        row = dict(ranked[(len(ranked) - 1) // 2])
        if len(same) > 1:
            row["extra"] = {**row.get("extra", {}), "rounds_us": [r["median_us"] for r in same]}
        out.append(row)
    return out


NOT_MEASURED = {"flashinfer_version": None, "ceilings": None,
                "not_measured": "no measure file of the peer (its run did not finish in the call)"}


def paired(ours: Sequence[str], peer: Sequence[str]) -> tuple[dict, dict, list[tuple]]:
    """Both sides' headers, and each of our rows with the peer's row of the same name ({} where
    the peer has none). Where no peer file exists (its JIT build or run did not finish in the
    call), the peer's header is NOT_MEASURED and every row pairs with {}: our side still makes
    a record, which says the peer is missing."""
    our_head, our_rows = load_rows(ours)
    peer = [p for p in peer if Path(p).is_file()]
    peer_head, peer_rows = load_rows(peer) if peer else (NOT_MEASURED, [])
    by_name = {r["name"]: r for r in peer_rows}
    return our_head, peer_head, [(r, by_name.get(r["name"], {})) for r in our_rows]

"""One-off: rewrite the results files of before schema 1 into it (benchmarks/schema.py).

    python benchmarks/migrate.py        # rewrites benchmarks/results/ in place

Keeps every number: fields the schema names move to their place, the rest to `extra`; the
published FlashInfer figures (`baseline_us`) become `published_us`; machine paths are cut to
the repository-relative part. Run once at the schema's introduction, then removed.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import schema  # noqa: E402

RESULTS = HERE / "results"
NAME = re.compile(r"(\d{4}-\d\d-\d\d)-(cpu|h100)-(?:([0-9a-f]{7})-)?(.+)\.(json|log)$")
H100 = "NVIDIA H100 80GB HBM3"

BENCHMARK_TOPICS = ("foundation", "norm-cascade-attention", "attention-cascade-page",
                    "attention-cascade", "attention", "attention-run3", "host-cost")
CHECK_TOPICS = ("artifacts", "cubin-artifacts", "jit-cache-wheel")
PROBE_PREFIXES = ("ncu-", "trace-", "profile-", "read-patterns", "decode-scaling",
                  "cluster-capacity", "first-call-lookup")
ROW_FIELDS = set(schema.CASE_FIELDS) | {"baseline_us", "speedup_vs_baseline"}


def added_at(path: Path) -> str | None:
    """When the file was committed (its run's day, to the hour): orders same-day records."""
    out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%aI", "--", path.name],
                         cwd=path.parent, capture_output=True, text=True).stdout.split()
    return out[-1] if out else None


def kind_of(topic: str) -> str:
    if topic in BENCHMARK_TOPICS:
        return "benchmark"
    if topic in CHECK_TOPICS:
        return "check"
    if topic.startswith(PROBE_PREFIXES):
        return "probe"
    return "sweep"  # tune-*, ab-*, *-sweep, graph-decode, attention-early-pdl, host-cost-vs-*


def scrub(obj):
    if isinstance(obj, str):
        s = re.sub(r"/(?:work|root|home)(?:/[^/\s\"']+)*?/(packages|benchmarks|tests|tools)/",
                   r"\1/", obj)
        s = re.sub(r"/(?:var/)?tmp/[^/\s\"':]+", "<tmp>", s)
        return s
    if isinstance(obj, dict):
        return {scrub(k): scrub(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


def ceiling_of(row: dict) -> str | None:
    if "pct_of_matmul" in row:
        return "matmul"
    if "pct_of_read" in row and "decode" in row["name"]:
        return "read"
    if "pct_of_copy" in row:
        return "copy"
    return None


def case_from_row(row: dict, group: str) -> dict:
    case: dict = {"name": row["name"], "group": group}
    extra = {}
    for k, v in row.items():
        if k == "baseline_us":
            case["published_us"] = v
        elif k == "speedup_vs_baseline":
            case["speedup_vs_published"] = v
        elif k in schema.CASE_FIELDS and k not in ("name", "group", "extra"):
            case[k] = v
        elif k != "name":
            extra[k] = v
    if ceiling_of(row):
        case["ceiling"] = ceiling_of(row)
    if extra:
        case["extra"] = extra
    return case


def is_row(x) -> bool:
    return isinstance(x, dict) and isinstance(x.get("name"), str) and \
        isinstance(x.get("median_us"), (int, float)) and x["median_us"] > 0


def convert(path: Path) -> dict:
    m = NAME.match(path.name)
    date, machine, file_commit, topic, ext = m.groups()
    if ext == "log":
        lines = path.read_text().splitlines()
        ceilings = ast.literal_eval(lines[0].split(" ", 1)[1]) if lines[0].startswith("ceilings") else {}
        old = {"ceilings": ceilings, "log": lines[1:] if ceilings else lines,
               "note": "the tune_attention run's console output (it hung; no JSON was written)"}
    else:
        old = json.loads(path.read_text())
    if old.get("schema") == schema.SCHEMA_VERSION:
        return old
    old = dict(old)
    kind = kind_of(topic)
    device = old.pop("device", None)
    if isinstance(device, str):
        device = {"name": device}
    elif not isinstance(device, dict):
        device = {"name": H100 if machine == "h100" else "cpu"}
    if machine == "cpu" and isinstance(old.get("machine"), dict):
        device = {"name": "cpu", **old.pop("machine")}
    if isinstance(old.get("torch"), str) and "torch" not in device:
        device["torch"] = old.pop("torch")
    commit = old.pop("commit", None) or old.get("after_commit") or file_commit or None
    rec_date = old.pop("date", None)
    rec_date = rec_date if isinstance(rec_date, str) and rec_date[:10].count("-") == 2 else date
    if len(rec_date) <= 10 and (added_at(path) or "")[:10] == rec_date:
        rec_date = added_at(path)
    ceilings = old.pop("ceilings", None) or {}
    note = old.pop("note", None)
    cases: list[dict] = []
    results = old.get("results")
    if isinstance(results, dict) and results and all(
            isinstance(v, list) and all(is_row(r) for r in v) for v in results.values()):
        for group, rows in old.pop("results").items():
            cases += [case_from_row(r, group) for r in rows]
    elif topic.startswith("host-cost") and kind == "benchmark" and isinstance(old.get("rows"), dict):
        for name, row in old.pop("rows").items():
            host = row.get("host_us")
            if not isinstance(host, (int, float)):
                cases.append(None)  # placeholder never kept
                continue
            case = {"name": name, "group": "host", "median_us": host,
                    "timing": "host wall time per call: mean of back-to-back calls "
                                      "(benchmarks/host_cost.py)"}
            rest = {k: v for k, v in row.items() if k != "host_us"}
            if rest:
                case["extra"] = rest
            cases.append(case)
        cases = [c for c in cases if c is not None]
    else:
        for key in ("cases", "rows"):
            if isinstance(old.get(key), list) and old[key] and all(is_row(r) for r in old[key]):
                cases += [case_from_row(r, topic) for r in old.pop(key)]
                break
    record = {"schema": schema.SCHEMA_VERSION, "kind": kind, "topic": topic, "device": device,
              "commit": commit, "date": rec_date, "ceilings": ceilings, "cases": cases}
    if isinstance(note, str):
        record["note"] = note
    elif note is not None:
        old["note"] = note
    if old:
        record["extra"] = old
    return scrub(record)


def main() -> int:
    bad = 0
    for path in sorted(RESULTS.iterdir()):
        if not NAME.match(path.name):
            continue
        record = convert(path)
        errors = schema.validate(record)
        if errors:
            bad += 1
            print(path.name, errors[:4])
            continue
        out = path.with_suffix(".json")
        out.write_text(json.dumps(record, indent=1) + "\n")
        if out != path:
            path.unlink()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

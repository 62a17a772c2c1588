"""The one schema of `benchmarks/results/*.json`, and its check.

Every results file is one *record*: what was measured, where, at which commit, against which
ceilings, and the cases. `FIELDS` and `CASE_FIELDS` below are the description (rendered into
benchmarks/README.md by `python benchmarks/index.py`); `validate()` checks a record against
them. Anything a script measures beyond the common fields goes under ``extra`` (the record's or
a case's), never as a new top-level key: tuning sweeps keep their variants there, probes their
traces and counters.

No GPU or torch is needed to import this module (the CPU tests load every record with it).
"""

from __future__ import annotations

import datetime
import re
from typing import Any

SCHEMA_VERSION = 1

#: What a record is. Only ``benchmark`` records feed the index (benchmarks/results/INDEX.md).
KINDS = {
    "benchmark": "the op's headline cases, timed by benchmarks/run.py or a bench_* module "
                 "through benchmarks/harness.py; the newest record of a case is its current figure",
    "sweep": "variants of one build or plan compared in one call (benchmarks/tuning/): the cases "
             "or `extra` name the variant; never the current figure of a case",
    "probe": "a measurement that explains a number (benchmarks/probes/: traces, profiles, "
             "Nsight Compute counters, read patterns); its data usually sits in `extra`",
    "check": "a correctness or packaging run with timings on the side (artifact and wheel checks)",
}

#: Ceilings measured in the same call (benchmarks/harness.py: measure_ceilings) and the
#: `pct_of_*` column of a case that each one gives.
CEILINGS = {
    "copy": ("copy_GBps", "device-to-device copy of 1 GiB, bytes read + written per second"),
    "read": ("read_GBps", "1 GiB read once by a 16-byte-load kernel (read-mostly ops: decode)"),
    "matmul": ("bf16_matmul_TFLOPs", "8192^3 bf16 matmul"),
}

# name: (required, type(s), description)
FIELDS: dict[str, tuple[bool, tuple[type, ...], str]] = {
    "schema": (True, (int,), f"schema version, {SCHEMA_VERSION}"),
    "kind": (True, (str,), "one of " + ", ".join(f"`{k}`" for k in KINDS)),
    "topic": (True, (str,), "what was measured, the file name's last part "
                            "(`<date>-<device>-<commit>-<topic>.json`)"),
    "device": (True, (dict,), "`name` (e.g. `NVIDIA H100 80GB HBM3`, or `cpu`) and what else is "
                              "known: `sm_count`, `capability`, `memory_GiB`, `torch`, `cuda`"),
    "commit": (True, (str, type(None)), "the measured tree's commit (short or full hash), "
                                        "null where the run did not record it"),
    "date": (True, (str,), "ISO 8601 time of the run, UTC (`YYYY-MM-DDTHH:MM:SS+00:00`; "
                           "records of before schema 1 that gave only the day carry the time "
                           "their file was committed)"),
    "ceilings": (True, (dict,), "ceilings measured in the same call (`copy_GBps`, `read_GBps`, "
                                "`bf16_matmul_TFLOPs`, and how: `read_method`, `copy_bytes`, "
                                "...); `{}` where none were measured"),
    "cases": (True, (list,), "the timed cases (below); `[]` where the data is all in `extra`"),
    "note": (False, (str,), "what the reader needs to know to read the numbers"),
    "extra": (False, (dict,), "everything else the script recorded (sweep variants, probe "
                              "data, test counts, host-cost profiles), free-form"),
}

CASE_FIELDS: dict[str, tuple[bool, tuple[type, ...], str]] = {
    "name": (True, (str,), "the case, stable across runs (the index keys on group + name)"),
    "group": (True, (str,), "the op or bench module (`norm`, `attention`, `cascade`, ...)"),
    "median_us": (True, (int, float), "time per call, microseconds: the median of many timings "
                                      "(the mean of back-to-back calls where `timing` says so)"),
    "p10_us": (False, (int, float), "10th percentile"),
    "p90_us": (False, (int, float), "90th percentile"),
    "timing": (False, (str,), "how it was timed (CUDA-graph replay or CUDA events, L2 flush)"),
    "bytes": (False, (int, float), "least traffic the op needs: each input read once, each "
                                   "output written once"),
    "GBps": (False, (int, float), "bytes / median"),
    "flops": (False, (int, float), "the op's arithmetic"),
    "TFLOPs": (False, (int, float), "flops / median"),
    "pct_of_copy": (False, (int, float), "GBps as % of the record's copy ceiling"),
    "pct_of_read": (False, (int, float), "GBps as % of the record's read ceiling"),
    "pct_of_matmul": (False, (int, float), "TFLOPs as % of the record's matmul ceiling"),
    "ceiling": (False, (str,), "which `pct_of_*` is the case's headline: `copy`, `read` or "
                               "`matmul`"),
    "peer_us": (False, (int, float), "FlashInfer 0.7.2's median on the same case, measured in "
                                     "the same call"),
    "speedup_vs_peer": (False, (int, float), "peer_us / median_us (> 1: ours is faster)"),
    "published_us": (False, (int, float), "a published FlashInfer figure for the same case "
                                          "(not measured here)"),
    "speedup_vs_published": (False, (int, float), "published_us / median_us"),
    "target": (False, (str,), "the goal the case is measured against (e.g. `<= 350 us`)"),
    "extra": (False, (dict,), "case data beyond these fields (plan columns: split, items, cta; "
                              "a variant's name)"),
}

#: Paths of the machine a record was made on never belong in a record.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:tmp|root|work|home|scratch|mnt|var/tmp)/")


def _check_fields(obj: dict, fields: dict, where: str) -> list[str]:
    errors = []
    for name, (required, types, _) in fields.items():
        if name not in obj:
            if required:
                errors.append(f"{where}: missing `{name}`")
            continue
        value = obj[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            errors.append(f"{where}: `{name}` must be {names}, got {type(value).__name__}")
    for name in obj:
        if name not in fields:
            errors.append(f"{where}: unknown field `{name}` (put it under `extra`)")
    return errors


def _strings(obj: Any):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def validate(record: Any) -> list[str]:
    """Every way `record` departs from the schema, as readable lines; [] if it conforms."""
    if not isinstance(record, dict):
        return [f"a record is a JSON object, got {type(record).__name__}"]
    errors = _check_fields(record, FIELDS, "record")
    if record.get("schema") not in (None, SCHEMA_VERSION):
        errors.append(f"record: `schema` must be {SCHEMA_VERSION}, got {record['schema']!r}")
    if isinstance(record.get("kind"), str) and record["kind"] not in KINDS:
        errors.append(f"record: `kind` must be one of {sorted(KINDS)}, got {record['kind']!r}")
    if isinstance(record.get("device"), dict) and not isinstance(record["device"].get("name"), str):
        errors.append("record: `device.name` must be a string")
    if isinstance(record.get("date"), str):
        try:
            datetime.date.fromisoformat(record["date"][:10])
        except ValueError:
            errors.append(f"record: `date` must start with YYYY-MM-DD, got {record['date']!r}")
    ceilings = record.get("ceilings") if isinstance(record.get("ceilings"), dict) else {}
    for i, case in enumerate(record.get("cases") or []):
        where = f"cases[{i}]"
        if not isinstance(case, dict):
            errors.append(f"{where}: must be an object")
            continue
        where = f"cases[{i}] ({case.get('name', '?')})"
        errors += _check_fields(case, CASE_FIELDS, where)
        if isinstance(case.get("median_us"), (int, float)) and not case["median_us"] > 0:
            errors.append(f"{where}: `median_us` must be > 0, got {case['median_us']}")
        for pct in ("copy", "read", "matmul"):
            if f"pct_of_{pct}" in case and CEILINGS[pct][0] not in ceilings:
                errors.append(f"{where}: `pct_of_{pct}` without `ceilings.{CEILINGS[pct][0]}`")
        if "ceiling" in case:
            if case["ceiling"] not in CEILINGS:
                errors.append(f"{where}: `ceiling` must be one of {sorted(CEILINGS)}, "
                              f"got {case['ceiling']!r}")
            elif f"pct_of_{case['ceiling']}" not in case:
                errors.append(f"{where}: `ceiling` is {case['ceiling']!r} but "
                              f"`pct_of_{case['ceiling']}` is missing")
        if "speedup_vs_peer" in case and "peer_us" not in case:
            errors.append(f"{where}: `speedup_vs_peer` without `peer_us`")
    paths = sorted({s for s in _strings(record) if MACHINE_PATH.search(s)})
    if paths:
        errors.append(f"record: machine paths in a record: {paths[:3]}")
    return errors


def record(kind: str, topic: str, device: dict, *, commit: str | None = None,
           ceilings: dict | None = None, cases: list | None = None, note: str | None = None,
           date: str | None = None, **extra: Any) -> dict:
    """A record in this schema; keyword arguments beyond the named ones go under `extra`."""
    rec: dict[str, Any] = {
        "schema": SCHEMA_VERSION, "kind": kind, "topic": topic, "device": device,
        "commit": commit or None,
        "date": date or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "ceilings": ceilings or {}, "cases": list(cases or []),
    }
    if note:
        rec["note"] = note
    if extra:
        rec["extra"] = extra
    return rec


def write(path, rec: dict) -> None:
    """Validate `rec` and write it as `path` (JSON); a record that does not conform is refused
    with every reason, before anything is written."""
    import json
    from pathlib import Path

    errors = validate(rec)
    if errors:
        raise ValueError("not a valid results record:\n  " + "\n  ".join(errors))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")


def headline_pct(case: dict) -> tuple[str, float] | None:
    """The case's headline share of a ceiling: (`copy`/`read`/`matmul`, percent), if any."""
    which = case.get("ceiling")
    if which is None:
        which = next((w for w in ("matmul", "copy", "read") if f"pct_of_{w}" in case), None)
    if which is None or f"pct_of_{which}" not in case:
        return None
    return which, case[f"pct_of_{which}"]

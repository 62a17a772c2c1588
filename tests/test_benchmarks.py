"""The benchmark record: every results file in one schema, no machine paths, generated files
current, one listed note per investigation, scripts that find their harness. CPU only."""

import ast
import importlib.util
import json
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))  # index.py imports schema by name
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


schema = _load("schema")
index = _load("index")

RESULTS = sorted((BENCH / "results").iterdir())


def test_results_hold_only_records_and_the_index():
    stray = [p.name for p in RESULTS if p.suffix != ".json" and p.name != "INDEX.md"]
    assert stray == [], "benchmarks/results/ holds JSON records (and INDEX.md) only"
    name = re.compile(r"\d{4}-\d\d-\d\d-[a-z0-9]+-([0-9a-f]{7}-)?[a-z0-9.-]+\.json$")
    assert [p.name for p in RESULTS if p.suffix == ".json" and not name.match(p.name)] == []


@pytest.mark.parametrize("path", [p for p in RESULTS if p.suffix == ".json"], ids=lambda p: p.stem)
def test_every_record_validates(path):
    record = json.loads(path.read_text())
    assert schema.validate(record) == []
    assert path.stem.endswith(record["topic"]), "the file name ends with the record's topic"
    assert path.name.startswith(record["date"][:10])


def test_no_machine_paths_in_results():
    offenders = [p.name for p in RESULTS if schema.MACHINE_PATH.search(p.read_text())]
    assert offenders == []


def test_generated_files_are_current():
    stale = [str(p.relative_to(ROOT)) for p in index.stale()]
    assert stale == [], f"run `python benchmarks/index.py` ({stale})"


def test_every_note_is_listed_and_opens_with_its_four_paragraphs():
    toc = (BENCH / "NOTES.md").read_text()
    notes = sorted((BENCH / "notes").glob("*.md"))
    assert len(notes) >= 10
    for note in notes:
        assert f"(notes/{note.name})" in toc, f"{note.name} missing: run python benchmarks/index.py"
        head = note.read_text().split("\n## ", 1)[0]
        labels = re.findall(r"^\*\*(Question|Prediction|Result|Decision)\.\*\*", head, re.M)
        assert labels == ["Question", "Prediction", "Result", "Decision"], note.name
    assert len(toc.splitlines()) < 60, "NOTES.md is a table of contents, the notes hold the text"


def _local_imports(script: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
    local = {p.stem for d in (BENCH, BENCH / "tuning", BENCH / "probes", ROOT / "tests")
             for p in d.glob("*.py")}
    return names & local


@pytest.mark.parametrize("script", sorted((BENCH / "tuning").glob("*.py"))
                         + sorted((BENCH / "probes").glob("*.py")), ids=lambda p: p.name)
def test_moved_scripts_find_what_they_import(script):
    """Run as `python benchmarks/<folder>/<script>.py`, each script's path setup reaches every
    benchmark or test module it imports (harness, bench_attention, tune_attention, ...)."""
    ns = {"__file__": str(script), "Path": Path, "sys": types.SimpleNamespace(path=[])}
    for line in script.read_text().splitlines():
        if line.strip().startswith(("HERE = ", "sys.path.insert(")):
            exec(line.strip(), ns)
    dirs = [script.parent] + [Path(p) for p in ns["sys"].path]
    for name in _local_imports(script):
        assert any((d / f"{name}.py").exists() for d in dirs), f"{script.name}: {name}"


def _record(**over):
    rec = schema.record("benchmark", "x", {"name": "cpu"}, commit="abc1234",
                        ceilings={"copy_GBps": 3000.0},
                        cases=[{"name": "a", "group": "g", "median_us": 2.0, "pct_of_copy": 90.0,
                                "ceiling": "copy"}])
    rec.update(over)
    return rec


def test_validate_names_what_is_wrong():
    assert schema.validate(_record()) == []
    assert schema.validate([]) == ["a record is a JSON object, got list"]
    assert "record: missing `ceilings`" in schema.validate(
        {k: v for k, v in _record().items() if k != "ceilings"})
    assert any("unknown field `speed`" in e for e in schema.validate(_record(speed=1)))
    assert any("`kind` must be one of" in e for e in schema.validate(_record(kind="run")))
    assert any("`schema` must be 1" in e for e in schema.validate(_record(schema=2)))
    assert any("`date` must start with YYYY-MM-DD" in e
               for e in schema.validate(_record(date="yesterday")))
    assert any("machine paths" in e for e in schema.validate(_record(note="see /tmp/x/log")))
    bad_case = {"name": "b", "group": "g", "median_us": 0, "pct_of_read": 50.0,
                "ceiling": "read", "speedup_vs_peer": 1.1}
    errors = schema.validate(_record(cases=[bad_case]))
    assert any("`median_us` must be > 0" in e for e in errors)
    assert any("`pct_of_read` without `ceilings.read_GBps`" in e for e in errors)
    assert any("`speedup_vs_peer` without `peer_us`" in e for e in errors)
    assert any("missing `group`" in e for e in schema.validate(
        _record(cases=[{"name": "c", "median_us": 1.0}])))


def test_write_refuses_an_invalid_record(tmp_path):
    with pytest.raises(ValueError, match="unknown field `speed`"):
        schema.write(tmp_path / "r.json", _record(speed=1))
    assert not (tmp_path / "r.json").exists()
    schema.write(tmp_path / "r.json", _record())
    assert schema.validate(json.loads((tmp_path / "r.json").read_text())) == []


def test_index_takes_the_newest_benchmark_record_of_each_case(tmp_path):
    old = _record(date="2026-01-01T00:00:00+00:00")
    new = _record(date="2026-01-02T00:00:00+00:00", commit="def5678")
    new["cases"][0]["median_us"] = 1.5
    sweep = _record(date="2026-01-03T00:00:00+00:00", kind="sweep", commit="0000000")
    records = [(tmp_path / "2026-01-01-cpu-abc1234-x.json", old),
               (tmp_path / "2026-01-02-cpu-def5678-x.json", new),
               (tmp_path / "2026-01-03-cpu-0000000-x.json", sweep)]
    (path, rec, case), = index.current_cases(records).values()
    assert rec["commit"] == "def5678" and case["median_us"] == 1.5
    text = index.index_markdown(records)
    assert "| a | 1.50 | 90.0% of copy |" in text and "def5678" in text and "0000000" not in text


def test_headlines_keep_the_newest_ratio_measured_against_the_peer():
    """A later run of ours alone (its ratio against a published figure, maybe of another GPU)
    does not replace a ratio measured in one call; the plain index still shows the newest."""
    def rec(date, **ratio):
        return {"kind": "benchmark", "date": date,
                "cases": [{"group": "attention", "name": "decode", **ratio}]}

    records = [(Path("a.json"), rec("2026-11-20", speedup_vs_peer=1.02)),
               (Path("b.json"), rec("2026-11-25", speedup_vs_published=1.39))]
    assert index.current_cases(records)[("attention", "decode")][0].name == "b.json"
    assert index.current_cases(records, measured_first=True)[("attention", "decode")][0].name \
        == "a.json"


def test_cited_benchmark_paths_exist():
    """Docs, notes, benchmark scripts, tests and tools name benchmark files by their path; every
    such path exists (the scripts moved into tuning/ and probes/ once)."""
    upstream = {"benchmarks/bench_batch_decode.py"}  # FlashInfer's own benchmark, cited as such
    files = [ROOT / "README.md", ROOT / "docs" / "attention.md",
             ROOT / "docs" / "CONTRIBUTING-ops.md", *BENCH.rglob("*.py"), *BENCH.rglob("*.md"),
             *(ROOT / "tests").rglob("*.py"), *(ROOT / "tools").glob("*.*")]
    cited = re.compile(r"benchmarks/[\w/.-]*\w\.(?:py|md|json)")
    missing = sorted({f"{f.relative_to(ROOT)}: {m}" for f in files if f.name != "INDEX.md"
                      for m in cited.findall(f.read_text(errors="ignore"))
                      if m not in upstream and not (ROOT / m).exists()})
    assert missing == []

"""benchmarks/flashinfer_benchmark.py on CPU: flags, testlists, CSV columns, repro commands,
the routine registry's coverage of every public op, listing without a GPU."""

import csv
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import flashinfer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import flashinfer_benchmark as fb  # noqa: E402
import routines  # noqa: E402

ISSUE_EXAMPLE = ("--routine BatchDecodeWithPagedKVCacheWrapper --backends fa2 fa3 cudnn "
                 "--batch_size 32 --s_kv 2048 --num_qo_heads 32 --num_kv_heads 8 --head_dim_qk 128 "
                 "--head_dim_vo 128 --page_size 16 --refcheck -vv")
CONTRACT_SAMPLING_TOPK = set(routines.SAMPLING_OPS) | set(routines.TOPK_OPS) | {
    "top_p_renorm_prob", "top_k_renorm_prob"}


def test_the_issue_example_parses():
    args = fb.parse_case(shlex.split(ISSUE_EXAMPLE))
    assert args.routine == "BatchDecodeWithPagedKVCacheWrapper"
    assert args.backends == ["fa2", "fa3", "cudnn"] and args.verbose == 2 and args.refcheck
    assert (args.batch_size, args.s_kv, args.page_size, args.head_dim_vo) == (32, 2048, 16, 128)
    assert (args.num_iters, args.dry_run_iters, args.random_seed) == (30, 5, 42)


def test_bad_flags_are_refused(capsys):
    for bad in ("--routine rmsnorm --backends fa3",  # not a backend of the routine
                "--routine nope", "--routine rmsnorm --num_iters 0",
                "--routine BatchDecodeWithPagedKVCacheWrapper --num_qo_heads 6 --num_kv_heads 4",
                "--backends fa2", "--routine rmsnorm --unknown_flag 1",
                "--routine rmsnorm --num_iter 3"):  # no abbreviations
        with pytest.raises(SystemExit):
            fb.parse_case(shlex.split(bad))


def test_default_backends_per_routine():
    assert fb.parse_case(["--routine", "rmsnorm"]).backends == ["cuda"]
    assert fb.parse_case(["--routine", "BatchPrefillWithRaggedKVCacheWrapper"]).backends == ["auto"]


@pytest.mark.parametrize("line", [
    ISSUE_EXAMPLE,
    "--routine rmsnorm --batch_size 8 --hidden_size 8192 --backends cuda cubin torch --refcheck",
    "--routine apply_llama31_rope --interleave --rotary_dim 64 --case_tag 'llama 3.1' -v",
    "--routine top_k_top_p_sampling_from_logits --filter_apply_order joint --top_p 0.5",
    "--routine BatchPrefillWithPagedKVCacheWrapper --causal --no_cuda_graph --enable_pdl",
])
def test_repro_command_round_trip(line):
    args = fb.parse_case(shlex.split(line))
    args.generate_repro_command = True
    again = fb.parse_case(shlex.split(fb.repro_command(args)))
    for key, value in vars(args).items():
        if key not in fb._NOT_CASE:
            assert getattr(again, key) == value, key
    assert fb.repro_command(again) == fb.repro_command(args)


def test_testlist_parsing(tmp_path):
    listing = tmp_path / "cases.txt"
    listing.write_text(
        "# attention\n\n"
        f"{ISSUE_EXAMPLE}\n"
        "python3 flashinfer_benchmark.py --routine silu_and_mul --hidden_size 14336  # inline\n"
        "--routine merge_state --seq_len 512 --case_tag merges\n")
    cases = fb.read_testlist(listing)
    assert [c.routine for c in cases] == ["BatchDecodeWithPagedKVCacheWrapper", "silu_and_mul",
                                          "merge_state"]
    assert cases[1].hidden_size == 14336 and cases[2].case_tag == "merges"


def test_gpu_testlist_covers_every_routine():
    cases = fb.read_testlist(ROOT / "benchmarks" / "testlists" / "all_routines.txt")
    assert {c.routine for c in cases} == set(routines.ROUTINES)
    assert all(c.refcheck for c in cases)


def test_registry_covers_every_public_op():
    # ops, not the enums that name their options (flashinfer.TopKTieBreak)
    public = {name for names in flashinfer._OPS.values() for name in names
              if not isinstance(getattr(flashinfer, name), type)}
    assert public - routines.covered_ops() == set()
    assert CONTRACT_SAMPLING_TOPK - routines.covered_ops() == set()
    for r in routines.ROUTINES.values():
        assert set(r.default_backends) <= set(r.backends)


def test_csv_has_the_fixed_columns(tmp_path):
    args = fb.parse_case(["--routine", "rmsnorm", "--case_tag", "t"])
    row = fb._row(args, "cuda", note="x")
    fb.write_csv(tmp_path / "out.csv", [row])
    with open(tmp_path / "out.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == fb.CSV_COLUMNS
        (got,) = list(reader)
    assert got["routine"] == "rmsnorm" and got["case_tag"] == "t" and got["note"] == "x"
    for column in ("median_time_ms", "ceiling", "pct_of_ceiling", "copy_GBps", "read_GBps",
                   "bf16_matmul_TFLOPs", "refcheck", "repro_command"):
        assert column in fb.CSV_COLUMNS


def test_listing_and_plan_only_need_no_gpu(tmp_path):
    env = {"PYTHONPATH": str(ROOT / "packages" / "flashinfer-python"), "CUDA_VISIBLE_DEVICES": ""}
    script = str(ROOT / "benchmarks" / "flashinfer_benchmark.py")
    out = subprocess.run([sys.executable, script, "--list_routines"], capture_output=True,
                         text=True, env=env, check=True).stdout
    assert "BatchDecodeWithPagedKVCacheWrapper" in out and "(needs flashinfer.sampling)" in out
    out = subprocess.run([sys.executable, script, "--testlist",
                          str(ROOT / "benchmarks" / "testlists" / "all_routines.txt"),
                          "--plan_only"], capture_output=True, text=True, env=env, check=True)
    assert len(out.stdout.splitlines()) == len(routines.ROUTINES) + 3


SMALL = ("--batch_size 3 --s_qo 8 --s_kv 40 --num_qo_heads 4 --num_kv_heads 2 --head_dim_qk 64 "
         "--page_size 16 --hidden_size 64 --seq_len 8 --head_dim 64 --vocab_size 300 --top_k 10 "
         "--num_speculate_tokens 3 --input_dtype float32 --num_states 3 --max_len 64")


@pytest.mark.parametrize("name", sorted(routines.ROUTINES))
def test_torch_baseline_passes_the_refcheck_on_cpu(name, monkeypatch):
    """Each routine's inputs, PyTorch baseline, reference and check, built on CPU (ours needs
    the GPU): the baseline must pass the refcheck the GPU run applies to ours."""
    monkeypatch.setattr(routines, "DEVICE", "cpu")
    extra = " --causal --s_qo 40" if "Prefill" in name or "prefill" in name else ""
    args = fb.parse_case(shlex.split(f"--routine {name} {SMALL}{extra}"))
    if "torch" not in routines.ROUTINES[name].backends:
        pytest.skip(f"{name} has no PyTorch baseline")
    built = routines.ROUTINES[name].build(args, ["torch"])
    assert built.bytes > 0 and built.ceiling in ("copy", "read", "matmul")
    out = built.fns["torch"]()
    ok, err, note = built.check(out, built.reference())
    assert ok, (name, err, note)


def test_rows_become_a_valid_results_record():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_schema", ROOT / "benchmarks" / "schema.py")
    schema = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(schema)
    args = fb.parse_case(["--routine", "BatchDecodeWithPagedKVCacheWrapper", "--case_tag", "x"])
    row = fb._row(args, "fa2", repro="python3 benchmarks/flashinfer_benchmark.py --routine r")
    row.update(median_time_ms=0.05, p10_time_ms=0.049, p90_time_ms=0.052, timing="cuda graph",
               bytes=150_000_000, flops=2e9, ceiling="read", shape="b=32", dtype="bf16",
               copy_GBps=3000.0, read_GBps=3300.0, bf16_matmul_TFLOPs=700.0, refcheck="pass")
    (case,) = fb.record_cases([row, fb._row(args, "cudnn", note="skipped")])
    assert case["ceiling"] == "read" and case["pct_of_read"] == round(100 * 3000 / 3300, 1)
    assert case["group"] == "attention" and case["extra"]["refcheck"] == "pass"
    rec = schema.record("benchmark", "cli-routines", {"name": "cpu"}, commit="abc1234",
                        ceilings={"copy_GBps": 3000.0, "read_GBps": 3300.0,
                                  "bf16_matmul_TFLOPs": 700.0}, cases=[case])
    assert schema.validate(rec) == []


def test_run_case_plumbing_on_cpu(tmp_path, monkeypatch):
    """run_case end to end with the timer and ceilings stubbed (no GPU): refcheck, rows, CSV,
    skipped backends, and the results record."""
    import torch

    monkeypatch.setattr(routines, "DEVICE", "cpu")
    monkeypatch.setattr(fb, "_time", lambda args, fn, cupti, graph=True: ([0.1, 0.2, 0.3],
                                                                           "cupti (stub)"))
    monkeypatch.setitem(fb._CEILINGS, "copy_GBps", 3000.0)
    monkeypatch.setitem(fb._CEILINGS, "read_GBps", 3300.0)
    monkeypatch.setitem(fb._CEILINGS, "bf16_matmul_TFLOPs", 700.0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stub")
    rows = []
    for line in ("--routine fused_add_rmsnorm --backends torch --batch_size 4 --hidden_size 64 "
                 "--refcheck --generate_repro_command --case_tag t",
                 "--routine single_prefill_with_kv_cache --backends torch --s_qo 8 --s_kv 16 "
                 "--num_qo_heads 4 --num_kv_heads 2 --head_dim_qk 64 --causal --refcheck"):
        rows += fb.run_case(fb.parse_case(shlex.split(line)), cupti=False)
    assert [r["refcheck"] for r in rows] == ["pass", ""]
    assert rows[0]["median_time_ms"] == 0.2 and rows[0]["ceiling"] == "copy"
    assert rows[0]["timer"] == "cupti" and rows[1]["timer"] == ""  # the second is skipped
    assert rows[0]["repro_command"].startswith("python3 benchmarks/flashinfer_benchmark.py")
    assert "top-left" in rows[1]["note"]  # causal SDPA with s_qo != s_kv is not comparable
    fb.write_csv(tmp_path / "o.csv", rows)
    assert len((tmp_path / "o.csv").read_text().splitlines()) == 3
    import harness

    monkeypatch.setattr(harness, "device_info", lambda: {"name": "cpu"})
    fb.write_record(tmp_path / "2026-01-01-cpu-abc1234-cli.json", rows, "abc1234")
    record = json.loads((tmp_path / "2026-01-01-cpu-abc1234-cli.json").read_text())
    assert record["topic"] == "cli" and len(record["cases"]) == 1

"""benchmarks/peer_compare.py, and the merges of host_cost.py and attention_vs_peer.py built on
it, on CPU with synthetic measure files: both write a valid results record with the peer's
column and the ratio, reading one or several files per side."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import peer_compare  # noqa: E402
import schema  # noqa: E402


def test_command_line():
    args = peer_compare.command_line("doc", ["measure", "o.json", "--label", "peer"])
    assert (args.cmd, args.out, args.label, args.cases) == ("measure", "o.json", "peer", "")
    args = peer_compare.command_line("doc", ["merge", "r.json", "--ours", "a", "b", "--peer", "c"])
    assert (args.ours, args.peer, args.commit) == (["a", "b"], ["c"], "")
    assert peer_compare.command_line("doc", ["warmup", "--cases", "x,y"]).cases == "x,y"
    for bad in (["warmup", "--label", "peer"], ["merge", "r.json", "--ours", "a"], []):
        with pytest.raises(SystemExit):  # warmup has no label to use: refused, not ignored
            peer_compare.command_line("doc", bad)


def _write(path, rows, **head):
    path.write_text(json.dumps({"rows": rows, **head}))
    return str(path)


def test_paired_joins_by_name_across_files(tmp_path):
    a = _write(tmp_path / "a.json", [{"name": "x", "v": 1}, {"name": "y", "v": 2}], label="ours")
    b = _write(tmp_path / "b.json", [{"name": "y", "v": 3}])  # a rerun of one case wins
    c = _write(tmp_path / "c.json", [{"name": "x", "v": 9}], label="peer")
    ours, peer, pairs = peer_compare.paired([a, b], [c])
    assert ours["label"] == "ours" and peer["label"] == "peer"
    assert [(r["name"], r["v"], p.get("v")) for r, p in pairs] == [("x", 1, 9), ("y", 3, None)]


DEVICE = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}


def _merged(module, tmp_path, ours, peer, *flags):
    """``module``'s merge of the two measure files: the record (valid) and its one case."""
    out = tmp_path / "r.json"
    assert module.main(["merge", str(out), "--ours", ours, "--peer", peer, *flags]) == 0
    rec = json.loads(out.read_text())
    assert schema.validate(rec) == []
    (case,) = rec["cases"]
    return rec, case


def test_host_cost_merge_writes_a_valid_record(tmp_path):
    import host_cost

    ours = _write(tmp_path / "o.json", [{"name": "decode run", "host_us": 10.0, "gpu_us": 5.0},
                                        {"name": "broken", "error": "boom"}],
                  device=DEVICE, flashinfer_version="0.1.0", method={"reps": 7})
    peer = _write(tmp_path / "p.json", [{"name": "decode run", "host_us": 20.0}],
                  flashinfer_version="0.7.2")
    rec, case = _merged(host_cost, tmp_path, ours, peer, "--commit", "abc1234")
    assert case["peer_us"] == 20.0 and case["speedup_vs_peer"] == 2.0
    assert case["extra"]["host_ratio_ours_over_peer"] == 0.5
    assert rec["extra"]["failed"][0]["name"] == "broken"


def test_attention_vs_peer_merge_writes_a_valid_record(tmp_path):
    import attention_vs_peer

    ceilings = {"copy_GBps": 3000.0, "read_GBps": 3300.0, "bf16_matmul_TFLOPs": 700.0}
    row = {"name": "batch decode 64 x kv 4096", "group": "attention", "timing": "cuda graph",
           "median_us": 300.0, "p10_us": 299.0, "p90_us": 301.0}
    ours = _write(tmp_path / "o.json", [row], device=DEVICE, ceilings=ceilings)
    peer = _write(tmp_path / "p.json", [dict(row, median_us=360.0)], ceilings=ceilings,
                  flashinfer_version="0.7.2")
    rec, case = _merged(attention_vs_peer, tmp_path, ours, peer, "--commit", "abc1234")
    assert case["peer_us"] == 360.0 and case["speedup_vs_peer"] == 1.2
    assert case["extra"]["ratio_ours_over_peer"] == round(300 / 360, 3)


def test_attention_merge_without_the_peer_file_records_ours_and_says_so(tmp_path):
    """The peer's JIT build may not finish within a device call: the merge still writes our
    side, with no peer column and the reason in the record."""
    import attention_vs_peer

    ours = _write(tmp_path / "o.json", [{"name": "decode", "median_us": 10.0}],
                  device=DEVICE, flashinfer_version="0.1.0", ceilings={"read_GBps": 3000.0})
    rec, case = _merged(attention_vs_peer, tmp_path, ours, str(tmp_path / "missing.json"))
    assert "peer_us" not in case and "speedup_vs_peer" not in case
    assert rec["note"].startswith("ours alone: no measure file of the peer")
    assert "not_measured" in rec["extra"]["peer"]


def test_median_round_keeps_the_median_rounds_row_and_every_rounds_time():
    rounds = [[{"name": "a", "median_us": t, "p10_us": t - 1}, {"name": "b", "median_us": 10.0}]
              for t in (5.0, 3.0, 4.0)]
    a, b = peer_compare.median_round(rounds)
    assert a["median_us"] == 4.0 and a["p10_us"] == 3.0
    assert a["extra"]["rounds_us"] == [5.0, 3.0, 4.0] and b["extra"]["rounds_us"] == [10.0] * 3
    assert peer_compare.median_round([[{"name": "a", "median_us": 1.0}]]) == [
        {"name": "a", "median_us": 1.0}]  # one round: the row as timed


def test_rounds_is_an_option_only_where_the_script_times_through_median_round():
    args = peer_compare.command_line("x", ["measure", "o.json", "--rounds", "3"], rounds=True)
    assert args.rounds == 3
    with pytest.raises(SystemExit):  # host_cost.py's measure would ignore it: refused
        peer_compare.command_line("x", ["measure", "o.json", "--rounds", "3"])
    with pytest.raises(SystemExit):  # at least one round
        peer_compare.command_line("x", ["measure", "o.json", "--rounds", "0"], rounds=True)

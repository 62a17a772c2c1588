"""Level-10 dumps and replay, on CPU tensors with fake decorated ops (no GPU, no kernel)."""

import json
import warnings

import pytest
import torch
from click.testing import CliRunner

from flashinfer import api_dump, api_logging, fi_trace, knobs
from flashinfer.__main__ import cli
from flashinfer.fi_trace import Tensor, TraceTemplate, Var


@pytest.fixture
def level10(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", "10")
    monkeypatch.setenv("FLASHINFER_LOGDEST", str(tmp_path / "log.txt"))
    monkeypatch.setenv("FLASHINFER_DUMP_DIR", str(tmp_path / "dumps"))
    for name in ("INCLUDE", "EXCLUDE", "MAX_COUNT", "MAX_SIZE_GB", "SAFETENSORS"):
        monkeypatch.delenv(f"FLASHINFER_DUMP_{name}", raising=False)
    # The host's free disk must not decide these tests (CI's disk can be nearly full by the
    # time the release check runs them): the free-space stop has its own test below.
    monkeypatch.setattr(api_dump, "_FREE_MARGIN", 0)
    api_dump.reset()
    api_logging._reset_sink()
    yield tmp_path / "dumps"
    api_dump.reset()
    api_logging._reset_sink()


# Fake ops live at module level so replay can import them by module + qualname.
def fake_double(x, factor=2.0):
    return x * factor


def fake_inplace_add(x, y):
    x.add_(y)


fi_trace._explicit["fake_inplace_add"] = TraceTemplate(
    op_type="fake", name_prefix="fake_inplace_add", description="x += y", axes={"n": Var()},
    inputs={"x": Tensor(["n"]), "y": Tensor(["n"])},
    outputs={"x_out": Tensor(["n"], "=x", source="arg:x")})


def _calls(root):
    return sorted(p for p in root.iterdir() if p.is_dir())


def _decorated(fn):
    return api_logging.flashinfer_api(fn)


def test_level10_writes_inputs_outputs_and_metadata(level10):
    op = _decorated(fake_double)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    op(x, factor=3.0)
    (folder,) = _calls(level10)
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["qualname"] == "fake_double" and meta["status"] == "ok"
    assert meta["arguments"]["factor"] == 3.0
    assert meta["arguments"]["x"]["shape"] == [2, 3]
    assert torch.equal(torch.load(folder / "inputs.pt")["x"], x)
    assert torch.equal(torch.load(folder / "outputs.pt")["result"], x * 3)
    (line,) = (level10 / "session.jsonl").read_text().splitlines()
    assert json.loads(line)["folder"] == folder.name and json.loads(line)["status"] == "ok"


def test_inplace_inputs_are_kept_as_they_were_before_the_call(level10):
    op = _decorated(fake_inplace_add)
    x, y = torch.ones(4), torch.full((4,), 2.0)
    op(x, y)
    (folder,) = _calls(level10)
    assert torch.equal(torch.load(folder / "inputs.pt")["x"], torch.ones(4))
    assert torch.equal(torch.load(folder / "outputs.pt")["arg:x"], torch.full((4,), 3.0))


def test_include_exclude_globs(level10, monkeypatch):
    a, b = _decorated(fake_double), _decorated(fake_inplace_add)
    monkeypatch.setenv("FLASHINFER_DUMP_INCLUDE", "fake_*")
    monkeypatch.setenv("FLASHINFER_DUMP_EXCLUDE", "*inplace*")
    a(torch.ones(2))
    b(torch.ones(2), torch.ones(2))
    (folder,) = [p for p in level10.iterdir() if p.is_dir()]
    assert "_fake_double_call" in folder.name
    monkeypatch.setenv("FLASHINFER_DUMP_INCLUDE", "flashinfer.norm.*")
    a(torch.ones(2))
    assert len([p for p in level10.iterdir() if p.is_dir()]) == 1


def test_max_count_and_size_stop_with_one_warning(level10, monkeypatch):
    op = _decorated(fake_double)
    monkeypatch.setenv("FLASHINFER_DUMP_MAX_COUNT", "2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            op(torch.ones(3))
    assert len(_calls(level10)) == 2
    assert sum("MAX_COUNT" in str(w.message) for w in caught) == 1
    api_dump.reset()
    monkeypatch.delenv("FLASHINFER_DUMP_MAX_COUNT")
    monkeypatch.setenv("FLASHINFER_DUMP_MAX_SIZE_GB", "0.000001")  # 1000 bytes
    level10 = level10.parent / "dumps2"
    monkeypatch.setenv("FLASHINFER_DUMP_DIR", str(level10))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op(torch.ones(100))  # 400 bytes in + 400 out: fits
        op(torch.ones(100))  # would pass 1000 bytes: refused, dumping stops
        op(torch.ones(1))
    assert len(_calls(level10)) == 1
    assert sum("MAX_SIZE_GB" in str(w.message) for w in caught) == 1


def test_a_nearly_full_disk_stops_dumping_with_one_warning(level10, monkeypatch):
    op = _decorated(fake_double)
    op(torch.ones(3))  # room enough: written
    monkeypatch.setattr(api_dump, "_FREE_MARGIN", 1 << 30)
    real = api_dump.shutil.disk_usage
    monkeypatch.setattr(api_dump.shutil, "disk_usage",
                        lambda path: real(path)._replace(free=(1 << 30) - 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op(torch.ones(3))  # would leave less than the margin: refused, dumping stops
        op(torch.ones(3))
    assert len(_calls(level10)) == 1
    stops = [str(w.message) for w in caught if "dumps stopped" in str(w.message)]
    assert len(stops) == 1 and "bytes free under" in stops[0], stops


def test_safetensors_and_replay_round_trip(level10, monkeypatch):
    monkeypatch.setenv("FLASHINFER_DUMP_SAFETENSORS", "1")
    op, inplace = _decorated(fake_double), _decorated(fake_inplace_add)
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, :2]
    op(strided, factor=0.5)
    inplace(torch.ones(3), torch.ones(3))
    folders = _calls(level10)
    assert (folders[0] / "inputs.safetensors").exists()
    results = api_dump.replay_dir(level10)
    assert [r.status for r in results] == ["match", "match"], results
    assert api_dump.summary(results) == (2, 0, 0, 0)


def test_replay_reports_a_mismatch_and_the_cli_fails(level10):
    op = _decorated(fake_double)
    op(torch.ones(3))
    (folder,) = _calls(level10)
    torch.save({"result": torch.zeros(3)}, folder / "outputs.pt")
    (result,) = api_dump.replay_dir(level10)
    assert result.status == "mismatch" and "differ" in result.detail
    out = CliRunner().invoke(cli, ["replay", "--dir", str(level10)])
    assert out.exit_code == 1 and "MISMATCH" in out.output and "1 mismatch" in out.output


def test_replay_cli_matches(level10):
    _decorated(fake_double)(torch.ones(3))
    out = CliRunner().invoke(cli, ["replay", "--dir", str(level10)])
    assert out.exit_code == 0, out.output
    assert "1 calls: 1 match" in out.output


def test_capture_defers_the_dump_until_flush(level10, monkeypatch):
    op = _decorated(fake_inplace_add)
    monkeypatch.setattr(api_dump, "_capturing", lambda: True)
    x, y = torch.ones(2), torch.ones(2)
    op(x, y)
    assert not level10.exists() or not any(level10.iterdir())  # nothing written, no copy made
    assert api_dump.flush() == 0  # still capturing
    monkeypatch.setattr(api_dump, "_capturing", lambda: False)
    assert api_dump.flush() == 1
    (folder,) = _calls(level10)
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["deferred"] is True
    # kept by reference: the values at flush time
    assert torch.equal(torch.load(folder / "inputs.pt")["x"], torch.full((2,), 2.0))


def test_a_raising_call_is_dumped_and_skipped_by_replay(level10):
    def fake_raises(x):
        raise ValueError("bad x")

    op = _decorated(fake_raises)
    with pytest.raises(ValueError, match="bad x"):
        op(torch.ones(1))
    (result,) = api_dump.replay_dir(level10)
    assert result.status == "skipped" and "raised ValueError" in result.detail


def test_every_dump_knob_is_declared():
    names = set(knobs.all_env_vars())
    for suffix in ("DIR", "MAX_SIZE_GB", "MAX_COUNT", "INCLUDE", "EXCLUDE", "SAFETENSORS"):
        assert f"FLASHINFER_DUMP_{suffix}" in names
    assert {"FLASHINFER_TRACE_DUMP", "FLASHINFER_TRACE_DUMP_DIR"} <= names


def fake_tuple_write(pair, value):
    pair[0].fill_(value)
    pair[1].fill_(-value)


fi_trace._explicit["fake_tuple_write"] = TraceTemplate(
    op_type="fake", name_prefix="fake_tuple_write", description="writes a (k, v) pair",
    axes={"n": Var()}, inputs={}, outputs={}, mutates=("pair",))


def test_a_tuple_argument_written_in_place_is_dumped_and_replayed(level10):
    op = _decorated(fake_tuple_write)
    k, v = torch.zeros(3), torch.zeros(3)
    op((k, v), 2.0)
    (folder,) = _calls(level10)
    outputs = torch.load(folder / "outputs.pt")
    assert set(outputs) == {"arg:pair.0", "arg:pair.1"}
    assert torch.equal(outputs["arg:pair.1"], torch.full((3,), -2.0))
    assert torch.equal(torch.load(folder / "inputs.pt")["pair.0"], torch.zeros(3))
    (result,) = api_dump.replay_dir(level10)
    assert result.status == "match" and "2 output(s)" in result.detail

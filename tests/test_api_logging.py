"""@flashinfer_api: levels 0/1/3/5, destinations, crash visibility, graph-capture safety."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from flashinfer import api_logging, knobs
from flashinfer.api_logging import flashinfer_api

PACKAGE_ROOT = Path(api_logging.__file__).resolve().parents[1]


@pytest.fixture
def logging_knobs():
    """Override the logging knobs in code; restore them and the log sink afterwards."""
    api_logging._reset_sink()
    with knobs.logging.scope():
        yield knobs.logging
    api_logging._reset_sink()


def _decorated(level: int, body=None):
    """A fresh function decorated at ``level`` (the level is read at decoration)."""
    knobs.logging.level = level

    def scale_rows(x, factor=2.0, *, out=None):
        if body is not None:
            body()
        return x * factor

    return flashinfer_api(scale_rows)


# ---------------------------------------------------------------------------------------------
# Level 0: identity


def test_level_0_returns_the_function_itself(logging_knobs, capsys):
    def op(x):
        return x

    logging_knobs.level = 0
    assert flashinfer_api(op) is op
    op(1)
    assert capsys.readouterr().out == ""


def test_level_0_is_the_default(monkeypatch):
    monkeypatch.delenv("FLASHINFER_LOGLEVEL", raising=False)

    def op():
        pass

    assert flashinfer_api(op) is op


def test_unparsable_level_warns_and_disables(monkeypatch):
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", "verbose")
    monkeypatch.setattr(api_logging, "_WARNED_LEVELS", set())

    def op():
        pass

    with pytest.warns(RuntimeWarning, match="FLASHINFER_LOGLEVEL"):
        assert flashinfer_api(op) is op


def test_unparsable_level_warns_once_per_process(tmp_path):
    """Every ops module decorates its functions on import: a bad value warns once, not once
    per decorated function (27 warnings before), even with every warning shown."""
    code = textwrap.dedent("""
        import warnings
        warnings.simplefilter("always")
        import flashinfer
        from flashinfer import activation, cascade, decode, norm, page, prefill, rope  # noqa: F401
    """)
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "FLASHINFER_LOGLEVEL": "loud",
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("API logging disabled") == 1, proc.stderr
    assert "FLASHINFER_LOGLEVEL" in proc.stderr


@pytest.mark.parametrize("env, level", [("1", 1), ("2", 1), ("4", 3), ("7", 5), ("10", 10), ("12", 10)])
def test_in_between_levels_round_down(monkeypatch, env, level):
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", env)
    assert api_logging._decoration_level() == level


def test_a_negative_level_disables_logging_with_a_warning(monkeypatch):
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", "-1")
    monkeypatch.setattr(api_logging, "_WARNED_LEVELS", set())  # whatever ran before
    with pytest.warns(RuntimeWarning, match=r"FLASHINFER_LOGLEVEL must be an integer .* got '-1'"):
        assert api_logging._decoration_level() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: the second call is silent
        assert api_logging._decoration_level() == 0


# ---------------------------------------------------------------------------------------------
# Levels 1, 3, 5 to stdout


def test_level_1_logs_the_name_and_a_banner_once(logging_knobs, capsys):
    op = _decorated(1)
    assert op.__name__ == "scale_rows" and op.__wrapped__ is not None
    x = torch.ones(2, 3)
    assert torch.equal(op(x), x * 2)
    op(x)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3, out
    assert "FlashInfer " in out[0] and "(commit " in out[0]
    assert out[1].endswith(".scale_rows") and out[2].endswith(".scale_rows")
    assert "shape" not in "".join(out)  # level 1 shows no arguments


def test_banner_has_package_version_and_short_commit(logging_knobs, capsys, monkeypatch):
    import flashinfer

    monkeypatch.setattr(flashinfer, "__version__", "1.2.3", raising=False)
    monkeypatch.setattr(flashinfer, "__git_commit__", "0123456789abcdef", raising=False)
    _decorated(1)(torch.ones(1))
    assert "FlashInfer 1.2.3 (commit 01234567)" in capsys.readouterr().out


def test_level_3_logs_inputs_and_outputs(logging_knobs, capsys):
    op = _decorated(3)
    x = torch.zeros(4, 6, dtype=torch.float16)[:, :3]  # strided rows
    op(x, 0.5, out=None)
    out = capsys.readouterr().out
    assert "scale_rows inputs:" in out
    assert "x: Tensor(shape=(4, 3), dtype=float16, device=cpu, stride=(6, 1))" in out
    assert "factor: 0.5" in out and "out: None" in out
    assert "scale_rows output: Tensor(shape=(4, 3), dtype=float16" in out
    assert "min=" not in out  # statistics only at level 5


def test_level_3_formats_containers_objects_and_long_reprs(logging_knobs, capsys):
    class Plan:  # default repr: only the type is useful
        pass

    logging_knobs.level = 3

    @flashinfer_api
    def op(items, plan, text, mapping):
        return (torch.ones(2), 7)

    op(list(range(20)), Plan(), "y" * 1000, {"a": torch.ones(1)})
    out = capsys.readouterr().out
    assert "items: [0, 1, 2, 3, 4, 5, 6, 7, ... (20 items)]" in out
    assert "plan: <Plan>" in out
    assert max(len(line) for line in out.splitlines()) < 400
    assert "mapping: {'a': Tensor(shape=(1,)" in out
    assert "op outputs:" in out and "[0]: Tensor(shape=(2,)" in out and "[1]: 7" in out


def test_methods_are_logged_with_their_class(logging_knobs, capsys):
    logging_knobs.level = 3

    class Wrapper:
        @flashinfer_api
        def run(self, q):
            return q

    Wrapper().run(torch.ones(1))
    out = capsys.readouterr().out
    assert "Wrapper.run inputs:" in out and "self: <" in out


def test_level_5_logs_statistics(logging_knobs, capsys):
    op = _decorated(5)
    op(torch.tensor([1.0, -3.0, float("nan"), float("inf"), 6.0]), 1.0)
    out = capsys.readouterr().out
    # statistics of the finite values, plus the non-finite counts
    assert "[min=-3 max=6 mean=1.33333 nan=1 inf=1]" in out


@pytest.mark.parametrize(
    "tensor, expected",
    [
        (torch.zeros(0), "[stats: empty]"),
        (torch.tensor([True, False, True]), "[min=0 max=1 mean=0.666667 nan=0 inf=0]"),
        (torch.arange(4, dtype=torch.int32), "[min=0 max=3 mean=1.5 nan=0 inf=0]"),
        (torch.full((2,), float("nan")), "[no finite values, nan=2 inf=0]"),
        (torch.tensor([1.0, 2.0], dtype=torch.bfloat16), "[min=1 max=2 mean=1.5 nan=0 inf=0]"),
    ],
)
def test_statistics_of_awkward_tensors(tensor, expected):
    assert api_logging._tensor_stats(tensor) == expected


def test_level_5_skips_statistics_during_graph_capture(logging_knobs, capsys, monkeypatch):
    monkeypatch.setattr(api_logging, "_capturing", lambda: True)
    _decorated(5)(torch.ones(3))
    out = capsys.readouterr().out
    assert "[stats skipped: graph capture]" in out and "min=" not in out


def test_level_is_read_at_decoration(logging_knobs, capsys):
    op = _decorated(1)
    logging_knobs.level = 0  # too late for op
    op(torch.ones(1))
    assert "scale_rows" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Crashes and logging failures


def test_a_crash_still_shows_the_inputs(logging_knobs, capsys):
    def boom():
        raise RuntimeError("illegal memory access")

    op = _decorated(3, body=boom)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        op(torch.ones(5, 7))
    out = capsys.readouterr().out
    inputs = out.index("x: Tensor(shape=(5, 7)")
    raised = out.index("scale_rows raised RuntimeError: illegal memory access")
    assert inputs < raised
    assert "output" not in out


def test_logging_never_raises(logging_knobs, capsys):
    class Hostile:
        def __repr__(self):
            raise RuntimeError("no repr for you")

    logging_knobs.level = 3

    @flashinfer_api
    def op(x, thing):
        return thing

    assert isinstance(op(torch.ones(1), Hostile()), Hostile)
    out = capsys.readouterr().out
    assert "thing: <unprintable Hostile: RuntimeError>" in out
    assert "op output: <unprintable Hostile: RuntimeError>" in out


def test_arguments_that_do_not_bind_are_logged_positionally(logging_knobs, capsys):
    op = _decorated(3)
    with pytest.raises(TypeError):
        op(torch.ones(1), 1.0, 2.0, 3.0)
    out = capsys.readouterr().out
    assert "arg[0]: Tensor(shape=(1,)" in out and "arg[3]: 3.0" in out
    assert "scale_rows raised TypeError" in out


# ---------------------------------------------------------------------------------------------
# Destinations


def test_dest_stderr(logging_knobs, capsys):
    logging_knobs.dest = "stderr"
    _decorated(1)(torch.ones(1))
    captured = capsys.readouterr()
    assert captured.out == "" and "scale_rows" in captured.err


def test_dest_file_with_pid_appends(logging_knobs, tmp_path, capsys):
    logging_knobs.dest = str(tmp_path / "logs" / "fi_%i.log")  # missing directory is created
    op = _decorated(3)
    op(torch.ones(2))
    api_logging._reset_sink()  # a new sink appends to the same file
    op(torch.ones(3))
    path = tmp_path / "logs" / f"fi_{os.getpid()}.log"
    text = path.read_text()
    assert text.count("scale_rows inputs:") == 2 and "shape=(3,)" in text
    assert capsys.readouterr().out == ""


def test_forked_process_opens_its_own_file(logging_knobs, tmp_path, monkeypatch):
    logging_knobs.dest = str(tmp_path / "fi_%i.log")
    op = _decorated(1)
    op(torch.ones(1))
    real_pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: 999999)  # what a forked child sees
    op(torch.ones(1))
    child = (tmp_path / "fi_999999.log").read_text()
    assert "FlashInfer " in child and "scale_rows" in child and "pid=999999" in child
    assert (tmp_path / f"fi_{real_pid}.log").read_text().count("scale_rows") == 1


def test_unwritable_dest_falls_back_to_stderr(logging_knobs, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    logging_knobs.dest = str(blocker / "sub" / "log.txt")  # a file where a directory must be
    _decorated(1)(torch.ones(1))
    err = capsys.readouterr().err
    assert "cannot open log file" in err and "scale_rows" in err


def test_environment_variables_in_a_fresh_process(tmp_path, monkeypatch):
    """The real path: env vars set before import, file per pid, crash with inputs logged."""
    script = textwrap.dedent(
        """
        import os, torch
        from flashinfer.api_logging import flashinfer_api

        @flashinfer_api
        def rmsnorm(input, weight, eps=1e-6):
            raise ValueError("weight must be 1-D")

        print(os.getpid())
        try:
            rmsnorm(torch.ones(8, 16, dtype=torch.bfloat16), torch.ones(4, 4))
        except ValueError:
            pass
        """
    )
    monkeypatch.setenv("PYTHONPATH", str(PACKAGE_ROOT))
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", "3")
    monkeypatch.setenv("FLASHINFER_LOGDEST", str(tmp_path / "api_%i.log"))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    pid = proc.stdout.strip()
    log = (tmp_path / f"api_{pid}.log").read_text()
    assert "FlashInfer " in log.splitlines()[0]
    assert "input: Tensor(shape=(8, 16), dtype=bfloat16" in log
    assert "weight: Tensor(shape=(4, 4)" in log
    assert "rmsnorm raised ValueError: weight must be 1-D" in log


# ---------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
def test_cuda_tensors_and_graph_capture(logging_knobs, capsys):
    op = _decorated(5)
    x = torch.ones(4, 4, device="cuda")
    op(x)
    out = capsys.readouterr().out
    assert "device=cuda:0" in out and "[min=1 max=1 mean=1 nan=0 inf=0]" in out
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = op(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, x * 2)
    assert "[stats skipped: graph capture]" in capsys.readouterr().out

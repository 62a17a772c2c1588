"""CUPTI timing on CPU, with a fake ``cupti`` module (cupti-python's ``from cupti import cupti``
API: activity kinds, buffer callbacks, external correlation ids): the busy-time arithmetic from
synthetic activity records, the fallback and its message, and the benchmark CLI's choice of timer.
The real CUPTI runs on the GPU (benchmarks/testlists/cupti_check.txt, docs/benchmarking.md)."""

import enum
import shlex
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from flashinfer import testing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import flashinfer_benchmark as fb  # noqa: E402


class ActivityKind(enum.IntEnum):  # values as in CUPTI's CUpti_ActivityKind
    MEMCPY = 1
    MEMSET = 2
    DRIVER = 4
    RUNTIME = 5
    CONCURRENT_KERNEL = 10
    EXTERNAL_CORRELATION = 39


class ExternalCorrelationKind(enum.IntEnum):
    OPENACC = 1
    CUSTOM0 = 3


def fake_cupti(fail_on=None):
    """A ``cupti`` package whose ``cupti.cupti`` records what was enabled and turns ``launch``
    calls into kernel and external-correlation records, delivered on ``activity_flush_all``."""
    m = types.ModuleType("cupti.cupti")
    m.ActivityKind, m.ExternalCorrelationKind = ActivityKind, ExternalCorrelationKind
    st = types.SimpleNamespace(enabled=set(), ever=set(), stack=[], pending=[], clock=1000,
                               corr=0, callbacks=None, flushes=0)
    m.state = st

    def check(name):
        if fail_on == name:
            raise RuntimeError(f"function cupti{name} is not found")

    def register(requested, completed):
        check("ActivityRegisterCallbacks")
        assert requested() == (8 << 20, 0)
        st.callbacks = completed

    def enable(kind):
        check("ActivityEnable")
        st.enabled.add(ActivityKind(kind))
        st.ever.add(ActivityKind(kind))

    def push(kind, ext):
        st.stack.append((int(kind), ext))

    def pop(kind):
        return st.stack.pop()[1]

    def flush(flag):
        st.flushes += 1
        records, st.pending = st.pending, []
        st.callbacks(records)

    def launch(*durations, gap=5, kind=ActivityKind.CONCURRENT_KERNEL, start=None):
        """One API call per kernel; ``start``: overlap the kernel with the previous one."""
        for d in durations:
            st.corr += 1
            if st.stack and ActivityKind.EXTERNAL_CORRELATION in st.enabled:
                ext_kind, ext = st.stack[-1]
                st.pending.append(types.SimpleNamespace(
                    kind=ActivityKind.EXTERNAL_CORRELATION, external_kind=ext_kind,
                    external_id=ext, correlation_id=st.corr))
            begin = st.clock + gap if start is None else start
            if kind in st.enabled:
                st.pending.append(types.SimpleNamespace(kind=kind, start=begin, end=begin + d,
                                                        correlation_id=st.corr))
            st.clock = max(st.clock, begin + d)

    m.activity_register_callbacks, m.activity_enable = register, enable
    m.activity_disable = lambda kind: st.enabled.discard(ActivityKind(kind))
    m.activity_push_external_correlation_id = push
    m.activity_pop_external_correlation_id = pop
    m.activity_flush_all, m.launch = flush, launch
    package = types.ModuleType("cupti")
    package.cupti = m
    return package, m


@pytest.fixture
def fresh(monkeypatch):
    """No CUPTI registration, probe or timer choice carried between tests; no CUDA calls."""
    monkeypatch.setattr(testing, "_CUPTI", {})
    monkeypatch.setattr(testing, "_CUPTI_PROBE", {})
    monkeypatch.setattr(fb, "_TIMER", {})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(testing, "_installed_cupti_versions", lambda: ("13.4.0", "13.0.88"))


def install(monkeypatch, package):
    monkeypatch.setitem(sys.modules, "cupti", package)
    monkeypatch.setitem(sys.modules, "cupti.cupti", package.cupti)


# ---- arithmetic ------------------------------------------------------------------------------


def test_busy_time_is_the_union_of_intervals():
    assert testing.busy_ns([]) == 0
    assert testing.busy_ns([(10, 30)]) == 20
    assert testing.busy_ns([(50, 60), (10, 30)]) == 30  # a gap is not busy; order is free
    assert testing.busy_ns([(10, 30), (20, 40)]) == 30  # overlap (PDL) counted once
    assert testing.busy_ns([(10, 100), (20, 30), (40, 50)]) == 90  # nested
    assert testing.busy_ns([(10, 20), (20, 30)]) == 20  # touching


def test_iteration_times_from_synthetic_records():
    records = [(100, 150, 1), (160, 200, 2),  # iteration 7: 50 + 40 ns
               (300, 310, 3),                 # the L2 flush: no external id
               (400, 500, 4), (450, 520, 5),  # iteration 8: overlapping, 120 ns
               (600, 700, 6)]                 # another caller's id (9)
    external = {1: 7, 2: 7, 4: 8, 5: 8, 6: 9}
    assert testing.cupti_iteration_times_ms(records, external, [7, 8]) == [90e-6, 120e-6]


def test_an_iteration_without_records_or_a_bad_record_is_refused():
    with pytest.raises(testing.CuptiUnavailable, match="no CUPTI kernel records for 1 of 2"):
        testing.cupti_iteration_times_ms([(100, 150, 1)], {1: 7}, [7, 8])
    with pytest.raises(testing.CuptiUnavailable, match="0 external correlations"):
        testing.cupti_iteration_times_ms([(100, 150, 1)], {}, [7])
    with pytest.raises(testing.CuptiUnavailable, match="layout does not match"):
        testing.cupti_iteration_times_ms([(0, 150, 1)], {1: 7}, [7])
    with pytest.raises(testing.CuptiUnavailable, match="layout does not match"):
        testing.cupti_iteration_times_ms([(200, 150, 1)], {1: 7}, [7])


def test_version_note_names_both_versions_and_the_fix():
    note = testing.cupti_version_note("13.4.0", "13.0.88")
    assert "cupti-python 13.4.0" in note and "nvidia-cuda-cupti 13.0.88" in note
    assert "nvidia-cuda-cupti~=13.4" in note and "cupti-python==13.0.*" in note
    assert testing.cupti_version_note("13.0.1", "13.0.88") == ""
    assert testing.cupti_version_note("13.4.0", "13.5.1") == ""  # a newer libcupti is fine
    assert testing.cupti_version_note("13.10.0", "13.9.0") != ""  # tuples, not strings
    assert "not installed" in testing.cupti_version_note("13.4.0", None)
    assert testing.cupti_version_note(None, "13.0.88") == ""


# ---- the timer with a fake cupti -------------------------------------------------------------


def test_kernel_times_from_a_fake_cupti(fresh, monkeypatch):
    package, m = fake_cupti()
    install(monkeypatch, package)

    def op():  # two serial kernels (300 + 200 ns), a memset overlapping the second (counted once)
        m.launch(300, 200)
        m.launch(50, kind=ActivityKind.MEMSET, start=m.state.clock - 100)

    flushes = []
    times = testing.cupti_kernel_times_ms(op, dry_run_iters=2, repeat_iters=4, cold_l2_cache=False)
    assert times == pytest.approx([500e-6] * 4)
    assert m.state.enabled == set() and not m.state.stack  # everything turned off again
    assert {ActivityKind.CONCURRENT_KERNEL, ActivityKind.MEMCPY, ActivityKind.MEMSET,
            ActivityKind.EXTERNAL_CORRELATION} <= m.state.ever
    # A flush launched outside the correlation range (as the L2 flush is) is not counted, and a
    # second call keeps its own ids.
    monkeypatch.setattr(testing, "_l2_flusher", lambda device, mode: lambda: flushes.append(
        m.launch(10_000)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    times = testing.cupti_kernel_times_ms(lambda: m.launch(700), dry_run_iters=0, repeat_iters=3)
    assert times == pytest.approx([700e-6] * 3) and len(flushes) == 3


def test_not_installed_gives_one_clean_reason(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupti", None)  # import cupti -> ModuleNotFoundError
    with pytest.raises(testing.CuptiUnavailable, match=r"^cupti-python is not installed"):
        testing.cupti_kernel_times_ms(lambda: None, dry_run_iters=0, repeat_iters=1,
                                      cold_l2_cache=False)


def test_a_cupti_that_fails_to_load_or_initialise_names_the_version_mismatch(fresh, monkeypatch):
    def load(name):  # `from cupti import cupti` fails inside the package, as a dlopen would
        raise OSError("libcupti.so.13: cannot open shared object file")

    broken = types.ModuleType("cupti")
    broken.__getattr__ = load
    monkeypatch.setitem(sys.modules, "cupti", broken)
    with pytest.raises(testing.CuptiUnavailable) as e:
        testing.cupti_kernel_times_ms(lambda: None, repeat_iters=1, cold_l2_cache=False)
    assert "failed to load: OSError: libcupti.so.13" in str(e.value)
    assert "nvidia-cuda-cupti 13.0.88" in str(e.value)
    def no_elftools(name):  # cupti-python 13.4 imports pyelftools when it loads
        raise ModuleNotFoundError("No module named 'elftools'", name="elftools")

    broken.__getattr__ = no_elftools
    with pytest.raises(testing.CuptiUnavailable, match="its dependency elftools is missing"):
        testing.cupti_kernel_times_ms(lambda: None, repeat_iters=1, cold_l2_cache=False)
    for where in ("ActivityRegisterCallbacks", "ActivityEnable"):
        testing._CUPTI.clear()
        install(monkeypatch, fake_cupti(fail_on=where)[0])
        with pytest.raises(testing.CuptiUnavailable, match="is not found .*cupti-python 13.4.0"):
            testing.cupti_kernel_times_ms(lambda: None, repeat_iters=1, cold_l2_cache=False)


def test_the_public_timer_falls_back_to_events_with_one_warning(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupti", None)
    monkeypatch.setattr(testing, "bench_gpu_time_with_cuda_event", lambda fn, *a: [0.5, 0.25])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert testing.bench_gpu_time(lambda: None, enable_cupti=True) == [0.5, 0.25]
    (w,) = caught
    assert "CUPTI timing is not available (cupti-python is not installed" in str(w.message)


def test_the_probe_reason_is_cached_and_carries_the_note(fresh, monkeypatch):
    calls = []

    def fails(*a, **k):
        calls.append(1)
        raise testing.CuptiUnavailable("CUPTI failed to enable activity records: X")

    monkeypatch.setattr(testing, "cupti_kernel_times_ms", fails)
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros(4))
    reason = testing.cupti_unavailable_reason()
    assert reason.startswith("CUPTI failed to enable") and "nvidia-cuda-cupti 13.0.88" in reason
    assert testing.cupti_unavailable_reason() == reason and len(calls) == 1


# ---- the benchmark CLI's choice --------------------------------------------------------------


def _args(extra=""):
    return fb.parse_case(shlex.split(f"--routine rmsnorm {extra}"))


def test_cli_selection(fresh, monkeypatch, capsys):
    monkeypatch.setattr(testing, "cupti_unavailable_reason", lambda: pytest.fail("probed"))
    assert fb._use_cupti(_args("--use_cuda_events")) is False  # forced: no probe, no message
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(testing, "cupti_unavailable_reason", lambda: None)
    assert fb._use_cupti(_args()) is True and fb._use_cupti(_args("--use_cupti")) is True
    assert capsys.readouterr().out.count("[INFO] timing with CUPTI") == 1
    with pytest.raises(SystemExit):  # one timer or the other
        _args("--use_cupti --use_cuda_events")


def test_cli_fallback_message_once_and_use_cupti_stops(fresh, monkeypatch, capsys):
    monkeypatch.setattr(testing, "cupti_unavailable_reason", lambda: "cupti-python is not "
                        "installed (pip install cupti-python)")
    assert fb._use_cupti(_args()) is False and fb._use_cupti(_args()) is False
    out = capsys.readouterr().out
    assert out.count("[INFO] CUPTI timing is not used: cupti-python is not installed") == 1
    assert "CUDA events around CUDA-graph replays" in out
    with pytest.raises(fb.CuptiRequired, match="--use_cupti: CUPTI timing cannot run here"):
        fb._use_cupti(_args("--use_cupti"))


def test_cli_row_names_its_timer_and_a_failed_call_falls_back(fresh, monkeypatch, capsys):
    import harness

    def time_ms(fn, *, use_cuda_graph, use_cupti=False, **kw):
        if use_cupti:
            raise testing.CuptiUnavailable("no CUPTI kernel records for 3 of 3 iterations")
        return [0.25, 0.5] if use_cuda_graph else [1.0]

    monkeypatch.setattr(harness, "time_ms", time_ms)
    times, how = fb._time(_args(), lambda: None, cupti=True)
    assert times == [0.25, 0.5] and how.startswith("cuda graph replay (CUPTI failed: no CUPTI")
    assert "[WARNING] CUPTI failed for this call" in capsys.readouterr().out
    with pytest.raises(fb.CuptiRequired):
        fb._time(_args("--use_cupti"), lambda: None, cupti=True)
    monkeypatch.setattr(harness, "time_ms", lambda fn, **kw: [0.125])
    assert fb._time(_args(), lambda: None, cupti=True) == (
        [0.125], "cupti (kernel busy time per call, cold L2)")


def test_csv_appends_the_timer_column():
    assert fb.CSV_COLUMNS[-1] == "timer" and fb.CSV_COLUMNS[-2] == "repro_command"
    assert fb._row(_args(), "cuda")["timer"] == ""  # an untimed row names no timer
    doc = (ROOT / "docs" / "benchmarking.md").read_text()
    listed = doc.split("The CSV has fixed columns: `", 1)[1].split("`", 1)[0]
    assert [c.strip() for c in listed.split(",")] == fb.CSV_COLUMNS


@pytest.mark.gpu
def test_cupti_agrees_with_events_on_a_long_copy():
    """The real thing, where cupti-python is installed and works (else skipped with the reason)."""
    import statistics

    reason = testing.cupti_unavailable_reason()
    if reason is not None:
        pytest.skip(f"CUPTI timing cannot run here: {reason}")
    x = torch.rand(1 << 26, device="cuda")  # 256 MiB read + 256 MiB written: ~0.2 ms
    y = torch.empty_like(x)
    kernel = statistics.median(testing.cupti_kernel_times_ms(lambda: y.copy_(x), 3, 20))
    events = statistics.median(testing.bench_gpu_time_with_cudagraph(
        lambda: y.copy_(x), 3, 20, num_iters_within_graph=1))
    assert abs(kernel / events - 1) < 0.1, (kernel, events)

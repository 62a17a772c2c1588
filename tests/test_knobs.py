import re
from pathlib import Path

import pytest

import flashinfer
from flashinfer import knobs
from flashinfer.exceptions import KnobError


def test_read_on_access(monkeypatch):
    monkeypatch.delenv("FLASHINFER_NVCC_THREADS", raising=False)
    assert knobs.jit.nvcc_threads == 1
    monkeypatch.setenv("FLASHINFER_NVCC_THREADS", "4")
    assert knobs.jit.nvcc_threads == 4


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("ON", True),
                                             ("0", False), ("no", False), ("", False)])
def test_bool(monkeypatch, value, expected):
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", value)
    assert knobs.jit.disable_jit is expected


@pytest.mark.parametrize("name, attr, bad", [
    ("FLASHINFER_DISABLE_JIT", "disable_jit", "maybe"),
    ("MAX_JOBS", "max_jobs", "four"),
    ("MAX_JOBS", "max_jobs", "0"),
    ("FLASHINFER_NVCC_THREADS", "nvcc_threads", "-1"),
    ("FLASHINFER_EXTRA_CUDAFLAGS", "extra_cudaflags", "-DX='unterminated"),
])
def test_bad_values_name_the_variable(monkeypatch, name, attr, bad):
    monkeypatch.setenv(name, bad)
    with pytest.raises(KnobError, match=name) as info:
        getattr(knobs.jit, attr)
    assert isinstance(info.value, ValueError) and info.value.value == bad


def test_override_and_scope(monkeypatch):
    monkeypatch.setenv("MAX_JOBS", "3")
    with knobs.jit.scope():
        knobs.jit.max_jobs = 7
        assert knobs.jit.max_jobs == 7
        del knobs.jit.max_jobs
        assert knobs.jit.max_jobs == 3
        knobs.jit.max_jobs = 9
    assert knobs.jit.max_jobs == 3


def test_aliases_and_flags(monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("CUDA_PATH", "/opt/cuda")
    assert knobs.jit.cuda_home == "/opt/cuda"
    monkeypatch.setenv("CUDA_HOME", "/usr/cuda")
    assert knobs.jit.cuda_home == "/usr/cuda"
    monkeypatch.setenv("FLASHINFER_EXTRA_CUDAFLAGS", "-DA=1 '-DB=two words'")
    assert knobs.jit.extra_cudaflags == ("-DA=1", "-DB=two words")


def test_workspace_default_and_paths(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    assert knobs.cache.workspace_base == tmp_path
    monkeypatch.delenv("FLASHINFER_CUBIN_DIR", raising=False)
    assert knobs.artifacts.cubin_dir == tmp_path / ".cache" / "flashinfer" / "cubins"


def test_every_variable_of_the_contract_is_declared():
    declared = set(knobs.all_env_vars())
    for name in ["FLASHINFER_WORKSPACE_BASE", "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_NVCC",
                 "FLASHINFER_NVCC_LAUNCHER", "FLASHINFER_EXTRA_CUDAFLAGS", "FLASHINFER_EXTRA_CFLAGS",
                 "FLASHINFER_EXTRA_LDFLAGS", "FLASHINFER_JIT_VERBOSE", "FLASHINFER_JIT_DEBUG",
                 "FLASHINFER_JIT_LINEINFO", "FLASHINFER_NVCC_THREADS", "MAX_JOBS",
                 "FLASHINFER_DISABLE_JIT", "FLASHINFER_LOGLEVEL", "FLASHINFER_LOGDEST",
                 "CUDA_HOME", "CUDA_PATH", "CXX"]:
        assert name in declared


def test_no_environment_reads_outside_knobs():
    """STYLE: one knobs module; nothing else reads os.environ / os.getenv."""
    root = Path(flashinfer.__file__).parent
    pattern = re.compile(r"os\.environ|os\.getenv|getenv\(")
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "knobs.py" and pattern.search(p.read_text())
    ]
    assert offenders == []

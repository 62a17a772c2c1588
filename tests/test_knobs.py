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


# -- hardening: every number a knob takes is finite and in range, every error names the knob --

_NUMERIC = [
    ("artifacts", "download_timeout", "FLASHINFER_DOWNLOAD_TIMEOUT"),
    ("artifacts", "download_backoff", "FLASHINFER_DOWNLOAD_BACKOFF"),
    ("artifacts", "download_deadline", "FLASHINFER_DOWNLOAD_DEADLINE"),
    ("artifacts", "download_retries", "FLASHINFER_DOWNLOAD_RETRIES"),
    ("jit", "nvcc_threads", "FLASHINFER_NVCC_THREADS"),
    ("jit", "max_jobs", "MAX_JOBS"),
    ("logging", "level", "FLASHINFER_LOGLEVEL"),
    ("dump", "max_size_gb", "FLASHINFER_DUMP_MAX_SIZE_GB"),
    ("dump", "max_count", "FLASHINFER_DUMP_MAX_COUNT"),
]


def test_every_numeric_knob_is_covered():
    numeric = {k.names[0] for g in knobs.GROUPS.values() for k in g.knobs().values()
               if getattr(k, "kind", None) in ("int", "float")}
    assert numeric == {name for _, _, name in _NUMERIC}


@pytest.mark.parametrize("group, attr, name", _NUMERIC, ids=[n for _, _, n in _NUMERIC])
@pytest.mark.parametrize("bad", ["inf", "-inf", "1e309", "nan", "-1", "1e300", "12abc",
                                 "99999999999999999999999"])
def test_numeric_knobs_refuse_what_they_cannot_use(monkeypatch, group, attr, name, bad):
    """inf, 1e309, 1e300 (a timeout that overflows time_t), nan, negatives, garbage: a ValueError
    that names the variable, the expected range and the value received, never an OverflowError
    later on."""
    monkeypatch.setenv(name, bad)
    with pytest.raises(KnobError) as info:
        getattr(knobs.GROUPS[group], attr)
    msg = str(info.value)
    assert name in msg and repr(bad) in msg and "must be" in msg
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name, attr, good, expected", [
    ("FLASHINFER_DOWNLOAD_TIMEOUT", "download_timeout", "2.5", 2.5),
    ("FLASHINFER_DOWNLOAD_TIMEOUT", "download_timeout", "604800", 604800.0),
    ("FLASHINFER_DOWNLOAD_DEADLINE", "download_deadline", "600", 600.0),
    ("FLASHINFER_DOWNLOAD_RETRIES", "download_retries", "1", 1),
])
def test_numeric_knobs_in_range(monkeypatch, name, attr, good, expected):
    monkeypatch.setenv(name, good)
    assert getattr(knobs.artifacts, attr) == expected


def test_loglevel_zero_is_valid(monkeypatch):
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", "0")
    assert knobs.logging.level == 0


@pytest.mark.parametrize("value, why", [
    ("ftp://mirror.example/fi", "unknown scheme 'ftp'"),
    ("s3://", "bucket"),
    ("s3:///prefix", "bucket"),
    ("data:text/plain;base64,AAAA", "unknown scheme 'data'"),
    ("https://", "host"),
    ("http:///path", "host"),
    ("https://a.example,,https://b.example", "empty entry"),
    (",", "empty entry"),
    ("https://a.example,", "empty entry"),
])
def test_bad_repository_lists_name_the_variable(monkeypatch, value, why):
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", value)
    with pytest.raises(KnobError) as info:
        knobs.artifacts.repository  # noqa: B018
    msg = str(info.value)
    assert "FLASHINFER_CUBINS_REPOSITORY" in msg and why in msg and repr(value) in msg


@pytest.mark.parametrize("value", [
    "https://a.example/fi s3://bucket/prefix", "/srv/mirror,file:///srv/other", "~/mirror",
    "http://127.0.0.1:8080", "s3://bucket",
])
def test_good_repository_lists(monkeypatch, value):
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", value)
    assert knobs.artifacts.repository == value


@pytest.mark.parametrize("value", ["abc", "ab" * 31, "ab" * 33, "zz" * 32, "ab" * 31 + " x"])
def test_a_malformed_manifest_sha256_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("FLASHINFER_CUBIN_MANIFEST_SHA256", value)
    with pytest.raises(KnobError) as info:
        knobs.artifacts.manifest_sha256  # noqa: B018
    assert "FLASHINFER_CUBIN_MANIFEST_SHA256" in str(info.value) and "64 hex" in str(info.value)


def test_a_manifest_sha256_is_read_in_lowercase(monkeypatch):
    monkeypatch.setenv("FLASHINFER_CUBIN_MANIFEST_SHA256", "AB" * 32)
    assert knobs.artifacts.manifest_sha256 == "ab" * 32


def test_an_unusable_workspace_names_the_variable(monkeypatch, tmp_path):
    """FLASHINFER_WORKSPACE_BASE pointing at a file: a JitError naming the variable, not a
    NotADirectoryError from deep inside the build."""
    from flashinfer.exceptions import JitError
    from flashinfer.jit import core
    from flashinfer.jit.scale import gen_scale_module

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(not_a_dir))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.delenv("FLASHINFER_DISABLE_JIT", raising=False)
    monkeypatch.setattr(core, "_aot_module", lambda spec, archs: None)
    core._loaded.clear()
    with pytest.raises(JitError, match="FLASHINFER_WORKSPACE_BASE") as info:
        core.get_module(gen_scale_module())
    assert str(not_a_dir) in str(info.value)

"""The `flashinfer` CLI, driven through click's CliRunner (no GPU, no compilation)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import flashinfer.__main__ as cli_module
from flashinfer import aot
from flashinfer.__main__ import cli
from flashinfer.exceptions import NoSupportedArchError
from flashinfer.jit import core

PACKAGE_ROOT = Path(cli_module.__file__).resolve().parents[1]
HEADERS = [
    "=== Version Info ===",
    "=== Torch Version Info ===",
    "=== Environment Variables ===",
    "=== JIT ===",
    "=== Artifact Path ===",
    "=== Downloaded Cubins ===",
    "=== Module Status ===",
]
MODULES = [
    {"name": "norm", "uri": "norm_abc", "status": "aot", "path": "/wheel/norm.so"},
    {"name": "rope", "uri": "rope_def", "status": "compiled", "path": "/cache/rope.so"},
    {"name": "activation", "uri": "activation_123", "status": "not-compiled", "path": None},
    {"name": "broken", "uri": None, "status": "not-compiled", "path": None, "error": "no archs"},
]


def run(*args: str):
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """An isolated cache: FLASHINFER_WORKSPACE_BASE=tmp_path, no cubin dir override."""
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    monkeypatch.delenv("FLASHINFER_CUBIN_DIR", raising=False)
    return tmp_path


@pytest.fixture
def fake_jit(monkeypatch):
    """Deterministic JIT answers (the real ones depend on the machine)."""
    monkeypatch.setattr(core, "resolve_archs", lambda: ["9.0a", "10.0a"])
    monkeypatch.setattr(core, "find_nvcc", lambda: Path("/opt/cuda/bin/nvcc"))
    monkeypatch.setattr(core, "nvcc_version", lambda: "13.0")
    monkeypatch.setattr(aot, "module_status", lambda: [dict(m) for m in MODULES])


# ---------------------------------------------------------------------------------------------
# help


@pytest.mark.parametrize("args", [[], ["--help"], ["-h"]])
def test_no_subcommand_prints_help(args):
    result = run(*args)
    assert result.exit_code == 0
    assert "FlashInfer CLI" in result.output
    for command in ("show-config", "clear-cache", "module-status"):
        assert command in result.output


def test_python_dash_m_runs_the_group(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(PACKAGE_ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "flashinfer", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Usage: flashinfer" in proc.stdout and "FlashInfer CLI" in proc.stdout


# ---------------------------------------------------------------------------------------------
# show-config


def test_show_config_prints_every_section_in_order(workspace, fake_jit):
    result = run("show-config")
    assert result.exit_code == 0
    positions = [result.output.index(h) for h in HEADERS]
    assert positions == sorted(positions)
    assert "error:" not in result.output


def test_show_config_on_this_machine_never_crashes(workspace):
    # Real JIT answers: no GPU here, nvcc may or may not be installed.
    result = run("show-config")
    assert result.exit_code == 0
    for header in HEADERS:
        assert header in result.output


def test_show_config_versions(workspace, fake_jit):
    out = run("show-config").output
    for dist in ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"):
        assert f"\n{dist}: " in out
    assert "imported flashinfer: " in out and str(PACKAGE_ROOT / "flashinfer") in out


def test_show_config_torch_section(workspace, fake_jit):
    import torch

    out = run("show-config").output
    assert f"torch: {torch.__version__}" in out
    if not torch.cuda.is_available():
        assert "GPUs: no CUDA device" in out


def test_show_config_environment(workspace, fake_jit, monkeypatch):
    monkeypatch.setenv("FLASHINFER_NVCC_THREADS", "4")
    monkeypatch.delenv("FLASHINFER_LOGDEST", raising=False)
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", "https://bob:s3cret@mirror.example/fi")
    out = run("show-config").output
    env_section = out.split("=== Environment Variables ===")[1].split("=== JIT ===")[0]
    from flashinfer import knobs

    for name in knobs.all_env_vars():
        assert f"\n{name}=" in env_section
    assert "FLASHINFER_NVCC_THREADS=4" in env_section
    assert "FLASHINFER_LOGDEST=(unset)" in env_section
    assert f"FLASHINFER_WORKSPACE_BASE={workspace}" in env_section
    assert "s3cret" not in out and "https://bob:***@mirror.example/fi" in out


def test_show_config_jit_section(workspace, fake_jit):
    out = run("show-config").output
    assert "target archs: 9.0a 10.0a" in out
    assert "nvcc: /opt/cuda/bin/nvcc (version 13.0)" in out
    assert f"cache dir: {workspace / '.cache' / 'flashinfer'}" in out


def test_show_config_without_archs_or_nvcc(workspace, fake_jit, monkeypatch):
    def no_archs():
        raise NoSupportedArchError("no CUDA GPU is visible and FLASHINFER_CUDA_ARCH_LIST is unset")

    monkeypatch.setattr(core, "resolve_archs", no_archs)
    monkeypatch.setattr(core, "find_nvcc", lambda: None)
    out = run("show-config").output
    assert "target archs: none (no CUDA GPU is visible" in out
    assert "nvcc: not found" in out


def test_show_config_cubins_and_modules(workspace, fake_jit, monkeypatch):
    cubins = workspace / "store"
    (cubins / "sm90" / "deep").mkdir(parents=True)
    for name in ("a.cubin", "sm90/b.cubin", "sm90/deep/c.cubin", "sm90/readme.txt"):
        (cubins / name).write_text("")
    monkeypatch.setenv("FLASHINFER_CUBIN_DIR", str(cubins))
    out = run("show-config").output
    assert f"=== Artifact Path ===\n{cubins}\n" in out
    assert "=== Downloaded Cubins ===\n3\n" in out
    assert "=== Module Status ===\ntotal: 4, aot: 1, compiled: 1, not-compiled: 2\n" in out


def test_show_config_default_cubin_dir_missing(workspace, fake_jit):
    out = run("show-config").output
    assert f"=== Artifact Path ===\n{workspace / '.cache' / 'flashinfer' / 'cubins'}\n" in out
    assert "=== Downloaded Cubins ===\n0\n" in out


def test_each_section_reports_its_own_failure(workspace, monkeypatch):
    def broken():
        raise ImportError("flashinfer.jit.core is broken")

    monkeypatch.setattr(cli_module, "_jit_core", broken)
    monkeypatch.setattr(cli_module, "_aot", broken)  # the module registry's section
    monkeypatch.setenv("FLASHINFER_CUBIN_DIR", "")  # empty counts as unset
    result = run("show-config")
    assert result.exit_code == 0
    for header in HEADERS:
        assert header in result.output
    assert result.output.count("error: ImportError: flashinfer.jit.core is broken") == 2
    assert "=== Downloaded Cubins ===\n0\n" in result.output


# ---------------------------------------------------------------------------------------------
# clear-cache


def test_clear_cache_removes_builds_and_keeps_cubins(workspace):
    cache = workspace / ".cache" / "flashinfer"
    build = cache / "0.1.0" / "sm90a" / "cached_ops" / "norm_abc"
    build.mkdir(parents=True)
    (build / "norm.so").write_bytes(b"\x7fELF")
    (cache / "cubins").mkdir()
    (cache / "cubins" / "k.cubin").write_bytes(b"")
    result = run("clear-cache")
    assert result.exit_code == 0
    assert "Cache cleared successfully" in result.output and str(cache) in result.output
    assert not (cache / "0.1.0").exists()
    assert (cache / "cubins" / "k.cubin").exists()


def test_clear_cache_on_an_empty_workspace(workspace):
    result = run("clear-cache")
    assert result.exit_code == 0 and "Cache cleared successfully" in result.output


def test_clear_cache_failure_is_an_error_message(workspace, monkeypatch):
    def denied():
        raise PermissionError("read-only file system")

    monkeypatch.setattr(core, "clear_jit_cache", denied)
    result = run("clear-cache")
    assert result.exit_code == 1
    assert "could not clear the JIT cache: PermissionError: read-only file system" in result.output
    assert "Traceback" not in result.output


# ---------------------------------------------------------------------------------------------
# module-status


@pytest.mark.parametrize(
    "filter_, names",
    [
        ("all", {"norm", "rope", "activation", "broken"}),
        ("aot", {"norm"}),
        ("jit", {"rope", "activation", "broken"}),
        ("compiled", {"norm", "rope"}),
        ("not-compiled", {"activation", "broken"}),
    ],
)
def test_module_status_filters(fake_jit, filter_, names):
    result = run("module-status", "--filter", filter_)
    assert result.exit_code == 0
    listed = {line.split()[0] for line in result.output.splitlines()[:-2] if line.strip()}
    assert listed == names
    assert result.output.rstrip().endswith("total: 4, aot: 1, compiled: 1, not-compiled: 2")


def test_module_status_default_is_all_and_sorted(fake_jit):
    lines = run("module-status").output.splitlines()
    assert [line.split()[0] for line in lines[:4]] == ["activation", "broken", "norm", "rope"]
    assert lines[2].split() == ["norm", "aot"]


def test_module_status_detailed(fake_jit):
    out = run("module-status", "--detailed", "--filter", "not-compiled").output
    assert "activation  not-compiled\n    uri: activation_123\n    path: -" in out
    assert "    uri: -\n    path: -\n    error: no archs" in out
    assert "norm" not in out.split("total:")[0]


def test_module_status_nothing_matches(monkeypatch):
    monkeypatch.setattr(aot, "module_status", lambda: [])
    result = run("module-status", "--filter", "aot")
    assert result.exit_code == 0
    assert "No modules match --filter aot." in result.output
    assert "total: 0, aot: 0, compiled: 0, not-compiled: 0" in result.output


def test_module_status_rejects_unknown_filter(fake_jit):
    result = run("module-status", "--filter", "sometimes")
    assert result.exit_code == 2 and "Invalid value for '--filter'" in result.output


def test_module_status_failure_is_an_error_message(monkeypatch):
    def broken():
        raise RuntimeError("registry unavailable")

    monkeypatch.setattr(aot, "module_status", broken)
    result = run("module-status")
    assert result.exit_code == 1
    assert "could not list modules: RuntimeError: registry unavailable" in result.output

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
    table, tail = result.output.split("\ntotal: ")
    listed = {line.split()[0] for line in table.splitlines() if line.strip()}
    assert listed == names
    assert tail.startswith("4, aot: 1, compiled: 1, not-compiled: 2\n")


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


def test_module_status_says_why_modules_are_not_compiled(fake_jit):
    out = run("module-status").output
    tail = out.split("total: 4, aot: 1, compiled: 1, not-compiled: 2\n")[1]
    assert "1 not-compiled because: no archs" in tail
    assert "1 not-compiled: each is compiled on first use" in tail


@pytest.fixture
def no_gpu(monkeypatch):
    """No CUDA GPU visible and no FLASHINFER_CUDA_ARCH_LIST (whatever this machine has)."""
    from flashinfer.jit import archs

    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(archs, "detect_archs", lambda: [])


def test_module_status_without_gpu_or_arch_list_says_why(workspace, no_gpu, monkeypatch):
    from flashinfer.jit import jit_cache

    monkeypatch.setattr(jit_cache, "installed", lambda: None)
    result = run("module-status")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(line.split()[1] == "not-compiled" for line in lines[: lines.index("")])
    why = [line for line in lines if line.startswith("why every module is not-compiled: ")]
    assert len(why) == 1, result.output
    assert "FLASHINFER_CUDA_ARCH_LIST is unset" in why[0]
    assert why[0].endswith("flashinfer-jit-cache is not installed")
    assert "not-compiled because" not in result.output  # said once, not per module
    show = run("show-config").output.split("=== Module Status ===\n")[1]
    assert "why every module is not-compiled: " in show


def test_module_status_without_gpu_uses_the_jit_cache_wheels_archs(workspace, no_gpu,
                                                                  monkeypatch, tmp_path):
    from flashinfer import knobs
    from flashinfer.jit import jit_cache

    wheel = jit_cache.JitCacheWheel(tmp_path, {"version": "0.1.0", "arch_list": ["8.0", "9.0a"]},
                                    "", ())
    monkeypatch.setattr(jit_cache, "installed", lambda: wheel)
    seen = []

    def status():
        seen.append(knobs.jit.cuda_arch_list)
        return [dict(m) for m in MODULES[:3]]

    monkeypatch.setattr(aot, "module_status", status)
    monkeypatch.setattr(core, "find_nvcc", lambda: Path("/opt/cuda/bin/nvcc"))
    out = run("module-status").output
    assert seen == ["8.0 9.0a"]
    assert ("status for the archs of the installed flashinfer-jit-cache 0.1.0 (8.0 9.0a)"
            in out)
    assert "norm" in out and "aot" in out
    assert "1 not-compiled: each is compiled on first use" in out  # activation: not in the wheel
    assert knobs.jit.cuda_arch_list is None  # the override ended with the command


# ---------------------------------------------------------------------------------------------
# --version, collect-env, list-modules, export-compile-commands


def test_version_flag():
    import flashinfer

    result = run("--version")
    assert result.exit_code == 0
    assert result.output.startswith(f"flashinfer {flashinfer.__version__} (commit ")


def test_collect_env_text_and_json(workspace, fake_jit, monkeypatch):
    import json

    import torch

    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", "https://bob:s3cret@mirror.example/fi")
    text = run("collect-env")
    assert text.exit_code == 0
    for part in ("flashinfer:", "packages:", "system:", "torch:", "toolchain:", "environment:"):
        assert f"\n{part}\n" in "\n" + text.output, part
    assert f"\ntorch:\n  version: {torch.__version__}\n" in text.output
    result = run("collect-env", "--json")
    assert result.exit_code == 0
    report = json.loads(result.output)
    assert report["torch"]["version"] == torch.__version__
    assert report["toolchain"]["target_archs"] == ["9.0a", "10.0a"]
    assert report["toolchain"]["nvcc"] == "/opt/cuda/bin/nvcc"
    assert report["environment"]["FLASHINFER_CUBINS_REPOSITORY"] == (
        "https://bob:***@mirror.example/fi")
    assert "s3cret" not in text.output + result.output


def test_collect_env_reports_a_broken_part(workspace, monkeypatch):
    import json

    def broken():
        raise ImportError("flashinfer.jit.core is broken")

    monkeypatch.setattr(cli_module, "_jit_core", broken)
    report = json.loads(run("collect-env", "--json").output)
    assert report["toolchain"] == {"error": "ImportError: flashinfer.jit.core is broken"}
    assert report["flashinfer"]["path"] == str(PACKAGE_ROOT / "flashinfer")


def test_list_modules(fake_jit):
    from flashinfer import aot

    names = sorted(s.name for s in aot.registered_specs())
    result = run("list-modules")
    assert result.exit_code == 0
    assert [line.split()[0] for line in result.output.splitlines()[: len(names)]] == names
    assert f"{len(names)} modules;" in result.output
    one = run("list-modules", "norm")
    assert one.exit_code == 0
    assert "name: norm\nsources:\n" in one.output and "csrc/norm.cu" in one.output
    assert "status: aot\nuri: norm_abc\npath: /wheel/norm.so" in one.output
    bad = run("list-modules", "nrom")
    assert bad.exit_code == 1 and "no module named 'nrom'; did you mean: norm?" in bad.output


@pytest.fixture
def one_module(monkeypatch):
    """The registry reduced to the norm module (planning all of them takes seconds)."""
    from flashinfer.jit.norm import gen_norm_module

    monkeypatch.setattr(cli_module, "_registered_specs", lambda: [gen_norm_module()])


def test_export_compile_commands(workspace, one_module, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.chdir(tmp_path)
    result = run("export-compile-commands")
    assert result.exit_code == 0, result.output
    assert "wrote 1 compile commands (1 modules, archs 9.0a) to compile_commands.json" in (
        result.output)
    (entry,) = json.loads((tmp_path / "compile_commands.json").read_text())
    assert entry["file"].endswith("csrc/norm.cu")
    args = entry["arguments"]
    assert args[args.index("-c") + 1] == entry["file"] and "-o" in args
    assert any("sm_90a" in a for a in args) and any(a.startswith("-I") for a in args)
    for argv in (["export-compile-commands", "sub/a.json"],
                 ["export-compile-commands", "-o", "sub/a.json"],
                 ["export-compile-commands", "sub/a.json", "--output", "sub/a.json"]):
        (tmp_path / "sub" / "a.json").unlink(missing_ok=True)
        assert run(*argv).exit_code == 0 and (tmp_path / "sub" / "a.json").is_file(), argv
    both = run("export-compile-commands", "a.json", "-o", "b.json")
    assert both.exit_code == 2 and "give the output once" in both.output


def test_export_compile_commands_without_gpu(workspace, one_module, no_gpu, tmp_path):
    result = run("export-compile-commands", str(tmp_path / "cc.json"))
    assert result.exit_code == 0, result.output
    assert "flags for 9.0a; set FLASHINFER_CUDA_ARCH_LIST for others" in result.output


# ---------------------------------------------------------------------------------------------
# install-cubin-wheel, install-jit-cache-wheel (download-jit-cache), download-kernels


@pytest.fixture
def released(monkeypatch):
    """A released build 0.1.0 (local label as a CUDA build carries) on CUDA 13.0 torch."""
    import torch

    import flashinfer

    monkeypatch.setattr(flashinfer, "__version__", "0.1.0+cu130")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("FLASHINFER_WHEEL_INDEX_URL", raising=False)


INSTALLS = {
    "install-cubin-wheel": "flashinfer-cubin==0.1.0",
    "install-jit-cache-wheel": "flashinfer-jit-cache==0.1.0",
    "download-jit-cache": "flashinfer-jit-cache==0.1.0",
    "download-kernels": "flashinfer-cubin==0.1.0 flashinfer-jit-cache==0.1.0",
}


@pytest.mark.parametrize("command", list(INSTALLS))
def test_install_dry_run_prints_the_pip_command(released, command):
    result = run(command, "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.output == (f"{sys.executable} -m pip install --index-url "
                             f"https://flashinfer.ai/whl/cu130/ {INSTALLS[command]}\n")


def test_install_options(released, monkeypatch):
    out = run("install-jit-cache-wheel", "--dry-run", "--cuda-version", "12.8",
              "--flashinfer-version", "0.2.0").output
    assert out.endswith("--index-url https://flashinfer.ai/whl/cu120/ flashinfer-jit-cache==0.2.0\n")
    for spelling in ("cu130", "13", "13.0"):
        out = run("download-jit-cache", "--dry-run", "--cuda", spelling).output
        assert "/whl/cu130/" in out, spelling
    out = run("install-cubin-wheel", "--dry-run", "--index-url", "file:///srv/whl/").output
    assert "--index-url file:///srv/whl/ flashinfer-cubin==0.1.0" in out
    monkeypatch.setenv("FLASHINFER_WHEEL_INDEX_URL", "https://mirror.example/fi/cu{major}/")
    out = run("install-cubin-wheel", "--dry-run").output
    assert "--index-url https://mirror.example/fi/cu13/ " in out


def test_install_errors(released, monkeypatch):
    import torch

    r = run("install-cubin-wheel", "--nightly")
    assert r.exit_code == 2 and "--nightly: this project publishes no nightly" in r.output
    r = run("install-cubin-wheel", "--dry-run", "--cuda-version", "thirteen")
    assert r.exit_code == 2 and "--cuda-version" in r.output and "'thirteen'" in r.output
    r = run("install-cubin-wheel", "--dry-run", "--index-url", "/srv/whl", "--cuda-version", "13")
    assert r.exit_code == 2 and "no {major} placeholder" in r.output
    r = run("install-cubin-wheel", "--dry-run", "--flashinfer-version", "latest")
    assert r.exit_code == 2 and "--flashinfer-version" in r.output
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build of torch
    r = run("download-kernels", "--dry-run")
    assert r.exit_code == 1 and "no CUDA build" in r.output and "--cuda-version" in r.output
    assert run("download-kernels", "--dry-run", "--cuda-version", "13.0").exit_code == 0
    import flashinfer

    monkeypatch.setattr(flashinfer, "__version__", "0.0.0+unknown")
    r = run("install-cubin-wheel", "--dry-run", "--cuda-version", "13.0")
    assert r.exit_code == 2 and "pass --flashinfer-version X.Y.Z" in r.output


def test_install_runs_pip_and_passes_its_failure_on(released, monkeypatch):
    calls = []

    def fake_run(cmd, check):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 3 if len(calls) > 1 else 0)

    monkeypatch.setattr(cli_module.subprocess, "run", fake_run)
    r = run("download-kernels")
    assert r.exit_code == 0, r.output
    assert calls[0][1:4] == ["-m", "pip", "install"]
    assert calls[0][-2:] == ["flashinfer-cubin==0.1.0", "flashinfer-jit-cache==0.1.0"]
    r = run("install-cubin-wheel")
    assert r.exit_code == 3 and "pip exited with status 3" in r.output


def test_download_jit_cache_is_a_hidden_alias():
    help_text = run("--help").output
    assert "install-jit-cache-wheel" in help_text and "download-jit-cache" not in help_text
    for command in ("install-cubin-wheel", "install-jit-cache-wheel", "download-kernels",
                    "collect-env", "list-modules", "export-compile-commands"):
        assert command in help_text

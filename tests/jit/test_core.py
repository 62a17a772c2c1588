"""The JIT against a real nvcc (sm_90a), on a CPU-only machine: build, load, cache, rebuild,
locking, failure modes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flashinfer import knobs
from flashinfer.exceptions import (
    CompilerNotFoundError,
    JitCompileError,
    MissingJITCacheError,
)
from flashinfer.jit import core
from flashinfer.jit.core import JitSpec, plan_build

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.nvcc


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A fresh cache and a private copy of the toy sources."""
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "ws"))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    src = tmp_path / "src"
    shutil.copytree(DATA, src)
    core._loaded.clear()
    core.stats.clear()
    yield src
    core._loaded.clear()


def toy(src: Path, **kw) -> JitSpec:
    return JitSpec(name="toy", sources=(str(src / "toy.cu"),), **kw)


def test_builds_loads_and_caches(workspace):
    spec = toy(workspace)
    assert spec.build_and_load().toy_value() == 1
    assert core.stats["built"] == 1
    plan = plan_build(spec)
    record = json.loads((plan.build_dir / "module.json").read_text())
    assert record["archs"] == ["9.0a"] and "-gencode=arch=compute_90a,code=sm_90a" in record[
        "cuda_cflags"
    ]
    assert not (plan.build_dir / "build").exists()  # intermediates are removed after publishing
    # a second call in the process is served from memory, a new process from disk
    assert spec.build_and_load().toy_value() == 1
    core._loaded.clear()
    assert spec.build_and_load().toy_value() == 1
    assert core.stats == {"built": 1, "loaded_disk": 1}


def test_header_edit_rebuilds(workspace):
    spec = toy(workspace)
    first = plan_build(spec)
    assert spec.build_and_load().toy_value() == 1
    (workspace / "toy_value.h").write_text("#define TOY_VALUE 2\n")
    second = plan_build(spec)
    assert second.build_dir != first.build_dir
    assert str(workspace / "toy_value.h") in second.inputs
    assert spec.build_and_load().toy_value() == 2
    assert core.stats["built"] == 2


def test_flag_change_rebuilds(workspace, monkeypatch):
    base = plan_build(toy(workspace))
    with_flag = toy(workspace, extra_cuda_cflags=("-DTOY_OFFSET=10",))
    assert plan_build(with_flag).build_dir != base.build_dir
    assert with_flag.build_and_load().toy_value() == 11
    monkeypatch.setenv("FLASHINFER_EXTRA_CUDAFLAGS", "-DTOY_OFFSET=5")
    assert plan_build(toy(workspace)).build_dir != base.build_dir
    assert toy(workspace).build_and_load().toy_value() == 6


def test_key_follows_archs_and_compiler(workspace, monkeypatch, tmp_path):
    base = plan_build(toy(workspace))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "8.0 9.0a")
    two = plan_build(toy(workspace))
    assert two.build_dir.parent.parent.name == "80_90a" and two.build_key != base.build_key
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    # another nvcc (here: a copy at another path) is another build, same module URI
    other = tmp_path / "bin" / "nvcc"
    other.parent.mkdir()
    shutil.copy2(core.toolchain.find_nvcc(), other)
    monkeypatch.setenv("FLASHINFER_NVCC", str(other))
    switched = plan_build(toy(workspace))
    assert switched.build_key != base.build_key
    assert switched.uri == base.uri


def test_compile_error_carries_nvcc_lines_and_log(workspace):
    (workspace / "toy.cu").write_text(
        (workspace / "toy.cu").read_text() + "\nint broken() { return undeclared_name; }\n"
    )
    with pytest.raises(JitCompileError) as info:
        toy(workspace).build_and_load()
    err = info.value
    assert any("undeclared_name" in line for line in err.error_lines)
    assert "undeclared_name" in str(err) and err.log_path in str(err)
    assert "undeclared_name" in Path(err.log_path).read_text()
    assert isinstance(err, RuntimeError)
    # nothing was published, and a fixed source builds
    assert not plan_build(toy(workspace)).so_path.exists()


def test_disable_jit_names_module_and_wheel(workspace):
    with knobs.jit.scope():
        knobs.jit.disable_jit = True
        with pytest.raises(MissingJITCacheError) as info:
            toy(workspace).build_and_load()
    msg = str(info.value)
    assert "'toy'" in msg and "flashinfer-jit-cache" in msg and "FLASHINFER_DISABLE_JIT" in msg
    assert info.value.spec == toy(workspace)
    # once built, a disabled JIT still loads it from disk
    toy(workspace).build_and_load()
    core._loaded.clear()
    with knobs.jit.scope():
        knobs.jit.disable_jit = True
        assert toy(workspace).build_and_load().toy_value() == 1


def test_missing_nvcc_is_a_clear_error(workspace, monkeypatch):
    monkeypatch.setenv("FLASHINFER_NVCC", "/nonexistent/nvcc")
    with pytest.raises(CompilerNotFoundError, match="nvcc"):
        toy(workspace).build_and_load()


_CHILD = textwrap.dedent(
    """
    import sys
    from flashinfer.jit import core
    spec = core.JitSpec(name="toy", sources=(sys.argv[1],))
    value = spec.build_and_load().toy_value()
    print(f"value={value} built={core.stats['built']}", flush=True)
    """
)


def _child(src: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(src / "toy.cu")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def test_eight_processes_cold_start_build_once(workspace):
    procs = [_child(workspace) for _ in range(8)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert all("value=1" in out for out in outputs), outputs
    assert sum("built=1" in out for out in outputs) == 1, outputs


def test_killed_build_blocks_nothing(workspace):
    proc = _child(workspace, start_new_session=True)
    work = plan_build(toy(workspace)).build_dir / "build"
    deadline = time.monotonic() + 120
    while not (work / "build.ninja").exists():  # ninja is about to run nvcc
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"child never started a build: {proc.communicate()[0]}")
        time.sleep(0.05)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not plan_build(toy(workspace)).so_path.exists()
    assert toy(workspace).build_and_load().toy_value() == 1  # lock released, leftovers ignored
    assert core.stats["built"] == 1


def test_real_module_builds_for_sm90a_and_validates(workspace):
    """The scale op's module, as shipped, compiles for sm_90a and its binding validates
    arguments with typed errors before touching the GPU."""
    import torch

    from flashinfer.jit.scale import gen_scale_module

    module = gen_scale_module().build_and_load()
    with pytest.raises(ValueError, match="CUDA"):
        module.scale(torch.empty(8), torch.empty(8), 2.0, False)


def test_an_arch_nvcc_does_not_know_names_nvccs_reason(workspace, monkeypatch):
    """For arch 9.9 the message was only `FAILED: [code=1] 00_toy.cuda.o`; nvcc's reason was in
    the log alone."""
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.9")
    with pytest.raises(JitCompileError) as info:
        toy(workspace).build_and_load()
    msg = str(info.value)
    assert "nvcc fatal" in msg and "Unsupported gpu architecture 'compute_99'" in msg, msg
    assert info.value.log_path in msg and "--generate-dependencies" not in msg

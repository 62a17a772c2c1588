from pathlib import Path

from flashinfer.jit.core import local_headers
from flashinfer.jit.ninja import NinjaBuild, render_ninja, write_if_changed


def test_render_is_pure_and_complete():
    b = NinjaBuild(
        name="m",
        sources=[Path("/src/a.cu"), Path("/src dir/b.cc")],
        nvcc=["ccache", "/cuda/bin/nvcc"],
        cxx=["c++"],
        cuda_cflags=["-O3", "-DX=$1"],
        cflags=["-O3"],
        ldflags=["-shared"],
    )
    text = render_ninja(b)
    assert text == render_ninja(b)
    assert "nvcc = ccache /cuda/bin/nvcc" in text
    assert "build 00_a.cuda.o: compile_cuda /src/a.cu" in text
    assert "build 01_b.o: compile_cxx /src$ dir/b.cc" in text  # space escaped for ninja
    assert "'-DX=$$1'" in text  # "$" escaped for ninja, quoted for the shell
    assert "build m.so: link 00_a.cuda.o 01_b.o" in text


def test_write_if_changed(tmp_path):
    f = tmp_path / "build.ninja"
    assert write_if_changed(f, "a")
    mtime = f.stat().st_mtime_ns
    assert not write_if_changed(f, "a") and f.stat().st_mtime_ns == mtime
    assert write_if_changed(f, "b") and f.read_text() == "b"


def test_local_headers_are_transitive_and_skip_system(tmp_path):
    inc = tmp_path / "include" / "lib"
    inc.mkdir(parents=True)
    (inc / "a.cuh").write_text('#include "b.cuh"\n#include <cuda_runtime.h>\n')
    (inc / "b.cuh").write_text("#pragma once\n")
    src = tmp_path / "x.cu"
    src.write_text('#include <lib/a.cuh>\n#include "missing.h"\n')
    found = local_headers([src], [tmp_path / "include"])
    assert [p.name for p in found] == ["a.cuh", "b.cuh"]

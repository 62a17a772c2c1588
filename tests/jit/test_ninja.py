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


# -- what a failed build says: the compiler's own error lines, bounded, without the commands --

NVCC_99 = """ninja: Entering directory `/ws/cached_ops/scale_0123/build'
[1/2] nvcc /src/scale.cu
FAILED: [code=1] 00_scale.cuda.o
/usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -gencode=arch=compute_99,code=sm_99 -I/tmp/test_compile_error0/include -c /src/scale.cu -o 00_scale.cuda.o
nvcc fatal   : Unsupported gpu architecture 'compute_99'
ninja: build stopped: subcommand failed.
"""


def test_the_fatal_line_of_nvcc_is_the_error():
    from flashinfer.jit.ninja import compiler_errors

    assert compiler_errors(NVCC_99) == ["nvcc fatal   : Unsupported gpu architecture 'compute_99'"]


def test_compiler_and_linker_diagnostics():
    from flashinfer.jit.ninja import compiler_errors

    out = "\n".join([
        "FAILED: [code=2] 00_a.cuda.o",
        "nvcc -DERROR_CHECKS=1 -c /src/error_handling/a.cu",  # the command: not an error line
        "/src/a.cu(5): error: identifier \"undeclared_name\" is undefined",
        "/src/b.cc:3:10: fatal error: missing.h: No such file or directory",
        "ptxas error   : Entry function 'k' uses too much shared data",
        "/usr/bin/ld: cannot find -lnothere: No such file or directory",
        "a.o: in function `f': a.cu:(.text+0x1): undefined reference to `g'",
        "collect2: error: ld returned 1 exit status",
        "/bin/sh: 1: no-such-cxx: not found",
        "/src/a.cu(9): warning #177-D: variable \"x\" was declared but never referenced",
    ])
    got = compiler_errors(out)
    assert len(got) == 7 and not any("-DERROR_CHECKS" in line or "warning" in line for line in got)


def test_the_message_is_bounded():
    from flashinfer.exceptions import JitCompileError

    lines = [f"/src/a.cu({i}): error: " + "x" * 5000 for i in range(1000)]
    err = JitCompileError(type("Spec", (), {"name": "m"})(), "/ws/build.log", lines)
    msg = str(err)
    assert len(msg) < 4000 and "/ws/build.log" in msg and "990 more" in msg
    assert err.error_lines == lines  # all of them, for a caller who wants them

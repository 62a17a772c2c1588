"""Build spec of the torch glue module (csrc/torch_rng.cc): torch's graph-safe Philox state.

The only module built against torch's C++ API: its ABI is the installed torch's, so it is
JIT-only (never in the jit-cache wheel) and torch's version is in its key. It is built the first
time a sampling op without a seed is captured in a CUDA graph (~7 s on one core).
"""

from __future__ import annotations

from pathlib import Path

from .core import JitSpec


def gen_torch_rng_module() -> JitSpec:
    import torch

    root = Path(torch.__file__).parent
    return JitSpec(
        name="torch_rng",
        sources=("torch_rng.cc",),
        extra_cflags=(
            "-std=c++20",  # torch's headers need it (later -std flags win)
            f"-I{root / 'include'}",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DFLASHINFER_TORCH_VERSION={torch.__version__}",  # in the key
        ),
        extra_ldflags=(f"-L{root / 'lib'}", f"-Wl,-rpath,{root / 'lib'}", "-lc10", "-lc10_cuda",
                       "-ltorch_cpu", "-ltorch_cuda"),
    )

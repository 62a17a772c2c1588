"""Where the compilers, ninja, TVM-FFI and our own sources are, and their identities."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from .. import knobs

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def source_root() -> Path:
    """Root holding ``include/`` and ``csrc/``: inside the installed wheel
    (``flashinfer/data``), or the source checkout (``packages/flashinfer-python``)."""
    bundled = _PACKAGE_DIR / "data"
    if (bundled / "csrc").is_dir():
        return bundled
    return _PACKAGE_DIR.parent


def sources_bundled() -> bool:
    """Whether the kernel sources are the ones an installed wheel bundles (not a checkout)."""
    return source_root() == _PACKAGE_DIR / "data"


def include_dir() -> Path:
    return source_root() / "include"


def csrc_dir() -> Path:
    return source_root() / "csrc"


def cuda_home() -> Optional[Path]:
    """CUDA_HOME / CUDA_PATH, else the toolkit of the nvcc on PATH, else /usr/local/cuda.

    The nvcc on PATH may be a wrapper outside the toolkit (e.g. /usr/local/bin/nvcc), so its
    parent only counts when it holds the runtime library."""
    if knobs.jit.cuda_home:
        return Path(knobs.jit.cuda_home)
    nvcc = shutil.which("nvcc")
    candidates = [Path(os.path.realpath(nvcc)).parent.parent] if nvcc else []
    candidates.append(Path("/usr/local/cuda"))
    for root in candidates:
        if (root / "bin" / "nvcc").exists() and (root / "lib64").is_dir():
            return root
    return None


def find_nvcc() -> Optional[Path]:
    """FLASHINFER_NVCC, else $CUDA_HOME/bin/nvcc, else nvcc on PATH."""
    if knobs.jit.nvcc:
        return Path(knobs.jit.nvcc)
    home = cuda_home()
    if home is not None and (home / "bin" / "nvcc").exists():
        return home / "bin" / "nvcc"
    found = shutil.which("nvcc")
    return Path(found) if found else None


def nvcc_version(nvcc: Optional[Path] = None) -> Optional[str]:
    """The ``release X.Y, VX.Y.Z`` line of ``nvcc --version``, or None without a working nvcc."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        return None
    return _nvcc_version(str(nvcc))


@functools.cache
def _nvcc_version(nvcc: str) -> Optional[str]:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.stdout.splitlines():
        if "release" in line:
            return line.split("release", 1)[1].strip()
    return None


def file_identity(path: Optional[Path]) -> str:
    """Identity of a tool binary without running it: resolved path, size and mtime. Switching
    to another nvcc (another path, or the same path reinstalled) changes it; running
    ``nvcc --version`` on every first call would cost ~50 ms."""
    if path is None:
        return "none"
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return f"missing:{path}"
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def find_ninja() -> Optional[Path]:
    try:
        import ninja  # the PyPI package ships the binary

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.exists():
            return candidate
    except (ImportError, AttributeError):
        pass
    found = shutil.which("ninja")
    return Path(found) if found else None


def host_compiler() -> str:
    return knobs.jit.cxx or "c++"


@functools.cache
def tvm_ffi_paths() -> tuple[list[Path], Path]:
    """(include dirs, libtvm_ffi.so) of the installed apache-tvm-ffi, without importing it
    (importing tvm_ffi imports torch)."""
    import importlib.util

    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None or spec.origin is None:
        raise ImportError("apache-tvm-ffi is not installed: pip install apache-tvm-ffi")
    root = Path(spec.origin).parent
    return [root / "include"], root / "lib" / "libtvm_ffi.so"


@functools.cache
def tvm_ffi_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("apache-tvm-ffi")
    except PackageNotFoundError:
        return "unknown"

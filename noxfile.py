"""Every workflow of the monorepo. ``nox -l`` lists them.

Torch is installed first in every session, from one setting: ``TORCH_SPEC`` (default
``torch==2.13.0``, the CPU build these machines carry). An unpinned ``torch`` in a fresh
environment would pull gigabytes of CUDA packages. On a GPU machine, set TORCH_SPEC to the build
that matches its CUDA, e.g. ``TORCH_SPEC="torch==2.11.0"``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PACKAGES = ["flashinfer-python", "flashinfer-jit-cache", "flashinfer-cubin"]
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]
nox.options.error_on_missing_interpreters = True


def _install_torch(session: nox.Session) -> None:
    session.install(TORCH_SPEC)


@nox.session
def tests(session: nox.Session) -> None:
    """Install the core package (a built wheel, not the source tree) and run the test suite."""
    _install_torch(session)
    session.install("pytest", "numpy", str(ROOT / "packages" / "flashinfer-python"))
    session.run(
        "python", "-c",
        "import flashinfer, sys; f = flashinfer.__file__; "
        "sys.exit(0 if 'site-packages' in f else f'flashinfer imported from {f}, not the wheel')",
    )
    session.run("pytest", *(session.posargs or ["tests"]))


@nox.session
def lint(session: nox.Session) -> None:
    """Static checks: ruff over Python, byte-compilation, and no env reads outside knobs."""
    session.install("ruff")
    session.run("ruff", "check", "packages", "tests", "benchmarks", "tools", "noxfile.py")
    session.run("python", "-m", "compileall", "-q", "packages", "tests", "benchmarks")


@nox.session
def build(session: nox.Session) -> None:
    """Build the wheels and sdists of the whole set into dist/."""
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir()
    session.install("build")
    for name in PACKAGES:
        session.run("python", "-m", "build", "--outdir", str(dist), str(ROOT / "packages" / name))
    session.log("built: " + ", ".join(sorted(p.name for p in dist.iterdir())))

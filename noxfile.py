"""Every workflow of the monorepo. ``nox -l`` lists them.

Torch is installed first in every session that needs it, from one setting: ``TORCH_SPEC``
(default ``torch==2.13.0``, the CPU build these machines carry). An unpinned ``torch`` in a fresh
environment would pull gigabytes of CUDA packages. On a GPU machine, set TORCH_SPEC to the build
that matches its CUDA, e.g. ``TORCH_SPEC="torch==2.11.0"``.

The set's three wheels are built from the source tree with ``python -m build --no-isolation``
in the session's environment, so the jit-cache's AOT build uses the apache-tvm-ffi and ninja
installed there, and the wheel pins exactly that apache-tvm-ffi. Which modules and archs the
jit-cache wheel holds: ``FLASHINFER_AOT_MODULES`` (default: all) and
``FLASHINFER_CUDA_ARCH_LIST`` (default for ``build``/``release``: :data:`RELEASE_ARCHS`).
See docs/wheels.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
DIST = ROOT / "dist"
PACKAGES = ["flashinfer-python", "flashinfer-jit-cache", "flashinfer-cubin"]
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
#: GPU archs of a release's jit-cache wheel: sm_80 SASS also serves 8.6/8.7/8.9; sm90 and
#: newer need their own "a" build (docs/wheels.md, "Which GPUs a wheel serves").
RELEASE_ARCHS = "8.0 9.0a 10.0a 12.0a"
#: CI's jit-cache wheel: one small module for the H100 arch (a full build takes long).
TEST_ARCHS, TEST_MODULES = "9.0a", "scale"
BUILD_REQUIREMENTS = ["build", "hatchling>=1.25", "apache-tvm-ffi>=0.1.15,<0.2", "ninja"]
#: What the tests need besides the set; moto[server] (with boto3): the S3-compatible server the
#: artifact tests start on loopback; hatchling: the cubin-wheel tests build that wheel (also in
#: the release's fresh venv, which has no build requirements otherwise); nox: tests/test_noxfile.py
#: imports this file to test the release guards.
TEST_REQUIREMENTS = ["pytest", "numpy", "moto[server]", "hatchling>=1.25", "nox"]
#: The extra index a release install takes torch & co from (ours is the main one).
PYPI = os.environ.get("RELEASE_EXTRA_INDEX_URL", "https://pypi.org/simple")

sys.path.insert(0, str(ROOT / "tools"))
from wheels import check as wheel_check  # noqa: E402
from wheels import index as wheel_index  # noqa: E402

if (ROOT / "tools" / "nox_artifacts.py").exists():
    import nox_artifacts  # noqa: E402, F401  - registers the sessions cubins, publish, mirror

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]
nox.options.error_on_missing_interpreters = True


def _install_torch(session: nox.Session) -> None:
    session.install(TORCH_SPEC)


def _version() -> str:
    return (ROOT / "version.txt").read_text().strip()


def _version_arg(session: nox.Session) -> str:
    """The X.Y.Z given after ``--``: a public PEP 440 version (no local label)."""
    from packaging.version import InvalidVersion, Version

    if len(session.posargs) != 1:
        session.error(f"usage: nox -s {session.name} -- X.Y.Z (got {session.posargs})")
    text = session.posargs[0]
    try:
        parsed = Version(text)
    except InvalidVersion:
        session.error(f"version must be a PEP 440 version like 1.2.3, got {text!r}")
    if parsed.local or str(parsed) != text or len(parsed.release) != 3:
        session.error(f"version must be a normalized public X.Y.Z version like 1.2.3 (or "
                      f"1.2.3rc1), got {text!r}")
    return text


# ----------------------------------------------------------------------------------------------
# Building and checking the set


def _build_set(session: nox.Session, outdir: Path, *, sdists: bool, archs: str,
               modules: str | None) -> None:
    """Build the three wheels (and sdists) of the current version.txt into ``outdir``.

    The session must already hold torch and BUILD_REQUIREMENTS. The JIT cache the AOT build
    compiles into is the session's own (content-addressed, so reusing it with ``-r`` is safe)."""
    outdir.mkdir(parents=True, exist_ok=True)
    env = {
        "FLASHINFER_CUDA_ARCH_LIST": archs,
        "FLASHINFER_WORKSPACE_BASE": os.environ.get("FLASHINFER_WORKSPACE_BASE")
        or str(Path(session.create_tmp()).resolve() / "aot-cache"),
    }
    if modules:
        env["FLASHINFER_AOT_MODULES"] = modules
    kinds = ["--wheel", "--sdist"] if sdists else ["--wheel"]
    session.log(f"jit-cache: archs {archs!r}, modules {modules or 'all'}")
    for name in PACKAGES:
        session.run("python", "-m", "build", "--no-isolation", *kinds, "--outdir", str(outdir),
                    str(ROOT / "packages" / name), env=env)


def _check(session: nox.Session, outdir: Path, version: str, sdists: bool) -> None:
    problems = wheel_check.check_dist(outdir, version, sdists=sdists)
    for line in problems:
        session.warn(f"FAIL {line}")
    if problems:
        session.error(f"{len(problems)} problems in the built set of {version} ({outdir})")
    wheels, tars = wheel_check.files_of(outdir, version)
    session.log(f"checked: {', '.join(p.name for p in [*wheels, *tars])}")


def _remove_version(outdir: Path, version: str) -> None:
    wheels, tars = wheel_check.files_of(outdir, version) if outdir.is_dir() else ([], [])
    for p in [*wheels, *tars]:
        p.unlink()


@nox.session
def build(session: nox.Session) -> None:
    """Build the three wheels and sdists into dist/, then check their metadata, pins and tags."""
    version = _version()
    _install_torch(session)
    session.install(*BUILD_REQUIREMENTS)
    # A rebuild replaces this version's files; other versions in dist/ (releases) stay.
    _remove_version(DIST, version)
    _build_dist(session, version)


def _build_dist(session: nox.Session, version: str) -> None:
    """The set and its sdists into dist/ for the configured archs and modules, then checked."""
    _build_set(session, DIST, sdists=True,
               archs=os.environ.get("FLASHINFER_CUDA_ARCH_LIST") or RELEASE_ARCHS,
               modules=os.environ.get("FLASHINFER_AOT_MODULES"))
    _check(session, DIST, version, sdists=True)


# ----------------------------------------------------------------------------------------------
# Tests against the installed set


def _install_from(session: nox.Session, python: str, find: list[str], version: str) -> None:
    """pip install 'flashinfer-python[jit-cache]==version' with ``find`` (pip options naming
    where our wheels are), then prove every flashinfer-* package came from there: an index
    that also serves the public flashinfer-python (PyPI does) must never win unnoticed."""
    report = Path(session.create_tmp()).resolve() / "pip-report.json"
    session.run(python, "-m", "pip", "install", "-q", *find,
                f"flashinfer-python[jit-cache]=={version}", "--report", str(report),
                external=True)
    ours = {"flashinfer-python", "flashinfer-jit-cache"}
    installed = {}
    for item in json.loads(report.read_text())["install"]:
        name = item["metadata"]["name"].lower()
        installed[name] = item["download_info"]["url"]
    if ours - set(installed):
        session.error(f"pip did not install {sorted(ours - set(installed))} (report: {report})")
    for name in ours:
        if not installed[name].startswith("file:"):
            session.error(f"{name} came from {installed[name]}, not from the built set")
    session.log("installed from the built set: " + ", ".join(
        installed[n].rsplit("/", 1)[-1] for n in sorted(ours)))


_ASSERT_INSTALLED = """
import sys, flashinfer, flashinfer_jit_cache as jc
v = sys.argv[1]
where = flashinfer.__file__
assert 'site-packages' in where, f'flashinfer imported from {where}, not the installed wheel'
assert flashinfer.__version__ == v, (flashinfer.__version__, v)
assert jc.__version__.split('+')[0] == v, (jc.__version__, v)
assert not jc.verify(), jc.verify()
print(f'flashinfer {flashinfer.__version__} + flashinfer-jit-cache {jc.__version__} '
      f'({len(jc.modules())} modules, archs {jc.arch_list()}, CUDA {jc.cuda_version()})')
"""


@nox.session
def tests(session: nox.Session) -> None:
    """Build the set (jit-cache: scale for sm_90a), install the built wheels, run the tests."""
    version = _version()
    _install_torch(session)
    session.install(*BUILD_REQUIREMENTS)
    wheelhouse = Path(session.create_tmp()).resolve() / "wheelhouse"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    _build_set(session, wheelhouse, sdists=False, archs=TEST_ARCHS, modules=TEST_MODULES)
    _check(session, wheelhouse, version, sdists=False)
    session.install(*TEST_REQUIREMENTS)
    _install_from(session, "python", ["--find-links", str(wheelhouse)], version)
    session.run("python", "-c", _ASSERT_INSTALLED, version)
    # The packaging tests reuse these wheels instead of building their own.
    session.run("pytest", *(session.posargs or ["tests"]),
                env={"FLASHINFER_TEST_WHEELHOUSE": str(wheelhouse)})


@nox.session
def lint(session: nox.Session) -> None:
    """Static checks: ruff over Python, byte-compilation (env reads: tests/test_knobs.py)."""
    session.install("ruff")
    session.run("ruff", "check", "packages", "tests", "benchmarks", "tools", "noxfile.py")
    session.run("python", "-m", "compileall", "-q", "packages", "tests", "benchmarks", "tools")


# ----------------------------------------------------------------------------------------------
# Versions and releases

#: Where a version may legitimately be spelled besides version.txt: test data, measurements,
#: and the records of releases (artifact locks name the release they lock).
_PIN_EXEMPT = ("version.txt", "tests/", "benchmarks/results/", "artifacts/releases/")


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
        return [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # an sdist or a copy without git
        return [p for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]


def _pin(session: nox.Session, version: str) -> None:
    """Verify the set reads the version from version.txt and nothing else spells ``version``,
    then write it there (a refused pin leaves the tree as it was)."""
    # X.Y.Z as a whole: not inside 10.X.Y.Z, X.Y.Z1 or X.Y.Z.post1
    pattern = re.compile(rf"(?<![\w.]){re.escape(version)}(?!\w|\.\w)")
    spelled = []
    for path in _tracked_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(_PIN_EXEMPT) or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binaries
        spelled += [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1)
                    if pattern.search(line)]
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        if not re.search(r'^dynamic = \[[^\]]*"version"', pyproject.read_text(), re.M):
            spelled.append(f"{pyproject.relative_to(ROOT)}: version is not dynamic")
    if spelled:
        session.error(f"{version} must live in version.txt only; also in: {', '.join(spelled)}")
    (ROOT / "version.txt").write_text(version + "\n")
    session.log(f"version.txt = {version}; no other file spells it")


@nox.session(python=False)
def pin(session: nox.Session) -> None:
    """Set the version of the whole set (version.txt) and verify nothing else spells it."""
    _pin(session, _version_arg(session))


def _refuse_dirty(session: nox.Session) -> None:
    out = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                         text=True)
    if out.returncode != 0:
        session.error(f"a release needs a git checkout: git status failed: {out.stderr.strip()}")
    if out.stdout.strip():
        changed = ", ".join(line[3:] for line in out.stdout.splitlines()[:10])
        session.error(f"the tree is dirty ({changed}); a release is built from committed files")


def _refuse_existing(session: nox.Session, version: str) -> None:
    wheels, tars = wheel_check.files_of(DIST, version) if DIST.is_dir() else ([], [])
    if wheels or tars:
        session.error(f"dist/ already holds {version} ({', '.join(p.name for p in wheels + tars)})"
                      "; a release is never overwritten (remove them if they are a dev build)")


def _release_artifacts(session: nox.Session, version: str) -> None:
    """Hook for the artifact repository (tools/nox_artifacts.py): build this release's cubins
    and publish them with their manifest, before the wheels are built (the core wheel pins the
    manifest's sha256, the cubin wheel packs the files)."""
    steps = getattr(sys.modules.get("nox_artifacts"), "release_steps", None)
    if steps is None:
        session.log("artifact steps: none (tools/nox_artifacts.py defines no release_steps)")
        return
    steps(session, version)


@nox.session
def release(session: nox.Session) -> None:
    """Release X.Y.Z: pin, build, check, index dist/whl, install from it fresh, test it."""
    version = _version_arg(session)
    _refuse_dirty(session)
    _refuse_existing(session, version)
    _pin(session, version)
    _install_torch(session)
    session.install(*BUILD_REQUIREMENTS)
    _release_artifacts(session, version)
    _build_dist(session, version)
    roots = wheel_index.write_index(DIST, DIST / "whl")
    wheels, _ = wheel_check.files_of(DIST, version)
    label = next(wheel_check.parse_wheel_filename(w.name)[1].local for w in wheels
                 if wheel_check.parse_wheel_filename(w.name)[0] == wheel_check.JIT_CACHE)
    index = roots[label].resolve().as_uri() + "/"
    session.log(f"index: {index}")

    # A fresh virtual environment that sees nothing of this one.
    venv = Path(session.create_tmp()).resolve() / "release-venv"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("python", "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    session.run(python, "-m", "pip", "install", "-q", TORCH_SPEC, external=True)
    _install_from(session, python, ["--index-url", index, "--extra-index-url", PYPI], version)
    session.run(python, "-c", _ASSERT_INSTALLED, version, external=True)
    shown = session.run(str(venv / "bin" / "flashinfer"), "show-config", external=True,
                        silent=True)
    section = shown.split("=== JIT Cache Wheel ===", 1)[-1].split("===", 1)[0]
    if "status: used" not in section or f"flashinfer-jit-cache: {version}+{label}" not in section:
        session.error(f"show-config does not show the installed jit-cache in use:\n{section}")
    session.log("show-config:" + section.rstrip())
    session.run(python, "-m", "pip", "install", "-q", *TEST_REQUIREMENTS, external=True)
    session.run(python, "-m", "pytest", "tests", "-q", external=True,
                env={"FLASHINFER_TEST_WHEELHOUSE": str(DIST)})
    session.log(f"released {version}: {DIST} (index {index})")

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
import zipfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
DIST = ROOT / "dist"
BUILD_AOT_CACHE = ROOT / "build" / "aot-cache"  # nox -s build's AOT cache, kept across sessions
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
#: imports this file to test the release guards; safetensors: level-10 dumps in that format;
#: pydantic and docstring-parser: what flashinfer-bench needs to load our trace files.
TEST_REQUIREMENTS = ["pytest", "numpy", "moto[server]", "hatchling>=1.25", "nox", "safetensors",
                     "pydantic>=2", "docstring-parser"]
#: tests/test_fi_trace.py loads the trace JSON with flashinfer-bench, which declares upstream's
#: flashinfer-python as a dependency (it would replace ours): installed with --no-deps.
TRACE_CHECKER = "flashinfer-bench==0.1.2"
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
               modules: str | None, extra_env: dict[str, str] | None = None,
               workspace: Path | None = None) -> None:
    """Build the three wheels (and sdists) of the current version.txt into ``outdir``.

    The session must already hold torch and BUILD_REQUIREMENTS. The JIT cache the AOT build
    compiles into is FLASHINFER_WORKSPACE_BASE where set, else ``workspace``, else
    ``build/aot-cache`` (outside the nox session, which nox recreates without ``-r``). It is
    content-addressed: a module is reused only where its sources, headers, flags, archs and
    compiler hash the same, so reusing it across builds and attempts is safe."""
    outdir.mkdir(parents=True, exist_ok=True)
    env = {
        "FLASHINFER_CUDA_ARCH_LIST": archs,
        "FLASHINFER_WORKSPACE_BASE": os.environ.get("FLASHINFER_WORKSPACE_BASE")
        or str(workspace or BUILD_AOT_CACHE),
    }
    if modules:
        env["FLASHINFER_AOT_MODULES"] = modules
    env.update(extra_env or {})
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
    # A rebuild replaces this version's files; other versions in dist/ (releases) stay, and
    # so does a release of this version.
    _refuse_released(session, version)
    _remove_version(DIST, version)
    _build_dist(session, version)


def _refuse_released(session: nox.Session, version: str) -> None:
    wheels, tars = wheel_check.files_of(DIST, version) if DIST.is_dir() else ([], [])
    if (wheels or tars) and (ROOT / "artifacts" / "releases" / f"{version}.json").is_file():
        session.error(f"dist/ holds the release of {version} (its lock is artifacts/releases/"
                      f"{version}.json), which a build never replaces: build the next version "
                      "(nox -s pin -- <next X.Y.Z>, e.g. X.Y.Z.dev0), or move dist/ away first")


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
    """Build the set (jit-cache: scale for sm_90a), install the built wheels, run the tests;
    then (a whole run, no pytest arguments) the release check on a fresh clone of HEAD."""
    version = _version()
    _install_torch(session)
    session.install(*BUILD_REQUIREMENTS)
    wheelhouse = Path(session.create_tmp()).resolve() / "wheelhouse"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    _build_set(session, wheelhouse, sdists=False, archs=TEST_ARCHS, modules=TEST_MODULES)
    _check(session, wheelhouse, version, sdists=False)
    session.install(*TEST_REQUIREMENTS)
    session.install("--no-deps", TRACE_CHECKER)
    _install_from(session, "python", ["--find-links", str(wheelhouse)], version)
    session.run("python", "-c", _ASSERT_INSTALLED, version)
    # The packaging tests reuse these wheels instead of building their own.
    session.run("pytest", *(session.posargs or ["tests"]),
                env={"FLASHINFER_TEST_WHEELHOUSE": str(wheelhouse)})
    if session.posargs:
        session.log("release check: skipped (pytest arguments select some tests; the whole run, "
                    "`nox -s tests`, includes it)")
    else:
        _release_check(session)


def check_version(version: str) -> str:
    """The version the release check releases in its clone: version.txt's with 100 added to the
    major. Not version.txt's, whose lock may be committed (the check's cubins, one arch, differ
    from a release's); none PyPI has (pip must find only ours), and plain (no pre-release
    paths); computed, not written down: the release's pin refuses a version a tracked file
    spells."""
    from packaging.version import Version

    major, minor, patch = Version(version).release[:3]
    return f"{major + 100}.{minor}.{patch}"


def _release_check(session: nox.Session) -> None:
    """The release flow, CI-sized, on a fresh clone of this checkout's HEAD (``git clone``, so
    uncommitted edits are not part of it): a release that fails (an unknown AOT module) and is
    run again, then succeeds (``scale`` for sm_90a, cubins for sm_90a), local-only; then
    checks that the clone holds only what the release says to commit, that neither the lock
    nor the core wheel names a path of the clone, and that releasing the version again is
    refused with what to do."""
    clone = Path(session.create_tmp()).resolve() / "release-check"
    shutil.rmtree(clone, ignore_errors=True)
    session.run("git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone), external=True)
    version = check_version((clone / "version.txt").read_text().strip())

    def nox_release(*flags: str) -> list[str]:
        return ["nox", "-f", str(clone / "noxfile.py"), "-s", "release", *flags, "--", version]

    env = {"FLASHINFER_CUDA_ARCH_LIST": TEST_ARCHS, "FLASHINFER_CUBIN_ARCHS": TEST_ARCHS,
           "FLASHINFER_PUBLIC_REPOSITORIES": "", "FLASHINFER_PUBLISH_REPOSITORY": "",
           "FLASHINFER_WORKSPACE_BASE": str(clone / "build" / "aot-cache")}
    session.log(f"release check: releasing {version} in {clone}, a clone of HEAD (uncommitted "
                "edits are not part of it): a failed attempt, its retry, a refused repeat")
    failed = session.run(*nox_release(), env={**env, "FLASHINFER_AOT_MODULES": "no_such_module"},
                         success_codes=[1], silent=True)
    if "no_such_module" not in failed:
        session.error(f"the failing release did not fail where expected:\n{failed[-3000:]}")
    log = session.run(*nox_release("-r"), env={**env, "FLASHINFER_AOT_MODULES": TEST_MODULES},
                      silent=True)
    problems = release_check_problems(clone, version, log)
    again = session.run(*nox_release("-r"), env={**env, "FLASHINFER_AOT_MODULES": TEST_MODULES},
                        success_codes=[1], silent=True)
    if "never overwritten" not in again or "bump the version" not in again:
        problems.append(f"a second release of {version} was not refused with what to do")
    for line in problems:
        session.warn(f"FAIL {line}")
    if problems:
        session.error(f"release check: {len(problems)} problems (log: {log[-3000:]})")
    session.log(f"release check: {version} released after a failed attempt, then refused")


def release_check_problems(clone: Path, version: str, log: str) -> list[str]:
    """What is wrong with the clone a release of ``version`` just finished in (pure; tested)."""
    problems = []
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=clone, capture_output=True, text=True).stdout.split("\n")
    left = sorted(line[3:] for line in status if line.strip())
    expected = sorted(["version.txt", _lock_rel(version)])
    if left != expected:
        problems.append(f"the release left {left} uncommitted, expected {expected}")
    advice = f"git add {' '.join(expected)} && git commit"
    if advice not in log:
        problems.append(f"the release did not say what to commit ({advice!r})")
    lock = clone / _lock_rel(version)
    text = lock.read_text() if lock.is_file() else ""
    if str(clone) in text or not text:
        problems.append(f"the lock names a path of the build machine or is missing: {text!r}")
    elif json.loads(text).get("repositories") != [] or "local-only" not in text:
        problems.append(f"a release without public repositories must say local-only: {text!r}")
    if "LOCAL-ONLY" not in log:
        problems.append("the release log does not say the release is local-only")
    wheels, _ = wheel_check.files_of(clone / "dist", version) if (clone / "dist").is_dir() \
        else ([], [])
    core = [w for w in wheels if w.name.startswith("flashinfer_python-")]
    if len(core) != 1:
        problems.append(f"dist/ holds {[w.name for w in wheels]}, no single core wheel")
    else:
        with zipfile.ZipFile(core[0]) as zf:
            pin = zf.read("flashinfer/_artifact_pin.py").decode()
        if str(clone) in pin or "REPOSITORIES = ()" not in pin or "LOCAL_ONLY = None" in pin:
            problems.append(f"the core wheel's pin is not local-only or names a path: {pin!r}")
    if (clone / "build" / "release" / version).exists():
        problems.append(f"the release left its staging directory build/release/{version}")
    return problems


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
    spelled = _spelled_elsewhere(version)
    if spelled:
        session.error(f"{version} must live in version.txt only; also in: {', '.join(spelled)}")
    (ROOT / "version.txt").write_text(version + "\n")
    session.log(f"version.txt = {version}; no other file spells it")


def _spelled_elsewhere(version: str) -> list[str]:
    """Where a tracked file other than version.txt (and _PIN_EXEMPT) spells ``version``, and
    which pyproject.toml does not read it from there."""
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
    return spelled


@nox.session(python=False)
def pin(session: nox.Session) -> None:
    """Set the version of the whole set (version.txt) and verify nothing else spells it."""
    _pin(session, _version_arg(session))


#: Where an unfinished release keeps its files: ``build/release/X.Y.Z/`` (git-ignored) holds the
#: lock the wheels pin, the built set and its index until the release has passed its tests; only
#: then do the files move to dist/ and the lock to artifacts/releases/. A failed release leaves
#: nothing that blocks the next attempt, which starts by clearing this directory, all but the
#: AOT build cache (:data:`AOT_CACHE`): a retried release recompiles only the modules whose
#: sources, flags or toolchain changed, or that the failed attempt had not finished.
RELEASE_STAGE = ROOT / "build" / "release"
AOT_CACHE = "aot-cache"


def _lock_rel(version: str) -> str:
    return f"artifacts/releases/{version}.json"


def _git_status(session: nox.Session) -> list[tuple[str, str]]:
    """``git status --porcelain`` as (status, path) pairs; a release needs a git checkout."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        session.error(f"a release needs a git checkout: git status failed: {out.stderr.strip()}")
    return [(line[:2], line[3:]) for line in out.stdout.splitlines() if line.strip()]


def _refuse_dirty(session: nox.Session, version: str) -> None:
    """A release is built from committed files. What a release of ``version`` itself leaves
    uncommitted does not count: ``version.txt`` holding ``version`` (an attempt that failed
    after pinning it) and ``artifacts/releases/<version>.json`` (its lock; the release keeps it
    unchanged if the cubins are the same, and refuses other cubins)."""
    own = {_lock_rel(version)}
    if (ROOT / "version.txt").read_text().strip() == version:
        own.add("version.txt")
    changed = [path for _, path in _git_status(session) if path not in own]
    if changed:
        more = f" and {len(changed) - 10} more" if len(changed) > 10 else ""
        session.error(f"the tree is dirty ({', '.join(changed[:10])}{more}); a release is built "
                      "from committed files: commit or stash them first")


def _refuse_existing(session: nox.Session, version: str) -> None:
    wheels, tars = wheel_check.files_of(DIST, version) if DIST.is_dir() else ([], [])
    if wheels or tars:
        names = [p.name for p in wheels + tars]
        session.error(
            f"dist/ already holds {version} ({', '.join(names)}): a published release is never "
            "overwritten. To release again, bump the version (nox -s release -- <next X.Y.Z>). "
            "If these files are not a release (a `nox -s build` of this version, or a copy you "
            "have not published), remove them and run the release again: rm "
            + " ".join(f"dist/{n}" for n in names))


def _fresh_stage(session: nox.Session, version: str) -> Path:
    stage = RELEASE_STAGE / version
    if stage.exists():
        session.log(f"removing what an unfinished release of {version} left in {stage}")
        for child in stage.iterdir():
            if child.name == AOT_CACHE and child.is_dir():
                session.log(f"keeping its AOT build cache ({stage / AOT_CACHE}): modules "
                            "already compiled from the same sources and flags are reused")
            elif child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    (stage / "dist").mkdir(parents=True)
    return stage


def _release_artifacts(session: nox.Session, version: str,
                       lock: Path) -> dict[str, dict[str, str]]:
    """Hook for the artifact repository (tools/nox_artifacts.py): build this release's cubins,
    publish them with their manifest and write the lock the wheels pin to ``lock`` (the core
    wheel pins the manifest's sha256, the cubin wheel packs the files), before the wheels are
    built. Returns the environment of the wheel builds (``build``) and of the tests
    (``tests``)."""
    steps = getattr(sys.modules.get("nox_artifacts"), "release_steps", None)
    if steps is None:
        session.log("artifact steps: none (tools/nox_artifacts.py defines no release_steps)")
        return {"build": {}, "tests": {}}
    return steps(session, version, lock)


def _promote(session: nox.Session, version: str, stage: Path) -> list[str]:
    """Move the tested set into dist/, index it, install the lock; returns what to commit."""
    files = sorted(p for p in (stage / "dist").iterdir() if p.is_file())
    clash = [p.name for p in files if (DIST / p.name).exists()]
    if clash:  # another process released meanwhile
        session.error(f"dist/ gained {', '.join(clash)} during the release; nothing was moved "
                      f"(the tested set stays in {stage / 'dist'})")
    DIST.mkdir(exist_ok=True)
    for p in files:
        os.replace(p, DIST / p.name)
    wheel_index.write_index(DIST, DIST / "whl")
    staged_lock = stage / "lock.json"
    if staged_lock.is_file():
        lock = ROOT / _lock_rel(version)
        lock.parent.mkdir(parents=True, exist_ok=True)
        if not lock.is_file() or lock.read_bytes() != staged_lock.read_bytes():
            os.replace(staged_lock, lock)
    shutil.rmtree(stage)
    own = {_lock_rel(version), "version.txt"}
    return sorted(path for _, path in _git_status(session) if path in own)


def _commit_advice(version: str, to_commit: list[str]) -> str:
    if not to_commit:
        return "nothing to commit: the tree is as it was (the lock was already committed)"
    files = " ".join(to_commit)
    return (f"commit what the release wrote (the lock is what a rebuild of {version} must pin): "
            f"git add {files} && git commit -m 'release {version}'")


@nox.session
def release(session: nox.Session) -> None:
    """Release X.Y.Z: pin, build, check, index, install from it fresh, test it; then dist/."""
    version = _version_arg(session)
    _refuse_existing(session, version)
    _refuse_dirty(session, version)
    stage = _fresh_stage(session, version)
    _pin(session, version)
    _install_torch(session)
    session.install(*BUILD_REQUIREMENTS)
    env = _release_artifacts(session, version, stage / "lock.json")
    outdir = stage / "dist"
    # The wheel builds pin the staged lock (a committed one of this version has the same bytes).
    build_env = dict(env["build"])
    if (stage / "lock.json").is_file():
        build_env["FLASHINFER_ARTIFACT_LOCK"] = str(stage / "lock.json")
    _build_set(session, outdir, sdists=True,
               archs=os.environ.get("FLASHINFER_CUDA_ARCH_LIST") or RELEASE_ARCHS,
               modules=os.environ.get("FLASHINFER_AOT_MODULES"), extra_env=build_env,
               workspace=stage / AOT_CACHE)
    _check(session, outdir, version, sdists=True)
    roots = wheel_index.write_index(outdir, stage / "whl")
    wheels, _ = wheel_check.files_of(outdir, version)
    label = next(wheel_check.parse_wheel_filename(w.name)[1].local for w in wheels
                 if wheel_check.parse_wheel_filename(w.name)[0] == wheel_check.JIT_CACHE)
    index = roots[label].resolve().as_uri() + "/"
    session.log(f"index of the staged set: {index}")

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
    session.run(python, "-m", "pip", "install", "-q", "--no-deps", TRACE_CHECKER, external=True)
    session.run(python, "-m", "pytest", "tests", "-q", external=True,
                env={"FLASHINFER_TEST_WHEELHOUSE": str(outdir), **env["tests"]})
    to_commit = _promote(session, version, stage)
    session.log(f"released {version}: {DIST} (index {DIST / 'whl' / label}/)")
    session.log(_commit_advice(version, to_commit))

"""The release flow of noxfile.py and tools/nox_artifacts.py, on throwaway git repositories with
the expensive steps (torch, cubins, AOT, pip, pytest) replaced: ``release`` refuses a dirty tree
and a published version (saying what to do), a failed release leaves nothing that blocks the
retry, a successful one moves the tested set into dist/ and says what to commit; the lock keeps
its bytes when a release is re-run and names no path of the build machine; ``pin`` refuses a
version spelled outside version.txt (leaving the tree as it was), and the version argument must
be a public X.Y.Z. The real flow, CI-sized, is ``nox -s tests``' release check."""

from __future__ import annotations

import calendar
import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("nox")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import noxfile  # noqa: E402

nox_artifacts = sys.modules["nox_artifacts"]  # imported by noxfile, from tools/


class Refused(Exception):
    pass


class FakeSession:
    """What the guards use of a nox session: ``error`` stops them."""

    name = "release"

    def __init__(self, posargs=()):
        self.posargs = list(posargs)
        self.logged: list[str] = []

    def error(self, message):
        raise Refused(message)

    def log(self, message):
        self.logged.append(message)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                   cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A committed tree with version.txt and one package that reads it."""
    (tmp_path / "version.txt").write_text("1.0.0\n")
    pyproject = tmp_path / "packages" / "p" / "pyproject.toml"
    pyproject.parent.mkdir(parents=True)
    pyproject.write_text('[project]\nname = "p"\ndynamic = ["version"]\n')
    (tmp_path / ".gitignore").write_text("/dist/\n/build/\n")  # as the real one
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "init")
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)
    monkeypatch.setattr(noxfile, "DIST", tmp_path / "dist")
    return tmp_path


def test_release_refuses_a_dirty_tree(repo):
    noxfile._refuse_dirty(FakeSession(), "1.0.0")  # clean: no error
    (repo / "notes.txt").write_text("uncommitted")
    with pytest.raises(Refused, match=r"the tree is dirty \(notes.txt\).*commit or stash"):
        noxfile._refuse_dirty(FakeSession(), "1.0.0")


def test_what_a_release_of_this_version_leaves_does_not_make_the_tree_dirty(repo):
    """A failed release of 1.2.3 leaves version.txt = 1.2.3; a successful one also its lock.
    Neither blocks running the release of 1.2.3 again; both block a release of another version,
    and so does a version.txt that holds another version."""
    (repo / "version.txt").write_text("1.2.3\n")
    lock = repo / "artifacts" / "releases" / "1.2.3.json"
    lock.parent.mkdir(parents=True)
    lock.write_text("{}")
    noxfile._refuse_dirty(FakeSession(), "1.2.3")
    with pytest.raises(Refused, match="version.txt, artifacts/releases/1.2.3.json"):
        noxfile._refuse_dirty(FakeSession(), "1.2.4")
    lock.unlink()
    (repo / "version.txt").write_text("1.2.2\n")
    with pytest.raises(Refused, match=r"dirty \(version.txt\)"):
        noxfile._refuse_dirty(FakeSession(), "1.2.3")


def test_release_refuses_a_version_already_in_dist_and_says_what_to_do(repo):
    noxfile._refuse_existing(FakeSession(), "1.2.3")  # no dist/ yet
    (repo / "dist").mkdir()
    (repo / "dist" / "flashinfer_python-1.2.2-py3-none-any.whl").write_bytes(b"")
    noxfile._refuse_existing(FakeSession(), "1.2.3")  # another version is fine
    name = "flashinfer_jit_cache-1.2.3+cu130-py3-none-manylinux_2_28_x86_64.whl"
    (repo / "dist" / name).write_bytes(b"")
    with pytest.raises(Refused) as refused:
        noxfile._refuse_existing(FakeSession(), "1.2.3")
    msg = str(refused.value)
    assert "dist/ already holds 1.2.3" in msg and "never overwritten" in msg
    assert "bump the version (nox -s release -- <next X.Y.Z>)" in msg
    assert msg.endswith(f"rm dist/{name}")


def test_build_never_replaces_a_release_of_its_version(repo):
    noxfile._refuse_released(FakeSession(), "1.2.3")  # nothing there
    (repo / "dist").mkdir()
    (repo / "dist" / "flashinfer_python-1.2.3-py3-none-any.whl").write_bytes(b"")
    noxfile._refuse_released(FakeSession(), "1.2.3")  # a development build: replaced
    lock = repo / "artifacts" / "releases" / "1.2.3.json"
    lock.parent.mkdir(parents=True)
    lock.write_text("{}")
    with pytest.raises(Refused, match=r"dist/ holds the release of 1\.2\.3 .*nox -s pin"):
        noxfile._refuse_released(FakeSession(), "1.2.3")


def test_build_compiles_into_a_cache_that_outlives_the_nox_session(repo, monkeypatch, tmp_path):
    """`nox -s build` (no -r) gets a fresh session directory each time; its AOT modules go to
    build/aot-cache, so a second build compiles only what changed."""
    monkeypatch.setattr(noxfile, "BUILD_AOT_CACHE", repo / "build" / "aot-cache")
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE", raising=False)
    workspaces = []

    class BuildSession(FakeSession):
        def create_tmp(self):
            return str(tmp_path / f"session-{len(workspaces)}")

        def run(self, *args, **kwargs):
            workspaces.append(kwargs["env"]["FLASHINFER_WORKSPACE_BASE"])

    for _ in range(2):
        noxfile._build_set(BuildSession(), repo / "dist", sdists=False, archs="9.0a",
                           modules=None)
    assert set(workspaces) == {str(repo / "build" / "aot-cache")}
    assert len(workspaces) == 2 * len(noxfile.PACKAGES)


# ----------------------------------------------------------------------------------------------
# The whole release session, its expensive steps replaced


class ReleaseSession(FakeSession):
    """A nox session for ``noxfile.release``: installs nothing, and of the commands it runs only
    answers ``flashinfer show-config`` (as an installed jit-cache in use would)."""

    def __init__(self, version, tmp):
        super().__init__([version])
        self.tmp, self.env, self.runs = tmp, {}, []

    def install(self, *args):
        pass

    def warn(self, message):
        self.logged.append(message)

    def create_tmp(self):
        self.tmp.mkdir(parents=True, exist_ok=True)
        return str(self.tmp)

    def run(self, *args, **kwargs):
        self.runs.append((args, kwargs))
        if args[-1] == "show-config":
            return (f"=== JIT Cache Wheel ===\nflashinfer-jit-cache: {self.posargs[0]}+cu130\n"
                    "status: used\n=== next ===")
        return ""


SET_FILES = ["flashinfer_python-{v}-py3-none-any.whl", "flashinfer_cubin-{v}-py3-none-any.whl",
             "flashinfer_jit_cache-{v}+cu130-py3-none-manylinux_2_28_x86_64.whl",
             "flashinfer_python-{v}.tar.gz"]


@pytest.fixture
def release_flow(repo, monkeypatch, tmp_path):
    """noxfile.release on ``repo`` with fakes: the artifact steps stage a lock (local-only), the
    build writes empty files of the set unless ``state.fail`` names the step that fails."""
    state = SimpleNamespace(fail=None, built_with=[])
    monkeypatch.setattr(noxfile, "RELEASE_STAGE", repo / "build" / "release")
    for name in ("_install_torch", "_install_from"):
        monkeypatch.setattr(noxfile, name, lambda *a, **k: None)
    monkeypatch.setattr(noxfile, "_check", lambda *a, **k: None)
    monkeypatch.setattr(noxfile.wheel_index, "write_index",
                        lambda dist, out: {"cu130": out / "cu130"})

    def artifacts(session, version, lock):
        lock.write_text(json.dumps({"release": version, "manifest_sha256": "c" * 64,
                                    "repositories": []}) + "\n")
        return {"build": {"FLASHINFER_CUBIN_RELEASE": "/staging"},
                "tests": {"FLASHINFER_CUBINS_REPOSITORY": "/published"}}

    def build_set(session, outdir, **kw):
        state.built_with.append(kw["extra_env"])
        if state.fail == "build":
            raise Refused("the AOT build failed")
        for f in SET_FILES:
            (outdir / f.format(v=session.posargs[0])).write_bytes(b"")

    monkeypatch.setattr(noxfile, "_release_artifacts", artifacts)
    monkeypatch.setattr(noxfile, "_build_set", build_set)

    def release(version):
        session = ReleaseSession(version, tmp_path / "session-tmp")
        noxfile.release(session)
        return session

    state.release = release
    return state


def test_a_failed_release_leaves_nothing_that_blocks_the_retry(repo, release_flow):
    release_flow.fail = "build"
    with pytest.raises(Refused, match="AOT build failed"):
        release_flow.release("1.2.3")
    assert not (repo / "dist").exists() or not list((repo / "dist").iterdir())
    assert not (repo / "artifacts" / "releases" / "1.2.3.json").exists()  # staged only
    assert (repo / "build" / "release" / "1.2.3" / "lock.json").is_file()
    release_flow.fail = None
    session = release_flow.release("1.2.3")  # the retry runs through
    assert any("removing what an unfinished release of 1.2.3 left" in m for m in session.logged)
    assert sorted(p.name for p in (repo / "dist").iterdir()) == sorted(
        f.format(v="1.2.3") for f in SET_FILES)
    # The wheels were built pinning the staged lock, with the cubin release.
    env = release_flow.built_with[-1]
    assert env["FLASHINFER_ARTIFACT_LOCK"].endswith("build/release/1.2.3/lock.json")
    assert env["FLASHINFER_CUBIN_RELEASE"] == "/staging"
    # The tests of the installed set find the cubins through an explicit setting.
    (args, kwargs), = [r for r in session.runs if r[0][1:3] == ("-m", "pytest")]
    assert kwargs["env"]["FLASHINFER_CUBINS_REPOSITORY"] == "/published"


def test_a_successful_release_says_what_to_commit_and_a_second_one_is_refused(repo, release_flow):
    session = release_flow.release("1.2.3")
    lock = repo / "artifacts" / "releases" / "1.2.3.json"
    assert json.loads(lock.read_text())["manifest_sha256"] == "c" * 64
    assert not (repo / "build" / "release" / "1.2.3").exists()
    assert session.logged[-1] == (
        "commit what the release wrote (the lock is what a rebuild of 1.2.3 must pin): "
        "git add artifacts/releases/1.2.3.json version.txt && git commit -m 'release 1.2.3'")
    with pytest.raises(Refused, match="never overwritten"):
        release_flow.release("1.2.3")
    # Committed, and dist/ emptied (a fresh clone): the release runs again, and the committed
    # lock, whose content the new one repeats, keeps its bytes; nothing is left to commit.
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "release 1.2.3")
    before = lock.read_bytes()
    shutil.rmtree(repo / "dist")
    session = release_flow.release("1.2.3")
    assert lock.read_bytes() == before
    assert session.logged[-1].startswith("nothing to commit")


REAL_BUILD_SET = noxfile._build_set


def test_a_retried_release_reuses_the_aot_modules_of_the_failed_attempt(repo, release_flow,
                                                                         monkeypatch, tmp_path):
    """The AOT build cache lives in build/release/X.Y.Z/aot-cache, which a failed attempt
    leaves and the retry keeps (each attempt here gets a fresh session directory, as nox
    without -r): a tiny fake module set, "compiled" by the jit-cache build into
    FLASHINFER_WORKSPACE_BASE under a key of its sources, as the JIT cache is. The retry
    compiles only what the failure stopped and what changed; success removes the cache."""
    monkeypatch.setattr(noxfile, "_build_set", REAL_BUILD_SET)
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE", raising=False)
    sources = {"norm": "v1", "rope": "v1", "scale": "does not compile"}
    compiled, workspaces = [], set()

    class BuildSession(ReleaseSession):
        def run(self, *args, **kwargs):
            if args[:3] != ("python", "-m", "build"):
                return super().run(*args, **kwargs)
            package, outdir = Path(args[-1]).name, Path(args[args.index("--outdir") + 1])
            if package == "flashinfer-jit-cache":
                base = Path(kwargs["env"]["FLASHINFER_WORKSPACE_BASE"])
                workspaces.add(base)
                for name, src in sources.items():
                    so = base / "cached_ops" / f"{name}_{src.replace(' ', '-')}" / f"{name}.so"
                    if so.is_file():
                        continue
                    if src == "does not compile":
                        raise Refused(f"the AOT build failed: {name}")
                    compiled.append(name)
                    so.parent.mkdir(parents=True)
                    so.write_bytes(b"")
            for f in SET_FILES:
                if f.startswith(package.replace("-", "_")):
                    (outdir / f.format(v=self.posargs[0])).write_bytes(b"")
            return ""

    with pytest.raises(Refused, match="AOT build failed: scale"):
        noxfile.release(BuildSession("1.2.3", tmp_path / "attempt-1"))
    assert compiled == ["norm", "rope"]
    sources.update(scale="v1", rope="v2")  # the fix, and an edit on the way
    session = BuildSession("1.2.3", tmp_path / "attempt-2")
    noxfile.release(session)
    assert compiled == ["norm", "rope", "rope", "scale"]  # norm was reused
    assert workspaces == {repo / "build" / "release" / "1.2.3" / "aot-cache"}
    assert any("keeping its AOT build cache" in m for m in session.logged)
    assert sorted(p.name for p in (repo / "dist").iterdir()) == sorted(
        f.format(v="1.2.3") for f in SET_FILES)
    assert not (repo / "build" / "release" / "1.2.3").exists()


# ----------------------------------------------------------------------------------------------
# The lock (tools/nox_artifacts.py)


@pytest.fixture
def locks(tmp_path, monkeypatch):
    monkeypatch.setattr(nox_artifacts, "LOCKS", tmp_path / "releases")
    return tmp_path / "releases"


def test_rerunning_never_rewrites_the_lock_of_identical_content(locks, monkeypatch):
    path = nox_artifacts.write_lock("1.2.3", "a" * 64, [], "2026-01-01T00:00:00Z")
    first = path.read_bytes()
    gmtime = time.gmtime
    monkeypatch.setattr(nox_artifacts.time, "gmtime", lambda *a: gmtime(10**9))  # "later"
    assert nox_artifacts.write_lock("1.2.3", "a" * 64, [], "2026-01-01T00:00:00Z").read_bytes() \
        == first
    staged = locks.parent / "staged.json"
    nox_artifacts.write_lock("1.2.3", "a" * 64, [], "2026-01-01T00:00:00Z", dest=staged)
    assert staged.read_bytes() == first
    # Other repositories: a new lock (new timestamp); other cubins: refused, with what to do.
    nox_artifacts.write_lock("1.2.3", "a" * 64, ["https://example.invalid/r"],
                             "2026-01-01T00:00:00Z")
    assert json.loads(path.read_text())["published"] == "2001-09-09T01:46:40Z"
    with pytest.raises(SystemExit, match=r"immutable; release a new version"):
        nox_artifacts.write_lock("1.2.3", "b" * 64, [], "2026-01-01T00:00:00Z")


def test_a_lock_names_public_urls_or_says_local_only(locks):
    doc = json.loads(nox_artifacts.write_lock("1.2.3", "a" * 64, [], "x").read_text())
    assert doc["repositories"] == [] and doc["local_only"].startswith("local-only release")
    assert nox_artifacts.public_repositories(" https://a.example/r, s3://b/p ") == [
        "https://a.example/r", "s3://b/p"]
    assert nox_artifacts.public_repositories(None) == []
    for path in ("/work/dist/artifacts", "file:///work/dist/artifacts", "dist/artifacts"):
        with pytest.raises(SystemExit, match="never name a path of the machine"):
            nox_artifacts.public_repositories(path)


class StepsSession(ReleaseSession):
    """For ``release_steps``: cubin_build writes a manifest into the staging repository."""

    virtualenv = SimpleNamespace(venv_backend="venv")

    def run(self, *args, **kwargs):
        self.runs.append((args, kwargs))
        if any(str(a).endswith("cubin_build.py") for a in args):
            m = nox_artifacts.STAGING / "releases" / self.posargs[0] / "manifest.json"
            m.parent.mkdir(parents=True, exist_ok=True)
            m.write_text(json.dumps({"release": self.posargs[0], "created": "2026-02-03T04:05:06Z"}))
        return ""


def test_release_steps_never_record_the_build_machines_path(locks, tmp_path, monkeypatch):
    """The lock the wheels pin: local-only (and the log says so) unless public URLs are
    configured; the tests get the publish repository explicitly. Before: the lock named the
    absolute dist/artifacts path as where users download from."""
    monkeypatch.setattr(nox_artifacts, "STAGING", tmp_path / "staging")
    monkeypatch.delenv("FLASHINFER_PUBLISH_REPOSITORY", raising=False)
    monkeypatch.delenv("FLASHINFER_PUBLIC_REPOSITORIES", raising=False)
    session = StepsSession("1.2.3", tmp_path / "t")
    env = nox_artifacts.release_steps(session, "1.2.3", tmp_path / "lock.json")
    text = (tmp_path / "lock.json").read_text()
    assert str(nox_artifacts.ROOT) not in text and json.loads(text)["repositories"] == []
    assert json.loads(text)["manifest_created"] == "2026-02-03T04:05:06Z"
    assert any("LOCAL-ONLY" in m for m in session.logged)
    assert env["tests"] == {"FLASHINFER_CUBINS_REPOSITORY": str(nox_artifacts.DEFAULT_REPOSITORY)}
    assert not (locks / "1.2.3.json").exists()  # only the staged copy
    monkeypatch.setenv("FLASHINFER_PUBLIC_REPOSITORIES", "https://cubins.example/fi")
    nox_artifacts.release_steps(session, "1.2.3", tmp_path / "lock.json")
    assert json.loads((tmp_path / "lock.json").read_text())["repositories"] == [
        "https://cubins.example/fi"]
    # A committed lock of this version: the cubin build reuses its manifest creation time, so
    # identical cubins give an identical manifest (and the same sha256).
    locks.mkdir()
    (locks / "1.2.3.json").write_text(json.dumps({"release": "1.2.3", "manifest_sha256": "0" * 64,
                                                  "manifest_created": "2026-02-03T04:05:06Z"}))
    with pytest.raises(SystemExit, match="immutable"):  # the fake manifest is another one
        nox_artifacts.release_steps(session, "1.2.3", tmp_path / "lock.json")
    build = [kw for a, kw in session.runs if any(str(x).endswith("cubin_build.py") for x in a)]
    assert build[-1]["env"]["SOURCE_DATE_EPOCH"] == str(calendar.timegm((2026, 2, 3, 4, 5, 6)))


# ----------------------------------------------------------------------------------------------
# The release check of ``nox -s tests`` judges a finished release by this


def test_release_check_problems(repo):
    assert noxfile.release_check_problems(repo, "1.2.3", "") != []
    (repo / "version.txt").write_text("1.2.3\n")
    lock = repo / "artifacts" / "releases" / "1.2.3.json"
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"repositories": [], "local_only": "local-only release: ..."}))
    (repo / "dist").mkdir()
    core = repo / "dist" / "flashinfer_python-1.2.3-py3-none-any.whl"
    with zipfile.ZipFile(core, "w") as zf:
        zf.writestr("flashinfer/_artifact_pin.py", "REPOSITORIES = ()\nLOCAL_ONLY = 'local'\n")
    log = ("... LOCAL-ONLY release ... git add artifacts/releases/1.2.3.json version.txt && "
           "git commit -m 'release 1.2.3'")
    assert noxfile.release_check_problems(repo, "1.2.3", log) == []
    lock.write_text(json.dumps({"repositories": [str(repo / "dist" / "artifacts")]}))
    (problem,) = noxfile.release_check_problems(repo, "1.2.3", log)
    assert "names a path of the build machine" in problem


def test_pin_writes_version_txt_only_when_nothing_else_spells_it(repo):
    session = FakeSession()
    noxfile._pin(session, "1.2.3")
    assert (repo / "version.txt").read_text() == "1.2.3\n"
    (repo / "packages" / "p" / "setup.cfg").write_text("version = 1.2.4\n")
    (repo / "packages" / "p" / "other.txt").write_text("needs 11.2.4 and 1.2.40\n")  # not 1.2.4
    _git(repo, "add", ".")
    with pytest.raises(Refused, match=r"1\.2\.4 must live in version.txt only; also in: "
                                      r"packages/p/setup.cfg:1$"):
        noxfile._pin(session, "1.2.4")
    assert (repo / "version.txt").read_text() == "1.2.3\n"  # a refused pin changes nothing


@pytest.mark.parametrize("arg", ["1.2", "1.2.3+cu130", "v1.2.3", "1.2.3.4", "latest"])
def test_version_argument_must_be_a_public_x_y_z(arg):
    with pytest.raises(Refused, match="version must be"):
        noxfile._version_arg(FakeSession([arg]))


def test_version_argument_accepts_releases_and_pre_releases():
    assert noxfile._version_arg(FakeSession(["1.2.3"])) == "1.2.3"
    assert noxfile._version_arg(FakeSession(["1.2.3rc1"])) == "1.2.3rc1"
    with pytest.raises(Refused, match="usage: nox -s release -- X.Y.Z"):
        noxfile._version_arg(FakeSession([]))


def test_the_release_check_runs_a_failing_release_its_retry_and_a_refused_repeat(
        monkeypatch, tmp_path):
    """``nox -s tests``' release check, its nox runs answered: the order, the flags (``-r``
    before ``--``: after it, it would be a second version argument) and what it checks."""
    calls = []

    class CheckSession(ReleaseSession):
        def run(self, *args, env=None, success_codes=None, silent=False, external=False):
            if args[:2] == ("git", "clone"):
                Path(args[-1]).mkdir(parents=True)
                (Path(args[-1]) / "version.txt").write_text("1.0.0\n")
                return ""
            calls.append((args, env, success_codes))
            assert args[-2:] == ("--", "101.0.0") and args[:2] == ("nox", "-f")
            if env["FLASHINFER_AOT_MODULES"] == "no_such_module":
                return "FLASHINFER_AOT_MODULES names unknown modules ['no_such_module']"
            if len(calls) == 2:
                return "released"
            return "dist/ already holds 101.0.0 (...): a published release is never overwritten. " \
                   "To release again, bump the version (...)"

    judged = []
    monkeypatch.setattr(noxfile, "release_check_problems",
                        lambda clone, version, log: judged.append((version, log)) or [])
    session = CheckSession("1.0.0", tmp_path / "t")
    noxfile._release_check(session)
    assert [c[0][5:-2] for c in calls] == [(), ("-r",), ("-r",)]
    assert [c[2] for c in calls] == [[1], None, [1]]
    assert all(c[1]["FLASHINFER_CUDA_ARCH_LIST"] == "9.0a" and c[1]["FLASHINFER_CUBIN_ARCHS"] ==
               "9.0a" and c[1]["FLASHINFER_PUBLIC_REPOSITORIES"] == "" for c in calls)
    assert [c[1]["FLASHINFER_AOT_MODULES"] for c in calls] == ["no_such_module", "scale", "scale"]
    assert judged == [("101.0.0", "released")]
    assert session.logged[-1].startswith("release check: 101.0.0 released after a failed attempt")


def test_the_release_checks_version_is_one_its_pin_accepts():
    """In this repository: the release check's version is spelled by no tracked file (else its
    release would be refused at the pin), and is not version.txt's (whose lock may exist)."""
    version = (ROOT / "version.txt").read_text().strip()
    check = noxfile.check_version(version)
    assert check != version and noxfile._spelled_elsewhere(check) == []
    assert noxfile.check_version("1.2.3rc1") == "101.2.3" and noxfile.check_version("0.1.0") == "100.1.0"


def test_the_readme_release_of_version_txt_passes_its_pin():
    """The README's main job releases version.txt's version: no tracked file may spell it (a
    doc example once did, and the release stopped at its pin on a fresh clone)."""
    version = (ROOT / "version.txt").read_text().strip()
    assert noxfile._spelled_elsewhere(version) == []

"""The flashinfer-cubin wheel: built hermetically from a verified release, preferred at run time,
and enough on its own (no download, no network) when it is installed. Also the pin that the
flashinfer-python build writes."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from artifacthelpers import make_release, pin, run_cli

from flashinfer import _versions
from flashinfer.artifacts import get_cubin, resolve
from flashinfer.artifacts.manifest import ManifestError, check_path
from flashinfer.artifacts.resolve import CubinWheel, Release, cubin_wheel_for

pytest.importorskip("hatchling", reason="building the wheel needs hatchling (nox -s tests has it)")

ROOT = Path(__file__).resolve().parents[2]
FILES = {"sm_90a/norm/a.cubin": 5000, "sm_90a/norm/b.cubin": 3000, "sm_100a/act/c.cubin": 100}


def load_hook(package: str):
    spec = importlib.util.spec_from_file_location(
        f"hook_{package.replace('-', '_')}", ROOT / "packages" / package / "hatch_build.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_wheel(tmp: Path, version: str, env: dict) -> subprocess.CompletedProcess:
    mono = tmp / "mono"
    if not mono.exists():
        shutil.copytree(ROOT / "packages" / "flashinfer-cubin", mono / "packages" / "flashinfer-cubin",
                        ignore=shutil.ignore_patterns("release", "_build_meta.py", "__pycache__"))
        (mono / "version.txt").write_text(version + "\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_CUBIN")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp / "wheels"), str(mono / "packages" / "flashinfer-cubin")],
        env=full, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def cubin_wheel(tmp_path_factory):
    """The flashinfer-cubin wheel of a synthetic release 7.7.7, installed into a directory."""
    tmp = tmp_path_factory.mktemp("cubin-wheel")
    rel = make_release(tmp / "repo", "7.7.7", FILES)
    r = build_wheel(tmp, "7.7.7", {"FLASHINFER_CUBIN_RELEASE": str(rel.root),
                                   "FLASHINFER_CUBIN_MANIFEST_SHA256": rel.sha256})
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp / "wheels").glob("flashinfer_cubin-7.7.7-*.whl")
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True)
    return rel, wheel, site


def test_the_wheel_holds_every_file_and_the_manifest(cubin_wheel):
    rel, wheel, site = cubin_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in FILES:
        assert f"flashinfer_cubin/release/files/{path}" in names
    assert "flashinfer_cubin/release/manifest.json" in names
    assert (site / "flashinfer_cubin/release/manifest.json").read_bytes() == rel.data
    ns: dict = {}
    exec((site / "flashinfer_cubin/_build_meta.py").read_text(), ns)
    assert (ns["RELEASE_VERSION"], ns["MANIFEST_SHA256"]) == ("7.7.7", rel.sha256)
    meta = zipfile.ZipFile(wheel).read("flashinfer_cubin-7.7.7.dist-info/METADATA").decode()
    assert "Requires-Dist: flashinfer-python==7.7.7" in meta


def test_offline_with_the_wheel_nothing_is_missing(cubin_wheel, tmp_path):
    rel, _, site = cubin_wheel
    env = {"PYTHONPATH": str(site), "FLASHINFER_NO_DOWNLOAD": "1",
           "FLASHINFER_CUBIN_DIR": str(tmp_path / "empty-store")}
    r = run_cli("artifacts", "status", "--version", "7.7.7", "--manifest-sha256", rel.sha256, env=env)
    assert r.returncode == 0, r.stderr
    assert "in flashinfer-cubin: 3" in r.stdout and "missing: 0" in r.stdout
    r = run_cli("list-cubins", "--version", "7.7.7", "--manifest-sha256", rel.sha256, env=env)
    assert r.returncode == 0 and r.stdout.count("wheel ") == 3


def test_get_cubin_is_served_by_the_wheel_without_any_socket(cubin_wheel, tmp_path):
    rel, _, site = cubin_wheel
    code = f"""
import socket
def no_network(*a, **k):
    raise AssertionError("socket opened")
socket.socket.connect = no_network
from flashinfer.artifacts import get_cubin, Release
release = Release("7.7.7", "{rel.sha256}")
for path in {sorted(FILES)!r}:
    blob = get_cubin(path, release)
    assert "flashinfer_cubin" in blob.source, blob.source
print("ok")
"""
    import flashinfer

    env = dict(os.environ, FLASHINFER_NO_DOWNLOAD="1", FLASHINFER_CUBIN_DIR=str(tmp_path / "s"),
               PYTHONPATH=os.pathsep.join([str(site), str(Path(flashinfer.__file__).parents[1])]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_the_runtime_prefers_the_wheel(monkeypatch, tmp_path):
    rel = make_release(tmp_path / "repo", "7.7.7", FILES)
    pin(monkeypatch, rel.release)
    root = tmp_path / "wheel-release"
    (root / "files" / "sm_90a/norm").mkdir(parents=True)
    (root / "manifest.json").write_bytes(rel.data)
    (root / "files" / "sm_90a/norm/a.cubin").write_bytes(rel.files["sm_90a/norm/a.cubin"])
    wheel = CubinWheel("7.7.7", "7.7.7", rel.sha256, root)
    monkeypatch.setattr(resolve, "installed_cubin_wheel", lambda: wheel)
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")
    assert get_cubin("sm_90a/norm/a.cubin").source.startswith(str(root))
    # A corrupt copy in the wheel is not used (here: nothing else is available offline).
    (root / "files" / "sm_90a/norm/a.cubin").write_bytes(b"0" * 5000)
    from flashinfer.artifacts import OfflineError

    with pytest.raises(OfflineError):
        get_cubin("sm_90a/norm/a.cubin")


def test_a_wheel_of_another_release_is_ignored_with_one_warning(monkeypatch, tmp_path):
    import warnings

    release = Release("7.7.8", "a" * 64)
    pin(monkeypatch, release)  # the mismatch is with the release this build pins
    monkeypatch.setattr(resolve, "_WARNED", set())
    other = CubinWheel("7.7.7", "7.7.7", "b" * 64, tmp_path)
    monkeypatch.setattr(resolve, "installed_cubin_wheel", lambda: other)
    with pytest.warns(_versions.VersionMismatchWarning) as caught:
        for _ in range(3):
            assert cubin_wheel_for(release) is None  # ignored, never an error
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "flashinfer-cubin 7.7.7" in msg and "artifact release 7.7.8" in msg
    assert "pip install --force-reinstall --no-deps 'flashinfer-cubin==7.7.8'" in msg
    # FLASHINFER_DISABLE_VERSION_CHECK=1: silent, and the wheel is still not used.
    monkeypatch.setattr(resolve, "_WARNED", set())
    monkeypatch.setenv("FLASHINFER_DISABLE_VERSION_CHECK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cubin_wheel_for(release) is None
    # A wheel of another version whose manifest IS the pinned one serves (a post-release of
    # flashinfer-python pins the same cubins), with or without the check.
    same = CubinWheel("7.7.7", "7.7.7", "a" * 64, tmp_path)
    monkeypatch.setattr(resolve, "installed_cubin_wheel", lambda: same)
    assert cubin_wheel_for(release) is same
    monkeypatch.delenv("FLASHINFER_DISABLE_VERSION_CHECK")
    assert cubin_wheel_for(release) is same
    # An empty development wheel is neither used nor warned about.
    empty = CubinWheel("7.7.8", None, None, tmp_path)
    monkeypatch.setattr(resolve, "installed_cubin_wheel", lambda: empty)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cubin_wheel_for(release) is None


def test_an_installed_wheel_of_another_release_never_breaks_the_ops(cubin_wheel, tmp_path):
    """The real wheel (release 7.7.7) installed, flashinfer pinned to 7.7.8: import is silent,
    get_cubin warns once, names both versions and the fix, and serves the file from the
    repository instead; FLASHINFER_DISABLE_VERSION_CHECK=1 silences the warning.

    The child pins 7.7.8 the way a built wheel does (its ``_artifact_pin``), so the test holds
    whether the flashinfer under test pins a release of its own (a release build, or CI once a
    lock is committed) or none (a development build): FLASHINFER_CUBIN_MANIFEST_SHA256 would
    only count in the latter."""
    _, _, site = cubin_wheel
    nxt = make_release(tmp_path / "next", "7.7.8", FILES)
    code = f"""
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as at_import:
    import flashinfer, flashinfer.artifacts
from types import SimpleNamespace
from flashinfer.artifacts import Release, get_cubin, resolve
resolve._build_pin = lambda: SimpleNamespace(
    RELEASE_VERSION="7.7.8", MANIFEST_SHA256="{nxt.sha256}", REPOSITORIES=())
with warnings.catch_warnings(record=True) as caught:
    sources = [get_cubin(p, Release("7.7.8", "{nxt.sha256}")).source for p in {sorted(FILES)!r}]
print("RESULT " + json.dumps({{"import": len(at_import), "sources": sources,
    "warnings": [(w.category.__name__, str(w.message)) for w in caught]}}))
"""
    import flashinfer

    base = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    base.update(FLASHINFER_CUBINS_REPOSITORY=str(nxt.root),
                PYTHONPATH=os.pathsep.join([str(site), str(Path(flashinfer.__file__).parents[1])]))
    for disabled in (False, True):
        env = dict(base, FLASHINFER_CUBIN_DIR=str(tmp_path / f"store-{disabled}"))
        if disabled:
            env["FLASHINFER_DISABLE_VERSION_CHECK"] = "1"
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        result = json.loads(r.stdout.split("RESULT ", 1)[1])
        assert result["import"] == 0
        assert all("flashinfer_cubin" not in s for s in result["sources"]), result
        if disabled:
            assert result["warnings"] == []
            continue
        (category, message), = result["warnings"]
        assert category == "VersionMismatchWarning"
        assert "flashinfer-cubin 7.7.7" in message and "release 7.7.8" in message
        assert "pip install --force-reinstall --no-deps 'flashinfer-cubin==7.7.8'" in message


def test_the_build_refuses_a_release_that_is_not_the_pinned_one(tmp_path):
    rel = make_release(tmp_path / "repo", "7.7.7", FILES)
    r = build_wheel(tmp_path, "7.7.7", {"FLASHINFER_CUBIN_RELEASE": str(rel.root),
                                        "FLASHINFER_CUBIN_MANIFEST_SHA256": "0" * 64})
    assert r.returncode != 0 and "pinned" in (r.stderr + r.stdout)
    assert not list(tmp_path.glob("wheels/*.whl"))


def test_the_build_refuses_a_file_that_does_not_verify(tmp_path):
    rel = make_release(tmp_path / "repo", "7.7.7", FILES)
    obj = rel.root / rel.entry("sm_90a/norm/b.cubin").object_path
    obj.write_bytes(b"1" * 3000)
    r = build_wheel(tmp_path, "7.7.7", {"FLASHINFER_CUBIN_RELEASE": str(rel.root),
                                        "FLASHINFER_CUBIN_MANIFEST_SHA256": rel.sha256})
    assert r.returncode != 0 and "b.cubin" in (r.stderr + r.stdout)
    staged = tmp_path / "mono/packages/flashinfer-cubin/flashinfer_cubin"
    assert not (staged / "release").exists() and not (staged / "release.partial").exists()


def test_without_a_release_the_wheel_is_empty_and_says_so(tmp_path):
    r = build_wheel(tmp_path, "7.7.9", {})
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    z = zipfile.ZipFile(wheel)
    assert not [n for n in z.namelist() if "/release/" in n]
    ns: dict = {}
    exec(z.read("flashinfer_cubin/_build_meta.py").decode(), ns)
    assert (ns["__version__"], ns["RELEASE_VERSION"], ns["MANIFEST_SHA256"]) == ("7.7.9", None, None)


@pytest.mark.parametrize("path", ["a/b.cubin", "sm_90a/x_1.cubin", "../a", "/a", "a/../b", ".x",
                                  "a\\b", "a//b", "C:x", ""])
def test_the_hook_path_rule_is_the_manifest_rule(path):
    hook = load_hook("flashinfer-cubin")
    try:
        check_path(path)
        ok = True
    except ManifestError:
        ok = False
    try:
        hook.safe_path(path)
        hook_ok = True
    except hook.CubinBuildError:
        hook_ok = False
    assert ok == hook_ok


def test_flashinfer_python_build_pins_the_lock(tmp_path, monkeypatch):
    hook = load_hook("flashinfer-python")
    pkg = tmp_path / "packages" / "flashinfer-python"
    (pkg / "flashinfer").mkdir(parents=True)
    monkeypatch.delenv("FLASHINFER_ARTIFACT_LOCK", raising=False)
    hook.write_artifact_pin(pkg, "3.2.1")
    text = (pkg / "flashinfer/_artifact_pin.py").read_text()
    assert "MANIFEST_SHA256 = None" in text
    lock = tmp_path / "artifacts" / "releases" / "3.2.1.json"
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"release": "3.2.1", "manifest_sha256": "c" * 64,
                                "repositories": ["https://example.invalid/r"]}))
    hook.write_artifact_pin(pkg, "3.2.1")
    ns: dict = {}
    exec((pkg / "flashinfer/_artifact_pin.py").read_text(), ns)
    assert ns["MANIFEST_SHA256"] == "c" * 64 and ns["RELEASE_VERSION"] == "3.2.1"
    assert ns["REPOSITORIES"] == ("https://example.invalid/r",) and ns["LOCAL_ONLY"] is None
    # A local-only release: no repository, and the pin says so.
    lock.write_text(json.dumps({"release": "3.2.1", "manifest_sha256": "c" * 64,
                                "repositories": [], "local_only": "local-only release: ..."}))
    hook.write_artifact_pin(pkg, "3.2.1")
    ns = {}
    exec((pkg / "flashinfer/_artifact_pin.py").read_text(), ns)
    assert ns["REPOSITORIES"] == () and ns["LOCAL_ONLY"] == "local-only release: ..."
    # A path of the build machine is never recorded as where users download from.
    for where in (str(tmp_path / "dist" / "artifacts"), "file:///srv/dist/artifacts"):
        lock.write_text(json.dumps({"release": "3.2.1", "manifest_sha256": "c" * 64,
                                    "repositories": [where]}))
        with pytest.raises(ValueError, match="a path of the machine that built it"):
            hook.write_artifact_pin(pkg, "3.2.1")
    lock.write_text(json.dumps({"release": "3.2.0", "manifest_sha256": "c" * 64}))
    with pytest.raises(ValueError, match="3.2.0"):
        hook.write_artifact_pin(pkg, "3.2.1")


def test_sdist_carries_the_verified_release_and_rebuilds_offline(tmp_path):
    """python -m build makes the wheel from the sdist: the sdist holds the verified release, and
    the wheel built from it (no repository, no monorepo) re-verifies it against the pin."""
    rel = make_release(tmp_path / "repo", "7.7.7", FILES)
    build_wheel(tmp_path, "7.7.7", {})  # lays out the monorepo copy
    pkg = tmp_path / "mono" / "packages" / "flashinfer-cubin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_CUBIN")}
    env.update(FLASHINFER_CUBIN_RELEASE=str(rel.root), FLASHINFER_CUBIN_MANIFEST_SHA256=rel.sha256)
    subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d",
                    str(tmp_path / "sdist")], cwd=pkg, env=env, check=True, capture_output=True)
    (sdist,) = (tmp_path / "sdist").glob("*.tar.gz")
    import tarfile

    unpacked = tmp_path / "unpacked"
    with tarfile.open(sdist) as tf:
        try:
            tf.extractall(unpacked, filter="data")
        except TypeError:  # Python without extraction filters
            tf.extractall(unpacked)
    src = unpacked / "flashinfer_cubin-7.7.7"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_CUBIN")}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path / "w2"), str(src)],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp_path / "w2").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert all(f"flashinfer_cubin/release/files/{p}" in names for p in FILES)
    # Tampering with the bundled copy makes the sdist unbuildable.
    (src / "flashinfer_cubin/release/files/sm_90a/norm/b.cubin").write_bytes(b"2" * 3000)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path / "w3"), str(src)],
                       env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "b.cubin" in r.stderr + r.stdout


def test_a_wheel_of_the_pinned_release_does_not_block_another_release(monkeypatch, tmp_path):
    """With flashinfer-cubin of the pinned release installed, downloading or mirroring another
    release (named with its hash) works: the wheel is just not a source for it."""
    from artifact_server import RepoServer

    from flashinfer.artifacts import download_release
    from flashinfer.artifacts.publish import mirror

    current = make_release(tmp_path / "current", "7.7.7", FILES)
    pin(monkeypatch, current.release)
    wheel = CubinWheel("7.7.7", "7.7.7", current.sha256, tmp_path / "wheel")
    monkeypatch.setattr(resolve, "installed_cubin_wheel", lambda: wheel)
    nxt = make_release(tmp_path / "next", "7.7.8", {"sm_90a/norm/a.cubin": 77})
    with RepoServer(nxt.root) as server:
        counts = download_release(nxt.release, repositories=[server.url])
        assert counts == {"present": 0, "downloaded": 1}
        result = mirror(nxt.release, str(tmp_path / "mirror"), [server.url])
    assert result.uploaded == 1 and result.manifest_sha256 == nxt.sha256
    # For the pinned release, a wheel of another release is ignored with a warning.
    monkeypatch.setattr(resolve, "installed_cubin_wheel",
                        lambda: CubinWheel("7.7.6", "7.7.6", "c" * 64, tmp_path / "wheel"))
    monkeypatch.setattr(resolve, "_WARNED", set())
    with pytest.warns(_versions.VersionMismatchWarning, match="flashinfer-cubin 7.7.6"):
        assert cubin_wheel_for(current.release) is None


def test_a_local_only_release_says_so_when_nothing_can_be_downloaded(monkeypatch, tmp_path):
    """The wheel of a local-only release names no repository; a download without
    FLASHINFER_CUBINS_REPOSITORY says why and what to set."""
    from types import SimpleNamespace

    from flashinfer.artifacts import DownloadError

    rel = make_release(tmp_path / "repo", "7.7.7", FILES)
    monkeypatch.setattr(resolve, "_build_pin", lambda: SimpleNamespace(
        RELEASE_VERSION="7.7.7", MANIFEST_SHA256=rel.sha256, REPOSITORIES=(),
        LOCAL_ONLY="local-only release: published to a directory of the machine that built it"))
    with pytest.raises(DownloadError) as caught:
        get_cubin("sm_90a/norm/a.cubin")
    assert "this build pins a local-only release" in str(caught.value)
    assert "set FLASHINFER_CUBINS_REPOSITORY" in str(caught.value)
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(rel.root))  # the explicit setting
    assert get_cubin("sm_90a/norm/a.cubin").source.startswith(str(tmp_path))

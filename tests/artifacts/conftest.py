"""Fixtures of the artifact tests: synthetic releases, an isolated store, a pinned release, fast
retries, and real loopback servers (tools/artifact_server.py, tools/s3_server.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from artifacthelpers import make_release, pin  # noqa: E402

from flashinfer.artifacts import resolve  # noqa: E402


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test: its own store, no configured repository, no pin (neither from the
    environment nor from the build: the flashinfer under test may be a release build that pins
    one; tests that need a pin call ``pin``), fast retries and timeouts, an empty manifest
    cache, and no installed flashinfer-cubin."""
    for name in ("FLASHINFER_CUBINS_REPOSITORY", "FLASHINFER_NO_DOWNLOAD",
                 "FLASHINFER_CUBIN_MANIFEST_SHA256", "FLASHINFER_DISABLE_VERSION_CHECK",
                 "FLASHINFER_ARTIFACT_LOCK", "FLASHINFER_CUBIN_RELEASE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASHINFER_CUBIN_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("FLASHINFER_DOWNLOAD_BACKOFF", "0.01")
    monkeypatch.setenv("FLASHINFER_DOWNLOAD_RETRIES", "3")
    monkeypatch.setenv("FLASHINFER_DOWNLOAD_TIMEOUT", "5")
    monkeypatch.setattr(resolve, "installed_cubin_wheel", lambda: None)
    monkeypatch.setattr(resolve, "_build_pin", lambda: None)
    resolve.clear_manifest_cache()
    yield
    resolve.clear_manifest_cache()


@pytest.fixture
def store_dir(tmp_path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def release(tmp_path, monkeypatch):
    """A synthetic release 7.7.7 (three files, one 3 MB so a download spans many chunks) in a
    directory repository, pinned."""
    rel = make_release(tmp_path / "repo", "7.7.7", {
        "sm_90a/norm/a.cubin": 3 * 1024 * 1024 + 17,
        "sm_90a/norm/b.cubin": 4096,
        "sm_100a/act/c.cubin": 100,
    })
    pin(monkeypatch, rel.release)
    return rel


@pytest.fixture
def http_server(release):
    from artifact_server import RepoServer

    with RepoServer(release.root) as server:
        yield server

"""Publishing to a directory repository, immutability, and offline mirrors."""

from __future__ import annotations

import json

import pytest
from artifact_server import RepoServer
from artifacthelpers import make_release, pin, run_cli

from flashinfer.artifacts import ChecksumError, PublishConflictError, get_cubin
from flashinfer.artifacts.manifest import Index, sha256_hex
from flashinfer.artifacts.publish import matching_wheels, mirror, publish


def test_publish_then_download_from_it(release, tmp_path, monkeypatch):
    dest = tmp_path / "published"
    result = publish(release.root, "7.7.7", str(dest))
    assert (result.uploaded, result.present, result.already_published) == (3, 0, False)
    assert result.manifest_sha256 == release.sha256
    assert (dest / "releases/7.7.7/manifest.json").read_bytes() == release.data
    index = Index.from_bytes((dest / "index.json").read_bytes())
    assert index.releases["7.7.7"]["manifest_sha256"] == release.sha256
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", dest.as_uri())  # file:// URL
    assert get_cubin("sm_90a/norm/b.cubin").data == release.files["sm_90a/norm/b.cubin"]


def test_publishing_the_same_release_again_is_a_no_op(release, tmp_path):
    dest = tmp_path / "published"
    publish(release.root, "7.7.7", str(dest))
    again = publish(release.root, "7.7.7", str(dest))
    assert again.already_published and again.uploaded == 0 and again.present == 3
    # A rebuilt manifest (another creation time) with the same files is the same release.
    rebuilt = make_release(tmp_path / "rebuilt", "7.7.7", release.files, created="2027-01-01T00:00:00Z")
    third = publish(rebuilt.root, "7.7.7", str(dest))
    assert third.already_published and third.manifest_sha256 == release.sha256


def test_two_publishes_of_one_version_with_different_bytes_are_refused(release, tmp_path):
    dest = tmp_path / "published"
    publish(release.root, "7.7.7", str(dest))
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    other = dict(release.files)
    other["sm_90a/norm/b.cubin"] = b"other bytes"
    changed = make_release(tmp_path / "changed", "7.7.7", other)
    with pytest.raises(PublishConflictError, match="immutable") as info:
        publish(changed.root, "7.7.7", str(dest))
    assert "sm_90a/norm/b.cubin" in str(info.value)
    after = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file() and ".lock" not in p.name}
    assert {p: b for p, b in before.items() if ".lock" not in p.name} == after
    # Same refusal, as a non-zero exit, through the CLI.
    r = run_cli("artifacts", "publish", "--source", str(changed.root), "--version", "7.7.7",
                "--repository", str(dest))
    assert r.returncode != 0 and "immutable" in r.stderr


def test_an_object_with_other_bytes_under_our_hash_is_refused(release, tmp_path):
    dest = tmp_path / "published"
    entry = release.entry("sm_90a/norm/b.cubin")
    squatted = dest / entry.object_path
    squatted.parent.mkdir(parents=True)
    squatted.write_bytes(b"not the file")
    with pytest.raises(PublishConflictError, match="other bytes"):
        publish(release.root, "7.7.7", str(dest))
    assert not (dest / "releases/7.7.7/manifest.json").exists()  # the manifest goes last


def test_unverified_source_files_are_never_published(release, tmp_path):
    obj = release.root / release.entry("sm_90a/norm/b.cubin").object_path
    obj.write_bytes(b"x" * obj.stat().st_size)
    dest = tmp_path / "published"
    with pytest.raises(ChecksumError):
        publish(release.root, "7.7.7", str(dest))
    assert not dest.exists()


def test_mirror_is_complete_and_self_contained(release, tmp_path, monkeypatch):
    dist = tmp_path / "dist"
    dist.mkdir()
    for name in ("flashinfer_python-7.7.7-py3-none-any.whl",
                 "flashinfer_cubin-7.7.7-py3-none-any.whl",
                 "flashinfer_jit_cache-7.7.7+cu130-py3-none-manylinux_2_28_x86_64.whl",
                 "flashinfer_python-7.7.70-py3-none-any.whl", "other-7.7.7-py3-none-any.whl"):
        (dist / name).write_bytes(name.encode())
    assert len(matching_wheels(dist, "7.7.7")) == 3
    dest = tmp_path / "mirror"
    with RepoServer(release.root) as server:
        monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", server.url)
        result = mirror(release.release, str(dest), dist=dist)
    assert result.uploaded == 3 and len(result.wheels) == 3
    assert sorted(p.name for p in (dest / "wheels").iterdir()) == sorted(result.wheels)
    # Usable with no network: the mirror is a repository by itself.
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(dest))
    monkeypatch.setenv("FLASHINFER_CUBIN_DIR", str(tmp_path / "fresh-store"))
    from flashinfer.artifacts import resolve

    resolve.clear_manifest_cache()
    for path, blob in release.files.items():
        assert get_cubin(path).data == blob


def test_cli_mirror_of_a_pinned_release(release, tmp_path):
    dest = tmp_path / "mirror"
    r = run_cli("artifacts", "mirror", "--dest", str(dest), "--version", "7.7.7",
                "--manifest-sha256", release.sha256, "--repository", str(release.root),
                "--store", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    assert "FLASHINFER_CUBINS_REPOSITORY=" in r.stdout
    assert sha256_hex((dest / "releases/7.7.7/manifest.json").read_bytes()) == release.sha256
    assert json.loads((dest / "index.json").read_text())["releases"]["7.7.7"]


def test_cli_mirror_refuses_a_release_that_is_not_pinned(release, tmp_path, monkeypatch):
    pin(monkeypatch, release.release)
    r = run_cli("artifacts", "mirror", "--dest", str(tmp_path / "m"), "--version", "9.9.9",
                "--repository", str(release.root))
    assert r.returncode != 0 and "--manifest-sha256" in r.stderr


def _fake_wheel(monkeypatch, tmp_path, release, paths):
    """An installed flashinfer-cubin of ``release`` holding ``paths`` (as the runtime sees it)."""
    from flashinfer.artifacts import resolve
    from flashinfer.artifacts.resolve import CubinWheel

    root = tmp_path / "wheel-release"
    (root / "files").mkdir(parents=True)
    (root / "manifest.json").write_bytes(release.data)
    for path in paths:
        (root / "files" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "files" / path).write_bytes(release.files[path])
    wheel = CubinWheel("7.7.7", "7.7.7", release.sha256, root)
    monkeypatch.setattr(resolve, "installed_cubin_wheel", lambda: wheel)
    return root


def test_mirror_from_the_installed_wheel_offline(release, tmp_path, monkeypatch):
    """Behind a firewall with only flashinfer-cubin installed: the mirror is made from the
    wheel, with downloads off and no socket opened, and serves a machine that has nothing."""
    import socket

    _fake_wheel(monkeypatch, tmp_path, release, release.files)
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", "http://127.0.0.1:9/never")

    def no_network(*a, **k):
        raise AssertionError("a socket was opened")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    dest = tmp_path / "mirror"
    result = mirror(release.release, str(dest))
    assert result.uploaded == 3
    assert (dest / "releases/7.7.7/manifest.json").read_bytes() == release.data
    from flashinfer.artifacts import resolve

    monkeypatch.setattr(resolve, "installed_cubin_wheel", lambda: None)
    monkeypatch.delenv("FLASHINFER_NO_DOWNLOAD")
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(dest))
    monkeypatch.setenv("FLASHINFER_CUBIN_DIR", str(tmp_path / "fresh-store"))
    resolve.clear_manifest_cache()
    for path, blob in release.files.items():
        assert get_cubin(path).data == blob


def test_download_takes_what_the_wheel_has_and_fetches_the_rest(release, tmp_path, monkeypatch,
                                                                store_dir):
    from flashinfer.artifacts import OfflineError, download_release

    _fake_wheel(monkeypatch, tmp_path, release, ["sm_90a/norm/a.cubin"])
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")
    with pytest.raises(OfflineError, match="sm_90a/norm/b.cubin|sm_100a/act/c.cubin"):
        download_release(release.release)  # offline: the wheel lacks two files
    big = release.entry("sm_90a/norm/a.cubin")
    assert (store_dir / big.object_path).read_bytes() == release.files[big.path]
    monkeypatch.delenv("FLASHINFER_NO_DOWNLOAD")
    with RepoServer(release.root) as server:
        counts = download_release(release.release, repositories=[server.url])
        fetched = {p for p, _ in server.log if p.startswith("objects/")}
    assert counts == {"present": 1, "downloaded": 2}
    assert fetched == {release.entry(p).object_path for p in ("sm_90a/norm/b.cubin",
                                                              "sm_100a/act/c.cubin")}
    assert (store_dir / "releases/7.7.7/manifest.json").read_bytes() == release.data


def test_republishing_a_rebuild_adopts_the_published_manifest(release, tmp_path):
    """A rebuild of a published release (same files, another creation time) must not end up
    pinned: the lock and the cubin wheel are made from the staging area, so with
    --adopt-published (what nox -s publish / release pass) it takes the published manifest."""
    dest = tmp_path / "published"
    publish(release.root, "7.7.7", str(dest))
    rebuilt = make_release(tmp_path / "rebuilt", "7.7.7", release.files, created="2027-01-01T00:00:00Z")
    staged = rebuilt.root / "releases/7.7.7/manifest.json"
    plain = publish(rebuilt.root, "7.7.7", str(dest))
    assert plain.already_published and not plain.adopted
    assert staged.read_bytes() == rebuilt.data  # without adopt the source is left alone
    r = run_cli("artifacts", "publish", "--source", str(rebuilt.root), "--version", "7.7.7",
                "--repository", str(dest), "--adopt-published")
    assert r.returncode == 0, r.stderr
    assert "already published" in r.stdout and release.sha256 in r.stdout
    assert staged.read_bytes() == release.data  # what users download is what gets pinned
    index = Index.from_bytes((rebuilt.root / "index.json").read_bytes())
    assert index.releases["7.7.7"]["manifest_sha256"] == release.sha256
    # Different files are still refused, adopt or not, and the source is left alone.
    other = dict(release.files)
    other["sm_90a/norm/b.cubin"] = b"changed"
    changed = make_release(tmp_path / "changed", "7.7.7", other)
    with pytest.raises(PublishConflictError):
        publish(changed.root, "7.7.7", str(dest), adopt=True)
    assert (changed.root / "releases/7.7.7/manifest.json").read_bytes() == changed.data

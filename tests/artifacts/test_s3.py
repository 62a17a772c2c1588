"""S3 repositories against moto's standalone server on loopback, driven through boto3."""

from __future__ import annotations

import pytest
from artifacthelpers import leftovers, make_release, objects, run_cli

from flashinfer.artifacts import PublishConflictError, get_cubin, repository
from flashinfer.artifacts.publish import mirror, publish

pytest.importorskip("boto3", reason="the s3 tests need boto3 and moto[server] (nox -s tests installs them)")
pytest.importorskip("moto", reason="the s3 tests need moto[server] (nox -s tests installs it)")

BUCKET = "flashinfer-artifacts"


@pytest.fixture(scope="module")
def s3_server():
    from s3_server import MotoS3

    with MotoS3() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture
def s3(s3_server, monkeypatch, request):
    """A fresh prefix per test, and the AWS variables pointing boto3 at the server."""
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return f"s3://{BUCKET}/{request.node.name}"


def keys(s3_server, prefix: str) -> set[str]:
    client = s3_server.client()
    resp = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix.split("/", 3)[3] + "/")
    return {o["Key"] for o in resp.get("Contents", [])}


def test_publish_to_s3_and_download_from_it(release, s3, s3_server, monkeypatch, store_dir):
    result = publish(release.root, "7.7.7", s3)
    assert result.uploaded == 3 and not result.already_published
    prefix = s3.split("/", 3)[3]
    assert f"{prefix}/releases/7.7.7/manifest.json" in keys(s3_server, s3)
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", s3)
    for path, blob in release.files.items():
        assert get_cubin(path).data == blob
    assert leftovers(store_dir) == []


def test_republish_is_a_no_op_and_different_bytes_are_refused(release, s3, tmp_path):
    publish(release.root, "7.7.7", s3)
    again = publish(release.root, "7.7.7", s3)
    assert again.already_published and again.uploaded == 0
    other = dict(release.files)
    other["sm_100a/act/c.cubin"] = b"changed"
    changed = make_release(tmp_path / "changed", "7.7.7", other)
    with pytest.raises(PublishConflictError, match="immutable"):
        publish(changed.root, "7.7.7", s3)
    r = run_cli("artifacts", "publish", "--source", str(changed.root), "--version", "7.7.7",
                "--repository", s3)
    assert r.returncode != 0 and "immutable" in r.stderr


def test_conditional_writes_never_overwrite(s3, tmp_path):
    repo = repository.open_repository(s3)
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"first")
    b.write_bytes(b"second")
    assert repo.put_if_absent("x/y", a) is True
    assert repo.put_if_absent("x/y", b) is False
    assert repository.open_repository(s3).read("x/y") == b"first"


def test_multipart_upload_of_a_big_file(s3, tmp_path, monkeypatch):
    monkeypatch.setattr(repository, "MULTIPART_THRESHOLD", 5 << 20)
    monkeypatch.setattr(repository, "MULTIPART_CHUNK", 5 << 20)  # S3's smallest part
    big = make_release(tmp_path / "big", "8.8.8", {"sm_90a/big.cubin": (11 << 20) + 3})
    publish(big.root, "8.8.8", s3)
    repo = repository.open_repository(s3)
    entry = big.entry("sm_90a/big.cubin")
    assert repo.exists(entry.object_path) == entry.size
    assert repo.read(entry.object_path, limit=1 << 30) == big.files["sm_90a/big.cubin"]
    # The completion is conditional too: a second multipart upload does not replace it.
    other = tmp_path / "other"
    other.write_bytes(b"y" * (6 << 20))
    assert repo.put_if_absent(entry.object_path, other) is False
    assert repo.exists(entry.object_path) == entry.size


def test_resumed_ranged_get(release, s3, store_dir, monkeypatch):
    publish(release.root, "7.7.7", s3)
    repo = repository.open_repository(s3)
    entry = release.entry("sm_90a/norm/a.cubin")
    stream = repo.open(entry.object_path, 1000)
    data = b"".join(stream.chunks)
    assert stream.start == 1000 and data == release.files["sm_90a/norm/a.cubin"][1000:]


def test_missing_key_is_not_found(s3, store_dir, release, monkeypatch):
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", s3)  # nothing published there
    from flashinfer.artifacts import DownloadError

    with pytest.raises(DownloadError, match="NoSuchKey|404"):
        get_cubin("sm_90a/norm/b.cubin")
    assert objects(store_dir) == {} and leftovers(store_dir) == []


def test_mirror_to_s3(release, s3, monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(release.root))
    result = mirror(release.release, s3)
    assert result.uploaded == 3
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", s3)
    monkeypatch.setenv("FLASHINFER_CUBIN_DIR", str(tmp_path / "other-store"))
    from flashinfer.artifacts import resolve

    resolve.clear_manifest_cache()
    assert get_cubin("sm_90a/norm/b.cubin").data == release.files["sm_90a/norm/b.cubin"]


def test_an_object_with_other_bytes_of_the_same_size_is_refused(release, s3, s3_server):
    """Our object name on S3 holding other bytes of the right size: refused (hashed, not only
    sized), and the release is not published over it."""
    entry = release.entry("sm_90a/norm/b.cubin")
    bucket_prefix = s3.split("/", 3)[3]
    s3_server.client().put_object(Bucket=BUCKET, Key=f"{bucket_prefix}/{entry.object_path}",
                                  Body=b"x" * entry.size)
    with pytest.raises(PublishConflictError, match="other bytes"):
        publish(release.root, "7.7.7", s3)
    assert f"{bucket_prefix}/releases/7.7.7/manifest.json" not in keys(s3_server, s3)

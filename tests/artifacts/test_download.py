"""Downloads over a real loopback HTTP server, with faults injected. Every failure is a typed
error (or a non-zero exit) and leaves no corrupt or partial file behind."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import time

import pytest
from artifact_server import Fault, RepoServer
from artifacthelpers import leftovers, objects, run_cli

from flashinfer import knobs
from flashinfer.artifacts import (
    DownloadError,
    OfflineError,
    PinError,
    download_release,
    get_cubin,
    load_manifest,
)
from flashinfer.artifacts.resolve import Release

BIG = "sm_90a/norm/a.cubin"


@pytest.fixture
def use(monkeypatch):
    def set_repos(*urls):
        monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", " ".join(urls))

    return set_repos


def big_object(release) -> str:
    return release.entry(BIG).object_path


def gets(server, path):
    return [rng for p, rng in server.log if p == path]


def test_get_cubin_downloads_verifies_and_caches(release, http_server, use, store_dir):
    use(http_server.url)
    blob = get_cubin(BIG)
    assert blob.data == release.files[BIG] and blob.entry.path == BIG
    assert objects(store_dir) == {release.entry(BIG).object_path.rsplit("/", 1)[1]: release.files[BIG]}
    assert (store_dir / "releases" / "7.7.7" / "manifest.json").read_bytes() == release.data
    n = len(http_server.log)
    assert get_cubin(BIG).data == release.files[BIG]  # from the store: no request
    assert len(http_server.log) == n and leftovers(store_dir) == []


def test_dropped_connection_resumes_with_range(release, http_server, use, store_dir):
    http_server.faults.append(Fault("drop", match=big_object(release), at=1_000_000))
    use(http_server.url)
    assert get_cubin(BIG).data == release.files[BIG]
    ranges = gets(http_server, big_object(release))
    assert ranges == [None, "bytes=1000000-"], ranges  # the second request continued the first
    assert leftovers(store_dir) == []


def test_connection_always_dropped_fails_and_leaves_nothing(release, http_server, use, store_dir):
    http_server.faults.append(Fault("drop", match=big_object(release), at=500_000, times=-1))
    use(http_server.url)
    with pytest.raises(DownloadError, match="a.cubin") as info:
        get_cubin(BIG)
    assert "attempt 3 of 3" in str(info.value) and "remedy" in str(info.value)
    assert objects(store_dir) == {} and leftovers(store_dir) == []


def test_truncated_body_is_refused_and_nothing_kept(release, http_server, use, store_dir):
    # A consistent response that is simply short: the repository's copy is wrong.
    http_server.faults.append(Fault("short", match=big_object(release), at=12345, times=-1))
    use(http_server.url)
    with pytest.raises(DownloadError, match="12345 bytes"):
        get_cubin(BIG)
    assert objects(store_dir) == {} and leftovers(store_dir) == []


def test_one_flipped_byte_is_refused_and_nothing_kept(release, http_server, use, store_dir):
    http_server.faults.append(Fault("flip", match=big_object(release), at=2_000_000, times=-1))
    use(http_server.url)
    with pytest.raises(DownloadError, match="sha256") as info:
        get_cubin(BIG)
    assert "discarded" in str(info.value)
    assert objects(store_dir) == {} and leftovers(store_dir) == []


def test_404_is_a_typed_error(release, http_server, use, store_dir):
    http_server.faults.append(Fault("status", match=big_object(release), status=404, times=-1))
    use(http_server.url)
    with pytest.raises(DownloadError, match="HTTP 404"):
        get_cubin(BIG)
    assert len(gets(http_server, big_object(release))) == 1  # a 404 is not retried
    assert objects(store_dir) == {} and leftovers(store_dir) == []


def test_server_slower_than_the_timeout(release, http_server, use, store_dir, monkeypatch):
    monkeypatch.setenv("FLASHINFER_DOWNLOAD_TIMEOUT", "0.3")
    monkeypatch.setenv("FLASHINFER_DOWNLOAD_RETRIES", "2")
    http_server.faults.append(Fault("slow", match=big_object(release), delay=1.5, times=-1))
    use(http_server.url)
    with pytest.raises(DownloadError, match="Timeout|timed out"):
        get_cubin(BIG)
    assert objects(store_dir) == {} and leftovers(store_dir) == []


def test_server_that_ignores_range_restarts_cleanly(release, http_server, use, store_dir):
    http_server.faults.extend([Fault("drop", match=big_object(release), at=700_000),
                               Fault("ignore_range", match=big_object(release))])
    use(http_server.url)
    assert get_cubin(BIG).data == release.files[BIG]
    assert leftovers(store_dir) == []


def test_5xx_is_retried(release, http_server, use):
    http_server.faults.append(Fault("status", match=big_object(release), status=503, times=2))
    use(http_server.url)
    assert get_cubin(BIG).data == release.files[BIG]
    assert len(gets(http_server, big_object(release))) == 3


def test_repositories_are_tried_in_order(release, use, store_dir):
    with RepoServer(release.root, [Fault("status", status=404, times=-1)]) as dead, \
            RepoServer(release.root, [Fault("flip", match="objects/*", at=10, times=-1)]) as bad, \
            RepoServer(release.root) as good:
        use(dead.url, bad.url, good.url)
        assert get_cubin(BIG).data == release.files[BIG]
        assert dead.log and bad.log and good.log
    assert leftovers(store_dir) == []


def test_resume_continues_from_another_repository(release, use, store_dir):
    obj = big_object(release)
    with RepoServer(release.root, [Fault("drop", match=obj, at=1 << 20, times=-1)]) as flaky, \
            RepoServer(release.root) as good:
        use(flaky.url, good.url)
        assert get_cubin(BIG).data == release.files[BIG]
        # Three attempts (FLASHINFER_DOWNLOAD_RETRIES=3) each added 1 MB before the drop; the
        # next repository continued from there.
        assert [rng for p, rng in flaky.log if p == obj] == [None, "bytes=1048576-",
                                                             "bytes=2097152-"]
        assert [rng for p, rng in good.log if p == obj] == [f"bytes={3 << 20}-"]


def test_manifest_not_matching_the_pin(release, http_server, use, store_dir, monkeypatch):
    from artifacthelpers import pin

    pin(monkeypatch, Release("7.7.7", "0" * 64))
    use(http_server.url)
    with pytest.raises(PinError, match="pinned"):
        get_cubin(BIG)
    assert not (store_dir / "releases" / "7.7.7").exists()
    assert objects(store_dir) == {} and leftovers(store_dir) == []


def test_a_stored_manifest_that_is_not_the_pinned_one_is_dropped(release, http_server, use, store_dir):
    stale = store_dir / "releases" / "7.7.7" / "manifest.json"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b'{"schema_version": 1}')
    use(http_server.url)
    assert load_manifest(release.release).release == "7.7.7"
    assert stale.read_bytes() == release.data


def test_a_corrupted_stored_file_is_never_returned(release, http_server, use, store_dir):
    use(http_server.url)
    get_cubin(BIG)
    obj = store_dir / release.entry(BIG).object_path
    data = bytearray(obj.read_bytes())
    data[5] ^= 1
    obj.write_bytes(bytes(data))
    assert get_cubin(BIG).data == release.files[BIG]  # detected, deleted, downloaded again
    assert obj.read_bytes() == release.files[BIG]


def test_offline_mode_opens_no_socket_and_names_the_remedy(release, http_server, use, monkeypatch):
    use(http_server.url)
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")

    def no_network(*a, **k):
        raise AssertionError("a socket was opened in offline mode")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(OfflineError, match="FLASHINFER_NO_DOWNLOAD") as info:
        get_cubin(BIG)
    assert "flashinfer-cubin" in str(info.value) and "remedy" in str(info.value)
    assert http_server.log == []


def test_offline_mode_names_the_missing_file(release, http_server, use, monkeypatch):
    use(http_server.url)
    get_cubin("sm_90a/norm/b.cubin")  # the manifest is now local
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")
    with pytest.raises(OfflineError, match="sm_90a/norm/a.cubin"):
        get_cubin(BIG)


def test_download_release_with_arch_filter(release, http_server, store_dir):
    counts = download_release(release.release, ["9.0a"], repositories=[http_server.url])
    assert counts == {"present": 0, "downloaded": 2}
    again = download_release(release.release, None, repositories=[http_server.url])
    assert again == {"present": 2, "downloaded": 1}
    for entry in release.manifest.files:
        f = store_dir / entry.object_path
        assert hashlib.sha256(f.read_bytes()).hexdigest() == entry.sha256


def test_cli_download_fails_non_zero_and_leaves_nothing(release, store_dir):
    with RepoServer(release.root, [Fault("flip", match="objects/*", at=3, times=-1)]) as bad:
        r = run_cli("artifacts", "download", "--version", "7.7.7", "--manifest-sha256",
                    release.sha256, "--repository", bad.url, "--dest", str(store_dir),
                    env={"FLASHINFER_DOWNLOAD_RETRIES": "1"})
    assert r.returncode != 0
    assert "download failed" in r.stderr and "sha256" in r.stderr and "remedy" in r.stderr
    assert objects(store_dir) == {} and leftovers(store_dir) == []


def test_cli_download_then_verify_then_status(release, http_server, store_dir):
    common = ["--version", "7.7.7", "--manifest-sha256", release.sha256, "--dest", str(store_dir)]
    r = run_cli("download-cubin", *common, "--repository", http_server.url)
    assert r.returncode == 0, r.stderr
    assert "3 downloaded" in r.stdout
    r = run_cli("artifacts", "verify", *common)
    assert r.returncode == 0 and "3 verified" in r.stdout
    r = run_cli("artifacts", "status", *common, env={"FLASHINFER_NO_DOWNLOAD": "1"})
    assert r.returncode == 0 and "missing: 0" in r.stdout, r.stdout + r.stderr
    obj = store_dir / release.entry(BIG).object_path
    obj.write_bytes(b"x" * obj.stat().st_size)
    r = run_cli("artifacts", "status", *common)
    assert r.returncode == 1 and "corrupt: 1" in r.stdout and "1 corrupt" in r.stderr
    r = run_cli("artifacts", "verify", *common)
    assert r.returncode == 1 and "a.cubin" in r.stderr and not obj.exists()


def test_cli_refuses_to_download_offline(release, http_server, store_dir):
    r = run_cli("artifacts", "download", "--version", "7.7.7", "--manifest-sha256", release.sha256,
                "--repository", http_server.url, "--dest", str(store_dir),
                env={"FLASHINFER_NO_DOWNLOAD": "1"})
    assert r.returncode != 0 and "FLASHINFER_NO_DOWNLOAD" in r.stderr
    assert http_server.log == []


def test_no_repository_configured(release, store_dir):
    with pytest.raises(DownloadError, match="FLASHINFER_CUBINS_REPOSITORY"):
        get_cubin(BIG)


def test_download_repairs_a_corrupt_store(release, http_server, store_dir):
    download_release(release.release, None, repositories=[http_server.url])
    obj = store_dir / release.entry(BIG).object_path
    obj.write_bytes(b"z" * obj.stat().st_size)  # same size, other bytes
    counts = download_release(release.release, None, repositories=[http_server.url])
    assert counts == {"present": 2, "downloaded": 1}
    assert obj.read_bytes() == release.files[BIG]


def test_checksum_knob_still_verifies_downloads(release, http_server, use, store_dir, caplog):
    """FLASHINFER_CUBIN_CHECKSUM_DISABLED=1 skips verification of local files only: a download
    that does not match is a transfer error, never kept or loaded."""
    with knobs.artifacts.scope():
        knobs.artifacts.checksum_disabled = True
        http_server.faults.append(Fault("flip", match=big_object(release), at=1, times=-1))
        use(http_server.url)
        with pytest.raises(DownloadError):
            get_cubin(BIG)
    assert objects(store_dir) == {}
    assert "FLASHINFER_CUBIN_CHECKSUM_DISABLED=1: local kernel binaries" in caplog.text


def test_checksum_knob_loads_a_replaced_local_file_with_a_warning(release, http_server, use,
                                                                   store_dir):
    """FlashInfer's meaning ("skip SHA256 verification"): a stored kernel binary replaced by
    other bytes is loaded, marked unchecked, with a warning naming it, and kept; without the
    knob it is deleted and downloaded again."""
    from flashinfer.artifacts import UnverifiedCubinWarning

    use(http_server.url)
    get_cubin(BIG)
    obj = store_dir / release.entry(BIG).object_path
    obj.write_bytes(b"\x7fELF a locally rebuilt kernel")
    with knobs.artifacts.scope():
        knobs.artifacts.checksum_disabled = True
        with pytest.warns(UnverifiedCubinWarning, match=f"loading {BIG} from .*UNVERIFIED"):
            blob = get_cubin(BIG)
    assert blob.data == b"\x7fELF a locally rebuilt kernel" and blob.checked is False
    assert "unverified" in blob.source and obj.exists()
    blob = get_cubin(BIG)  # the knob off again: verified, so replaced by the pinned bytes
    assert blob.data == release.files[BIG] and blob.checked is True


CA_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE")
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"])
def test_https_with_a_private_ca(release, tmp_path, monkeypatch, store_dir, variable):
    """An https repository whose certificate only a private CA vouches for: refused at once (a
    retry cannot help) with the variable to set, nothing kept; with that variable, it works."""
    pytest.importorskip("cryptography", reason="makes the test certificate (moto needs it too)")
    from artifacthelpers import self_signed_cert

    for name in CA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    cert, key = self_signed_cert(tmp_path)
    with RepoServer(release.root, tls=(cert, key)) as server:
        assert server.url.startswith("https://127.0.0.1:")
        monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", server.url)
        with pytest.raises(DownloadError, match="REQUESTS_CA_BUNDLE") as info:
            get_cubin(BIG)
        assert "CERTIFICATE_VERIFY_FAILED" in str(info.value) and "attempt" not in str(info.value)
        assert objects(store_dir) == {} and leftovers(store_dir) == []
        monkeypatch.setenv(variable, str(cert))
        assert get_cubin(BIG).data == release.files[BIG]
    assert leftovers(store_dir) == []


def test_http_proxy_is_honoured(release, monkeypatch, store_dir):
    """HTTP_PROXY (as every tool reads it) routes the downloads: nothing listens at the
    repository's own address, so only the proxy can have answered."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    with RepoServer(release.root) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("http_proxy", proxy.url)
        monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", "http://127.0.0.1:9")
        assert get_cubin(BIG).data == release.files[BIG]
        assert proxy.targets and all(t.startswith("http://127.0.0.1:9/") for t in proxy.targets)
        # NO_PROXY exempts the host: straight to 127.0.0.1:9, where nothing answers.
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        monkeypatch.setenv("FLASHINFER_DOWNLOAD_RETRIES", "1")
        with pytest.raises(DownloadError):
            get_cubin("sm_90a/norm/b.cubin")
    assert leftovers(store_dir) == []



def test_a_mismatch_after_a_resume_retries_the_whole_file(release, http_server, use, store_dir):
    """Bytes stitched from two responses (a drop, then a resume whose body was corrupted in
    transit) do not verify, and the hash cannot say which response was bad: the repository
    gets one whole-file try before it is given up."""
    obj = big_object(release)
    http_server.faults.extend([Fault("drop", match=obj, at=1 << 20),
                               Fault("flip", match=obj, at=10)])
    use(http_server.url)
    assert get_cubin(BIG).data == release.files[BIG]
    assert gets(http_server, obj) == [None, f"bytes={1 << 20}-", None]
    assert leftovers(store_dir) == []
    # A repository that keeps serving bad bytes in one response is not asked again.
    http_server.faults.append(Fault("flip", match=obj, at=10, times=-1))
    (store_dir / obj).unlink()
    before = len(gets(http_server, obj))
    with pytest.raises(DownloadError, match="discarded"):
        get_cubin(BIG)
    assert len(gets(http_server, obj)) == before + 1
    assert objects(store_dir) == {} and leftovers(store_dir) == []


# -- hardening: nothing a repository does can stall a download forever --

def _unblock(fifo) -> None:
    """Give a reader stuck opening ``fifo`` its EOF (a writer that opens and closes)."""
    import os

    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("target", ["fifo", "/dev/zero", "directory"])
def test_a_directory_repository_refuses_non_regular_files(release, tmp_path, use, store_dir, target):
    """An object that is a symlink to a FIFO (opening it blocks until a writer comes), a device
    or a directory is refused as not a regular file, and promptly."""
    import os
    import threading

    obj = release.root / big_object(release)
    obj.unlink()
    if target == "fifo":
        dest = tmp_path / "fifo"
        os.mkfifo(dest)
    elif target == "directory":
        dest = tmp_path / "adir"
        dest.mkdir()
    else:
        dest = target
    obj.symlink_to(dest)
    use(str(release.root))
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(_try(get_cubin, BIG)), daemon=True)
    worker.start()
    worker.join(10)
    hung = worker.is_alive()
    for _ in range(50):  # today's code: let the stuck reader (and its retries) go
        if not worker.is_alive():
            break
        _unblock(dest)
        worker.join(0.1)
    assert not hung, "the download blocked on a non-regular file"
    assert isinstance(outcome[0], DownloadError), outcome
    assert "not a regular file" in str(outcome[0]) and "attempt 2" not in str(outcome[0])
    assert objects(store_dir) == {} and leftovers(store_dir) == []


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the outcome is the point
        return e


def test_a_manifest_that_is_a_fifo_fails_the_cli_promptly(release, tmp_path, store_dir):
    import os

    manifest = release.root / "releases" / "7.7.7" / "manifest.json"
    manifest.unlink()
    os.mkfifo(tmp_path / "fifo")
    manifest.symlink_to(tmp_path / "fifo")
    try:
        r = run_cli("artifacts", "download", "--version", "7.7.7", "--manifest-sha256",
                    release.sha256, "--repository", str(release.root), timeout=30)
    finally:
        _unblock(tmp_path / "fifo")
    assert r.returncode == 1 and "not a regular file" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("what, fault, limit", [
    # one byte every 50 ms never trips the read timeout (5 s here)
    ("object", Fault("trickle", times=-1, at=100, delay=0.05), 4.0),
    ("manifest", Fault("trickle", times=-1, at=100, delay=0.05), 4.0),
    # silence shorter than the read timeout: the timeout is capped by what is left
    ("object", Fault("slow", times=-1, delay=3), 2.5),
], ids=["trickled-object", "trickled-manifest", "silent-object"])
def test_a_slow_server_is_cut_at_the_deadline(release, use, store_dir, monkeypatch, what, fault,
                                              limit):
    """The per-file deadline (FLASHINFER_DOWNLOAD_DEADLINE, 1 s here) ends the download, with
    every attempt, and names the knob."""
    fault.match = big_object(release) if what == "object" else "releases/7.7.7/manifest.json"
    monkeypatch.setenv("FLASHINFER_DOWNLOAD_DEADLINE", "1")
    with RepoServer(release.root, [fault]) as server:
        use(server.url)
        start = time.monotonic()
        with pytest.raises(DownloadError, match="FLASHINFER_DOWNLOAD_DEADLINE"):
            get_cubin(BIG)
        took = time.monotonic() - start
    assert took < limit, took
    assert objects(store_dir) == {} and leftovers(store_dir) == []


def test_the_default_deadline_grows_with_the_size(monkeypatch):
    from flashinfer.artifacts.fetch import default_deadline, file_deadline

    assert default_deadline(0) == 300 and default_deadline(256 << 20) == 300 + 1024
    monkeypatch.delenv("FLASHINFER_DOWNLOAD_DEADLINE", raising=False)
    assert file_deadline(1 << 30) == default_deadline(1 << 30)
    monkeypatch.setenv("FLASHINFER_DOWNLOAD_DEADLINE", "7")
    assert file_deadline(1 << 30) == 7


@pytest.mark.parametrize("variable, value", [
    ("FLASHINFER_CUBINS_REPOSITORY", "ftp://mirror.example/fi"),
    ("FLASHINFER_CUBINS_REPOSITORY", "s3://"),
    ("FLASHINFER_CUBINS_REPOSITORY", "data:text/plain;base64,AAAA"),
    ("FLASHINFER_CUBIN_MANIFEST_SHA256", "abc"),
    ("FLASHINFER_DOWNLOAD_TIMEOUT", "inf"),
    ("FLASHINFER_DOWNLOAD_TIMEOUT", "1e309"),
    ("FLASHINFER_DOWNLOAD_DEADLINE", "nan"),
])
def test_a_bad_knob_is_named_by_the_api_and_the_cli(release, http_server, monkeypatch, variable,
                                                     value):
    monkeypatch.setenv(variable, value)
    if variable != "FLASHINFER_CUBINS_REPOSITORY":
        monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", http_server.url)
    with pytest.raises(ValueError, match=variable):
        get_cubin(BIG)
    r = run_cli("artifacts", "download", "--version", "7.7.7", "--manifest-sha256",
                release.sha256)
    assert r.returncode == 1 and variable in r.stderr and repr(value) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_trickling_s3_endpoint_is_cut_at_the_deadline(tmp_path, monkeypatch, store_dir):
    """botocore's read(n) waits for all n bytes: the S3 backend reads what has arrived, so the
    deadline holds there too (the test server stands in for S3: a path-style GET is a GET)."""
    pytest.importorskip("boto3", reason="the s3 backend needs boto3 (nox -s tests installs it)")
    from artifacthelpers import make_release

    rel = make_release(tmp_path / "srv" / "bucket" / "pre", "7.7.7", {BIG: 100_000})
    trickle = Fault("trickle", match="*/objects/*", times=-1, at=1000, delay=0.05)  # 50 s
    monkeypatch.setenv("FLASHINFER_DOWNLOAD_DEADLINE", "1")
    for name, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with RepoServer(tmp_path / "srv", [trickle]) as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
        start = time.monotonic()
        with pytest.raises(DownloadError, match="FLASHINFER_DOWNLOAD_DEADLINE"):
            download_release(rel.release, None, None, ["s3://bucket/pre"])
        took = time.monotonic() - start
    assert took < 4, took
    assert objects(store_dir) == {} and leftovers(store_dir) == []

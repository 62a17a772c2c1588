"""``flashinfer artifacts`` and FlashInfer's aliases, through click's CliRunner."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from flashinfer.__main__ import cli
from flashinfer.artifacts import cli as artifacts_cli
from flashinfer.artifacts import get_cubin


def invoke(*args):
    return CliRunner().invoke(cli, list(args))


def test_aliases_are_the_artifacts_commands():
    assert cli.commands["download-cubin"] is artifacts_cli.download
    assert cli.commands["list-cubins"] is artifacts_cli.list_cmd
    assert cli.commands["clear-cubin"] is artifacts_cli.clear
    group = cli.commands["artifacts"]
    assert {"download", "verify", "status", "list", "mirror", "publish", "clear"} <= set(group.commands)


def test_without_a_pin_every_command_fails_with_the_remedy(monkeypatch):
    from flashinfer.artifacts import resolve

    monkeypatch.setattr(resolve, "_build_pin", lambda: None)  # a development build
    for args in (["artifacts", "status"], ["artifacts", "verify"], ["download-cubin"]):
        r = invoke(*args)
        assert r.exit_code == 1, (args, r.output)
        assert "FLASHINFER_CUBIN_MANIFEST_SHA256" in r.output


def test_status_and_show_config_with_a_pinned_release(release, monkeypatch, store_dir):
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(release.root))
    get_cubin("sm_90a/norm/b.cubin")
    r = invoke("artifacts", "status")
    assert r.exit_code == 1, r.output  # incomplete
    assert "3 files" in r.output and "in store: 1" in r.output and "missing: 2" in r.output
    assert "missing  sm_90a/norm/a.cubin" in r.output
    r = invoke("show-config")
    section = r.output.split("=== Artifact Path ===\n", 1)[1].split("===", 1)[0]
    assert section.splitlines()[0] == str(store_dir)
    assert f"pinned release: 7.7.7 (manifest sha256 {release.sha256})" in section
    assert f"repositories: {release.root}" in section
    downloaded = r.output.split("=== Downloaded Cubins ===\n", 1)[1].split("===", 1)[0]
    assert downloaded.splitlines()[:2] == ["1", "release 7.7.7: 1 of 3 files available"]


def test_clear_cubin_removes_the_store(release, monkeypatch, store_dir):
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(release.root))
    get_cubin("sm_90a/norm/b.cubin")
    r = invoke("clear-cubin")
    assert r.exit_code == 0 and "removed" in r.output and not store_dir.exists()


def test_bad_knob_values_exit_non_zero(monkeypatch):
    monkeypatch.setenv("FLASHINFER_DOWNLOAD_TIMEOUT", "soon")
    monkeypatch.setenv("FLASHINFER_CUBIN_MANIFEST_SHA256", "ab" * 32)
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", "http://127.0.0.1:9")
    r = invoke("download-cubin")
    assert r.exit_code == 1 and "FLASHINFER_DOWNLOAD_TIMEOUT" in r.output


def test_credentials_never_reach_the_output(release, monkeypatch):
    """show-config with a pinned release prints the repositories, and a download failure names
    the URL it tried: neither shows a password."""
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", "http://bob:s3cret@127.0.0.1:9/fi")
    monkeypatch.setenv("FLASHINFER_DOWNLOAD_RETRIES", "1")
    out = invoke("show-config").output
    assert "repositories: http://bob:***@127.0.0.1:9/fi" in out
    r = invoke("download-cubin")
    assert r.exit_code == 1 and "http://bob:***@127.0.0.1:9/fi" in r.output, r.output
    assert "s3cret" not in out + r.output


def test_redact():
    from flashinfer.knobs import redact, shown_value

    assert redact("https://tok@h/x s3://b/p file:///a@b") == "https://***@h/x s3://b/p file:///a@b"
    assert redact("a https://u:p@h/ b http://v:q@i/") == "a https://u:***@h/ b http://v:***@i/"
    assert shown_value("HF_TOKEN", "abc") == "***" and shown_value("X", None) == "(unset)"


def test_arch_spellings_and_an_arch_the_release_lacks(release, store_dir):
    """``--arch`` takes 9.0a, sm_90a or 90a; an arch the release has no file for (or a typo) is
    an error that lists the release's archs, never a silent "0 downloaded"."""
    repo = ["--repository", str(release.root)]
    r = invoke("artifacts", "download", "--arch", "sm_90a", *repo)
    assert r.exit_code == 0, r.output
    assert "2 downloaded, 0 already present" in r.output
    for bad, why in (("8.0", "has no file for 8.0"), ("sm_80", "has no file for 8.0"),
                     ("hopper", "not an arch")):
        for cmd in (["artifacts", "download", *repo], ["artifacts", "status"], ["list-cubins"]):
            r = invoke(*cmd, "--arch", bad)
            assert r.exit_code == 1, (cmd, bad, r.output)
            assert why in r.output and "['10.0a', '9.0a']" in r.output, r.output
    r = invoke("artifacts", "status", "--arch", "100a", "-v")
    assert r.exit_code == 1 and "1 files" in r.output and "missing: 1" in r.output, r.output
    assert "run `flashinfer artifacts download --arch 100a`" in r.output
    r = invoke("artifacts", "status", "--arch", "90a")
    assert r.exit_code == 0 and "in store: 2, missing: 0, corrupt: 0" in r.output, r.output


def test_status_exits_non_zero_unless_every_file_is_available(release, store_dir):
    """status is the check (exit 1 on a missing or corrupt file, with the download that fixes
    it); list / list-cubins is the inventory (exit 0); status never deletes anything."""
    r = invoke("artifacts", "download", "--repository", str(release.root))
    assert r.exit_code == 0, r.output
    r = invoke("artifacts", "status")
    assert r.exit_code == 0 and "in store: 3, missing: 0, corrupt: 0" in r.output, r.output

    corrupt = store_dir / release.entry("sm_90a/norm/b.cubin").object_path
    corrupt.write_bytes(b"x" * release.entry("sm_90a/norm/b.cubin").size)
    (store_dir / release.entry("sm_100a/act/c.cubin").object_path).unlink()
    r = invoke("artifacts", "status", "--dest", str(store_dir))
    assert r.exit_code == 1, r.output
    assert "corrupt  sm_90a/norm/b.cubin" in r.output and "missing  sm_100a/act/c.cubin" in r.output
    assert "1 files missing, 1 corrupt" in r.output
    assert f"run `flashinfer artifacts download --dest {store_dir}`" in r.output
    assert corrupt.exists()  # read-only
    for cmd in (["artifacts", "list"], ["list-cubins"]):
        r = invoke(*cmd)
        assert r.exit_code == 0 and "missing: 1, corrupt: 1" in r.output, (cmd, r.output)

    r = invoke("artifacts", "download", "--repository", str(release.root))  # repairs
    assert r.exit_code == 0 and "2 downloaded, 1 already present" in r.output, r.output
    r = invoke("artifacts", "status")
    assert r.exit_code == 0, r.output


def test_every_command_exits_non_zero_on_failure(release, tmp_path, store_dir, monkeypatch):
    """download, verify, mirror, publish and the aliases: a failure is exit 1 with what failed
    and a remedy, never a traceback."""
    missing_repo = str(tmp_path / "no-such-repo")
    cases = [
        (["artifacts", "download", "--repository", missing_repo], "download failed"),
        (["download-cubin", "--repository", missing_repo], "download failed"),
        (["artifacts", "verify"], "verify failed"),
        (["artifacts", "mirror", "--dest", str(tmp_path / "m"), "--repository", missing_repo],
         "mirror failed"),
        (["artifacts", "publish", "--source", str(tmp_path), "--version", "7.7.7",
          "--repository", str(tmp_path / "pub")], "publish failed"),
    ]
    for args, what in cases:
        r = invoke(*args)
        assert r.exit_code == 1, (args, r.output)
        assert isinstance(r.exception, SystemExit), (args, r.exception)
        assert what in r.output, (args, r.output)
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")
    for args in (["artifacts", "status"], ["list-cubins"], ["download-cubin"]):
        r = invoke(*args)
        assert r.exit_code == 1 and "FLASHINFER_NO_DOWNLOAD" in r.output, (args, r.output)
        assert isinstance(r.exception, SystemExit), (args, r.exception)


def test_select_files_raises_a_typed_arch_error(release):
    from flashinfer.artifacts import ArchError
    from flashinfer.artifacts.resolve import select_files

    assert [f.path for f in select_files(release.manifest, ["90a"])] == [
        "sm_90a/norm/a.cubin", "sm_90a/norm/b.cubin"]
    assert len(select_files(release.manifest, [])) == len(select_files(release.manifest)) == 3
    try:
        select_files(release.manifest, ["9.0"])
    except ArchError as e:
        assert isinstance(e, ValueError)
        assert (e.argument, e.expected) == ("9.0", ["10.0a", "9.0a"])
    else:
        raise AssertionError("no ArchError")


def test_verify_before_any_download_says_to_download(release, store_dir):
    r = invoke("artifacts", "verify")
    assert r.exit_code == 1
    assert "run `flashinfer artifacts download` first" in r.output, r.output
    assert "FLASHINFER_NO_DOWNLOAD=1" not in r.output  # it is not set: do not blame it


def test_filesystem_failures_exit_non_zero_with_a_remedy(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"x")
    r = invoke("artifacts", "clear", "--dest", str(not_a_dir))
    assert r.exit_code == 1 and "clear failed" in r.output and "remedy" in r.output, r.output
    assert not_a_dir.read_bytes() == b"x"


def test_the_client_and_cli_run_without_torch(release, tmp_path):
    """nox -s publish and nox -s mirror run the CLI in environments without torch (and a
    mirror host may have none): publishing, downloading and verifying must not import it."""
    import subprocess
    import sys

    from artifacthelpers import objects, run_cli

    blocker = tmp_path / "notorch"
    blocker.mkdir()
    # A torch that cannot be imported, found before any real one.
    (blocker / "torch.py").write_text("raise ImportError('torch is blocked in this test')\n")
    env = {"PYTHONPATH": str(blocker)}
    dest, store = tmp_path / "published", tmp_path / "store2"
    r = run_cli("artifacts", "publish", "--source", str(release.root), "--version", "7.7.7",
                "--repository", str(dest), env=env)
    assert r.returncode == 0, r.stderr
    common = ["--version", "7.7.7", "--manifest-sha256", release.sha256, "--dest", str(store)]
    r = run_cli("artifacts", "download", *common, "--repository", str(dest), env=env)
    assert r.returncode == 0 and "3 downloaded" in r.stdout, r.stderr
    r = run_cli("artifacts", "verify", *common, env=env)
    assert r.returncode == 0 and "3 verified" in r.stdout, r.stderr
    assert len(objects(store)) == 3
    import os

    import flashinfer

    package_root = str(Path(flashinfer.__file__).resolve().parents[1])
    code = ("import sys, flashinfer.artifacts.cli, flashinfer.artifacts.publish; "
            "assert 'torch' not in sys.modules")
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), package_root])}
    assert subprocess.run([sys.executable, "-c", code], env=full).returncode == 0


# ---------------------------------------------------------------------------------------------
# list-cubins on a development build, verify, mirror, offline local mirrors


def test_list_cubins_without_a_pin_lists_what_is_local(release, tmp_path, monkeypatch, store_dir):
    """A development build pins no release: list-cubins says so, lists the releases in the store
    and the installed flashinfer-cubin (unverified against a pin), and exits 0."""
    from flashinfer.artifacts import resolve

    r = invoke("artifacts", "download", "--arch", "9.0a", "--repository", str(release.root))
    assert r.exit_code == 0, r.output
    monkeypatch.setattr(resolve, "_build_pin", lambda: None)
    resolve.clear_manifest_cache()
    r = invoke("list-cubins")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("no artifact release is pinned: this flashinfer-python build")
    assert "FLASHINFER_CUBIN_MANIFEST_SHA256" in lines[0]
    assert (f"store {store_dir}: release 7.7.7 (manifest sha256 {release.sha256[:16]}..., not "
            "checked against a pin): 3 files; present: 2, missing: 1, corrupt: 0") in lines
    assert any(line.startswith("missing  sm_100a/act/c.cubin") for line in lines)
    assert lines[-1] == "flashinfer-cubin: not installed"
    r = invoke("artifacts", "list", "--dest", str(tmp_path / "empty"))
    assert r.exit_code == 0 and f"store {tmp_path / 'empty'}: no release stored" in r.output
    # another release named explicitly still needs its hash
    r = invoke("list-cubins", "--version", "7.7.7")
    assert r.exit_code == 1 and "--manifest-sha256" in r.output, r.output


def test_list_cubins_without_a_pin_lists_the_installed_wheel(release, tmp_path, monkeypatch):
    from test_publish import _fake_wheel

    from flashinfer.artifacts import resolve

    _fake_wheel(monkeypatch, tmp_path, release, ["sm_90a/norm/a.cubin"])
    monkeypatch.setattr(resolve, "_build_pin", lambda: None)
    r = invoke("list-cubins")
    assert r.exit_code == 0, r.output
    assert "flashinfer-cubin 7.7.7 at" in r.output and "present: 1, missing: 2" in r.output


def test_verify_with_nothing_stored_says_so_and_how_to_download(release, tmp_path, store_dir):
    """The manifest alone (an interrupted download) is not something verified: exit 1, naming
    the store it looked in and the download command; --dest points it at another store."""
    store_dir.mkdir(parents=True)
    (store_dir / "releases" / "7.7.7").mkdir(parents=True)
    (store_dir / "releases" / "7.7.7" / "manifest.json").write_bytes(release.data)
    r = invoke("artifacts", "verify")
    assert r.exit_code == 1, r.output
    assert f"looked in: store {store_dir} (no flashinfer-cubin of this release" in r.output
    assert f"nothing is stored for release 7.7.7 in {store_dir}" in r.output
    assert "run `flashinfer artifacts download`" in r.output
    other = tmp_path / "elsewhere"
    r = invoke("artifacts", "download", "--dest", str(other), "--repository", str(release.root))
    assert r.exit_code == 0, r.output
    r = invoke("artifacts", "verify", "--dest", str(other))
    assert r.exit_code == 0, r.output
    assert f"looked in: store {other}" in r.output
    assert "release 7.7.7: 3 verified (3 in the store), 0 missing, 0 corrupt" in r.output


def test_verify_checks_the_installed_wheel_too(release, tmp_path, monkeypatch):
    from test_publish import _fake_wheel

    wheel_root = _fake_wheel(monkeypatch, tmp_path, release, release.files)
    r = invoke("artifacts", "verify")
    assert r.exit_code == 0, r.output
    assert "3 verified (0 in the store, 3 in flashinfer-cubin), 0 missing, 0 corrupt" in r.output
    (wheel_root / "files" / "sm_100a/act/c.cubin").write_bytes(b"x" * 100)
    r = invoke("artifacts", "verify")
    assert r.exit_code == 1, r.output
    assert "flashinfer-cubin lacks or has corrupt copies of: sm_100a/act/c.cubin" in r.output
    assert "pip install --force-reinstall" in r.output


def _wheels(dist, version):
    dist.mkdir()
    names = [f"flashinfer_python-{version}-py3-none-any.whl",
             f"flashinfer_cubin-{version}-py3-none-any.whl",
             "flashinfer_python-0.0.1-py3-none-any.whl"]
    for name in names:
        (dist / name).write_bytes(name.encode())
    return names[:2]


def test_mirror_refuses_a_dist_that_does_not_exist_or_holds_no_wheel(release, tmp_path):
    repo = ["--repository", str(release.root)]
    r = invoke("artifacts", "mirror", "--dest", str(tmp_path / "m"), "--dist",
               str(tmp_path / "nonexistent"), *repo)
    assert r.exit_code == 2 and "does not exist" in r.output, r.output
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "flashinfer_python-0.0.1-py3-none-any.whl").write_bytes(b"")
    r = invoke("artifacts", "mirror", "--dest", str(tmp_path / "m"), "--dist", str(empty), *repo)
    assert r.exit_code == 1, r.output
    assert "holds no wheel of release 7.7.7 (found: flashinfer_python-0.0.1" in r.output
    assert not (tmp_path / "m").exists()


def test_mirror_says_what_it_holds(release, tmp_path):
    """Without --dist a mirror holds the kernel binaries only, and says so; with it, the
    release's wheels are listed (and only those of its version)."""
    repo = ["--repository", str(release.root)]
    r = invoke("artifacts", "mirror", "--dest", str(tmp_path / "m1"), *repo)
    assert r.exit_code == 0, r.output
    assert "3 kernel binaries (every arch), and no wheels (no --dist given)" in r.output
    assert f"use it: FLASHINFER_CUBINS_REPOSITORY={tmp_path / 'm1'}" in r.output
    names = _wheels(tmp_path / "dist", "7.7.7")
    r = invoke("artifacts", "mirror", "--dest", str(tmp_path / "m2"), "--dist",
               str(tmp_path / "dist"), *repo)
    assert r.exit_code == 0, r.output
    assert f"2 wheels under wheels/: {', '.join(sorted(names))}" in r.output
    assert "pip install --no-index --find-links" in r.output
    assert sorted(p.name for p in (tmp_path / "m2" / "wheels").iterdir()) == sorted(names)


def test_a_local_mirror_works_offline(release, tmp_path, monkeypatch, store_dir):
    """Reading a directory or file:// repository is not a download: with
    FLASHINFER_NO_DOWNLOAD=1 the ops and `download` read it; an http one is skipped and the
    message says which local repositories were read."""
    import socket

    from flashinfer.artifacts import OfflineError, resolve

    def no_network(*a, **k):
        raise AssertionError("a socket was opened")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY",
                       f"http://127.0.0.1:9/never {release.root.as_uri()}")
    assert get_cubin("sm_90a/norm/b.cubin").data == release.files["sm_90a/norm/b.cubin"]
    r = invoke("download-cubin")
    assert r.exit_code == 0, r.output
    assert "2 downloaded, 1 already present" in r.output and "local repositories only" in r.output
    r = invoke("artifacts", "status")
    assert r.exit_code == 0, r.output

    monkeypatch.setenv("FLASHINFER_CUBIN_DIR", str(tmp_path / "fresh"))
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(tmp_path / "empty-mirror"))
    resolve.clear_manifest_cache()
    try:
        get_cubin("sm_90a/norm/b.cubin")
    except OfflineError as e:
        assert "only the local repositories" in str(e) and "empty-mirror" in str(e), e
    else:
        raise AssertionError("no OfflineError")
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", "http://127.0.0.1:9/never")
    try:
        get_cubin("sm_90a/norm/b.cubin")
    except OfflineError as e:  # the remedy it gives is one that works
        assert "local directory (or file://) mirror" in str(e), e
    else:
        raise AssertionError("no OfflineError")


def test_the_root_download_cubin_flag_downloads_then_runs_the_command(release, monkeypatch,
                                                                      store_dir):
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(release.root))
    r = invoke("--download-cubin")
    assert r.exit_code == 0, r.output
    assert f"release 7.7.7: 3 downloaded, 0 already present, in {store_dir}" in r.output
    assert "Usage" not in r.output  # the flag is the work: no help
    r = invoke("--download-cubin", "list-cubins")
    assert r.exit_code == 0, r.output
    assert "0 downloaded, 3 already present" in r.output and "in store: 3" in r.output


def test_list_cubins_with_a_contradicting_pin_is_an_error_not_an_inventory(release, monkeypatch):
    monkeypatch.setenv("FLASHINFER_CUBIN_MANIFEST_SHA256", "ab" * 32)
    r = invoke("list-cubins")
    assert r.exit_code == 1 and "contradicts" in r.output, r.output
    assert "listing what is held locally" not in r.output

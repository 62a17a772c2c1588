"""``flashinfer artifacts ...``: download, verify, status, mirror, publish, clear.

FlashInfer's ``download-cubin``, ``list-cubins`` and ``clear-cubin`` are aliases (registered in
``flashinfer/__main__.py``). Every failure exits non-zero with a message that says what failed
and what to do; nothing here prints a traceback for an expected failure.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

import click

from .. import knobs
from ..exceptions import FlashInferError
from .errors import OfflineError, PinError
from .manifest import Manifest
from .resolve import Release, pinned_release, release_is_pinned, repository_urls
from .store import Store, hash_file


@contextlib.contextmanager
def _errors(action: str) -> Iterator[None]:
    """Turn our typed errors into a clean non-zero exit; a bad variable fails first."""
    try:
        knobs.artifacts.check()
        yield
    except FlashInferError as e:
        raise click.ClickException(f"{action} failed: {e}") from None
    except OSError as e:
        raise click.ClickException(
            f"{action} failed: {e}; remedy: check that the path exists and is writable by you "
            "(--dest, FLASHINFER_CUBIN_DIR), and that the disk is not full"
        ) from None


def _release(version: Optional[str], sha: Optional[str]) -> Release:
    return pinned_release(version, sha)


def _store(dest: Optional[Path]) -> Store:
    return Store(dest if dest is not None else knobs.artifacts.cubin_dir)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GB"


release_options = [
    click.option("--version", "version", default=None,
                 help="Release version (default: the one this flashinfer build pins)."),
    click.option("--manifest-sha256", "manifest_sha256", default=None,
                 help="Manifest hash of a release other than the pinned one (from a trusted source)."),
    click.option("--dest", type=click.Path(path_type=Path), default=None,
                 help="Local store (default: FLASHINFER_CUBIN_DIR)."),
]


def with_release_options(fn):
    for option in reversed(release_options):
        fn = option(fn)
    return fn


@click.group("artifacts", context_settings={"help_option_names": ["-h", "--help"]})
def artifacts_group() -> None:
    """Kernel binaries (cubins): download, verify, inspect, mirror and clear them."""


@artifacts_group.command("download")
@with_release_options
@click.option("--arch", "archs", multiple=True, help='Only these archs, e.g. --arch 9.0a (repeatable).')
@click.option("--repository", "repositories", multiple=True,
              help="Repository URL, tried in the order given (default: FLASHINFER_CUBINS_REPOSITORY).")
@click.option("--jobs", default=4, show_default=True, help="Files downloaded at once.")
def download(version, manifest_sha256, dest, archs, repositories, jobs) -> None:
    """Download (and verify) the files of a release into the local store."""
    from .resolve import download_release, load_manifest, select_files

    with _errors("download"):
        offline = knobs.artifacts.no_download
        release = _release(version, manifest_sha256)
        store = _store(dest)
        urls = list(repositories) or None
        manifest = load_manifest(release, store, not offline, urls)
        total = sum(f.size for f in select_files(manifest, archs))
        label = f"release {release.version} ({_human(total)})"
        with click.progressbar(length=total, label=label, file=sys.stderr,
                               show_pos=False) as bar:
            counts = download_release(
                release, list(archs) or None, store, urls, bar.update, jobs
            )
    click.echo(
        f"release {release.version}: {counts['downloaded']} downloaded, {counts['present']} "
        f"already present, in {store.root}"
        + (" (FLASHINFER_NO_DOWNLOAD=1: read from flashinfer-cubin and local repositories only)"
           if offline else "")
    )


@artifacts_group.command("verify")
@with_release_options
def verify_cmd(version, manifest_sha256, dest) -> None:
    """Re-hash the files of a release held here: in the store (--dest, default
    FLASHINFER_CUBIN_DIR) and in an installed flashinfer-cubin of the release. A corrupt stored
    copy is deleted. Exit 1 on a corrupt file, or when nothing of the release is held (nothing
    was verified); missing files are counted, not an error (``status`` checks completeness)."""
    from .resolve import cubin_wheel_for, load_manifest

    with _errors("verify"):
        release = _release(version, manifest_sha256)
        store = _store(dest)
        wheel = cubin_wheel_for(release)
        click.echo(f"looked in: store {store.root}" + (
            f", flashinfer-cubin at {wheel.root}" if wheel is not None
            else " (no flashinfer-cubin of this release is installed)"))
        try:  # the store and the wheel only: verify reads no repository
            manifest = load_manifest(release, store, allow_download=False, repositories=[])
        except OfflineError:
            manifest = None
        counts = {"store": 0, "wheel": 0, "missing": 0}
        bad: List[str] = []
        bad_in_wheel: List[str] = []
        for entry in manifest.files if manifest is not None else ():
            state = store.check(entry)
            if state == "corrupt":
                bad.append(entry.path)
                store.object_file(entry).unlink(missing_ok=True)
            elif state == "present":
                counts["store"] += 1
            if state != "present" and wheel is not None:
                f = wheel.file(entry.path)
                if f.is_file() and hash_file(f) == (entry.sha256, entry.size):
                    counts["wheel"] += 1
                    continue
                bad_in_wheel.append(entry.path)
            elif state == "missing":
                counts["missing"] += 1
    verified = counts["store"] + counts["wheel"]
    if verified == 0 and not bad and not bad_in_wheel:
        raise click.ClickException(
            f"verify failed: nothing is stored for release {release.version} in {store.root}"
            + ("" if wheel is not None else " and no flashinfer-cubin of it is installed")
            + ": nothing to verify; remedy: run `"
            + _download_command(dest, (), version, manifest_sha256)
            + "` first (it downloads into FLASHINFER_CUBIN_DIR, or into --dest DIR), or point "
            "--dest at the store you downloaded into"
        )
    click.echo(
        f"release {release.version}: {verified} verified ({counts['store']} in the store"
        + (f", {counts['wheel']} in flashinfer-cubin" if wheel is not None else "")
        + f"), {counts['missing']} missing, {len(bad) + len(bad_in_wheel)} corrupt"
    )
    problems = []
    if bad:
        problems.append(
            "corrupt stored files (deleted): " + _some(bad) + "; run `"
            + _download_command(dest, (), version, manifest_sha256) + "` to fetch them again")
    if bad_in_wheel:
        problems.append(
            "flashinfer-cubin lacks or has corrupt copies of: " + _some(bad_in_wheel)
            + f"; reinstall it: pip install --force-reinstall --no-deps "
            f"'flashinfer-cubin=={wheel.version}'")
    if problems:
        raise click.ClickException("verify failed: " + "; ".join(problems))


def _some(paths: Sequence[str]) -> str:
    return ", ".join(paths[:10]) + (" ..." if len(paths) > 10 else "")


def _status(release: Release, store: Store, archs: Sequence[str], verbose: bool
            ) -> tuple[List[str], dict[str, int]]:
    """The lines ``status`` and ``list`` print, and the count of files in each state."""
    from .resolve import release_status

    rows = release_status(release, store, list(archs) or None)
    counts = {"wheel": 0, "present": 0, "missing": 0, "corrupt": 0}
    lines = []
    for entry, state in rows:
        counts[state] += 1
        if verbose or state in ("missing", "corrupt"):
            lines.append(f"{state:8} {entry.path} ({_human(entry.size)}, {entry.arch or '-'})")
    head = (
        f"release {release.version} (manifest sha256 {release.manifest_sha256[:16]}...): "
        f"{len(rows)} files; in flashinfer-cubin: {counts['wheel']}, in store: "
        f"{counts['present']}, missing: {counts['missing']}, corrupt: {counts['corrupt']}"
    )
    return [head, f"store: {store.root}"] + lines, counts


def _download_command(dest: Optional[Path], archs: Sequence[str], version: Optional[str],
                      manifest_sha256: Optional[str]) -> str:
    """The ``flashinfer artifacts download`` that completes what ``status`` looked at."""
    words = ["flashinfer artifacts download"]
    if version is not None:
        words.append(f"--version {version}")
    if manifest_sha256 is not None:
        words.append(f"--manifest-sha256 {manifest_sha256}")
    words += [f"--arch {a}" for a in archs]
    if dest is not None:
        words.append(f"--dest {dest}")
    return " ".join(words)


@artifacts_group.command("status")
@with_release_options
@click.option("--arch", "archs", multiple=True, help="Only these archs (repeatable).")
@click.option("-v", "--verbose", is_flag=True, help="List every file, not only the missing ones.")
def status(version, manifest_sha256, dest, archs, verbose) -> None:
    """What is present (in flashinfer-cubin or the store), missing, or corrupt; exit 1 unless
    every file (of ``--arch``) is available."""
    with _errors("status"):
        release = _release(version, manifest_sha256)
        lines, counts = _status(release, _store(dest), archs, verbose)
    for line in lines:
        click.echo(line)
    if counts["missing"] or counts["corrupt"]:
        raise click.ClickException(
            f"release {release.version} is incomplete: {counts['missing']} files missing, "
            f"{counts['corrupt']} corrupt (listed above); remedy: run `"
            f"{_download_command(dest, archs, version, manifest_sha256)}` (it fetches the "
            "missing files and replaces corrupt copies), or install the flashinfer-cubin wheel "
            "of this release"
        )


@artifacts_group.command("list")
@with_release_options
@click.option("--arch", "archs", multiple=True, help="Only these archs (repeatable).")
def list_cmd(version, manifest_sha256, dest, archs) -> None:
    """Every file of the release and where it is (an inventory: missing files are listed, not
    an error; ``status`` is the check that fails on them). On a build that pins no release
    (a development build), what is local: the releases in the store and the installed
    flashinfer-cubin, unverified against any pin."""
    with _errors("list"):
        try:
            release = _release(version, manifest_sha256)
        except PinError as e:
            if version is not None or manifest_sha256 is not None or release_is_pinned():
                raise
            lines = _unpinned_inventory(e, _store(dest), archs)
        else:
            lines, _ = _status(release, _store(dest), archs, True)
    for line in lines:
        click.echo(line)


def _inventory(where: str, data: bytes, state_of, archs: Sequence[str]) -> List[str]:
    """Lines for the release whose manifest is ``data`` held at ``where``; ``state_of(entry)``
    says ``present``, ``missing`` or ``corrupt``."""
    from .manifest import sha256_hex
    from .resolve import select_files

    try:
        manifest = Manifest.from_bytes(data)
    except FlashInferError as e:
        return [f"{where}: a manifest that does not parse ({e})"]
    rows = [(entry, state_of(entry)) for entry in select_files(manifest, archs)]
    counts = {s: sum(1 for _, x in rows if x == s) for s in ("present", "missing", "corrupt")}
    lines = [
        f"{where}: release {manifest.release} (manifest sha256 {sha256_hex(data)[:16]}..., not "
        f"checked against a pin): {len(rows)} files; present: {counts['present']}, missing: "
        f"{counts['missing']}, corrupt: {counts['corrupt']}"
    ]
    lines += [f"{state:8} {e.path} ({_human(e.size)}, {e.arch or '-'})" for e, state in rows]
    return lines


def _wheel_state(wheel):
    def state(entry) -> str:
        f = wheel.file(entry.path)
        if not f.is_file():
            return "missing"
        return "present" if hash_file(f) == (entry.sha256, entry.size) else "corrupt"

    return state


def _unpinned_inventory(pin_error: PinError, store: Store, archs: Sequence[str]) -> List[str]:
    """``list`` without a pinned release: what the store and the installed wheel hold."""
    from .resolve import installed_cubin_wheel

    lines = [f"no artifact release is pinned: {pin_error}", "listing what is held locally:"]
    versions = store.releases()
    if not versions:
        lines.append(f"store {store.root}: no release stored")
    for v in versions:
        lines += _inventory(f"store {store.root}", store.read_manifest(v) or b"", store.check,
                            archs)
    wheel = installed_cubin_wheel()
    if wheel is None:
        lines.append("flashinfer-cubin: not installed")
    elif wheel.release is None:
        lines.append(f"flashinfer-cubin {wheel.version} at {wheel.root}: holds no release")
    else:
        lines += _inventory(f"flashinfer-cubin {wheel.version} at {wheel.root}",
                            wheel.manifest_bytes(), _wheel_state(wheel), archs)
    return lines


@artifacts_group.command("mirror")
@click.option("--dest", "destination", required=True,
              help="Where the mirror goes: a directory, file:// or s3://bucket/prefix.")
@click.option("--version", "version", default=None, help="Release (default: the pinned one).")
@click.option("--manifest-sha256", "manifest_sha256", default=None,
              help="Manifest hash of a release other than the pinned one.")
@click.option("--repository", "repositories", multiple=True, help="Source repositories, in order.")
@click.option("--dist", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Also copy the release's wheels (flashinfer_python, flashinfer_cubin, "
              "flashinfer_jit_cache of its version) from this directory, e.g. dist/; it must hold "
              "at least one. Default: no wheels.")
@click.option("--store", "store_dir", type=click.Path(path_type=Path), default=None,
              help="Local store used on the way (default: FLASHINFER_CUBIN_DIR).")
def mirror_cmd(destination, version, manifest_sha256, repositories, dist, store_dir) -> None:
    """A complete, self-contained copy of a release (index, manifest, every file of every arch,
    and with --dist its wheels) for offline use; it says what it holds."""
    from .publish import matching_wheels, mirror

    with _errors("mirror"):
        release = _release(version, manifest_sha256)
        if dist is not None and not matching_wheels(dist, release.version):
            found = sorted(p.name for p in dist.glob("*.whl"))
            raise click.ClickException(
                f"mirror refused: --dist {dist} holds no wheel of release {release.version} "
                f"(found: {', '.join(found[:8]) or 'no .whl file'}); build them first (nox -s "
                "build), point --dist at the directory that holds them, or leave --dist out for "
                "a mirror of the kernel binaries only"
            )
        result = mirror(release, destination, list(repositories) or None, dist, _store(store_dir))
    click.echo(result.summary())
    shown = knobs.redact(destination)
    click.echo(f"the mirror holds: index.json, releases/{release.version}/manifest.json, "
               f"{result.uploaded + result.present} kernel binaries (every arch), and "
               + (f"{len(result.wheels)} wheels under wheels/: {', '.join(result.wheels)}"
                  if result.wheels else "no wheels (no --dist given)"))
    local = "://" not in destination or destination.startswith("file://")
    click.echo(
        f"use it: FLASHINFER_CUBINS_REPOSITORY={shown} (a local directory is read even with "
        "FLASHINFER_NO_DOWNLOAD=1)" if local else f"use it: FLASHINFER_CUBINS_REPOSITORY={shown}"
    )
    if result.wheels and local:  # pip reads --find-links from a directory, not from s3://
        click.echo(f"install offline: pip install --no-index --find-links {shown}/wheels "
                   "'flashinfer-python[cubin]'")


@artifacts_group.command("publish")
@click.option("--source", type=click.Path(path_type=Path, exists=True), required=True,
              help="A directory repository holding the release (e.g. the cubin staging area).")
@click.option("--version", "version", required=True, help="The release to publish.")
@click.option("--repository", "repository", required=True,
              help="Destination: a directory, file:// or s3://bucket/prefix.")
@click.option("--adopt-published", "adopt", is_flag=True,
              help="If the release is already published with the same files, replace the "
              "source's manifest by the published one (so a lock or wheel made from the source "
              "pins what users download).")
def publish_cmd(source, version, repository, adopt) -> None:
    """Upload a release; refused if that version is already published with other files."""
    from .publish import publish

    with _errors("publish"):
        result = publish(source, version, repository, adopt=adopt)
    click.echo(result.summary())


@artifacts_group.command("clear")
@click.option("--dest", type=click.Path(path_type=Path), default=None,
              help="Local store (default: FLASHINFER_CUBIN_DIR).")
def clear(dest) -> None:
    """Remove every downloaded kernel binary (the local store)."""
    with _errors("clear"):
        store = _store(dest)
        n = store.clear()
    click.echo(f"removed {n} files from {store.root}")


# ---------------------------------------------------------------------------------------------
# show-config sections
# ---------------------------------------------------------------------------------------------


def artifact_path_lines() -> List[str]:
    """show-config's "Artifact Path": the store, the repositories, the pinned release."""
    lines = [str(knobs.artifacts.cubin_dir)]
    try:
        release = pinned_release()
        lines.append(f"pinned release: {release.version} (manifest sha256 {release.manifest_sha256})")
        urls = " ".join(repository_urls(release))
        lines.append("repositories: " + (knobs.redact(urls) or "none configured"))
    except FlashInferError as e:
        lines.append(f"pinned release: none ({e})")
    from .resolve import installed_cubin_wheel

    wheel = installed_cubin_wheel()
    lines.append(
        "flashinfer-cubin: not installed" if wheel is None else
        f"flashinfer-cubin: {wheel.version} (release {wheel.release or 'none'}) at {wheel.root}"
    )
    return lines


def downloaded_lines(count: int) -> List[str]:
    """show-config's "Downloaded Cubins": the count, then the pinned release's status if its
    manifest is at hand (show-config never downloads)."""
    from .resolve import release_status

    lines = [str(count)]
    try:
        release = pinned_release()
        with knobs.artifacts.scope():
            knobs.artifacts.no_download = True
            rows = release_status(release)
    except FlashInferError:
        return lines
    missing = sum(1 for _, s in rows if s in ("missing", "corrupt"))
    lines.append(f"release {release.version}: {len(rows) - missing} of {len(rows)} files available")
    return lines

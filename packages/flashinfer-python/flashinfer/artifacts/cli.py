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
from .resolve import Release, pinned_release, repository_urls
from .store import Store


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
        if knobs.artifacts.no_download:
            raise click.ClickException(
                "download refused: FLASHINFER_NO_DOWNLOAD=1 is set; unset it to download"
            )
        release = _release(version, manifest_sha256)
        store = _store(dest)
        urls = list(repositories) or None
        manifest = load_manifest(release, store, True, urls)
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
    )


@artifacts_group.command("verify")
@with_release_options
def verify_cmd(version, manifest_sha256, dest) -> None:
    """Re-hash every stored file of a release; corrupt copies are deleted (exit 1). Files the
    store does not hold are counted, not an error (``status`` checks completeness)."""
    from .resolve import load_manifest

    with _errors("verify"):
        release = _release(version, manifest_sha256)
        store = _store(dest)
        manifest = load_manifest(release, store, allow_download=False)
        states = {"present": 0, "missing": 0, "corrupt": []}
        for entry in manifest.files:
            state = store.check(entry)
            if state == "corrupt":
                states["corrupt"].append(entry.path)
                store.object_file(entry).unlink(missing_ok=True)
            else:
                states[state] += 1
    bad = states["corrupt"]
    click.echo(
        f"release {release.version}: {states['present']} verified, {states['missing']} missing, "
        f"{len(bad)} corrupt"
    )
    if bad:
        raise click.ClickException(
            "corrupt files (deleted): " + ", ".join(bad[:10]) + (" ..." if len(bad) > 10 else "")
            + "; run `flashinfer artifacts download` to fetch them again"
        )


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
    an error; ``status`` is the check that fails on them)."""
    with _errors("list"):
        release = _release(version, manifest_sha256)
        lines, _ = _status(release, _store(dest), archs, True)
    for line in lines:
        click.echo(line)


@artifacts_group.command("mirror")
@click.option("--dest", "destination", required=True,
              help="Where the mirror goes: a directory, file:// or s3://bucket/prefix.")
@click.option("--version", "version", default=None, help="Release (default: the pinned one).")
@click.option("--manifest-sha256", "manifest_sha256", default=None,
              help="Manifest hash of a release other than the pinned one.")
@click.option("--repository", "repositories", multiple=True, help="Source repositories, in order.")
@click.option("--dist", type=click.Path(path_type=Path), default=Path("dist"), show_default=True,
              help="Also copy the matching wheels found here.")
@click.option("--store", "store_dir", type=click.Path(path_type=Path), default=None,
              help="Local store used on the way (default: FLASHINFER_CUBIN_DIR).")
def mirror_cmd(destination, version, manifest_sha256, repositories, dist, store_dir) -> None:
    """A complete, self-contained copy of a release (manifest, files, wheels) for offline use."""
    from .publish import mirror

    with _errors("mirror"):
        release = _release(version, manifest_sha256)
        result = mirror(release, destination, list(repositories) or None, dist, _store(store_dir))
    click.echo(result.summary())
    shown = knobs.redact(destination)
    local = "://" not in destination or destination.startswith("file://")
    click.echo(
        f"use it: FLASHINFER_CUBINS_REPOSITORY={shown}"
        # pip reads --find-links from a directory (or a web page), not from s3://
        + (f"; pip install --no-index --find-links {shown}/wheels 'flashinfer-python[cubin]'"
           if result.wheels and local else "")
    )


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

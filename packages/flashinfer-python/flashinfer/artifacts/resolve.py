"""Finding a kernel binary: the pinned release, its manifest, and the file's verified bytes.

``get_cubin(path)`` checks that ``path`` is in the release manifest (whose sha256 is pinned inside
this flashinfer-python build), then looks in the installed ``flashinfer-cubin`` wheel, then the
local store (``FLASHINFER_CUBIN_DIR``), then downloads from the repositories in
``FLASHINFER_CUBINS_REPOSITORY`` (tried in order). ``FLASHINFER_NO_DOWNLOAD=1`` skips the network
repositories (http(s), s3; none is constructed, no socket is opened) but still reads local ones (a
directory or ``file://`` mirror: reading them is not a download); a file none of those has fails
at once, naming the file and the remedy.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from .. import _versions, knobs
from .errors import (
    ArchError,
    ChecksumError,
    DownloadError,
    NotInManifestError,
    OfflineError,
    PinError,
)
from .fetch import Progress, fetch_file, fetch_small
from .manifest import (
    FileEntry,
    Manifest,
    check_sha256,
    check_version,
    manifest_path,
    parse_arch,
)
from .repository import (
    DirectoryRepository,
    Repository,
    open_repository,
    parse_repository_list,
)
from .store import Store, VerifiedBlob, hash_file, verify_local

logger = logging.getLogger("flashinfer.artifacts")

_OFFLINE_REMEDY = (
    "remedy: install the flashinfer-cubin wheel of this release (pip install "
    "flashinfer-cubin=={version}), or run `flashinfer artifacts download` on a machine with "
    "network access and copy its store to {store}, or point FLASHINFER_CUBINS_REPOSITORY at a "
    "local directory (or file://) mirror made with `flashinfer artifacts mirror` (read even "
    "with FLASHINFER_NO_DOWNLOAD=1), or unset FLASHINFER_NO_DOWNLOAD"
)


@dataclass(frozen=True)
class Release:
    """A release of the artifact repository, identified by version and manifest sha256."""

    version: str
    manifest_sha256: str
    repositories: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_version(self.version)
        check_sha256(self.manifest_sha256, f"manifest sha256 of release {self.version}")


def _build_pin():
    try:
        from .. import _artifact_pin as pin
    except ImportError:  # a source tree that was never built
        return None
    return pin


def pinned_release(version: Optional[str] = None, manifest_sha256: Optional[str] = None) -> Release:
    """The release this build trusts: the pin written into the wheel at build time.

    ``FLASHINFER_CUBIN_MANIFEST_SHA256`` pins one where the build carries none (a development
    build); it cannot replace a build's pin. Explicit arguments (the CLI's ``--version`` and
    ``--manifest-sha256``) name another release, which must then come with its hash.

    Raises
    ------
    PinError
        Nothing is pinned, or the variable contradicts the build's pin.
    """
    pin = _build_pin()
    built_sha = getattr(pin, "MANIFEST_SHA256", None)
    built_version = getattr(pin, "RELEASE_VERSION", None)
    built_repos = tuple(getattr(pin, "REPOSITORIES", ()) or ())
    if manifest_sha256 is not None:
        if version is None:
            raise PinError("--manifest-sha256 names a release: give its --version too")
        return Release(version, manifest_sha256.lower(), built_repos)
    if version is not None and version != (built_version or _package_version()):
        raise PinError(
            f"release {version} is not the one this flashinfer build pins "
            f"({built_version or 'none'}); give its manifest hash too (--manifest-sha256), "
            "taken from a source you trust (its release notes, artifacts/releases/ in the repo)"
        )
    env_sha = knobs.artifacts.manifest_sha256
    if built_sha:
        if env_sha and env_sha.lower() != built_sha:
            raise PinError(
                f"FLASHINFER_CUBIN_MANIFEST_SHA256={env_sha} contradicts the release manifest "
                f"sha256 {built_sha} pinned in this flashinfer-python build; unset it"
            )
        return Release(built_version or _package_version(), built_sha, built_repos)
    if env_sha:
        return Release(built_version or _package_version(), env_sha.lower(), built_repos)
    raise PinError(
        f"this flashinfer-python build ({_package_version()}) pins no artifact release (a "
        "development build, or no cubin release was published for it); install a released "
        "wheel, or set FLASHINFER_CUBIN_MANIFEST_SHA256 to the manifest hash of a release you "
        "trust (artifacts/releases/<version>.json)"
    )


def release_is_pinned() -> bool:
    """Whether this build pins a release (in the wheel, or by FLASHINFER_CUBIN_MANIFEST_SHA256)."""
    return bool(getattr(_build_pin(), "MANIFEST_SHA256", None) or knobs.artifacts.manifest_sha256)


def _package_version() -> str:
    from .. import __version__

    return __version__


def repository_urls(release: Release) -> list[str]:
    """``FLASHINFER_CUBINS_REPOSITORY`` if set, else the repositories the release was published to."""
    return parse_repository_list(knobs.artifacts.repository) or list(release.repositories)


def _no_repository_remedy() -> str:
    """What to do when no repository is configured; a local-only release's wheel says why."""
    note = getattr(_build_pin(), "LOCAL_ONLY", None)
    return (f"this build pins a {note}; " if note else "") + (
        "remedy: set FLASHINFER_CUBINS_REPOSITORY (https://, s3:// or a directory)")


def _repositories(
    release: Release, urls: Optional[Sequence[str]] = None, local_only: bool = False
) -> list[Repository]:
    """The repositories to read, in order; ``local_only`` keeps the directory (and ``file://``)
    ones: what ``FLASHINFER_NO_DOWNLOAD=1`` still allows, since reading them is no download.
    Building a repository object opens nothing (an S3 client is made on first use)."""
    repos = [open_repository(u) for u in (urls if urls is not None else repository_urls(release))]
    return [r for r in repos if isinstance(r, DirectoryRepository)] if local_only else repos


def _offline_from(repos: Sequence[Repository], error: DownloadError) -> OfflineError:
    """A local repository lacked a file while downloads are off: say which were read."""
    where = ", ".join(r.shown for r in repos)
    return OfflineError(
        f"{error}\n(downloads are off, FLASHINFER_NO_DOWNLOAD=1: only the local repositories "
        f"{where} were read)"
    )


# ---------------------------------------------------------------------------------------------
# The flashinfer-cubin wheel
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CubinWheel:
    """An installed flashinfer-cubin: a verified release laid out as ``release/files/<path>``."""

    version: str
    release: Optional[str]
    manifest_sha256: Optional[str]
    root: Path

    def manifest_bytes(self) -> bytes:
        return (self.root / "manifest.json").read_bytes()

    def file(self, path: str) -> Path:
        return self.root / "files" / path

    def as_repository(self, manifest: Manifest) -> Repository:
        """The wheel's files as a (local, read-only) repository of ``manifest``'s objects, so
        ``download`` and ``mirror`` take them from here before any network repository."""
        return _WheelRepository(self, manifest)


class _WheelRepository(DirectoryRepository):
    """A directory repository whose objects are the wheel's ``files/<path>``."""

    def __init__(self, wheel: CubinWheel, manifest: Manifest):
        super().__init__(wheel.root, f"flashinfer-cubin at {wheel.root}")
        self._files = {e.object_path: wheel.file(e.path) for e in manifest.files}

    def file(self, path: str) -> Path:
        return self._files.get(path) or self.root / "files" / ".not-in-the-wheel" / path


def installed_cubin_wheel() -> Optional[CubinWheel]:
    """The installed flashinfer-cubin; None when there is none, or (with one warning) when it
    cannot even be imported."""
    if importlib.util.find_spec("flashinfer_cubin") is None:
        return None
    try:
        mod = importlib.import_module("flashinfer_cubin")
    except Exception as e:  # noqa: BLE001 - a broken sibling must not break the ops
        _warn_once(("cubin-import",), (
            f"flashinfer-cubin cannot be imported ({type(e).__name__}: {e}); it is ignored. "
            "Fix: pip install --force-reinstall --no-deps "
            f"'flashinfer-cubin=={_versions.public_version(_package_version())}' "
            "(or pip uninstall flashinfer-cubin)."
        ))
        return None
    return CubinWheel(
        version=getattr(mod, "__version__", "unknown"),
        release=getattr(mod, "RELEASE_VERSION", None),
        manifest_sha256=getattr(mod, "MANIFEST_SHA256", None),
        root=Path(getattr(mod, "RELEASE_DIR", Path(mod.__file__).parent / "release")),
    )


def _is_the_pinned_release(release: Release) -> bool:
    """Whether ``release`` is the one this build pins (not one named by ``--version`` and
    ``--manifest-sha256``)."""
    pinned = getattr(_build_pin(), "MANIFEST_SHA256", None) or knobs.artifacts.manifest_sha256
    return bool(pinned) and pinned.lower() == release.manifest_sha256


#: What this process has warned about (each warning is given once).
_WARNED: set = set()
_WARNED_LOCK = threading.Lock()


def cubin_wheel_for(release: Release) -> Optional[CubinWheel]:
    """The installed flashinfer-cubin if it serves ``release``, i.e. holds its manifest.

    For the pinned release, a wheel of another manifest is ignored with one
    :class:`~flashinfer._versions.VersionMismatchWarning` per process naming both versions and
    the ``pip install`` that fixes it (:func:`flashinfer._versions.check_cubin_release`); never
    an error, so a stale wheel cannot break an op that the store or a download can serve.
    ``FLASHINFER_DISABLE_VERSION_CHECK=1`` silences the warning; such a wheel is still not used
    (its files are not the pinned ones). For another release (downloading or mirroring the next
    one, say) the wheel is simply not a source.
    """
    wheel = installed_cubin_wheel()
    if wheel is None or wheel.release is None:
        return None  # none, or an empty development wheel: nothing to serve or complain about
    if wheel.manifest_sha256 == release.manifest_sha256:
        return wheel
    if _is_the_pinned_release(release) and not knobs.artifacts.disable_version_check:
        _warn_once(
            ("cubin-wheel", str(wheel.root), wheel.manifest_sha256, release.manifest_sha256),
            _versions.check_cubin_release(
                _package_version(), release.version, release.manifest_sha256, wheel.version,
                wheel.release, wheel.manifest_sha256,
            ),
        )
    return None


def _warn_once(key: tuple, message: Optional[str]) -> None:
    with _WARNED_LOCK:
        if message is None or key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(message, _versions.VersionMismatchWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# Manifests and files
# ---------------------------------------------------------------------------------------------

_MANIFESTS: dict[tuple[str, str], Manifest] = {}
_MANIFEST_LOCK = threading.Lock()


def _parse_pinned(data: bytes, release: Release) -> Manifest:
    manifest = Manifest.from_bytes(data, release.manifest_sha256)
    if manifest.release != release.version:
        raise PinError(
            f"the pinned manifest is of release {manifest.release}, not {release.version}"
        )
    return manifest


def default_store() -> Store:
    return Store(knobs.artifacts.cubin_dir)


def load_manifest(
    release: Release,
    store: Optional[Store] = None,
    allow_download: Optional[bool] = None,
    repositories: Optional[Sequence[str]] = None,
) -> Manifest:
    """The release's manifest, verified against its pinned sha256 (cached per process)."""
    key = (release.version, release.manifest_sha256)
    with _MANIFEST_LOCK:
        if key in _MANIFESTS:
            return _MANIFESTS[key]
    store = store or default_store()
    allow_download = (not knobs.artifacts.no_download) if allow_download is None else allow_download
    manifest = _local_manifest(release, store)
    if manifest is None:
        # Offline, local mirrors are still read; a read-only command (verify) passes
        # repositories=[] and reads nothing but the store and the wheel.
        repos = _repositories(release, repositories, local_only=not allow_download)
        if not repos and not allow_download:
            where = (
                f"the manifest of artifact release {release.version} is neither in an installed "
                f"flashinfer-cubin nor in {store.root}"
            )
            if knobs.artifacts.no_download:
                raise OfflineError(
                    f"{where}, and downloads are off (FLASHINFER_NO_DOWNLOAD=1) with no local "
                    "repository configured; "
                    + _OFFLINE_REMEDY.format(version=release.version, store=store.root)
                )
            # A read-only command (verify): nothing was downloaded into this store yet.
            raise OfflineError(
                f"{where}, and this command reads only local files; remedy: run `flashinfer "
                f"artifacts download` first (with --dest {store.root} if that is not your "
                "FLASHINFER_CUBIN_DIR), or point --dest at the store that holds the release"
            )
        if not repos:
            raise DownloadError(manifest_path(release.version), [], _no_repository_remedy())
        with store.lock(f"manifest-{release.version}"):
            manifest = _local_manifest(release, store)
            if manifest is None:
                try:
                    (manifest, data), _ = fetch_small(
                        repos,
                        manifest_path(release.version),
                        lambda d: (_parse_pinned(d, release), d),
                    )
                except DownloadError as e:
                    raise (_offline_from(repos, e) if not allow_download else e) from None
                store.save_manifest(release.version, data)
    with _MANIFEST_LOCK:
        _MANIFESTS[key] = manifest
    return manifest


def _local_manifest(release: Release, store: Store) -> Optional[Manifest]:
    """From the cubin wheel, else the store; a stored copy that is not the pinned one is dropped."""
    wheel = cubin_wheel_for(release)
    if wheel is not None:
        return _parse_pinned(wheel.manifest_bytes(), release)
    data = store.read_manifest(release.version)
    if data is None:
        return None
    try:
        return _parse_pinned(data, release)
    except PinError as e:
        logger.warning("discarding a stored manifest that is not the pinned one: %s", e)
        store.discard_manifest(release.version)
        return None


def clear_manifest_cache() -> None:
    with _MANIFEST_LOCK:
        _MANIFESTS.clear()


def lookup(manifest: Manifest, path: str) -> FileEntry:
    entry = manifest.get(path)
    if entry is None:
        raise NotInManifestError(
            f"{path!r} is not in the manifest of artifact release {manifest.release} "
            f"({len(manifest.files)} files); a kernel binary can only be loaded if the pinned "
            "release lists it (is flashinfer-python newer than its cubin release?)"
        )
    return entry




def _warn_checksum_disabled() -> None:
    if knobs.artifacts.checksum_disabled and "checksum" not in _WARNED:
        _WARNED.add("checksum")
        logger.warning(
            "FLASHINFER_CUBIN_CHECKSUM_DISABLED=1: local kernel binaries that do not match the "
            "pinned manifest are loaded anyway, each with an UnverifiedCubinWarning (downloads "
            "are still verified)"
        )


def get_cubin(
    path: str,
    release: Optional[Release] = None,
    allow_download: Optional[bool] = None,
) -> VerifiedBlob:
    """The verified bytes of the kernel binary ``path`` of the pinned release.

    Looks in the installed flashinfer-cubin, then the local store, then downloads (unless
    ``FLASHINFER_NO_DOWNLOAD=1``).

    Raises
    ------
    PinError
        No release is pinned, or a stored manifest is not the pinned one.
    NotInManifestError
        ``path`` is not part of the release.
    OfflineError
        The file is not local and downloads are off; the message names it and the remedy.
    DownloadError
        No repository provided bytes that verify.
    """
    _warn_checksum_disabled()
    release = release or pinned_release()
    allow_download = (not knobs.artifacts.no_download) if allow_download is None else allow_download
    store = default_store()
    manifest = load_manifest(release, store, allow_download)
    entry = lookup(manifest, path)
    wheel = cubin_wheel_for(release)
    if wheel is not None:
        try:
            return verify_local(entry, wheel.file(path).read_bytes(), str(wheel.file(path)))
        except (OSError, ChecksumError) as e:
            logger.warning("the installed flashinfer-cubin has a bad copy of %s: %s", path, e)
    blob = store.read_verified(entry)
    if blob is not None:
        return blob
    repos = _repositories(release, local_only=not allow_download)
    if not repos and not allow_download:
        raise OfflineError(
            f"kernel binary {path} (release {release.version}, sha256 {entry.sha256[:12]}...) "
            f"is not available locally and downloads are off (FLASHINFER_NO_DOWNLOAD=1); "
            + _OFFLINE_REMEDY.format(version=release.version, store=store.root)
        )
    try:
        ensure_object(store, repos, entry)
    except DownloadError as e:
        raise (_offline_from(repos, e) if not allow_download else e) from None
    blob = store.read_verified(entry)
    if blob is None:  # removed or corrupted between the download and this read
        raise ChecksumError(f"{path}: stored copy", entry.sha256, "a file that does not verify")
    return blob


def select_files(manifest: Manifest, archs: Optional[Iterable[str]] = None) -> list[FileEntry]:
    """The files of ``manifest`` for ``archs`` (all files when None or empty).

    Each arch may be written ``9.0a``, ``sm_90a`` or ``90a``; one that does not parse, or that
    the release has no files for, raises :class:`ArchError` listing the release's archs, so a
    typo never passes for "nothing to do".
    """
    wanted = list(archs or [])
    if not wanted:
        return manifest.select(None)
    have = sorted({f.arch for f in manifest.files if f.arch is not None})
    parsed = []
    for text in wanted:
        arch = parse_arch(text)
        if arch is None:
            raise ArchError(text, have, "not an arch")
        if arch not in have:
            raise ArchError(text, have, f"release {manifest.release} has no file for {arch}")
        parsed.append(arch)
    return manifest.select(parsed)


def _present(store: Store, entry: FileEntry, rehash: bool) -> bool:
    """Whether the store has ``entry``: by size, or (``rehash``) by hash, deleting a bad copy."""
    dest = store.object_file(entry)
    try:
        if dest.stat().st_size != entry.size:
            return False
    except FileNotFoundError:
        return False
    if not rehash or hash_file(dest) == (entry.sha256, entry.size):
        return True
    logger.warning("deleting a stored copy of %s that does not verify", entry.path)
    dest.unlink(missing_ok=True)
    return False


def _offline_missing(entry: FileEntry, store: Store) -> OfflineError:
    return OfflineError(
        f"kernel binary {entry.path} (sha256 {entry.sha256[:12]}...) is neither in an installed "
        f"flashinfer-cubin nor in {store.root}, and downloads are off (FLASHINFER_NO_DOWNLOAD=1); "
        "remedy: unset FLASHINFER_NO_DOWNLOAD, or install the flashinfer-cubin wheel of this "
        "release, or point FLASHINFER_CUBINS_REPOSITORY (or --repository) at a local directory "
        "or file:// mirror of it (made with `flashinfer artifacts mirror`)"
    )


def ensure_object(
    store: Store,
    repos: Sequence[Repository],
    entry: FileEntry,
    progress: Progress = None,
    rehash: bool = False,
) -> str:
    """Make sure the store holds a verified copy of ``entry``: ``"present"`` or ``"downloaded"``.

    One process downloads a given file at a time (a per-object lock); the others wait and find
    it present. A copy already there is checked by size, or by hash with ``rehash`` (``download``
    does: it repairs a store); every read hashes it again anyway.
    """
    dest = store.object_file(entry)
    if _present(store, entry, rehash):
        return "present"
    if not repos and knobs.artifacts.no_download:
        raise _offline_missing(entry, store)
    if not repos:
        raise DownloadError(entry.path, [], _no_repository_remedy())
    with store.lock(entry.sha256):
        if _present(store, entry, False):  # another process just finished it
            return "present"
        if store.discard_partials(entry.sha256):
            logger.info("deleted the partial download of %s left by a killed process", entry.path)
        tmp = store.temp_path(entry.sha256)
        fetch_file(repos, entry.object_path, entry.size, entry.sha256, tmp, progress, entry.path)
        store.commit(tmp, dest)
    return "downloaded"


def download_release(
    release: Release,
    archs: Optional[Iterable[str]] = None,
    store: Optional[Store] = None,
    repositories: Optional[Sequence[str]] = None,
    progress: Progress = None,
    jobs: int = 4,
) -> dict[str, int]:
    """Download every file of a release (for ``archs``, or all) into the store.

    Files download ``jobs`` at a time (many small cubins are latency-bound). An installed
    flashinfer-cubin of the release is the first source (a local copy, verified like a
    download); with ``FLASHINFER_NO_DOWNLOAD=1`` it is the only one, and no network repository
    is constructed. The store receives the manifest too, so it is a repository of the release
    (what ``mirror`` publishes from). Returns counts ``{"present": n, "downloaded": m}``;
    raises the first failure after the others finished.
    """
    store = store or default_store()
    offline = knobs.artifacts.no_download
    manifest = load_manifest(release, store, not offline, repositories)
    wheel = cubin_wheel_for(release)
    repos = _repositories(release, repositories, local_only=offline)
    if wheel is not None:
        repos.insert(0, wheel.as_repository(manifest))
        if store.read_manifest(release.version) is None:
            data = wheel.manifest_bytes()
            _parse_pinned(data, release)  # the bytes load_manifest accepted; checked again
            store.save_manifest(release.version, data)
    entries = select_files(manifest, archs)
    counts = {"present": 0, "downloaded": 0}
    lock = threading.Lock()
    safe_progress: Optional[Callable[[int], None]] = None
    if progress is not None:

        def safe_progress(n: int) -> None:
            with lock:
                progress(n)

    errors: list[BaseException] = []

    def one(entry: FileEntry) -> None:
        try:
            try:
                state = ensure_object(store, repos, entry, safe_progress, rehash=True)
            except DownloadError as e:
                if offline:  # only the wheel and local mirrors were asked; none has it
                    raise (_offline_from(repos, e) if len(repos) > (wheel is not None)
                           else _offline_missing(entry, store)) from None
                raise
        except BaseException as e:  # collected; the first is raised once all are done
            with lock:
                errors.append(e)
            return
        with lock:
            counts[state] += 1
        if state == "present" and safe_progress is not None:
            safe_progress(entry.size)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, entries))
    if errors:
        raise errors[0]
    return counts


def release_status(
    release: Release, store: Optional[Store] = None, archs: Optional[Iterable[str]] = None
) -> list[tuple[FileEntry, str]]:
    """Each file of the release and where it is: ``wheel``, ``present`` (in the store),
    ``missing`` or ``corrupt``. Reads only; needs the manifest locally unless downloads are on."""
    store = store or default_store()
    manifest = load_manifest(release, store)
    wheel = cubin_wheel_for(release)
    out = []
    for entry in select_files(manifest, archs):
        state = store.check(entry)
        if state != "present" and wheel is not None:
            f = wheel.file(entry.path)
            if f.is_file() and f.stat().st_size == entry.size:
                state = "wheel" if hash_file(f)[0] == entry.sha256 else "corrupt"
        out.append((entry, state))
    return out

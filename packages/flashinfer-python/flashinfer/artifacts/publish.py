"""Publishing a release to a repository, and mirroring one.

A published release is immutable. Objects are written with conditional writes (a hard link in a
directory, ``If-None-Match: *`` on S3), so nothing is overwritten; the manifest is written last,
so a release is visible only once all its files are; publishing a version again is a no-op if its
files are the same and refused (:class:`PublishConflictError`) if they differ.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .. import knobs
from .errors import ChecksumError, NotFoundError, PublishConflictError
from .manifest import INDEX_PATH, Index, Manifest, manifest_path, sha256_hex
from .repository import DirectoryRepository, Repository, open_repository
from .store import hash_file


@dataclass
class PublishResult:
    version: str
    manifest_sha256: str
    destination: str
    uploaded: int = 0
    present: int = 0
    already_published: bool = False
    adopted: bool = False
    wheels: list[str] = field(default_factory=list)

    def summary(self) -> str:
        state = "already published (same files)" if self.already_published else "published"
        wheels = f", {len(self.wheels)} wheels" if self.wheels else ""
        adopted = "; the source now holds the published manifest" if self.adopted else ""
        return (
            f"release {self.version} {state} at {knobs.redact(self.destination)}: {self.uploaded} files "
            f"uploaded, {self.present} already there{wheels}; manifest sha256 "
            f"{self.manifest_sha256}{adopted}"
        )


def _existing_manifest(dest: Repository, version: str) -> Optional[bytes]:
    try:
        return dest.read(manifest_path(version))
    except NotFoundError:
        return None


def _same_object(dest: Repository, path: str, size: int, sha256: str) -> bool:
    """Whether the object already at ``path`` has exactly our bytes (hashed: a same-size object
    with other bytes under our name would be served to every user of the release, who would
    all refuse it). On S3 this reads the object back, streamed; it happens only for objects
    that were already there (a re-publish, a shared object, a resumed mirror)."""
    if isinstance(dest, DirectoryRepository):
        return hash_file(dest.file(path)) == (sha256, size)
    if dest.exists(path) != size:
        return False
    h, n = hashlib.sha256(), 0
    stream = dest.open(path)
    try:
        for chunk in stream.chunks:
            h.update(chunk)
            n += len(chunk)
    finally:
        stream.close()
    return (h.hexdigest(), n) == (sha256, size)


def publish(
    source_root: Path,
    version: str,
    destination: str,
    progress: Optional[Callable[[int], None]] = None,
    adopt: bool = False,
) -> PublishResult:
    """Publish release ``version`` from the directory repository ``source_root`` (a staging
    area or a store) to ``destination`` (a directory, ``file://`` or ``s3://`` URL).

    A release already published with the same files but another manifest (a rebuild has another
    creation time) is left as it is, and its manifest's hash is the one reported. With
    ``adopt``, the source's manifest is then replaced by the published one, so that what is
    pinned and packed from the source afterwards (the lock, the flashinfer-cubin wheel) is what
    users download: ``nox -s publish`` and ``nox -s release`` do this.

    Raises
    ------
    ChecksumError
        A source file does not match the manifest (nothing is uploaded).
    PublishConflictError
        ``destination`` has release ``version`` with other files, or an object with other bytes.
    """
    src = DirectoryRepository(Path(source_root))
    try:
        data = src.read(manifest_path(version))
    except NotFoundError:
        raise NotFoundError(
            f"{src.file(manifest_path(version))} does not exist: build the release first "
            "(nox -s cubins) or download it (flashinfer artifacts download)"
        ) from None
    manifest = Manifest.from_bytes(data)
    for entry in manifest.files:  # never publish bytes that do not match their manifest
        f = src.file(entry.object_path)
        if not f.is_file():
            raise ChecksumError(f"{entry.path}: source file {f}", entry.sha256, "missing")
        digest, size = hash_file(f)
        if (digest, size) != (entry.sha256, entry.size):
            raise ChecksumError(f"{entry.path}: source file {f}", entry.sha256, digest)
    dest = open_repository(destination)
    result = PublishResult(version, sha256_hex(data), destination)
    existing = _existing_manifest(dest, version)
    if existing is not None:
        _check_same_release(existing, manifest, version, destination)
        result.manifest_sha256 = sha256_hex(existing)
        result.already_published = True
    for entry in manifest.files:
        if dest.put_if_absent(entry.object_path, src.file(entry.object_path)):
            result.uploaded += 1
        elif _same_object(dest, entry.object_path, entry.size, entry.sha256):
            result.present += 1
        else:
            raise PublishConflictError(
                f"{destination}/{entry.object_path} exists with other bytes than {entry.path} "
                "(sha256 names must match their content): repair or replace that repository"
            )
        if progress is not None:
            progress(entry.size)
    if existing is None and not dest.put_bytes_if_absent(manifest_path(version), data):
        # Another publisher got there between our check and our write.
        existing = dest.read(manifest_path(version))
        _check_same_release(existing, manifest, version, destination)
        result.manifest_sha256 = sha256_hex(existing)
        result.already_published = True
    final = Manifest.from_bytes(existing) if existing is not None else manifest

    def add(old: Optional[bytes]) -> bytes:
        index = Index.from_bytes(old) if old else Index()
        index.add(final, result.manifest_sha256)
        return index.to_bytes()

    dest.update(INDEX_PATH, add)
    if adopt and existing is not None and existing != data:
        _adopt(Path(source_root), version, existing, result.manifest_sha256)
        result.adopted = True
    return result


def _adopt(source_root: Path, version: str, published: bytes, sha256: str) -> None:
    """Make the source's manifest of ``version`` the published one (same files, checked by the
    caller), and its index say so."""
    src = DirectoryRepository(source_root)
    target = src.file(manifest_path(version))
    tmp = target.with_name(f".{target.name}.adopt.tmp")
    tmp.write_bytes(published)
    os.replace(tmp, target)
    final = Manifest.from_bytes(published, sha256)

    def add(old: Optional[bytes]) -> bytes:
        index = Index.from_bytes(old) if old else Index()
        index.add(final, sha256)
        return index.to_bytes()

    src.update(INDEX_PATH, add)


def _check_same_release(existing: bytes, manifest: Manifest, version: str, where: str) -> None:
    old = Manifest.from_bytes(existing)
    if not old.same_content(manifest):
        changed = {f.path for f in old.files} ^ {f.path for f in manifest.files} or {
            f.path for f in manifest.files if old.get(f.path) != f
        }
        raise PublishConflictError(
            f"release {version} is already published at {where} with other files (manifest "
            f"sha256 {sha256_hex(existing)}; differing: {sorted(changed)[:5]}); published "
            "releases are immutable: publish a new version"
        )


_WHEEL = re.compile(r"^(flashinfer_python|flashinfer_cubin|flashinfer_jit_cache)-([^-]+)-.*\.whl$")


def matching_wheels(dist: Path, version: str) -> list[Path]:
    """The wheels of the set for ``version`` in ``dist`` (local versions like +cu130 included)."""
    out = []
    for p in sorted(Path(dist).glob("*.whl")):
        m = _WHEEL.match(p.name)
        if m and (m.group(2) == version or m.group(2).startswith(version + "+")):
            out.append(p)
    return out


def mirror(
    release,
    destination: str,
    repositories=None,
    dist: Optional[Path] = None,
    store=None,
    progress: Optional[Callable[[int], None]] = None,
) -> PublishResult:
    """A complete, self-contained copy of ``release`` at ``destination``: index, manifest, every
    file (all archs), and the matching wheels from ``dist`` under ``wheels/`` (install offline
    with ``pip install --no-index --find-links <mirror>/wheels flashinfer-python[cubin]``)."""
    from .resolve import default_store, download_release

    store = store or default_store()
    download_release(release, None, store, repositories, progress)
    result = publish(store.root, release.version, destination)
    if dist is not None and Path(dist).is_dir():
        dest = open_repository(destination)
        for whl in matching_wheels(Path(dist), release.version):
            if not dest.put_if_absent(f"wheels/{whl.name}", whl):
                if dest.exists(f"wheels/{whl.name}") != whl.stat().st_size:
                    raise PublishConflictError(
                        f"{destination}/wheels/{whl.name} exists with other bytes"
                    )
            result.wheels.append(whl.name)
    return result

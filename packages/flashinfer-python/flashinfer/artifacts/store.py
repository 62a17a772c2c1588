"""The local store of kernel binaries (``FLASHINFER_CUBIN_DIR``) and verified reads.

The store has the layout of a repository, so it can itself serve as one (copy it to another
machine and point ``FLASHINFER_CUBINS_REPOSITORY`` at it)::

    releases/<version>/manifest.json      verified copies of release manifests
    objects/sha256/<aa>/<sha256>.<ext>    file contents, by hash, shared by releases
    .tmp/                                 downloads in progress (never read as results; what a
                                          killed process left is deleted by the next download
                                          of that file)
    .locks/                               one advisory lock per object, so concurrent processes
                                          download each file once

A file enters ``objects/`` only by ``os.replace`` after its sha256 and size matched the manifest,
and it is hashed again every time it is read: :func:`verify` is the only way to obtain a
:class:`VerifiedBlob`, and the loader accepts nothing else. A stored file that no longer verifies
(disk corruption, tampering) is deleted when it is found.

The one exception is FlashInfer's ``FLASHINFER_CUBIN_CHECKSUM_DISABLED=1`` ("skip SHA256
verification", for loading locally replaced kernel binaries): :func:`verify_local` then accepts a
local file that does not match, with an :class:`UnverifiedCubinWarning` naming it, as a blob
marked ``checked=False``; such a file is kept, not deleted. Downloads are verified regardless.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import ContextManager, Optional

from .. import knobs
from .._filelock import file_lock
from .errors import ChecksumError
from .manifest import FileEntry, manifest_path

logger = logging.getLogger("flashinfer.artifacts")

_TOKEN = object()


class VerifiedBlob:
    """The bytes of one manifest entry, checked against its sha256 and size.

    Only :func:`verify` creates one; :mod:`flashinfer.artifacts.loader` loads nothing else.
    """

    __slots__ = ("entry", "data", "source", "checked")

    def __init__(self, entry: FileEntry, data: bytes, source: str, token: object,
                 checked: bool = True):
        if token is not _TOKEN:
            raise TypeError("VerifiedBlob is created only by flashinfer.artifacts.store.verify()")
        object.__setattr__(self, "entry", entry)
        object.__setattr__(self, "data", bytes(data))
        object.__setattr__(self, "source", source)
        # False only for a file accepted unverified under FLASHINFER_CUBIN_CHECKSUM_DISABLED=1
        object.__setattr__(self, "checked", checked)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"VerifiedBlob is immutable (cannot set {name!r})")

    def __repr__(self) -> str:
        return f"VerifiedBlob({self.entry.path!r}, {len(self.data)} bytes from {self.source})"


def verify(entry: FileEntry, data: bytes, source: str) -> VerifiedBlob:
    """Check ``data`` against ``entry``; raise :class:`ChecksumError` if it does not match."""
    if len(data) != entry.size:
        raise ChecksumError(f"{entry.path}: size", str(entry.size), str(len(data)), source)
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise ChecksumError(f"{entry.path}: sha256", entry.sha256, digest, source)
    return VerifiedBlob(entry, data, source, _TOKEN)


class UnverifiedCubinWarning(UserWarning):
    """A kernel binary that does not match the pinned manifest is loaded anyway, because
    FLASHINFER_CUBIN_CHECKSUM_DISABLED=1."""


def verify_local(entry: FileEntry, data: bytes, source: str) -> VerifiedBlob:
    """:func:`verify` for a local file (installed wheel, store). Where
    FLASHINFER_CUBIN_CHECKSUM_DISABLED=1, a file that does not match is returned anyway, with a
    warning naming it and the mismatch, as a blob with ``checked=False``."""
    try:
        return verify(entry, data, source)
    except ChecksumError as e:
        if not knobs.artifacts.checksum_disabled:
            raise
        message = (f"FLASHINFER_CUBIN_CHECKSUM_DISABLED=1: loading {entry.path} from {source} "
                   f"although it does not match the pinned manifest ({e}): this kernel binary "
                   "is UNVERIFIED")
        logger.warning(message)
        warnings.warn(message, UnverifiedCubinWarning, stacklevel=3)
        return VerifiedBlob(entry, data, f"{source} (unverified)", _TOKEN, checked=False)


def hash_file(path: Path) -> tuple[str, int]:
    """(sha256, size) of a file, read in 4 MB blocks (bounded memory)."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(4 << 20)
        view = memoryview(buf)
        while True:
            k = f.readinto(buf)
            if not k:
                break
            h.update(view[:k])
            n += k
    return h.hexdigest(), n


class Store:
    """A local store rooted at ``root`` (see the module docstring for the layout)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    # -- paths ----------------------------------------------------------------------------------

    def object_file(self, entry: FileEntry) -> Path:
        return self.root / entry.object_path

    def manifest_file(self, version: str) -> Path:
        return self.root / manifest_path(version)

    @property
    def tmp_dir(self) -> Path:
        return self.root / ".tmp"

    def temp_path(self, name: str) -> Path:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        return self.tmp_dir / f"{name}.{os.getpid()}.part"

    # -- locking --------------------------------------------------------------------------------

    def lock(self, name: str) -> ContextManager[None]:
        """An exclusive advisory lock; the kernel drops it if the holder dies."""
        return file_lock(self.root / ".locks" / f"{name}.lock")

    # -- reads ----------------------------------------------------------------------------------

    def read_verified(self, entry: FileEntry) -> Optional[VerifiedBlob]:
        """The entry's bytes if the store has a copy that verifies; a copy that does not is
        deleted (it would never be used) and None is returned, unless
        FLASHINFER_CUBIN_CHECKSUM_DISABLED=1 (:func:`verify_local`: kept and returned)."""
        path = self.object_file(entry)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return verify_local(entry, data, str(path))
        except ChecksumError as e:
            logger.warning("deleting a stored file that no longer verifies: %s", e)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return None

    def check(self, entry: FileEntry) -> str:
        """``present``, ``missing`` or ``corrupt`` (read-only: nothing is deleted)."""
        path = self.object_file(entry)
        if not path.is_file():
            return "missing"
        digest, size = hash_file(path)
        return "present" if (digest, size) == (entry.sha256, entry.size) else "corrupt"

    def read_manifest(self, version: str) -> Optional[bytes]:
        try:
            return self.manifest_file(version).read_bytes()
        except FileNotFoundError:
            return None

    # -- writes ---------------------------------------------------------------------------------

    def commit(self, tmp: Path, dest: Path) -> None:
        """Publish a verified temp file under its final name (atomic: readers see all or nothing)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)

    def save_manifest(self, version: str, data: bytes) -> None:
        dest = self.manifest_file(version)
        tmp = self.temp_path(f"manifest-{version}")
        tmp.write_bytes(data)
        self.commit(tmp, dest)

    def discard_manifest(self, version: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.manifest_file(version).unlink()

    def releases(self) -> list[str]:
        d = self.root / "releases"
        return sorted(p.name for p in d.iterdir() if (p / "manifest.json").is_file()) if (
            d.is_dir()
        ) else []

    def clear(self) -> int:
        """Remove the whole store; returns the number of files removed."""
        if not self.root.exists():
            return 0
        count = sum(1 for p in self.root.rglob("*") if p.is_file())
        shutil.rmtree(self.root)
        return count

    def discard_partials(self, name: str) -> int:
        """Delete the partial downloads of ``name`` (left by a process that was killed mid-file:
        a temp file is deleted on every failure the process survives). Call it holding
        ``lock(name)``: every live writer of ``name`` holds it, so what is found is dead."""
        count = 0
        if self.tmp_dir.is_dir():
            for p in self.tmp_dir.glob(f"{name}.*.part"):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                    count += 1
        return count

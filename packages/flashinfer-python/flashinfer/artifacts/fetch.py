"""Downloading one file from an ordered list of repositories, verified as it streams.

Memory stays bounded (1 MB chunks straight to a temp file); the sha256 is computed on the fly, so
a finished download is verified without reading it again. A dropped connection or a truncated
body is retried with jittered exponential backoff and *resumed* from the bytes already written
(HTTP ``Range``, S3 ranged GET, a file seek); the hash state carries over. A repository that does
not have the file, or serves other bytes, is skipped for the next one. On any failure the temp
file is deleted: a file that does not verify is never kept.

Each file has a deadline for all its attempts and repositories together
(``FLASHINFER_DOWNLOAD_DEADLINE``, default :func:`default_deadline`): the read timeout only
bounds a silence, so without it a server that trickles a byte a second would never be given up on.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, TypeVar

from .. import knobs
from .errors import DownloadError, NotFoundError, RepositoryError, TransientError
from .repository import DeadlineExceeded, Repository, remaining, until

T = TypeVar("T")

logger = logging.getLogger("flashinfer.artifacts")

Progress = Optional[Callable[[int], None]]

#: Longest pause between two attempts, seconds.
MAX_BACKOFF = 30.0

#: The default deadline of one file: this many seconds, plus one per :data:`DEADLINE_RATE`
#: bytes of the file (a transfer slower than 256 KiB/s on average is given up on).
DEADLINE_BASE = 300.0
DEADLINE_RATE = 256 << 10


def default_deadline(size: int) -> float:
    """Seconds a file of ``size`` bytes may take when FLASHINFER_DOWNLOAD_DEADLINE is unset:
    300 plus one per 256 KiB (5 min for a small file, 21 min for 256 MiB)."""
    return DEADLINE_BASE + size / DEADLINE_RATE


def file_deadline(size: int) -> float:
    """FLASHINFER_DOWNLOAD_DEADLINE, else :func:`default_deadline` of ``size``."""
    knob = knobs.artifacts.download_deadline
    return default_deadline(size) if knob is None else knob


def _deadline_message(seconds: float) -> str:
    how = ("FLASHINFER_DOWNLOAD_DEADLINE" if knobs.artifacts.download_deadline is not None
           else "the default: 300 s + 1 s per 256 KiB; set FLASHINFER_DOWNLOAD_DEADLINE")
    return f"not complete within its deadline of {seconds:g} s ({how})"


def backoff_delay(attempt: int, base: Optional[float] = None) -> float:
    """Full jitter: uniform in [0, base * 2**attempt], capped; spreads out clients that failed
    together (a restarted server) instead of retrying in lockstep."""
    base = knobs.artifacts.download_backoff if base is None else base
    return random.uniform(0.0, min(MAX_BACKOFF, base * (2**attempt)))


class _Partial:
    """The temp file and running hash of one download (kept across retries and repositories:
    the content is addressed by its hash, so any repository can continue it)."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "wb", buffering=0)
        self.hash = hashlib.sha256()
        self.size = 0
        #: Whether the bytes were received in more than one response (a resume, possibly from
        #: another repository): a mismatch then does not say which response was bad.
        self.stitched = False

    def reset(self) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.hash = hashlib.sha256()
        self.size = 0
        self.stitched = False

    def write(self, chunk: bytes) -> None:
        self.file.write(chunk)
        self.hash.update(chunk)
        self.size += len(chunk)


def _receive(repo: Repository, relpath: str, part: _Partial, size: int, progress: Progress,
             deadline: Optional[float] = None):
    """One attempt: append the rest of the file to ``part``. Raises TransientError (retry),
    NotFoundError / RepositoryError (next repository), DeadlineExceeded (give up)."""
    stream = repo.open(relpath, part.size, deadline)
    try:
        if stream.start != part.size:
            if stream.start != 0:
                raise TransientError(f"{repo.shown}/{relpath}: resumed at {stream.start}, "
                                     f"asked for {part.size}")
            part.reset()  # the server ignored the range request: start over
        elif part.size:
            part.stitched = True
        received = 0
        for chunk in until(stream.chunks, deadline, f"{repo.shown}/{relpath}"):
            if part.size + len(chunk) > size:
                raise RepositoryError(
                    f"{repo.shown}/{relpath}: more than the manifest's {size} bytes"
                )
            part.write(chunk)
            received += len(chunk)
            if progress is not None:
                progress(len(chunk))
        if part.size < size:
            if stream.length is not None and received >= stream.length:
                # The server sent all it announced: its copy is short, retrying will not help.
                raise RepositoryError(
                    f"{repo.shown}/{relpath}: the repository's copy has {part.size} bytes, the "
                    f"manifest says {size}"
                )
            raise TransientError(
                f"{repo.shown}/{relpath}: body ended after {part.size} of {size} bytes"
            )
    finally:
        stream.close()


def _with_retries(
    op: Callable[[], T], attempts: list[str], deadline: Optional[float] = None
) -> tuple[bool, Optional[T]]:
    """``(True, op())`` from one repository, retrying a :class:`TransientError` (with jittered
    backoff) up to ``FLASHINFER_DOWNLOAD_RETRIES`` times; ``(False, None)`` once it gave up or
    the repository said no (404, another 4xx), every failure recorded in ``attempts``.
    :class:`DeadlineExceeded` goes through: the file is given up on, not the repository."""
    retries = knobs.artifacts.download_retries
    for attempt in range(retries):
        try:
            return True, op()
        except TransientError as e:
            attempts.append(f"{e} (attempt {attempt + 1} of {retries})")
            if attempt + 1 < retries:
                delay = backoff_delay(attempt)
                left = remaining(deadline, "waiting to retry")
                time.sleep(delay if left is None else min(delay, left))
        except (NotFoundError, RepositoryError) as e:
            attempts.append(str(e))
            break
    return False, None


def fetch_file(
    repos: Sequence[Repository],
    relpath: str,
    size: int,
    sha256: str,
    dest_tmp: Path,
    progress: Progress = None,
    what: Optional[str] = None,
) -> None:
    """Download ``relpath`` into ``dest_tmp``; on return the file is complete and verified.

    Raises
    ------
    DownloadError
        No repository provided bytes matching ``size`` and ``sha256``; ``dest_tmp`` is gone.
    """
    attempts: list[str] = []
    part = _Partial(dest_tmp)
    ok = False
    seconds = file_deadline(size)
    deadline = time.monotonic() + seconds

    def receive(repo: Repository) -> None:
        if part.size < size or size == 0:  # the rest (a resume, or from another repository)
            _receive(repo, relpath, part, size, progress, deadline)

    try:
        for repo in repos:
            # A second, whole-file try from the same repository when the bad bytes may have
            # come from an earlier response (a resume after a drop, another repository).
            for _ in range(2):
                try:
                    got = _with_retries(lambda repo=repo: receive(repo), attempts, deadline)[0]
                except DeadlineExceeded as e:
                    attempts.append(f"{e}: {_deadline_message(seconds)}")
                    raise DownloadError(what or relpath, attempts) from None
                if not got:
                    break
                digest = part.hash.hexdigest()
                if digest == sha256:
                    ok = True
                    return
                attempts.append(
                    f"{repo.shown}/{relpath}: sha256 {digest}, the manifest says {sha256} "
                    "(discarded)"
                )
                stitched = part.stitched
                part.reset()
                if not stitched:
                    break
        raise DownloadError(
            what or relpath,
            attempts,
            "remedy: check FLASHINFER_CUBINS_REPOSITORY (an ordered list of https://, s3:// or "
            "directory repositories), the network/proxy (HTTPS_PROXY), or install "
            "flashinfer-cubin for offline use",
        )
    finally:
        part.file.close()
        if not ok:
            with contextlib.suppress(FileNotFoundError):
                dest_tmp.unlink()


def fetch_small(repos: Sequence[Repository], relpath: str, accept: Callable[[bytes], object]):
    """A small file (a manifest) from the first repository whose bytes ``accept`` takes.

    ``accept(data)`` returns the parsed value or raises; its error is recorded and the next
    repository tried. Transient failures are retried as for big files (whole file each time).
    Returns ``(value, repo)``; raises DownloadError listing every attempt, or the last
    ``accept`` error when every repository answered with bytes ``accept`` refused.
    """
    attempts: list[str] = []
    refusals: list[Exception] = []
    seconds = file_deadline(0)
    deadline = time.monotonic() + seconds
    for repo in repos:
        try:
            got, data = _with_retries(
                lambda repo=repo: repo.read(relpath, deadline=deadline), attempts, deadline
            )
        except DeadlineExceeded as e:
            attempts.append(f"{e}: {_deadline_message(seconds)}")
            raise DownloadError(relpath, attempts) from None
        if not got:
            continue
        try:
            return accept(data), repo
        except Exception as e:  # noqa: BLE001 - recorded; re-raised below
            attempts.append(f"{repo.shown}/{relpath}: {e}")
            refusals.append(e)
    if repos and len(refusals) == len(repos):
        # Every repository answered, with bytes we refuse (a manifest that is not the pinned
        # one, say): that error, with its remedy, is the useful one.
        raise refusals[-1]
    raise DownloadError(
        relpath,
        attempts,
        "remedy: check FLASHINFER_CUBINS_REPOSITORY and the network, or install flashinfer-cubin",
    )

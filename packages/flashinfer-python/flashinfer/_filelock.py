"""One cross-process lock for every cache the package writes (JIT builds, the cubin store,
directory repositories)."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory ``fcntl`` lock on ``path`` (created, with its directory, if
    missing). The kernel releases it if the holder dies, so a crashed process never leaves a
    stale lock behind (unlike an ``O_EXCL`` lock file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

"""One sha256 over every kernel source the package ships (``include/`` and ``csrc/``).

The flashinfer-python wheel records it (``flashinfer._build_meta.__source_digest__``) for the
tree it bundles as ``flashinfer/data``, and the flashinfer-jit-cache wheel records it for the tree
its modules were compiled from (``source_digest`` in its manifest). When both agree, the bytes
behind every module's URI are the same on both sides, so the JIT can match the wheel's modules by
their flags alone instead of reading and hashing every source and header on the first call
(:func:`flashinfer.jit.core.config_key`).

Standard library only, and no imports from the package: the build hooks
(``packages/flashinfer-python/hatch_build.py``) and ``tools/wheels/check.py`` load this file by
path, so the three places compute the digest with the same code.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Iterator

#: The directories of a source root whose files the digest covers: what the core wheel bundles
#: under ``flashinfer/data/`` and what the JIT compiles from.
SOURCE_DIRS = ("include", "csrc")
_SKIP_PARTS = {"__pycache__"}


def digest_files(files: Iterable[tuple[str, bytes]]) -> str:
    """sha256 (hex) of ``(relative posix path, bytes)`` pairs, independent of their order.

    >>> digest_files([("csrc/a.cu", b"x")]) == digest_files([("csrc/a.cu", b"x")])
    True
    >>> digest_files([("csrc/a.cu", b"x")]) == digest_files([("csrc/b.cu", b"x")])
    False
    """
    h = hashlib.sha256(b"flashinfer-source-digest-v1\0")
    for rel, data in sorted(files):
        name = rel.encode()
        h.update(len(name).to_bytes(8, "little") + name)
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def tree_files(root: Path) -> Iterator[tuple[str, bytes]]:
    """``(path relative to root, bytes)`` of every file under ``root/include`` and
    ``root/csrc`` (Python byte-code caches aside)."""
    for sub in SOURCE_DIRS:
        base = root / sub
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            rel = path.relative_to(root)
            if path.is_file() and not _SKIP_PARTS.intersection(rel.parts) and path.suffix != ".pyc":
                yield rel.as_posix(), path.read_bytes()


def tree_digest(root: Path) -> str:
    """The digest of the source tree at ``root`` (holding ``include/`` and ``csrc/``).

    Raises
    ------
    FileNotFoundError
        ``root`` holds neither directory.
    """
    if not any((root / sub).is_dir() for sub in SOURCE_DIRS):
        raise FileNotFoundError(f"root must hold {' or '.join(SOURCE_DIRS)}/, got {root}")
    return digest_files(tree_files(root))

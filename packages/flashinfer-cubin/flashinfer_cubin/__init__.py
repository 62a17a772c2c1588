"""FlashInfer kernel binaries (cubins) of one artifact release, verified at build time.

``flashinfer`` finds this package by itself and prefers it over downloads: each file is at
``RELEASE_DIR / "files" / <path>``, listed (with its sha256) in ``RELEASE_DIR / "manifest.json"``,
whose sha256 is ``MANIFEST_SHA256``. flashinfer checks that hash against the one pinned in
flashinfer-python, and every file's hash as it reads it.
"""

from pathlib import Path

try:
    from ._build_meta import MANIFEST_SHA256, RELEASE_VERSION, __version__
except ImportError:  # a source tree that was never built
    __version__ = "0.0.0+unknown"
    RELEASE_VERSION = None
    MANIFEST_SHA256 = None

RELEASE_DIR = Path(__file__).resolve().parent / "release"

__all__ = ["MANIFEST_SHA256", "RELEASE_DIR", "RELEASE_VERSION", "__version__"]

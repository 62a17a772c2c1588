"""Kernel binaries (cubins): the release manifest, repositories, the verified store, the loader.

The design in one paragraph (details in docs/artifacts.md): a release is a manifest plus files in
an artifact repository (a directory, https, or S3); the manifest's sha256 is pinned inside the
flashinfer-python wheel at build time; :func:`get_cubin` finds a file of the pinned release in the
installed ``flashinfer-cubin`` wheel, the local store or a repository, verifying every byte; the
loader (``loader.py``) hands only verified bytes to the CUDA driver.

Importing this package (and running its CLI) imports neither torch nor requests nor boto3;
``kernels.py``, the ops served from cubins, is the only part that needs torch.
"""

from __future__ import annotations

import sys

from .errors import (
    ArchError,
    ArtifactError,
    ChecksumError,
    DownloadError,
    LoaderError,
    ManifestError,
    NotInManifestError,
    OfflineError,
    PinError,
    PublishConflictError,
    RepositoryError,
)
from .manifest import FileEntry, KernelInfo, Manifest, ParamLayout
from .resolve import (
    Release,
    download_release,
    get_cubin,
    load_manifest,
    pinned_release,
    release_status,
)
from .store import Store, UnverifiedCubinWarning, VerifiedBlob

__all__ = [
    "BACKENDS",
    "check_backend",
    "ArchError",
    "ArtifactError",
    "ChecksumError",
    "DownloadError",
    "FileEntry",
    "KernelInfo",
    "LoaderError",
    "Manifest",
    "ManifestError",
    "NotInManifestError",
    "OfflineError",
    "ParamLayout",
    "PinError",
    "PublishConflictError",
    "Release",
    "RepositoryError",
    "Store",
    "UnverifiedCubinWarning",
    "VerifiedBlob",
    "clear_caches",
    "download_release",
    "get_cubin",
    "load_manifest",
    "pinned_release",
    "release_status",
]


def clear_caches() -> None:
    """Forget what this process has read and loaded: the verified manifests, the cubin kernels
    and the loader's modules, so the next use finds, verifies and loads every file again (as a
    new process would). For tests, and after changing the store or the installed wheels.
    """
    from . import loader, resolve

    resolve.clear_manifest_cache()
    loader.clear_caches()
    kernels = sys.modules.get(f"{__name__}.kernels")  # imported only with torch, by the ops
    if kernels is not None:
        kernels.clear_cache()


def __getattr__(name: str):
    # ``backend=``'s values and check live in flashinfer._checks, which imports torch; the
    # artifact client and CLI must not (nox -s publish / mirror run them without torch).
    if name in ("BACKENDS", "check_backend"):
        from .. import _checks

        return getattr(_checks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

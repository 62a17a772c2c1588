"""The errors of the artifact client: each says what failed and what to do about it.

All derive from :class:`ArtifactError` (a :class:`~flashinfer.exceptions.FlashInferError`), so a
caller can catch the family; the CLI turns any of them into a non-zero exit with the message.
"""

from __future__ import annotations

from typing import Optional

from ..exceptions import FlashInferError


class ArtifactError(FlashInferError, RuntimeError):
    """Base class of the artifact client's errors."""


class ManifestError(ArtifactError, ValueError):
    """A manifest or index does not parse or breaks the schema (bad path, bad hash, ...)."""


class ArchError(ArtifactError, ValueError):
    """An arch was asked for (``--arch``) that is malformed or that the release has no files for.

    Attributes
    ----------
    argument : str
        The arch as given.
    expected : list of str
        The archs the release has files for.
    """

    def __init__(self, argument: str, expected: list[str], why: str):
        self.argument = argument
        self.expected = list(expected)
        super().__init__(
            f"--arch {argument!r}: {why}; the release has files for {self.expected or 'no arch'} "
            "(write them as 9.0a, sm_90a or 90a)"
        )


class PinError(ArtifactError):
    """No release is pinned, or a manifest does not hash to the pinned sha256."""


class NotInManifestError(ArtifactError, KeyError):
    """A kernel binary was asked for that the release manifest does not list."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class OfflineError(ArtifactError):
    """A file is missing locally and downloads are off (FLASHINFER_NO_DOWNLOAD=1)."""


class DownloadError(ArtifactError):
    """Every repository failed to provide a file.

    Attributes
    ----------
    path : str
        The repository-relative path that was asked for.
    attempts : list of str
        One line per repository tried: what went wrong there.
    """

    def __init__(self, path: str, attempts: list[str], remedy: str = ""):
        self.path = path
        self.attempts = list(attempts)
        lines = "\n  ".join(self.attempts) or "(no repository configured)"
        tail = f"\n{remedy}" if remedy else ""
        super().__init__(f"could not download {path}:\n  {lines}{tail}")


class ChecksumError(ArtifactError):
    """Bytes whose sha256 or size is not the one the manifest gives (never kept, never loaded)."""

    def __init__(self, what: str, expected: str, received: str, where: Optional[str] = None):
        self.expected = expected
        self.received = received
        at = f" from {where}" if where else ""
        super().__init__(f"{what}{at}: expected {expected}, received {received}")


class RepositoryError(ArtifactError):
    """A repository URL is not usable (unknown scheme, missing boto3, bad bucket...)."""


class NotFoundError(RepositoryError):
    """The repository answered that the object does not exist (404 / NoSuchKey / no file)."""


class TransientError(RepositoryError):
    """A failure worth retrying: connection dropped, timeout, truncated body, 5xx."""


class PublishConflictError(ArtifactError):
    """A published release (or object) exists with other bytes: releases are immutable."""


class LoaderError(ArtifactError):
    """The CUDA driver could not be reached, or refused to load or launch a kernel binary.

    Attributes
    ----------
    call : str
        The driver call that failed, e.g. ``cuModuleLoadData``.
    code : int
        The ``CUresult`` it returned (-1 when the driver itself could not be loaded).
    """

    def __init__(self, call: str, code: int, detail: str):
        self.call = call
        self.code = code
        super().__init__(f"{call} failed ({code}): {detail}")

"""Precompiled FlashInfer modules for one CUDA major and a list of GPU archs.

flashinfer finds a module here by its URI (``modules/<uri>/<name>.so``) when the URI it computes
for the module matches, after checking this wheel's version and CUDA major against its own; it
reads ``manifest.json`` directly and never imports this package. This package is the small API
for people and tools: what the wheel holds, and whether its files are intact.

>>> import flashinfer_jit_cache as jc        # doctest: +SKIP
>>> jc.__version__, jc.cuda_version(), jc.arch_list()   # doctest: +SKIP
('X.Y.Z+cu130', '13.0', ['8.0', '9.0a', '10.0a', '12.0a'])

Importing it reads nothing; the manifest is read (once) by the first function that needs it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST_PATH = PACKAGE_DIR / "manifest.json"


@functools.cache
def manifest() -> dict:
    """The manifest written by the wheel's build: ``version``, ``flashinfer_version``,
    ``cuda_version``, ``nvcc_version``, ``tvm_ffi_version``, ``arch_list``, ``git_commit`` and
    ``modules`` (each: ``name``, ``uri``, ``archs``, ``path``, ``sha256``, ``size``)."""
    return json.loads(MANIFEST_PATH.read_text())


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return manifest()["version"]
    raise AttributeError(f"module 'flashinfer_jit_cache' has no attribute {name!r}")


def arch_list() -> list[str]:
    """The GPU archs the modules were built for, e.g. ``['9.0a']``."""
    return list(manifest()["arch_list"])


def cuda_version() -> str:
    """The CUDA toolkit version the modules were built with, e.g. ``'13.0'``."""
    return manifest()["cuda_version"]


def modules() -> list[dict]:
    """One record per module (name, uri, archs, path relative to the package, sha256, size)."""
    return [dict(m) for m in manifest()["modules"]]


def module_path(uri: str) -> Path:
    """The ``.so`` of the module with this URI.

    Raises
    ------
    KeyError
        No module of the wheel has this URI; the message lists the URIs it has.
    """
    for m in manifest()["modules"]:
        if m["uri"] == uri:
            return PACKAGE_DIR / m["path"]
    known = ", ".join(m["uri"] for m in manifest()["modules"])
    raise KeyError(f"uri must be one of this wheel's modules ({known}), got {uri!r}")


def verify() -> list[str]:
    """Check every module file against its recorded size and sha256; returns the problems
    (empty when the wheel is intact)."""
    problems = []
    for m in manifest()["modules"]:
        path = PACKAGE_DIR / m["path"]
        if not path.is_file():
            problems.append(f"{m['uri']}: {path} is missing")
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        if path.stat().st_size != m["size"] or h.hexdigest() != m["sha256"]:
            problems.append(
                f"{m['uri']}: {path} should have sha256 {m['sha256']} and {m['size']} bytes, "
                f"has {h.hexdigest()} and {path.stat().st_size}"
            )
    return problems

"""Hatch hooks shared in spirit by the three packages: the version comes from the monorepo's
``version.txt`` (or the copy an sdist carries), and the build writes ``_build_meta.py`` with the
version, the git commit and the digest of the kernel sources it bundles, so the installed package
knows all three without reading files at import (the digest lets the JIT match the jit-cache
wheel's modules without hashing sources: ``flashinfer/jit/source_digest.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.metadata.plugin.interface import MetadataHookInterface

HERE = Path(__file__).resolve().parent


def read_version(root: Path) -> str:
    for candidate in (root / "version.txt", root.parent.parent / "version.txt"):
        if candidate.is_file():
            return candidate.read_text().strip()
    raise FileNotFoundError(f"version.txt not found next to {root} nor at the monorepo root")


def git_commit(root: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


#: What a lock may name as the repositories users download from (tools/nox_artifacts.py).
PUBLIC_SCHEMES = ("https://", "http://", "s3://")

#: extra name -> sibling distribution; each extra pins its sibling to exactly our version.
SIBLING_EXTRAS = {"jit-cache": "flashinfer-jit-cache", "cubin": "flashinfer-cubin"}


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: dict) -> None:
        version = read_version(Path(self.root))
        metadata["version"] = version
        # "==X.Y.Z" also matches the jit-cache wheel's "X.Y.Z+cu130" (PEP 440 ignores the local
        # label when the specifier has none); which CUDA build is chosen by the index.
        metadata["optional-dependencies"] = {
            extra: [f"{dist}=={version}"] for extra, dist in SIBLING_EXTRAS.items()
        }
        # s3:// artifact repositories (downloads, mirrors, publishing); conditional writes
        # (If-None-Match) need botocore 1.35+.
        metadata["optional-dependencies"]["s3"] = ["boto3>=1.35"]


def source_digest(root: Path) -> str:
    """The digest of ``root``'s include/ and csrc/ (the files the wheel bundles as
    flashinfer/data), computed by the package's own ``flashinfer/jit/source_digest.py``."""
    import importlib.util

    path = root / "flashinfer" / "jit" / "source_digest.py"
    spec = importlib.util.spec_from_file_location("_flashinfer_source_digest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tree_digest(root)


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        root = Path(self.root)
        meta = root / "flashinfer" / "_build_meta.py"
        meta.write_text(
            '"""Written by hatch_build.py at build time."""\n'
            f'__version__ = "{read_version(root)}"\n'
            f'__git_commit__ = "{git_commit(root)}"\n'
            f'__source_digest__ = "{source_digest(root)}"\n'
        )
        write_artifact_pin(root, read_version(root))


def write_artifact_pin(root: Path, version: str) -> None:
    """Pin the artifact release's manifest sha256 into the wheel (flashinfer/_artifact_pin.py).

    From the lock ``artifacts/releases/<version>.json`` that publishing a release writes (or the
    lock file ``FLASHINFER_ARTIFACT_LOCK`` names). In an sdist (no monorepo around it) the pin
    written when the sdist was made is kept. No lock: no pin (a development build), and the
    cubin backend then asks for one (FLASHINFER_CUBIN_MANIFEST_SHA256) instead of trusting any
    manifest a repository serves.

    The repositories recorded are where users download the release from: URLs, never a path of
    the machine that built it (refused). A lock without any is a local-only release, and the
    pin says so (``LOCAL_ONLY``: the lock's note; users set FLASHINFER_CUBINS_REPOSITORY).
    """
    import json
    import os

    target = root / "flashinfer" / "_artifact_pin.py"
    lock = os.environ.get("FLASHINFER_ARTIFACT_LOCK")
    path = Path(lock) if lock else root.parent.parent / "artifacts" / "releases" / f"{version}.json"
    if path.is_file():
        data = json.loads(path.read_text())
        if data.get("release") != version:
            raise ValueError(f"{path} is the artifact lock of {data.get('release')}, not {version}")
        pin, repos = str(data["manifest_sha256"]), list(data.get("repositories", []))
        local = [r for r in repos if not str(r).startswith(PUBLIC_SCHEMES)]
        if local:
            raise ValueError(
                f"{path} names {local} as where users download release {version} from: a "
                "path of the machine that built it. A lock names public URLs "
                f"({', '.join(PUBLIC_SCHEMES)}; FLASHINFER_PUBLIC_REPOSITORIES), or none "
                "(a local-only release)"
            )
        local_only = None if repos else str(data.get("local_only") or "local-only release")
    elif (root / "PKG-INFO").is_file() and target.is_file():
        return
    else:
        pin, repos, local_only = None, [], None
    target.write_text(
        '"""Written by hatch_build.py at build time: the artifact release this build trusts."""\n'
        f"RELEASE_VERSION = {json.dumps(version)}\n"
        f"MANIFEST_SHA256 = {json.dumps(pin) if pin else 'None'}\n"
        f"REPOSITORIES = {tuple(repos)!r}\n"
        f"LOCAL_ONLY = {local_only!r}\n"
    )

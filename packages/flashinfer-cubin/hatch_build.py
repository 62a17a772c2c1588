"""Build hooks of flashinfer-cubin: the version from the monorepo, and the wheel's contents from
one verified artifact release.

The release comes from ``FLASHINFER_CUBIN_RELEASE`` (a repository directory, ``file://`` URL, or
http(s) URL: the only place this build reads from), e.g. the staging area of ``nox -s cubins`` or
an offline mirror. Its manifest must hash to the pinned sha256: the lock
``artifacts/releases/<version>.json`` of the monorepo (or the file ``FLASHINFER_ARTIFACT_LOCK``
names), else ``FLASHINFER_CUBIN_MANIFEST_SHA256``. Every file is copied with its sha256 and size
checked against the manifest, under ``flashinfer_cubin/release/files/<path>``, next to the
manifest itself; the wheel then holds every file of the release and nothing unverified.

The sdist carries the verified release, so a wheel built from the sdist needs no repository: it
re-verifies the bundled copy against the pin recorded in the sdist. Without a release (a
development build of an unreleased version) the wheel holds none, and says so.

This hook needs nothing but the standard library, so the build stays hermetic. It re-implements
the few manifest checks it needs (tests/artifacts/test_cubin_wheel.py holds it to the package's
rules in flashinfer/artifacts/manifest.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.metadata.plugin.interface import MetadataHookInterface

# Package indexes refuse files over 100 MB by default (docs/artifacts.md says how to split).
SIZE_LIMIT = 100 * 1000 * 1000
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_COMPONENT = r"[A-Za-z0-9_][A-Za-z0-9._+-]*"
_PATH = re.compile(rf"^{_COMPONENT}(/{_COMPONENT})*$")


class CubinBuildError(RuntimeError):
    pass


def read_version(root: Path) -> str:
    for candidate in (root / "version.txt", root.parent.parent / "version.txt"):
        if candidate.is_file():
            return candidate.read_text().strip()
    raise FileNotFoundError(f"version.txt not found for {root}")


def safe_path(path: object) -> str:
    if not isinstance(path, str) or len(path) > 255 or not _PATH.match(path):
        raise CubinBuildError(f"manifest path {path!r} is not a safe relative path")
    return path


def object_path(sha256: str, path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    suffix = "." + name.rsplit(".", 1)[1] if "." in name[1:] else ""
    return f"objects/sha256/{sha256[:2]}/{sha256}{suffix}"


def find_pin(root: Path, version: str) -> Optional[str]:
    """The pinned manifest sha256 for ``version``, or None."""
    lock = os.environ.get("FLASHINFER_ARTIFACT_LOCK")
    candidates = [Path(lock)] if lock else [
        root.parent.parent / "artifacts" / "releases" / f"{version}.json"
    ]
    for path in candidates:
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("release") != version:
                raise CubinBuildError(f"{path} is the lock of {data.get('release')}, not {version}")
            return str(data["manifest_sha256"])
    env = os.environ.get("FLASHINFER_CUBIN_MANIFEST_SHA256")
    return env.strip().lower() if env else None


def _reader(source: str):
    """A function relpath -> bytes for the repository ``source`` (directory, file://, http(s))."""
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme in ("http", "https"):
        base = source.rstrip("/")

        def read(rel: str) -> bytes:
            with urllib.request.urlopen(f"{base}/{rel}", timeout=60) as resp:
                return resp.read()

        return read
    root = Path(urllib.request.url2pathname(parsed.path) if parsed.scheme == "file" else source)
    if not root.is_dir():
        raise CubinBuildError(f"FLASHINFER_CUBIN_RELEASE={source}: not a directory repository")
    return lambda rel: (root / rel).read_bytes()


def check_manifest(data: bytes, version: str, pin: str) -> list[dict]:
    digest = hashlib.sha256(data).hexdigest()
    if digest != pin:
        raise CubinBuildError(
            f"release manifest of {version} has sha256 {digest}, but {pin} is pinned; refusing to "
            "build flashinfer-cubin from a release that is not the pinned one"
        )
    manifest = json.loads(data)
    if manifest.get("schema_version") != 1 or manifest.get("release") != version:
        raise CubinBuildError(
            f"manifest is schema {manifest.get('schema_version')!r} of release "
            f"{manifest.get('release')!r}; expected schema 1 of {version}"
        )
    files = manifest.get("files")
    if not isinstance(files, list):
        raise CubinBuildError("manifest has no file list")
    for f in files:
        safe_path(f.get("path"))
        if not _HEX64.match(str(f.get("sha256"))) or not isinstance(f.get("size"), int):
            raise CubinBuildError(f"manifest entry {f.get('path')!r}: bad sha256 or size")
    return files


def stage_release(read, version: str, pin: str, dest: Path) -> int:
    """Copy the verified release into ``dest`` (manifest.json + files/<path>); total bytes."""
    data = read(f"releases/{version}/manifest.json")
    files = check_manifest(data, version, pin)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "files").mkdir(parents=True)
    total = 0
    for f in files:
        blob = read(object_path(f["sha256"], f["path"]))
        digest = hashlib.sha256(blob).hexdigest()
        if len(blob) != f["size"] or digest != f["sha256"]:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CubinBuildError(
                f"{f['path']}: the repository's copy has sha256 {digest} ({len(blob)} bytes), the "
                f"manifest says {f['sha256']} ({f['size']} bytes)"
            )
        out = tmp / "files" / f["path"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(blob)
        total += len(blob)
    (tmp / "manifest.json").write_bytes(data)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return total


def verify_staged(dest: Path, version: str, pin: str) -> int:
    files = check_manifest((dest / "manifest.json").read_bytes(), version, pin)
    total = 0
    for f in files:
        blob = (dest / "files" / f["path"]).read_bytes()
        if len(blob) != f["size"] or hashlib.sha256(blob).hexdigest() != f["sha256"]:
            raise CubinBuildError(f"bundled {f['path']} does not match the manifest")
        total += len(blob)
    return total


def _pin_from_meta(meta: Path) -> Optional[str]:
    if not meta.is_file():
        return None
    m = re.search(r"^MANIFEST_SHA256 = ['\"]([0-9a-f]{64})['\"]", meta.read_text(), re.M)
    return m.group(1) if m else None


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: dict) -> None:
        version = read_version(Path(self.root))
        metadata["version"] = version
        metadata["dependencies"] = [f"flashinfer-python=={version}"]


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        root = Path(self.root)
        pkg = root / "flashinfer_cubin"
        dest = pkg / "release"
        meta = pkg / "_build_meta.py"
        release = read_version(root)
        source = os.environ.get("FLASHINFER_CUBIN_RELEASE")
        from_sdist = (root / "PKG-INFO").is_file()
        pin = find_pin(root, release) or (_pin_from_meta(meta) if from_sdist else None)
        if source:
            if pin is None:
                raise CubinBuildError(
                    f"FLASHINFER_CUBIN_RELEASE is set but release {release} has no pinned manifest "
                    f"hash: write artifacts/releases/{release}.json (nox -s publish -- "
                    "--write-lock) or set FLASHINFER_CUBIN_MANIFEST_SHA256"
                )
            total = stage_release(_reader(source), release, pin, dest)
        elif from_sdist and pin and (dest / "manifest.json").is_file():
            total = verify_staged(dest, release, pin)
        else:
            shutil.rmtree(dest, ignore_errors=True)
            pin, total = None, 0
            self.app.display_warning(
                f"flashinfer-cubin {release}: no release given (FLASHINFER_CUBIN_RELEASE unset): "
                "the wheel holds no kernel binaries"
            )
        if total > SIZE_LIMIT:
            raise CubinBuildError(
                f"release {release} holds {total / 1e6:.0f} MB of files, over the {SIZE_LIMIT / 1e6:.0f}"
                " MB index limit: split the wheel by arch (docs/artifacts.md)"
            )
        meta.write_text(
            '"""Written by hatch_build.py at build time: the release this wheel holds."""\n'
            f'__version__ = "{release}"\n'
            f"RELEASE_VERSION = {(release if pin else None)!r}\n"
            f"MANIFEST_SHA256 = {pin!r}\n"
        )

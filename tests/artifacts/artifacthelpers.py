"""Helpers of the artifact tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Mapping, Optional, Union

from flashinfer.artifacts import resolve
from flashinfer.artifacts.manifest import (
    INDEX_PATH,
    FileEntry,
    Index,
    Manifest,
    manifest_path,
    sha256_hex,
)
from flashinfer.artifacts.resolve import Release

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SyntheticRelease:
    root: Path  # a directory repository
    manifest: Manifest
    data: bytes  # the manifest's bytes
    files: dict[str, bytes]

    @property
    def sha256(self) -> str:
        return sha256_hex(self.data)

    @property
    def release(self) -> Release:
        return Release(self.manifest.release, self.sha256)

    def entry(self, path: str) -> FileEntry:
        return self.manifest.get(path)


def payload(path: str, size: int) -> bytes:
    """Deterministic bytes that differ per path."""
    seed = sha256_hex(path.encode()).encode()
    return (seed * (size // len(seed) + 1))[:size]


def make_release(
    root: Path, version: str, files: Mapping[str, Union[int, bytes]], created: str = "2026-01-01T00:00:00Z",
    raw_manifest: Optional[bytes] = None,
) -> SyntheticRelease:
    """Write a release (objects, manifest, index) into the directory repository ``root``."""
    blobs = {p: (v if isinstance(v, bytes) else payload(p, v)) for p, v in files.items()}
    entries = []
    for path, blob in blobs.items():
        head = path.split("/")[0]
        sm = head[3:] if head.startswith("sm_") and head.endswith("a") else None
        arch = f"{sm[:-2]}.{sm[-2]}a" if sm else None  # sm_90a -> 9.0a
        entry = FileEntry(path, sha256_hex(blob), len(blob), arch)
        obj = root / entry.object_path
        obj.parent.mkdir(parents=True, exist_ok=True)
        obj.write_bytes(blob)
        entries.append(entry)
    manifest = Manifest.build(version, entries, created)
    data = raw_manifest if raw_manifest is not None else manifest.to_bytes()
    (root / manifest_path(version)).parent.mkdir(parents=True, exist_ok=True)
    (root / manifest_path(version)).write_bytes(data)
    index = Index()
    index.add(manifest, sha256_hex(data))
    (root / INDEX_PATH).write_bytes(index.to_bytes())
    return SyntheticRelease(root, manifest, data, blobs)


def pin(monkeypatch, release: Release, repositories=()) -> None:
    """Make ``release`` the one this flashinfer build pins (as the wheel's _artifact_pin would)."""
    fake = SimpleNamespace(
        RELEASE_VERSION=release.version, MANIFEST_SHA256=release.manifest_sha256,
        REPOSITORIES=tuple(repositories),
    )
    monkeypatch.setattr(resolve, "_build_pin", lambda: fake)
    resolve.clear_manifest_cache()


def leftovers(store: Path) -> list[str]:
    """Files in the store that are neither a verified object nor a manifest nor a lock."""
    out = []
    if not store.exists():
        return out
    for p in store.rglob("*"):
        rel = p.relative_to(store).as_posix()
        if p.is_file() and not rel.startswith((".locks/", "objects/", "releases/")):
            out.append(rel)
    return out


def objects(store: Path) -> dict[str, bytes]:
    d = store / "objects"
    return {p.name: p.read_bytes() for p in d.rglob("*") if p.is_file()} if d.exists() else {}


def run_cli(*args: str, env: Optional[dict] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m flashinfer ...`` in a fresh process (the exit status is the point)."""
    import flashinfer

    full = dict(os.environ)
    package_root = str(Path(flashinfer.__file__).resolve().parents[1])
    full.update({k: v for k, v in (env or {}).items() if k != "PYTHONPATH"})
    full["PYTHONPATH"] = os.pathsep.join(
        p for p in ((env or {}).get("PYTHONPATH"), package_root, os.environ.get("PYTHONPATH")) if p
    )
    return subprocess.run([sys.executable, "-m", "flashinfer", *args], env=full,
                          capture_output=True, text=True, timeout=timeout)


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as PEM files: (cert, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flashinfer test repository")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file

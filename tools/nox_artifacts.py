"""nox sessions of the artifact repository (noxfile.py imports this module to register them).

    nox -s cubins                      compile artifacts/kernels.json into the staging repository
    nox -s cubins -- --archs "9.0a 10.0a" --kernels 'rmsnorm_*'
    nox -s publish -- --repository s3://bucket/prefix [--version V] [--write-lock]
    nox -s mirror -- --dest /srv/mirror [--version V --manifest-sha256 H] [--repository URL]

``release_steps(session, version)`` is what ``nox -s release`` runs before building the wheels:
build the cubins, publish them (``FLASHINFER_PUBLISH_REPOSITORY``, default ``dist/artifacts``),
write the lock ``artifacts/releases/<version>.json`` (the manifest sha256 the flashinfer-python
wheel pins, and the repositories users download from: ``FLASHINFER_PUBLIC_REPOSITORIES``, default
the publish URL), and point the flashinfer-cubin build at the verified release.

S3: the endpoint and credentials come from the standard AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or ``AWS_PROFILE``, ``AWS_DEFAULT_REGION``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent.parent
STAGING = ROOT / "build" / "artifacts" / "staging"
DEFAULT_REPOSITORY = ROOT / "dist" / "artifacts"
LOCKS = ROOT / "artifacts" / "releases"
CLIENT_REQUIREMENTS = ["click>=8", "requests>=2.28"]
S3_REQUIREMENTS = ["boto3>=1.35"]


def _version() -> str:
    return (ROOT / "version.txt").read_text().strip()


def _source_env() -> dict[str, str]:
    """Run flashinfer.artifacts from the source tree (it needs neither torch nor a build)."""
    src = str(ROOT / "packages" / "flashinfer-python")
    return {"PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}


def _python(session: nox.Session) -> str:
    """The session's interpreter: its virtualenv's, or this one for python=False sessions."""
    return sys.executable if session.virtualenv.venv_backend == "none" else "python"


def build_cubins(session: nox.Session, args: list[str]) -> None:
    session.run(_python(session), str(ROOT / "tools" / "cubin_build.py"), *args,
                external=True, env=_source_env())


def manifest_sha256(staging: Path, version: str) -> str:
    return hashlib.sha256((staging / "releases" / version / "manifest.json").read_bytes()).hexdigest()


def write_lock(version: str, sha256: str, repositories: list[str]) -> Path:
    """artifacts/releases/<version>.json: what the flashinfer-python build pins."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    path = LOCKS / f"{version}.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("manifest_sha256") != sha256:
            raise SystemExit(
                f"{path} pins manifest {old.get('manifest_sha256')} for {version}, not {sha256}: "
                "a published release is immutable; release a new version"
            )
    doc = {
        "release": version,
        "manifest_sha256": sha256,
        "repositories": repositories,
        "published": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


def publish_release(session: nox.Session, staging: Path, version: str, repository: str) -> None:
    """Publish the staged release. If ``repository`` has it already with the same files (a
    rebuild: another creation time), the staging area takes the published manifest, so the
    lock written from it and the cubin wheel built from it pin what users download."""
    session.run(
        _python(session), "-m", "flashinfer", "artifacts", "publish", "--source", str(staging),
        "--version", version, "--repository", repository, "--adopt-published", external=True,
        env=_source_env(),
    )


@nox.session(python=False)
def cubins(session: nox.Session) -> None:
    """Compile the cubins of artifacts/kernels.json (nvcc -cubin per arch) into build/artifacts/staging."""
    build_cubins(session, list(session.posargs))


def _publish_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="nox -s publish --")
    ap.add_argument("--repository", default=str(DEFAULT_REPOSITORY),
                    help="a directory (default dist/artifacts), file:// or s3://bucket/prefix")
    ap.add_argument("--version", default=_version())
    ap.add_argument("--staging", type=Path, default=STAGING)
    ap.add_argument("--write-lock", action="store_true",
                    help="write artifacts/releases/<version>.json (what the wheels pin)")
    ap.add_argument("--public-url", action="append", default=[],
                    help="where users download from, recorded in the lock (default: --repository)")
    return ap.parse_args(argv)


@nox.session
def publish(session: nox.Session) -> None:
    """Publish the staged release: -- --repository DIR|s3://bucket/prefix [--write-lock]."""
    args = _publish_args(list(session.posargs))
    session.install(*CLIENT_REQUIREMENTS, *(S3_REQUIREMENTS if args.repository.startswith("s3://")
                                            else []))
    publish_release(session, args.staging, args.version, args.repository)
    if args.write_lock:
        path = write_lock(args.version, manifest_sha256(args.staging, args.version),
                          args.public_url or [args.repository])
        session.log(f"lock written: {path}")


@nox.session
def mirror(session: nox.Session) -> None:
    """A self-contained offline copy of a release: -- --dest DIR|s3://... [flashinfer artifacts mirror options]."""
    session.install(*CLIENT_REQUIREMENTS, *S3_REQUIREMENTS)
    session.run("python", "-m", "flashinfer", "artifacts", "mirror", "--dist",
                str(ROOT / "dist"), *session.posargs, env=_source_env())


def release_steps(session: nox.Session, version: str) -> None:
    """Build and publish the cubins of ``version``, write its lock, and set
    FLASHINFER_CUBIN_RELEASE for the flashinfer-cubin wheel build that follows."""
    spec = json.loads((ROOT / "artifacts" / "kernels.json").read_text())
    archs = os.environ.get("FLASHINFER_CUBIN_ARCHS") or " ".join(spec["archs"])
    repository = os.environ.get("FLASHINFER_PUBLISH_REPOSITORY") or str(DEFAULT_REPOSITORY)
    public = os.environ.get("FLASHINFER_PUBLIC_REPOSITORIES", "").split() or [repository]
    build_cubins(session, ["--version", version, "--archs", archs, "--out", str(STAGING)])
    session.install(*CLIENT_REQUIREMENTS, *(S3_REQUIREMENTS if repository.startswith("s3://")
                                            else []))
    publish_release(session, STAGING, version, repository)
    path = write_lock(version, manifest_sha256(STAGING, version), public)
    session.env["FLASHINFER_CUBIN_RELEASE"] = str(STAGING)
    session.log(f"artifacts of {version}: published to {repository}; lock {path}")

"""nox sessions of the artifact repository (noxfile.py imports this module to register them).

    nox -s cubins                      compile artifacts/kernels.json into the staging repository
    nox -s cubins -- --archs "9.0a 10.0a" --kernels 'rmsnorm_*'
    nox -s publish -- --repository s3://bucket/prefix [--version V] [--write-lock]
    nox -s mirror -- --dest /srv/mirror [--version V --manifest-sha256 H] [--repository URL]

``release_steps(session, version, lock)`` is what ``nox -s release`` runs before building the
wheels: build the cubins, publish them (``FLASHINFER_PUBLISH_REPOSITORY``, default
``dist/artifacts``), and write the lock (the manifest sha256 the flashinfer-python wheel pins, and
where users download from) to ``lock``, a staging path: the release moves it to
``artifacts/releases/<version>.json`` only once its tests pass. Where users download from is
``FLASHINFER_PUBLIC_REPOSITORIES`` (https:// or s3:// URLs, declared in flashinfer/knobs.py),
never the publish repository's path on this machine; unset, the release is local-only: the lock
and the core wheel name no repository and say so, and users set FLASHINFER_CUBINS_REPOSITORY.

A lock of the same version that is already there (committed by an earlier release) is kept
byte for byte when the cubins are the same: the rebuild reuses its manifest creation time, so
an identical build has an identical manifest; other cubins are refused (a release is immutable).

S3: the endpoint and credentials come from the standard AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or ``AWS_PROFILE``, ``AWS_DEFAULT_REGION``).
"""

from __future__ import annotations

import argparse
import calendar
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

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


#: What a lock says when no public repository was configured.
LOCAL_ONLY = ("local-only release: published to a directory of the machine that built it, which "
              "users cannot reach; set FLASHINFER_CUBINS_REPOSITORY to a copy of that repository "
              "(or install flashinfer-cubin)")
#: Schemes a public repository may have: something users can reach (not a path of this machine).
PUBLIC_SCHEMES = ("https://", "http://", "s3://")
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def lock_path(version: str) -> Path:
    return LOCKS / f"{version}.json"


def lock_text(version: str, sha256: str, repositories: list[str], created: str) -> str:
    """The lock of ``version``: the committed lock's text, unchanged, if it says the same
    (so re-running a release never rewrites its timestamp), else a new one.

    Raises SystemExit when the committed lock pins another manifest (a published release is
    immutable)."""
    doc = {"release": version, "manifest_sha256": sha256, "manifest_created": created,
           "repositories": list(repositories)}
    if not repositories:
        doc["local_only"] = LOCAL_ONLY
    path = lock_path(version)
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("manifest_sha256") != sha256:
            raise SystemExit(
                f"{path} pins manifest {old.get('manifest_sha256')} for {version}, not {sha256} "
                "(these cubins differ from the released ones: another nvcc, or changed kernels): "
                "a published release is immutable; release a new version (nox -s release -- "
                "<next X.Y.Z>)")
        if {k: v for k, v in old.items() if k != "published"} == doc:
            return path.read_text()
    doc["published"] = time.strftime(_TIME_FORMAT, time.gmtime())
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def write_lock(version: str, sha256: str, repositories: list[str], created: str,
               dest: Optional[Path] = None) -> Path:
    """Write the lock of ``version`` to ``dest`` (default: artifacts/releases/<version>.json),
    only if its bytes change."""
    text = lock_text(version, sha256, repositories, created)
    dest = dest or lock_path(version)
    if not dest.is_file() or dest.read_text() != text:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, dest)
    return dest


def manifest_created(staging: Path, version: str) -> str:
    return json.loads((staging / "releases" / version / "manifest.json").read_bytes())["created"]


def public_repositories(value: Optional[str]) -> list[str]:
    """FLASHINFER_PUBLIC_REPOSITORIES: URLs users can reach; a path of this machine is refused."""
    urls = value.replace(",", " ").split() if value else []
    for url in urls:
        if not url.startswith(PUBLIC_SCHEMES):
            raise SystemExit(
                f"FLASHINFER_PUBLIC_REPOSITORIES names {url!r}, which is not a URL users can "
                f"download from ({', '.join(PUBLIC_SCHEMES)}): a wheel must never name a path of "
                "the machine that built it. Leave it unset for a local-only release.")
    return urls


def _source_knobs():
    """flashinfer.knobs from the source tree, where the settings users set for a release are
    declared (FLASHINFER_PUBLIC_REPOSITORIES: ``flashinfer show-config`` lists it)."""
    src = str(ROOT / "packages" / "flashinfer-python")
    if src not in sys.path:
        sys.path.insert(0, src)
    from flashinfer import knobs

    return knobs


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
                    help="where users download from (https:// or s3://), recorded in the lock "
                    "(default: none, a local-only release)")
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
                          public_repositories(" ".join(args.public_url)),
                          manifest_created(args.staging, args.version))
        session.log(f"lock written: {path}")


@nox.session
def mirror(session: nox.Session) -> None:
    """A self-contained offline copy of a release: -- --dest DIR|s3://... [flashinfer artifacts mirror options]."""
    session.install(*CLIENT_REQUIREMENTS, *S3_REQUIREMENTS)
    # The wheels come from dist/ when it exists (a release or `nox -s build` made it); the
    # command says what the mirror holds either way, and `--dist` in posargs overrides.
    dist = [] if "--dist" in session.posargs or not (ROOT / "dist").is_dir() else [
        "--dist", str(ROOT / "dist")]
    if not dist and "--dist" not in session.posargs:
        session.warn("no dist/ here: the mirror holds no wheels (run `nox -s build` or a release "
                     "first, or pass --dist DIR)")
    session.run("python", "-m", "flashinfer", "artifacts", "mirror", *dist, *session.posargs,
                env=_source_env())


def release_steps(session: nox.Session, version: str, lock: Path) -> dict[str, dict[str, str]]:
    """Build and publish the cubins of ``version`` and write its lock to ``lock``.

    Returns the environment of the wheel builds (``build``: FLASHINFER_CUBIN_RELEASE for the
    flashinfer-cubin wheel) and of the release's tests (``tests``: the publish repository named
    explicitly in FLASHINFER_CUBINS_REPOSITORY, since a local-only wheel names none)."""
    spec = json.loads((ROOT / "artifacts" / "kernels.json").read_text())
    archs = os.environ.get("FLASHINFER_CUBIN_ARCHS") or " ".join(spec["archs"])
    repository = os.environ.get("FLASHINFER_PUBLISH_REPOSITORY") or str(DEFAULT_REPOSITORY)
    public = public_repositories(_source_knobs().artifacts.public_repositories)
    env = dict(_source_env())
    if lock_path(version).is_file():
        # An earlier release of this version: the same cubins must give the same manifest.
        created = json.loads(lock_path(version).read_text()).get("manifest_created")
        if created:
            env["SOURCE_DATE_EPOCH"] = str(calendar.timegm(time.strptime(created, _TIME_FORMAT)))
    session.run(_python(session), str(ROOT / "tools" / "cubin_build.py"), "--version", version,
                "--archs", archs, "--out", str(STAGING), external=True, env=env)
    session.install(*CLIENT_REQUIREMENTS, *(S3_REQUIREMENTS if repository.startswith("s3://")
                                            else []))
    publish_release(session, STAGING, version, repository)
    write_lock(version, manifest_sha256(STAGING, version), public,
               manifest_created(STAGING, version), dest=lock)
    if public:
        session.log(f"artifacts of {version}: published to {repository}; users download from "
                    f"{' '.join(public)} (copy the repository there)")
    else:
        session.warn(f"artifacts of {version}: published to {repository} only. A LOCAL-ONLY "
                     "release: no FLASHINFER_PUBLIC_REPOSITORIES is set, so the lock and the "
                     "core wheel name no repository; users of these wheels need "
                     "FLASHINFER_CUBINS_REPOSITORY (or the flashinfer-cubin wheel)")
    return {"build": {"FLASHINFER_CUBIN_RELEASE": str(STAGING)},
            "tests": {"FLASHINFER_CUBINS_REPOSITORY": repository}}

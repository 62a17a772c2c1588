"""Helpers of the packaging tests: building the set, installing wheels into private
directories, child interpreters that import from there, and writing (synthetic or
re-versioned) wheels."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from wheels import check  # noqa: E402, F401  - re-exported to the tests

VERSION = (ROOT / "version.txt").read_text().strip()


def record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def write_wheel(path: Path, files: dict[str, bytes], dist_info: str) -> Path:
    """A wheel holding ``files`` plus a correct RECORD under ``dist_info``."""
    rows = [record_line(n, d) for n, d in files.items()] + [[f"{dist_info}/RECORD", "", ""]]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist_info}/RECORD", out.getvalue())
    return path


def read_wheel(path: Path) -> tuple[dict[str, bytes], str]:
    """(files without RECORD, the dist-info directory name)."""
    with zipfile.ZipFile(path) as zf:
        files = {n: zf.read(n) for n in zf.namelist() if not n.endswith(".dist-info/RECORD")}
    dist_info = next(n.split("/")[0] for n in files if n.endswith(".dist-info/METADATA"))
    return files, dist_info


def reversion_wheel(src: Path, outdir: Path, new_version: str) -> Path:
    """A copy of a wheel of the set under another version: dist-info name, METADATA and (for the
    jit-cache) manifest.json say ``new_version``; the binaries are the same bytes."""
    files, dist_info = read_wheel(src)
    name, old_version = dist_info[: -len(".dist-info")].rsplit("-", 1)
    new_info = f"{name}-{new_version}.dist-info"
    renamed = {}
    for n, data in files.items():
        if n == f"{dist_info}/METADATA":
            data = data.decode().replace(f"Version: {old_version}\n",
                                         f"Version: {new_version}\n", 1).encode()
        if n.endswith("flashinfer_jit_cache/manifest.json"):
            manifest = json.loads(data)
            manifest["version"] = new_version
            data = json.dumps(manifest, indent=1).encode()
        renamed[n.replace(dist_info, new_info, 1)] = data
    tags = src.name[:-4].split("-")[-3:]
    return write_wheel(outdir / f"{name}-{new_version}-{'-'.join(tags)}.whl", renamed, new_info)


def build_here(outdir: Path) -> Path:
    """Build the set into ``outdir`` the way ``nox -s tests`` does; skip (with the reason in
    the summary) where this environment cannot."""
    for module in ("build", "hatchling"):
        try:
            __import__(module)
        except ImportError:
            pytest.skip(f"building the wheels needs the {module!r} package (pip install build "
                        "hatchling), or FLASHINFER_TEST_WHEELHOUSE pointing at built wheels")
    env = dict(os.environ, FLASHINFER_CUDA_ARCH_LIST="9.0a", FLASHINFER_AOT_MODULES="scale",
               FLASHINFER_WORKSPACE_BASE=str(outdir / "aot-cache"))
    for name in ("flashinfer-python", "flashinfer-jit-cache", "flashinfer-cubin"):
        proc = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir",
             str(outdir), str(ROOT / "packages" / name)],
            env=env, capture_output=True, text=True,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return outdir


def pip_target(wheels: list[Path], target: Path) -> Path:
    """Install ``wheels`` (no dependencies: this interpreter has them) into ``target``."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--target", str(target), *map(str, wheels)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return target


def run_child(code: str, target: Path, env: Optional[dict] = None, cwd: Optional[Path] = None):
    """Run ``code`` in a new interpreter that imports flashinfer from ``target`` only (not
    from the source tree, not from an installed copy), with a fresh JIT cache."""
    child_env = {k: val for k, val in os.environ.items() if not k.startswith("FLASHINFER_")}
    child_env.update(PYTHONPATH=str(target),
                     FLASHINFER_WORKSPACE_BASE=str(target.parent / (target.name + "-ws")))
    child_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True,
                          text=True, cwd=str(cwd or target.parent))

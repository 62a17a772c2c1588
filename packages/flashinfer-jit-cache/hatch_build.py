"""Hatch hooks of flashinfer-jit-cache: its version and pins, and the AOT build that fills it.

Version: ``version.txt`` plus the local label of the CUDA it is built with (``X.Y.Z+cu130``),
so the wheel file says which CUDA it serves. Pins: ``flashinfer-python==<version>`` and
``apache-tvm-ffi==<the version it was built with>`` (both are part of every module's URI, so
any other version would make the modules unusable).

Wheel: runs ``aot_driver.py build`` (flashinfer's AOT for ``FLASHINFER_CUDA_ARCH_LIST``, limited
to ``FLASHINFER_AOT_MODULES`` when set, ``MAX_JOBS`` modules at a time), copies every module to
``flashinfer_jit_cache/modules/<uri>/<name>.so``, writes ``flashinfer_jit_cache/manifest.json``
(versions, CUDA, arch list, the digest of the kernel sources, modules with URI, config key and
sha256) and tags the wheel
``py3-none-manylinux_2_28_<machine>``: the modules are TVM-FFI libraries loaded with dlopen, not
CPython extensions, so one wheel serves every Python >= 3.10.

The AOT runs in the interpreter that runs this hook (``python -m build --no-isolation`` from a
nox session, or an isolated build env with the build requirements) against the monorepo's
``packages/flashinfer-python`` (or, outside the monorepo, an installed flashinfer-python of the
same version).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.metadata.plugin.interface import MetadataHookInterface

#: glibc floor the tag promises; tools/wheels/check.py verifies every module against it.
MANYLINUX = "manylinux_2_28"

_info_cache: dict[str, dict] = {}


def read_version(root: Path) -> str:
    for candidate in (root / "version.txt", root.parent.parent / "version.txt"):
        if candidate.is_file():
            return candidate.read_text().strip()
    raise FileNotFoundError(f"version.txt not found next to {root} nor at the monorepo root")


def core_dir(root: Path) -> Optional[Path]:
    """The monorepo's flashinfer-python sources, when this package sits beside them."""
    candidate = root.parent / "flashinfer-python"
    return candidate if (candidate / "flashinfer" / "__init__.py").is_file() else None


def _driver(root: Path, command: str, *extra: str) -> subprocess.CompletedProcess:
    core = core_dir(root)
    cmd = [sys.executable, str(root / "aot_driver.py"), command, "--version", read_version(root)]
    if core is not None:
        cmd += ["--core", str(core)]
    # stderr goes straight through: it carries the build's progress lines
    proc = subprocess.run([*cmd, *extra], stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}); see the output above")
    return proc


def toolchain_info(root: Path) -> dict:
    """CUDA and TVM-FFI versions this build uses (asked once per process)."""
    key = str(root)
    if key not in _info_cache:
        _info_cache[key] = json.loads(_driver(root, "info").stdout)
    return _info_cache[key]


def git_commit(root: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: dict) -> None:
        root = Path(self.root)
        version = read_version(root)
        info = toolchain_info(root)
        metadata["version"] = f"{version}+{info['cuda_label']}"
        metadata["dependencies"] = [
            f"flashinfer-python=={version}",
            f"apache-tvm-ffi=={info['tvm_ffi_version']}",
        ]


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        info = toolchain_info(root)
        self._stage = Path(tempfile.mkdtemp(prefix="flashinfer-jit-cache-"))
        listing = self._stage / "built.json"
        _driver(root, "build", "--out", str(listing))
        built = json.loads(listing.read_text())
        modules = []
        for m in built["modules"]:
            rel = f"modules/{m['uri']}/{m['name']}.so"
            dest = self._stage / "pkg" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(m["so"], dest)
            modules.append(
                {
                    "name": m["name"],
                    "uri": m["uri"],
                    "config_key": m["config_key"],
                    "archs": m["archs"],
                    "path": rel,
                    "sha256": sha256_of(dest),
                    "size": dest.stat().st_size,
                }
            )
        manifest = {
            "schema": 1,
            "name": "flashinfer-jit-cache",
            "version": self.metadata.version,
            "flashinfer_version": info["flashinfer_version"],
            "cuda_version": info["cuda_version"],
            "nvcc_version": info["nvcc_version"],
            "tvm_ffi_version": info["tvm_ffi_version"],
            "arch_list": built["arch_list"],
            "git_commit": git_commit(root),
            "source_digest": built["source_digest"],
            "modules": modules,
        }
        (self._stage / "pkg" / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        build_data["force_include"][str(self._stage / "pkg" / "modules")] = (
            "flashinfer_jit_cache/modules"
        )
        build_data["force_include"][str(self._stage / "pkg" / "manifest.json")] = (
            "flashinfer_jit_cache/manifest.json"
        )
        build_data["pure_python"] = False
        build_data["infer_tag"] = False
        build_data["tag"] = f"py3-none-{MANYLINUX}_{platform.machine()}"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        stage = getattr(self, "_stage", None)
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)

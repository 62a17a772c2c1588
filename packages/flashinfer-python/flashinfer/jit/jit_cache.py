"""The installed ``flashinfer-jit-cache`` wheel, as the JIT sees it.

The wheel holds ``flashinfer_jit_cache/modules/<uri>/<name>.so`` and ``manifest.json`` (its
version, the CUDA it was built with, the arch list, and per module the URI, archs and sha256).
This module reads that manifest once per process, without importing the sibling's code (which
may be of another version), and decides whether the wheel may be used:

* its version must be ours (:func:`flashinfer._versions.check_sibling_version`), and
* its CUDA major must be torch's (:func:`flashinfer._versions.check_cuda_major`).

Otherwise it warns once (:class:`~flashinfer._versions.VersionMismatchWarning`, naming both
versions and the pip command that fixes it) and is ignored: modules come from the disk cache or
the JIT as if it were not installed. ``FLASHINFER_DISABLE_VERSION_CHECK=1`` skips both checks.
Nothing here runs at ``import flashinfer``; the first :func:`candidates` call does it.

The manifest also records the digest of the kernel sources the modules were compiled from, and
each module's config key. When that digest is the one this installed package recorded for the
sources it bundles (:func:`sources_match`), the JIT matches modules by config key and reads no
source file (:func:`flashinfer.jit.core._aot_module`).
"""

from __future__ import annotations

import importlib.util
import json
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from .. import _versions, knobs
from .archs import Arch, parse_arch_list

DISTRIBUTION = "flashinfer-jit-cache"
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class AotModule:
    """One module of the wheel: its name and URI, the archs it holds SASS for, its file, and
    the file's size and sha256 as the manifest records them (checked before loading)."""

    name: str
    uri: str
    archs: tuple[Arch, ...]
    path: Path
    config_key: Optional[str] = None  # flashinfer.jit.core.config_key, when recorded
    size: Optional[int] = None
    sha256: Optional[str] = None


@dataclass(frozen=True)
class JitCacheWheel:
    """What the installed wheel holds, and whether this process uses it.

    Attributes
    ----------
    root : Path
        The ``flashinfer_jit_cache`` package directory.
    manifest : dict
        ``manifest.json`` as written by the wheel's build.
    problem : str
        Why the wheel is ignored; empty when it is used.
    modules : tuple of AotModule
    """

    root: Path
    manifest: dict
    problem: str
    modules: tuple[AotModule, ...]

    @property
    def usable(self) -> bool:
        return not self.problem

    @property
    def version(self) -> str:
        return str(self.manifest.get("version", "unknown"))

    @property
    def cuda_version(self) -> str:
        return str(self.manifest.get("cuda_version", "unknown"))

    @property
    def arch_list(self) -> list[str]:
        return [str(a) for a in self.manifest.get("arch_list", [])]

    @property
    def source_digest(self) -> Optional[str]:
        """Digest of the kernel sources the modules were compiled from (None: not recorded)."""
        value = self.manifest.get("source_digest")
        return str(value) if value else None


_state: dict[str, Optional[JitCacheWheel]] = {}
_state_lock = threading.Lock()


def package_dir() -> Optional[Path]:
    """Directory of the installed ``flashinfer_jit_cache`` package holding a manifest, else
    None. Finds it without importing it."""
    spec = importlib.util.find_spec("flashinfer_jit_cache")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        if (Path(root) / MANIFEST_NAME).is_file():
            return Path(root)
    return None


def runtime_cuda() -> Optional[str]:
    """The CUDA version torch runs (None for a CPU build or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def _modules(root: Path, manifest: dict) -> tuple[AotModule, ...]:
    return tuple(
        AotModule(
            name=m["name"],
            uri=m["uri"],
            archs=tuple(parse_arch_list(" ".join(m["archs"]), f"{MANIFEST_NAME} of {m['name']}")),
            path=root / m["path"],
            config_key=m.get("config_key"),
            size=m.get("size"),
            sha256=m.get("sha256"),
        )
        for m in manifest["modules"]
    )


def _problem(manifest: dict) -> str:
    """Why a wheel with this manifest must not be used here; empty if it may."""
    from .. import __version__

    if knobs.artifacts.disable_version_check:
        return ""
    version = str(manifest.get("version", "unknown"))
    message = _versions.check_sibling_version(DISTRIBUTION, version, __version__)
    if message is None:
        message = _versions.check_cuda_major(
            DISTRIBUTION, version, manifest.get("cuda_version"), runtime_cuda()
        )
    return message or ""


def _inspect() -> Optional[JitCacheWheel]:
    root = package_dir()
    if root is None:
        return None
    try:
        manifest = json.loads((root / MANIFEST_NAME).read_text())
        modules = _modules(root, manifest)
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        # A wheel we cannot read is one we cannot use; say so once instead of failing ops.
        return JitCacheWheel(root, {}, f"{DISTRIBUTION} at {root} has an unreadable "
                             f"{MANIFEST_NAME} ({type(e).__name__}: {e}); it is ignored. "
                             f"Reinstall it: pip install --force-reinstall {DISTRIBUTION}", ())
    return JitCacheWheel(root, manifest, _problem(manifest), modules)


def installed() -> Optional[JitCacheWheel]:
    """The installed wheel (None when there is none), checked once per process; the first call
    warns if the wheel is ignored."""
    with _state_lock:
        if "wheel" not in _state:
            wheel = _inspect()
            _state["wheel"] = wheel
            if wheel is not None and wheel.problem:
                warnings.warn(wheel.problem, _versions.VersionMismatchWarning, stacklevel=4)
        return _state["wheel"]


def reset() -> None:
    """Forget what :func:`installed` found (tests; after installing another wheel)."""
    with _state_lock:
        _state.clear()


def bundled_source_digest() -> Optional[str]:
    """The digest this installed package recorded at build time for the kernel sources it
    bundles (``flashinfer/data``), or None where it can't vouch for them: a source checkout or
    an editable install (whose sources may have changed since ``_build_meta.py`` was written),
    or a build that predates the digest."""
    from . import toolchain

    if not toolchain.sources_bundled():
        return None
    try:
        from .._build_meta import __source_digest__
    except ImportError:
        return None
    return __source_digest__ or None


def sources_match() -> bool:
    """Whether the usable installed wheel was compiled from exactly the sources this package
    bundles, so its modules may be matched by config key instead of by hashing the sources.

    Files edited inside an installed package are not noticed (pip's RECORD is the contract
    there); edit a source checkout instead, where the URI is always computed from the files."""
    wheel = installed()
    if wheel is None or not wheel.usable or wheel.source_digest is None:
        return False
    return wheel.source_digest == bundled_source_digest()


def covers(built: Arch, target: Arch) -> bool:
    """Whether SASS built for ``built`` runs on a GPU the target ``target`` stands for.

    Plain SASS runs on its major at the same or a higher minor (sm_80 runs on 8.6 and 8.9);
    arch-specific ``a`` SASS runs only on GPUs of exactly that arch, and an ``a`` target (what
    the JIT asks for on sm90 and newer, where kernels may use wgmma) only takes ``a`` SASS of
    that arch; family ``f`` SASS runs on its major from its minor up. Embedded PTX is not
    counted: it would mean a driver compile at first use, which this wheel exists to avoid.
    """
    if built.major != target.major or built.minor > target.minor:
        return False
    if target.suffix == "a":
        return built.suffix == "a" and built.minor == target.minor
    if built.suffix == "a":
        return built.minor == target.minor
    return True


def candidates(name: str, targets: Sequence[Arch]) -> list[AotModule]:
    """Modules called ``name`` in the usable installed wheel whose archs cover every target.

    The caller still compares URIs: a candidate is only right if ``name`` hashes to its URI
    here (same sources, flags and versions)."""
    wheel = installed()
    if wheel is None or not wheel.usable:
        return []
    return [
        m
        for m in wheel.modules
        if m.name == name and all(any(covers(b, t) for b in m.archs) for t in targets)
    ]


def describe() -> list[str]:
    """Lines for ``flashinfer show-config``: where the wheel is, what it holds, whether used."""
    wheel = installed()
    if wheel is None:
        return [f"{DISTRIBUTION}: not installed (modules come from the JIT)"]
    m: dict[str, Any] = wheel.manifest
    lines = [
        f"{DISTRIBUTION}: {wheel.version} at {wheel.root}",
        f"status: {'used' if wheel.usable else 'ignored: ' + wheel.problem}",
        f"arch list: {' '.join(wheel.arch_list) or '-'}",
        f"CUDA version: {wheel.cuda_version} (nvcc {m.get('nvcc_version', 'unknown')})",
        f"TVM-FFI version: {m.get('tvm_ffi_version', 'unknown')}",
        f"source digest: {wheel.source_digest or 'not recorded'} ("
        + ("the bundled sources': modules match by config key, no source is hashed)"
           if sources_match() else "not vouched for here: modules match by hashing sources)"),
    ]
    names = sorted({x.name for x in wheel.modules})
    shown = ", ".join(names[:8]) + (f", ... ({len(names) - 8} more)" if len(names) > 8 else "")
    lines.append(f"modules: {len(wheel.modules)} ({shown})")
    # one line per module, as the manifest records it: uri, archs, sha256
    for record in sorted(m.get("modules", []), key=lambda r: str(r.get("uri"))):
        archs = " ".join(map(str, record.get("archs", [])))
        lines.append(f"  {record.get('uri')} [{archs}] sha256 {record.get('sha256')}")
    return lines

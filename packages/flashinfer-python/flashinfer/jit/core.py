"""The JIT: a module spec -> a content-addressed build directory -> ninja + nvcc -> a loaded
TVM-FFI module.

Where a module comes from, in order (:func:`get_module`):

1. the process cache;
2. the installed ``flashinfer-jit-cache`` wheel, by the module's URI;
3. the disk cache, ``<workspace>/.cache/flashinfer/<version>/<archs>/cached_ops/<name>_<key>/``;
4. a build, unless ``FLASHINFER_DISABLE_JIT`` is set (then :class:`MissingJITCacheError`).

The key hashes everything that changes the binary: the bytes of the sources and of every header
they include from our trees, the flags, the target archs, the identities of nvcc and the host
compiler, the TVM-FFI version and ours. A changed input is a new directory, so nothing is ever
rebuilt in place and a stale binary can't be picked up. Builds take an advisory ``fcntl`` lock per
module (the kernel drops it when the holder dies) and publish the ``.so`` by atomic rename, so
any number of processes can start cold at once and a killed build blocks nothing.

A file in a cache is never handed to the loader unchecked: a truncated ``.so`` would kill the
process with SIGBUS. The disk cache's ``module.json`` records the ``.so``'s size, sha256 and
mtime; before loading, the size is compared (a stat) and the sha256 only when the mtime differs
from the record or ``FLASHINFER_JIT_VERIFY`` is set (or the load failed). A damaged copy is
rebuilt with one warning. Both files are fsynced before the rename that publishes the ``.so``
and the directory after it. The jit-cache wheel's modules are checked against the sizes (and,
with the knob, the hashes) of its manifest, and skipped, never rewritten, when they differ.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

from .. import knobs
from .._filelock import file_lock
from ..exceptions import CompilerNotFoundError, JitCompileError, JitError, MissingJITCacheError
from . import archs as _archs
from . import toolchain

logger = logging.getLogger("flashinfer.jit")

#: What happened to modules in this process: "built", "loaded_disk", "loaded_aot".
stats: Counter = Counter()

#: Compute capability majors the elementwise/row kernels are built and tested for: bf16
#: arithmetic and 16-byte vector paths assume sm_80+ (Ampere, Ada, Hopper, Blackwell, Thor).
SM80_AND_NEWER = (8, 9, 10, 11, 12)

_loaded: dict[str, Any] = {}
_loaded_lock = threading.Lock()
#: Files of the jit-cache wheel this process found damaged or unloadable (warned about once).
_aot_refused: set[str] = set()


@dataclass(frozen=True)
class JitSpec:
    """A module to compile: its sources and flags, and the GPU majors it supports.

    Attributes
    ----------
    name : str
        Module name; the ``.so`` is ``<name>.so`` and the name starts its URI.
    sources : tuple of str
        Paths relative to the package's ``csrc/`` (absolute paths are kept as they are).
    extra_cuda_cflags, extra_cflags, extra_ldflags : tuple of str
        Flags of this module on top of the common ones.
    extra_include_dirs : tuple of str
        Include dirs on top of ``include/``, ``csrc/`` and TVM-FFI's.
    supported_major_versions : tuple of int, optional
        Compute capability majors the module compiles for; None means any.
    precompiled : bool
        The flashinfer-jit-cache wheel holds it (:func:`flashinfer.aot.registered_specs` lists
        exactly these; a test holds the two together). Not part of the module's key.
    """

    name: str
    sources: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    extra_include_dirs: tuple[str, ...] = ()
    supported_major_versions: Optional[tuple[int, ...]] = None
    precompiled: bool = field(default=False, compare=False)

    def source_paths(self) -> list[Path]:
        return [Path(s) if os.path.isabs(s) else toolchain.csrc_dir() / s for s in self.sources]

    def build_and_load(self) -> Any:
        """The loaded module (functions are attributes).

        Raises
        ------
        NoSupportedArchError
            No target arch is left for this module.
        MissingJITCacheError
            No cache has it and ``FLASHINFER_DISABLE_JIT`` is set.
        CompilerNotFoundError
            It must be compiled and nvcc or ninja is missing.
        JitCompileError
            Compilation failed; carries the compiler's error lines and the log path.
        """
        return get_module(self)


# ----------------------------------------------------------------------------------------------
# What a build of a spec would be, and its key


@dataclass(frozen=True)
class BuildPlan:
    """A spec resolved against the environment: flags, archs, the key and the paths."""

    spec: JitSpec
    archs: tuple[_archs.Arch, ...]
    sources: tuple[Path, ...]
    include_dirs: tuple[Path, ...]
    cuda_cflags: tuple[str, ...]
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    nvcc: Optional[Path]
    source_key: str  # toolchain-independent: names the module (URI) for the jit-cache wheel
    build_key: str  # source_key + compiler identities: names the disk-cache directory
    inputs: tuple[str, ...] = field(default=(), compare=False)  # hashed files, for the record

    @property
    def uri(self) -> str:
        return f"{self.spec.name}_{self.source_key[:16]}"

    @property
    def build_dir(self) -> Path:
        return jit_dir(self.archs) / f"{self.spec.name}_{self.build_key[:16]}"

    @property
    def so_path(self) -> Path:
        return self.build_dir / f"{self.spec.name}.so"


_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def local_headers(sources: Sequence[Path], include_dirs: Sequence[Path]) -> list[Path]:
    """Every header the sources include, transitively, that resolves inside ``include_dirs``
    (or next to the including file). System and toolkit headers are covered by the compiler's
    identity and the TVM-FFI version instead."""
    seen: set[Path] = set()
    stack = list(sources)
    while stack:
        current = stack.pop()
        try:
            text = current.read_text(errors="replace")
        except OSError:
            continue
        for name in _INCLUDE_RE.findall(text):
            for base in (current.parent, *include_dirs):
                candidate = (base / name).resolve()
                if candidate.is_file():
                    if candidate not in seen:
                        seen.add(candidate)
                        stack.append(candidate)
                    break
    return sorted(seen)


#: Force-included into every translation unit (found on the csrc include path, so the flag
#: names no install path): it keeps the host code's glibc/libstdc++ symbol versions within
#: manylinux_2_28, so a module built on a new distribution loads on an old one (the jit-cache
#: wheel's tag promises it; tools/wheels/check.py verifies it).
COMPAT_HEADER = "manylinux_compat.h"


def _flags(spec: JitSpec, archs: Sequence[_archs.Arch]) -> tuple[list[str], list[str], list[str]]:
    jk = knobs.jit
    opt = ["-O0", "-g"] if jk.debug else ["-O3", "-DNDEBUG"]
    compat = ["-include", COMPAT_HEADER]
    cuda = ["-std=c++17", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", *compat, *opt]
    if jk.debug:
        cuda.append("-G")
    elif jk.lineinfo:
        cuda.append("-lineinfo")
    cuda += [f for a in archs for f in a.gencode_flags()]
    cuda += ["--threads", str(jk.nvcc_threads), "-ccbin", toolchain.host_compiler()]
    cuda += [*spec.extra_cuda_cflags, *jk.extra_cudaflags]
    cflags = ["-std=c++17", "-fPIC", *compat, *opt, *spec.extra_cflags, *jk.extra_cflags]
    _, libtvm = toolchain.tvm_ffi_paths()
    home = toolchain.cuda_home()
    cudalib = [f"-L{home / 'lib64'}", f"-Wl,-rpath,{home / 'lib64'}"] if home else []
    ldflags = ["-shared", f"-L{libtvm.parent}", "-ltvm_ffi", *cudalib, "-lcudart"]
    ldflags += [*spec.extra_ldflags, *jk.extra_ldflags]
    return cuda, cflags, ldflags


def target_archs(spec: JitSpec) -> list[_archs.Arch]:
    """The archs ``spec`` is built for now: the requested ones whose major it supports."""
    return _archs.select_archs(_archs.requested_archs(), spec.supported_major_versions, spec.name)


class _Resolved(NamedTuple):
    """A spec resolved against the knobs for some archs: its files, dirs and flags, and every
    input of its URI except the bytes of its files (``config``: tagged byte strings)."""

    sources: list[Path]
    our_dirs: list[Path]  # include dirs whose headers are hashed (ours, not TVM-FFI's)
    include_dirs: list[Path]
    cuda: list[str]
    cflags: list[str]
    ldflags: list[str]
    config: list[tuple[str, bytes]]


class _SourceHash(NamedTuple):
    hasher: Any  # hashlib sha256, fed with everything but the toolchain's identity
    sources: list[Path]
    include_dirs: list[Path]
    cuda: list[str]
    cflags: list[str]
    ldflags: list[str]
    inputs: list[str]


def _add(h: Any, tag: str, data: bytes) -> None:
    h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little") + data)


def _key_flags(flags: Sequence[str]) -> list[str]:
    """The flags that name the binary. Paths are dropped (the bytes behind -I count, not where
    they are: they differ between installs of one version), and so are ``-ccbin X`` (the host
    compiler's identity is in the build key) and ``--threads N`` (no effect on the output), so
    the URI stays toolchain-independent and a jit-cache wheel matches whatever CXX or
    FLASHINFER_NVCC_THREADS the user has."""
    kept, skip_next = [], False
    for f in flags:
        if skip_next:
            skip_next = False
        elif f in ("-ccbin", "--threads"):
            skip_next = True
        elif not f.startswith(("-I", "-L", "-Wl,-rpath")):
            kept.append(f)
    return kept


def _resolve(spec: JitSpec, archs: Sequence[_archs.Arch]) -> _Resolved:
    """Flags, dirs and the file-independent part of the URI. Reads no file and touches neither
    nvcc nor the host compiler."""
    sources = spec.source_paths()
    tvm_includes, _ = toolchain.tvm_ffi_paths()
    ours = [toolchain.include_dir(), toolchain.csrc_dir(), *map(Path, spec.extra_include_dirs)]
    include_dirs = [*ours, *tvm_includes]
    cuda, cflags, ldflags = _flags(spec, archs)
    includes = [f"-I{d}" for d in include_dirs]
    cuda += includes
    cflags += includes
    from .. import __version__

    config = [
        ("flashinfer", __version__.encode()),
        ("tvm-ffi", toolchain.tvm_ffi_version().encode()),
        ("archs", " ".join(map(str, archs)).encode()),
    ]
    for tag, flags in (("cuda_cflags", cuda), ("cflags", cflags), ("ldflags", ldflags)):
        config.append((tag, "\0".join(_key_flags(flags)).encode()))
    return _Resolved(sources, ours, include_dirs, cuda, cflags, ldflags, config)


def _hash_sources(spec: JitSpec, archs: Sequence[_archs.Arch]) -> _SourceHash:
    """Hash what the module's URI names (versions, archs, flags, source and header bytes).
    Touches neither nvcc nor the host compiler, so a jit-cache lookup works without them."""
    r = _resolve(spec, archs)
    h = hashlib.sha256()
    for tag, data in r.config:
        _add(h, tag, data)
    compat = (toolchain.csrc_dir() / COMPAT_HEADER).resolve()
    headers = sorted({compat, *local_headers([*r.sources, compat], r.our_dirs)})
    inputs = []
    for path in [*r.sources, *headers]:
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FileNotFoundError(f"source of JIT module {spec.name!r} not found: {path}") from e
        _add(h, "file:" + path.name, data)
        inputs.append(str(path))
    return _SourceHash(h, r.sources, r.include_dirs, r.cuda, r.cflags, r.ldflags, inputs)


def module_uri(spec: JitSpec, archs: Sequence[_archs.Arch]) -> str:
    """The URI of ``spec`` built for ``archs`` here: the key of the jit-cache wheel."""
    return f"{spec.name}_{_hash_sources(spec, archs).hasher.hexdigest()[:16]}"


def in_source_tree(spec: JitSpec) -> bool:
    """Whether every file ``spec`` compiles lies in the package's source tree (sources given
    relative to ``csrc/``, no extra include dirs), so that the tree's digest covers them."""
    return not spec.extra_include_dirs and not any(os.path.isabs(s) for s in spec.sources)


def config_key(spec: JitSpec, archs: Sequence[_archs.Arch]) -> str:
    """Everything the URI of ``spec`` for ``archs`` hashes except the bytes of its files, plus
    which files those are (the spec's name, sources and include dirs as given).

    Two source trees with the same :mod:`~flashinfer.jit.source_digest` give the same URI for
    specs with the same config key (the files, found by following ``#include`` lines through
    identical trees, are identical), so the jit-cache lookup can compare this key, which reads no
    file, instead of the URI, which reads every source and header the module includes. Only
    meaningful for specs :func:`in_source_tree`."""
    h = hashlib.sha256()
    _add(h, "config-key", b"1")
    _add(h, "name", spec.name.encode())
    _add(h, "sources", "\0".join(spec.sources).encode())
    _add(h, "include_dirs", "\0".join(spec.extra_include_dirs).encode())
    for tag, data in _resolve(spec, archs).config:
        _add(h, tag, data)
    return h.hexdigest()[:16]


def plan_build(spec: JitSpec, archs: Optional[Sequence[_archs.Arch]] = None) -> BuildPlan:
    """Resolve ``spec`` against the current knobs and toolchain, and hash it (for ``archs``,
    default :func:`target_archs`)."""
    archs = target_archs(spec) if archs is None else list(archs)
    hashed = _hash_sources(spec, archs)
    h = hashed.hasher
    source_key = h.hexdigest()
    nvcc = toolchain.find_nvcc()
    cxx = shutil.which(toolchain.host_compiler())
    _add(h, "nvcc", toolchain.file_identity(nvcc).encode())
    _add(h, "cxx", toolchain.file_identity(Path(cxx) if cxx else None).encode())
    return BuildPlan(
        spec=spec,
        archs=tuple(archs),
        sources=tuple(hashed.sources),
        include_dirs=tuple(hashed.include_dirs),
        cuda_cflags=tuple(hashed.cuda),
        cflags=tuple(hashed.cflags),
        ldflags=tuple(hashed.ldflags),
        nvcc=nvcc,
        source_key=source_key,
        build_key=h.hexdigest(),
        inputs=tuple(hashed.inputs),
    )


# ----------------------------------------------------------------------------------------------
# Cache locations


def cache_dir() -> Path:
    """``<FLASHINFER_WORKSPACE_BASE or $HOME>/.cache/flashinfer``."""
    return knobs.cache.workspace_base / ".cache" / "flashinfer"


def jit_dir(archs: Sequence[_archs.Arch]) -> Path:
    from .. import __version__

    return cache_dir() / __version__ / _archs.arch_tag(archs) / "cached_ops"


def clear_jit_cache() -> Path:
    """Remove every JIT build tree (all versions and archs); downloaded cubins stay."""
    root = cache_dir()
    if root.is_dir():
        for child in root.iterdir():
            if child.is_dir() and (child.name[:1].isdigit()) and child.name != "cubins":
                shutil.rmtree(child, ignore_errors=True)
    return root


def _aot_module(spec: JitSpec, archs: Sequence[_archs.Arch]) -> Optional[Any]:
    """The installed flashinfer-jit-cache's build of ``spec``, if one covers ``archs`` and has
    the URI ``spec`` would have here when built for that build's archs (same sources, flags,
    flashinfer and TVM-FFI versions). The wheel's version and CUDA major are checked once per
    process (:mod:`flashinfer.jit.jit_cache`). Needs no nvcc: nothing here looks at it.

    Where the wheel was compiled from the very sources this package bundles (equal source
    digests, :func:`flashinfer.jit.jit_cache.sources_match`), a module whose recorded config key
    equals :func:`config_key` here has that URI without a file being read; otherwise (a source
    checkout, another tree, other flags) the URI is computed from the sources and compared."""
    from . import jit_cache

    candidates = jit_cache.candidates(spec.name, archs)
    by_key = bool(candidates) and in_source_tree(spec) and jit_cache.sources_match()
    for candidate in candidates:
        if by_key and candidate.config_key == config_key(spec, candidate.archs):
            return candidate
        if module_uri(spec, candidate.archs) == candidate.uri:
            return candidate
    return None


# ----------------------------------------------------------------------------------------------
# Build and load


def get_module(spec: JitSpec) -> Any:
    """Load ``spec``'s module from the first place that has it, building it if none does.
    See :meth:`JitSpec.build_and_load` for what it raises."""
    archs = target_archs(spec)
    # The jit-cache wheel first, before anything that needs nvcc (plan_build stats it).
    aot = _aot_module(spec, archs)
    if aot is not None:
        module = _load_aot(aot)
        if module is not None:
            return module
    plan = plan_build(spec, archs)
    with _loaded_lock:
        module = _loaded.get(plan.build_key)
    if module is not None:
        return module
    path = _disk_or_build(plan)
    try:
        module = _load(path)
    except Exception:
        # A copy that passed the cheap check (same size, same mtime) but does not load: if its
        # bytes are not the recorded ones, it is rebuilt; if they are, the error is real.
        if not _rebuild_if_damaged(plan):
            raise
        module = _load(plan.so_path)
    with _loaded_lock:
        return _loaded.setdefault(plan.build_key, module)


def _aot_damage(aot: Any) -> Optional[str]:
    """Why the wheel's file differs from its manifest (None: it does not, as far as checked).
    The size always (a stat); the sha256 with FLASHINFER_JIT_VERIFY. Not by mtime: pip gives
    every installed file the time it was unpacked."""
    size, sha = getattr(aot, "size", None), getattr(aot, "sha256", None)
    try:
        st = os.stat(aot.path)
    except OSError as e:
        return f"cannot stat it: {e}"
    if type(size) is int and st.st_size != size:
        return f"it has {st.st_size} bytes, its manifest says {size}"
    if knobs.jit.verify and sha:
        got = _file_sha256(Path(aot.path))
        if got != sha:
            return f"its sha256 is {got}, its manifest says {sha}"
    return None


def _load_aot(aot: Any) -> Optional[Any]:
    """The loaded jit-cache module, or None (with one warning) when its file is damaged or it
    does not load here, e.g. on a system whose libstdc++ is older than the build's: the JIT is
    still there. The wheel's files are never modified."""
    key = "aot:" + aot.uri
    with _loaded_lock:
        module = _loaded.get(key)
        if module is not None or str(aot.path) in _aot_refused:
            return module
    damage = _aot_damage(aot)
    try:
        if damage is not None:
            raise _Damaged(damage)
        module = _load(aot.path)
    except Exception as e:  # noqa: BLE001 - any load failure means: use the JIT instead
        with _loaded_lock:
            _aot_refused.add(str(aot.path))
        if isinstance(e, _Damaged):
            from .jit_cache import DISTRIBUTION

            what = (f"is damaged ({e}), so it is compiled instead; reinstall the wheel: pip "
                    f"install --force-reinstall {DISTRIBUTION}")
        else:
            what = f"failed to load, so it is compiled instead: {type(e).__name__}: {e}"
        warnings.warn(
            f"flashinfer-jit-cache's module {aot.uri} ({aot.path}) {what}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    stats["loaded_aot"] += 1
    with _loaded_lock:
        return _loaded.setdefault(key, module)


def _load(path: Path) -> Any:
    import tvm_ffi

    return tvm_ffi.load_module(str(path))


class _Damaged(Exception):
    """A cached module file that is not the one its record describes."""


RECORD = "module.json"


def _file_sha256(path: Path) -> str:
    from ..artifacts.store import hash_file  # bounded memory; imported only when hashing

    return hash_file(path)[0]


def _fsync(path: Path, directory: bool = False) -> None:
    """Flush ``path`` (a file, or with ``directory`` the entries of a directory) to disk."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:  # a platform that cannot open directories: nothing to flush there
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def _write_durably(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, the bytes on disk before the name."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _disk_damage(plan: BuildPlan, verify: bool = False) -> Optional[str]:
    """Why the disk cache's ``.so`` of ``plan`` is not the one its record describes; None when
    it is, as far as checked: the size always (a stat), the sha256 when the mtime differs from
    the record's, or ``verify`` / FLASHINFER_JIT_VERIFY. A copy found intact under a new mtime
    (a cache copied without its times) has its record updated, so it is hashed once."""
    so, record_path = plan.so_path, plan.build_dir / RECORD
    st = os.stat(so)
    try:
        record = json.loads(record_path.read_text())
        size, sha, mtime = (record["so"][k] for k in ("size", "sha256", "mtime_ns"))
        if type(size) is not int or type(mtime) is not int or not isinstance(sha, str):
            raise TypeError("mistyped")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        return f"its record {record_path} has no size and sha256 ({type(e).__name__}: {e})"
    if st.st_size != size:
        return f"it has {st.st_size} bytes, its record says {size}"
    if verify or knobs.jit.verify or st.st_mtime_ns != mtime:
        got = _file_sha256(so)
        if got != sha:
            return f"its sha256 is {got}, its record says {sha}"
        if st.st_mtime_ns != mtime:
            record["so"]["mtime_ns"] = st.st_mtime_ns
            with contextlib.suppress(OSError):  # a read-only cache: hashed again next time
                _write_durably(record_path, json.dumps(record, indent=1))
    return None


def _state(plan: BuildPlan, verify: bool = False) -> tuple[bool, Optional[str]]:
    """(whether the ``.so`` exists, why it is damaged or None)."""
    try:
        return True, _disk_damage(plan, verify)
    except (FileNotFoundError, NotADirectoryError):
        return False, None


def _warn_rebuild(plan: BuildPlan, why: str) -> None:
    warnings.warn(
        f"JIT module {plan.spec.name!r}: the cached {plan.so_path} is damaged ({why}); "
        "rebuilding it",
        RuntimeWarning,
        stacklevel=4,
    )


def _lock(plan: BuildPlan):
    folder = plan.build_dir.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise JitError(
            f"cannot create the JIT cache directory {folder} ({type(e).__name__}: {e}); the "
            "cache is <FLASHINFER_WORKSPACE_BASE>/.cache/flashinfer, so FLASHINFER_WORKSPACE_BASE "
            f"(now {knobs.cache.workspace_base}) must name a directory you can write"
        ) from None
    return file_lock(plan.build_dir.with_name(plan.build_dir.name + ".lock"))


def _disk_or_build(plan: BuildPlan) -> Path:
    """Fast path (checked) -> lock -> re-check -> refuse if JIT is disabled -> build ->
    publish. A damaged copy is rebuilt, with one warning from the process that rebuilds it."""
    exists, damage = _state(plan)
    if exists and damage is None:
        stats["loaded_disk"] += 1
        return plan.so_path
    if knobs.jit.disable_jit:
        from .remedy import missing_module_message  # the error path only

        found = (f"\n(Its cached copy {plan.so_path} is damaged, so it is not loaded: {damage}.)"
                 if exists else "")
        raise MissingJITCacheError(
            missing_module_message(plan.spec, plan.uri, plan.archs) + found, plan.spec)
    with _lock(plan):
        exists, damage = _state(plan)  # another process may have built or repaired it
        if exists and damage is None:
            stats["loaded_disk"] += 1
            return plan.so_path
        if damage is not None:
            _warn_rebuild(plan, damage)
        _build(plan)
        stats["built"] += 1
    return plan.so_path


def _rebuild_if_damaged(plan: BuildPlan) -> bool:
    """After a failed load: hash the file; rebuild it (True) unless it is the recorded one."""
    if knobs.jit.disable_jit:
        return False
    with _lock(plan):
        exists, damage = _state(plan, verify=True)
        if exists and damage is None:
            return False
        if damage is not None:
            _warn_rebuild(plan, damage)
        _build(plan)
        stats["built"] += 1
    return True


def _build(plan: BuildPlan) -> None:
    # Imported here: a process whose modules all come from a cache never needs it.
    from .ninja import (
        NinjaBuild,
        compiler_errors,
        failed_targets,
        render_ninja,
        write_if_changed,
    )

    nvcc = plan.nvcc
    if nvcc is None or not os.access(nvcc, os.X_OK):
        raise CompilerNotFoundError(
            f"JIT module {plan.spec.name!r} must be compiled, but nvcc was not found "
            f"(looked at FLASHINFER_NVCC, CUDA_HOME/bin, PATH; got {nvcc}). Install the CUDA "
            "toolkit, or pip install 'flashinfer-python[jit-cache]' to use precompiled modules."
        )
    ninja = toolchain.find_ninja()
    if ninja is None:
        raise CompilerNotFoundError("ninja was not found: pip install ninja")
    work = plan.build_dir / "build"
    shutil.rmtree(work, ignore_errors=True)  # leftovers of a build that was killed
    work.mkdir(parents=True)
    build = NinjaBuild(
        name=plan.spec.name,
        sources=plan.sources,
        nvcc=[*knobs.jit.nvcc_launcher, str(nvcc)],
        cxx=[*knobs.jit.cxx_launcher, toolchain.host_compiler()],
        cuda_cflags=plan.cuda_cflags,
        cflags=plan.cflags,
        ldflags=plan.ldflags,
    )
    write_if_changed(work / "build.ninja", render_ninja(build))
    jobs = knobs.jit.max_jobs or max(1, min(len(plan.sources), os.cpu_count() or 1))
    log_path = plan.build_dir / "build.log"
    logger.info("compiling JIT module %s for %s", plan.spec.name, " ".join(map(str, plan.archs)))
    start = time.monotonic()
    with open(log_path, "w") as log:
        cmd = [str(ninja), "-C", str(work), "-j", str(jobs)]
        if knobs.jit.verbose:
            cmd.append("-v")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log.write(proc.stdout)
    if knobs.jit.verbose:
        print(proc.stdout, end="", flush=True)
    if proc.returncode != 0:
        lines = compiler_errors(proc.stdout) or failed_targets(proc.stdout)
        raise JitCompileError(plan.spec, str(log_path), lines)
    seconds = time.monotonic() - start
    built = work / f"{plan.spec.name}.so"
    _fsync(built)
    st = os.stat(built)
    record = {
        "name": plan.spec.name,
        "uri": plan.uri,
        "archs": [str(a) for a in plan.archs],
        "nvcc": str(nvcc),
        "nvcc_version": toolchain.nvcc_version(nvcc),
        "cuda_cflags": list(plan.cuda_cflags),
        "inputs": list(plan.inputs),
        "build_seconds": round(seconds, 2),
        "so": {"size": st.st_size, "sha256": _file_sha256(built), "mtime_ns": st.st_mtime_ns},
    }
    # The record, then the .so (the commit point; rename keeps its mtime), then the directory.
    _write_durably(plan.build_dir / RECORD, json.dumps(record, indent=1))
    os.replace(built, plan.so_path)
    _fsync(plan.build_dir, directory=True)
    shutil.rmtree(work, ignore_errors=True)
    logger.info("built %s in %.1f s", plan.spec.name, seconds)


# ----------------------------------------------------------------------------------------------
# Introspection for the CLI


def resolve_archs() -> list[str]:
    """The archs modules are built for now (raises NoSupportedArchError when none)."""
    return [str(a) for a in _archs.requested_archs()]


def find_nvcc() -> Optional[Path]:
    return toolchain.find_nvcc()


def nvcc_version() -> Optional[str]:
    return toolchain.nvcc_version()


def spec_status(spec: JitSpec) -> dict:
    """Where ``spec``'s module would come from: ``{"name", "uri", "status", "path"}`` with status
    "aot" (the installed flashinfer-jit-cache), "compiled" (the JIT cache on disk) or
    "not-compiled" (and "error" where the spec cannot be planned). :func:`flashinfer.aot.module_status`
    lists it for every registered module."""
    try:
        plan = plan_build(spec)
    except Exception as e:  # noqa: BLE001 - status must describe, not raise
        return {"name": spec.name, "uri": None, "status": "not-compiled", "path": None,
                "error": str(e)}
    aot = _aot_module(spec, plan.archs)
    if aot is not None:
        status, path = "aot", str(aot.path)
    elif plan.so_path.is_file():
        status, path = "compiled", str(plan.so_path)
    else:
        status, path = "not-compiled", None
    return {"name": spec.name, "uri": plan.uri, "status": status, "path": path}

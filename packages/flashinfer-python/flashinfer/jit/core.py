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
"""

from __future__ import annotations

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
from ..exceptions import CompilerNotFoundError, JitCompileError, MissingJITCacheError
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
    """

    name: str
    sources: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    extra_include_dirs: tuple[str, ...] = ()
    supported_major_versions: Optional[tuple[int, ...]] = None

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
    module = _load(_disk_or_build(plan))
    with _loaded_lock:
        return _loaded.setdefault(plan.build_key, module)


def _load_aot(aot: Any) -> Optional[Any]:
    """The loaded jit-cache module, or None (with a warning) when it does not load here, e.g.
    on a system whose libstdc++ is older than the build's: the JIT is still there."""
    key = "aot:" + aot.uri
    with _loaded_lock:
        module = _loaded.get(key)
    if module is not None:
        return module
    try:
        module = _load(aot.path)
    except Exception as e:  # noqa: BLE001 - any load failure means: use the JIT instead
        warnings.warn(
            f"flashinfer-jit-cache's module {aot.uri} ({aot.path}) failed to load, so it is "
            f"compiled instead: {type(e).__name__}: {e}",
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


def _disk_or_build(plan: BuildPlan) -> Path:
    """Fast path -> lock -> re-check -> refuse if JIT is disabled -> build -> publish."""
    if plan.so_path.is_file():
        stats["loaded_disk"] += 1
        return plan.so_path
    if knobs.jit.disable_jit:
        raise MissingJITCacheError(
            f"JIT module {plan.spec.name!r} (uri {plan.uri}, archs "
            f"{' '.join(map(str, plan.archs))}) is not in any cache and FLASHINFER_DISABLE_JIT "
            "is set. Install the wheel that provides it: pip install "
            "'flashinfer-python[jit-cache]' (flashinfer-jit-cache of the same version), or "
            "unset FLASHINFER_DISABLE_JIT to compile it.",
            plan.spec,
        )
    with file_lock(plan.build_dir.with_name(plan.build_dir.name + ".lock")):
        if plan.so_path.is_file():  # another process built it while we waited
            stats["loaded_disk"] += 1
            return plan.so_path
        _build(plan)
        stats["built"] += 1
    return plan.so_path


def _build(plan: BuildPlan) -> None:
    # Imported here: a process whose modules all come from a cache never needs it.
    from .ninja import NinjaBuild, render_ninja, write_if_changed

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
        raise JitCompileError(plan.spec, str(log_path), _error_lines(proc.stdout))
    seconds = time.monotonic() - start
    record = {
        "name": plan.spec.name,
        "uri": plan.uri,
        "archs": [str(a) for a in plan.archs],
        "nvcc": str(nvcc),
        "nvcc_version": toolchain.nvcc_version(nvcc),
        "cuda_cflags": list(plan.cuda_cflags),
        "inputs": list(plan.inputs),
        "build_seconds": round(seconds, 2),
    }
    (plan.build_dir / "module.json").write_text(json.dumps(record, indent=1))
    os.replace(work / f"{plan.spec.name}.so", plan.so_path)  # the commit point
    shutil.rmtree(work, ignore_errors=True)
    logger.info("built %s in %.1f s", plan.spec.name, seconds)


def _error_lines(output: str) -> list[str]:
    """The compiler's and linker's error lines, without ninja's own chatter."""
    keep = []
    for line in output.splitlines():
        low = line.lower()
        if any(w in low for w in ("error", "undefined reference", "cannot find")) and not (
            line.startswith("ninja:")
        ):
            keep.append(line.strip())
    return keep or [ln.strip() for ln in output.splitlines() if ln.startswith("FAILED")]


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

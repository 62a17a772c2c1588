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

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from .. import knobs
from ..exceptions import CompilerNotFoundError, JitCompileError, MissingJITCacheError
from . import archs as _archs
from . import toolchain
from .ninja import NinjaBuild, render_ninja, write_if_changed

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


def _flags(spec: JitSpec, archs: Sequence[_archs.Arch]) -> tuple[list[str], list[str], list[str]]:
    jk = knobs.jit
    opt = ["-O0", "-g"] if jk.debug else ["-O3", "-DNDEBUG"]
    cuda = ["-std=c++17", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", *opt]
    if jk.debug:
        cuda.append("-G")
    elif jk.lineinfo:
        cuda.append("-lineinfo")
    cuda += [f for a in archs for f in a.gencode_flags()]
    cuda += ["--threads", str(jk.nvcc_threads), "-ccbin", toolchain.host_compiler()]
    cuda += [*spec.extra_cuda_cflags, *jk.extra_cudaflags]
    cflags = ["-std=c++17", "-fPIC", *opt, *spec.extra_cflags, *jk.extra_cflags]
    _, libtvm = toolchain.tvm_ffi_paths()
    home = toolchain.cuda_home()
    cudalib = [f"-L{home / 'lib64'}", f"-Wl,-rpath,{home / 'lib64'}"] if home else []
    ldflags = ["-shared", f"-L{libtvm.parent}", "-ltvm_ffi", *cudalib, "-lcudart"]
    ldflags += [*spec.extra_ldflags, *jk.extra_ldflags]
    return cuda, cflags, ldflags


def plan_build(spec: JitSpec) -> BuildPlan:
    """Resolve ``spec`` against the current knobs and toolchain, and hash it."""
    archs = _archs.select_archs(
        _archs.requested_archs(), spec.supported_major_versions, spec.name
    )
    sources = spec.source_paths()
    tvm_includes, _ = toolchain.tvm_ffi_paths()
    ours = [toolchain.include_dir(), toolchain.csrc_dir(), *map(Path, spec.extra_include_dirs)]
    include_dirs = [*ours, *tvm_includes]
    cuda, cflags, ldflags = _flags(spec, archs)
    includes = [f"-I{d}" for d in include_dirs]
    cuda += includes
    cflags += includes
    from .. import __version__

    h = hashlib.sha256()

    def add(tag: str, data: bytes) -> None:
        h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

    add("flashinfer", __version__.encode())
    add("tvm-ffi", toolchain.tvm_ffi_version().encode())
    add("archs", " ".join(map(str, archs)).encode())
    # Include dirs differ between installs of the same version; the headers' bytes matter, not
    # where they are, so flags are hashed without the -I entries.
    for tag, flags in (("cuda_cflags", cuda), ("cflags", cflags), ("ldflags", ldflags)):
        add(tag, "\0".join(f for f in flags if not f.startswith(("-I", "-L", "-Wl,-rpath"))).encode())
    headers = local_headers(sources, ours)
    inputs = []
    for path in [*sources, *headers]:
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FileNotFoundError(f"source of JIT module {spec.name!r} not found: {path}") from e
        add("file:" + path.name, data)
        inputs.append(str(path))
    source_key = h.hexdigest()
    nvcc = toolchain.find_nvcc()
    cxx = shutil.which(toolchain.host_compiler())
    add("nvcc", toolchain.file_identity(nvcc).encode())
    add("cxx", toolchain.file_identity(Path(cxx) if cxx else None).encode())
    return BuildPlan(
        spec=spec,
        archs=tuple(archs),
        sources=tuple(sources),
        include_dirs=tuple(include_dirs),
        cuda_cflags=tuple(cuda),
        cflags=tuple(cflags),
        ldflags=tuple(ldflags),
        nvcc=nvcc,
        source_key=source_key,
        build_key=h.hexdigest(),
        inputs=tuple(inputs),
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


def _aot_path(plan: BuildPlan) -> Optional[Path]:
    """The module in the installed flashinfer-jit-cache wheel, if it has this URI."""
    import importlib.util

    spec = importlib.util.find_spec("flashinfer_jit_cache")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        candidate = Path(root) / "modules" / plan.uri / f"{plan.spec.name}.so"
        if candidate.is_file():
            return candidate
    return None


# ----------------------------------------------------------------------------------------------
# Build and load


def get_module(spec: JitSpec) -> Any:
    """Load ``spec``'s module from the first place that has it, building it if none does.
    See :meth:`JitSpec.build_and_load` for what it raises."""
    plan = plan_build(spec)
    with _loaded_lock:
        module = _loaded.get(plan.build_key)
    if module is not None:
        return module
    path = _aot_path(plan)
    if path is not None:
        stats["loaded_aot"] += 1
    else:
        path = _disk_or_build(plan)
    module = _load(path)
    with _loaded_lock:
        return _loaded.setdefault(plan.build_key, module)


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
    with _file_lock(plan.build_dir.with_name(plan.build_dir.name + ".lock")):
        if plan.so_path.is_file():  # another process built it while we waited
            stats["loaded_disk"] += 1
            return plan.so_path
        _build(plan)
        stats["built"] += 1
    return plan.so_path


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock; the kernel releases it if the holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _build(plan: BuildPlan) -> None:
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


def module_status() -> list[dict]:
    """Every module registered in :mod:`flashinfer.aot`, with where it would come from."""
    from ..aot import registered_specs

    rows = []
    for spec in registered_specs():
        try:
            plan = plan_build(spec)
        except Exception as e:  # noqa: BLE001 - status must describe, not raise
            rows.append({"name": spec.name, "uri": None, "status": "not-compiled",
                         "path": None, "error": str(e)})
            continue
        aot = _aot_path(plan)
        if aot is not None:
            status, path = "aot", str(aot)
        elif plan.so_path.is_file():
            status, path = "compiled", str(plan.so_path)
        else:
            status, path = "not-compiled", None
        rows.append({"name": spec.name, "uri": plan.uri, "status": status, "path": path})
    return rows

"""Runs flashinfer's AOT build for the jit-cache wheel; hatch_build.py calls it in a subprocess.

    python aot_driver.py info  --version X.Y.Z [--core DIR]            -> JSON on stdout
    python aot_driver.py build --version X.Y.Z [--core DIR] --out FILE -> JSON in FILE

``--core`` is the flashinfer-python source directory of the monorepo (the one this wheel is
built with); without it, the ``flashinfer`` importable by this interpreter is used. Either way
it must be version X.Y.Z: the version is part of every module's URI.

``build`` compiles every module of :func:`flashinfer.aot.registered_specs` (or those named in
FLASHINFER_AOT_MODULES) for FLASHINFER_CUDA_ARCH_LIST, ``MAX_JOBS`` (default: the core count)
modules at a time, with progress on stderr, into the JIT cache
(FLASHINFER_WORKSPACE_BASE), and writes where each module's ``.so`` is, its URI and config key,
and the digest of the source tree the modules were compiled from (the JIT matches modules by
config key where the installed flashinfer-python bundles sources of the same digest).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _import_flashinfer(core: str | None, version: str):
    if core:
        sys.path.insert(0, core)
    import flashinfer

    where = Path(flashinfer.__file__).resolve().parent
    if flashinfer.__version__ != version:
        if core and where == (Path(core) / "flashinfer").resolve():
            # A source tree whose _build_meta.py was never written (or predates the last pin):
            # it *is* version X.Y.Z, version.txt says so, and the URI must carry that version.
            flashinfer.__version__ = version
        else:
            sys.exit(f"flashinfer at {where} is {flashinfer.__version__}, expected {version}")
    return flashinfer


def info(args: argparse.Namespace) -> dict:
    _import_flashinfer(args.core, args.version)
    from flashinfer import _versions
    from flashinfer.jit import toolchain

    nvcc = toolchain.find_nvcc()
    release = toolchain.nvcc_version(nvcc)  # "13.0, V13.0.88"
    if release is None:
        sys.exit(
            f"building flashinfer-jit-cache needs nvcc, and none runs (found: {nvcc}); set "
            "CUDA_HOME or FLASHINFER_NVCC"
        )
    cuda = release.split(",")[0].strip()
    return {
        "flashinfer_version": args.version,
        "cuda_version": cuda,
        "cuda_label": _versions.cuda_label(cuda),
        "nvcc": str(nvcc),
        "nvcc_version": release,
        "tvm_ffi_version": toolchain.tvm_ffi_version(),
    }


def build(args: argparse.Namespace) -> dict:
    _import_flashinfer(args.core, args.version)
    from flashinfer import aot, knobs
    from flashinfer.jit import core, source_digest, toolchain

    if not knobs.jit.cuda_arch_list:
        sys.exit(
            "FLASHINFER_CUDA_ARCH_LIST must name the archs the jit-cache wheel holds, e.g. "
            '"8.0 9.0a 10.0a 12.0a"; it is unset'
        )
    specs = aot.registered_specs()
    wanted = [n.strip() for n in (knobs.jit.aot_modules or "").split(",") if n.strip()]
    if wanted:
        unknown = sorted(set(wanted) - {s.name for s in specs})
        if unknown:
            sys.exit(
                f"FLASHINFER_AOT_MODULES names unknown modules {unknown}; known: "
                f"{[s.name for s in specs]}"
            )
        specs = [s for s in specs if s.name in wanted]
    # Build from source even where a jit-cache wheel is installed in this interpreter: the
    # wheel being built must hold what this toolchain compiles, not a copy of another wheel.
    core._aot_module = lambda spec, archs: None
    jobs = knobs.jit.max_jobs or os.cpu_count() or 1
    print(
        f"flashinfer-jit-cache: {len(specs)} modules for {knobs.jit.cuda_arch_list}, "
        f"{jobs} at a time",
        file=sys.stderr,
        flush=True,
    )
    seconds = aot.build_all(specs, jobs=jobs)
    modules = []
    for spec in specs:
        plan = core.plan_build(spec)
        if not plan.so_path.is_file():
            sys.exit(f"module {spec.name} was built but {plan.so_path} is missing")
        modules.append(
            {
                "name": spec.name,
                "uri": plan.uri,
                # used only for specs whose files all lie in the digested tree
                "config_key": core.config_key(spec, plan.archs),
                "archs": [str(a) for a in plan.archs],
                "so": str(plan.so_path.resolve()),
                "build_seconds": round(seconds.get(spec.name, 0.0), 2),
            }
        )
    return {
        "arch_list": core.resolve_archs(),
        "source_digest": source_digest.tree_digest(toolchain.source_root()),
        "modules": modules,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["info", "build"])
    parser.add_argument("--version", required=True)
    parser.add_argument("--core", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = info(args) if args.command == "info" else build(args)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()

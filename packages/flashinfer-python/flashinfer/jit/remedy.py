"""What a missing module's error says: each way to get it (flashinfer-jit-cache, nvcc, a copy).

Below :mod:`flashinfer.jit.core` in the import order (core calls it on its error path), so it
reads the registry only through :attr:`JitSpec.precompiled`.
"""

from __future__ import annotations

from typing import Any, Sequence

from .archs import parse_arch_list

#: The archs a release's jit-cache wheel holds (RELEASE_ARCHS in noxfile.py; docs/wheels.md).
RELEASE_ARCHS = ("8.0", "9.0a", "10.0a", "12.0a")


def missing_module_message(spec: Any, uri: str, archs: Sequence[Any]) -> str:
    """What :class:`~flashinfer.exceptions.MissingJITCacheError` says: the module, and each way
    to get it, one a line. Called on that error path only (it reads the registry and the
    installed jit-cache)."""
    from .. import __version__, _versions
    from . import jit_cache

    targets = " ".join(map(str, archs))
    version = _versions.public_version(__version__)
    lines = [f"JIT module {spec.name!r} (uri {uri}, archs {targets}) is not in any cache, and "
             "FLASHINFER_DISABLE_JIT is set, so it is not compiled. Ways to get it:"]
    wheel = jit_cache.installed()
    registered = spec.precompiled
    if not registered:
        lines.append("- no flashinfer-jit-cache wheel precompiles this variant (docs/wheels.md, "
                     "'What the released set covers without nvcc'): it is compiled once, below")
    elif wheel is None:
        cuda = jit_cache.runtime_cuda()
        label = _versions.cuda_label(cuda) if cuda else "cu130"
        lines.append(f"- install flashinfer-jit-cache {version}, which precompiles it for "
                     f"{' '.join(RELEASE_ARCHS)}: pip install 'flashinfer-jit-cache=={version}' "
                     f"--extra-index-url {_versions.WHEEL_INDEX_BASE}/{label}/")
    elif not wheel.usable:
        lines.append(f"- make the installed flashinfer-jit-cache usable: {wheel.problem}")
    elif all(any(jit_cache.covers(b, t) for b in parse_arch_list(" ".join(wheel.arch_list)))
             for t in archs):
        lines.append(f"- the installed flashinfer-jit-cache {wheel.version} has it for these archs"
                     ", but built from other sources or flags (a source checkout, "
                     "FLASHINFER_EXTRA_CUDAFLAGS; docs/wheels.md, 'At run time'): build it, below")
    else:
        lines.append(f"- the installed flashinfer-jit-cache {wheel.version} holds it for "
                     f"{' '.join(wheel.arch_list)}, none of which serves {targets} (docs/wheels.md"
                     ", 'Which GPUs a wheel serves'): it is compiled once, below")
    lines.append("- compile it here: install the CUDA toolkit (nvcc, found through "
                 "FLASHINFER_NVCC, CUDA_HOME or PATH) and unset FLASHINFER_DISABLE_JIT; it is "
                 "cached for every later process")
    how = (f"python -m flashinfer.aot --only {spec.name}" if registered else "call the op once")
    lines.append(f"- or compile it where nvcc is ({how}, with FLASHINFER_CUDA_ARCH_LIST="
                 f"\"{targets}\" and flashinfer {__version__}) and copy "
                 "$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/ to this machine's")
    return "\n".join(lines)

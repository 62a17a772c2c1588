"""The modules worth precompiling, and a parallel builder for them.

``python -m flashinfer.aot [--jobs N] [--only name,...]`` builds them into the JIT cache for
``FLASHINFER_CUDA_ARCH_LIST``; the flashinfer-jit-cache wheel packs the result.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Optional, Sequence

from .jit.core import JitSpec, get_module, spec_status


def registered_specs() -> list[JitSpec]:
    """Every module the package has, in a stable order."""
    from .jit.activation import gen_activation_module
    from .jit.attention import common_variants, extra_variants
    from .jit.cascade import gen_cascade_module
    from .jit.norm import gen_norm_module
    from .jit.page import gen_page_module
    from .jit.quantization import gen_quantization_module
    from .jit.rope import gen_rope_module
    from .jit.scale import gen_scale_module

    return [
        gen_scale_module(),
        gen_norm_module(),
        gen_activation_module(),
        gen_rope_module(),
        gen_quantization_module(),
        gen_page_module(),
        gen_cascade_module(),
        *(v.spec() for v in common_variants() + extra_variants()),
    ]


def module_status() -> list[dict]:
    """Every registered module, with where it would come from (:func:`~flashinfer.jit.core.spec_status`)."""
    return [spec_status(spec) for spec in registered_specs()]


def _minutes(s: float) -> str:
    return f"{int(s) // 60}m{int(s) % 60:02d}s"


def build_all(specs: Sequence[JitSpec], jobs: int = 4) -> dict[str, float]:
    """Build (or load) every spec, ``jobs`` at a time; returns seconds per module.

    Prints one progress line per finished module on stderr: ``[i/N] name: seconds``, the time
    since the start and a naive estimate of what is left (the mean so far times what remains)."""
    seconds: dict[str, float] = {}
    start = time.monotonic()

    def one(spec: JitSpec) -> tuple[str, float]:
        start = time.monotonic()
        get_module(spec)
        return spec.name, time.monotonic() - start

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, s) for s in specs]
        for i, fut in enumerate(as_completed(futures), 1):
            name, secs = fut.result()
            seconds[name] = secs
            elapsed = time.monotonic() - start
            left = elapsed / i * (len(specs) - i)
            print(f"[{i}/{len(specs)}] {name}: {secs:.1f} s (elapsed {_minutes(elapsed)}, "
                  f"~{_minutes(left)} left)", file=sys.stderr, flush=True)
    return seconds


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashinfer.aot", description=__doc__)
    parser.add_argument("--jobs", type=int, default=4, help="modules built at once")
    parser.add_argument("--only", default="", help="comma-separated module names")
    args = parser.parse_args(argv)
    specs = registered_specs()
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {s.name for s in specs}
        if unknown:
            parser.error(f"unknown modules {sorted(unknown)}; known: {[s.name for s in specs]}")
        specs = [s for s in specs if s.name in wanted]
    build_all(specs, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The modules worth precompiling, and a parallel builder for them.

``python -m flashinfer.aot [--jobs N] [--only name,...]`` builds them into the JIT cache for
``FLASHINFER_CUDA_ARCH_LIST``; the flashinfer-jit-cache wheel packs the result.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Optional, Sequence

from .jit.core import JitSpec, get_module, spec_status
from .jit.remedy import RELEASE_ARCHS  # noqa: F401  (re-exported: the release's archs)


def registered_specs() -> list[JitSpec]:
    """Every module the package has, in a stable order: what the jit-cache wheel precompiles."""
    from .jit.activation import gen_activation_module
    from .jit.attention import precompiled_variants
    from .jit.cascade import gen_cascade_module
    from .jit.norm import gen_norm_module
    from .jit.page import gen_page_module
    from .jit.quantization import gen_quantization_module
    from .jit.rope import gen_rope_module
    from .jit.sampling import gen_sampling_module
    from .jit.scale import gen_scale_module
    from .jit.topk import gen_topk_module

    return [
        gen_scale_module(),
        gen_norm_module(),
        gen_activation_module(),
        gen_rope_module(),
        gen_quantization_module(),
        gen_page_module(),
        gen_cascade_module(),
        gen_topk_module(),
        gen_sampling_module(),
        *(v.spec() for v in precompiled_variants()),
    ]


def module_status() -> list[dict]:
    """Every registered module, with where it would come from (:func:`~flashinfer.jit.core.spec_status`)."""
    return [spec_status(spec) for spec in registered_specs()]


def _minutes(s: float) -> str:
    return f"{int(s) // 60}m{int(s) % 60:02d}s"


#: Seconds of nvcc per arch for each module, measured on the 2-core build machine (nvcc 13.0,
#: one module at a time, ``benchmarks/results/2026-11-26-cpu-5ab6b7e-aot-module-times.json``): the
#: weights of :class:`Progress`. Only their ratios matter (the machine's speed is measured as the
#: build goes); a module missing here weighs the mean of those listed.
COMPILE_WEIGHTS = {"scale": 5.4, "norm": 12.3, "activation": 9.7, "rope": 24.1,
                   "quantization": 9.8, "page": 7.2, "cascade": 10.1,
                   # the same machine, MAX_JOBS=2: benchmarks/results/2026-11-27-cpu-7353dc7-aot-
                   # sampling-topk-times.json. Sampling: its share in the AOT build itself, where
                   # modules build two at a time and its 17 units get about one core: 292.2 s
                   # for 4 archs in the release build at 36e96fc against 1.73 s per unit of
                   # weight for the other modules in it (...-cpu-36e96fc-fresh-clone-timings.json;
                   # 449.4 s at 5e39186, when each unit also compiled the on-chip kernels)
                   "topk": 14.7, "sampling": 168.8}
#: Every attention variant is one instantiation of the same source: 13-25 s per arch in the same
#: measurements, whatever the head_dim, mask or position encoding (the spread is the machine's).
ATTENTION_WEIGHT = 18.0


def compile_weight(name: str) -> float:
    """The expected compile time of module ``name``, relative to the others."""
    if name.startswith("attention_"):
        return ATTENTION_WEIGHT
    return COMPILE_WEIGHTS.get(name, sum(COMPILE_WEIGHTS.values()) / len(COMPILE_WEIGHTS))


class Progress:
    """The progress lines of an AOT build and their estimate of what is left.

    The basis: each module's expected compile time (:func:`compile_weight`, measured per module
    on the build machine) times this build's speed, the seconds the finished modules took per
    unit of their weights; less what running modules have done; ``jobs`` at a time (each
    module's time is measured while the others run, so the speed includes their contention).
    The old estimate, the mean of the modules so far times the number left, ran 20-40% low: the
    small modules came first, and the slowest ones (``rope``, the attention variants) last.
    """

    def __init__(self, names: Sequence[str], jobs: int):
        self.total = len(names)
        self.jobs = max(1, jobs)
        self.pending = {n: compile_weight(n) for n in names}
        self.seconds = self.weights = 0.0  # of the finished modules
        self.running: dict[str, float] = {}  # name -> start time
        self._lock = threading.Lock()

    def started(self, name: str, at: float) -> None:
        with self._lock:
            self.running[name] = at

    def left(self, now: float) -> Optional[float]:
        """Seconds the unfinished modules are expected to take from ``now``; None before the
        first module is done (no measured speed yet)."""
        if not self.weights:
            return None
        speed = self.seconds / self.weights
        work = speed * sum(self.pending.values())
        with self._lock:
            work -= sum(min(now - at, speed * self.pending[name])
                        for name, at in self.running.items())
        return max(work, 0.0) / min(self.jobs, len(self.pending)) if self.pending else 0.0

    def finished(self, name: str, seconds: float, elapsed: float) -> str:
        """Record a finished module (``elapsed`` since the start, the clock of ``started``) and
        return its progress line."""
        with self._lock:
            self.running.pop(name, None)
            self.weights += self.pending.pop(name)
            self.seconds += seconds
        left = self.left(elapsed)
        return (f"[{self.total - len(self.pending)}/{self.total}] {name}: {seconds:.1f} s "
                f"(elapsed {_minutes(elapsed)}, ~{_minutes(left)} left)")


def build_order(specs: Sequence[JitSpec]) -> list[JitSpec]:
    """The longest builds first (the short ones fill the last gaps of a parallel build); equal
    weights in registry order."""
    return sorted(specs, key=lambda s: -compile_weight(s.name))


def build_all(specs: Sequence[JitSpec], jobs: int = 4) -> dict[str, float]:
    """Build (or load) every spec, ``jobs`` at a time (:func:`build_order`); returns seconds
    per module.

    Prints one progress line per finished module on stderr: ``[i/N] name: seconds``, the time
    since the start and what is left (:class:`Progress`)."""
    names = [s.name for s in specs]
    shared = sorted({n for n in names if names.count(n) > 1})
    if shared:  # progress and the returned seconds are keyed by name
        raise ValueError(f"specs must have distinct names (variants of one module need names of "
                         f"their own), got several named {shared}")
    seconds: dict[str, float] = {}
    start = time.monotonic()
    progress = Progress(names, jobs)
    print("AOT: ~left = the modules left, each at its measured share of compile time "
          "(flashinfer.aot.COMPILE_WEIGHTS), at the speed of those done, "
          f"{jobs} at a time", file=sys.stderr, flush=True)

    def one(spec: JitSpec) -> tuple[str, float]:
        began = time.monotonic()
        progress.started(spec.name, began - start)
        get_module(spec)
        return spec.name, time.monotonic() - began

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, s) for s in build_order(specs)]
        for fut in as_completed(futures):
            name, secs = fut.result()
            seconds[name] = secs
            print(progress.finished(name, secs, time.monotonic() - start), file=sys.stderr,
                  flush=True)
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

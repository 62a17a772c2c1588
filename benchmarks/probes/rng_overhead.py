"""What the RNG source costs a captured sampling call (128 x 128256 fp32, bench_sampling's
inputs and timer): the generator path (during capture, the generator's graph-safe state read by
the kernel: csrc/torch_rng.cc), the same with that op forced unavailable (the fallback: (seed,
offset) drawn on the device by torch.randint, one more kernel in the graph), int seed/offset,
and seed/offset tensors, next to the generator draw alone and torch's own uniform_ against a
fill_ (what any graph that follows the generator pays at replay).

    python benchmarks/probes/rng_overhead.py OUT.json [--no-pdl]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_sampling  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--no-pdl", action="store_true",
                    help="launch the sampling kernels without Programmatic Dependent Launch")
    a = ap.parse_args()
    import flashinfer
    import flashinfer.sampling

    if a.no_pdl:
        flashinfer.sampling.resolve_pdl = lambda enable_pdl, device: False

    _, probs = bench_sampling._inputs()
    seed_t = torch.tensor([7], dtype=torch.int64, device="cuda")
    off_t = torch.tensor([0], dtype=torch.int64, device="cuda")
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    buf = torch.empty(2, dtype=torch.int64, device="cuda")
    one = torch.empty(1, device="cuda")
    cases = {
        "randint (2,) alone": lambda: torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64,
                                                    device="cuda", generator=gen),
        "random_ (2,) alone": lambda: buf.random_(generator=gen),
        # torch's own draw against a node that draws nothing: a graph that follows the
        # generator pays torch's replay prologue (the graph's seed and offset set) whoever draws.
        "torch uniform_ (1,) alone": lambda: one.uniform_(generator=gen),
        "torch fill_ (1,) alone": lambda: one.fill_(1.0),
    }
    def randint_fallback(fn, *args):
        real = flashinfer.sampling._graph_philox
        flashinfer.sampling._graph_philox = lambda: RuntimeError("forced by the probe")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return fn(probs, *args)
        finally:
            flashinfer.sampling._graph_philox = real

    for op, args in (("sampling_from_probs", ()), ("min_p_sampling_from_probs", (0.1,)),
                     ("top_p_sampling_from_probs", (0.9,)), ("top_k_sampling_from_probs", (50,))):
        fn = getattr(flashinfer, op)
        cases[f"{op} generator"] = lambda fn=fn, args=args: fn(probs, *args)
        cases[f"{op} generator, randint fallback"] = (
            lambda fn=fn, args=args: randint_fallback(fn, *args))
        cases[f"{op} int seed"] = lambda fn=fn, args=args: fn(probs, *args, seed=7, offset=0)
        cases[f"{op} tensor seed"] = lambda fn=fn, args=args: fn(probs, *args, seed=seed_t,
                                                                 offset=off_t)
    # A 1 x 128 row: the kernel's own time is a few us, so what a graph that follows the
    # generator adds at replay (torch's replay prologue for the graph's RNG state) shows.
    tiny = torch.softmax(torch.randn(1, 128, device="cuda"), -1)
    cases["sampling_from_probs 1x128 generator"] = lambda: flashinfer.sampling_from_probs(tiny)
    cases["sampling_from_probs 1x128 int seed"] = lambda: flashinfer.sampling_from_probs(
        tiny, seed=7, offset=0)
    rows = {}
    for name, fn in cases.items():
        us, mode = bench_sampling.time_us(fn)
        rows[name] = round(us, 2)
        print(f"{name:<44} {us:8.2f} us", flush=True)
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "timing": mode,
                                       "cases": rows}, indent=1))


if __name__ == "__main__":
    main()

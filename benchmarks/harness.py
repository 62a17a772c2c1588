"""Benchmark harness: ceilings measured in the same run, then every case, into one JSON record
(the schema of benchmarks/schema.py).

Method (device README's METHOD.md): measure the ceilings first (a large device-to-device copy
counting bytes read + written; a read-only pass over the same size, for ops that mostly read,
such as decode; an 8192³ bf16 matmul), warm up, take the median of many CUDA-event timings,
random inputs only (never zeros), inputs far larger than L2.
"""

from __future__ import annotations

import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import schema
import torch


def _timing_module():
    """This checkout's ``flashinfer.testing``, whichever ``flashinfer`` the process imports.

    A peer comparison runs FlashInfer 0.7.2 in its own process, whose ``flashinfer.testing`` is
    other code (no CUPTI timer; its cold-L2 flush skips closures, so the peer's cases ran with a
    warm L2 in records before this), so both sides must be timed by the same code: ours, loaded
    by path when the importable package's copy differs."""
    import importlib.util

    import flashinfer.testing as imported

    ours = Path(__file__).resolve().parents[1] / "packages/flashinfer-python/flashinfer/testing.py"
    if not ours.is_file() or Path(imported.__file__).read_bytes() == ours.read_bytes():
        return imported
    spec = importlib.util.spec_from_file_location("flashinfer_bench_timing", ours)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_timing = _timing_module()
bench_gpu_time, cuda_graph_of, cupti_kernel_times_ms = (
    _timing.bench_gpu_time, _timing.cuda_graph_of, _timing.cupti_kernel_times_ms)


@dataclass
class Case:
    """One timed configuration.

    ``bytes_moved`` is the least traffic the op needs (each input read once, each output
    written once); ``flops`` its arithmetic; ``ceiling`` which ceiling is the case's headline
    (``"copy"``, ``"read"``, ``"matmul"``; default: matmul for flops, copy for bytes);
    ``published_us`` a published figure to compare with (FlashInfer's, same device class),
    ``peer_us`` the peer's time measured in the same call, ``target`` the goal (``"<= 350 us"``).
    """

    name: str
    fn: Callable[[], Any]
    bytes_moved: int = 0
    flops: float = 0.0
    published_us: Optional[float] = None
    peer_us: Optional[float] = None
    target: str = ""
    ceiling: Optional[str] = None
    extra: dict = field(default_factory=dict)
    # None: bandwidth-bound cases (bytes_moved > 0) are timed as CUDA-graph replays, each replay
    # one call after a cold-L2 flush: a CUDA-event timing of a Python call would also measure
    # the host's launch gap whenever the call is shorter than the host's work per call (decode
    # and merges; serving frameworks run these under CUDA graphs). Compute-bound cases (prefill,
    # which plans on the host per call) are timed with CUDA events around the call.
    use_cuda_graph: Optional[bool] = None
    # How the L2 is made cold before each call (flashinfer.testing's cold_l2_cache): "read"
    # leaves clean lines, "write" dirty ones whose write-back the timed call then pays.
    l2_flush: str = "read"


def _median_ms(
    fn: Callable[[], Any], repeat_ms: float = 300.0, use_cuda_graph: bool = False,
    l2_flush: str = "read",
) -> tuple[float, float, float]:
    # One call per graph replay, so every call starts from a cold L2 (several calls per graph
    # would let small inputs stay in L2 between them).
    times = sorted(bench_gpu_time(fn, dry_run_time_ms=50, repeat_time_ms=repeat_ms,
                                  cold_l2_cache=l2_flush, use_cuda_graph=use_cuda_graph,
                                  num_iters_within_graph=1))
    times = [t for t in times if t > 0]
    if not times:
        raise RuntimeError("every timing was zero")
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return statistics.median(times), pick(0.1), pick(0.9)


def time_ms(fn: Callable[[], Any], *, num_iters: int, dry_run_iters: int, use_cuda_graph: bool,
            use_cupti: bool = False, l2_flush: str = "read") -> list[float]:
    """Per-call milliseconds of ``num_iters`` timed calls after ``dry_run_iters`` warm-ups (the
    benchmark CLI's counts; the record's cases use :func:`_median_ms`'s time budgets).
    ``use_cupti``: each call's kernel time from CUPTI (of a one-call graph's replays with
    ``use_cuda_graph``); raises ``flashinfer.testing.CuptiUnavailable`` instead of falling back,
    so the caller knows (and says) which timer it used."""
    if use_cupti:
        call = cuda_graph_of(fn, 1).replay if use_cuda_graph else fn
        times = cupti_kernel_times_ms(call, dry_run_iters=dry_run_iters, repeat_iters=num_iters,
                                      cold_l2_cache=l2_flush)
        return [t for t in times if t > 0]
    times = bench_gpu_time(fn, dry_run_iters=dry_run_iters, repeat_iters=num_iters,
                           cold_l2_cache=l2_flush, use_cuda_graph=use_cuda_graph,
                           num_iters_within_graph=1)
    return [t for t in times if t > 0]


def _copy_ms(n: int) -> float:
    """After a write flush: the copy starts with an L2 full of dirty lines and leaves its own,
    the steady state of a stream of copies (and the ceiling's definition in earlier records)."""
    src = torch.randint(0, 127, (n,), dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    return _median_ms(lambda: dst.copy_(src), l2_flush="write")[0]


# Reads n bytes once (16-byte loads, four in flight per thread, a grid-stride loop over a
# full-occupancy grid) and writes nothing unless the XOR of all words hits one value: the
# read-only bandwidth that a read-mostly kernel (decode) can hope for.
# read_once_l2_256 is the same with an L2 prefetch-size hint on every load (L2 fetches the
# aligned 256 bytes around the address from DRAM at once), a second estimate of the ceiling.
_READ_SRC = r"""
template <bool kHint>
__device__ __forceinline__ int4 load16(const int4* p) {
  if (!kHint) return *p;
  int4 v;
  asm volatile("ld.global.nc.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <bool kHint>
__device__ void read_body(const int4* __restrict__ x, long long n, unsigned* out) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const int4 a = load16<kHint>(x + i), b = load16<kHint>(x + i + stride),
               c = load16<kHint>(x + i + 2 * stride), d = load16<kHint>(x + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
           d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const int4 a = load16<kHint>(x + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}

extern "C" __global__ void read_once(const int4* __restrict__ x, long long n, unsigned* out) {
  read_body<false>(x, n, out);
}

extern "C" __global__ void read_once_l2_256(const int4* __restrict__ x, long long n,
                                            unsigned* out) {
  read_body<true>(x, n, out);
}
"""


def _read_ms(n: int, name: str = "read_once") -> tuple[float, str]:
    """Milliseconds to read n bytes once, and how: kernel `name` above through CuPy (NVRTC),
    or, where CuPy is missing or fails (the reason is recorded), a torch sum (a reduction
    kernel, usually a little slower)."""
    src = torch.randint(-128, 127, (n,), dtype=torch.int8, device="cuda")
    try:  # only CuPy's part: a failure of the timing itself must not turn into the fallback
        import cupy

        kernel = cupy.RawKernel(_READ_SRC, name)
        x, out = cupy.from_dlpack(src), cupy.zeros(1, dtype=cupy.uint32)
        p = torch.cuda.get_device_properties(0)
        grid, block = p.multi_processor_count * (2048 // 256), 256

        def run():  # on torch's current stream, where the timing events are recorded
            stream = torch.cuda.current_stream().cuda_stream
            with cupy.cuda.ExternalStream(stream) if stream else cupy.cuda.Stream.null:
                kernel((grid,), (block,), (x, cupy.int64(n // 16), out))

        run()
        torch.cuda.synchronize()
    except Exception as err:  # recorded in the result, never hidden
        words = src.view(torch.int32)
        why = f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
        return _median_ms(lambda: words.sum(dtype=torch.int64))[0], f"torch.sum ({why})"
    return _median_ms(run)[0], "16-byte loads kernel (cupy)"


def measure_ceilings() -> dict:
    """Copy bandwidth (GB/s, read+write), read-only bandwidth (GB/s) and bf16 matmul rate
    (TFLOP/s) on this device."""
    n = 1 << 30  # 1 GiB each way, 20x the H100's L2
    copy_ms = _copy_ms(n)
    read_ms, read_method = _read_ms(n)
    hint_ms, hint_method = _read_ms(n, "read_once_l2_256")
    m = 8192
    a = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    mm_ms, _, _ = _median_ms(lambda: a @ b)
    return {
        "copy_GBps": 2 * n / (copy_ms * 1e-3) / 1e9,
        "copy_bytes": 2 * n,
        "read_GBps": n / (read_ms * 1e-3) / 1e9,
        "read_bytes": n,
        "read_method": read_method,
        # the same read with an L2::256B prefetch hint per load (recorded beside, not used
        # for the % columns)
        "read_l2_256_GBps": n / (hint_ms * 1e-3) / 1e9,
        "read_l2_256_method": hint_method,
        "bf16_matmul_TFLOPs": 2 * m**3 / (mm_ms * 1e-3) / 1e12,
        "matmul_shape": [m, m, m],
    }


def run_cases(cases: list[Case], ceilings: dict, group: str) -> list[dict]:
    """Time every case; rows in the schema's case form (benchmarks/schema.py), `group` the op."""
    rows = []
    for case in cases:
        graph = case.use_cuda_graph
        if graph is None:
            graph = case.bytes_moved > 0
        timing = "cuda graph replay (1 call per replay, cold L2)" if graph else "cuda events"
        try:
            med, p10, p90 = _median_ms(case.fn, use_cuda_graph=graph, l2_flush=case.l2_flush)
        except RuntimeError as err:  # an op that cannot be captured: time the call itself
            if not graph:
                raise
            timing = f"cuda events (graph capture failed: {str(err).splitlines()[0][:120]})"
            med, p10, p90 = _median_ms(case.fn, use_cuda_graph=False, l2_flush=case.l2_flush)
        timing += f", {case.l2_flush} flush"
        row: dict[str, Any] = {
            "name": case.name,
            "group": group,
            "timing": timing,
            "median_us": round(med * 1e3, 2),
            "p10_us": round(p10 * 1e3, 2),
            "p90_us": round(p90 * 1e3, 2),
        }
        if case.bytes_moved:
            gbps = case.bytes_moved / (med * 1e-3) / 1e9
            row.update(bytes=case.bytes_moved, GBps=round(gbps, 1),
                       pct_of_copy=round(100 * gbps / ceilings["copy_GBps"], 1))
            if "read_GBps" in ceilings:  # the ceiling of read-mostly ops (decode)
                row["pct_of_read"] = round(100 * gbps / ceilings["read_GBps"], 1)
        if case.flops:
            tflops = case.flops / (med * 1e-3) / 1e12
            row.update(flops=case.flops, TFLOPs=round(tflops, 1),
                       pct_of_matmul=round(100 * tflops / ceilings["bf16_matmul_TFLOPs"], 1))
        if case.published_us:
            row.update(published_us=case.published_us,
                       speedup_vs_published=round(case.published_us / (med * 1e3), 3))
        if case.peer_us:
            row.update(peer_us=case.peer_us,
                       speedup_vs_peer=round(case.peer_us / (med * 1e3), 3))
        if case.target:
            row["target"] = case.target
        ceiling = case.ceiling or ("matmul" if case.flops else "copy" if case.bytes_moved else None)
        if f"pct_of_{ceiling}" not in row:  # no such ceiling measured
            ceiling = None
        if ceiling:
            row["ceiling"] = ceiling
        if case.extra:
            row["extra"] = dict(case.extra)
        rows.append(row)
        share = f"{row[f'pct_of_{ceiling}']:>6}% of {ceiling}" if ceiling else ""
        print(f"{case.name:<58} {row['median_us']:>10.1f} us  {share}", flush=True)
        torch.cuda.empty_cache()
    return rows


def device_info() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {
        "name": p.name,
        "sm_count": p.multi_processor_count,
        "capability": f"{p.major}.{p.minor}",
        "memory_GiB": round(p.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def git_commit() -> Optional[str]:
    """The checkout's short commit, or None where there is no git (a copy without .git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parent, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def record(kind: str, topic: str, *, commit: Optional[str] = None, **fields: Any) -> dict:
    """A results record of this device (benchmarks/schema.py: `schema.record`); `commit`
    defaults to the checkout's, where git knows it."""
    return schema.record(kind, topic, device_info(), commit=commit or git_commit(), **fields)


def write(path: Path, rec: dict) -> None:
    """Validate and write one record (benchmarks/schema.py)."""
    schema.write(path, rec)

"""Benchmark and test helpers (``flashinfer.testing``).

:func:`bench_gpu_time` times a callable on the GPU and returns per-iteration milliseconds. Timing
follows the usual discipline: warm-up first (module loads, allocator growth stay out of the
numbers), many repetitions, optionally a cold L2 before each one (``cold_l2_cache``), CUDA events
around the work (or around a CUDA graph of several iterations, for launch-bound ops).
"""

from __future__ import annotations

import math
import random
import time
import warnings
from typing import Any, Callable, List, Optional, Sequence, Union

import torch


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def _l2_flusher(device: torch.device, cold_l2_cache: Union[bool, str]) -> Optional[Callable[[], None]]:
    """How a cold L2 is made before each timed call (``cold_l2_cache``). ``True`` or ``"read"``:
    one read pass over twice the L2 size, so the L2 holds only clean, unrelated lines, as after
    a predecessor whose results were written back. ``"write"``: zero twice the L2 size (Triton's
    do_bench does this); the L2 is then full of dirty lines whose write-back (up to the L2 size,
    ~50 MB or ~17 us on an H100) lands inside the timed call; benchmarks/notes/l2-flush.md
    compares the two. ``False``: none."""
    if cold_l2_cache is False:
        return None
    mode = "read" if cold_l2_cache is True else cold_l2_cache
    if mode not in ("read", "write"):
        raise ValueError(f"cold_l2_cache must be True, False, 'read' or 'write', got {cold_l2_cache!r}")
    size = torch.cuda.get_device_properties(device).L2_cache_size
    buf = torch.zeros(max(2 * size, 1 << 20) // 8, dtype=torch.int64, device=device)
    if mode == "write":
        return lambda: buf.zero_()
    return lambda: buf.sum()


def cuda_graph_of(fn: Callable[[], Any], calls: int = 1) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` calls of ``fn``, captured after three warm-up calls on a side
    stream (allocator growth and lazy loading stay out of the graph)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    return graph


def _iterations(fn: Callable[[], Any], time_ms: float, iters: Optional[int]) -> int:
    if iters is not None:
        return max(1, iters)
    # estimate from a few calls
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per_call_ms = max((time.perf_counter() - start) * 1e3 / 3, 1e-3)
    return max(1, min(10_000, int(math.ceil(time_ms / per_call_ms))))


def bench_gpu_time_with_cuda_event(
    fn: Callable[[], Any],
    dry_run_iters: Optional[int] = None,
    repeat_iters: Optional[int] = None,
    dry_run_time_ms: float = 25,
    repeat_time_ms: float = 100,
    cold_l2_cache: Union[bool, str] = True,
    sleep_after_run: bool = False,
) -> List[float]:
    """Per-iteration milliseconds, each iteration between two CUDA events."""
    flush = _l2_flusher(torch.device("cuda", torch.cuda.current_device()), cold_l2_cache)
    for _ in range(_iterations(fn, dry_run_time_ms, dry_run_iters)):
        fn()
    n = _iterations(fn, repeat_time_ms, repeat_iters)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    torch.cuda.synchronize()
    for i in range(n):
        if flush is not None:
            flush()
        starts[i].record()
        fn()
        ends[i].record()
        if sleep_after_run:
            torch.cuda.synchronize()
            time.sleep(0.001)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def bench_gpu_time_with_cudagraph(
    fn: Callable[[], Any],
    dry_run_iters: Optional[int] = None,
    repeat_iters: Optional[int] = None,
    dry_run_time_ms: float = 25,
    repeat_time_ms: float = 100,
    num_iters_within_graph: int = 10,
    cold_l2_cache: Union[bool, str] = True,
) -> List[float]:
    """Per-iteration milliseconds from replays of a graph holding ``num_iters_within_graph``
    calls (launch gaps shrink, so small ops are measured, not the launcher)."""
    graph = cuda_graph_of(fn, num_iters_within_graph)
    times = bench_gpu_time_with_cuda_event(
        graph.replay, dry_run_iters, repeat_iters, dry_run_time_ms, repeat_time_ms, cold_l2_cache
    )
    return [t / num_iters_within_graph for t in times]


def bench_gpu_time_with_cupti(*args: Any, **kwargs: Any) -> List[float]:
    """CUPTI timing is not available in this build; falls back to CUDA events with a warning."""
    warnings.warn("CUPTI timing is not available; using CUDA events", stacklevel=2)
    return bench_gpu_time_with_cuda_event(*args, **kwargs)


def bench_gpu_time(
    fn: Callable,
    dry_run_iters: Optional[int] = None,
    repeat_iters: Optional[int] = None,
    dry_run_time_ms: float = 25,
    repeat_time_ms: float = 100,
    l2_flush: Optional[bool] = None,
    l2_flush_size_mb: Optional[int] = None,
    l2_flush_device: Optional[str] = None,
    sleep_after_run: bool = False,
    enable_cupti: bool = False,
    use_cuda_graph: bool = False,
    num_iters_within_graph: int = 10,
    input_args: Sequence[Any] = (),
    input_kwargs: Optional[dict] = None,
    cold_l2_cache: Union[bool, str] = True,
    aggregate_op: Callable = max,
) -> List[float]:
    """Time ``fn(*input_args, **input_kwargs)`` on the GPU; per-iteration **milliseconds**.

    CUPTI (``enable_cupti``) > CUDA graph (``use_cuda_graph``) > CUDA events. ``l2_flush*`` are
    deprecated aliases of ``cold_l2_cache``. ``aggregate_op`` is accepted for compatibility.

    Examples
    --------
    >>> times = bench_gpu_time(lambda: x.mul_(1.0))
    >>> median_ms = sorted(times)[len(times) // 2]
    """
    if l2_flush is not None or l2_flush_size_mb is not None or l2_flush_device is not None:
        warnings.warn("l2_flush* are deprecated; use cold_l2_cache", DeprecationWarning, 2)
        if l2_flush is not None:
            cold_l2_cache = l2_flush
    kwargs = input_kwargs or {}
    call = (lambda: fn(*input_args, **kwargs)) if (input_args or kwargs) else fn
    if enable_cupti:
        return bench_gpu_time_with_cupti(
            call, dry_run_iters, repeat_iters, dry_run_time_ms, repeat_time_ms, cold_l2_cache
        )
    if use_cuda_graph:
        return bench_gpu_time_with_cudagraph(
            call, dry_run_iters, repeat_iters, dry_run_time_ms, repeat_time_ms,
            num_iters_within_graph, cold_l2_cache,
        )
    return bench_gpu_time_with_cuda_event(
        call, dry_run_iters, repeat_iters, dry_run_time_ms, repeat_time_ms, cold_l2_cache,
        sleep_after_run,
    )


def attention_flops(
    batch_size: int, qo_seqlen: int, kv_seqlen: int, head_dim_qk: int, head_dim_vo: int,
    num_qo_heads: int, causal: bool,
) -> float:
    """FLOPs of attention: 2·Sq·Skv·H·(Dqk + Dvo) per batch, half of it when causal."""
    if causal and qo_seqlen > kv_seqlen:
        raise ValueError(f"causal needs qo_seqlen <= kv_seqlen, got {qo_seqlen} > {kv_seqlen}")
    pairs = qo_seqlen * kv_seqlen
    if causal:
        pairs = qo_seqlen * (kv_seqlen - qo_seqlen) + qo_seqlen * (qo_seqlen + 1) // 2
    return 2.0 * batch_size * num_qo_heads * pairs * (head_dim_qk + head_dim_vo)


def attention_tflops_per_sec(
    batch_size: int, qo_seqlen: int, kv_seqlen: int, head_dim_qk: int, head_dim_vo: int,
    num_qo_heads: int, causal: bool, time_ms: float,
) -> float:
    flops = attention_flops(batch_size, qo_seqlen, kv_seqlen, head_dim_qk, head_dim_vo,
                            num_qo_heads, causal)
    return flops / (time_ms * 1e-3) / 1e12


def attention_tb_per_sec(
    batch_size: int, qo_seqlen: int, kv_seqlen: int, head_dim_qk: int, head_dim_vo: int,
    num_qo_heads: int, num_kv_heads: int, time_ms: float, q_dtype=torch.bfloat16,
    kv_dtype=torch.bfloat16, o_dtype=torch.bfloat16,
) -> float:
    q = batch_size * qo_seqlen * num_qo_heads * head_dim_qk * q_dtype.itemsize
    kv = batch_size * kv_seqlen * num_kv_heads * (head_dim_qk + head_dim_vo) * kv_dtype.itemsize
    o = batch_size * qo_seqlen * num_qo_heads * head_dim_vo * o_dtype.itemsize
    return (q + kv + o) / (time_ms * 1e-3) / 1e12

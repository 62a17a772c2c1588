"""Benchmark and test helpers (``flashinfer.testing``).

:func:`bench_gpu_time` times a callable on the GPU and returns per-iteration milliseconds. Timing
follows the usual discipline: warm-up first (module loads, allocator growth stay out of the
numbers), many repetitions, optionally a cold L2 before each one (``cold_l2_cache``), CUDA events
around the work (or around a CUDA graph of several iterations, for launch-bound ops), or, with
``enable_cupti`` and cupti-python installed, the kernels' own durations from CUPTI activity records
(:func:`cupti_kernel_times_ms`).
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


def _warm_up(fn: Callable[[], Any], dry_run_iters: Optional[int], repeat_iters: Optional[int],
             dry_run_time_ms: float, repeat_time_ms: float) -> int:
    """Run the warm-up calls; return how many calls to time."""
    for _ in range(_iterations(fn, dry_run_time_ms, dry_run_iters)):
        fn()
    return _iterations(fn, repeat_time_ms, repeat_iters)


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
    n = _warm_up(fn, dry_run_iters, repeat_iters, dry_run_time_ms, repeat_time_ms)
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


# --------------------------------------------------------------------------------------------
# CUPTI timing (cupti-python, import name ``cupti``)
# --------------------------------------------------------------------------------------------


class CuptiUnavailable(RuntimeError):
    """CUPTI timing cannot run in this process; the message says why and what to install."""


# GPU work whose [start, end) counts towards an iteration's time.
_CUPTI_TIMED_KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET")
# EXTERNAL_CORRELATION maps each launch (its correlation id) to the iteration pushed around it;
# those records come with the API records, so the runtime and driver kinds are on too.
_CUPTI_CORRELATION_KINDS = ("EXTERNAL_CORRELATION", "RUNTIME", "DRIVER")
_CUPTI_FLUSH_FORCED = 1  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: also flush unfinished buffers
_CUPTI: dict = {}  # the process's one registration: module, record sink, next external id


def _release(version: str) -> tuple:
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def cupti_version_note(python_version: Optional[str], library_version: Optional[str]) -> str:
    """What is wrong between cupti-python (``python_version``) and the CUPTI library package
    ``nvidia-cuda-cupti`` (``library_version``; None: not installed), or ``""``.

    cupti-python X.Y declares ``nvidia-cuda-cupti~=X.Y`` and is built against that CUPTI's
    entry points and record layouts: an older libcupti (cupti-python 13.4 on CUDA 13.0's) may
    lack functions it binds (``FunctionNotFoundError`` when one is called) or deliver records
    of an older layout."""
    if not python_version:
        return ""
    need = ".".join(map(str, _release(python_version)))
    if library_version is None:
        return (f"cupti-python {python_version} needs nvidia-cuda-cupti~={need}, which is not "
                "installed (libcupti is then looked up on the loader path)")
    if _release(library_version) < _release(python_version):
        have = ".".join(map(str, _release(library_version)))
        return (f"cupti-python {python_version} is built for libcupti {need} (it requires "
                f"nvidia-cuda-cupti~={need}) but this environment has nvidia-cuda-cupti "
                f"{library_version}: install cupti-python=={have}.* or nvidia-cuda-cupti~={need}")
    return ""


def _installed_cupti_versions() -> tuple:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for dist in ("cupti-python", "nvidia-cuda-cupti"):
        try:
            found.append(version(dist))
        except PackageNotFoundError:
            found.append(None)
    return tuple(found)


def _cupti_failure(what: str, err: BaseException) -> CuptiUnavailable:
    note = cupti_version_note(*_installed_cupti_versions())
    first = str(err).splitlines()[0] if str(err) else ""
    return CuptiUnavailable(f"{what}: {type(err).__name__}: {first}" + (f" ({note})" if note
                                                                        else ""))


def _cupti_call(what: str, f: Callable, *args: Any) -> Any:
    try:
        return f(*args)
    except Exception as err:  # cuptiError, FunctionNotFoundError (a libcupti too old), ...
        raise _cupti_failure(f"CUPTI failed to {what}", err) from err


def _cupti_session() -> dict:
    """Import cupti-python and register the activity-buffer callbacks once per process."""
    if "cupti" in _CUPTI:
        return _CUPTI
    try:
        from cupti import cupti
    except ModuleNotFoundError as err:
        if err.name == "cupti":
            raise CuptiUnavailable("cupti-python is not installed (pip install cupti-python)") \
                from None
        # e.g. elftools (pyelftools), cuda.bindings: installed with --no-deps
        raise _cupti_failure(f"cupti-python failed to load (its dependency {err.name} is "
                             "missing; pip install cupti-python installs them)", err) from err
    except Exception as err:  # e.g. libcupti of another major version, missing cuda.pathfinder
        raise _cupti_failure("cupti-python failed to load", err) from err
    timed = {int(getattr(cupti.ActivityKind, k)) for k in _CUPTI_TIMED_KINDS}
    external = int(cupti.ActivityKind.EXTERNAL_CORRELATION)
    ours = int(cupti.ExternalCorrelationKind.CUSTOM0)
    sink: dict = {"timed": [], "external": {}}

    def buffer_requested():
        return 8 << 20, 0  # bytes per buffer; 0: as many records as fit

    def buffer_completed(activities):
        # Copy the fields out now: the records live in a buffer CUPTI reuses after this returns.
        for a in activities:
            kind = int(a.kind)
            if kind in timed:
                sink["timed"].append((int(a.start), int(a.end), int(a.correlation_id)))
            elif kind == external and int(a.external_kind) == ours:
                sink["external"][int(a.correlation_id)] = int(a.external_id)

    _cupti_call("register its buffer callbacks", cupti.activity_register_callbacks,
                buffer_requested, buffer_completed)
    _CUPTI.update(cupti=cupti, sink=sink, next_id=1, custom=cupti.ExternalCorrelationKind.CUSTOM0)
    return _CUPTI


def busy_ns(intervals: Sequence[tuple]) -> int:
    """Length of the union of ``[start, end)`` intervals: the time the GPU spent on them, with
    idle gaps left out and overlapping (concurrent, PDL) work counted once."""
    total, cur_start, cur_end = 0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def cupti_iteration_times_ms(records: Sequence[tuple], external_ids: dict,
                             iteration_ids: Sequence[int]) -> List[float]:
    """Per-iteration milliseconds from CUPTI activity records.

    ``records``: ``(start_ns, end_ns, correlation_id)`` of each kernel / memcpy / memset;
    ``external_ids``: correlation id -> the external id pushed around its launch;
    ``iteration_ids``: the external id of each timed iteration, in order. An iteration's time is
    :func:`busy_ns` of its records (kernel time, launch gaps excluded). Records of other
    launches (the L2 flush between iterations, other threads) are ignored. Raises
    :class:`CuptiUnavailable` where an iteration has no records or a record is malformed."""
    index = {ext: i for i, ext in enumerate(iteration_ids)}
    per_iteration: List[list] = [[] for _ in iteration_ids]
    for start, end, correlation in records:
        i = index.get(external_ids.get(correlation))
        if i is None:
            continue
        if not 0 < start <= end:
            raise CuptiUnavailable(f"a CUPTI record has start {start}, end {end}: the records' "
                                   "layout does not match this libcupti")
        per_iteration[i].append((start, end))
    empty = [i for i, found in enumerate(per_iteration) if not found]
    if empty:
        raise CuptiUnavailable(
            f"no CUPTI kernel records for {len(empty)} of {len(per_iteration)} iterations "
            f"({len(records)} kernel records, {len(external_ids)} external correlations)")
    return [busy_ns(found) / 1e6 for found in per_iteration]


def cupti_kernel_times_ms(
    fn: Callable[[], Any],
    dry_run_iters: Optional[int] = None,
    repeat_iters: Optional[int] = None,
    dry_run_time_ms: float = 25,
    repeat_time_ms: float = 100,
    cold_l2_cache: Union[bool, str] = True,
) -> List[float]:
    """Per-iteration milliseconds of the GPU work ``fn`` launches, from CUPTI activity records
    (kernels, memcpys and memsets; :func:`cupti_iteration_times_ms`), the L2 made cold before
    each iteration (the flush is not counted). Launch overhead and host gaps between an
    iteration's kernels are not in the time, unlike CUDA events around the call.

    Raises :class:`CuptiUnavailable` (never falls back) where cupti-python is missing or CUPTI
    fails; errors of ``fn`` itself propagate."""
    state = _cupti_session()
    cupti, sink, custom = state["cupti"], state["sink"], state["custom"]
    flush = None if cold_l2_cache is False else _l2_flusher(
        torch.device("cuda", torch.cuda.current_device()), cold_l2_cache)
    n = _warm_up(fn, dry_run_iters, repeat_iters, dry_run_time_ms, repeat_time_ms)
    first = state["next_id"]
    state["next_id"] += n
    kinds = [getattr(cupti.ActivityKind, k) for k in _CUPTI_TIMED_KINDS + _CUPTI_CORRELATION_KINDS]
    torch.cuda.synchronize()
    _cupti_call("flush", cupti.activity_flush_all, _CUPTI_FLUSH_FORCED)  # an earlier caller's
    sink["timed"].clear()
    sink["external"].clear()
    enabled = []
    try:
        for kind in kinds:
            _cupti_call("enable activity records", cupti.activity_enable, kind)
            enabled.append(kind)
        for i in range(n):
            if flush is not None:
                flush()
            _cupti_call("push a correlation id", cupti.activity_push_external_correlation_id,
                        custom, first + i)
            try:
                fn()
            finally:
                _cupti_call("pop a correlation id", cupti.activity_pop_external_correlation_id,
                            custom)
        torch.cuda.synchronize()
        _cupti_call("flush", cupti.activity_flush_all, _CUPTI_FLUSH_FORCED)
    finally:
        for kind in enabled:
            cupti.activity_disable(kind)
    records, external = list(sink["timed"]), dict(sink["external"])
    sink["timed"].clear()
    sink["external"].clear()
    return cupti_iteration_times_ms(records, external, range(first, first + n))


_CUPTI_PROBE: dict = {}


def cupti_unavailable_reason() -> Optional[str]:
    """None where CUPTI timing works in this process, else why not (checked once: cupti-python
    imported, its callbacks registered, and a probe kernel timed with a plausible result)."""
    if "reason" not in _CUPTI_PROBE:
        try:
            x = torch.rand(1 << 22, device="cuda")
            times = cupti_kernel_times_ms(lambda: x.mul_(1.0001), dry_run_iters=2,
                                          repeat_iters=5, cold_l2_cache=False)
            events = bench_gpu_time_with_cuda_event(lambda: x.mul_(1.0001), dry_run_iters=2,
                                                    repeat_iters=5, cold_l2_cache=False)
            # Kernel time can be below the events' (no launch overhead), never far above.
            bound = 10 * sorted(events)[len(events) // 2] + 1.0
            if not all(0 < t < bound for t in times):
                raise CuptiUnavailable(f"CUPTI timed a probe kernel at {times} ms (CUDA events: "
                                       f"{events} ms): its records are not plausible")
            _CUPTI_PROBE["reason"] = None
        except CuptiUnavailable as err:
            note = cupti_version_note(*_installed_cupti_versions())
            _CUPTI_PROBE["reason"] = str(err) + (f" ({note})" if note and note not in str(err)
                                                 else "")
    return _CUPTI_PROBE["reason"]


def bench_gpu_time_with_cupti(
    fn: Callable[[], Any],
    dry_run_iters: Optional[int] = None,
    repeat_iters: Optional[int] = None,
    dry_run_time_ms: float = 25,
    repeat_time_ms: float = 100,
    cold_l2_cache: Union[bool, str] = True,
    use_cuda_graph: bool = False,
    num_iters_within_graph: int = 10,
) -> List[float]:
    """Per-iteration milliseconds of GPU work from CUPTI (:func:`cupti_kernel_times_ms`; with
    ``use_cuda_graph``, of replays of a graph of ``num_iters_within_graph`` calls, per call).
    Where CUPTI cannot run: one warning saying why, then CUDA events (graph replays with
    ``use_cuda_graph``)."""
    calls = num_iters_within_graph if use_cuda_graph else 1
    timed = cuda_graph_of(fn, calls).replay if use_cuda_graph else fn
    try:
        times = cupti_kernel_times_ms(timed, dry_run_iters, repeat_iters, dry_run_time_ms,
                                      repeat_time_ms, cold_l2_cache)
    except CuptiUnavailable as err:
        warnings.warn(f"CUPTI timing is not available ({err}); using CUDA events", stacklevel=2)
        times = bench_gpu_time_with_cuda_event(timed, dry_run_iters, repeat_iters,
                                               dry_run_time_ms, repeat_time_ms, cold_l2_cache)
    return [t / calls for t in times]


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
            call, dry_run_iters, repeat_iters, dry_run_time_ms, repeat_time_ms, cold_l2_cache,
            use_cuda_graph, num_iters_within_graph,
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

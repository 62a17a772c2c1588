"""Host time per call of the attention run paths (what an eager, non-graph caller pays per layer).

    python benchmarks/host_cost.py OUT.json

Each row calls one function back to back ``N`` times after a warm-up and a synchronize, and
divides the host wall time by ``N``; the GPU work per call is kept far shorter than the host
work (decode of one request of 1024 keys), so the queue never fills and the figure is the
host's. The GPU time of the same call (CUDA events) is beside it. ``plan`` is timed too (once
per batch). A cProfile of the wrapper's ``run`` lists where its host time goes.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import time

import torch

import flashinfer
from flashinfer import attention_runtime as rt

HQ, HKV, D, PAGE, DT = 32, 8, 128, 16, torch.bfloat16
N = 3000


def _host_us(fn) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    host = (time.perf_counter() - t0) / N * 1e6
    torch.cuda.synchronize()
    return host


def _gpu_us(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(200):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 200 * 1e3


def _decode_wrapper(batch: int, kv_len: int):
    pages = -(-kv_len // PAGE)
    cache = torch.randn(batch * pages, 2, PAGE, HKV, D, dtype=DT, device="cuda")
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    indices = torch.arange(batch * pages, dtype=torch.int32)
    last = torch.full((batch,), kv_len - (pages - 1) * PAGE, dtype=torch.int32)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=DT)
    q = torch.randn(batch, HQ, D, dtype=DT, device="cuda")
    return w, q, cache


def main() -> int:
    out_path = sys.argv[1]
    rows = {}
    w, q, cache = _decode_wrapper(1, 1024)
    out = torch.empty_like(q)
    small = torch.randn(128, device="cuda")
    calls = {
        "torch.add (one small kernel, reference)": lambda: torch.add(small, small),
        "decode wrapper.run(q, cache, out=out)": lambda: w.run(q, cache, out=out),
        "decode wrapper.run(q, cache)": lambda: w.run(q, cache),
        "decode wrapper.run(q, cache, return_lse=True)": lambda: w.run(q, cache, return_lse=True),
    }
    # The module call alone, with every argument resolved once (the binding and the launch).
    k, v = cache[:, 0], cache[:, 1]
    module = rt.get_attention_module(w._variant)
    plan = w._plan
    o_part, lse_part = w._ws.partial_views(HQ, D)
    counters = w._ws.counters[: plan.item_capacity * HKV] if plan.split_kv else None
    args = (plan.cta, plan.grid_x, q, k, v, out, None, 0, w._qo_indptr, w._kv_indptr,
            w._kv_indices, w._kv_last_page_len, w._plan_dev, plan.item_capacity, plan.split_kv,
            plan.cluster_merge,
            o_part if plan.split_kv else None, lse_part if plan.split_kv else None,
            plan.num_rows, counters, None, None, None, D ** -0.5, 0.0, 1.0, 1.0, 1e4, -1, False)
    calls["module.run (binding and launch only)"] = lambda: module.run(*args)
    for name, fn in calls.items():
        rows[name] = {"host_us": round(_host_us(fn), 2), "gpu_us": round(_gpu_us(fn), 2)}
        print(f"{name:50s} host {rows[name]['host_us']:7.2f} us  gpu {rows[name]['gpu_us']:7.2f} us")

    # plan() once per batch (per decode step): host metadata in, the plan scheduled and
    # uploaded; host tensors, as serving frameworks pass them.
    for batch, kv_len in ((1, 32768), (64, 4096), (512, 1000)):
        pw, _, _ = _decode_wrapper(batch, kv_len)
        pages = -(-kv_len // PAGE)
        args = (torch.arange(batch + 1, dtype=torch.int32) * pages,
                torch.arange(batch * pages, dtype=torch.int32),
                torch.full((batch,), kv_len - (pages - 1) * PAGE, dtype=torch.int32),
                HQ, HKV, D, PAGE)
        name = f"decode plan, batch {batch} x kv {kv_len}"
        # Metadata on the host (staged through the pinned mirror in one copy) and, interleaved
        # in the same process, on the device (copied as it is).
        dev_args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
        host_t, dev_t = [], []
        for _ in range(5):
            for which, times in ((args, host_t), (dev_args, dev_t)):
                t0 = time.perf_counter()
                for _ in range(40):
                    pw.plan(*which, q_data_type=DT)
                times.append((time.perf_counter() - t0) / 40 * 1e6)
        # What a serving step pays: plan, then the first run of the plan (which resolves its
        # launch) with out= given.
        q_b = torch.randn(batch, HQ, D, dtype=DT, device="cuda")
        out_b = torch.empty_like(q_b)
        cache_b = torch.randn(batch * pages, 2, PAGE, HKV, D, dtype=DT, device="cuda")
        step_t = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(40):
                pw.plan(*args, q_data_type=DT)
                pw.run(q_b, cache_b, out=out_b)
            step_t.append((time.perf_counter() - t0) / 40 * 1e6)
        rows[name] = {"host_us": round(sorted(host_t)[2], 2),
                      "host_us_device_metadata": round(sorted(dev_t)[2], 2),
                      "host_us_plan_and_first_run": round(sorted(step_t)[2], 2)}
        del cache_b
        print(f"{name:50s} host metadata {rows[name]['host_us']:7.2f} us, device metadata "
              f"{rows[name]['host_us_device_metadata']:7.2f} us")
        # The same plan while the GPU is busy (~20 ms of matmuls queued ahead): a plan that
        # waits for the stream shows it in its host time.
        a = torch.randn(4096, 4096, dtype=DT, device="cuda")
        torch.cuda.synchronize()
        for _ in range(100):
            a @ a
        t0 = time.perf_counter()
        pw.plan(*args, q_data_type=DT)
        busy = (time.perf_counter() - t0) * 1e6
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        rows[name].update(host_us_gpu_busy=round(busy, 2),
                          gpu_left_after_plan_us=round((time.perf_counter() - t0) * 1e6, 1))
        print(f"{name:50s} host {rows[name]['host_us']:7.2f} us, with the GPU busy "
              f"{busy:9.1f} us (GPU still busy {rows[name]['gpu_left_after_plan_us']} us after)")

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(N):
        w.run(q, cache, out=out)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue()[:6000])
    prof = cProfile.Profile()  # plan of the last (batch 512) case
    prof.enable()
    for _ in range(100):
        pw.plan(*args, q_data_type=DT)
    prof.disable()
    plan_text = io.StringIO()
    pstats.Stats(prof, stream=plan_text).sort_stats("tottime").print_stats(25)
    print(plan_text.getvalue()[:6000])
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "plan": {"cta": plan.cta, "split_kv": plan.split_kv, "items": plan.num_items},
              "calls": N, "rows": rows, "profile_tottime": text.getvalue(),
              "plan_profile_tottime": plan_text.getvalue()}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

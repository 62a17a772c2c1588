"""Where a decode kernel's time goes, CTA by CTA: the attention module built with the trace
probe (FLASHINFER_ATTENTION_PROBE_TRACE, include/flashinfer/attention/common.cuh), whose thread
0 of every CTA stamps %globaltimer at entry, Q landed, first K tile, last tile, all key streams
done, stores issued, merge count known and exit. Each case runs as the decode rows do (one-call
CUDA-graph replays after the read-pass L2 flush); after every replay the stamps are read back,
and per event the earliest, median and latest CTA (microseconds after the first CTA's entry)
are reported as medians over the replays, with the events of the CTA that ends last (the
critical path) and the replay's event-timed duration. GPU only.

    python benchmarks/probes/trace_decode.py OUT.json [VARIANT ...]

Variants are keys of tune_attention.VARIANTS, traced with the probe added (default: "default").
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuning"))  # tune_attention

import bench_attention as ba  # noqa: E402
import torch  # noqa: E402
import tune_attention as ta  # noqa: E402

import flashinfer.attention.runtime as rt  # noqa: E402
import harness  # noqa: E402
from flashinfer import aot, testing  # noqa: E402
from flashinfer.jit.core import get_module  # noqa: E402

EVENTS = ["entry", "q", "first_k", "loop_done", "streams_done", "written", "counted", "end"]
SLOTS, CTAS = len(EVENTS) + 1, 4096  # + the SM id; kTraceSlots, kTraceCtas
REPLAYS = 40
CASES = [  # (batch, kv_len, fixed split or None)
    (1, 32768, None),
    (1, 32768, 1024),
    (1, 131072, None),
    (64, 4096, None),
]


def trace_case(module, batch: int, kv_len: int, split) -> dict:
    case = ba._decode(batch, kv_len, True, None, "", split)
    graph = testing.cuda_graph_of(case.fn)
    flush = testing._l2_flusher(torch.device("cuda"), "read")
    stamps = torch.zeros(CTAS, SLOTS, dtype=torch.int64, device="cuda")
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_replay: dict[str, list[float]] = {}
    resolution = None
    for i in range(REPLAYS + 3):
        flush()
        start.record()
        graph.replay()
        stop.record()
        torch.cuda.synchronize()
        module.trace_copy(stamps)
        torch.cuda.synchronize()
        if i < 3:
            continue
        s = stamps.cpu()
        # This replay's CTAs: entered within 1 ms of the latest entry (a slot keeps the stamps
        # of the last replay that ran its CTA; earlier events of this replay are all later).
        ran = s[:, 0] >= s[:, 0].max() - 1_000_000
        t = s[ran].double()
        t0 = t[:, 0].min()
        rows = {"event_timed_us": start.elapsed_time(stop) * 1e3, "ctas": float(ran.sum())}
        for e, name in enumerate(EVENTS):
            col = t[:, e]
            col = col[col >= t0]
            if col.numel() == 0:
                continue
            rel = (col - t0) / 1e3
            rows[f"{name} first"] = rel.min().item()
            rows[f"{name} median"] = rel.median().item()
            rows[f"{name} last"] = rel.max().item()
        # The CTA that ends last: its own events (the kernel's critical path).
        last = t[:, EVENTS.index("end")].argmax()
        for e, name in enumerate(EVENTS):
            if t[last, e] >= t0:
                rows[f"{name} critical"] = ((t[last, e] - t0) / 1e3).item()
        rows["sms"] = float(len(set(s[ran, SLOTS - 1].tolist())))
        for key, value in rows.items():
            per_replay.setdefault(key, []).append(value)
        flat = torch.unique(t[:, :len(EVENTS)].flatten())
        steps = (flat[1:] - flat[:-1])
        steps = steps[steps > 0]
        if steps.numel():
            resolution = min(resolution or 1e9, steps.min().item())
    out = {k: round(statistics.median(v), 2) for k, v in per_replay.items()}
    out.update(split=case.extra["split"], items=case.extra["items"], cta=case.extra["cta"],
               timer_step_ns=resolution)
    return out


def main() -> int:
    out_path = Path(sys.argv[1])
    names = sys.argv[2:] or ["default"]
    unknown = sorted(set(names) - set(ta.VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(ta.VARIANTS)}")
    decode = ta.MODULES[0]
    built = {}
    for n in names:
        spec = ta.specs(ta.VARIANTS[n])[decode]
        built[n] = dataclasses.replace(spec, extra_cuda_cflags=spec.extra_cuda_cflags
                                       + ("-DFLASHINFER_ATTENTION_PROBE_TRACE=1",))
    aot.build_all(list(built.values()), jobs=16)
    result = {"replays": REPLAYS, "events": EVENTS, "variants": {}}
    for name in names:
        module = get_module(built[name])
        rt.set_module_source(lambda v, module=module: module)
        rows = result["variants"][name] = {}
        for batch, kv_len, split in CASES:
            label = f"{batch} x {kv_len}" + (f", chunk {split}" if split else "")
            rows[label] = r = trace_case(module, batch, kv_len, split)
            print(f"== {name}: {label} (cta {r['cta']}, {r['items']} items, split {r['split']}, "
                  f"{r['ctas']:.0f} CTAs on {r['sms']:.0f} SMs, timer step {r['timer_step_ns']} ns)"
                  f"\n   event-timed {r['event_timed_us']:.2f} us", flush=True)
            for e in EVENTS:
                if f"{e} first" in r:
                    crit = r.get(f"{e} critical")
                    print(f"   {e:13s} first {r[f'{e} first']:7.2f}  median {r[f'{e} median']:7.2f}"
                          f"  last {r[f'{e} last']:7.2f}  critical CTA "
                          f"{'-' if crit is None else f'{crit:7.2f}'} us", flush=True)
            harness.write(out_path, harness.record("probe", "trace-decode", **result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

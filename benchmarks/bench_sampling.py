"""flashinfer.sampling at serving sizes (issue 19's table), ours and the peer's with one timer.

Two ways to run:

* ``benchmarks/run.py --ops sampling``: our ops through the harness (ceilings, graph replays,
  cold L2) into the usual JSON.
* ``python benchmarks/bench_sampling.py --standalone OUT.json``: every case timed with the timer
  below (one call per CUDA-graph replay after an L2 flush, median of 60) under whichever
  ``flashinfer`` is first on ``PYTHONPATH``. Run it once for ours and once for the peer
  (FlashInfer 0.7.2: a separate process, both packages are ``flashinfer``), then
  ``--merge OURS.json PEER.json RUN.json`` adds the peer's time and the ratio to run.py's rows.
  ``--warm`` calls each op once (the peer JIT-compiles its sampling module on first use).

bytes_moved: the input read once (and the output written once for the (B, V) transforms);
chain speculative sampling reads one target and one draft row per request (at most).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

B, V = 128, 128256
COPY = "copy-bandwidth ceiling"


def _inputs(b=B, v=V):
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(b, v, device="cuda", generator=g) * 2
    return logits, torch.softmax(logits, -1)


def specs():
    """(name, make() -> fn, bytes_moved, target) for every case; make() builds the inputs."""
    import flashinfer

    def probs_case(op, *args, b=B, **kw):
        def make():
            _, probs = _inputs(b)
            return lambda: getattr(flashinfer, op)(probs, *args, **kw)
        return make

    def logits_case(op, *args, **kw):
        def make():
            logits, _ = _inputs()
            return lambda: getattr(flashinfer, op)(logits, *args, **kw)
        return make

    def chain():
        b, n = 64, 4
        g = torch.Generator(device="cuda").manual_seed(1)
        target = torch.softmax(torch.randn(b, n + 1, V, device="cuda", generator=g), -1)
        draft = torch.softmax(torch.randn(b, n, V, device="cuda", generator=g), -1)
        ids = torch.randint(0, V, (b, n), device="cuda", generator=g, dtype=torch.int32)
        return lambda: flashinfer.chain_speculative_sampling(draft, ids, target)

    def copy():
        logits, _ = _inputs()
        out = torch.empty_like(logits)
        return lambda: out.copy_(logits)

    read = B * V * 4
    return [
        ("copy 128x128256 fp32 (torch; the transforms' floor)", copy, 2 * read, ""),
        ("top_p_sampling_from_probs 128x128256 fp32 p=0.9",
         probs_case("top_p_sampling_from_probs", 0.9), read, "<= 0.5x FlashInfer (~41 us)"),
        ("top_k_sampling_from_probs 128x128256 fp32 k=50",
         probs_case("top_k_sampling_from_probs", 50), read, "<= 0.3x FlashInfer"),
        ("min_p_sampling_from_probs 128x128256 fp32 min_p=0.1",
         probs_case("min_p_sampling_from_probs", 0.1), read, "<= 0.5x FlashInfer"),
        ("top_k_top_p_sampling_from_logits 128x128256 fp32 k=50 p=0.9 joint",
         logits_case("top_k_top_p_sampling_from_logits", 50, 0.9, filter_apply_order="joint"),
         read, "<= 0.3x FlashInfer"),
        ("top_k_top_p_sampling_from_probs 128x128256 fp32 k=50 p=0.9 joint",
         probs_case("top_k_top_p_sampling_from_probs", 50, 0.9, filter_apply_order="joint"),
         read, ""),
        ("top_k_top_p_sampling_from_probs 128x128256 fp32 k=50 p=0.9 top_k_first",
         probs_case("top_k_top_p_sampling_from_probs", 50, 0.9), read, ""),
        ("sampling_from_probs 128x128256 fp32", probs_case("sampling_from_probs"), read, ""),
        ("sampling_from_logits 128x128256 fp32", logits_case("sampling_from_logits"), read, ""),
        # The same calls with seed and offset given: no generator, so a captured call is the
        # sampling kernel alone in both packages (with the default generator ours draws
        # (seed, offset) on the device while capturing, one more graph node; FlashInfer reads
        # the generator on the host and replays that seed). Top-p's time depends on the draws
        # on the direct path (benchmarks/probes/top_p_seeds.py): seed 0 is one draw.
        ("sampling_from_probs 128x128256 fp32 (seed, offset given)",
         probs_case("sampling_from_probs", seed=0, offset=0), read, ""),
        ("min_p_sampling_from_probs 128x128256 fp32 min_p=0.1 (seed, offset given)",
         probs_case("min_p_sampling_from_probs", 0.1, seed=0, offset=0), read, ""),
        ("top_p_sampling_from_probs 128x128256 fp32 p=0.9 (seed, offset given)",
         probs_case("top_p_sampling_from_probs", 0.9, seed=0, offset=0), read, ""),
        ("top_p_sampling_from_probs 1x128256 fp32 p=0.9 (latency)",
         probs_case("top_p_sampling_from_probs", 0.9, b=1), V * 4, ""),
        ("sampling_from_probs 1x128256 fp32 (latency)", probs_case("sampling_from_probs", b=1),
         V * 4, ""),
        ("softmax 128x128256 fp32", logits_case("softmax"), 2 * read, ">= 85% of copy"),
        ("top_p_renorm_probs 128x128256 fp32 p=0.9", probs_case("top_p_renorm_probs", 0.9),
         2 * read, ">= 85% of copy"),
        ("top_k_renorm_probs 128x128256 fp32 k=50", probs_case("top_k_renorm_probs", 50),
         2 * read, ">= 85% of copy"),
        ("top_k_mask_logits 128x128256 fp32 k=50", logits_case("top_k_mask_logits", 50),
         2 * read, ">= 85% of copy"),
        ("chain_speculative_sampling b=64 n=4 V=128256", chain, 64 * 2 * V * 4,
         ">= 1.0x FlashInfer"),
    ]


def cases():
    from harness import Case

    return [Case(name, make(), bytes_moved=nbytes, target=target)
            for name, make, nbytes, target in specs()]


# ---------------------------------------------------------------------------------------------
# The standalone timer (the same for both packages)


def time_us(fn, iters: int = 60) -> tuple[float, str]:
    fn()
    torch.cuda.synchronize()
    mode = "cuda graph replay, 1 call, read flush"
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except Exception as err:  # noqa: BLE001 - record why, time the eager call
        torch.cuda.synchronize()
        run, mode = fn, f"eager (capture failed: {str(err).splitlines()[0][:100]}), read flush"
    flush = torch.ones(64 << 20, device="cuda")  # 256 MB, 5x the L2
    events = []
    for _ in range(iters):
        flush.sum()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        events.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e3 for a, b in events), mode


# The peer's top_k_first path goes through its radix top-k module, whose JIT did not finish in
# 7 minutes on 16 cores: not measured for the peer.
PEER_SKIP = ("top_k_first",)


def standalone(out: str, warm_only: bool, peer: bool = False, only: str = "",
               no_cluster: bool = False) -> None:
    import flashinfer

    if no_cluster:  # ours only: the one-CTA-per-row path (what SM80/89 run)
        from flashinfer import knobs

        knobs.sampling.no_cluster = True
    rows = {"flashinfer": getattr(flashinfer, "__version__", "?"),
            "device": torch.cuda.get_device_name(), "no_cluster": no_cluster,
            "cases": {}}
    for name, make, _, _ in specs():
        if only and not any(o in name for o in only.split(",")):
            continue
        if peer and any(s in name for s in PEER_SKIP):
            rows["cases"][name] = {"error": "not measured (the peer's top-k module JIT)"}
            continue
        try:
            fn = make()
            if warm_only:
                fn()
                torch.cuda.synchronize()
                continue
            us, mode = time_us(fn)
            rows["cases"][name] = {"median_us": round(us, 2), "timing": mode}
            print(f"{name:<72} {us:9.1f} us  {mode[:40]}", flush=True)
        except Exception as err:  # noqa: BLE001 - a case the package lacks
            rows["cases"][name] = {"error": str(err).splitlines()[0][:200]}
            print(f"{name:<72} error: {err}", flush=True)
        torch.cuda.empty_cache()
    if not warm_only:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


def merge(ours: str, peer: str, run: str, out: str) -> None:
    o, p, r = (json.load(open(x)) for x in (ours, peer, run))
    for row in r["cases"]:
        mine, theirs = o["cases"].get(row["name"], {}), p["cases"].get(row["name"], {})
        row["standalone_us"] = mine.get("median_us")
        row["peer_us"] = theirs.get("median_us", theirs.get("error"))
        if isinstance(row["peer_us"], float) and row["standalone_us"]:
            row["ours_over_peer"] = round(row["standalone_us"] / row["peer_us"], 3)
    r["peer"] = {"package": f"flashinfer {p['flashinfer']}", "device": p["device"],
                 "timer": "bench_sampling.time_us for both (standalone_us / peer_us)"}
    with open(out, "w") as f:
        json.dump(r, f, indent=1)
    for row in r["cases"]:
        print(f"{row['name']:<72} ours {row['standalone_us']} peer {row['peer_us']} "
              f"ratio {row.get('ours_over_peer')} copy% {row.get('pct_of_copy')}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--standalone")
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--peer", action="store_true", help="skip the cases listed in PEER_SKIP")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    ap.add_argument("--no-cluster", action="store_true",
                    help="ours: force the one-CTA-per-row path (FLASHINFER_SAMPLING_NO_CLUSTER)")
    ap.add_argument("--merge", nargs=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.merge:
        merge(*a.merge, a.out)
    else:
        standalone(a.standalone, a.warm, a.peer, a.only, a.no_cluster)
    sys.exit(0)

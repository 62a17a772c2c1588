"""The headline attention cases (issue 3's table, bench_attention.py) through the public API
only, so the same file times this package or the peer (FlashInfer 0.7.2) in a separate process
of the same device call; ``merge`` writes one results file with both columns and the ratio.

    python benchmarks/attention_vs_peer.py measure --label ours OUT.json [--cases SUBSTR,...]
        [--rounds N]   (the case list N times, interleaved: noisy rows, e.g. sinks against none)
    python benchmarks/attention_vs_peer.py warmup [--cases SUBSTR,...]   (builds only)
    python benchmarks/attention_vs_peer.py merge RESULT.json --ours A.json [...] --peer B.json [...]

Timing and ceilings are harness.py's (graph replays of one call each, cold L2, median).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_attention as ba  # noqa: E402
import peer_compare  # noqa: E402
import schema  # noqa: E402

import flashinfer  # noqa: E402
import harness  # noqa: E402

BF16 = torch.bfloat16


def _pairs(n: int) -> int:
    """Visible (q, k) pairs of a causal n x n request."""
    return n * (n + 1) // 2


def _mla_ragged_prefill(batch: int, n: int, heads: int) -> "harness.Case":
    """DeepSeek-style MLA prefill as vLLM and SGLang run it: ragged, causal, MHA, q/k 192 wide
    (128 no-RoPE + 64 RoPE channels), v and the output 128."""
    import flashinfer

    q = torch.randn(batch * n, heads, 192, dtype=BF16, device="cuda")
    k = torch.randn(batch * n, heads, 192, dtype=BF16, device="cuda")
    v = torch.randn(batch * n, heads, 128, dtype=BF16, device="cuda")
    indptr = torch.arange(batch + 1, dtype=torch.int32) * n
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ba._ws())
    w.plan(indptr, indptr, heads, heads, 192, 128, causal=True, q_data_type=BF16)
    out = torch.empty(batch * n, heads, 128, dtype=BF16, device="cuda")
    return harness.Case(f"ragged prefill 192/128 causal {batch} x {n}, {heads} heads",
                        lambda: w.run(q, k, v, out=out),
                        flops=2.0 * batch * heads * _pairs(n) * (192 + 128),
                        target=">= 1.0x FlashInfer 0.7.2")


def _decode_512(batch: int, kv_len: int, use_tensor_cores: bool) -> "harness.Case":
    """head_dim 512 decode (Gemma-style global layers): 32 / 8 heads, page 16, pages in order."""
    import flashinfer

    hq, hkv, d, page = 32, 8, 512, 16
    pages = kv_len // page
    cache = torch.randn(batch * pages, 2, page, hkv, d, dtype=BF16, device="cuda")
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    indices = torch.arange(batch * pages, dtype=torch.int32)
    last = torch.full((batch,), page, dtype=torch.int32)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ba._ws(), "NHD",
                                                      use_tensor_cores=use_tensor_cores)
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=BF16)
    q = torch.randn(batch, hq, d, dtype=BF16, device="cuda")
    out = torch.empty_like(q)
    tc = "tensor cores" if use_tensor_cores else "CUDA cores"
    return harness.Case(f"batch decode hd512 {batch} x kv {kv_len} ({tc})",
                        lambda: w.run(q, cache, out=out),
                        bytes_moved=batch * kv_len * hkv * d * 2 * 2 + 2 * q.numel() * 2,
                        ceiling="read", target=">= 1.0x FlashInfer 0.7.2")


def _paged_prefill_512(batch: int, n: int) -> "harness.Case":
    w, q, cache, out = ba._paged_setup(batch, n, d=512)
    return harness.Case(f"paged prefill hd512 causal {batch} x {n}",
                        lambda: w.run(q, cache, out=out),
                        flops=4.0 * batch * ba.HQ * _pairs(n) * 512,
                        target=">= 1.0x FlashInfer 0.7.2")


def _sinks(on: bool) -> dict:
    """run()'s ``sinks=`` keyword: gpt-oss-like logits per query head, or nothing."""
    if not on:
        return {}
    return {"sinks": torch.rand(ba.HQ, dtype=torch.float32, device="cuda") * 4 - 2}


def _spec_decode(batch, kv_len, q_len=1, sinks=False):
    """Tensor-core decode with ``q_len_per_req`` query rows per request (speculative decoding,
    causal among them) and/or attention sinks (issue 21); pages in order, as ``ba._decode``."""
    pages = (kv_len + ba.PAGE - 1) // ba.PAGE
    cache = torch.randn(batch * pages, 2, ba.PAGE, ba.HKV, ba.D, dtype=ba.DT, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ba._ws(), "NHD", use_tensor_cores=True)
    w.plan(torch.arange(batch + 1, dtype=torch.int32) * pages,
           torch.arange(batch * pages, dtype=torch.int32),
           torch.full((batch,), kv_len - (pages - 1) * ba.PAGE, dtype=torch.int32),
           ba.HQ, ba.HKV, ba.D, ba.PAGE, q_data_type=ba.DT, q_len_per_req=q_len)
    q = torch.randn(batch * q_len, ba.HQ, ba.D, dtype=ba.DT, device="cuda")
    out = torch.empty_like(q)
    kw = _sinks(sinks)
    note = "".join([f", q_len_per_req {q_len}" if q_len > 1 else "", ", sinks" if sinks else ""])
    return harness.Case(f"batch decode {batch} x kv {kv_len} (tensor cores{note})",
                        lambda: w.run(q, cache, out=out, **kw),
                        bytes_moved=batch * kv_len * ba.HKV * ba.D * 2 * 2 + 2 * q.numel() * 2,
                        target="<= 1.2 x q_len 1, >= 1.0 x peer" if q_len > 1 else
                        "<= 1.02 x without sinks", ceiling="read")


def _spec_prefill(paged, batch, n):
    """The causal prefill cases of ``ba`` (paged 8 x 2048, ragged 16 x 1024) with sinks."""
    make = ba._paged_prefill if paged else ba._ragged_prefill
    return make(batch, n, None, "<= 1.02 x without sinks", run_kw=_sinks(True), note=" (sinks)")


CASES = {
    "batch decode 64 x kv 4096": lambda: ba._decode(64, 4096, True, 362.8, "<= 350 us"),
    "batch decode 1 x kv 32768": lambda: ba._decode(1, 32768, True, 56.0, "<= 50 us"),
    "batch decode 128 x kv 8192": lambda: ba._decode(128, 8192, True, 1420.0, "<= 1390 us"),
    "batch decode 64 x kv 4096, CUDA-graph wrapper": lambda: ba._decode(
        64, 4096, True, 362.8, "<= 350 us", note=", CUDA-graph wrapper", graph_wrapper=True),
    # fp8-e4m3 KV cache (issue 21): half the bytes of bf16; target >= 95% of the read ceiling
    # and >= 1.25x FlashInfer 0.7.2 (235 us in the issue). Both decode paths of the peer (ours
    # runs one kernel for both flags).
    "batch decode 64 x kv 4096, fp8-e4m3 KV": lambda: ba._decode(
        64, 4096, True, 235.0, ">= 95% of read, >= 1.25x peer", note=", fp8-e4m3 KV",
        kv_dtype=torch.float8_e4m3fn),
    "batch decode 64 x kv 4096 (CUDA cores, fp8-e4m3 KV)": lambda: ba._decode(
        64, 4096, False, 235.0, ">= 95% of read, >= 1.25x peer", note=", fp8-e4m3 KV",
        kv_dtype=torch.float8_e4m3fn),
    "batch decode 64 x kv 4096, CUDA-graph wrapper, fp8-e4m3 KV": lambda: ba._decode(
        64, 4096, True, 235.0, ">= 95% of read", note=", CUDA-graph wrapper, fp8-e4m3 KV",
        graph_wrapper=True, kv_dtype=torch.float8_e4m3fn),
    "single prefill causal 16384": lambda: ba._single_prefill(16384, 5824.0, "<= 5800 us"),
    "ragged prefill causal 16 x 1024": lambda: ba._ragged_prefill(16, 1024, 452.0, "<= 450 us"),
    "paged prefill causal 8 x 2048": lambda: ba._paged_prefill(8, 2048, 906.0, "<= 900 us"),
    # A batch whose K/V of one KV head (64 MB) outgrows the L2: the Hopper kernel's items go
    # request by request (plan.SM90_REQUEST_ORDER_BYTES).
    "ragged prefill causal 64 x 2048": lambda: ba._ragged_prefill(64, 2048, None, ""),
    # issue 21: the wide head dims
    "ragged prefill 192/128 causal 16 x 1024, 128 heads": lambda: _mla_ragged_prefill(16, 1024,
                                                                                      128),
    "batch decode hd512 16 x kv 8192 (tensor cores)": lambda: _decode_512(16, 8192, True),
    "batch decode hd512 16 x kv 8192 (CUDA cores)": lambda: _decode_512(16, 8192, False),
    "paged prefill hd512 causal 4 x 2048": lambda: _paged_prefill_512(4, 2048),
    # Issue 22: head_dim 256 on the Hopper kernel ("auto"; FlashInfer's fa3 published 819 us, H100).
    "single prefill causal 8192, head_dim 256, 16/8 heads": lambda: ba._single_prefill(
        8192, 819.0, ">= 1.0x FlashInfer fa3", None, 16, 8, 256),
    # Issue 21: speculative decoding (q_len_per_req 4 against q_len 1 above) and sinks (each
    # against the same case without them).
    "batch decode 64 x kv 4096, q_len_per_req 4": lambda: _spec_decode(64, 4096, q_len=4),
    "batch decode 64 x kv 4096, sinks": lambda: _spec_decode(64, 4096, sinks=True),
    "batch decode 1 x kv 32768, sinks": lambda: _spec_decode(1, 32768, sinks=True),
    "batch decode 64 x kv 4096, q_len_per_req 4, sinks": lambda: _spec_decode(64, 4096, 4, True),
    "ragged prefill causal 16 x 1024, sinks": lambda: _spec_prefill(False, 16, 1024),
    "paged prefill causal 8 x 2048, sinks": lambda: _spec_prefill(True, 8, 2048),
    # The FA2 kernel (what sm_80 runs; issue 22's FA2 rows) and single decode.
    "single prefill causal 16384, fa2": lambda: ba._single_prefill(16384, None, "", "fa2"),
    "ragged prefill causal 16 x 1024, fa2": lambda: ba._ragged_prefill(16, 1024, None, "", "fa2"),
    "paged prefill causal 8 x 2048, fa2": lambda: ba._paged_prefill(8, 2048, None, "", "fa2"),
    "single decode kv 32768": lambda: ba._single_decode(32768),
    "single prefill causal 8192, head_dim 256, 16/8 heads, fa2": lambda: ba._single_prefill(
        8192, None, "", "fa2", 16, 8, 256),
}


def _wanted(name: str, wanted: list) -> bool:
    """``--cases``: substrings of the case names; one starting with ``=`` is a whole name, one
    starting with ``!`` excludes the names that hold it."""
    if any(w.startswith("!") and w[1:] in name for w in wanted):
        return False
    return any(name == w[1:] if w.startswith("=") else w in name for w in wanted
               if not w.startswith("!"))


def _build(args) -> list:
    """The wanted cases, each called once (a JIT build on a cold cache). A case the package
    cannot run (the peer at a head dim it lacks) is left out with its error on stderr, so the
    others are still timed; ``merge`` then shows it without a peer time."""
    wanted = [s for s in args.cases.split(",") if s] if args.cases else None
    cases = []
    for name, make in CASES.items():
        if wanted and not _wanted(name, wanted):
            continue
        try:
            case = make()
            case.extra.clear()  # the peer's wrappers have no plan fields to report
            case.fn()  # the first call (a JIT build on a cold cache)
        except Exception as e:  # the peer may lack an option (issue 21's): its column stays empty
            if args.cmd == "measure" and args.label != "peer":
                raise  # (a warmup skips it: its measure, ours or the peer's, says what failed)
            print(f"peer: skipping {name!r}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        cases.append(case)
    return cases


def measure(args) -> int:
    import flashinfer

    cases = _build(args)
    payload = {"label": args.label, "device": harness.device_info(),
               "flashinfer_version": getattr(flashinfer, "__version__", "?"),
               "ceilings": harness.measure_ceilings()}
    payload["rows"] = peer_compare.median_round(
        [harness.run_cases(cases, payload["ceilings"], group="attention")
         for _ in range(args.rounds)])
    Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")
    return 0


def _schema_case(c: dict) -> dict:
    """A merged row as a results-schema case (the peer's median as peer_us)."""
    case = {k: v for k, v in c.items() if k in schema.CASE_FIELDS}
    case.setdefault("group", "attention")
    if c.get("peer_median_us"):
        case["peer_us"] = c["peer_median_us"]
        case["speedup_vs_peer"] = round(c["peer_median_us"] / c["median_us"], 3)
    extra = {k: v for k, v in c.items() if k not in schema.CASE_FIELDS and v is not None}
    if extra:
        case["extra"] = {**case.get("extra", {}), **extra}
    return case


def merge(args) -> int:
    ours, peer, pairs = peer_compare.paired(args.ours, args.peer)
    cases = []
    for r, p in pairs:
        case = dict(r, peer_median_us=p.get("median_us"), peer_p10_us=p.get("p10_us"),
                    peer_p90_us=p.get("p90_us"))
        if p.get("median_us"):
            case["ratio_ours_over_peer"] = round(r["median_us"] / p["median_us"], 3)
        cases.append(case)
    schema.write(args.out, schema.record(
        "benchmark", "attention-vs-peer", ours["device"], commit=args.commit or None,
        ceilings=ours["ceilings"], cases=[_schema_case(c) for c in cases],
        note=("ours alone: " + peer["not_measured"] if "not_measured" in peer else
              "ours and the peer in two processes of one device call")
        + "; harness.py timing (graph replays, one call each, cold L2, median)",
        peer={k: v for k, v in peer.items()
              if k in ("flashinfer_version", "ceilings", "not_measured")}))
    for c in cases:
        print(f"{c['name'][:56]:56s} ours {c['median_us']:>9.1f}  peer "
              f"{c['peer_median_us'] or float('nan'):>9.1f}  ratio "
              f"{c.get('ratio_ours_over_peer', '-')}")
    return 0


def main(argv=None) -> int:
    args = peer_compare.command_line(__doc__, argv, rounds=True)
    if args.cmd == "warmup":
        _build(args)
        return 0
    return measure(args) if args.cmd == "measure" else merge(args)


if __name__ == "__main__":
    sys.exit(main())

"""The headline attention cases (issue 3's table, bench_attention.py) through the public API
only, so the same file times this package or the peer (FlashInfer 0.7.2) in a separate process
of the same device call; ``merge`` writes one results file with both columns and the ratio.

    python benchmarks/attention_vs_peer.py measure --label ours OUT.json [--cases SUBSTR,...]
    python benchmarks/attention_vs_peer.py warmup [--cases SUBSTR,...]   (builds only)
    python benchmarks/attention_vs_peer.py merge RESULT.json --ours A.json --peer B.json

Timing and ceilings are harness.py's (graph replays of one call each, cold L2, median).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_attention as ba  # noqa: E402
import schema  # noqa: E402

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
    import flashinfer

    hq, hkv, d, page = 32, 8, 512, 16
    pages = n // page
    cache = torch.randn(batch * pages, 2, page, hkv, d, dtype=BF16, device="cuda")
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32) * n
    indices = torch.randperm(batch * pages, dtype=torch.int32)
    last = torch.full((batch,), page, dtype=torch.int32)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ba._ws(), "NHD")
    w.plan(qo_indptr, kv_indptr, indices, last, hq, hkv, d, page, causal=True, q_data_type=BF16)
    q = torch.randn(batch * n, hq, d, dtype=BF16, device="cuda")
    out = torch.empty_like(q)
    return harness.Case(f"paged prefill hd512 causal {batch} x {n}",
                        lambda: w.run(q, cache, out=out),
                        flops=4.0 * batch * hq * _pairs(n) * d, target=">= 1.0x FlashInfer 0.7.2")


CASES = {
    "batch decode 64 x kv 4096": lambda: ba._decode(64, 4096, True, 362.8, "<= 350 us"),
    "batch decode 1 x kv 32768": lambda: ba._decode(1, 32768, True, 56.0, "<= 50 us"),
    "batch decode 128 x kv 8192": lambda: ba._decode(128, 8192, True, 1420.0, "<= 1390 us"),
    "batch decode 64 x kv 4096, CUDA-graph wrapper": lambda: ba._decode(
        64, 4096, True, 362.8, "<= 350 us", note=", CUDA-graph wrapper", graph_wrapper=True),
    "single prefill causal 16384": lambda: ba._single_prefill(16384, 5824.0, "<= 5800 us"),
    "ragged prefill causal 16 x 1024": lambda: ba._ragged_prefill(16, 1024, 452.0, "<= 450 us"),
    "paged prefill causal 8 x 2048": lambda: ba._paged_prefill(8, 2048, 906.0, "<= 900 us"),
    # issue 21: the wide head dims
    "ragged prefill 192/128 causal 16 x 1024, 128 heads": lambda: _mla_ragged_prefill(16, 1024,
                                                                                      128),
    "batch decode hd512 16 x kv 8192 (tensor cores)": lambda: _decode_512(16, 8192, True),
    "batch decode hd512 16 x kv 8192 (CUDA cores)": lambda: _decode_512(16, 8192, False),
    "paged prefill hd512 causal 4 x 2048": lambda: _paged_prefill_512(4, 2048),
}


def _build(args) -> list:
    """The wanted cases, each called once (a JIT build on a cold cache). A case the package
    cannot run (the peer at a head dim it lacks) is left out with its error on stderr, so the
    others are still timed; ``merge`` then shows it without a peer time."""
    wanted = [s for s in args.cases.split(",") if s] if args.cases else None
    cases = []
    for name, make in CASES.items():
        if wanted and not any(w in name for w in wanted):
            continue
        try:
            case = make()
            case.extra.clear()  # the peer's wrappers have no plan fields to report
            case.fn()
        except Exception as err:  # noqa: BLE001 (reported, and the case left out)
            print(f"case {name!r} failed: {type(err).__name__}: {str(err)[:300]}",
                  file=sys.stderr, flush=True)
            continue
        cases.append(case)
    return cases


def measure(args) -> int:
    import flashinfer

    cases = _build(args)
    payload = {"label": args.label, "device": harness.device_info(),
               "flashinfer_version": getattr(flashinfer, "__version__", "?"),
               "ceilings": harness.measure_ceilings()}
    payload["rows"] = harness.run_cases(cases, payload["ceilings"], group="attention")
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
    ours = json.loads(Path(args.ours).read_text())
    peer = json.loads(Path(args.peer).read_text())
    prow = {r["name"]: r for r in peer["rows"]}
    cases = []
    for r in ours["rows"]:
        p = prow.get(r["name"], {})
        case = dict(r, peer_median_us=p.get("median_us"), peer_p10_us=p.get("p10_us"),
                    peer_p90_us=p.get("p90_us"))
        if p.get("median_us"):
            case["ratio_ours_over_peer"] = round(r["median_us"] / p["median_us"], 3)
        cases.append(case)
    schema.write(args.out, schema.record(
        "benchmark", "attention-vs-peer", ours["device"], commit=args.commit or None,
        ceilings=ours["ceilings"], cases=[_schema_case(c) for c in cases],
        note="ours and the peer in two processes of one device call; harness.py timing (graph "
             "replays, one call each, cold L2, median)",
        peer={"flashinfer_version": peer.get("flashinfer_version"),
              "ceilings": peer["ceilings"]}))
    for c in cases:
        print(f"{c['name'][:56]:56s} ours {c['median_us']:>9.1f}  peer "
              f"{c['peer_median_us'] or float('nan'):>9.1f}  ratio "
              f"{c.get('ratio_ours_over_peer', '-')}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("out")
    m.add_argument("--label", default="ours")
    m.add_argument("--cases", default="")
    w = sub.add_parser("warmup")
    w.add_argument("--cases", default="")
    g = sub.add_parser("merge")
    g.add_argument("out")
    g.add_argument("--ours", required=True)
    g.add_argument("--peer", required=True)
    g.add_argument("--commit", default="")
    args = ap.parse_args(argv)
    if args.cmd == "warmup":
        _build(args)
        return 0
    return measure(args) if args.cmd == "measure" else merge(args)


if __name__ == "__main__":
    sys.exit(main())

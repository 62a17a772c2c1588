"""A small workload over real ops for the debugging tools (tools/gpu_tooling.sh runs it twice):

    FLASHINFER_LOGLEVEL=10 FLASHINFER_DUMP_DIR=/tmp/d python tools/tooling_workload.py
    python -m flashinfer replay --dir /tmp/d              # every call: MATCH
    FLASHINFER_TRACE_DUMP=1 FLASHINFER_TRACE_DUMP_DIR=/tmp/t python tools/tooling_workload.py

Two "layers" of norm, activation, RoPE, attention, a cascade merge and a paged append (the
second layer repeats the first's shapes, so the trace dump writes each (op, shapes) once), then
one rmsnorm captured in a CUDA graph and replayed (its dump is deferred and flushed after).
"""

import torch

import flashinfer
from flashinfer import api_dump


def layer(tokens: int = 64, hidden: int = 1024, heads: int = 8, kv_heads: int = 2, dim: int = 128):
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(tokens, hidden, device=dev, dtype=dt)
    residual = torch.randn_like(x)
    w = torch.randn(hidden, device=dev, dtype=dt)
    flashinfer.fused_add_rmsnorm(x, residual, w)
    h = flashinfer.rmsnorm(x, w)
    q = torch.randn(tokens, heads, dim, device=dev, dtype=dt)
    k = torch.randn(tokens, kv_heads, dim, device=dev, dtype=dt)
    v = torch.randn_like(k)
    pos = torch.arange(tokens, device=dev, dtype=torch.int32)
    q, k = flashinfer.apply_rope_pos_ids(q, k, pos)
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    flashinfer.single_decode_with_kv_cache(q[-1], k, v)
    s = torch.randn(tokens, heads, device=dev)
    flashinfer.merge_state(o, s, o.flip(0), s.flip(0))
    pages, page = 8, 16
    cache = torch.zeros(pages, 2, page, kv_heads, dim, device=dev, dtype=dt)
    indptr = torch.tensor([0, pages], dtype=torch.int32, device=dev)
    indices = torch.arange(pages, dtype=torch.int32, device=dev)
    last = torch.tensor([page], dtype=torch.int32, device=dev)  # 8 full pages: 128 tokens
    batch = torch.zeros(tokens, dtype=torch.int32, device=dev)
    pos_in = torch.arange(tokens, dtype=torch.int32, device=dev) + (pages * page - tokens)
    flashinfer.append_paged_kv_cache(k, v, batch, pos_in, cache, indices, indptr, last)
    up = torch.randn(tokens, 2 * hidden, device=dev, dtype=dt)
    flashinfer.silu_and_mul(up)
    return h


def captured_rmsnorm():
    x = torch.randn(32, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    flashinfer.rmsnorm(x, w, out=out)  # warm-up (module load) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashinfer.rmsnorm(x, w, out=out)
    graph.replay()
    torch.cuda.synchronize()
    print(f"deferred dumps flushed after the graph: {api_dump.flush()}")


if __name__ == "__main__":
    for _ in range(2):
        layer()
    captured_rmsnorm()
    torch.cuda.synchronize()
    print("workload done")

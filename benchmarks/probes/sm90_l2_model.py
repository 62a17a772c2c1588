"""A rough model of how much K/V the Hopper prefill kernel (cta 3) reads from DRAM, and how
evenly its CTAs finish, under the ways its persistent grid can take the work units. Every CTA
reads one K+V tile per time step (two extra steps per item for its boundary); tiles go through
one LRU cache the size of the L2. No GPU.

    python benchmarks/probes/sm90_l2_model.py

Units are w = kv_head * num_items + item ("head-major": the CTAs running at one time share one
KV head). How the CTAs take them:
- "dealt": CTA x takes w = x, x + G, ... (G CTAs; the kernel until the claims). CTAs that draw
  short items run ahead by tens of rounds, so the CTAs running at one time spread over many KV
  heads: 192/128 ragged 16 x 1024 at 128 heads (10.5 MB of K/V per head) thrashes the L2.
- "claims": each CTA claims the next unclaimed unit when it needs one (WorkOrder::claim).
The items in either order, per head:
- "longest": longest first over the whole batch;
- "request": request by request (largest total first), each one's longest first (plan.py
  _sm90_order): the CTAs running at one time read a few requests' K/V streams.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict


def items(qo: int, kv: int, batch: int, group: int = 4, tile_q: int = 128):
    """(visible keys, request) per item, longest first, as flashinfer/attention/plan.py orders
    them for bottom-right causal prefill."""
    out = []
    for b in range(batch):
        for qt in range(math.ceil(qo * group / tile_q)):
            last = min(qo, ((qt + 1) * tile_q + group - 1) // group)
            out.append((min(kv, kv - qo + last), b))
    out.sort(key=lambda it: -it[0])
    return out


def request_by_request(its):
    """``its`` (longest first) as plan.py's _sm90_order puts them."""
    total: dict = {}
    for visible, b in its:
        total[b] = total.get(b, 0) + visible
    return sorted(its, key=lambda it: (-total[it[1]], it[1]))


def simulate(its, heads: int, claims: bool, ctas: int = 132, l2_mb: int = 50,
             tile_kb: int = 64):
    """(L2 hit rate, K/V MB read from DRAM, the longest CTA's time over the mean)."""
    n = len(its) * heads
    cache: OrderedDict = OrderedDict()
    capacity = l2_mb * 1024 // tile_kb
    hits = misses = 0
    heap = [(0.0, x, x, 0) for x in range(min(ctas, n))]
    claimed = len(heap)
    end = [0.0] * ctas
    while heap:
        t, x, w, j = heapq.heappop(heap)
        visible, b = its[w % len(its)]
        key = ((b, w // len(its)), j)
        if key in cache:
            hits += 1
            cache.move_to_end(key)
        else:
            misses += 1
            cache[key] = True
            if len(cache) > capacity:
                cache.popitem(last=False)
        if j + 1 < math.ceil(visible / 128):
            heapq.heappush(heap, (t + 1, x, w, j + 1))
            continue
        nxt = claimed if claims else w + ctas
        if nxt < n:
            claimed += claims
            heapq.heappush(heap, (t + 2, x, nxt, 0))
        else:
            end[x] = t + 1
    busy = [e for e in end if e]
    return hits / (hits + misses), misses * tile_kb / 1024, max(busy) / (sum(busy) / len(busy))


if __name__ == "__main__":
    # name: (qo, kv, batch, group, KV heads, K+V tile KB)
    shapes = {"192/128 ragged 16 x 1024, 128 heads": (1024, 1024, 16, 1, 128, 80),
              "ragged 16 x 1024, 32/8": (1024, 1024, 16, 4, 8, 64),
              "paged 8 x 2048, 32/8": (2048, 2048, 8, 4, 8, 64),
              "ragged 64 x 4096, 32/8": (4096, 4096, 64, 4, 8, 64),
              "192/128 ragged 8 x 4096, 128 heads": (4096, 4096, 8, 1, 128, 80)}
    for name, (qo, kv, batch, group, heads, tile_kb) in shapes.items():
        its = items(qo, kv, batch, group)
        for order, seq in (("longest", its), ("request", request_by_request(its))):
            for claims in (False, True):
                hit, mb, over = simulate(seq, heads, claims, tile_kb=tile_kb)
                print(f"{name:36s} {order:8s} {'claims' if claims else 'dealt':6s}: hit rate "
                      f"{hit:.2f}, K/V from DRAM {mb:6.0f} MB, longest CTA / mean {over:.3f}")

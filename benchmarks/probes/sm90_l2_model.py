"""A rough model of how much K/V the Hopper prefill kernel (cta 3) reads from DRAM under two
orders of its persistent work list: every CTA reads one 64 KB K+V tile per time step (one extra
step per item for the boundary), tiles go through one LRU cache the size of the L2. No GPU.

    python benchmarks/probes/sm90_l2_model.py

"item" is w = item * num_kv_heads + kv_head (a810e42): the CTAs running at one time cover one
query tile of every request and head, 128 different K/V streams in the ragged case, so a
stream's tiles come back only after the whole wave's K/V has passed through the L2.
"head" is w = kv_head * num_items + item: the CTAs running at one time share one KV head, and
each stream is read by 8-16 CTAs at once.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

TILE_KB = 64  # K + V of 128 keys at head_dim 128, bf16


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


def simulate(its, heads: int, order: str, ctas: int = 132, l2_mb: int = 50):
    n = len(its) * heads

    def unit(w):
        i, h = divmod(w, heads) if order == "item" else divmod(w, len(its))[::-1]
        visible, b = its[i]
        return (b, h), math.ceil(visible / 128)

    cache: OrderedDict = OrderedDict()
    capacity = l2_mb * 1024 // TILE_KB
    hits = misses = 0
    heap = [(0.0, x, x, 0) for x in range(min(ctas, n))]
    while heap:
        t, x, w, j = heapq.heappop(heap)
        stream, tiles = unit(w)
        if (stream, j) in cache:
            hits += 1
            cache.move_to_end((stream, j))
        else:
            misses += 1
            cache[(stream, j)] = True
            if len(cache) > capacity:
                cache.popitem(last=False)
        if j + 1 < tiles:
            heapq.heappush(heap, (t + 1, x, w, j + 1))
        elif w + ctas < n:
            heapq.heappush(heap, (t + 2, x, w + ctas, 0))
    return hits / (hits + misses), misses * TILE_KB / 1024


if __name__ == "__main__":
    shapes = {"single 16384": (16384, 16384, 1), "ragged 16 x 1024": (1024, 1024, 16),
              "paged 8 x 2048": (2048, 2048, 8)}
    for name, (qo, kv, batch) in shapes.items():
        its = items(qo, kv, batch)
        for order in ("item", "head"):
            for l2 in (25, 50):
                hit, mb = simulate(its, 8, order, l2_mb=l2)
                print(f"{name:16s} {order}-major  L2 {l2} MB: hit rate {hit:.2f}, "
                      f"DRAM reads {mb:6.0f} MB")

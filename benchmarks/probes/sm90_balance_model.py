"""The load balance of the Hopper prefill kernel's persistent grid (cta 3) under three orders
of a batch's items: the longest CTA's work over the mean, each unit costing its K/V tiles plus
one (the item's unoverlapped start and end). No GPU.

    python benchmarks/probes/sm90_balance_model.py

The static deals the kernel used until its CTAs claimed their units one at a time (027ecfa;
benchmarks/probes/sm90_l2_model.py models the claims): CTA x of G took units w = x, x + G, ...
of w = kv_head * N + item (N items), so head h's item j ran on CTA (h * N + j) mod G.
"longest first": the plan's items sorted by visible keys, longest first (before 34293aa).
"snake rounds": the same, in rounds of G with every other round reversed (the plan's order
until 027ecfa), so the CTA that took a round's longest item takes the next round's shortest.
"LPT": each unit, longest first, to the least loaded CTA (a bound no static order reaches).
"""

from __future__ import annotations

import heapq
import math

SMS = 132
CASES = {  # name: (requests, tokens each, group size, KV heads, K/V tile keys)
    "ragged 16 x 1024, 32/8 heads, hd 128": (16, 1024, 4, 8, 128),
    "paged 8 x 2048, 32/8 heads, hd 128": (8, 2048, 4, 8, 128),
    "ragged 64 x 256, 32/8 heads, hd 128": (64, 256, 4, 8, 128),
    "ragged 4 x 8192, 32/8 heads, hd 128": (4, 8192, 4, 8, 128),
    "ragged 16 x 1024, 16/8 heads, hd 256": (16, 1024, 2, 8, 64),
    "paged 8 x 2048, 16/8 heads, hd 256": (8, 2048, 2, 8, 64),
    "ragged 192/128 16 x 1024, 128 heads": (16, 1024, 1, 128, 128),
}


def costs(requests: int, tokens: int, group: int, tile_kv: int, tile_q: int = 128) -> list:
    """K/V tiles per item (causal, one query tile of tile_q packed rows), longest first."""
    out = []
    for _ in range(requests):
        for qt in range(math.ceil(tokens * group / tile_q)):
            visible = min(tokens, ((qt + 1) * tile_q + group - 1) // group)
            out.append(math.ceil(visible / tile_kv))
    return sorted(out, reverse=True)


def snake_rounds(order: list, grid: int) -> list:
    return [x for s in range(0, len(order), grid)
            for x in (order[s:s + grid][::-1] if (s // grid) % 2 else order[s:s + grid])]


def imbalance(item_costs: list, heads: int, grid: int) -> float:
    n, load = len(item_costs), [0.0] * grid
    for h in range(heads):
        for j, c in enumerate(item_costs):
            load[(h * n + j) % grid] += c + 1
    return max(load) * grid / sum(load)


def lpt(item_costs: list, heads: int, grid: int) -> float:
    heap = [(0.0, i) for i in range(grid)]
    for c in sorted((c for c in item_costs for _ in range(heads)), reverse=True):
        load, i = heapq.heappop(heap)
        heapq.heappush(heap, (load + c + 1, i))
    return max(load for load, _ in heap) * grid / sum(load for load, _ in heap)


def main() -> None:
    print(f"{'case':40s} {'longest first':>14s} {'snake rounds':>13s} {'LPT':>6s}")
    for name, (requests, tokens, group, heads, tile_kv) in CASES.items():
        c = costs(requests, tokens, group, tile_kv)
        grid = min(SMS, len(c) * heads)
        print(f"{name:40s} {imbalance(c, heads, grid):14.3f} "
              f"{imbalance(snake_rounds(c, grid), heads, grid):13.3f} {lpt(c, heads, grid):6.3f}")


if __name__ == "__main__":
    main()

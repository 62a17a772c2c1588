"""Host-side scheduling of attention work: done once per batch by ``plan``, reused by every
``run`` (every layer) and safe to replay in a CUDA graph.

The unit of work is an *item*: one request, one tile of its packed query rows (``qo_len *
group_size`` rows, ``tile_q`` per tile) and one chunk of its keys, for each KV head; the kernel
spreads the (item, KV head) pairs over its CTAs (``attention_kernel``, ``grid_x`` CTAs per KV
head; the Hopper kernel's grid is persistent). Long keys and
few items leave SMs idle, so the keys are split into chunks (*split KV*): every chunk writes a
partial softmax state (float32 output and base-2 lse) and they are merged: by the last CTA of
each (request, tile, KV head) to finish, counted in a ``merge_slot`` per (request, tile), or by
a merge kernel (the Hopper kernel's case).

The kernel reads the plan from one int32 buffer on the device::

    [num_items, kv_chunk_size, 0, 0,
     request_idx[cap], qo_tile_idx[cap], kv_chunk_idx[cap],     # cap = item_capacity
     merge_slot[cap],                                           # < cap, one per (request, tile)
     qo_begin[cap], qo_len[cap], kv_begin[cap], kv_len[cap],    # the item's request
     merge_indptr[num_rows + 1]]                                # split KV only

The request's rows and keys are in the plan, not looked up through the indptr arrays: the
kernel's first K/V bytes then wait for two dependent loads (the plan, the page ids), not three.
``kv_begin`` is the request's first entry of ``kv_indices`` (paged) or its first token (ragged).

Nothing here touches the GPU; the functions are pure and tested on the CPU.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from itertools import accumulate
from typing import Optional, Sequence

import torch

HEADER = 4
COLUMNS = 8  # ints per item (the layout above)


@dataclass(frozen=True)
class AttentionPlan:
    """What ``plan`` decided; ``run`` hands it to the kernel unchanged.

    Attributes
    ----------
    cta : int
        CTA shape (0: 16 rows x 4 key streams, 1: 64 rows, 2: 128 rows, 3: the Hopper kernel's
        128 rows, 4: 16 rows x 2 key streams, 5: 16 rows x 8 key streams;
        include/flashinfer/attention/launch.cuh).
    tile_q : int
        Packed query rows per item.
    num_items : int
        Work items of this plan (per KV head).
    item_capacity : int
        Items the plan buffer has room for (fixed under CUDA graphs).
    grid_x : int
        CTAs per KV head of the launch; for the Hopper kernel (cta 3) the whole persistent grid,
        whose CTAs take (item, KV head) pairs in turn.
    kv_chunk_size : int
        Keys per chunk; 0 means whole sequences.
    split_kv : bool
        Items write partial states that a merge kernel combines.
    num_rows : int
        Query rows of the batch (sum of qo lengths).
    num_partials : int
        Partial states written when split (0 otherwise).
    cluster_merge : bool
        The items are the chunks of one query tile (batch-1 decode): the CTAs of each KV head
        form one thread-block cluster and merge in shared memory, where the GPU runs one wave
        of them (include/flashinfer/attention/launch.cuh; otherwise as any split plan).
    sm90_tma_q : bool
        The Hopper kernel loads Q through a TMA tensor map (where q's layout allows one) rather
        than with cp.async: where its CTAs take several short items (``TMA_Q_MAX_KEYS``).
    """

    cta: int
    tile_q: int
    num_items: int
    item_capacity: int
    grid_x: int
    kv_chunk_size: int
    split_kv: bool
    num_rows: int
    num_partials: int
    cluster_merge: bool = False
    sm90_tma_q: bool = False

    @property
    def buffer_len(self) -> int:
        """Ints of the plan buffer."""
        return HEADER + COLUMNS * self.item_capacity + (self.num_rows + 1 if self.split_kv else 0)


# CTAs per SM the split heuristic aims for, per shape: what the registers allow for the
# FA2 shapes (~220 per thread for the 16-row ones: one 256-thread, two 128-thread or four
# 64-thread CTAs), one for the persistent Hopper kernel.
CTAS_PER_SM = {0: 2, 1: 2, 2: 2, 3: 1, 4: 4, 5: 1}

# The Hopper kernel loads Q through the TMA where its CTAs take eight or more (item, KV head)
# pairs of at most TMA_Q_MAX_KEYS keys on average, with cp.async otherwise. The TMA spares the
# K/V copies issued after Q the wait for Q's bytes, which matters where items are short and
# follow each other on a CTA; on long items it measured slower, for a reason not found. H100,
# bf16, causal, 8 KV heads, the three ways in turns (plan's choice, cp.async, TMA; us), pairs
# per CTA and mean KV tiles of 128 keys per item in brackets: ragged 64 x 256 193 / 228 / 194
# (31, 1.1), ragged 16 x 1024 381 / 402 / 381 (31, 4.1), ragged 8 x 1024 220 / 233 / 220
# (15.5, 4.1), paged 8 x 2048 678 / 701 / 671 (31, 8.1), ragged 2 x 2048 - / 250 / 256 (7.8,
# 8.1), ragged 4 x 4096 1188 / 1194 / 1205 (31, 16), single 8192 1290 / 1290 / 1313 (15.5, 32);
# chunked prefills of 1024 and 2048 over 8192 and 32768 keys within 1% either way
# (benchmarks/tuning/tma_q_sweep.py, benchmarks/NOTES.md).
TMA_Q_MAX_KEYS = 12 * 128



def choose_cta(max_packed_rows: int, head_dim: int, sm90: bool = False, batch_ctas: int = 0,
               num_sms: int = 0) -> int:
    """The CTA shape for a batch whose longest request has ``max_packed_rows`` packed rows.

    16 rows when every request fits one MMA tile (decode, short queries), with as many
    independent key streams as keep the memory system busy for the batch's ``batch_ctas``
    (16-row tiles x KV heads, times the chunks of the caller's fixed KV split if any): eight
    (shape 5, one CTA per SM; head_dim <= 128) when they fit one per SM, split or not (H100:
    1 x 32768 55.0 vs 56.3 us, 16 x 4096 95.3 vs 97.7 us); four (shape 0) up to two per SM
    and beyond four; two (shape 4, four CTAs per SM) in between: one
    wave of the narrow shape instead of two of the wide one (64 x 4096 at 8 KV heads: 348.9 vs
    351.2 us; outside that range it measured slower). Longer queries take the Hopper
    kernel (3) where ``sm90`` says the GPU and the variant allow it; otherwise 64 rows, except
    for long queries at head_dim 64 and 128, which take 128 rows (shape 2: each K/V tile in
    shared memory serves twice the rows; at head_dim 128, 64-key steps since the kernel's
    registers allow them: H200, bf16, 32/8 heads, against 64 rows single causal 16384 6468 vs
    6995 us, paged 8 x 2048 1093 vs 1221, ragged 16 x 1024 649 vs 634;
    benchmarks/notes/fa2-tiles-and-registers.md). head_dim 256 keeps 64 rows (registers).

    Examples
    --------
    >>> choose_cta(8, 128, batch_ctas=512, num_sms=132)
    4
    >>> choose_cta(8, 128, batch_ctas=1024, num_sms=132)
    0
    >>> choose_cta(8, 128, batch_ctas=8, num_sms=132)
    5
    """
    if max_packed_rows <= 16:
        if 0 < num_sms and batch_ctas <= CTAS_PER_SM[5] * num_sms and head_dim <= 128:
            return 5
        two_streams = CTAS_PER_SM[0] * num_sms < batch_ctas <= CTAS_PER_SM[4] * num_sms
        return 4 if two_streams else 0
    if sm90 and max_packed_rows > 64:
        return 3
    if max_packed_rows <= 64 or head_dim > 128:
        return 1
    return 2


def tile_rows(cta: int, head_dim: int) -> int:
    """Packed query rows per CTA of shape ``cta``: what include/flashinfer/attention/launch.cuh
    compiles (``cta_tile_q`` of a module; tests/test_package_layout.py checks the two agree)."""
    return {0: 16, 1: 64, 2: 128 if head_dim <= 128 else 64, 3: 128, 4: 16, 5: 16}[cta]


def cta_occupancy(cta: int, head_dim: int) -> int:
    """CTAs of shape ``cta`` that one SM holds: ``CTAS_PER_SM``, but one for the FA2 shapes at
    head_dim 512 (two groups of warps per CTA and 144-152 KB of shared memory: launch.cuh).

    >>> cta_occupancy(0, 128), cta_occupancy(0, 512), cta_occupancy(1, 512)
    (2, 1, 1)
    """
    return 1 if head_dim > 256 else CTAS_PER_SM[cta]


def _num_chunks(kv_len: int, chunk: int) -> int:
    return max(1, math.ceil(kv_len / chunk)) if chunk > 0 else 1


def choose_chunk_size(kv_lens: Sequence[int], qtiles: Sequence[int], num_kv_heads: int,
                      target_ctas: int, min_chunk: int = 256, align: int = 64) -> int:
    """Smallest chunk (a multiple of ``align``, at least ``min_chunk``) that keeps the CTA
    count at or under ``target_ctas``; 0 (no split) when even one chunk per request does not.

    Examples
    --------
    >>> choose_chunk_size([32768], [1], 8, 264)
    1024
    >>> choose_chunk_size([4096] * 64, [1] * 64, 8, 264)
    0
    """
    max_kv = max(kv_lens, default=0)
    base = sum(qtiles) * num_kv_heads
    if max_kv <= min_chunk or not base or base >= target_ctas:
        return 0

    lo = max(min_chunk, align)
    if len(kv_lens) == 1:  # closed form: the smallest aligned chunk giving at most `most` chunks
        most = target_ctas // base
        fewest = -(-max_kv // most)  # the smallest chunk, unaligned
        chunk = max(lo, -(-fewest // align) * align)
        return 0 if chunk >= max_kv else chunk

    def ctas(chunk: int) -> int:
        return num_kv_heads * sum(q * _num_chunks(k, chunk) for k, q in zip(kv_lens, qtiles))

    hi = math.ceil(max_kv / align) * align
    # The largest chunk that still splits gives a second chunk to every request longer than
    # it; if even that is too many, nothing smaller fits either (a batch of equal lengths).
    below = (max_kv - 1) // align * align
    if below < lo or base + num_kv_heads * sum(q for k, q in zip(kv_lens, qtiles)
                                               if k > below) > target_ctas:
        return 0
    while lo < hi:  # ctas() falls as the chunk grows: find the smallest chunk that fits
        mid = (lo + hi) // 2 // align * align
        if mid < lo:
            mid = lo
        if ctas(mid) <= target_ctas:
            hi = mid
        else:
            lo = mid + align
    return 0 if lo >= max_kv else lo


def _tiles(qo_lens: Sequence[int], group_size: int, tile: int, max_rows: int) -> list[int]:
    """Tiles of ``tile`` packed rows per request (``max_rows``: the longest one's rows)."""
    if max_rows <= tile and min(qo_lens, default=0) > 0:  # one each (decode): no loop per request
        return [1] * len(qo_lens)
    return [-(-q * group_size // tile) for q in qo_lens]


def _merge_indptr(buf: array, start: int, qo_lens: Sequence[int], chunks: Sequence[int]) -> None:
    """``buf[start:]`` (``num_rows + 1`` ints) := the partial states before each query row,
    ``[0] + cumsum(chunks of each row's request)``."""
    if len(buf) - start > 4097:  # long prefill: torch's ~20 us of calls beat a loop per row
        per_row = torch.repeat_interleave(torch.tensor(chunks), torch.tensor(qo_lens))
        torch.frombuffer(buf, dtype=torch.int32)[start + 1:] = torch.cumsum(per_row, 0)
        return
    # Row r (from 0) of a request whose states start after p ends at p + (r + 1) * chunks.
    out = array("i", [0])
    end = 0
    for q, nc in zip(qo_lens, chunks):
        if q:
            out.extend(range(end + nc, end + nc * q + 1, nc))
            end += nc * q
    buf[start:] = out


def _items(qo_lens, kv_lens, qtiles, chunks, tile_q, chunk, group_size, causal):
    """Columns (request, qo tile, kv chunk, merge slot) and cost of every item, in request order."""
    req: list[int] = []
    qtile: list[int] = []
    kchunk: list[int] = []
    slot: list[int] = []
    cost: list[int] = []
    g = group_size
    if max(chunks, default=1) == 1:  # no split (most prefills): one item per tile, slot = index
        for b, (qo, kv, nq) in enumerate(zip(qo_lens, kv_lens, qtiles)):
            req += [b] * nq
            qtile += range(nq)
            if causal:  # keys up to the tile's last row's position (bottom-right aligned)
                cost += [max(0, min(kv, kv - qo + min(qo, ((qt + 1) * tile_q + g - 1) // g)))
                         for qt in range(nq)]
            else:
                cost += [kv] * nq
        return req, qtile, [0] * len(req), list(range(len(req))), cost
    tile = 0
    for b, (qo, kv, nq, nc) in enumerate(zip(qo_lens, kv_lens, qtiles, chunks)):
        for qt in range(nq):
            visible = kv
            if causal:  # keys up to the tile's last row's position (bottom-right aligned)
                visible = min(kv, kv - qo + min(qo, ((qt + 1) * tile_q + group_size - 1)
                                                // group_size))
            if nc == 1:
                cost.append(max(0, visible))
            else:
                cost += [max(0, min(kv, lo + chunk, visible) - lo)
                         for lo in range(0, nc * chunk, chunk)]
            req += [b] * nc
            qtile += [qt] * nc
            kchunk += range(nc)
            slot += [tile] * nc
            tile += 1
    return req, qtile, kchunk, slot, cost


#: A batch on the Hopper kernel whose K/V of one KV head (at two bytes an element) is larger
#: than this goes request by request (_sm90_order). Its CTAs claim the units head-major in plan
#: order, so those running at one time read about one KV head's K/V: within the L2, longest
#: first over the whole batch keeps it there and balances the CTAs best; beyond it, only
#: request by request does. An LRU model of the L2 (benchmarks/probes/sm90_l2_model.py, 50 MB)
#: at 8 KV heads: 64 x 1024 (32 MB a head) reads 256 MB of K/V from DRAM either way, the
#: longest CTA's work over the mean 1.002 longest first, 1.006 request by request; 64 x 2048
#: (64 MB) 4096 vs 512 MB; 64 x 4096 (128 MB) 28.5 GB vs 1.0 GB. Q and the output pass
#: through the L2 as well, hence a bound below its size.
SM90_REQUEST_ORDER_BYTES = 32 << 20


def _sm90_order(order: list, req: list, cost: list, head_kv_bytes: int) -> list:
    """``order`` (longest first) for the Hopper kernel: kept where one KV head's K/V
    (``head_kv_bytes``) fits SM90_REQUEST_ORDER_BYTES or every item is of one request (the
    kernel takes that item-major, and tells the two apart by the first and the last item's
    request); otherwise request by request, the requests by their total cost (largest first),
    each one's items longest first."""
    if head_kv_bytes <= SM90_REQUEST_ORDER_BYTES or len(order) < 2 \
            or req[order[0]] == req[order[-1]]:
        return order
    total: dict = {}
    for b, c in zip(req, cost):
        total[b] = total.get(b, 0) + c
    rank = {b: i for i, b in enumerate(sorted(total, key=lambda b: (-total[b], b)))}
    return sorted(order, key=[rank[b] for b in req].__getitem__)


def schedule(
    qo_lens: Sequence[int],
    kv_lens: Sequence[int],
    *,
    group_size: int,
    num_kv_heads: int,
    head_dim: int,
    num_sms: int,
    causal: bool = False,
    kv_chunk_size: Optional[int] = None,
    disable_split_kv: bool = False,
    item_capacity: Optional[int] = None,
    force_split: bool = False,
    cta: Optional[int] = None,
    backend: str = "fa2",
    ctas_per_sm: Optional[int] = None,
    qo_begins: Optional[Sequence[int]] = None,
    kv_begins: Optional[Sequence[int]] = None,
    head_dim_vo: Optional[int] = None,
) -> tuple[AttentionPlan, torch.Tensor]:
    """Plan one batch. Returns the plan and its int32 buffer (CPU; the caller uploads it).

    Parameters
    ----------
    qo_lens, kv_lens : sequence of int
        Query rows and keys of each request.
    kv_chunk_size : int, optional
        Keys per chunk (``fixed_split_size``); None chooses one, 0 or ``disable_split_kv``
        disables splitting.
    item_capacity : int, optional
        Fixed buffer size (CUDA-graph mode: the launch shape must not change).
    force_split : bool
        Plan for the split-KV path even with one chunk per request (CUDA-graph mode: the
        captured launches are the same whether a later plan splits or not; the FA2 kernels
        then write one-chunk requests' outputs directly and merge the others themselves, the
        Hopper kernel's are merged by the merge kernel).
    backend : str
        ``"fa3"``: the Hopper kernel may be chosen (``runtime.resolve_backend`` says where it
        exists); ``"fa2"``: the FA2 shapes only.
    qo_begins, kv_begins : sequence of int, optional
        Each request's first q row and its first ``kv_indices`` entry (paged) or token (ragged):
        ``qo_indptr[:-1]`` and ``kv_indptr[:-1]``. Default: the running sums of the lengths.
    head_dim_vo : int, optional
        v's head dim (default ``head_dim``): with ``head_dim``, what ``cta_occupancy`` reads.
    ctas_per_sm : int, optional
        CTAs per SM the split heuristic aims for (default: ``cta_occupancy(cta, the wider
        head dim)``). Decode (cta 0) fits two per SM (its registers; one at head_dim 512);
        with its two-stage pipeline two per SM measured
        56.4 vs 56.8 us (one per SM) on 1 x 32768 (H100, benchmarks/NOTES.md), and CUDA-graph
        plans need it: their captured grid has about that many CTAs per SM.
    """
    if len(qo_lens) != len(kv_lens):
        raise ValueError(f"qo_lens and kv_lens must have one entry per request, got "
                         f"{len(qo_lens)} and {len(kv_lens)}")
    if min(qo_lens, default=0) < 0 or min(kv_lens, default=0) < 0:
        raise ValueError("sequence lengths must be >= 0")
    max_rows = max(qo_lens, default=0) * group_size
    if cta is None:
        fixed = kv_chunk_size if kv_chunk_size and not disable_split_kv else 0
        tiles = _tiles(qo_lens, group_size, 16, max_rows)
        if fixed:
            tiles = [t * (-(-k // fixed) or 1) for t, k in zip(tiles, kv_lens)]
        batch_ctas = num_kv_heads * sum(tiles)
        cta = choose_cta(max_rows, head_dim, backend == "fa3", batch_ctas, num_sms)
    if ctas_per_sm is None:
        ctas_per_sm = cta_occupancy(cta, max(head_dim, head_dim_vo or head_dim))
    tile_q = tile_rows(cta, head_dim)
    qtiles = _tiles(qo_lens, group_size, tile_q, max_rows)

    if disable_split_kv or kv_chunk_size == 0:
        chunk = 0
    elif kv_chunk_size is not None:
        if kv_chunk_size < 0:
            raise ValueError(f"fixed_split_size must be >= 0, got {kv_chunk_size}")
        chunk = kv_chunk_size
    else:
        target = num_sms * ctas_per_sm
        if item_capacity is not None:
            target = min(target, item_capacity * num_kv_heads)
        chunk = choose_chunk_size(kv_lens, qtiles, num_kv_heads, target)

    # The items as four columns and their costs (keys each sees); one slot per (request, tile).
    # Chunks per request (_num_chunks, inlined: this runs once per request per plan).
    chunks = [-(-k // chunk) or 1 for k in kv_lens] if chunk > 0 else [1] * len(kv_lens)
    one_per_request = max(qtiles, default=0) <= 1 and max(chunks, default=1) == 1
    if one_per_request:
        # One item per non-empty request (decode): its keys are all visible, even causal; its
        # tile and chunk are 0 and its slot is its index.
        if min(qtiles, default=1):
            req, cost = list(range(len(qtiles))), list(kv_lens)
        else:
            req = [b for b, nq in enumerate(qtiles) if nq]
            cost = [kv_lens[b] for b in req]
    else:
        req, qtile, kchunk, slot, cost = _items(qo_lens, kv_lens, qtiles, chunks, tile_q,
                                                chunk, group_size, causal)
    # Longest first (a stable sort): CTAs take items in index order, so the tail is made of
    # short ones.
    order = sorted(range(len(cost)), key=cost.__getitem__, reverse=True)
    num_items = len(order)
    split = force_split or (not one_per_request
                            and any(nc > 1 for nc, q in zip(chunks, qo_lens) if q))
    capacity = item_capacity if item_capacity is not None else max(1, num_items)
    if num_items > capacity:
        raise ValueError(f"the batch needs {num_items} work items, more than the "
                         f"{capacity} this wrapper was sized for")
    num_rows = sum(qo_lens)
    grid_x = capacity if item_capacity is not None else num_items
    if cta == 3:  # persistent: at most one CTA per SM over all (item, KV head) pairs
        grid_x = max(1, min(grid_x * num_kv_heads, num_sms))
        order = _sm90_order(order, req, cost,
                            sum(kv_lens) * (head_dim + (head_dim_vo or head_dim)) * 2)
    plan_info = AttentionPlan(
        cta=cta, tile_q=tile_q, num_items=num_items, item_capacity=capacity,
        grid_x=grid_x, kv_chunk_size=chunk,
        split_kv=split, num_rows=num_rows,
        num_partials=sum(q * nc for q, nc in zip(qo_lens, chunks)) if split else 0,
        # One query tile's chunks (at most a cluster of 16), one CTA each: not in graph mode,
        # whose later plans fill a fixed grid. The eight-stream shape only, where measured
        # (H100: 1 x 1024 12.5 vs 13.7 us, 1 x 2048 13.2 vs 14.2 us; a wave there holds 15
        # clusters of 8 but only 7 of 16, so 8 KV heads in 16 chunks keep the counted merge:
        # benchmarks/NOTES.md).
        cluster_merge=(split and cta == 5 and item_capacity is None and 2 <= num_items <= 16
                       and sum(qtiles) == 1),
        sm90_tma_q=(cta == 3 and num_items * num_kv_heads >= 8 * grid_x
                    and sum(cost) <= TMA_Q_MAX_KEYS * num_items),
    )
    # The buffer is built as an array and handed over as a tensor of the same memory: a plan
    # is called per decode step, and every torch call costs microseconds (host_cost.py).
    buf = array("i", bytes(4 * plan_info.buffer_len))
    buf[0] = num_items
    buf[1] = chunk
    if num_items:  # the columns, each in `order`
        reqs = array("i", map(req.__getitem__, order))
        if qo_begins is None:
            qo_begins = list(accumulate(qo_lens, initial=0))
        if kv_begins is None:
            kv_begins = list(accumulate(kv_lens, initial=0))
        cols = [reqs, None, None, array("i", order)] if one_per_request else \
            [reqs] + [array("i", map(c.__getitem__, order)) for c in (qtile, kchunk, slot)]
        # (one item per request: tile and chunk 0, the slot its index in request order)
        cols += [array("i", map(c.__getitem__, reqs))
                 for c in (qo_begins, qo_lens, kv_begins, kv_lens)]
        for c, col in enumerate(cols):
            if col is not None:
                buf[HEADER + c * capacity:HEADER + c * capacity + num_items] = col
    if split:
        _merge_indptr(buf, HEADER + COLUMNS * capacity, qo_lens, chunks)
    return plan_info, torch.frombuffer(buf, dtype=torch.int32)

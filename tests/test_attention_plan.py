"""The host scheduler (flashinfer.attention.plan): pure functions, tested on the CPU."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from flashinfer.attention.plan import (
    COLUMNS,
    HEADER,
    SM90_REQUEST_ORDER_BYTES,
    choose_chunk_size,
    choose_cta,
    schedule,
)

SMS = 132


def _items(plan, buf, columns=3):
    """(request, qo_tile, kv_chunk[, merge_slot]) of every item, in plan order."""
    cap = plan.item_capacity
    cols = [buf[HEADER + i * cap:HEADER + i * cap + plan.num_items].tolist()
            for i in range(columns)]
    return list(zip(*cols))


def _check_slots(plan, buf):
    """One merge slot per (request, qo tile), shared by its chunks, below the item capacity."""
    slots = {}
    for b, t, _, slot in _items(plan, buf, columns=4):
        assert 0 <= slot < plan.item_capacity
        assert slots.setdefault((b, t), slot) == slot
    assert len(set(slots.values())) == len(slots)


def _check_cover(qo_lens, kv_lens, plan, buf, group_size):
    """Every (request, qo tile, kv chunk) appears exactly once."""
    expect = set()
    for b, (qo, kv) in enumerate(zip(qo_lens, kv_lens)):
        tiles = math.ceil(qo * group_size / plan.tile_q)
        chunks = max(1, math.ceil(kv / plan.kv_chunk_size)) if plan.kv_chunk_size else 1
        expect |= {(b, t, c) for t in range(tiles) for c in range(chunks)}
    got = _items(plan, buf)
    assert len(got) == len(set(got)) == plan.num_items
    assert set(got) == expect


@pytest.mark.parametrize("rows, head_dim, cta", [
    (1, 128, 0), (16, 128, 0), (17, 128, 1), (64, 128, 1), (65, 128, 2), (100_000, 128, 2),
    (65, 64, 2), (100_000, 256, 1),
])
def test_choose_cta(rows, head_dim, cta):
    assert choose_cta(rows, head_dim) == cta


def test_chunk_size_splits_long_sequences_only_when_the_chip_is_not_full():
    assert choose_chunk_size([32768], [1], 8, 264) == 1024
    assert choose_chunk_size([4096] * 64, [1] * 64, 8, 264) == 0  # 512 CTAs already
    assert choose_chunk_size([100], [1], 8, 264) == 0  # shorter than the smallest chunk
    chunk = choose_chunk_size([5000, 70, 131072], [1, 1, 1], 4, 264)
    assert chunk % 64 == 0 and chunk >= 256
    ctas = 4 * sum(max(1, math.ceil(k / chunk)) for k in (5000, 70, 131072))
    assert ctas <= 264


def test_chunk_size_of_one_request_is_the_searched_one():
    """One request takes a closed form (plan runs per decode step); a second, empty request
    (no query tiles, no CTAs) sends the same question through the search."""
    rnd = random.Random(3)
    for _ in range(2000):
        kv, tiles = rnd.randint(0, 300000), rnd.choice([0, 1, 2, 7, 64])
        heads, target = rnd.choice([1, 2, 8]), rnd.choice([8, 132, 264, 528, 1000])
        assert choose_chunk_size([kv], [tiles], heads, target) == \
            choose_chunk_size([kv, 0], [tiles, 0], heads, target), (kv, tiles, heads, target)


@pytest.mark.parametrize("qo_lens, kv_lens, group_size", [
    ([1] * 7, [1, 17, 4096, 0, 33, 999, 131072], 4),  # decode with an empty request
    ([1], [32768], 8),
    ([300, 1, 0, 2048], [700, 5, 9, 2048], 1),         # prefill, qo > kv nowhere
    ([513], [513], 4),
])
def test_schedule_covers_every_tile_and_chunk_once(qo_lens, kv_lens, group_size):
    plan, buf = schedule(qo_lens, kv_lens, group_size=group_size, num_kv_heads=8,
                         head_dim=128, num_sms=SMS)
    assert buf.dtype == torch.int32 and buf.numel() == plan.buffer_len
    assert buf[0].item() == plan.num_items and buf[1].item() == plan.kv_chunk_size
    _check_cover(qo_lens, kv_lens, plan, buf, group_size)
    _check_slots(plan, buf)
    assert plan.grid_x == plan.num_items == plan.item_capacity
    assert plan.num_rows == sum(qo_lens)


def test_split_merge_indptr_counts_chunks_per_query_row():
    qo_lens, kv_lens = [1, 2, 1], [5000, 10, 0]
    plan, buf = schedule(qo_lens, kv_lens, group_size=4, num_kv_heads=8, head_dim=128,
                         num_sms=SMS, kv_chunk_size=1024)
    assert plan.split_kv and plan.kv_chunk_size == 1024
    merge = buf[HEADER + COLUMNS * plan.item_capacity:].tolist()
    assert merge == [0, 5, 6, 7, 8]  # 5 chunks for row 0, 1 each for the rest
    assert plan.num_partials == 8
    _check_slots(plan, buf)


def test_items_longest_first_and_causal_cost():
    plan, buf = schedule([1024, 1024], [1024, 4096], group_size=1, num_kv_heads=1,
                         head_dim=128, num_sms=SMS, causal=True, disable_split_kv=True)
    items = _items(plan, buf)
    # The first item is a tile of the long request: its last tile sees all 4096 keys.
    assert items[0] == (1, plan.num_items // 2 - 1, 0)
    assert items[-1] == (0, 0, 0)  # the first tile of the short causal request sees 64 keys


def test_no_split_options():
    for kwargs in ({"disable_split_kv": True}, {"kv_chunk_size": 0}):
        plan, _ = schedule([1], [131072], group_size=4, num_kv_heads=8, head_dim=128,
                           num_sms=SMS, **kwargs)
        assert not plan.split_kv and plan.kv_chunk_size == 0 and plan.num_items == 1


def test_cuda_graph_capacity_keeps_the_launch_shape():
    plan, buf = schedule([1] * 3, [10, 20, 30], group_size=4, num_kv_heads=8, head_dim=128,
                         num_sms=SMS, item_capacity=64, force_split=True, cta=0)
    assert plan.grid_x == plan.item_capacity == 64 and plan.num_items == 3
    assert plan.split_kv  # forced: the captured graph always runs the merge
    assert buf.numel() == HEADER + COLUMNS * 64 + 3 + 1
    _check_slots(plan, buf)
    with pytest.raises(ValueError, match="more than the 2 this wrapper was sized for"):
        schedule([1] * 3, [10, 20, 30], group_size=4, num_kv_heads=8, head_dim=128,
                 num_sms=SMS, item_capacity=2)


@pytest.mark.parametrize("qo_lens, kv_lens, kwargs, match", [
    ([1, 2], [3], {}, "one entry per request"),
    ([-1], [3], {}, ">= 0"),
    ([1], [-3], {}, ">= 0"),
    ([1], [3], {"kv_chunk_size": -5}, "fixed_split_size must be >= 0"),
])
def test_schedule_rejects_bad_input(qo_lens, kv_lens, kwargs, match):
    with pytest.raises(ValueError, match=match):
        schedule(qo_lens, kv_lens, group_size=1, num_kv_heads=1, head_dim=128, num_sms=SMS,
                 **kwargs)


def test_decode_splits_for_the_shapes_ctas_per_sm():
    # A batch of at most one CTA per SM takes eight key streams (cta 5, one per SM) and splits
    # to fill the SMs: 1 x 32768 at 8 KV heads in 16 chunks of 2048 (128 CTAs); 16 x 4096 (128
    # CTAs already) is not split. At head_dim 256 (no cta 5) the four-stream shape aims for two
    # per SM: 32 chunks of 1024.
    plan, _ = schedule([1], [32768], group_size=4, num_kv_heads=8, head_dim=128, num_sms=SMS)
    assert plan.cta == 5 and plan.kv_chunk_size == 2048 and plan.num_items == 16
    plan, _ = schedule([1] * 16, [4096] * 16, group_size=4, num_kv_heads=8, head_dim=128,
                       num_sms=SMS)
    assert plan.cta == 5 and not plan.split_kv and plan.num_items == 16
    plan, _ = schedule([1], [32768], group_size=4, num_kv_heads=8, head_dim=256, num_sms=SMS)
    assert plan.cta == 0 and plan.kv_chunk_size == 1024 and plan.num_items == 32
    # 20 x 4096 (160 CTAs: more than one per SM, not split) keeps four streams.
    plan, _ = schedule([1] * 20, [4096] * 20, group_size=4, num_kv_heads=8, head_dim=128,
                       num_sms=SMS)
    assert plan.cta == 0 and not plan.split_kv
    # An explicit ctas_per_sm still rules.
    plan, _ = schedule([1], [32768], group_size=4, num_kv_heads=8, head_dim=128, num_sms=SMS,
                       ctas_per_sm=2)
    assert plan.kv_chunk_size == 1024 and plan.num_items == 32


@pytest.mark.parametrize("batch, cta", [
    (33, 0),   # 264 CTAs at 8 KV heads: two per SM, one wave of shape 0
    (34, 4),   # 272: one wave of the two-stream shape (four per SM) instead of two
    (64, 4),   # 512
    (66, 4),   # 528: exactly four per SM
    (67, 0),   # 536: more than one wave either way
    (128, 0),
])
def test_decode_takes_two_key_streams_when_they_fit_one_wave(batch, cta):
    plan, _ = schedule([1] * batch, [4096] * batch, group_size=4, num_kv_heads=8, head_dim=128,
                       num_sms=SMS)
    assert plan.cta == cta and plan.tile_q == 16 and not plan.split_kv
    assert plan.num_items == batch and plan.grid_x == batch


def test_two_key_stream_plans_split_for_four_ctas_per_sm():
    # 40 requests at 8 KV heads (320 unsplit CTAs): shape 4, which aims for four per SM (528),
    # so the one long request is split and the short ones are not.
    plan, buf = schedule([1] * 40, [32768] + [100] * 39, group_size=4, num_kv_heads=8,
                         head_dim=128, num_sms=SMS)
    assert plan.cta == 4 and plan.split_kv
    assert 8 * plan.num_items <= 4 * SMS
    assert plan.num_items == 39 + math.ceil(32768 / plan.kv_chunk_size)
    _check_cover([1] * 40, [32768] + [100] * 39, plan, buf, 4)
    _check_slots(plan, buf)


def test_two_and_eight_key_streams_only_for_16_row_tiles():
    # Two rows of a group of 8 are 16 packed rows (shape 4); three are 24 (shape 1, 64 rows).
    assert choose_cta(16, 128, batch_ctas=400, num_sms=SMS) == 4
    assert choose_cta(24, 128, batch_ctas=400, num_sms=SMS) == 1
    assert choose_cta(16, 128, batch_ctas=100, num_sms=SMS) == 5
    assert choose_cta(24, 128, batch_ctas=100, num_sms=SMS) == 1
    assert choose_cta(16, 256, batch_ctas=100, num_sms=SMS) == 0  # no shape 5 at 256
    assert choose_cta(16, 128) == 0  # nothing known of the batch: four streams


def _model_items(qo_lens, kv_lens, plan, group_size, causal, with_cost=False):
    """The plan's items spelled out one at a time: (request, qo tile, kv chunk, merge slot) in
    request order with each one's visible keys, sorted longest first (stable); ``with_cost``:
    (visible keys, item) pairs."""
    chunk, items, slot = plan.kv_chunk_size, [], 0
    for b, (qo, kv) in enumerate(zip(qo_lens, kv_lens)):
        chunks = max(1, math.ceil(kv / chunk)) if chunk else 1
        for qt in range(math.ceil(qo * group_size / plan.tile_q)):
            last_row = min(qo, math.ceil((qt + 1) * plan.tile_q / group_size))
            visible = min(kv, kv - qo + last_row) if causal else kv
            for c in range(chunks):
                hi = min(kv, (c + 1) * chunk) if chunk else kv
                items.append((max(0, min(hi, visible) - c * chunk), (b, qt, c, slot)))
            slot += 1
    items.sort(key=lambda it: -it[0])
    return items if with_cost else [it[1] for it in items]


def test_schedule_matches_an_item_by_item_model():
    rnd = random.Random(0)
    for _ in range(300):
        batch = rnd.choice([1, 2, 5, 40, 300])
        qo_lens = [rnd.choice([0, 1, 1, 3, 17, 130, 700]) for _ in range(batch)]
        kv_lens = [q + rnd.choice([0, 5, 999, 4096]) for q in qo_lens]
        group, causal = rnd.choice([1, 4, 8]), rnd.random() < 0.5
        kwargs = rnd.choice([{}, {"kv_chunk_size": 256}, {"disable_split_kv": True}])
        # Paged: each request's first page-id entry, not a running sum of its keys.
        kv_begins = rnd.choice([None, list(itertools.accumulate(
            (rnd.randint(0, 9) for _ in qo_lens), initial=0))])
        plan, buf = schedule(qo_lens, kv_lens, group_size=group, num_kv_heads=rnd.choice([1, 8]),
                             head_dim=128, num_sms=SMS, causal=causal, kv_begins=kv_begins,
                             **kwargs)
        assert _items(plan, buf, columns=4) == _model_items(qo_lens, kv_lens, plan, group, causal)
        # Columns 4-7: the item's request's first q row, q rows, first key entry, keys.
        cap, n = plan.item_capacity, plan.num_items
        reqs = buf[HEADER:HEADER + n].tolist()
        for c, per_request in enumerate((list(itertools.accumulate(qo_lens, initial=0)), qo_lens,
                                         kv_begins or list(itertools.accumulate(kv_lens, initial=0)),
                                         kv_lens), start=4):
            assert buf[HEADER + c * cap:HEADER + c * cap + n].tolist() == \
                [per_request[b] for b in reqs]
        chunks = [max(1, math.ceil(k / plan.kv_chunk_size)) if plan.kv_chunk_size else 1
                  for k in kv_lens]
        assert plan.split_kv == any(c > 1 for c, q in zip(chunks, qo_lens) if q)
        if plan.split_kv:  # merge_indptr: each row's partial states
            merge = buf[HEADER + COLUMNS * plan.item_capacity:].tolist()
            rows = [c for c, q in zip(chunks, qo_lens) for _ in range(q)]
            assert merge == [0] + list(itertools.accumulate(rows))
            assert plan.num_partials == sum(rows)


def test_cluster_merge_only_for_the_chunks_of_one_query_tile():
    kw = dict(group_size=4, num_kv_heads=8, head_dim=128, num_sms=SMS)
    plan, _ = schedule([1], [32768], **kw)
    assert plan.cta == 5 and plan.split_kv and plan.num_items == 16 and plan.cluster_merge
    plan, _ = schedule([0, 1, 0], [9, 32768, 5], **kw)  # empty requests have no items
    assert plan.num_items == 16 and plan.cluster_merge
    assert not schedule([1], [200], **kw)[0].cluster_merge  # not split
    assert not schedule([1, 1], [32768, 32768], **kw)[0].cluster_merge  # two query tiles
    assert not schedule([1], [32768], kv_chunk_size=256, **kw)[0].cluster_merge  # 128 chunks
    assert not schedule([1], [32768], item_capacity=17, force_split=True, **kw)[0].cluster_merge
    assert not schedule([1], [32768], cta=0, **kw)[0].cluster_merge  # eight streams only
    assert not schedule([1], [32768], **{**kw, "head_dim": 256})[0].cluster_merge


@pytest.mark.parametrize("qo_lens, tma_q", [
    ([1024] * 16, True),    # 4096 (item, KV head) pairs on 132 CTAs, 4.1 KV tiles per item
    ([2048] * 8, True),     # 8.1 tiles
    ([4096] * 4, False),    # 16 tiles: more keys than TMA_Q_MAX_KEYS
    ([1024] * 8, True),     # 2048 pairs: 15.5 per CTA
    ([2048] * 2, False),    # 1024 pairs: fewer than eight per CTA
    ([2048], False),        # 512 pairs
    ([16384], False),       # 64 tiles
])
def test_hopper_q_through_the_tma_only_for_several_short_items_per_cta(qo_lens, tma_q):
    plan, _ = schedule(qo_lens, qo_lens, group_size=4, num_kv_heads=8, head_dim=128,
                       num_sms=SMS, causal=True, backend="fa3")
    assert plan.cta == 3 and plan.sm90_tma_q == tma_q
    # Not a question for the FA2 shapes.
    fa2, _ = schedule(qo_lens, qo_lens, group_size=4, num_kv_heads=8, head_dim=128,
                      num_sms=SMS, causal=True, backend="fa2")
    assert fa2.cta != 3 and not fa2.sm90_tma_q


@pytest.mark.parametrize("chunk, cta", [(256, 0), (512, 4), (2048, 5), (0, 5)])
def test_decode_shape_follows_the_callers_fixed_split(chunk, cta):
    # 1 x 32768 at 8 KV heads in chunks of 256 is 1024 CTAs: more than four per SM, four key
    # streams; 512 CTAs: two streams; 128 (or unsplit): eight.
    plan, _ = schedule([1], [32768], group_size=4, num_kv_heads=8, head_dim=128, num_sms=SMS,
                       kv_chunk_size=chunk)
    assert plan.cta == cta and plan.kv_chunk_size == chunk


def test_hopper_batches_outgrowing_the_l2_take_their_items_request_by_request():
    """Several requests on the Hopper kernel (cta 3), whose CTAs claim the units head-major in
    plan order: where one KV head's K/V is over plan.SM90_REQUEST_ORDER_BYTES, the requests by
    their visible keys summed over their items (largest first, ties by index), each one's items
    longest first; below it, and for one request (the kernel takes it item-major), longest first
    over the batch."""
    for qo_lens, group, heads in (([2048] * 64, 4, 8), ([300, 7, 1000, 64] * 200, 4, 8),
                                  ([5, 40960, 0, 700, 40960], 1, 2)):
        kv_bytes = sum(qo_lens) * 256 * 2
        assert kv_bytes > SM90_REQUEST_ORDER_BYTES
        plan, buf = schedule(qo_lens, qo_lens, group_size=group, num_kv_heads=heads,
                             head_dim=128, num_sms=SMS, causal=True, cta=3,
                             disable_split_kv=True)
        model = _model_items(qo_lens, qo_lens, plan, group, True, with_cost=True)
        total = {}
        for cost, it in model:
            total[it[0]] = total.get(it[0], 0) + cost
        expect = [it for _, it in sorted(model, key=lambda m: (-total[m[1][0]], m[1][0]))]
        assert _items(plan, buf, columns=4) == expect != [it for _, it in model]
    for qo_lens in ([1024] * 16, [8192], [24576] * 2):  # 8 MB a KV head; one request; 24 MB
        plan, buf = schedule(qo_lens, qo_lens, group_size=4, num_kv_heads=8, head_dim=128,
                             num_sms=SMS, causal=True, cta=3, disable_split_kv=True)
        assert _items(plan, buf, columns=4) == _model_items(qo_lens, qo_lens, plan, 4, True)


def test_the_plan_header_leaves_the_hopper_kernels_counters_at_zero():
    """Ints 2 and 3 of the plan buffer are the Hopper kernel's work counters (units claimed,
    CTAs done): every plan uploads them as 0, the kernel's last CTA puts them back."""
    for qo_lens, cta in (([1024] * 16, 3), ([300, 7, 1000, 64] * 8, 3), ([1] * 64, None)):
        plan, buf = schedule(qo_lens, [4096] * len(qo_lens), group_size=4, num_kv_heads=8,
                             head_dim=128, num_sms=SMS, causal=True, cta=cta)
        assert buf[:HEADER].tolist() == [plan.num_items, plan.kv_chunk_size, 0, 0]

"""flashinfer.topk: top_k, top_k_page_table_transform, top_k_ragged_transform, TopKTieBreak.

The oracle is a stable sort of the order-preserving key (NaN largest, -0 == +0): with
TopKTieBreak.SMALL (and NONE, which picks the smaller indices here) the first k of the stable
descending sort, with LARGE the same on the reversed row. Unsorted results are compared as sets,
sorted ones as sequences (descending value, equal values by ascending index). Row lengths reach
both kernel paths: the threshold bin stashed in shared memory (<= 4096 candidates) and the
rounds over the row itself (ties of a few distinct values over long rows).
"""

from __future__ import annotations

import pytest
import torch

import flashinfer
import flashinfer.topk as topk_mod
from flashinfer.topk import TopKTieBreak

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# ---------------------------------------------------------------------------------------------
# reference


def _keys(x: torch.Tensor) -> torch.Tensor:
    """int64 order-preserving key of every element (float32 holds half/bf16 exactly)."""
    f = x.float()
    f = torch.where(f == 0, torch.zeros_like(f), f)  # -0 == +0
    bits = f.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    key = torch.where(bits >= 0x80000000, 0xFFFFFFFF - bits, bits + 0x80000000)
    return torch.where(torch.isnan(f), torch.full_like(key, 0x1_0000_0000), key)


def ref_indices(x: torch.Tensor, k: int, tie: int) -> torch.Tensor:
    """(rows, k) indices of the selection, ordered by key desc (ties: the preferred first)."""
    key = _keys(x)
    if tie == TopKTieBreak.LARGE:
        order = torch.sort(key.flip(-1), dim=-1, descending=True, stable=True).indices
        return (x.shape[-1] - 1 - order)[:, :k]
    return torch.sort(key, dim=-1, descending=True, stable=True).indices[:, :k]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    both_nan = torch.isnan(a.float()) & torch.isnan(b.float())
    return bool(((a == b) | both_nan).all())


def check_top_k(x, values, indices, k, tie, sorted_):
    assert values.shape == indices.shape == (x.shape[0], k)
    assert values.dtype == x.dtype and indices.dtype == torch.int64
    want = ref_indices(x, k, tie)
    got_set = torch.sort(indices, dim=-1).values
    assert torch.equal(got_set, torch.sort(want, dim=-1).values)
    assert _same_bits(values, torch.gather(x, 1, indices))
    if sorted_:  # descending key, equal keys by ascending index
        key = torch.gather(_keys(x), 1, indices)
        order = torch.sort(indices, dim=-1).indices  # ascending index first ...
        key_by_idx = torch.gather(key, 1, order)
        resort = torch.sort(key_by_idx, dim=-1, descending=True, stable=True).indices
        assert torch.equal(indices, torch.gather(torch.gather(indices, 1, order), 1, resort))


# ---------------------------------------------------------------------------------------------
# GPU: top_k


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,d,k",
    [(1, 1, 1), (3, 17, 5), (3, 17, 17), (5, 1000, 1), (19, 4097, 50), (7, 8191, 2048),
     (4, 128256, 50), (4, 128256, 1024), (2, 128256, 3000), (2, 256000, 2048), (64, 65536, 2048),
     (1, 70001, 1)],
)
@pytest.mark.parametrize("sorted_", [False, True])
def test_top_k_random(dtype, rows, d, k, sorted_):
    torch.manual_seed(rows * 7 + d + k)
    x = torch.randn(rows, d, device="cuda").to(dtype)
    values, indices = flashinfer.top_k(x, k, sorted=sorted_)
    check_top_k(x, values, indices, k, TopKTieBreak.SMALL, sorted_)
    if sorted_ and dtype == torch.float32:  # distinct values: exactly torch.topk
        v, _ = torch.topk(x, k, dim=-1)
        assert torch.equal(values, v)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tie", list(TopKTieBreak))
@pytest.mark.parametrize("d,k,levels", [(1000, 37, 3), (4097, 1000, 8), (128256, 50, 8),
                                        (128256, 2048, 2), (65536, 3000, 5), (300, 7, 1)])
@pytest.mark.parametrize("sorted_", [False, True])
def test_top_k_ties(dtype, tie, d, k, levels, sorted_):
    torch.manual_seed(d + k + levels)
    x = torch.randint(0, levels, (3, d), device="cuda").to(dtype)
    values, indices = flashinfer.top_k(x, k, sorted=sorted_, tie_break=tie)
    check_top_k(x, values, indices, k, int(tie), sorted_)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["ascending", "descending"])
@pytest.mark.parametrize("d,k", [(65536, 2048), (128256, 50), (20000, 700)])
def test_top_k_unrepresentative_first_tile(dtype, order, d, k):
    # The stash bin is chosen from the row's first tile; sorted rows make that sample wrong in
    # both directions (stash overflow; threshold below the stash), so the ordered walks run.
    torch.manual_seed(d + k)
    x = torch.sort(torch.randn(3, d, device="cuda"), dim=-1,
                   descending=order == "descending").values.to(dtype)
    for sorted_ in (False, True):
        values, indices = flashinfer.top_k(x, k, sorted=sorted_)
        check_top_k(x, values, indices, k, TopKTieBreak.SMALL, sorted_)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tie", [TopKTieBreak.SMALL, TopKTieBreak.LARGE])
@pytest.mark.parametrize("rows,d,k,levels,order", [
    (1, 256000, 2048, 0, None), (2, 128256, 50, 0, None), (4, 65536, 2048, 0, None),
    (3, 128256, 2048, 6, None), (1, 70001, 1, 0, None), (2, 65536, 2048, 0, "ascending"),
    (1, 100000, 3000, 0, None), (5, 16384, 100, 0, None)])
def test_top_k_cluster_rows_match_single_cta_rows(dtype, tie, rows, d, k, levels, order):
    # A few long rows take a cluster of CTAs a row on SM90 (the rows' chunks walked apart, the
    # stashes gathered by rank 0); 200 rows take one CTA a row. Both give the same results, bit
    # for bit, whatever path each row takes inside (stash, ordered walks, rank 0 alone).
    torch.manual_seed(rows + d + k + levels)
    if levels:
        x = torch.randint(0, levels, (rows, d), device="cuda").to(dtype)
    else:
        x = torch.randn(rows, d, device="cuda").to(dtype)
    if order:
        x = torch.sort(x, dim=-1).values
    many = x.repeat((200 + rows - 1) // rows, 1)[:200]
    for sorted_ in (False, True):
        v1, i1 = flashinfer.top_k(x, k, sorted=sorted_, tie_break=tie)
        v2, i2 = flashinfer.top_k(many, k, sorted=sorted_, tie_break=tie)
        check_top_k(x, v1, i1, k, int(tie), sorted_)
        assert torch.equal(i1, i2[:rows]) and torch.equal(v1, v2[:rows])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,k", [(6, 2), (7, 7), (9, 3)])
def test_top_k_rows_shorter_than_a_vector(dtype, d, k):
    torch.manual_seed(d)
    x = torch.randn(5, d, device="cuda").to(dtype)
    values, indices = flashinfer.top_k(x, k, sorted=True)
    check_top_k(x, values, indices, k, TopKTieBreak.SMALL, True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_specials(dtype):
    torch.manual_seed(0)
    x = torch.randn(6, 5003, device="cuda").to(dtype)
    x[:, ::7] = float("-inf")
    x[0, 5] = x[1, 100] = x[2, 4000] = float("nan")
    x[3, 11] = float("inf")
    x[4] = float("-inf")  # a row of -inf only
    x[5, ::2] = -0.0
    x[5, 1::2] = 0.0
    for k in (1, 3, 600):
        values, indices = flashinfer.top_k(x, k, sorted=True)
        check_top_k(x, values, indices, k, TopKTieBreak.SMALL, True)
    assert torch.isnan(values[0, 0]) and indices[0, 0] == 5  # NaN is the largest


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_strided_rows_and_k_equal_d(dtype):
    torch.manual_seed(1)
    base = torch.randn(9, 3001, device="cuda").to(dtype)
    for x in (base[:, 1:], base[:, 3:2999], base[::2, :]):
        for k in (1, 77, x.shape[1]):
            values, indices = flashinfer.top_k(x, k, sorted=k <= 2048)
            check_top_k(x, values, indices, k, TopKTieBreak.SMALL, k <= 2048)


@pytest.mark.gpu
def test_top_k_deterministic_and_graph():
    torch.manual_seed(2)
    x = torch.randn(64, 65536, device="cuda")
    a = flashinfer.top_k(x, 2048, deterministic=True)
    b = flashinfer.top_k(x, 2048)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    static = x.clone()
    flashinfer.top_k(static, 2048, sorted=True, dsa_graph_safe=True)  # compile outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        vals, idx = flashinfer.top_k(static, 2048, sorted=True, dsa_graph_safe=True)
    for seed in (3, 4):
        torch.manual_seed(seed)
        static.copy_(torch.randn_like(static))
        g.replay()
        torch.cuda.synchronize()
        check_top_k(static, vals, idx, 2048, TopKTieBreak.SMALL, True)


@pytest.mark.gpu
def test_top_k_empty_batch():
    x = torch.randn(0, 100, device="cuda")
    v, i = flashinfer.top_k(x, 5)
    assert v.shape == i.shape == (0, 5)


# ---------------------------------------------------------------------------------------------
# GPU: the transforms


def _windows(rows, max_len, k, device):
    g = torch.Generator().manual_seed(rows + max_len + k)
    lengths = torch.randint(0, max_len + 1, (rows,), generator=g)
    lengths[0], lengths[-1] = max_len, min(k, max_len)  # a full row, a row of exactly k
    if rows > 2:
        lengths[1] = 0
    starts = (torch.rand(rows, generator=g) * (max_len - lengths + 1)).long().clamp(min=0)
    return lengths.int().to(device), starts.int().to(device)


def _ref_rows(x, lengths, starts, k, tie):
    """Per row: the selected local indices (a sorted list) or the ordered 0..len-1."""
    out = []
    for i in range(x.shape[0]):
        n, s = int(lengths[i]), int(starts[i])
        if n <= k:
            out.append(list(range(n)))
        else:
            sel = ref_indices(x[i : i + 1, s : s + n], k, tie)[0]
            out.append(sorted(sel.tolist()))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,max_len,k", [(5, 300, 64), (9, 4096, 256), (4, 65536, 2048),
                                            (3, 100, 200), (6, 20000, 2500)])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("tie", [TopKTieBreak.NONE, TopKTieBreak.LARGE])
def test_page_table_transform(dtype, rows, max_len, k, page_size, tie):
    torch.manual_seed(rows + max_len)
    x = torch.randn(rows, max_len, device="cuda").to(dtype)
    if tie == TopKTieBreak.LARGE:
        x = torch.randint(0, 4, x.shape, device="cuda").to(dtype)
    lengths, starts = _windows(rows, max_len, k, "cuda")
    batch = 3
    cols = max_len // page_size + 2
    table = torch.randint(0, 1 << 16, (batch, cols), device="cuda", dtype=torch.int32)
    r2b = torch.randint(0, batch, (rows,), device="cuda", dtype=torch.int32)
    pt_starts = torch.randint(0, 2, (rows,), device="cuda", dtype=torch.int32)
    raw = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    out = flashinfer.top_k_page_table_transform(
        x, table, lengths, k, row_to_batch=r2b, tie_break=tie, row_starts=starts,
        page_table_row_starts=pt_starts, page_size=page_size, out_raw_indices=raw)
    want = _ref_rows(x, lengths, starts, k, int(tie))
    for i, sel in enumerate(want):
        n = len(sel)
        got_raw = raw[i, :n].tolist()
        if int(lengths[i]) <= k:
            assert got_raw == sel
        else:
            assert sorted(got_raw) == sel
        assert (raw[i, n:] == -1).all() and (out[i, n:] == -1).all()
        b, p0 = int(r2b[i]), int(pt_starts[i])
        idx = torch.tensor(got_raw, dtype=torch.int64)
        pages = table[b].cpu()[p0 + idx // page_size].long()
        assert out[i, :n].cpu().long().tolist() == (pages * page_size + idx % page_size).tolist()


@pytest.mark.gpu
def test_page_table_transform_defaults():
    torch.manual_seed(5)
    x = torch.randn(8, 4096, device="cuda", dtype=torch.float16)
    table = torch.randint(0, 1000, (8, 4096), device="cuda", dtype=torch.int32)
    lengths = torch.full((8,), 4096, device="cuda", dtype=torch.int32)
    out = flashinfer.top_k_page_table_transform(x, table, lengths, 256)
    sel = ref_indices(x, 256, 1)
    want = torch.sort(torch.gather(table, 1, sel), dim=-1).values
    # table entries may repeat: compare the gathered multisets
    assert torch.equal(torch.sort(out, dim=-1).values, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,max_len,k", [(5, 300, 64), (64, 65536, 2048), (3, 100, 200),
                                            (2, 128256, 3000)])
def test_ragged_transform(dtype, rows, max_len, k):
    torch.manual_seed(rows + k)
    x = torch.randn(rows, max_len, device="cuda").to(dtype)
    lengths, starts = _windows(rows, max_len, k, "cuda")
    offsets = torch.randint(0, 1 << 20, (rows,), device="cuda", dtype=torch.int32)
    for row_starts in (None, starts):
        s = torch.zeros_like(starts) if row_starts is None else starts
        out = flashinfer.top_k_ragged_transform(x, offsets, lengths, k, row_starts=row_starts)
        want = _ref_rows(x, lengths, s, k, 1)
        for i, sel in enumerate(want):
            n = len(sel)
            got = (out[i, :n] - offsets[i]).tolist()
            assert (got if int(lengths[i]) <= k else sorted(got)) == sel
            assert (out[i, n:] == -1).all()


@pytest.mark.gpu
def test_transforms_under_cuda_graph():
    torch.manual_seed(6)
    rows, max_len, k = 16, 65536, 2048
    x = torch.randn(rows, max_len, device="cuda")
    lengths = torch.randint(1, max_len + 1, (rows,), device="cuda", dtype=torch.int32)
    offsets = torch.arange(rows, device="cuda", dtype=torch.int32) * max_len
    table = torch.arange(max_len, device="cuda", dtype=torch.int32).repeat(rows, 1) * 3
    flashinfer.top_k_ragged_transform(x, offsets, lengths, k)
    out_pt = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_r = flashinfer.top_k_ragged_transform(x, offsets, lengths, k, dsa_graph_safe=True)
        flashinfer.top_k_page_table_transform(x, table, lengths, k, out=out_pt,
                                              dsa_graph_safe=True)
    for seed in (7, 8):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x))
        lengths.copy_(torch.randint(1, max_len + 1, (rows,), device="cuda", dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        want = _ref_rows(x, lengths, torch.zeros_like(lengths), k, 1)
        for i, sel in enumerate(want):
            n = len(sel)
            got = (out_r[i, :n] - offsets[i]).tolist()
            assert (got if int(lengths[i]) <= k else sorted(got)) == sel
            assert (out_pt[i, :n].long() == (out_r[i, :n].long() - int(offsets[i])) * 3).all()


# ---------------------------------------------------------------------------------------------
# CPU: validation, raised before anything compiles


@pytest.fixture
def no_compile(monkeypatch):
    def boom():
        raise AssertionError("the module must not be built for a bad call")

    monkeypatch.setattr(topk_mod, "get_topk_module", boom)


def test_names_and_tie_break_enum():
    assert flashinfer.top_k is topk_mod.top_k is topk_mod.topk
    assert flashinfer.TopKTieBreak is TopKTieBreak
    assert flashinfer.top_k_page_table_transform is topk_mod.top_k_page_table_transform
    assert flashinfer.top_k_ragged_transform is topk_mod.top_k_ragged_transform
    assert [int(t) for t in TopKTieBreak] == [0, 1, 2]
    assert TopKTieBreak.SMALLER is TopKTieBreak.SMALL and TopKTieBreak.LARGER is TopKTieBreak.LARGE
    assert f"{TopKTieBreak.LARGE}" == "large" and repr(TopKTieBreak.NONE) == "TopKTieBreak.NONE"


X = torch.randn(4, 100)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(input=X.int(), k=3), ValueError, "input must be float16 or bfloat16 or float32"),
        (dict(input=X.double(), k=3), ValueError, "input must be float16"),
        (dict(input=X[0], k=3), ValueError, "input must be 2-D"),
        (dict(input=X[None], k=3), ValueError, "input must be 2-D"),
        (dict(input=X.t(), k=3), ValueError, "contiguous in its last dimension"),
        (dict(input=X, k=3), ValueError, "must be a CUDA tensor"),
        (dict(input=X, k=0), ValueError, "k must be a positive int"),
        (dict(input=X, k=-2), ValueError, "k must be a positive int"),
        (dict(input=X, k=101), ValueError, r"k must be at most input.shape\[1\] \(100\)"),
        (dict(input=X, k=2.0), TypeError, "k must be an int"),
        (dict(input=X, k=3, tie_break=3), ValueError, "tie_break must be 0"),
        (dict(input=X, k=3, tie_break="small"), TypeError, "tie_break must be an int"),
        (dict(input=X, k=3, sorted="yes"), TypeError, "sorted must be a bool"),
        (dict(input=X, k=3, deterministic=None), TypeError, "deterministic must be a bool"),
        (dict(input=X, k=3, dsa_graph_safe=1), TypeError, "dsa_graph_safe must be a bool"),
        (dict(input=[[1.0]], k=1), TypeError, "input must be a torch.Tensor"),
    ],
)
def test_top_k_validation(no_compile, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        flashinfer.top_k(**kwargs)


def test_top_k_unknown_keyword(no_compile):
    with pytest.raises(TypeError):
        flashinfer.top_k(X, 3, largest=True)


L4 = torch.full((4,), 100, dtype=torch.int32)
PT = torch.zeros(4, 100, dtype=torch.int32)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(lengths=L4[:3]), ValueError, r"lengths must have shape \(4,\)"),
        (dict(lengths=L4.long()), ValueError, "lengths must be int32"),
        (dict(lengths=L4[None]), ValueError, "lengths must be 1-D"),
        (dict(src_page_table=PT.long()), ValueError, "src_page_table must be int32"),
        (dict(src_page_table=PT[0]), ValueError, "src_page_table must be 2-D"),
        (dict(row_to_batch=L4[:2]), ValueError, r"row_to_batch must have shape \(4,\)"),
        (dict(row_starts=L4.float()), ValueError, "row_starts must be int32"),
        (dict(page_table_row_starts=L4[:1]), ValueError, "page_table_row_starts must have"),
        (dict(page_size=3), ValueError, "page_size must be a positive power of two"),
        (dict(page_size=0), ValueError, "page_size must be a positive power of two"),
        (dict(page_size=16, row_starts=L4), ValueError, "page_table_row_starts is required"),
        (dict(out=torch.empty(4, 7, dtype=torch.int32)), ValueError, r"out must have shape"),
        (dict(out=torch.empty(4, 8, dtype=torch.int64)), ValueError, "out must be int32"),
        (dict(out=torch.empty(8, 4, dtype=torch.int32).t()), ValueError, "out must be contiguous"),
        (dict(out_raw_indices=torch.empty(3, 8, dtype=torch.int32)), ValueError,
         "out_raw_indices must have shape"),
        (dict(k=0), ValueError, "k must be a positive int"),
        (dict(tie_break=-1), ValueError, "tie_break must be 0"),
        (dict(input=X.long()), ValueError, "input must be float16"),
        (dict(), ValueError, "must be a CUDA tensor"),
    ],
)
def test_page_table_transform_validation(no_compile, kwargs, exc, match):
    args = dict(input=X, src_page_table=PT, lengths=L4, k=8)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        flashinfer.top_k_page_table_transform(**args)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(offsets=L4[:3]), ValueError, r"offsets must have shape \(4,\)"),
        (dict(offsets=L4.long()), ValueError, "offsets must be int32"),
        (dict(lengths=torch.full((5,), 3, dtype=torch.int32)), ValueError,
         r"lengths must have shape \(4,\)"),
        (dict(row_starts=L4[None]), ValueError, "row_starts must be 1-D"),
        (dict(input=X[0]), ValueError, "input must be 2-D"),
        (dict(k=-1), ValueError, "k must be a positive int"),
        (dict(), ValueError, "must be a CUDA tensor"),
    ],
)
def test_ragged_transform_validation(no_compile, kwargs, exc, match):
    args = dict(input=X, offsets=L4, lengths=L4, k=8)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        flashinfer.top_k_ragged_transform(**args)


def test_oracle_orders_nan_and_signed_zero():
    x = torch.tensor([[0.0, -0.0, float("nan"), float("inf"), -1.0, float("-inf")]])
    assert ref_indices(x, 6, 1).tolist() == [[2, 3, 0, 1, 4, 5]]
    assert ref_indices(x, 6, 2).tolist() == [[2, 3, 1, 0, 4, 5]]

"""flashinfer.page: append_paged_kv_cache, get_batch_indices_positions, get_seq_lens, and the
paged-cache unpacking shared with the attention wrappers.

The append is a copy, so results are compared bit for bit with a plain-torch scatter, over the
whole cache (a stray write anywhere fails the test). Shapes cover both layouts and both cache
forms (one 5-D tensor; a (k, v) tuple whose K and V have different strides), page sizes 1 to
64, odd head counts, head dims on the 16-byte path and off it, strided appended rows, empty
requests, batch 1, and padding rows (batch index -1).
"""

from __future__ import annotations

import inspect

import pytest
import torch

import flashinfer
import flashinfer.page as page

# ---------------------------------------------------------------------------------------------
# Reference and batch construction


def make_batch(seq_lens, append_lens, page_size, spare_pages=3, device="cuda", seed=0):
    """Page table of requests that hold seq_lens[b] tokens after appending append_lens[b].

    Pages are a random permutation of num_pages (with spare pages nobody owns), so page order
    differs from request order. Returns (kv_indptr, kv_indices, kv_last_page_len, append_indptr,
    num_pages), int32 on `device`.
    """
    g = torch.Generator().manual_seed(seed)
    pages = [(n + page_size - 1) // page_size for n in seq_lens]
    num_pages = sum(pages) + spare_pages
    perm = torch.randperm(num_pages, generator=g)[: sum(pages)]
    kv_indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()), dtype=torch.int32)
    last = [0 if n == 0 else (n - 1) % page_size + 1 for n in seq_lens]
    append_indptr = torch.tensor([0] + list(torch.tensor(append_lens).cumsum(0).tolist()),
                                 dtype=torch.int32)
    to = dict(device=device)
    return (kv_indptr.to(**to), perm.to(torch.int32).to(**to),
            torch.tensor(last, dtype=torch.int32, **to), append_indptr.to(**to), num_pages)


def ref_batch_indices_positions(append_indptr, seq_lens, nnz):
    bi = torch.full((nnz,), -1, dtype=torch.int32)
    pos = torch.zeros(nnz, dtype=torch.int32)
    ind = append_indptr.cpu().tolist()
    sl = seq_lens.cpu().tolist()
    for b in range(len(ind) - 1):
        n = ind[b + 1] - ind[b]
        for i in range(n):
            bi[ind[b] + i] = b
            pos[ind[b] + i] = sl[b] - n + i
    return bi, pos


def ref_append(key, value, bi, pos, k_cache, v_cache, kv_indices, kv_indptr, layout):
    """Scatter into copies of the caches, as bit patterns (so fp8 works too); rows with a
    negative batch index are skipped."""
    k_ref, v_ref = bits(k_cache).clone(), bits(v_cache).clone()
    keep = (bi >= 0).cpu()
    b = bi.cpu()[keep].long()
    p = pos.cpu()[keep].long()
    page_size = k_cache.shape[1] if layout == "NHD" else k_cache.shape[2]
    pages = kv_indices.cpu().long()[kv_indptr.cpu().long()[b] + p // page_size].to(key.device)
    slots = (p % page_size).to(key.device)
    keep = keep.to(key.device)
    for ref, rows in ((k_ref, bits(key)[keep]), (v_ref, bits(value)[keep])):
        if layout == "NHD":
            ref[pages, slots] = rows
        else:
            ref[pages, :, slots] = rows
    return k_ref, v_ref


def rand(shape, dtype, device="cuda"):
    x = torch.randn(shape, device=device)
    return x.to(dtype)


def bits(x):
    """The bit pattern as integers, so fp8 compares (and scatters) exactly."""
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()])


# ---------------------------------------------------------------------------------------------
# API surface and validation (CPU; nothing compiles)


@pytest.fixture
def no_compile(monkeypatch):
    def refuse():
        raise RuntimeError("validation must fail before the module is built")

    monkeypatch.setattr(page, "get_page_module", refuse)


NAMES = ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"]


def test_both_import_paths():
    for name in NAMES:
        assert getattr(flashinfer, name) is getattr(page, name)


def test_signatures_match_the_contract():
    def params(f):
        return [(p.name, p.default) for p in inspect.signature(f).parameters.values()]

    E = inspect.Parameter.empty
    assert params(page.append_paged_kv_cache) == [
        ("append_key", E), ("append_value", E), ("batch_indices", E), ("positions", E),
        ("paged_kv_cache", E), ("kv_indices", E), ("kv_indptr", E), ("kv_last_page_len", E),
        ("kv_layout", "NHD"),
    ]
    assert params(page.get_batch_indices_positions) == [
        ("append_indptr", E), ("seq_lens", E), ("nnz", E), ("batch_indices", None),
        ("positions", None),
    ]
    assert params(page.get_seq_lens) == [("kv_indptr", E), ("kv_last_page_len", E),
                                         ("page_size", E)]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_unpack_one_tensor(layout):
    shape = (6, 2, 16, 4, 8) if layout == "NHD" else (6, 2, 4, 16, 8)
    x = torch.randn(shape)
    k, v = page._unpack_paged_kv_cache(x, layout)
    assert k.shape == v.shape == shape[:1] + shape[2:]
    assert k.data_ptr() == x.data_ptr() and torch.equal(k, x[:, 0]) and torch.equal(v, x[:, 1])
    assert page._paged_kv_dims(k, layout) == (6, 16, 4, 8)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_unpack_tuple_keeps_different_strides(layout):
    base_k = torch.randn(6, 16, 4, 8)
    base_v = torch.randn(12, 16, 4, 16)
    k, v = base_k, base_v[::2, ..., :8]  # V: every other page, a slice of wider rows
    if layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    for arg in ((k, v), [k, v]):
        k2, v2 = page._unpack_paged_kv_cache(arg, layout)
        assert k2 is k and v2 is v
    assert page._paged_kv_dims(v, layout) == (6, 16, 4, 8)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_unpack_missing_page_dim_means_page_size_1(layout):
    x = torch.randn(5, 2, 3, 8)
    k, v = page._unpack_paged_kv_cache(x, layout)
    assert page._paged_kv_dims(k, layout) == (5, 1, 3, 8)
    assert torch.equal(k.reshape(5, 3, 8), x[:, 0]) and torch.equal(v.reshape(5, 3, 8), x[:, 1])
    k3, v3 = torch.randn(5, 3, 8), torch.randn(5, 3, 8)
    k, v = page._unpack_paged_kv_cache((k3, v3), layout)
    assert page._paged_kv_dims(k, layout) == (5, 1, 3, 8)
    assert k.data_ptr() == k3.data_ptr() and torch.equal(v.reshape(5, 3, 8), v3)


def test_unpack_errors():
    x = torch.randn(4, 2, 16, 2, 8)
    for bad in ("nhd", "NDH", None, 0):
        with pytest.raises(KeyError, match="kv_layout"):
            page._unpack_paged_kv_cache(x, bad)
    with pytest.raises(ValueError, match="5-D"):
        page._unpack_paged_kv_cache(torch.randn(4, 3, 16, 2, 8), "NHD")
    with pytest.raises(ValueError, match="5-D"):
        page._unpack_paged_kv_cache(torch.randn(4, 2, 16, 2, 8, 1), "NHD")
    with pytest.raises(ValueError, match="5-D"):
        page._unpack_paged_kv_cache(torch.randn(8, 2), "NHD")
    with pytest.raises(ValueError, match=r"\(k_cache, v_cache\)"):
        page._unpack_paged_kv_cache((x[:, 0], x[:, 1], x[:, 1]), "NHD")
    with pytest.raises(TypeError, match="paged_kv_cache"):
        page._unpack_paged_kv_cache("cache", "NHD")
    with pytest.raises(TypeError, match="k_cache"):
        page._unpack_paged_kv_cache((1, x[:, 1]), "NHD")
    with pytest.raises(ValueError, match="k_cache must be 4-D"):
        page._unpack_paged_kv_cache((torch.randn(4, 8), x[:, 1]), "NHD")
    with pytest.raises(ValueError, match="same rank and number of pages"):
        page._unpack_paged_kv_cache((x[:, 0], x[:3, 1]), "NHD")
    with pytest.raises(ValueError, match="same rank and number of pages"):
        page._unpack_paged_kv_cache((x[:, 0], x[:, 1, 0]), "NHD")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_get_seq_lens_cpu(dtype):
    kv_indptr = torch.tensor([0, 3, 4, 4, 9], dtype=dtype)
    last = torch.tensor([13, 8, 0, 16], dtype=dtype)
    got = page.get_seq_lens(kv_indptr, last, 16)
    assert got.dtype == dtype
    assert got.tolist() == [45, 8, 0, 4 * 16 + 16]
    with pytest.raises(ValueError, match="kv_last_page_len must have shape"):
        page.get_seq_lens(kv_indptr, last[:3], 16)


def test_get_seq_lens_rejects_bad_metadata():
    """Values are checked where they are host data; the page size always."""
    kv_indptr = torch.tensor([0, 3, 4, 4], dtype=torch.int32)
    last = torch.tensor([13, 8, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"kv_indptr must be non-decreasing, got kv_indptr\[1\] "
                                         r"= 3 > kv_indptr\[2\] = 2"):
        page.get_seq_lens(torch.tensor([0, 3, 2, 4], dtype=torch.int32), last, 16)
    with pytest.raises(ValueError, match=r"kv_last_page_len must be in \[0, page_size=16\], got "
                                         r"kv_last_page_len\[1\] = 17"):
        page.get_seq_lens(kv_indptr, torch.tensor([13, 17, 0], dtype=torch.int32), 16)
    with pytest.raises(ValueError, match=r"kv_last_page_len\[0\] = -1"):
        page.get_seq_lens(kv_indptr, torch.tensor([-1, 8, 0], dtype=torch.int32), 16)
    for bad in (0, -16, True, 16.0, "16"):
        with pytest.raises(ValueError, match="page_size must be a positive int"):
            page.get_seq_lens(kv_indptr, last, bad)
    # the edges stay legal: a full last page, an empty request, an integer type other than int
    assert page.get_seq_lens(kv_indptr, torch.tensor([16, 1, 0], dtype=torch.int32),
                             torch.tensor(16).item()).tolist() == [48, 1, 0]
    assert page.get_seq_lens(kv_indptr[:1], last[:0], 16).tolist() == []


def test_get_batch_indices_positions_validation(no_compile):
    f = page.get_batch_indices_positions
    indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
    seq = torch.tensor([4, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="CUDA"):
        f(indptr, seq, 5)
    with pytest.raises(ValueError, match="append_indptr must be int32 or int64"):
        f(indptr.float(), seq, 5)
    with pytest.raises(ValueError, match=r"append_indptr must have batch_size \+ 1 >= 1"):
        f(indptr[:0], seq[:0], 5)
    with pytest.raises(ValueError, match="seq_lens must have shape"):
        f(indptr, seq[:1], 5)
    with pytest.raises(ValueError, match="seq_lens must be int32 or int64"):
        f(indptr, seq.float(), 5)
    with pytest.raises(TypeError, match="seq_lens must be a torch.Tensor"):
        f(indptr, [4, 5], 5)
    for bad in (-1, 2.5, "5", True):
        with pytest.raises(ValueError, match="nnz"):
            f(indptr, seq, bad)
    with pytest.raises(ValueError, match=r"batch_indices must have shape \(5,\)"):
        f(indptr, seq, 5, batch_indices=torch.empty(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="positions must be int32"):
        f(indptr, seq, 5, positions=torch.empty(5, dtype=torch.int64))
    with pytest.raises(ValueError, match="batch_indices must be on cpu"):
        f(indptr, seq, 5, batch_indices=torch.empty(5, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="positions must be contiguous"):
        f(indptr, seq, 5, positions=torch.empty(10, dtype=torch.int32)[::2])


def cpu_append_args(layout="NHD", dtype=torch.float16, nnz=5, heads=2, dim=8, page_size=4):
    key = torch.randn(nnz, heads, dim).to(dtype)
    value = torch.randn(nnz, heads, dim).to(dtype)
    shape = (3, 2, page_size, heads, dim) if layout == "NHD" else (3, 2, heads, page_size, dim)
    cache = torch.zeros(shape, dtype=dtype)
    bi = torch.zeros(nnz, dtype=torch.int32)
    pos = torch.arange(nnz, dtype=torch.int32)
    kv_indices = torch.tensor([2, 0], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 2], dtype=torch.int32)
    last = torch.tensor([1], dtype=torch.int32)
    return [key, value, bi, pos, cache, kv_indices, kv_indptr, last]


def test_append_validation(no_compile):
    f = page.append_paged_kv_cache
    a = cpu_append_args()
    with pytest.raises(ValueError, match="CUDA"):
        f(*a)
    with pytest.raises(KeyError, match="kv_layout"):
        f(*a, kv_layout="NDH")

    def bad(i, value, match, exc=ValueError, **kw):
        args = list(a)
        args[i] = value
        with pytest.raises(exc, match=match):
            f(*args, **kw)

    bad(0, a[0].double(), "append_key must be")
    bad(0, a[0][:, :, None], "append_key must be 3-D")
    bad(1, a[1][:, :1], "append_value must have shape")
    bad(1, a[1].bfloat16(), "append_value must have the dtype of append_key")
    bad(0, a[0].transpose(1, 2).contiguous().transpose(1, 2), "append_key must be contiguous")
    bad(4, a[4].bfloat16(), "k_cache must have the dtype of append_key")
    bad(4, a[4][:, :, :, :1], "k_cache must have page_size 4, num_heads 2")
    bad(4, a[4][..., :4], "head_dim 8")
    bad(4, (a[4][:, 0], a[4][:, 1, :, :1]), "v_cache must have page_size 4, num_heads 2")
    bad(4, (a[4][:, 0], a[4][:, 1, :2]), "v_cache must have page_size 4")
    bad(4, torch.zeros(3, 2, 4, 2, 16, dtype=torch.float16)[..., ::2],
        "k_cache must be contiguous in its last dimension")
    bad(4, torch.zeros(3, 3, 4, 2, 8, dtype=torch.float16), "5-D")
    bad(4, "cache", "paged_kv_cache", exc=TypeError)
    bad(2, a[2][:4], r"batch_indices must have shape \(5,\)")
    bad(2, a[2].float(), "batch_indices must be int32 or int64")
    bad(3, a[3][:, None], "positions must be 1-D")
    bad(6, a[6][:0], r"kv_indptr must have batch_size \+ 1 >= 1")
    bad(7, torch.tensor([1, 1], dtype=torch.int32), r"kv_last_page_len must have shape \(1,\)")
    bad(5, a[5].to(device="meta"), "kv_indices must be on cpu")
    # HND reads heads from dim 2 of the page: an NHD-shaped cache with page != heads fails.
    with pytest.raises(ValueError, match="kv_layout='HND'"):
        f(*a, kv_layout="HND")


# ---------------------------------------------------------------------------------------------
# Build (CPU machine with nvcc)


@pytest.mark.nvcc
def test_module_builds():
    mod = page.get_page_module()
    for name in ("append_paged_kv_cache", "get_batch_indices_positions"):
        assert callable(getattr(mod, name))


# ---------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "seq_lens,append_lens,pad",
    [
        ([5], [5], 0),  # batch 1, all new
        ([5, 5, 5, 5], [1, 2, 3, 4], 0),  # FlashInfer's docstring example
        ([45, 8, 25, 22], [45, 8, 25, 22], 0),
        ([7, 0, 130, 3, 0, 64], [2, 0, 17, 3, 0, 1], 6),  # empty requests, padding entries
        ([1000] * 37, [1] * 37, 0),  # decode
    ],
)
@pytest.mark.parametrize("idtype", [torch.int32, torch.int64])
def test_get_batch_indices_positions(seq_lens, append_lens, pad, idtype):
    append_indptr = torch.tensor([0] + torch.tensor(append_lens).cumsum(0).tolist(),
                                 dtype=idtype, device="cuda")
    seq = torch.tensor(seq_lens, dtype=idtype, device="cuda")
    nnz = sum(append_lens) + pad
    bi, pos = flashinfer.get_batch_indices_positions(append_indptr, seq, nnz)
    want_bi, want_pos = ref_batch_indices_positions(append_indptr, seq, nnz)
    assert bi.dtype == pos.dtype == torch.int32 and bi.shape == pos.shape == (nnz,)
    assert torch.equal(bi.cpu(), want_bi)
    assert torch.equal(pos.cpu(), want_pos)


@pytest.mark.gpu
def test_get_batch_indices_positions_preallocated():
    append_indptr = torch.tensor([0, 3, 3, 7], dtype=torch.int32, device="cuda")
    seq = torch.tensor([10, 4, 4], dtype=torch.int32, device="cuda")
    bi = torch.full((9,), 77, dtype=torch.int32, device="cuda")
    pos = torch.full((9,), 55, dtype=torch.int32, device="cuda")
    got_bi, got_pos = flashinfer.get_batch_indices_positions(append_indptr, seq, 9, bi, pos)
    assert got_bi is bi and got_pos is pos
    assert bi.tolist() == [0, 0, 0, 2, 2, 2, 2, -1, -1]
    # Given positions keep their old values in unused slots.
    assert pos.tolist() == [7, 8, 9, 0, 1, 2, 3, 55, 55]
    # A large batch: the binary search over append_indptr.
    lens = torch.randint(0, 9, (3000,))
    append_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).cuda()
    seq = (lens + torch.randint(0, 100, (3000,))).cuda()
    nnz = int(lens.sum())
    got = flashinfer.get_batch_indices_positions(append_indptr, seq, nnz)
    want = ref_batch_indices_positions(append_indptr, seq, nnz)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@pytest.mark.gpu
def test_get_seq_lens_gpu():
    kv_indptr = torch.tensor([0, 3, 4, 4], dtype=torch.int32, device="cuda")
    last = torch.tensor([13, 8, 0], dtype=torch.int32, device="cuda")
    got = flashinfer.get_seq_lens(kv_indptr, last, 16)
    assert got.device.type == "cuda" and got.tolist() == [45, 8, 0]


def cache_views(form, layout, num_pages, page_size, heads, dim, dtype):
    """(paged_kv_cache argument, k view, v view) filled with random data."""
    inner = (page_size, heads, dim) if layout == "NHD" else (heads, page_size, dim)
    if form == "tensor":
        x = rand((num_pages, 2) + inner, dtype)
        return x, x[:, 0], x[:, 1]
    if form == "tuple":
        k, v = rand((num_pages,) + inner, dtype), rand((num_pages,) + inner, dtype)
        return (k, v), k, v
    if form == "tuple-strided":
        # K: pages interleaved with unused ones. V: pages not outermost in memory, rows cut out
        # of a wider head dim (for fp8 the 8-element offset also leaves the 16-byte path).
        k = rand((2 * num_pages,) + inner, dtype)[::2]
        base = rand(inner[:-1] + (num_pages, dim + 24), dtype)
        v = base[..., 8:8 + dim].permute(2, 0, 1, 3)
        return (k, v), k, v
    if form == "no-page-dim":
        assert page_size == 1
        x = rand((num_pages, 2, heads, dim), dtype)
        k, v = page._unpack_paged_kv_cache(x, layout)
        return x, k, v
    raise AssertionError(form)


def run_append_case(layout, form, page_size, heads, dim, dtype, seq_lens, append_lens,
                    key_layout="contiguous", pad=0, seed=0):
    torch.manual_seed(seed)
    kv_indptr, kv_indices, last, append_indptr, num_pages = make_batch(
        seq_lens, append_lens, page_size, seed=seed)
    nnz = int(append_indptr[-1])
    seq = page.get_seq_lens(kv_indptr, last, page_size)
    assert seq.tolist() == list(seq_lens)
    bi, pos = flashinfer.get_batch_indices_positions(append_indptr, seq, nnz + pad)
    if key_layout == "contiguous":
        key, value = rand((nnz + pad, heads, dim), dtype), rand((nnz + pad, heads, dim), dtype)
    else:  # slices of a packed qkv tensor: q heads, then k, then v
        qkv = rand((nnz + pad, 3 * heads + 1, dim), dtype)
        key, value = qkv[:, heads + 1:2 * heads + 1], qkv[:, 2 * heads + 1:]
    cache, k_view, v_view = cache_views(form, layout, num_pages, page_size, heads, dim, dtype)
    k_ref, v_ref = ref_append(key, value, bi, pos, k_view, v_view, kv_indices, kv_indptr, layout)
    assert flashinfer.append_paged_kv_cache(key, value, bi, pos, cache, kv_indices, kv_indptr,
                                            last, layout) is None
    assert torch.equal(bits(k_view), k_ref)
    assert torch.equal(bits(v_view), v_ref)


BATCHES = [
    ([9], [9]),  # batch 1, prefill of a fresh request
    ([17, 0, 40, 1], [17, 0, 5, 1]),  # empty request; partial appends
    ([100, 33, 64, 7, 250], [1, 1, 1, 1, 1]),  # decode
]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["tensor", "tuple", "tuple-strided"])
@pytest.mark.parametrize("page_size", [1, 5, 16, 64])
@pytest.mark.parametrize("seq_lens,append_lens", BATCHES)
def test_append_layouts_forms_pages(layout, form, page_size, seq_lens, append_lens):
    run_append_case(layout, form, page_size, 3, 128, torch.float16, seq_lens, append_lens)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32,
                                   torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("heads,dim", [(1, 64), (8, 128), (5, 256), (7, 33), (2, 12)])
def test_append_dtypes_and_head_shapes(layout, dtype, heads, dim):
    run_append_case(layout, "tuple-strided", 16, heads, dim, dtype, [30, 3, 77], [30, 2, 9])


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_packed_qkv_rows_and_padding(layout):
    run_append_case(layout, "tensor", 16, 4, 128, torch.bfloat16, [20, 50, 1], [20, 3, 1],
                    key_layout="qkv", pad=7)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_missing_page_dim(layout):
    run_append_case(layout, "no-page-dim", 1, 2, 64, torch.float16, [6, 2], [3, 2])


@pytest.mark.gpu
def test_append_int64_metadata_and_large_batch():
    torch.manual_seed(1)
    seq_lens = torch.randint(1, 300, (200,)).tolist()
    append_lens = [min(n, a) for n, a in zip(seq_lens, torch.randint(0, 40, (200,)).tolist())]
    kv_indptr, kv_indices, last, append_indptr, num_pages = make_batch(seq_lens, append_lens, 16)
    seq = page.get_seq_lens(kv_indptr, last, 16)
    nnz = int(append_indptr[-1])
    bi, pos = flashinfer.get_batch_indices_positions(append_indptr.long(), seq.long(), nnz)
    key, value = rand((nnz, 8, 128), torch.bfloat16), rand((nnz, 8, 128), torch.bfloat16)
    cache = rand((num_pages, 2, 8, 16, 128), torch.bfloat16)
    k_ref, v_ref = ref_append(key, value, bi, pos, cache[:, 0], cache[:, 1], kv_indices,
                              kv_indptr, "HND")
    flashinfer.append_paged_kv_cache(key, value, bi.long(), pos.long(), cache,
                                     kv_indices.long(), kv_indptr.long(), last.long(), "HND")
    assert torch.equal(bits(cache[:, 0]), k_ref) and torch.equal(bits(cache[:, 1]), v_ref)


@pytest.mark.gpu
def test_append_skips_rows_outside_the_page_table():
    """Negative batch indices and positions beyond a request's pages are not written."""
    kv_indptr = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    kv_indices = torch.tensor([1], dtype=torch.int32, device="cuda")
    last = torch.tensor([4], dtype=torch.int32, device="cuda")
    cache = torch.zeros(3, 2, 4, 1, 8, dtype=torch.float16, device="cuda")
    key = torch.ones(4, 1, 8, dtype=torch.float16, device="cuda")
    bi = torch.tensor([0, -1, 0, 1], dtype=torch.int32, device="cuda")
    pos = torch.tensor([2, 0, 4, 0], dtype=torch.int32, device="cuda")
    flashinfer.append_paged_kv_cache(key, key, bi, pos, cache, kv_indices, kv_indptr, last)
    written = cache.abs().sum(dim=(1, 3, 4))  # per (page, slot)
    assert written.nonzero().tolist() == [[1, 2]]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["tensor", "tuple"])
def test_append_out_of_range_page_ids_write_nothing_outside_the_cache(layout, form):
    """Page ids past the cache or negative, and an indptr past kv_indices, skip their rows: the
    cache sits between two poisoned guard regions of the same allocation, and only the rows of
    valid ids change."""
    torch.manual_seed(3)
    pages, page_size, heads, dim, guard = 4, 4, 2, 64, 3
    inner = (page_size, heads, dim) if layout == "NHD" else (heads, page_size, dim)
    if form == "tensor":
        full = rand((pages + 2 * guard, 2) + inner, torch.float16)
        cache = full[guard:guard + pages]
        k_view, v_view = cache[:, 0], cache[:, 1]
    else:  # K and V each between guards of their own allocation
        full = rand((2, pages + 2 * guard) + inner, torch.float16)
        k_view, v_view = full[0, guard:guard + pages], full[1, guard:guard + pages]
        cache = (k_view, v_view)
    before = full.clone()
    # request 0: pages [1, pages, -1, 1 << 30] (ids 2-4 bad); request 1: page 2, then its indptr
    # points past kv_indices (5 entries, indptr ends at 7)
    kv_indices = torch.tensor([1, pages, -1, 1 << 30, 2], dtype=torch.int32, device="cuda")
    kv_indptr = torch.tensor([0, 4, 7], dtype=torch.int32, device="cuda")
    last = torch.tensor([page_size, page_size], dtype=torch.int32, device="cuda")
    bi = torch.tensor([0, 0, 0, 0, 1, 1, 1], dtype=torch.int32, device="cuda")
    pos = torch.tensor([1, 5, 9, 13, 2, 6, 10], dtype=torch.int32, device="cuda")
    key, value = rand((7, heads, dim), torch.float16), rand((7, heads, dim), torch.float16)
    flashinfer.append_paged_kv_cache(key, value, bi, pos, cache, kv_indices, kv_indptr, last,
                                     layout)
    torch.cuda.synchronize()
    # only token 0 (page 1, slot 1) and token 4 (page 2, slot 2) are placeable
    want = before.clone()
    if form == "tensor":
        wk, wv = want[guard:guard + pages, 0], want[guard:guard + pages, 1]
    else:
        wk, wv = want[0, guard:guard + pages], want[1, guard:guard + pages]
    for t, (pg, slot) in ((0, (1, 1)), (4, (2, 2))):
        if layout == "NHD":
            wk[pg, slot], wv[pg, slot] = key[t], value[t]
        else:
            wk[pg, :, slot], wv[pg, :, slot] = key[t], value[t]
    assert torch.equal(full, want)  # the guards, every other slot, and the two rows


@pytest.mark.gpu
def test_append_empty_is_a_no_op():
    a = [x.cuda() for x in cpu_append_args(nnz=0)]
    before = a[4].clone()
    assert flashinfer.append_paged_kv_cache(*a) is None
    assert torch.equal(a[4], before)

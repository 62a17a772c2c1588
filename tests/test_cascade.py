"""flashinfer.cascade: merge_state, merge_state_in_place, merge_states, and the split-KV reduction
(MergeStatesVarlen, through flashinfer.attention.merge.merge_states_varlen).

References are float64 from the rounded inputs. LSEs are base 2. Inputs include empty states
(s = -inf, whose v is garbage: inf/NaN must not leak into the result), rows where every state is
empty (v = 0, s = -inf exactly), s of large magnitude, strided v and s, head dims on and off the
16-byte path, odd head counts, and, for the varlen merge, empty rows, rows of 1-2 parts and a
row of 132 parts (the split-KV shape).
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from cascade_ref import poison_empty, rand_lse, ref_merge

import flashinfer
import flashinfer.attention.merge as merge
import flashinfer.cascade as cascade

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# Outputs are convex combinations of the inputs computed in float32 and rounded once.
TOL = {
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
}
LSE_TOL = dict(rtol=1e-5, atol=1e-4)

# ---------------------------------------------------------------------------------------------
# float64 reference: tests/cascade_ref.py


def check(v, s, want_v, want_s):
    torch.testing.assert_close(v.double(), want_v, **TOL[v.dtype])
    torch.testing.assert_close(s.double(), want_s, **LSE_TOL)
    assert not v.isnan().any() and not s.isnan().any()


# ---------------------------------------------------------------------------------------------
# API surface and validation (CPU; nothing compiles)


@pytest.fixture
def no_compile(monkeypatch):
    def refuse():
        raise RuntimeError("validation must fail before the module is built")

    monkeypatch.setattr(merge, "get_cascade_module", refuse)


def test_both_import_paths():
    for name in ("merge_state", "merge_state_in_place", "merge_states"):
        assert getattr(flashinfer, name) is getattr(cascade, name)


def test_signatures_match_the_contract():
    def params(f):
        return [(p.name, p.default) for p in inspect.signature(f).parameters.values()]

    E = inspect.Parameter.empty
    assert params(cascade.merge_state) == [("v_a", E), ("s_a", E), ("v_b", E), ("s_b", E)]
    assert params(cascade.merge_state_in_place) == [
        ("v", E), ("s", E), ("v_other", E), ("s_other", E), ("mask", None)]
    assert params(cascade.merge_states) == [("v", E), ("s", E)]


def test_merge_state_validation(no_compile):
    f = cascade.merge_state
    va, vb = torch.randn(4, 3, 8).half(), torch.randn(4, 3, 8).half()
    sa, sb = torch.randn(4, 3), torch.randn(4, 3)
    with pytest.raises(ValueError, match="CUDA"):
        f(va, sa, vb, sb)
    with pytest.raises(ValueError, match="v_a must be 3-D"):
        f(va[0], sa, vb, sb)
    with pytest.raises(ValueError, match="v_a must be float16 or bfloat16 or float32"):
        f(va.double(), sa, vb, sb)
    with pytest.raises(ValueError, match="v_b must have shape"):
        f(va, sa, vb[:, :2], sb)
    with pytest.raises(ValueError, match="v_b must have the dtype of v_a"):
        f(va, sa, vb.bfloat16(), sb)
    with pytest.raises(ValueError, match="v_a must be contiguous in its last dimension"):
        f(va.transpose(1, 2).contiguous().transpose(1, 2), sa, vb, sb)
    with pytest.raises(ValueError, match="v_b must be contiguous in its last dimension"):
        f(va, sa, vb.transpose(1, 2).contiguous().transpose(1, 2), sb)
    with pytest.raises(ValueError, match=r"s_a must have shape \(4, 3\)"):
        f(va, sa[:, :2], vb, sb)
    with pytest.raises(ValueError, match=r"s_b must have shape \(4, 3\)"):
        f(va, sa, vb, sb[None])
    with pytest.raises(ValueError, match="s_b must be a floating-point tensor"):
        f(va, sa, vb, sb.int())
    with pytest.raises(ValueError, match="s_a must be on cpu"):
        f(va, sa.to("meta"), vb, sb)
    with pytest.raises(TypeError, match="v_b must be a torch.Tensor"):
        f(va, sa, None, sb)
    with pytest.raises(ValueError, match="head_dim"):
        f(torch.randn(2, 1, 2048).half(), sa[:2, :1], torch.randn(2, 1, 2048).half(), sb[:2, :1])


def test_merge_state_in_place_validation(no_compile):
    f = cascade.merge_state_in_place
    v, vo = torch.randn(4, 3, 8).half(), torch.randn(4, 3, 8).half()
    s, so = torch.randn(4, 3), torch.randn(4, 3)
    mask = torch.ones(4, dtype=torch.bool)
    with pytest.raises(ValueError, match="CUDA"):
        f(v, s, vo, so)
    with pytest.raises(ValueError, match="CUDA"):
        f(v, s, vo, so, mask)
    with pytest.raises(ValueError, match="v_other must have shape"):
        f(v, s, vo[:2], so)
    with pytest.raises(ValueError, match=r"s_other must have shape \(4, 3\)"):
        f(v, s, vo, so.t())
    with pytest.raises(ValueError, match=r"mask must have shape \(4,\)"):
        f(v, s, vo, so, mask[:3])
    with pytest.raises(ValueError, match="mask must be bool"):
        f(v, s, vo, so, mask.int())
    with pytest.raises(ValueError, match="mask must be on cpu"):
        f(v, s, vo, so, mask.to("meta"))


def test_merge_states_validation(no_compile):
    f = cascade.merge_states
    v, s = torch.randn(4, 5, 3, 8).half(), torch.randn(4, 5, 3)
    with pytest.raises(ValueError, match="CUDA"):
        f(v, s)
    with pytest.raises(ValueError, match="v must be 4-D"):
        f(v[0], s)
    with pytest.raises(ValueError, match=r"s must have shape \(4, 5, 3\)"):
        f(v, s[:, :4])
    with pytest.raises(ValueError, match="v must be float16 or bfloat16 or float32"):
        f(v.to(torch.float8_e4m3fn), s)
    with pytest.raises(ValueError, match="v must be contiguous in its last dimension"):
        f(v[..., ::2], s)


def test_merge_states_varlen_validation(no_compile):
    f = merge.merge_states_varlen
    v, s = torch.randn(6, 3, 8), torch.randn(6, 3)
    indptr = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="CUDA"):
        f(v, s, indptr)
    with pytest.raises(ValueError, match="v_part must be contiguous float32"):
        f(v.half(), s, indptr)
    with pytest.raises(ValueError, match="lse_part must have shape"):
        f(v, s[:5], indptr)
    with pytest.raises(ValueError, match="indptr must be int32"):
        f(v, s, indptr.long())
    with pytest.raises(ValueError, match=r"out must have shape \(2, 3, 8\)"):
        f(v, s, indptr, out=torch.empty(3, 3, 8))
    with pytest.raises(ValueError, match="lse must have dtype torch.float32"):
        f(v, s, indptr, lse=torch.empty(2, 3, dtype=torch.float16))


# ---------------------------------------------------------------------------------------------
# Build (CPU machine with nvcc)


@pytest.mark.nvcc
def test_module_builds():
    mod = merge.get_cascade_module()
    for name in ("merge_state", "merge_state_in_place", "merge_states", "merge_states_varlen"):
        assert callable(getattr(mod, name))


# ---------------------------------------------------------------------------------------------
# GPU: merge_state and merge_state_in_place

SHAPES = [
    (1, 1, 64),  # one state
    (7, 3, 128),  # odd heads
    (130, 32, 128),
    (5, 8, 256),
    (9, 5, 80),  # 10 vectors per head row: tiles of 51 states
    (4, 3, 33),  # odd head_dim: one element per access
    (3, 2, 2048 // 4),  # 64 vectors per row
    (2, 1, 1024),  # the longest row
    (1500, 32, 128),  # enough states for full 32-state tiles
    (2048, 27, 80),  # full tiles of 51 states of 10 vectors
    (1, 32, 128),  # one row: states addressed by head alone
    (3, 1, 128),  # one head: states addressed by row alone
]


def make_pair(L, H, D, dtype, empty_frac=0.2, seed=0, **lse_kw):
    torch.manual_seed(seed)
    va = torch.randn(L, H, D, device="cuda").to(dtype)
    vb = torch.randn(L, H, D, device="cuda").to(dtype)
    sa = rand_lse((L, H), empty_frac, seed=seed, **lse_kw)
    sb = rand_lse((L, H), empty_frac, seed=seed + 1, **lse_kw)
    if L > 1:
        sa[0], sb[0] = -math.inf, -math.inf  # a row with nothing visible on either side
    poison_empty(va, sa)
    poison_empty(vb, sb)
    return va, sa, vb, sb


def ref_pair(va, sa, vb, sb):
    return ref_merge(torch.stack([va, vb], 1), torch.stack([sa, sb], 1), dim=1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L,H,D", SHAPES)
def test_merge_state(L, H, D, dtype):
    va, sa, vb, sb = make_pair(L, H, D, dtype)
    v, s = flashinfer.merge_state(va, sa, vb, sb)
    assert v.shape == va.shape and v.dtype == dtype and s.dtype == torch.float32
    check(v, s, *ref_pair(va, sa, vb, sb))
    if L > 1:
        assert torch.all(v[0] == 0) and torch.all(torch.isneginf(s[0]))


@pytest.mark.gpu
@pytest.mark.parametrize("offset,scale", [(1e4, 30.0), (-3e4, 1e3), (0.0, 200.0)])
def test_merge_state_large_lse(offset, scale):
    va, sa, vb, sb = make_pair(64, 8, 128, torch.bfloat16, empty_frac=0.1, offset=offset,
                               scale=scale)
    v, s = flashinfer.merge_state(va, sa, vb, sb)
    check(v, s, *ref_pair(va, sa, vb, sb))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_merge_state_strided(dtype):
    """v rows and heads strided (slices of wider tensors), s a strided view, s in float16."""
    L, H, D = 33, 6, 128
    va_full = torch.randn(L, 2 * H, D + 64, device="cuda").to(dtype)
    vb_full = torch.randn(L, H + 1, D, device="cuda").to(dtype)
    va, vb = va_full[:, ::2, 64:], vb_full[:, 1:]
    sa = rand_lse((H, L), 0.2).t()
    sb = rand_lse((L, 3 * H), 0.2, seed=3)[:, ::3]
    v, s = flashinfer.merge_state(va, sa.half(), vb, sb)
    check(v, s, *ref_pair(va, sa.half().float(), vb, sb))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_merge_state_head_packed_padded(dtype):
    """Rows head-packed but heads padded (row stride = heads x head stride, head stride 2 x D):
    the one-index-per-state path with a state stride other than head_dim."""
    L, H, D = 40, 8, 128
    va = torch.randn(L, H, 2, D, device="cuda").to(dtype)[:, :, 1]
    vb = torch.randn(L, H, D, device="cuda").to(dtype)
    sa = rand_lse((L, H, 3), 0.2)[:, :, 0]  # head-packed s with a state stride of 3
    sb = rand_lse((L, H), 0.2, seed=4)
    poison_empty(va, sa)
    poison_empty(vb, sb)
    v, s = flashinfer.merge_state(va, sa, vb, sb)
    check(v, s, *ref_pair(va, sa, vb, sb))


@pytest.mark.gpu
def test_merge_state_headline_shape():
    va, sa, vb, sb = make_pair(8192, 32, 128, torch.bfloat16, empty_frac=0.01)
    v, s = flashinfer.merge_state(va, sa, vb, sb)
    check(v, s, *ref_pair(va, sa, vb, sb))


@pytest.mark.gpu
def test_merge_state_empty_batch():
    va = torch.empty(0, 4, 64, dtype=torch.float16, device="cuda")
    s = torch.empty(0, 4, device="cuda")
    v, lse = flashinfer.merge_state(va, s, va, s)
    assert v.shape == (0, 4, 64) and lse.shape == (0, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L,H,D", SHAPES)
@pytest.mark.parametrize("use_mask", [False, True])
def test_merge_state_in_place(L, H, D, dtype, use_mask):
    v, s, vo, so = make_pair(L, H, D, dtype, seed=5)
    want_v, want_s = ref_pair(v, s, vo, so)
    mask = None
    if use_mask:
        mask = torch.rand(L, device="cuda") < 0.6
        want_v = torch.where(mask[:, None, None], want_v, v.double())
        want_s = torch.where(mask[:, None], want_s, s.double())
    assert flashinfer.merge_state_in_place(v, s, vo, so, mask) is None
    if use_mask:  # untouched rows keep their poisoned v exactly
        keep = ~mask
        torch.testing.assert_close(v[keep], want_v[keep].to(dtype), equal_nan=True, rtol=0,
                                   atol=0)
        torch.testing.assert_close(s[keep].double(), want_s[keep], rtol=0, atol=0)
        v, s, want_v, want_s = v[mask], s[mask], want_v[mask], want_s[mask]
    check(v, s, want_v, want_s)


@pytest.mark.gpu
def test_merge_state_in_place_strided_and_non_float32_s():
    L, H, D = 40, 4, 128
    v_full = torch.randn(L, 3 * H, D, device="cuda").half()
    v = v_full[:, H:2 * H]  # the middle heads of a packed tensor
    vo = torch.randn(L, H, D, device="cuda").half()
    s, so = rand_lse((L, H), 0.1), rand_lse((L, H), 0.1, seed=9)
    want_v, want_s = ref_pair(v, s, vo, so)
    others = v_full[:, :H].clone(), v_full[:, 2 * H:].clone()
    merge_state_in_place_s = s.clone()
    cascade.merge_state_in_place(v, merge_state_in_place_s, vo, so)
    check(v, merge_state_in_place_s, want_v, want_s)
    assert torch.equal(v_full[:, :H], others[0]) and torch.equal(v_full[:, 2 * H:], others[1])
    # FlashInfer's contract: s is .to(float32)-ed first, so a float16 s is read, not updated.
    v2, s16 = vo.clone(), s.half()
    before = s16.clone()
    cascade.merge_state_in_place(v2, s16, v_full[:, H:2 * H], so)
    assert torch.equal(s16, before)
    assert not torch.equal(v2, vo)


# ---------------------------------------------------------------------------------------------
# GPU: merge_states


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "L,S,H,D",
    [(1, 1, 1, 64), (3, 2, 5, 128), (130, 7, 32, 128), (1, 132, 32, 128), (2, 33, 3, 256),
     (17, 5, 2, 33), (4, 0, 3, 64), (2, 9, 1, 1024), (1, 200, 8, 128)],
)
def test_merge_states(L, S, H, D, dtype):
    torch.manual_seed(L * 7 + S)
    v = torch.randn(L, S, H, D, device="cuda").to(dtype)
    s = rand_lse((L, S, H), 0.25, seed=S)
    if L > 1 and S > 0:
        s[0] = -math.inf  # a row whose every state is empty
    poison_empty(v, s)
    got_v, got_s = flashinfer.merge_states(v, s)
    assert got_v.shape == (L, H, D) and got_s.shape == (L, H)
    check(got_v, got_s, *ref_merge(v, s, dim=1))
    if S == 0 or L > 1:
        assert torch.all(got_v[0] == 0) and torch.all(torch.isneginf(got_s[0]))


@pytest.mark.gpu
def test_merge_states_strided():
    L, S, H, D = 9, 6, 4, 128
    v_full = torch.randn(L, S, H + 2, D + 32, device="cuda").bfloat16()
    v = v_full[:, :, 1:H + 1, 16:16 + D]
    s = rand_lse((L, H, S), 0.2).transpose(1, 2)
    got_v, got_s = flashinfer.merge_states(v, s)
    check(got_v, got_s, *ref_merge(v, s, dim=1))


@pytest.mark.gpu
def test_merge_states_matches_pairwise_merges():
    """Merging S states at once equals folding them in with merge_state_in_place."""
    v = torch.randn(50, 5, 8, 128, device="cuda")
    s = rand_lse((50, 5, 8), 0.1)
    acc_v, acc_s = v[:, 0].clone(), s[:, 0].clone()
    for i in range(1, 5):
        flashinfer.merge_state_in_place(acc_v, acc_s, v[:, i].contiguous(), s[:, i].contiguous())
    got_v, got_s = flashinfer.merge_states(v, s)
    torch.testing.assert_close(got_v, acc_v, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_s, acc_s, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# GPU: the split-KV reduction (MergeStatesVarlen)


def varlen_case(counts, H, D, seed=0):
    torch.manual_seed(seed)
    indptr = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32,
                          device="cuda")
    P = int(indptr[-1])
    v = torch.randn(P, H, D, device="cuda")
    s = rand_lse((P, H), 0.1, seed=seed)
    poison_empty(v, s)
    return v, s, indptr


def ref_varlen(v, s, indptr):
    outs, lses = [], []
    ind = indptr.tolist()
    for r in range(len(ind) - 1):
        o, lse = ref_merge(v[ind[r]:ind[r + 1]][None], s[ind[r]:ind[r + 1]][None], dim=1)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.stack(outs), torch.stack(lses)


COUNTS = [
    [132],  # split-KV decode: one row, many chunks
    [32],
    [200],  # more parts than one round of loads of every group
    [3],
    [0],  # empty row
    [1, 2, 0, 1, 2, 2, 1, 0, 5],
    [2] * 300,  # many rows of few parts
    [40, 0, 7, 132, 1],
]


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("counts", COUNTS)
@pytest.mark.parametrize("H,D", [(32, 128), (3, 64), (8, 256), (5, 33), (1, 128)])
def test_merge_states_varlen(counts, H, D, out_dtype):
    v, s, indptr = varlen_case(counts, H, D)
    out, lse = merge.merge_states_varlen(v, s, indptr, out_dtype=out_dtype)
    want_v, want_s = ref_varlen(v, s, indptr)
    check(out, lse, want_v, want_s)
    for r, c in enumerate(counts):
        if c == 0:
            assert torch.all(out[r] == 0) and torch.all(torch.isneginf(lse[r]))


@pytest.mark.gpu
def test_merge_states_varlen_strided_out_without_lse():
    v, s, indptr = varlen_case([4, 1, 0, 9], 6, 128)
    wide = torch.full((4, 8, 128 + 8), math.nan, device="cuda", dtype=torch.bfloat16)
    out = wide[:, 1:7, 8:]
    got, lse = merge.merge_states_varlen(v, s, indptr, out=out, return_lse=False)
    assert got is out and lse is None
    torch.testing.assert_close(out.double(), ref_varlen(v, s, indptr)[0], **TOL[out.dtype])
    assert wide[:, 0].isnan().all() and wide[:, 7].isnan().all() and wide[..., :8].isnan().all()


@pytest.mark.gpu
def test_merge_states_varlen_cuda_graph_follows_indptr():
    """The launch depends on shapes only: a captured merge reads new indptr values on replay."""
    H, D = 32, 128
    v, s, indptr = varlen_case([100, 30, 2], H, D)
    out = torch.empty(3, H, D, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(3, H, device="cuda")
    merge.merge_states_varlen(v, s, indptr, out=out, lse=lse)  # compile and warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        merge.merge_states_varlen(v, s, indptr, out=out, lse=lse)
    for counts in ([1, 1, 130], [0, 132, 0], [60, 60, 12]):
        indptr.copy_(torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist()))
        graph.replay()
        torch.cuda.synchronize()
        check(out, lse, *ref_varlen(v, s, indptr))

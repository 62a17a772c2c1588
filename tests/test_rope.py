"""flashinfer.rope: RoPE on q/k from pos_ids, indptr/offsets or a cos/sin cache."""

from __future__ import annotations

import math

import pytest
import torch

import flashinfer
import flashinfer.rope as rope

# ----------------------------------------------------------------------------------------------
# Reference, from the contract's formulas, in float64 except where the contract says float32:
# the frequency is rounded to float32 once and the angle is the float32 product pos * freq.
# ----------------------------------------------------------------------------------------------

LLAMA31_DEFAULTS = dict(rope_scale=8.0, rope_theta=5e5, low_freq_factor=1.0,
                        high_freq_factor=4.0, old_context_len=8192)


def ref_freq(rotary_dim, rope_scale=1.0, rope_theta=1e4, llama31=None) -> torch.Tensor:
    """float32 (rotary_dim/2,): theta^(-2i/rd)/scale, or the Llama-3.1 blend."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    freq = float(rope_theta) ** (-2.0 * i / rotary_dim)
    if llama31 is None:
        out = freq / rope_scale
    else:
        low, high, old = llama31
        smooth = (freq * old / (2 * math.pi * (high - low)) - low / (high - low)).clamp(0, 1)
        out = (1 - smooth) * freq / rope_scale + smooth * freq
    return out.float()


def ref_cos_sin(pos: torch.Tensor, freq: torch.Tensor):
    """float64 cos, sin of the float32 angle, shape (nnz, 1, rotary_dim/2)."""
    angle = pos.cpu().float()[:, None] * freq[None, :]  # float32 product, as the kernel
    angle = angle.double()[:, None, :]
    return angle.cos(), angle.sin()


def ref_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool):
    """float64 result; x (nnz, H, D), cos/sin (nnz, 1, rd/2) float64."""
    rd = 2 * cos.shape[-1]
    x = x.detach().cpu().double()
    out = x.clone()
    if interleave:
        a, b = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2] = a * cos - b * sin
        out[..., 1:rd:2] = b * cos + a * sin
    else:
        a, b = x[..., : rd // 2], x[..., rd // 2 : rd]
        out[..., : rd // 2] = a * cos - b * sin
        out[..., rd // 2 : rd] = b * cos + a * sin
    return out


def positions_from_indptr(indptr, offsets, nnz):
    """offsets[b] + j - indptr[b] for rows of a request; -1 marks rows of no request."""
    indptr, offsets = indptr.cpu().long(), offsets.cpu().long()
    pos = torch.full((nnz,), -1, dtype=torch.int64)
    for b in range(len(offsets)):
        s, e = indptr[b].item(), indptr[b + 1].item()
        pos[s:e] = offsets[b] + torch.arange(e - s)
    return pos


def tol(dtype):
    # The kernel rounds the float32 result once; the reference is exact: half an ulp apart,
    # plus the float32 math (~1e-6 relative).
    return dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=2e-3, atol=2e-3)


def assert_rope_close(got: torch.Tensor, want64: torch.Tensor, rotary_dim: int):
    got_cpu = got.detach().cpu()
    torch.testing.assert_close(got_cpu.double(), want64, **tol(got.dtype))
    # Pass-through channels are copied bit for bit.
    assert torch.equal(got_cpu[..., rotary_dim:], want64[..., rotary_dim:].to(got.dtype))


def make_qk(nnz, hq, hk, d, dtype, layout="contiguous"):
    """q (nnz, hq, d), k (nnz, hk, d) in one of several memory layouts, plus an owner tensor."""
    dev = "cuda"
    if layout == "contiguous":
        q = torch.randn(nnz, hq, d, dtype=dtype, device=dev)
        k = torch.randn(nnz, hk, d, dtype=dtype, device=dev)
        return q, k, None
    if layout == "packed_qkv":
        # (nnz, (hq + 2 hk) d) with q, k, v side by side: row stride (hq + 2 hk) d.
        qkv = torch.randn(nnz, (hq + 2 * hk) * d, dtype=dtype, device=dev)
        q = qkv[:, : hq * d].view(nnz, hq, d)
        k = qkv[:, hq * d : (hq + hk) * d].view(nnz, hk, d)
        return q, k, qkv
    if layout == "head_padded":
        # Head stride d + 8: still 16-byte aligned.
        q = torch.randn(nnz, hq, d + 8, dtype=dtype, device=dev)[..., :d]
        k = torch.randn(nnz, hk, d + 8, dtype=dtype, device=dev)[..., :d]
        return q, k, None
    if layout == "odd_stride":
        # Head stride d + 3 and an odd element offset: only the scalar path can read this.
        q = torch.randn(nnz, hq, d + 3, dtype=dtype, device=dev)[..., 1 : d + 1]
        k = torch.randn(nnz, hk, d + 3, dtype=dtype, device=dev)[..., 1 : d + 1]
        return q, k, None
    if layout == "heads_major":
        # Dense but permuted: (hq, nnz, d) storage seen as (nnz, hq, d).
        q = torch.randn(hq, nnz, d, dtype=dtype, device=dev).transpose(0, 1)
        k = torch.randn(hk, nnz, d, dtype=dtype, device=dev).transpose(0, 1)
        return q, k, None
    raise AssertionError(layout)


def poison_allocator(nbytes: int):
    """Leave NaN-filled blocks in the caching allocator so fresh outputs start as NaN."""
    junk = torch.full((nbytes // 2 + 1024,), float("nan"), dtype=torch.float16, device="cuda")
    del junk


# ----------------------------------------------------------------------------------------------
# CPU: every validation error, before anything compiles
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def no_compile(monkeypatch):
    def fail():
        raise AssertionError("validation must fail before the module is built")

    monkeypatch.setattr(rope, "get_rope_module", fail)


def cpu_qk(nnz=5, hq=4, hk=2, d=64, dtype=torch.float16):
    return torch.randn(nnz, hq, d).to(dtype), torch.randn(nnz, hk, d).to(dtype)


def test_both_import_paths():
    for name in rope.__all__:
        assert getattr(flashinfer, name) is getattr(rope, name)


@pytest.mark.parametrize("fn", [rope.apply_rope_pos_ids, rope.apply_rope_pos_ids_inplace,
                                rope.apply_llama31_rope_pos_ids,
                                rope.apply_llama31_rope_pos_ids_inplace])
def test_cpu_pos_ids_rejected(no_compile, fn):
    q, k = cpu_qk()
    with pytest.raises(ValueError, match="CUDA"):
        fn(q, k, torch.arange(5))


@pytest.mark.parametrize("fn", [rope.apply_rope, rope.apply_rope_inplace,
                                rope.apply_llama31_rope, rope.apply_llama31_rope_inplace])
def test_cpu_indptr_rejected(no_compile, fn):
    q, k = cpu_qk()
    with pytest.raises(ValueError, match="CUDA"):
        fn(q, k, torch.tensor([0, 2, 5]), torch.tensor([0, 7]))


@pytest.mark.parametrize("fn", [rope.apply_rope_with_cos_sin_cache,
                                rope.apply_rope_with_cos_sin_cache_inplace])
def test_cpu_cos_sin_cache_rejected(no_compile, fn):
    query, key = torch.randn(5, 4 * 64).half(), torch.randn(5, 2 * 64).half()
    with pytest.raises(ValueError, match="CUDA"):
        fn(torch.arange(5), query, key, 64, torch.randn(100, 64))


def test_qk_validation(no_compile):
    q, k = cpu_qk()
    pos = torch.arange(5)
    f = rope.apply_rope_pos_ids
    with pytest.raises(ValueError, match="q must be 3-D"):
        f(q[0], k, pos)
    with pytest.raises(ValueError, match="k must be 3-D"):
        f(q, k.flatten(1), pos)
    with pytest.raises(ValueError, match="q must be float16 or bfloat16"):
        f(q.float(), k.float(), pos)
    with pytest.raises(ValueError, match="k must have the dtype of q"):
        f(q, k.bfloat16(), pos)
    with pytest.raises(ValueError, match="k must have shape"):
        f(q, k[:4], pos[:4])
    with pytest.raises(ValueError, match="k must have shape"):
        f(q, k[..., :32], pos)
    with pytest.raises(ValueError, match="q must be contiguous in its last dimension"):
        f(q.transpose(0, 2).contiguous().transpose(0, 2), k, pos)
    with pytest.raises(TypeError, match="torch.Tensor"):
        f(q.tolist(), k, pos)


@pytest.mark.parametrize("rotary_dim", [0, 3, 66, 128, -2, 2.0])
def test_rotary_dim_validation(no_compile, rotary_dim):
    q, k = cpu_qk(d=64)
    with pytest.raises(ValueError, match="rotary_dim"):
        rope.apply_rope_pos_ids(q, k, torch.arange(5), rotary_dim=rotary_dim)


def test_rotary_dim_limit(no_compile):
    q, k = cpu_qk(d=1024, hq=1, hk=1)
    with pytest.raises(ValueError, match="at most 512"):
        rope.apply_rope_pos_ids(q, k, torch.arange(5))


def test_pos_ids_validation(no_compile):
    q, k = cpu_qk()
    f = rope.apply_rope_pos_ids_inplace
    with pytest.raises(ValueError, match="pos_ids must be int32 or int64"):
        f(q, k, torch.arange(5).float())
    with pytest.raises(ValueError, match=r"pos_ids must have shape \(5,\)"):
        f(q, k, torch.arange(6))
    with pytest.raises(ValueError, match="pos_ids must be 1-D"):
        f(q, k, torch.arange(5)[None])


def test_indptr_offsets_validation(no_compile):
    q, k = cpu_qk()
    f = rope.apply_rope
    indptr, offsets = torch.tensor([0, 2, 5]), torch.tensor([0, 7])
    with pytest.raises(ValueError, match="offsets must have the dtype of indptr"):
        f(q, k, indptr.int(), offsets)
    with pytest.raises(ValueError, match="offsets must have the dtype of indptr"):
        f(q, k, indptr, offsets.int())
    with pytest.raises(ValueError, match=r"offsets must have shape \(2,\)"):
        f(q, k, indptr, offsets[:1])
    with pytest.raises(ValueError, match="indptr must be int32 or int64"):
        f(q, k, indptr.float(), offsets.float())
    with pytest.raises(ValueError, match="indptr must be 1-D"):
        f(q, k, indptr[None], offsets)
    with pytest.raises(ValueError, match="indptr must have batch_size"):
        f(q, k, indptr[:0], offsets[:0])
    with pytest.raises(ValueError, match="rope_scale"):
        f(q, k, indptr, offsets, rope_scale=0)
    with pytest.raises(ValueError, match="rope_theta"):
        f(q, k, indptr, offsets, rope_theta=-1.0)


def test_cos_sin_cache_validation(no_compile):
    f = rope.apply_rope_with_cos_sin_cache
    query, key = torch.randn(5, 4 * 64).half(), torch.randn(5, 2 * 64).half()
    pos, cache = torch.arange(5), torch.randn(100, 64)
    for bad in (cache.half(), cache.bfloat16(), cache.double()):
        with pytest.raises(ValueError, match="^cos_sin_cache should be float32$"):
            f(pos, query, key, 64, bad)
    with pytest.raises(ValueError, match="rotary_dim"):
        f(pos, query, key, 64, torch.randn(100, 128))
    with pytest.raises(ValueError, match="rotary_dim"):
        f(pos, query, key, 64, torch.randn(100, 30)[:, :15])
    with pytest.raises(ValueError, match="cos_sin_cache must be 2-D"):
        f(pos, query, key, 64, cache[None])
    with pytest.raises(ValueError, match="whole number of heads"):
        f(pos, query, key, 48, torch.randn(100, 48))
    with pytest.raises(ValueError, match="key must have 5 rows"):
        f(pos, query, key[:4], 64, cache)
    with pytest.raises(ValueError, match=r"positions must have shape \(5,\)"):
        f(pos[:4], query, key, 64, cache)
    with pytest.raises(ValueError, match="positions must be int32 or int64"):
        f(pos.float(), query, key, 64, cache)
    with pytest.raises(ValueError, match="query must be float16 or bfloat16"):
        f(pos, query.float(), key.float(), 64, cache)
    with pytest.raises(ValueError, match="key must have the dtype of query"):
        f(pos, query, key.bfloat16(), 64, cache)
    with pytest.raises(ValueError, match="query must be contiguous in its last dimension"):
        f(pos, query.t().contiguous().t(), key, 64, cache)
    with pytest.raises(ValueError, match="cannot be viewed"):
        f(pos, torch.randn(5, 4, 80).half()[..., :64], key, 128, cache)
    with pytest.raises(ValueError, match="head_size"):
        f(pos, query, key, 0, cache)


# ----------------------------------------------------------------------------------------------
# Build (CPU machine with nvcc)
# ----------------------------------------------------------------------------------------------


@pytest.mark.nvcc
def test_module_builds():
    mod = rope.get_rope_module()
    for name in ("apply_rope_pos_ids", "apply_rope_indptr", "apply_rope_cos_sin_cache"):
        assert callable(getattr(mod, name))


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------

DTYPES = [torch.float16, torch.bfloat16]


def run_pos_ids(q, k, pos, inplace, llama31, **kw):
    if llama31:
        fn = rope.apply_llama31_rope_pos_ids_inplace if inplace else rope.apply_llama31_rope_pos_ids
    else:
        fn = rope.apply_rope_pos_ids_inplace if inplace else rope.apply_rope_pos_ids
    if inplace:
        assert fn(q, k, pos, **kw) is None
        return q, k
    return fn(q, k, pos, **kw)


def check_pos_ids_case(nnz, hq, hk, d, rotary_dim, interleave, dtype, idtype, layout, inplace,
                       llama31=None, max_pos=4096, rope_scale=1.0, rope_theta=1e4):
    torch.manual_seed(nnz * 131 + hq * 7 + d)
    q, k, owner = make_qk(nnz, hq, hk, d, dtype, layout)
    pos = torch.randint(0, max_pos, (nnz,), dtype=idtype, device="cuda")
    q0, k0 = q.clone(), k.clone()
    owner0 = owner.clone() if owner is not None else None
    kw = dict(rotary_dim=rotary_dim, interleave=interleave)
    rd = d if rotary_dim is None else rotary_dim
    if llama31 is not None:
        kw.update(llama31)
        freq = ref_freq(rd, llama31["rope_scale"], llama31["rope_theta"],
                        (llama31["low_freq_factor"], llama31["high_freq_factor"],
                         llama31["old_context_len"]))
    else:
        kw.update(rope_scale=rope_scale, rope_theta=rope_theta)
        freq = ref_freq(rd, rope_scale, rope_theta)
    if not inplace:
        poison_allocator(2 * (q.numel() + k.numel()) * q.element_size())
    q_out, k_out = run_pos_ids(q, k, pos, inplace, llama31 is not None, **kw)
    cos, sin = ref_cos_sin(pos, freq)
    assert_rope_close(q_out, ref_rotate(q0, cos, sin, interleave), rd)
    assert_rope_close(k_out, ref_rotate(k0, cos, sin, interleave), rd)
    if inplace:
        assert q_out is q and k_out is k
    else:
        assert torch.equal(q, q0) and torch.equal(k, k0), "out of place modified its inputs"
        assert q_out.shape == q.shape and k_out.shape == k.shape
    if owner is not None:
        # Packed QKV: the v part is never touched.
        hq_d, hk_d = hq * d, hk * d
        assert torch.equal(owner[:, hq_d + hk_d :], owner0[:, hq_d + hk_d :])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("d,rotary_dim", [(64, None), (128, None), (256, None), (128, 64),
                                          (128, 32), (256, 160)])
@pytest.mark.parametrize("inplace", [False, True])
def test_pos_ids_head_dims(dtype, interleave, d, rotary_dim, inplace):
    check_pos_ids_case(37, 8, 2, d, rotary_dim, interleave, dtype, torch.int32, "contiguous",
                       inplace)


@pytest.mark.gpu
@pytest.mark.parametrize("nnz,hq,hk", [(1, 1, 1), (1, 32, 8), (7, 5, 3), (513, 32, 8),
                                       (2049, 4, 1), (33, 3, 0)])
@pytest.mark.parametrize("idtype", [torch.int32, torch.int64])
def test_pos_ids_shapes(nnz, hq, hk, idtype):
    check_pos_ids_case(nnz, hq, hk, 128, None, False, torch.bfloat16, idtype, "contiguous", False)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["packed_qkv", "head_padded", "odd_stride", "heads_major"])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 64])
def test_pos_ids_layouts(layout, interleave, inplace, rotary_dim):
    check_pos_ids_case(29, 6, 2, 128, rotary_dim, interleave, torch.float16, torch.int64, layout,
                       inplace)


@pytest.mark.gpu
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("d,rotary_dim", [(64, 6), (64, 24), (96, 96), (80, 40), (130, 2)])
def test_pos_ids_unaligned_rotary_dims(interleave, d, rotary_dim):
    # rotary_dim / 2 not a multiple of 8 (or head_dim not of 8): the scalar path.
    check_pos_ids_case(19, 3, 2, d, rotary_dim, interleave, torch.bfloat16, torch.int32,
                       "contiguous", False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", [False, True])
def test_pos_ids_large_positions(dtype, interleave):
    # Angles ~1e5 rad: a fast, unreduced sincos would be off by far more than the tolerance.
    check_pos_ids_case(257, 4, 2, 128, None, interleave, dtype, torch.int64, "contiguous", False,
                       max_pos=200_000)
    check_pos_ids_case(64, 2, 1, 64, None, interleave, dtype, torch.int32, "contiguous", True,
                       max_pos=1_000_000)


@pytest.mark.gpu
@pytest.mark.parametrize("rope_scale,rope_theta", [(1.0, 1e4), (2.5, 1e6), (0.5, 500.0)])
def test_pos_ids_scale_theta(rope_scale, rope_theta):
    check_pos_ids_case(50, 4, 4, 64, None, False, torch.float16, torch.int32, "contiguous",
                       False, rope_scale=rope_scale, rope_theta=rope_theta)


@pytest.mark.gpu
@pytest.mark.parametrize("params", [
    LLAMA31_DEFAULTS,
    dict(rope_scale=4.0, rope_theta=1e4, low_freq_factor=2.0, high_freq_factor=8.0,
         old_context_len=2048),
    dict(rope_scale=32.0, rope_theta=5e5, low_freq_factor=0.5, high_freq_factor=3.0,
         old_context_len=4096),
])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_llama31_pos_ids(params, interleave, inplace):
    check_pos_ids_case(45, 8, 2, 128, None, interleave, torch.bfloat16, torch.int64,
                       "contiguous", inplace, llama31=params, max_pos=131072)


@pytest.mark.gpu
def test_llama31_defaults_match_signature():
    q, k, _ = make_qk(9, 2, 1, 128, torch.bfloat16)
    pos = torch.arange(9, device="cuda") * 5000
    explicit = rope.apply_llama31_rope_pos_ids(q, k, pos, **LLAMA31_DEFAULTS)
    default = rope.apply_llama31_rope_pos_ids(q, k, pos)
    assert torch.equal(explicit[0], default[0]) and torch.equal(explicit[1], default[1])
    plain = rope.apply_rope_pos_ids(q, k, pos, rope_scale=8, rope_theta=5e5)
    assert not torch.equal(plain[0], default[0])


# ---- tilings of the kernel (plan_tiles in rope.cuh; numbers for a 132-SM GPU) ------------------


@pytest.mark.gpu
@pytest.mark.parametrize("nnz,hq,hk,d,rotary_dim,layout", [
    (1601, 32, 8, 128, None, "contiguous"),   # 3 whole tokens per block, last tile partial
    (2000, 28, 4, 128, None, "contiguous"),   # warps of 4 head rows straddle q/k and tokens
    (600, 130, 2, 128, None, "contiguous"),   # 1056 items per token: 2 blocks per token
    (70, 160, 8, 128, 64, "contiguous"),      # few tokens, many heads: 7 chunks per token
    (140_000, 1, 1, 16, None, "contiguous"),  # 256-token tiles (shared-memory cap)
    (1700, 5, 3, 136, 128, "contiguous"),     # one pass-through vector per head
    (1700, 6, 2, 192, 64, "contiguous"),
    (1601, 32, 8, 128, 64, "packed_qkv"),
    (300, 32, 8, 128, None, "odd_stride"),    # scalar path: 2560 items per token, 3 chunks
])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_pos_ids_tilings(nnz, hq, hk, d, rotary_dim, layout, interleave, inplace):
    check_pos_ids_case(nnz, hq, hk, d, rotary_dim, interleave, torch.bfloat16, torch.int32,
                       layout, inplace, max_pos=100_000)


# ---- indptr / offsets ------------------------------------------------------------------------


def run_indptr(q, k, indptr, offsets, inplace, llama31, **kw):
    if llama31:
        fn = rope.apply_llama31_rope_inplace if inplace else rope.apply_llama31_rope
    else:
        fn = rope.apply_rope_inplace if inplace else rope.apply_rope
    if inplace:
        assert fn(q, k, indptr, offsets, **kw) is None
        return q, k
    return fn(q, k, indptr, offsets, **kw)


def check_indptr_case(lengths, offsets_list, hq, hk, d, rotary_dim, interleave, dtype, idtype,
                      layout, inplace, llama31=None):
    nnz = sum(lengths)
    torch.manual_seed(nnz + hq)
    q, k, _ = make_qk(nnz, hq, hk, d, dtype, layout)
    indptr = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=idtype,
                          device="cuda")
    offsets = torch.tensor(offsets_list, dtype=idtype, device="cuda")
    q0, k0 = q.clone(), k.clone()
    rd = d if rotary_dim is None else rotary_dim
    kw = dict(rotary_dim=rotary_dim, interleave=interleave)
    if llama31 is not None:
        kw.update(llama31)
        freq = ref_freq(rd, llama31["rope_scale"], llama31["rope_theta"],
                        (llama31["low_freq_factor"], llama31["high_freq_factor"],
                         llama31["old_context_len"]))
    else:
        freq = ref_freq(rd)
    q_out, k_out = run_indptr(q, k, indptr, offsets, inplace, llama31 is not None, **kw)
    pos = positions_from_indptr(indptr, offsets, nnz)
    cos, sin = ref_cos_sin(pos, freq)
    assert_rope_close(q_out, ref_rotate(q0, cos, sin, interleave), rd)
    assert_rope_close(k_out, ref_rotate(k0, cos, sin, interleave), rd)
    if not inplace:
        assert torch.equal(q, q0) and torch.equal(k, k0)


@pytest.mark.gpu
@pytest.mark.parametrize("lengths,offsets", [
    ([1], [0]),
    ([17], [0]),
    ([5], [1000]),
    ([3, 0, 12, 1, 40], [7, 3, 0, 99999, 250]),
    ([64] * 8, [0, 64, 128, 5, 6, 7, 8, 9]),
    ([0, 0, 9, 0], [1, 2, 3, 4]),
])
@pytest.mark.parametrize("idtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("interleave", [False, True])
def test_indptr_ragged(lengths, offsets, idtype, interleave):
    check_indptr_case(lengths, offsets, 8, 2, 128, None, interleave, torch.float16, idtype,
                      "contiguous", False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "packed_qkv", "odd_stride"])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("d,rotary_dim", [(64, None), (256, 128)])
def test_indptr_layouts(dtype, layout, inplace, d, rotary_dim):
    check_indptr_case([3, 10, 1, 25], [0, 17, 123, 4096], 4, 1, d, rotary_dim, True, dtype,
                      torch.int64, layout, inplace)


@pytest.mark.gpu
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_llama31_indptr(inplace, interleave):
    params = dict(rope_scale=16.0, rope_theta=2e5, low_freq_factor=1.5, high_freq_factor=6.0,
                  old_context_len=4096)
    check_indptr_case([30, 2, 19], [0, 70000, 120000], 8, 4, 128, None, interleave,
                      torch.bfloat16, torch.int32, "contiguous", inplace, llama31=params)


@pytest.mark.gpu
def test_indptr_rows_outside_requests_unrotated():
    # indptr[-1] < nnz: the trailing rows belong to no request and are copied unchanged.
    q, k, _ = make_qk(12, 2, 1, 64, torch.float16)
    indptr = torch.tensor([2, 5, 9], dtype=torch.int32, device="cuda")
    offsets = torch.tensor([10, 20], dtype=torch.int32, device="cuda")
    q_out, k_out = rope.apply_rope(q, k, indptr, offsets)
    for rows in (slice(0, 2), slice(9, 12)):
        assert torch.equal(q_out[rows], q[rows]) and torch.equal(k_out[rows], k[rows])
    pos = torch.tensor([0, 0, 10, 11, 12, 20, 21, 22, 23, 0, 0, 0], device="cuda")
    want_q, _ = rope.apply_rope_pos_ids(q, k, pos)
    torch.testing.assert_close(q_out[2:9], want_q[2:9], rtol=0, atol=0)


@pytest.mark.gpu
def test_indptr_equals_pos_ids():
    lengths, offs = [7, 0, 33, 2], [100, 5, 0, 77777]
    q, k, _ = make_qk(sum(lengths), 16, 4, 128, torch.bfloat16)
    indptr = torch.tensor([0, 7, 7, 40, 42], dtype=torch.int64, device="cuda")
    offsets = torch.tensor(offs, dtype=torch.int64, device="cuda")
    pos = positions_from_indptr(indptr, offsets, 42).cuda()
    for interleave in (False, True):
        a = rope.apply_rope(q, k, indptr, offsets, interleave=interleave)
        b = rope.apply_rope_pos_ids(q, k, pos, interleave=interleave)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.gpu
@pytest.mark.parametrize("interleave", [False, True])
def test_indptr_tiles_straddle_requests(interleave):
    # 3-token tiles that cross request boundaries, with requests of 1 and 0 tokens among them.
    check_indptr_case([500, 1, 0, 700, 2, 399], [7, 3, 0, 99999, 5, 250], 32, 8, 128, None,
                      interleave, torch.bfloat16, torch.int32, "contiguous", False)


# ---- cos/sin cache ---------------------------------------------------------------------------


def make_cache(max_pos, rotary_dim, base=1e4):
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).float().cuda()


def ref_cache_rope(x3: torch.Tensor, pos, cache, is_neox):
    rd = cache.shape[1]
    rows = cache.cpu()[pos.cpu().long()].double()
    cos, sin = rows[:, None, : rd // 2], rows[:, None, rd // 2 :]
    return ref_rotate(x3, cos, sin, interleave=not is_neox)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("head_size,rotary_dim", [(64, 64), (128, 128), (128, 64), (256, 256),
                                                  (80, 32)])
@pytest.mark.parametrize("query_dims", [2, 3])
@pytest.mark.parametrize("inplace", [False, True])
def test_cos_sin_cache(dtype, is_neox, head_size, rotary_dim, query_dims, inplace):
    nnz, hq, hk, max_pos = 23, 8, 2, 8192
    cache = make_cache(max_pos, rotary_dim)
    pos = torch.randint(0, max_pos, (nnz,), device="cuda")
    query = torch.randn(nnz, hq * head_size, dtype=dtype, device="cuda")
    key = torch.randn(nnz, hk * head_size, dtype=dtype, device="cuda")
    if query_dims == 3:
        query = query.view(nnz, hq, head_size)
    q0, k0 = query.clone(), key.clone()
    fn = (rope.apply_rope_with_cos_sin_cache_inplace if inplace
          else rope.apply_rope_with_cos_sin_cache)
    if not inplace:
        poison_allocator(2 * (query.numel() + key.numel()) * query.element_size())
    res = fn(pos, query, key, head_size, cache, is_neox)
    if inplace:
        assert res is None
        q_out, k_out = query, key
    else:
        q_out, k_out = res
        assert torch.equal(query, q0) and torch.equal(key, k0)
    assert q_out.shape == q0.shape and k_out.shape == k0.shape
    want_q = ref_cache_rope(q0.reshape(nnz, -1, head_size), pos, cache, is_neox)
    want_k = ref_cache_rope(k0.reshape(nnz, -1, head_size), pos, cache, is_neox)
    assert_rope_close(q_out.reshape(nnz, -1, head_size), want_q, rotary_dim)
    assert_rope_close(k_out.reshape(nnz, -1, head_size), want_k, rotary_dim)


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("idtype", [torch.int32, torch.int64])
def test_cos_sin_cache_packed_qkv_inplace(is_neox, idtype):
    # vLLM's layout: q and k are column slices of one (nnz, (hq + 2 hk) * hs) tensor.
    nnz, hq, hk, hs, max_pos = 31, 16, 4, 128, 150_000
    cache = make_cache(max_pos, hs, base=5e5)
    qkv = torch.randn(nnz, (hq + 2 * hk) * hs, dtype=torch.bfloat16, device="cuda")
    qkv0 = qkv.clone()
    query, key = qkv[:, : hq * hs], qkv[:, hq * hs : (hq + hk) * hs]
    pos = torch.randint(100_000, max_pos, (nnz,), dtype=idtype, device="cuda")
    q_out, k_out = rope.apply_rope_with_cos_sin_cache(pos, query, key, hs, cache, is_neox)
    assert torch.equal(qkv, qkv0)
    rope.apply_rope_with_cos_sin_cache_inplace(pos, query, key, hs, cache, is_neox)
    assert torch.equal(qkv[:, (hq + hk) * hs :], qkv0[:, (hq + hk) * hs :])
    assert torch.equal(query, q_out) and torch.equal(key, k_out)
    want_q = ref_cache_rope(qkv0[:, : hq * hs].reshape(nnz, hq, hs), pos, cache, is_neox)
    assert_rope_close(query.reshape(nnz, hq, hs), want_q, hs)


@pytest.mark.gpu
def test_cos_sin_cache_matches_frequency_path():
    # A cache holding exactly the kernel's own cos/sin gives the pos-ids result.
    nnz, rd = 40, 128
    pos = torch.randint(0, 50_000, (nnz,), device="cuda")
    freq = ref_freq(rd)
    cos, sin = ref_cos_sin(torch.arange(50_000), freq)
    cache = torch.cat([cos[:, 0], sin[:, 0]], dim=-1).float().cuda()
    q, k, _ = make_qk(nnz, 4, 2, rd, torch.float16)
    a = rope.apply_rope_pos_ids(q, k, pos)
    b = rope.apply_rope_with_cos_sin_cache(pos, q, k, rd, cache)
    torch.testing.assert_close(a[0], b[0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(a[1], b[1], rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_cos_sin_cache_out_of_range_positions_unrotated():
    cache = make_cache(16, 64)
    q, k, _ = make_qk(4, 2, 1, 64, torch.bfloat16)
    pos = torch.tensor([3, 16, -1, 100], device="cuda")
    q_out, k_out = rope.apply_rope_with_cos_sin_cache(pos, q, k, 64, cache)
    assert torch.equal(q_out[1:], q[1:]) and torch.equal(k_out[1:], k[1:])
    assert not torch.equal(q_out[0], q[0])


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("nnz,hq,hk,head_size,rotary_dim", [
    (1601, 32, 8, 128, 128), (70, 160, 8, 128, 64), (1700, 6, 2, 192, 64)])
def test_cos_sin_cache_tilings(is_neox, nnz, hq, hk, head_size, rotary_dim):
    torch.manual_seed(nnz)
    max_pos = 4096
    cache = make_cache(max_pos, rotary_dim)
    pos = torch.randint(0, max_pos, (nnz,), device="cuda")
    query = torch.randn(nnz, hq * head_size, dtype=torch.float16, device="cuda")
    key = torch.randn(nnz, hk * head_size, dtype=torch.float16, device="cuda")
    q_out, k_out = rope.apply_rope_with_cos_sin_cache(pos, query, key, head_size, cache, is_neox)
    for got, x in ((q_out, query), (k_out, key)):
        want = ref_cache_rope(x.reshape(nnz, -1, head_size), pos, cache, is_neox)
        assert_rope_close(got.reshape(nnz, -1, head_size), want, rotary_dim)


# ---- misc --------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_current_stream_and_graph_capture():
    q, k, _ = make_qk(64, 8, 2, 128, torch.bfloat16)
    pos = torch.randint(0, 4096, (64,), device="cuda")
    want = rope.apply_rope_pos_ids(q, k, pos)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    qc, kc = q.clone(), k.clone()
    with torch.cuda.stream(s):
        rope.apply_rope_pos_ids_inplace(qc, kc, pos)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(qc, want[0]) and torch.equal(kc, want[1])
    qg, kg = q.clone(), k.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        rope.apply_rope_pos_ids_inplace(qg, kg, pos)
    qg.copy_(q)
    kg.copy_(k)
    g.replay()
    assert torch.equal(qg, want[0]) and torch.equal(kg, want[1])


@pytest.mark.gpu
def test_empty_batch():
    q, k, _ = make_qk(0, 4, 2, 64, torch.float16)
    pos = torch.empty(0, dtype=torch.int32, device="cuda")
    q_out, k_out = rope.apply_rope_pos_ids(q, k, pos)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    indptr = torch.zeros(1, dtype=torch.int32, device="cuda")
    assert rope.apply_rope_inplace(q, k, indptr, pos) is None
    query, key = q.view(0, 4 * 64), k.view(0, 2 * 64)
    q_out, k_out = rope.apply_rope_with_cos_sin_cache(pos, query, key, 64, torch.ones(8, 64).cuda())
    assert q_out.shape == (0, 256) and k_out.shape == (0, 128)


@pytest.mark.gpu
@pytest.mark.large
def test_row_stride_over_2_31():
    # Two rows 2^31 + 256 elements apart: row offsets overflow 32 bits.
    stride = 2**31 + 256
    hq, hk, d = 2, 1, 128
    base = torch.empty(2 * stride, dtype=torch.bfloat16, device="cuda")
    rows = base.as_strided((2, (hq + hk) * d), (stride, 1))
    rows.copy_(torch.randn(2, (hq + hk) * d))
    q = rows[:, : hq * d].view(2, hq, d)
    k = rows[:, hq * d :].view(2, hk, d)
    q0, k0 = q.clone(), k.clone()
    pos = torch.tensor([5, 70000], device="cuda")
    rope.apply_rope_pos_ids_inplace(q, k, pos)
    cos, sin = ref_cos_sin(pos, ref_freq(d))
    assert_rope_close(q, ref_rotate(q0, cos, sin, False), d)
    assert_rope_close(k, ref_rotate(k0, cos, sin, False), d)

"""flashinfer.norm: rmsnorm, gemma_rmsnorm, fused_add_rmsnorm, gemma_fused_add_rmsnorm, layernorm.

The hidden sizes are chosen to reach every kernel path (include/flashinfer/norm.cuh) in both
access widths: 16-byte vectors when every row start is 16-byte aligned and 8 | H, else one element
per access; per width, rows of <= 128 accesses (several rows per block, warp shuffles), <= 4096
(one row per block, 4 accesses per thread), <= 8192 (8 per thread; not the fused add) and longer
(the loop kernel that re-reads the row).
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import flashinfer
import flashinfer.norm as norm

HALF = [torch.float16, torch.bfloat16]
# Both sides compute in float32 and round once: results are at most 1 ulp apart (bf16 2^-7, fp16
# 2^-10 relative, plus rsqrtf's 2 ulp in float32).
TOL = {
    torch.float16: dict(rtol=2e-3, atol=1e-5),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5),
    torch.float32: dict(rtol=2e-5, atol=1e-6),
}
# 16-byte accesses: 64/128 (warp path), 1000, 4096, 5120, 8192, 16384, 28672, 32768 (4 per
# thread), 40960, 65536 (8 per thread; the loop kernel for the fused add), 70000 (loop kernel).
# One element per access (8 does not divide H): 111 (warp path), 4097 (4 per thread; loop kernel
# for the fused add), 8191 (8 per thread), 8199 (loop kernel).
HIDDEN = [64, 111, 128, 1000, 4096, 4097, 5120, 8191, 8192, 8199, 16384, 28672, 32768, 40960,
          65536, 70000]
BATCH = [1, 19, 130]

RMS_OPS = {"rmsnorm": 0.0, "gemma_rmsnorm": 1.0}
FUSED_OPS = {"fused_add_rmsnorm": 0.0, "gemma_fused_add_rmsnorm": 1.0}


# ---------------------------------------------------------------------------------------------
# float32 references


def ref_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, w_offset: float) -> torch.Tensor:
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * (w.float() + w_offset)).to(x.dtype)


def ref_fused(x, r, w, eps, w_offset):
    """(new input, new residual): t = x + r in float32, residual = round(t), input = norm(t)."""
    t = x.float() + r.float()
    rstd = torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)
    return (t * rstd * (w.float() + w_offset)).to(x.dtype), t.to(x.dtype)


def ref_layernorm(x, gamma, beta, eps):
    return F.layer_norm(x.float(), (x.shape[-1],), gamma, beta, eps).to(x.dtype)


def rand(shape, dtype, scale=1.0, device="cuda"):
    return (torch.randn(shape, dtype=torch.float32, device=device) * scale).to(dtype)


def check_rms(op, x, w, eps, got):
    torch.testing.assert_close(got, ref_rmsnorm(x, w, eps, RMS_OPS[op]), **TOL[x.dtype])


def run_fused(op, x, r, w, eps=1e-6, **kw):
    """Run a fused op on x, r in place; compare both with the reference from their old values."""
    want_x, want_r = ref_fused(x, r, w, eps, FUSED_OPS[op])
    assert getattr(flashinfer, op)(x, r, w, eps, **kw) is None
    # The residual is round(float32 sum) on both sides: bit-exact.
    torch.testing.assert_close(r, want_r, rtol=0, atol=0)
    torch.testing.assert_close(x, want_x, **TOL[x.dtype])


# ---------------------------------------------------------------------------------------------
# API surface and validation (CPU; nothing compiles)


@pytest.fixture
def no_compile(monkeypatch):
    def refuse():
        raise RuntimeError("validation must fail before the module is built")

    monkeypatch.setattr(norm, "get_norm_module", refuse)


NAMES = ["rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "layernorm"]


def test_both_import_paths():
    for name in NAMES:
        assert getattr(flashinfer, name) is getattr(norm, name)


def contract_params(f):
    """``f``'s parameters as the API contract spells them, plus the keyword-only ones we add.

    The contract's parameters come first, positional-or-keyword, with its defaults, so every
    call written against it (positional or keyword) binds the same way. Ours (``backend=``,
    like the contract's attention wrappers have) must be keyword-only with a default, so no
    contract call can reach them by position or miss them."""
    contract, extra = [], {}
    for p in inspect.signature(f).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            assert p.default is not inspect.Parameter.empty, (f.__name__, p.name)
            extra[p.name] = p.default
        else:
            assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, (f.__name__, p.name)
            contract.append((p.name, p.default))
    return contract, extra


def test_signatures_match_the_contract():
    E = inspect.Parameter.empty
    rms = [("input", E), ("weight", E), ("eps", 1e-6), ("out", None), ("enable_pdl", None)]
    fused = [("input", E), ("residual", E), ("weight", E), ("eps", 1e-6), ("enable_pdl", None)]
    cubin = {"backend": "auto"}
    assert contract_params(norm.rmsnorm) == (rms, cubin)
    assert contract_params(norm.gemma_rmsnorm) == (rms, cubin)
    assert contract_params(norm.fused_add_rmsnorm) == (fused, cubin)
    assert contract_params(norm.gemma_fused_add_rmsnorm) == (fused, cubin)
    assert contract_params(norm.layernorm) == (
        [("input", E), ("gemma", E), ("beta", E), ("eps", 1e-6)], {})


def cpu_args(name, dtype=torch.bfloat16, shape=(4, 64)):
    x = torch.ones(shape, dtype=dtype)
    h = shape[-1]
    if name in RMS_OPS:
        return (x, torch.ones(h, dtype=dtype)), {}
    if name in FUSED_OPS:
        return (x, torch.ones(shape, dtype=dtype), torch.ones(h, dtype=dtype)), {}
    return (x, torch.ones(h), torch.zeros(h)), {}


def call(name, args, **kw):
    return getattr(flashinfer, name)(*args, **kw)


@pytest.mark.parametrize("name", NAMES)
def test_cpu_input_is_rejected(name, no_compile):
    args, _ = cpu_args(name)
    with pytest.raises(ValueError, match="CUDA"):
        call(name, args)


@pytest.mark.parametrize("name", NAMES)
def test_non_tensor_is_rejected(name, no_compile):
    args, _ = cpu_args(name)
    with pytest.raises(TypeError, match="torch.Tensor"):
        call(name, ([[1.0] * 64] * 4, *args[1:]))
    for i in range(1, len(args)):
        bad = list(args)
        bad[i] = [1.0] * 64
        with pytest.raises(TypeError, match="torch.Tensor"):
            call(name, bad)


@pytest.mark.parametrize("name", [*RMS_OPS, *FUSED_OPS])
@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int8])
def test_rmsnorm_dtype_is_rejected(name, dtype, no_compile):
    args, _ = cpu_args(name, dtype=dtype)
    with pytest.raises(ValueError, match="input must be float16 or bfloat16"):
        call(name, args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_layernorm_needs_bfloat16(dtype, no_compile):
    args, _ = cpu_args("layernorm", dtype=dtype)
    with pytest.raises(ValueError, match="input must be bfloat16"):
        call("layernorm", args)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(64,), (2, 3, 4, 64), ()])
def test_rank_is_rejected(name, shape, no_compile):
    if shape == ():
        x = torch.tensor(1.0, dtype=torch.bfloat16)
        args, _ = cpu_args(name)
        args = (x, *args[1:])
    else:
        args, _ = cpu_args(name, shape=shape)
    with pytest.raises(ValueError, match="input must be"):
        call(name, args)


@pytest.mark.parametrize("name", [*FUSED_OPS, "layernorm"])
def test_3d_is_rejected_where_the_contract_says_2d(name, no_compile):
    args, _ = cpu_args(name, shape=(2, 4, 64))
    with pytest.raises(ValueError, match="input must be 2-D"):
        call(name, args)


@pytest.mark.parametrize("name", RMS_OPS)
def test_3d_is_accepted_by_rmsnorm(name, no_compile):
    args, _ = cpu_args(name, shape=(2, 4, 64))
    with pytest.raises(ValueError, match="CUDA"):  # every other check passed
        call(name, args)


@pytest.mark.parametrize("name", NAMES)
def test_last_dim_must_be_contiguous(name, no_compile):
    args, _ = cpu_args(name, shape=(64, 4))
    x = args[0].t()  # (4, 64) with strides (1, 4)
    bad = (x, *[a.t() if a.dim() == 2 else a for a in args[1:]])
    with pytest.raises(ValueError, match="input must be contiguous in its last dimension"):
        call(name, bad)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("wshape", [(65,), (63,), (1, 64), ()])
def test_weight_shape_is_rejected(name, wshape, no_compile):
    args, _ = cpu_args(name)
    i = 2 if name in FUSED_OPS else 1
    bad = list(args)
    bad[i] = torch.ones(wshape, dtype=args[i].dtype)
    with pytest.raises(ValueError, match=r"must have shape \(64,\)"):
        call(name, bad)


@pytest.mark.parametrize("name", [*RMS_OPS, *FUSED_OPS])
@pytest.mark.parametrize("wdtype", [torch.float16, torch.float32])
def test_weight_dtype_must_match_input(name, wdtype, no_compile):
    args, _ = cpu_args(name, dtype=torch.bfloat16)
    i = 2 if name in FUSED_OPS else 1
    bad = list(args)
    bad[i] = torch.ones(64, dtype=wdtype)
    with pytest.raises(ValueError, match="weight must be bfloat16"):
        call(name, bad)


@pytest.mark.parametrize("which", [1, 2])
@pytest.mark.parametrize("pdtype", [torch.bfloat16, torch.float16, torch.float64])
def test_layernorm_params_must_be_float32(which, pdtype, no_compile):
    args, _ = cpu_args("layernorm")
    bad = list(args)
    bad[which] = bad[which].to(pdtype)
    name = "gemma" if which == 1 else "beta"
    with pytest.raises(ValueError, match=f"{name} must be float32"):
        call("layernorm", bad)


@pytest.mark.parametrize("name", NAMES)
def test_weight_must_be_contiguous(name, no_compile):
    args, _ = cpu_args(name)
    i = 2 if name in FUSED_OPS else 1
    bad = list(args)
    bad[i] = torch.ones(128, dtype=args[i].dtype)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        call(name, bad)


@pytest.mark.parametrize("name", RMS_OPS)
@pytest.mark.parametrize(
    "out, match",
    [
        (torch.empty(4, 65, dtype=torch.bfloat16), "out must have shape"),
        (torch.empty(1, 4, 64, dtype=torch.bfloat16), "out must have shape"),
        (torch.empty(4, 64, dtype=torch.float16), "out must have dtype"),
        (torch.empty(64, 4, dtype=torch.bfloat16).t(), "out must be contiguous in its last"),
    ],
)
def test_out_is_checked(name, out, match, no_compile):
    args, _ = cpu_args(name)
    with pytest.raises(ValueError, match=match):
        call(name, args, out=out)


@pytest.mark.parametrize("name", FUSED_OPS)
@pytest.mark.parametrize(
    "residual, match",
    [
        (torch.ones(4, 65, dtype=torch.bfloat16), "residual must have shape"),
        (torch.ones(5, 64, dtype=torch.bfloat16), "residual must have shape"),
        (torch.ones(4, 64, dtype=torch.float16), "residual must have the dtype of input"),
        (torch.ones(64, 4, dtype=torch.bfloat16).t(), "residual must be contiguous in its last"),
    ],
)
def test_residual_is_checked(name, residual, match, no_compile):
    args, _ = cpu_args(name)
    with pytest.raises(ValueError, match=match):
        call(name, (args[0], residual, args[2]))


# ---------------------------------------------------------------------------------------------
# RMSNorm (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch", BATCH)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rmsnorm_matches_reference(op, dtype, batch, hidden):
    torch.manual_seed(batch * 100003 + hidden)
    x = rand((batch, hidden), dtype, scale=3.0)
    w = rand(hidden, dtype)
    x_before = x.clone()
    got = getattr(flashinfer, op)(x, w)
    assert got.shape == x.shape and got.dtype == dtype
    check_rms(op, x, w, 1e-6, got)
    assert torch.equal(x, x_before)  # the input is not touched


@pytest.mark.gpu
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("hidden", [128, 4096, 4097, 70000])
def test_rmsnorm_float32(op, hidden):
    x = rand((7, hidden), torch.float32, scale=2.0)
    w = rand(hidden, torch.float32)
    check_rms(op, x, w, 1e-6, getattr(flashinfer, op)(x, w))


@pytest.mark.gpu
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("enable_pdl", [None, True, False])
@pytest.mark.parametrize("hidden", [128, 8192])
def test_rmsnorm_out_given_and_pdl(op, dtype, enable_pdl, hidden):
    x = rand((33, hidden), dtype)
    w = rand(hidden, dtype)
    out = torch.full_like(x, float("nan"))
    got = getattr(flashinfer, op)(x, w, 1e-6, out=out, enable_pdl=enable_pdl)
    assert got is out
    check_rms(op, x, w, 1e-6, out)


@pytest.mark.gpu
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("hidden", [128, 4096, 4097, 70000])
def test_rmsnorm_in_place(op, hidden):
    x = rand((9, hidden), torch.bfloat16)
    w = rand(hidden, torch.bfloat16)
    want = ref_rmsnorm(x, w, 1e-6, RMS_OPS[op])
    assert getattr(flashinfer, op)(x, w, out=x) is x
    torch.testing.assert_close(x, want, **TOL[x.dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("eps", [1e-6, 1e-5, 0.1])
def test_rmsnorm_eps(op, eps):
    # Small inputs so that eps is a large part of the mean square.
    x = rand((5, 2048), torch.float16, scale=1e-2)
    w = rand(2048, torch.float16)
    check_rms(op, x, w, eps, getattr(flashinfer, op)(x, w, eps))


@pytest.mark.gpu
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "extra, offset",
    [
        (16, 0),  # row stride a multiple of 16 bytes: 16-byte accesses
        (8, 8),  # 16-byte aligned start and stride
        (1, 0),  # odd row stride: element accesses
        (8, 3),  # base pointer 6 bytes past alignment: element accesses
    ],
)
@pytest.mark.parametrize("hidden", [128, 1000, 8192, 28672, 70000])
def test_rmsnorm_strided_rows(op, dtype, extra, offset, hidden):
    rows = 37
    base = rand((rows, hidden + extra), dtype)
    x = base[:, offset : offset + hidden]
    w = rand(hidden, dtype)
    out_base = torch.full((rows, hidden + extra), float("nan"), dtype=dtype, device="cuda")
    out = out_base[:, offset : offset + hidden]
    assert getattr(flashinfer, op)(x, w, out=out) is out
    check_rms(op, x, w, 1e-6, out)
    # The columns around the output view are untouched.
    assert out_base[:, :offset].isnan().all() and out_base[:, offset + hidden :].isnan().all()
    # Without out=: a new tensor.
    check_rms(op, x, w, 1e-6, getattr(flashinfer, op)(x, w))


@pytest.mark.gpu
@pytest.mark.parametrize("op", [*RMS_OPS, *FUSED_OPS])
@pytest.mark.parametrize("hidden", [128, 4096, 28672])
def test_unaligned_weight(op, hidden):
    # A weight that starts 2 bytes past 16-byte alignment: element accesses for every tensor.
    dtype = torch.bfloat16
    w = rand(hidden + 1, dtype)[1:]
    x = rand((11, hidden), dtype)
    if op in RMS_OPS:
        check_rms(op, x, w, 1e-6, getattr(flashinfer, op)(x, w))
    else:
        run_fused(op, x, rand((11, hidden), dtype), w)


@pytest.mark.gpu
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch, heads", [(1, 1), (1, 32), (7, 8), (300, 3), (1000, 1)])
@pytest.mark.parametrize("head_dim", [64, 128, 256, 111])
def test_rmsnorm_qk_norm_3d(op, dtype, batch, heads, head_dim):
    x = rand((batch, heads, head_dim), dtype, scale=2.0)
    w = rand(head_dim, dtype)
    got = getattr(flashinfer, op)(x, w)
    assert got.shape == x.shape
    check_rms(op, x, w, 1e-6, got)


@pytest.mark.gpu
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [64, 128, 111])
@pytest.mark.parametrize("enable_pdl", [True, False])
def test_rmsnorm_3d_views(op, dtype, head_dim, enable_pdl):
    batch, nq, nk = 13, 8, 2
    w = rand(head_dim, dtype)
    f = getattr(flashinfer, op)
    # q of a packed QKV tensor: head stride head_dim, token stride (nq + 2 nk) * head_dim; the
    # output is a new contiguous tensor, so the two tensors have different row strides.
    qkv = rand((batch, nq + 2 * nk, head_dim), dtype)
    q = qkv[:, :nq]
    check_rms(op, q, w, 1e-6, f(q, w, enable_pdl=enable_pdl))
    k = qkv[:, nq : nq + nk]
    out = torch.full((batch, nk, head_dim), float("nan"), dtype=dtype, device="cuda")
    assert f(k, w, out=out, enable_pdl=enable_pdl) is out
    check_rms(op, k, w, 1e-6, out)
    # Heads before tokens: (batch, heads, d) viewed from a (heads, batch, d) tensor.
    t = rand((nq, batch, head_dim), dtype).transpose(0, 1)
    check_rms(op, t, w, 1e-6, f(t, w, enable_pdl=enable_pdl))
    # Padded heads: evenly spaced rows (the kernel folds them into 2-D).
    p = rand((batch, nq, head_dim + 8), dtype)[..., :head_dim]
    check_rms(op, p, w, 1e-6, f(p, w, enable_pdl=enable_pdl))
    # Output written into a packed QKV buffer in place of the input.
    out_qkv = torch.full_like(qkv, float("nan"))
    f(q, w, out=out_qkv[:, :nq], enable_pdl=enable_pdl)
    check_rms(op, q, w, 1e-6, out_qkv[:, :nq])
    assert out_qkv[:, nq:].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("shape", [(0, 128), (0, 4, 128), (3, 0, 128), (5, 0)])
def test_rmsnorm_empty(op, shape):
    x = torch.randn(shape, dtype=torch.float16, device="cuda")
    w = torch.randn(shape[-1], dtype=torch.float16, device="cuda")
    got = getattr(flashinfer, op)(x, w)
    assert got.shape == x.shape


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
def test_rmsnorm_extreme_values(dtype):
    # Large magnitudes: the float32 sum of squares must not overflow for half inputs.
    # (1e17^2 * 1024 < float32 max; bf16's own max squared would overflow any float32 sum.)
    big = 60000.0 if dtype == torch.float16 else 1e17
    x = torch.full((3, 1024), big, dtype=dtype, device="cuda")
    x[1] = -big
    x[2, ::2] = 0
    w = torch.ones(1024, dtype=dtype, device="cuda")
    got = flashinfer.rmsnorm(x, w)
    assert torch.isfinite(got).all()
    check_rms("rmsnorm", x, w, 1e-6, got)
    # An all-zero row normalizes to zeros (rsqrt(eps) * 0).
    z = torch.zeros(2, 1024, dtype=dtype, device="cuda")
    assert torch.equal(flashinfer.rmsnorm(z, w), z)


@pytest.mark.gpu
def test_rmsnorm_cuda_graph():
    x = rand((16, 4096), torch.bfloat16)
    w = rand(4096, torch.bfloat16)
    out = torch.empty_like(x)
    flashinfer.rmsnorm(x, w, out=out)  # build and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashinfer.rmsnorm(x, w, out=out)
    x.copy_(rand((16, 4096), torch.bfloat16))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check_rms("rmsnorm", x, w, 1e-6, out)


@pytest.mark.gpu
def test_rmsnorm_follows_the_current_stream():
    x = rand((64, 8192), torch.bfloat16)
    w = rand(8192, torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = flashinfer.rmsnorm(x, w)
    torch.cuda.current_stream().wait_stream(s)
    check_rms("rmsnorm", x, w, 1e-6, out)


# ---------------------------------------------------------------------------------------------
# Fused add + RMSNorm (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("op", FUSED_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch", BATCH)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_fused_matches_reference(op, dtype, batch, hidden):
    torch.manual_seed(batch * 7919 + hidden)
    x = rand((batch, hidden), dtype, scale=2.0)
    r = rand((batch, hidden), dtype, scale=2.0)
    run_fused(op, x, r, rand(hidden, dtype))


def exact_fraction(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got == want).float().mean().item()


@pytest.mark.gpu
@pytest.mark.parametrize("op", FUSED_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("hidden", [128, 4096, 4097, 40960])
def test_fused_norm_uses_the_unrounded_sum(op, dtype, hidden):
    # Normalizing round(t) instead of t moves each output by up to half an ulp before its own
    # rounding, which a 1-ulp tolerance cannot see; counting bit-exact outputs can. From the
    # float32 t, only outputs within ~1e-7 (relative) of a rounding midpoint may differ.
    x = rand((64, hidden), dtype, scale=4.0)
    r = rand((64, hidden), dtype, scale=4.0)
    w = rand(hidden, dtype)
    want_x, want_r = ref_fused(x, r, w, 1e-6, FUSED_OPS[op])
    wrong_x = ref_rmsnorm(want_r, w, 1e-6, FUSED_OPS[op])  # from the rounded sum
    assert exact_fraction(wrong_x, want_x) < 0.9  # the test can tell the two apart
    getattr(flashinfer, op)(x, r, w)
    assert torch.equal(r, want_r)
    assert exact_fraction(x, want_x) > 0.99


@pytest.mark.gpu
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("hidden", [128, 111, 8192, 70000])
def test_rmsnorm_rounds_once(op, dtype, hidden):
    # float32 math and one final rounding: bit-exact with the float32 reference except for
    # outputs within float32 noise of a rounding midpoint.
    x = rand((64, hidden), dtype, scale=3.0)
    w = rand(hidden, dtype)
    got = getattr(flashinfer, op)(x, w)
    assert exact_fraction(got, ref_rmsnorm(x, w, 1e-6, RMS_OPS[op])) > 0.99


@pytest.mark.gpu
@pytest.mark.parametrize("op", FUSED_OPS)
@pytest.mark.parametrize("hidden", [128, 4096, 4097, 40960])
def test_fused_float32(op, hidden):
    x = rand((7, hidden), torch.float32)
    r = rand((7, hidden), torch.float32)
    run_fused(op, x, r, rand(hidden, torch.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("op", FUSED_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("enable_pdl", [None, True, False])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_fused_pdl_and_eps(op, dtype, enable_pdl, eps):
    x = rand((33, 8192), dtype)
    r = rand((33, 8192), dtype)
    run_fused(op, x, r, rand(8192, dtype), eps, enable_pdl=enable_pdl)


@pytest.mark.gpu
@pytest.mark.parametrize("op", FUSED_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "x_extra, x_offset, r_extra, r_offset",
    [
        (16, 0, 0, 0),  # strided input, contiguous residual
        (0, 0, 24, 8),  # contiguous input, strided residual
        (8, 8, 64, 0),  # both strided, different strides, all 16-byte aligned
        (1, 0, 0, 0),  # odd input stride: element accesses
        (0, 0, 8, 5),  # residual 10 bytes past alignment: element accesses
    ],
)
@pytest.mark.parametrize("hidden", [64, 128, 1000, 5120, 28672, 40960])
def test_fused_strided_rows(op, dtype, x_extra, x_offset, r_extra, r_offset, hidden):
    rows = 29
    xb = rand((rows, hidden + x_extra), dtype)
    rb = rand((rows, hidden + r_extra), dtype)
    xb_before, rb_before = xb.clone(), rb.clone()
    x = xb[:, x_offset : x_offset + hidden]
    r = rb[:, r_offset : r_offset + hidden]
    run_fused(op, x, r, rand(hidden, dtype))
    # Nothing outside the views changed.
    for base, before, off in ((xb, xb_before, x_offset), (rb, rb_before, r_offset)):
        assert torch.equal(base[:, :off], before[:, :off])
        assert torch.equal(base[:, off + hidden :], before[:, off + hidden :])


@pytest.mark.gpu
@pytest.mark.parametrize("op", FUSED_OPS)
@pytest.mark.parametrize("shape", [(0, 4096), (3, 0)])
def test_fused_empty(op, shape):
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    r = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(shape[-1], dtype=torch.bfloat16, device="cuda")
    assert getattr(flashinfer, op)(x, r, w) is None


@pytest.mark.gpu
def test_fused_cuda_graph():
    hidden = 5120
    x = rand((16, hidden), torch.bfloat16)
    r = rand((16, hidden), torch.bfloat16)
    w = rand(hidden, torch.bfloat16)
    flashinfer.fused_add_rmsnorm(x, r, w)  # build and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashinfer.fused_add_rmsnorm(x, r, w)
    x.copy_(rand((16, hidden), torch.bfloat16))
    r.copy_(rand((16, hidden), torch.bfloat16))
    want_x, want_r = ref_fused(x, r, w, 1e-6, 0.0)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(r, want_r, rtol=0, atol=0)
    torch.testing.assert_close(x, want_x, **TOL[torch.bfloat16])


# ---------------------------------------------------------------------------------------------
# LayerNorm (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", BATCH)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_layernorm_matches_reference(batch, hidden):
    torch.manual_seed(batch * 31 + hidden)
    # An offset mean: the variance must not come from E[x^2] - mean^2.
    x = (rand((batch, hidden), torch.float32, scale=2.0) + 5.0).to(torch.bfloat16)
    gamma = torch.randn(hidden, device="cuda")
    beta = torch.randn(hidden, device="cuda")
    got = flashinfer.layernorm(x, gamma, beta)
    assert got.shape == x.shape and got.dtype == torch.bfloat16
    torch.testing.assert_close(got, ref_layernorm(x, gamma, beta, 1e-6), **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("eps", [1e-6, 1e-5, 0.5])
@pytest.mark.parametrize("extra, offset", [(0, 0), (16, 8), (1, 0), (8, 3)])
@pytest.mark.parametrize("hidden", [128, 4096, 70000])
def test_layernorm_strided_and_eps(eps, extra, offset, hidden):
    base = rand((21, hidden + extra), torch.bfloat16, scale=0.5)
    x = base[:, offset : offset + hidden]
    gamma = torch.randn(hidden, device="cuda")
    beta = torch.randn(hidden, device="cuda")
    got = flashinfer.layernorm(x, gamma, beta, eps)
    torch.testing.assert_close(got, ref_layernorm(x, gamma, beta, eps), **TOL[torch.bfloat16])


@pytest.mark.gpu
def test_layernorm_constant_rows():
    # Zero variance: (x - mean) = 0, so every output is beta (rounded).
    x = torch.full((4, 2048), 3.0, dtype=torch.bfloat16, device="cuda")
    gamma = torch.randn(2048, device="cuda")
    beta = torch.randn(2048, device="cuda")
    got = flashinfer.layernorm(x, gamma, beta)
    torch.testing.assert_close(got, beta.to(torch.bfloat16).expand(4, -1), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Tensors and strides beyond 2^31 elements (GPU, > 20 GB free)

BIG_STRIDE = (1 << 31) + 64  # elements; a multiple of 8 keeps 16-byte accesses


def strided_rows(hidden, dtype, rows=2, stride=BIG_STRIDE):
    """(rows, hidden) rows `stride` elements apart, in a buffer just large enough."""
    buf = torch.empty((rows - 1) * stride + hidden, dtype=dtype, device="cuda")
    x = buf.as_strided((rows, hidden), (stride, 1))
    x.copy_(rand((rows, hidden), dtype))
    return x


@pytest.mark.large
@pytest.mark.parametrize("op", RMS_OPS)
def test_rmsnorm_over_2_31_elements(op):
    # 262152 x 8192 bf16 = 2^31 + 65536 elements (4.3 GB); compared in row chunks.
    hidden = 8192
    rows = (1 << 31) // hidden + 8
    x = torch.empty(rows, hidden, dtype=torch.bfloat16, device="cuda")
    for i in range(0, rows, 16384):
        x[i : i + 16384].normal_()
    w = rand(hidden, torch.bfloat16)
    got = getattr(flashinfer, op)(x, w)
    for i in range(0, rows, 16384):
        check_rms(op, x[i : i + 16384], w, 1e-6, got[i : i + 16384])


@pytest.mark.large
def test_fused_over_2_31_elements():
    # 2 x 4.3 GB inputs, plus copies of the last rows to check against.
    hidden = 4096
    rows = (1 << 31) // hidden + 8
    x = torch.empty(rows, hidden, dtype=torch.bfloat16, device="cuda")
    r = torch.empty_like(x)
    for i in range(0, rows, 32768):
        x[i : i + 32768].normal_()
        r[i : i + 32768].normal_()
    w = rand(hidden, torch.bfloat16)
    head = slice(0, 1024)
    tail = slice(rows - 40000, rows)  # includes every row past element 2^31
    want = [(s, *ref_fused(x[s], r[s], w, 1e-6, 0.0)) for s in (head, tail)]
    flashinfer.fused_add_rmsnorm(x, r, w)
    for s, want_x, want_r in want:
        torch.testing.assert_close(r[s], want_r, rtol=0, atol=0)
        torch.testing.assert_close(x[s], want_x, **TOL[torch.bfloat16])


@pytest.mark.large
@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("hidden", [128, 8192, 8191])
def test_rmsnorm_row_stride_over_2_31(op, hidden):
    x = strided_rows(hidden, torch.bfloat16)
    assert x.stride(0) > 2**31
    w = rand(hidden, torch.bfloat16)
    check_rms(op, x, w, 1e-6, getattr(flashinfer, op)(x, w))
    # The output into the same kind of view.
    out = strided_rows(hidden, torch.bfloat16)
    getattr(flashinfer, op)(x, w, out=out)
    check_rms(op, x, w, 1e-6, out)


@pytest.mark.large
@pytest.mark.parametrize("op", RMS_OPS)
def test_rmsnorm_3d_batch_stride_over_2_31(op):
    # (2, 4, 128): heads 128 elements apart, batches 2^31 + 64 apart (not foldable into 2-D).
    head_dim, heads = 128, 4
    buf = torch.empty(BIG_STRIDE + heads * head_dim, dtype=torch.bfloat16, device="cuda")
    x = buf.as_strided((2, heads, head_dim), (BIG_STRIDE, head_dim, 1))
    x.copy_(rand((2, heads, head_dim), torch.bfloat16))
    w = rand(head_dim, torch.bfloat16)
    check_rms(op, x, w, 1e-6, getattr(flashinfer, op)(x, w))


@pytest.mark.large
@pytest.mark.parametrize("op", FUSED_OPS)
@pytest.mark.parametrize("hidden", [128, 8192, 8191])
def test_fused_row_stride_over_2_31(op, hidden):
    x = strided_rows(hidden, torch.bfloat16)
    r = strided_rows(hidden, torch.bfloat16)
    run_fused(op, x, r, rand(hidden, torch.bfloat16))


@pytest.mark.large
@pytest.mark.parametrize("hidden", [128, 8192, 8191])
def test_layernorm_row_stride_over_2_31(hidden):
    x = strided_rows(hidden, torch.bfloat16)
    gamma = torch.randn(hidden, device="cuda")
    beta = torch.randn(hidden, device="cuda")
    got = flashinfer.layernorm(x, gamma, beta)
    torch.testing.assert_close(got, ref_layernorm(x, gamma, beta, 1e-6), **TOL[torch.bfloat16])

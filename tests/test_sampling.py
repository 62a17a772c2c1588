"""flashinfer.sampling: every op against exact references.

Oracles are sort-based and computed in float64: the top-k set is the values >= the k-th largest,
the top-p set the largest values until their mass exceeds top_p of the row's (ties at the
threshold are kept, as the kernel keeps them). Frequencies are checked with a max-deviation bound
of 6 standard deviations per token over 2^20 draws (false-failure odds < 1e-7 per test).
"""

from __future__ import annotations

import inspect
import math
import re
import warnings

import pytest
import torch

import flashinfer
import flashinfer.sampling as sampling

OPS = [
    "softmax", "sampling_from_probs", "sampling_from_logits", "top_p_sampling_from_probs",
    "top_k_sampling_from_probs", "min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits", "top_p_renorm_probs", "top_k_renorm_probs",
    "top_k_mask_logits", "chain_speculative_sampling", "top_p_renorm_prob", "top_k_renorm_prob",
]
COMMON = ["indices", "deterministic", "generator", "check_nan", "seed", "offset", "return_valid"]
SIGNATURES = {
    "softmax": ["logits", "temperature", "enable_pdl"],
    "sampling_from_probs": ["probs", *COMMON],
    "sampling_from_logits": ["logits", *COMMON[:-1]],
    "top_p_sampling_from_probs": ["probs", "top_p", *COMMON],
    "top_k_sampling_from_probs": ["probs", "top_k", *COMMON],
    "min_p_sampling_from_probs": ["probs", "min_p", *COMMON],
    "top_k_top_p_sampling_from_probs": ["probs", "top_k", "top_p", "indices", "filter_apply_order",
                                        *COMMON[1:]],
    "top_k_top_p_sampling_from_logits": ["logits", "top_k", "top_p", "indices",
                                         "filter_apply_order", *COMMON[1:-1]],
    "top_p_renorm_probs": ["probs", "top_p", "is_deterministic"],
    "top_k_renorm_probs": ["probs", "top_k"],
    "top_k_mask_logits": ["logits", "top_k"],
    "chain_speculative_sampling": ["draft_probs", "draft_token_ids", "target_probs",
                                   "maybe_output_accepted_token_num",
                                   "maybe_output_emitted_draft_token_num", "deterministic",
                                   "generator", "seed", "offset"],
}


# ---------------------------------------------------------------------------------------------
# float64 references


def ref_top_k_keep(x: torch.Tensor, k) -> torch.Tensor:
    """Bool mask of values >= the k-th largest of each row (k >= V keeps all)."""
    v = x.shape[1]
    k = torch.as_tensor(k, device=x.device).expand(x.shape[0]).clamp(max=v).long()
    kth = x.sort(dim=1, descending=True).values.gather(1, (k - 1)[:, None])
    return x >= kth


def ref_top_p_keep(p: torch.Tensor, top_p, slack: float = 0.0) -> torch.Tensor:
    """Bool mask of the largest values whose mass first exceeds top_p * (1 + slack) of the row's,
    plus every value tied with the last one kept."""
    p = p.double().clamp(min=0)
    top_p = torch.as_tensor(top_p, dtype=torch.float64, device=p.device).expand(p.shape[0])
    srt = p.sort(dim=1, descending=True).values
    cum = srt.cumsum(1)
    target = (top_p * (1 + slack))[:, None] * cum[:, -1:]
    first = (cum > target).long().argmax(1)  # first index whose cumulative mass exceeds target
    first = torch.where((cum > target).any(1), first, torch.full_like(first, p.shape[1] - 1))
    thr = srt.gather(1, first[:, None])
    return p >= thr


def ref_top_p_renorm_exact(probs: torch.Tensor, top_p) -> torch.Tensor:
    """top_p_renorm_probs bit for bit (float32 rows, no NaN): values clamped to 0, fixed-point
    weights floor(x * 2^(40 - ilogb(max))), target floor(top_p * total) + 1, kept: the values at
    or above the largest value whose weight at and above reaches the target (all when none
    does), out = x * float32(2^(40 - ilogb(max)) / kept weight)."""
    x = probs.double().clamp(min=0)
    mx = x.max(1).values
    scale = torch.where(mx > 0, torch.ldexp(torch.ones_like(mx), 41 - torch.frexp(mx)[1]), 1.0)
    w = torch.floor(x * scale[:, None]).long()
    top_p = torch.as_tensor(top_p, dtype=torch.float32, device=x.device).expand(x.shape[0])
    target = torch.floor(top_p.double() * w.sum(1).double()).long() + 1
    srt, order = x.sort(1, descending=True)
    reached = w.gather(1, order).cumsum(1) >= target[:, None]
    first = reached.long().argmax(1)
    v = torch.where(reached.any(1), srt.gather(1, first[:, None])[:, 0], -1.0)
    keep = x >= v[:, None]
    kept = torch.where(keep, w, 0).sum(1)
    inv = torch.where(kept > 0, scale / kept.double(), 0.0).float()
    return torch.where(keep, x.float() * inv[:, None], 0.0)


def renorm(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    q = torch.where(keep, p.double(), 0.0)
    return q / q.sum(1, keepdim=True)


# ---------------------------------------------------------------------------------------------
# CPU: signatures, exports and every validation error (raised before any compile)


@pytest.mark.parametrize("name", OPS)
def test_exported_both_ways(name):
    assert getattr(flashinfer, name) is getattr(sampling, name)


def test_aliases():
    assert sampling.top_p_renorm_prob is sampling.top_p_renorm_probs
    assert sampling.top_k_renorm_prob is sampling.top_k_renorm_probs


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature(name):
    params = inspect.signature(getattr(sampling, name)).parameters
    assert list(params) == SIGNATURES[name]
    defaults = {"deterministic": True, "generator": None, "check_nan": False, "seed": None,
                "offset": None, "return_valid": False, "indices": None,
                "filter_apply_order": "top_k_first", "is_deterministic": False,
                "temperature": None, "enable_pdl": None}
    for p, d in defaults.items():
        if p in params:
            assert params[p].default == d, (name, p)


P = torch.rand(4, 10)


@pytest.mark.parametrize("bad, msg", [
    (torch.tensor(0.5), "Expected a 1D tensor of shape \\(batch_size,\\) or scalar for the sampling "
                        "parameter, but got a 0-dimensional tensor."),
    (torch.full((4, 1), 0.5), "Expected a 1D tensor or scalar for the sampling parameter, but got "
                              "a 2D tensor."),
    (torch.full((3,), 0.5), "Sampling parameter tensor batch size mismatch: "),
])
@pytest.mark.parametrize("op", ["top_p_sampling_from_probs", "top_p_renorm_probs",
                                "min_p_sampling_from_probs", "top_k_sampling_from_probs",
                                "top_k_renorm_probs", "top_k_mask_logits"])
def test_param_tensor_errors(op, bad, msg):
    if "top_k" in op:
        bad = bad.long()
    with pytest.raises(ValueError, match=msg):
        getattr(sampling, op)(P, bad)


def test_param_tensor_errors_top_k_top_p():
    with pytest.raises(ValueError, match="but got a 0-dimensional tensor"):
        sampling.top_k_top_p_sampling_from_probs(P, torch.tensor(3), 0.5)
    with pytest.raises(ValueError, match="but got a 3D tensor"):
        sampling.top_k_top_p_sampling_from_probs(P, 3, torch.ones(4, 1, 1))
    with pytest.raises(ValueError, match="batch size mismatch"):
        sampling.top_k_top_p_sampling_from_logits(P, torch.ones(5, dtype=torch.int32), 0.5)
    with pytest.raises(ValueError, match="batch size mismatch"):  # against indices' length
        sampling.top_p_sampling_from_probs(P, torch.ones(4), indices=torch.zeros(6, dtype=torch.int32))


@pytest.mark.parametrize("call, msg", [
    (lambda: sampling.top_p_sampling_from_probs(P, 0.0), "top_p must be in \\(0, 1\\]"),
    (lambda: sampling.top_p_sampling_from_probs(P, 1.5), "top_p must be in \\(0, 1\\]"),
    (lambda: sampling.top_p_renorm_probs(P, -0.1), "top_p must be in"),
    (lambda: sampling.top_k_sampling_from_probs(P, 0), "top_k must be positive"),
    (lambda: sampling.top_k_renorm_probs(P, -3), "top_k must be positive"),
    (lambda: sampling.top_k_mask_logits(P, 2.5), "top_k must be an integer"),
    (lambda: sampling.top_k_sampling_from_probs(P, torch.ones(4)), "top_k must be an integer tensor"),
    (lambda: sampling.min_p_sampling_from_probs(P, 1.5), "min_p must be in \\[0, 1\\]"),
    (lambda: sampling.top_k_top_p_sampling_from_probs(P, 3, 0.5, filter_apply_order="both"),
     "filter_apply_order must be 'top_k_first' or 'joint'"),
    (lambda: sampling.top_k_top_p_sampling_from_logits(P, 3, 0.5, filter_apply_order="x"),
     "filter_apply_order"),
    (lambda: sampling.sampling_from_probs(P[0]), "probs must be 2-D"),
    (lambda: sampling.sampling_from_probs(P.double()), "probs must be float16 or bfloat16 or float32"),
    (lambda: sampling.sampling_from_probs(P.t()), "contiguous in its last dimension"),
    (lambda: sampling.sampling_from_probs(P), "CUDA"),
    (lambda: sampling.sampling_from_logits(P), "CUDA"),
    (lambda: sampling.top_k_mask_logits(P, 3), "CUDA"),
    (lambda: sampling.softmax(P), "CUDA"),
    (lambda: sampling.softmax(P, temperature=0.0), "temperature must be positive"),
    (lambda: sampling.softmax(P, temperature=torch.ones(2)), "batch size mismatch"),
    (lambda: sampling.sampling_from_probs(P, indices=torch.zeros(3)), "indices must be int32 or int64"),
    (lambda: sampling.sampling_from_probs(P, indices=torch.zeros(3, 1, dtype=torch.int32)),
     "indices must be 1-D"),
    (lambda: sampling.sampling_from_probs(torch.rand(2, 0)), "vocab_size"),
    (lambda: sampling.top_p_sampling_from_probs(P, 0.5, generator=None, seed=1,
                                                offset=torch.zeros(1, dtype=torch.int64)),
     "seed and offset must be both ints"),
])
def test_validation(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_unknown_keyword():
    with pytest.raises(TypeError):
        sampling.sampling_from_probs(P, temperature=1.0)
    with pytest.raises(TypeError):
        sampling.top_p_sampling_from_probs(P, 0.5, top_k=3)


def test_sample_kernels_each_in_one_source():
    """Each (input dtype, filter set) SampleKernel and each dtype's TransformKernel is instantiated
    in exactly one of the module's translation units, and the bindings' units declare the others
    extern: a source missing from the spec would only fail when the built module loads (an
    undefined symbol)."""
    from flashinfer.jit import toolchain
    from flashinfer.jit.sampling import gen_sampling_module

    csrc, srcs = toolchain.csrc_dir(), gen_sampling_module().sources
    assert sorted(p.name for p in csrc.glob("sampling*.cu")) == sorted(srcs)
    text = {s: (csrc / s).read_text() for s in srcs}
    dtypes = ("float", "__half", "__nv_bfloat16")

    def pairs(t, prefix):
        found = [(d, f) for f in re.findall(rf"SAMPLE_FILTERS\({prefix}, (\w+)\)", t) for d in dtypes]
        return found + re.findall(rf"SAMPLE_FILTER\({prefix}, (\w+), (\w+)\)", t)

    defined = [p for t in text.values() for p in pairs(t, "")]
    sets = ("kDrawFilters", "kTopKFilters", "kTopKTopPFilters", "kTopPFilters")
    assert sorted(defined) == sorted((d, f) for d in dtypes for f in sets)
    assert sorted(pairs(text["sampling.cu"], "extern")) == sorted(defined)
    rows = [d for t in text.values() for d in re.findall(r"TRANSFORM_ROWS\(, (\w+)\)", t)]
    assert sorted(rows) == sorted(dtypes)
    bound = re.findall(r"TRANSFORM_ROWS\(extern, (\w+)\)", text["sampling_transform.cu"])
    assert sorted(bound) == sorted(dtypes)


def test_chain_validation():
    d, t = torch.rand(2, 3, 8), torch.rand(2, 4, 8)
    ids = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="target_probs must have shape"):
        sampling.chain_speculative_sampling(d, ids, torch.rand(2, 3, 8))
    with pytest.raises(ValueError, match="draft_token_ids must have shape"):
        sampling.chain_speculative_sampling(d, ids[:, :2], t)
    with pytest.raises(ValueError, match="draft_probs must be 3-D"):
        sampling.chain_speculative_sampling(d[0], ids, t)
    with pytest.raises(ValueError, match="draft_probs must be float32"):
        sampling.chain_speculative_sampling(d.half(), ids, t)
    with pytest.raises(ValueError, match="maybe_output_accepted_token_num must be an int32"):
        sampling.chain_speculative_sampling(d, ids, t, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="CUDA"):
        sampling.chain_speculative_sampling(d, ids, t)


# ---------------------------------------------------------------------------------------------
# GPU


def _dev():
    return torch.device("cuda")


def _probs(b, v, dtype=torch.float32, seed=0, spread=3.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(b, v, device="cuda", generator=g) * spread
    return torch.softmax(logits, -1).to(dtype)


def _counts(samples, v):
    return torch.bincount(samples.long(), minlength=v).double()


def _assert_freq(samples, expected: torch.Tensor):
    """Max deviation of the empirical frequencies from `expected` under 6 sigma per token."""
    n = samples.numel()
    freq = _counts(samples, expected.numel()) / n
    exp = expected.double().to(freq.device)
    sigma = (exp * (1 - exp) / n).sqrt()
    assert (freq[exp == 0] == 0).all(), "a token outside the kept set was drawn"
    dev = ((freq - exp).abs() / sigma.clamp(min=1e-12))[exp > 0]
    assert dev.max() < 6, f"max deviation {dev.max():.1f} sigma; freq {freq} vs {exp}"


SMALL = torch.tensor([0.02, 0.3, 0.05, 0.13, 0.25, 0.01, 0.04, 0.2])
N_DRAWS = 1 << 20


@pytest.mark.gpu
@pytest.mark.parametrize("op, args, keep", [
    ("sampling_from_probs", (), [1] * 8),
    ("top_p_sampling_from_probs", (0.7,), [0, 1, 0, 0, 1, 0, 0, 1]),   # 0.3+0.25+0.2 = 0.75 > 0.7
    ("top_p_sampling_from_probs", (0.8,), [0, 1, 0, 1, 1, 0, 0, 1]),   # + 0.13 = 0.88 > 0.8
    ("top_p_sampling_from_probs", (1.0,), [1] * 8),                     # every candidate kept
    ("top_k_sampling_from_probs", (3,), [0, 1, 0, 0, 1, 0, 0, 1]),
    ("top_k_sampling_from_probs", (100,), [1] * 8),
    ("min_p_sampling_from_probs", (0.5,), [0, 1, 0, 0, 1, 0, 0, 1]),   # >= 0.15
    ("top_k_top_p_sampling_from_probs", (4, 0.7), [0, 1, 0, 0, 1, 0, 0, 1]),  # top-4 renorm: .68/.88
])
def test_frequencies(op, args, keep):
    probs = SMALL.cuda()[None]
    idx = torch.zeros(N_DRAWS, dtype=torch.int32, device="cuda")
    s = getattr(sampling, op)(probs, *args, indices=idx, seed=1234, offset=0)
    assert s.dtype == torch.int32 and s.shape == (N_DRAWS,)
    keep = torch.tensor(keep, dtype=torch.bool)
    _assert_freq(s, renorm(SMALL[None], keep[None])[0])


# Ties at the top-p boundary: 0.15 three times. p = 0.3, 0.5, 0.6 all stop inside the tie and
# keep all three; 0.2 keeps the top one; 0.75 stops in the 0.1 tie and keeps both.
TIES = torch.tensor([0.15, 0.05, 0.25, 0.1, 0.15, 0.05, 0.15, 0.1])


@pytest.mark.gpu
@pytest.mark.parametrize("top_p", [0.2, 0.3, 0.5, 0.6, 0.75])
def test_top_p_frequencies_ties_at_boundary(top_p):
    """Top-p by rejection (with the exact fallback) against the sort-based oracle."""
    probs = TIES.cuda()[None]
    keep = ref_top_p_keep(probs, top_p).cpu()
    idx = torch.zeros(N_DRAWS, dtype=torch.int32, device="cuda")
    s = sampling.top_p_sampling_from_probs(probs, top_p, indices=idx, seed=99, offset=4)
    assert keep[0, s.long().cpu()].all()
    _assert_freq(s, renorm(TIES[None], keep)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("force_one_cta", [False, True])
def test_top_p_fallback_tiny_acceptance(force_one_cta):
    """p = 0.008 on a flat-ish row: the top-p set (5 tokens, 0.9% of the mass) accepts ~1% of the
    candidates, so most draws reject all 8 and take the exact radix fallback."""
    from flashinfer import knobs

    w = torch.ones(1000, dtype=torch.float64)
    w[[17, 400, 3, 999, 512]] = torch.tensor([2.0, 1.9, 1.8, 1.7, 1.6], dtype=torch.float64)
    probs = (w / w.sum()).float().cuda()[None]
    keep = ref_top_p_keep(probs, 0.008).cpu()
    assert keep.sum() == 5
    idx = torch.zeros(N_DRAWS, dtype=torch.int64, device="cuda")
    with knobs.sampling.scope():
        knobs.sampling.no_cluster = force_one_cta
        s = sampling.top_p_sampling_from_probs(probs, 0.008, indices=idx, seed=5, offset=0)
        again = sampling.top_p_sampling_from_probs(probs, 0.008, indices=idx, seed=5, offset=0)
    assert torch.equal(s, again)
    assert keep[0, s.cpu()].all()
    _assert_freq(s, renorm(probs.cpu(), keep)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("force_one_cta", [False, True])
@pytest.mark.parametrize("top_p", [0.25, 0.7])
def test_top_p_mass_at_the_limit(top_p, force_one_cta):
    """TIES with p at a candidate's mass above it (0.25: the 0.25 above the tied 0.15; 0.7: the
    0.25 and three 0.15 above the 0.1): the counting pass's exact test (fixed-point weights,
    the radix search's set) keeps them: every sample in the exact set, the exact set's
    frequencies, equal samples on a repeat, on the cluster and the one-CTA path."""
    from flashinfer import knobs

    probs = TIES.cuda()[None]
    keep = (ref_top_p_renorm_exact(probs, top_p) > 0).cpu()
    idx = torch.zeros(N_DRAWS // 4, dtype=torch.int32, device="cuda")
    with knobs.sampling.scope():
        knobs.sampling.no_cluster = force_one_cta
        s = sampling.top_p_sampling_from_probs(probs, top_p, indices=idx, seed=21, offset=0)
        again = sampling.top_p_sampling_from_probs(probs, top_p, indices=idx, seed=21, offset=0)
    assert torch.equal(s, again)
    assert keep[0, s.long().cpu()].all()
    _assert_freq(s, renorm(TIES[None], keep)[0])


@pytest.mark.gpu
def test_top_p_direct_path_mass_at_the_limit():
    """Top-p on the direct path (160 x 128256 float32: rows read where they lie, candidates
    decided by the mass histogram) where p sits at a candidate's mass above it: TIES spread over
    the row at random columns, the rest 0 or tiny, p 0.25 / 0.7 / 0.5 / 0.9 per row. The
    histogram cannot decide those candidates (their prefix holds the threshold): the counting
    pass over the row does. Every sample in its row's exact top-p set, the one-CTA path's
    samples bit for bit, equal samples on a repeat."""
    from flashinfer import knobs

    b, v = 160, 128256
    g = torch.Generator(device="cuda").manual_seed(5)
    probs = torch.rand(b, v, device="cuda", generator=g) * 1e-9
    probs[::3] = 0
    cols = torch.stack(
        [torch.randperm(v, device="cuda", generator=g)[: TIES.numel()] for _ in range(b)]
    )
    probs.scatter_(1, cols, TIES.cuda().expand(b, -1).contiguous())
    p = torch.tensor([0.25, 0.7, 0.5, 0.9], device="cuda").repeat(b // 4)
    keep = ref_top_p_renorm_exact(probs, p) > 0
    kw = dict(seed=3, offset=0)
    for off in range(4):
        kw["offset"] = 32 * off
        s = sampling.top_p_sampling_from_probs(probs, p, **kw)
        again = sampling.top_p_sampling_from_probs(probs, p, **kw)
        with knobs.sampling.scope():
            knobs.sampling.no_cluster = True
            one = sampling.top_p_sampling_from_probs(probs, p, **kw)
        assert torch.equal(s, again) and torch.equal(s, one)
        assert keep[torch.arange(b, device="cuda"), s.long()].all()


@pytest.mark.gpu
@pytest.mark.parametrize("v", [391, 128256])
def test_block_draw_frequencies(v):
    """The draw weighs 128-column blocks, then the elements of a block: mass at block and
    cluster-chunk edges and in a partial last block, a negative probability (clamped to 0) and
    zeros; plain (blocks summed in the first pass), from logits (in the weights' pass), min-p."""
    cols = [0, 127, 128, 255, 256, v - 8, v - 1]
    if v > 1000:
        cols += [16127, 16128, 64511, 64512]
    w = torch.zeros(v, dtype=torch.float64)
    w[cols] = torch.arange(1, len(cols) + 1, dtype=torch.float64)
    expected = w / w.sum()
    probs = expected.clone()
    probs[300] = -0.01
    probs = probs.float().cuda()[None]
    idx = torch.zeros(N_DRAWS, dtype=torch.int32, device="cuda")
    _assert_freq(sampling.sampling_from_probs(probs, indices=idx, seed=21, offset=0), expected)
    logits = torch.where(w > 0, w.log(), -float("inf")).float().cuda()[None]
    _assert_freq(sampling.sampling_from_logits(logits, indices=idx, seed=22, offset=0), expected)
    keep = (w >= 0.3 * w.max())[None]
    s = sampling.min_p_sampling_from_probs(probs, 0.3, indices=idx, seed=23, offset=0)
    _assert_freq(s, renorm(expected[None].float(), keep)[0])


@pytest.mark.gpu
def test_frequencies_from_logits():
    logits = SMALL.log().cuda()[None]
    idx = torch.zeros(N_DRAWS, dtype=torch.int64, device="cuda")
    s = sampling.sampling_from_logits(logits, indices=idx, seed=7, offset=8)
    assert s.dtype == torch.int64
    _assert_freq(s, SMALL)
    s = sampling.top_k_top_p_sampling_from_logits(logits, 3, 0.9, indices=idx, seed=7, offset=8,
                                                  filter_apply_order="joint")
    _assert_freq(s, renorm(SMALL[None], torch.tensor([[0, 1, 0, 0, 1, 0, 0, 1]]).bool())[0])


@pytest.mark.gpu
def test_five_million_draws_one_row():
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125]], device="cuda")
    idx = torch.zeros(5_000_000, dtype=torch.int64, device="cuda")
    s = sampling.sampling_from_probs(probs, indices=idx, seed=3, offset=0)
    _assert_freq(s, probs[0].cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("v", [1000, 128256, 256000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_top_k_renorm_and_mask_exact(v, dtype):
    b = 8 if v > 1000 else 64
    probs = _probs(b, v, dtype)
    k = torch.tensor([1, 2, 10, 50, 300, 1000, v, v + 5] * (b // 8), device="cuda")
    keep = ref_top_k_keep(probs.float(), k)
    out = sampling.top_k_renorm_probs(probs, k)
    assert out.dtype == dtype
    ref = renorm(probs.float(), keep).to(dtype)
    assert ((out != 0) <= keep).all()
    half = dtype != torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-2 if half else 1e-5, atol=1e-7 if half else 0)
    logits = torch.randn(b, v, device="cuda").to(dtype)
    masked = sampling.top_k_mask_logits(logits, k)
    keep = ref_top_k_keep(logits.float(), k)
    assert torch.equal(masked, torch.where(keep, logits, torch.full_like(logits, -float("inf"))))


@pytest.mark.gpu
@pytest.mark.parametrize("v", [1000, 128256])
def test_top_p_renorm_matches_oracle(v):
    b = 64 if v == 1000 else 8
    probs = _probs(b, v, spread=2.0 if v == 1000 else 4.0)
    top_p = torch.linspace(0.05, 1.0, b, device="cuda")
    out = sampling.top_p_renorm_probs(probs, top_p)
    assert out.dtype == torch.float32
    kept = out != 0
    lo, hi = ref_top_p_keep(probs, top_p, -1e-6), ref_top_p_keep(probs, top_p, 1e-6)
    assert (lo <= kept).all() and (kept <= hi).all()
    torch.testing.assert_close(out.double(), renorm(probs, kept), rtol=1e-5, atol=1e-9)
    # half inputs: float32 out
    assert sampling.top_p_renorm_probs(probs.half(), 0.9).dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.parametrize("v", [1000, 128256, 256000])
def test_top_p_renorm_bit_exact(v):
    """Bit for bit against the fixed-point reference, where the threshold lies near the max
    (peaked rows, small top_p), deep in the bulk (top_p 0.9-0.999 of flat rows), 22 binades
    below the max (top_p 1 - 2^-20), at ties, in unnormalized rows with negatives, all zeros."""
    g = torch.Generator(device="cuda").manual_seed(v)
    spread = torch.tensor([0.5, 2.0, 2.0, 2.0, 4.0, 8.0, 16.0, 2.0] * 2, device="cuda")
    logits = torch.randn(16, v, device="cuda", generator=g) * spread[:, None]
    probs = torch.softmax(logits, -1)
    probs[7] = torch.softmax(logits[7].round(), -1)  # ties
    probs[8] *= 7.25  # unnormalized
    probs[9, ::3] = -probs[9, ::3]  # negatives count as 0
    probs[10] = 0
    top_p = torch.tensor([0.9, 0.9, 0.5, 0.999, 0.9, 0.9, 0.9, 0.7,
                          0.95, 0.3, 0.9, 1e-6, 0.1, 1.0, 1 - 2**-20, 0.99], device="cuda")
    out = sampling.top_p_renorm_probs(probs, top_p)
    assert torch.equal(out, ref_top_p_renorm_exact(probs, top_p))
    assert torch.equal(sampling.top_p_renorm_probs(probs, 0.9), ref_top_p_renorm_exact(probs, 0.9))


@pytest.mark.gpu
def test_ties_at_the_boundary():
    probs = torch.tensor([[0.1, 0.2, 0.2, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25, 0.0]], device="cuda")
    # top-2: 0.3 and every 0.2 tied with the 2nd
    out = sampling.top_k_renorm_probs(probs, 2)
    assert ((out[0] != 0).tolist()) == [False, True, True, True, True]
    assert ((out[1] != 0).tolist()) == [True, True, True, True, False]
    # top-p 0.4: 0.3 + 0.2 > 0.4 at the first 0.2, so all the tied 0.2 stay
    out = sampling.top_p_renorm_probs(probs, 0.4)
    assert ((out[0] != 0).tolist()) == [False, True, True, True, True]
    idx = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    s = sampling.top_k_sampling_from_probs(probs, 2, indices=idx, seed=0, offset=0)
    assert set(s.unique().tolist()) == {1, 2, 3, 4}


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["top_p", "top_p_small", "top_k", "min_p", "joint", "top_k_first"])
@pytest.mark.parametrize("b, v", [(1, 128256), (1024, 1000), (16, 256000)])
def test_samples_in_kept_set(op, b, v):
    probs = _probs(b, v, spread=3.0)
    kk, pp, mp = 20, 0.8, 0.05
    if op in ("top_p", "top_p_small"):
        if op == "top_p_small":  # mostly the exact fallback after 8 rejected candidates
            pp = 0.01
        s = sampling.top_p_sampling_from_probs(probs, pp)
        keep = ref_top_p_keep(probs, pp, 1e-6)
    elif op == "top_k":
        s = sampling.top_k_sampling_from_probs(probs, kk)
        keep = ref_top_k_keep(probs, kk)
    elif op == "min_p":
        s = sampling.min_p_sampling_from_probs(probs, mp)
        keep = probs >= mp * probs.max(1, keepdim=True).values * (1 - 1e-6)
    elif op == "joint":
        s = sampling.top_k_top_p_sampling_from_probs(probs, kk, pp, filter_apply_order="joint")
        keep = ref_top_k_keep(probs, kk) & ref_top_p_keep(probs, pp, 1e-6)
    else:
        s = sampling.top_k_top_p_sampling_from_probs(probs, kk, pp)
        tk = ref_top_k_keep(probs, kk)
        keep = tk & ref_top_p_keep(torch.where(tk, probs, 0.0), pp, 1e-6)
    assert s.shape == (b,) and s.dtype == torch.int32
    assert keep.gather(1, s.long()[:, None]).all()


@pytest.mark.gpu
def test_reproducible_and_seed_sensitive():
    probs = _probs(256, 5000)
    a = sampling.top_p_sampling_from_probs(probs, 0.9, seed=42, offset=100)
    b = sampling.top_p_sampling_from_probs(probs, 0.9, seed=42, offset=100)
    assert torch.equal(a, b)
    c = sampling.top_p_sampling_from_probs(probs, 0.9, seed=43, offset=100)
    d = sampling.top_p_sampling_from_probs(probs, 0.9, seed=42, offset=104)
    assert (a != c).sum() > 100 and (a != d).sum() > 100
    # deterministic=False is also run-to-run identical
    e1 = sampling.top_k_top_p_sampling_from_probs(probs, 50, 0.9, deterministic=False, seed=1, offset=0)
    e2 = sampling.top_k_top_p_sampling_from_probs(probs, 50, 0.9, deterministic=False, seed=1, offset=0)
    assert torch.equal(e1, e2)
    # per-row seed/offset tensors: row i with (seed_i, offset_i) equals the scalar call's row i
    seeds = torch.full((256,), 42, dtype=torch.int64, device="cuda")
    offs = torch.full((1,), 100, dtype=torch.int64, device="cuda")
    assert torch.equal(sampling.top_p_sampling_from_probs(probs, 0.9, seed=seeds, offset=offs), a)


@pytest.mark.gpu
def test_generator_offsets():
    g = torch.Generator(device="cuda").manual_seed(5)
    probs = _probs(10, 100)
    for fn, args, inc in [
        (sampling.sampling_from_probs, (), 12),         # B = 10 -> 12
        (sampling.min_p_sampling_from_probs, (0.1,), 12),
        (sampling.top_p_sampling_from_probs, (0.9,), 320),
        (sampling.top_k_sampling_from_probs, (5,), 320),
        (sampling.top_k_top_p_sampling_from_probs, (5, 0.9), 320),
        (sampling.sampling_from_logits, (), 1000),
    ]:
        before = g.get_offset()
        fn(probs, *args, generator=g)
        assert g.get_offset() - before == inc, fn.__name__
    # same generator state -> same samples; advanced state -> different ones
    g1 = torch.Generator(device="cuda").manual_seed(9)
    g2 = torch.Generator(device="cuda").manual_seed(9)
    probs = _probs(512, 1000)
    x1 = sampling.top_p_sampling_from_probs(probs, 0.95, generator=g1)
    x2 = sampling.top_p_sampling_from_probs(probs, 0.95, generator=g2)
    x3 = sampling.top_p_sampling_from_probs(probs, 0.95, generator=g1)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_probs_parity(dtype):
    logits = (torch.randn(512, 32000, device="cuda") * 2).to(dtype)
    g = torch.Generator(device="cuda").manual_seed(11)
    state = g.get_state()
    a = sampling.top_k_top_p_sampling_from_logits(logits, 100, 0.9, filter_apply_order="joint",
                                                  generator=g)
    g2 = torch.Generator(device="cuda")
    g2.set_state(state)
    b = sampling.top_k_top_p_sampling_from_probs(torch.softmax(logits, -1), 100, 0.9,
                                                 filter_apply_order="joint", generator=g2)
    assert torch.equal(a, b)
    assert g.get_offset() == g2.get_offset()
    g.set_state(state)
    g2.set_state(state)
    a = sampling.top_k_top_p_sampling_from_logits(logits, 100, 0.9, generator=g)
    b = sampling.top_k_top_p_sampling_from_probs(torch.softmax(logits, -1), 100, 0.9, generator=g2)
    assert (a == b).float().mean() >= 0.95


@pytest.mark.gpu
def test_nan_rows():
    probs = _probs(4, 100)
    probs[1, 7] = float("nan")
    s, valid = sampling.top_p_sampling_from_probs(probs, 0.9, return_valid=True, seed=0, offset=0)
    assert valid.tolist() == [True, False, True, True] and s[1].item() == 0
    s, valid = sampling.sampling_from_probs(probs, return_valid=True, seed=0, offset=0)
    assert valid.tolist() == [True, False, True, True]
    # the top-k filters' kernel (per-element draw; k >= vocab keeps every element)
    for k in (5, 100):
        t, valid = sampling.top_k_sampling_from_probs(probs, k, return_valid=True, seed=0, offset=0)
        assert valid.tolist() == [True, False, True, True] and t[1].item() == 0
    with pytest.raises(ValueError, match="NaN"):
        sampling.sampling_from_probs(probs, check_nan=True)


@pytest.mark.gpu
def test_indices_out_of_range_is_invalid():
    probs = _probs(4, 100)
    idx = torch.tensor([0, 3, 4, -1], dtype=torch.int64, device="cuda")
    s, valid = sampling.sampling_from_probs(probs, indices=idx, return_valid=True, seed=0, offset=0)
    assert valid.tolist() == [True, True, False, False] and s.dtype == torch.int64


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_softmax(dtype):
    logits = (torch.randn(33, 128256, device="cuda") * 3).to(dtype)
    logits[0, :100] = -float("inf")
    out = sampling.softmax(logits)
    torch.testing.assert_close(out, torch.softmax(logits.float(), -1), rtol=2e-5, atol=1e-8)
    t = torch.rand(33, device="cuda") + 0.5
    out = sampling.softmax(logits, temperature=t)
    torch.testing.assert_close(out, torch.softmax(logits.float() / t[:, None], -1), rtol=2e-5,
                               atol=1e-8)
    out = sampling.softmax(logits, 0.7, enable_pdl=False)
    torch.testing.assert_close(out, torch.softmax(logits.float() / 0.7, -1), rtol=2e-5, atol=1e-8)


@pytest.mark.gpu
@pytest.mark.parametrize("b, v, pad", [
    (1, 128256, 0), (1, 256000, 0), (7, 12, 0), (16, 1000, 4), (33, 128256, 0),
    (64, 256000, 0), (100, 128256, 4), (128, 128256, 0), (132, 151936, 0), (128, 4, 0),
    (128, 256000, 0), (133, 128256, 0), (128, 128256, 1), (50, 127, 0)])
def test_softmax_rows_on_chip(b, v, pad):
    # SoftmaxResidentKernel (float32, vocab % 4 == 0, 16-byte aligned rows, rows <= SMs): every
    # cluster size, chunks in registers only / with shared memory / with a remainder read twice;
    # the other shapes (more rows than SMs, a chunk too large, odd strides or vocabularies)
    # take TransformKernel. -inf, NaN and +inf rows as torch.softmax.
    g = torch.Generator(device="cuda").manual_seed(b * 7 + v)
    wide = torch.randn(b, v + pad, device="cuda", generator=g) * 3
    logits = wide[:, :v]
    logits[0, : max(1, v // 3)] = -float("inf")
    if b > 3:
        logits[1, v // 2] = float("nan")
        logits[2, v - 1] = float("inf")
        logits[3] = -float("inf")
    t = torch.rand(b, device="cuda", generator=g) + 0.5
    ref = torch.softmax(logits.double() / t.double()[:, None], -1).float()
    out = sampling.softmax(logits, temperature=t)
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=1e-8, equal_nan=True)
    if b > 3:
        assert out[1:4].isnan().all()
    out = sampling.softmax(logits, 1.3, enable_pdl=False)
    ref = torch.softmax(logits.double() / 1.3, -1).float()
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=1e-8, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["top_k_mask_logits", "top_k_renorm_probs"])
@pytest.mark.parametrize("b, v", [(67, 128256), (128, 128256), (132, 151936), (100, 1000),
                                  (128, 8), (300, 4096), (48, 128256), (32, 256000)])
def test_top_k_rows_on_chip(op, b, v):
    # TopKResidentKernel (a k tensor; float32, vocab % 4 == 0, aligned rows, SMs / 2 < rows <=
    # SMs) and TopKStreamKernel (a scalar k: k x vocab <= 32M where the resident kernel could
    # take the rows, 128M elsewhere; below half the SMs with 40K elements an SM: 48 x 128256,
    # 32 x 256000) against TransformKernel on the same rows (a stride of v + 1 takes it): bit for bit, over
    # ties, NaN, -inf / zero rows, sparse rows, an ascending row (the stream's list overflows),
    # k = 1 .. 5000 (resident: no bound beyond 1024, radix rounds beyond 4096) and k >= vocab.
    g = torch.Generator(device="cuda").manual_seed(b + v)
    x = torch.randn(b, v, device="cuda", generator=g) * 3
    if op == "top_k_renorm_probs":
        x = torch.softmax(x, -1)
    x[0] = (x[0] * 4).round() / 4  # ties
    x[1, v // 3] = float("nan")
    x[2] = -float("inf") if op == "top_k_mask_logits" else 0.0
    x[3, 10:] = -float("inf") if op == "top_k_mask_logits" else 0.0  # sparse
    x[4] = 0.5  # one value
    x[5, : v // 2] = -x[5, : v // 2]  # negative probabilities count as 0
    x[6] = x[6].sort().values  # ascending: the prefix's bound lists the whole row
    # a low first quarter: the stream's list overflows and its own k-th largest bounds t
    x[7, : v // 4] = x[7, : v // 4] - 40 if op == "top_k_mask_logits" else x[7, : v // 4] * 1e-6
    ks = torch.tensor([1, 50, 512, 513, 5000, v, v + 3, 2, 7, 1000, 4000], dtype=torch.int32,
                      device="cuda").repeat(b // 11 + 1)[:b]
    wide = torch.empty(b, v + 1, device="cuda")
    wide[:, :v] = x
    fn = getattr(sampling, op)
    for k in (ks, 50, 1, 300, 513, 1000, 4000):
        got = fn(x, k)
        ref = fn(wide[:, :v], k)
        torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
    # and the meaning, on the finite rows: the k largest kept
    kept = (fn(x, 50)[6:] != (-float("inf") if op == "top_k_mask_logits" else 0)).sum(-1)
    assert (kept >= min(50, v)).all() and (kept <= min(50, v) + 2).all()


@pytest.mark.gpu
@pytest.mark.parametrize("b, v", [(67, 128256), (128, 128256), (132, 151936), (100, 1000),
                                  (128, 8), (80, 4096), (48, 128256), (160, 128256)])
def test_top_p_renorm_rows_on_chip(b, v):
    # TopPResidentKernel (float32, vocab % 4 == 0, aligned rows, SMs / 2 < rows <= SMs, or rows
    # of 64K+ columns with 46K+ elements an SM: 48 and 160 rows of 128256 on an H100) against
    # TransformKernel on the same rows (a stride of v + 1 takes it) and the fixed-point
    # reference, bit for bit: spreads from peaked to flat, ties, NaN, negatives, zero rows, a
    # uniform row (its bin holds the whole row: the list overflows), one value, a row below
    # 2^-85 and one above 2 (no window), sorted rows, top_p from 1e-6 to 1.
    g = torch.Generator(device="cuda").manual_seed(b + v)
    spread = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0, 8.0, 16.0], device="cuda")
    spread = spread.repeat(b // 7 + 1)[:b]
    x = torch.softmax(torch.randn(b, v, device="cuda", generator=g) * spread[:, None], -1)
    x[0] = torch.softmax((torch.randn(v, device="cuda", generator=g) * 4).round(), -1)  # ties
    x[1, v // 3] = float("nan")
    x[2] = 0.0
    x[3] = 1.0 / v  # uniform
    x[4, 1:] = 0.0  # one value
    x[5, : v // 2] = -x[5, : v // 2]  # negatives count as 0
    x[6] = x[6].sort().values
    x[7] *= 2.0**-86 / x[7].max()  # max 2^-86: no window (its scale 2^126 still a float)
    x[8] *= 7.25  # unnormalized
    x[9] *= 6.0 / x[9].max()  # a max of 2 or more: beyond the histogram (the slow path)
    ps = torch.tensor([0.9, 0.5, 1e-6, 0.999, 1.0, 0.1, 0.7, 1 - 2**-20, 0.95, 0.3, 0.99],
                      device="cuda").repeat(b // 11 + 1)[:b]
    wide = torch.empty(b, v + 1, device="cuda")
    wide[:, :v] = x
    finite = torch.ones(b, dtype=torch.bool, device="cuda")
    finite[1] = False
    for p in (ps, 0.9, 0.5, 1e-6, 1.0):
        got = sampling.top_p_renorm_probs(x, p)
        torch.testing.assert_close(got, sampling.top_p_renorm_probs(wide[:, :v], p), rtol=0,
                                   atol=0)
        ref = ref_top_p_renorm_exact(x[finite], p if isinstance(p, float) else p[finite])
        assert torch.equal(got[finite], ref)


@pytest.mark.gpu
def test_chain_speculative_counts():
    b, n, v = 6, 4, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    target = torch.softmax(torch.randn(b, n + 1, v, device="cuda", generator=g), -1)
    draft = torch.softmax(torch.randn(b, n, v, device="cuda", generator=g), -1)
    ids = torch.randint(0, v, (b, n), device="cuda", generator=g)
    # Make the acceptance of each draft certain: accept (p >= q) or reject (p = 0).
    accept = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1], [1, 0, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0],
                           [1, 1, 0, 1]], device="cuda").bool()
    rows = torch.arange(b, device="cuda")[:, None]
    pos = torch.arange(n, device="cuda")[None]
    q = draft[rows, pos, ids]
    target[rows, pos, ids] = torch.where(accept, q.clamp(min=0.5) + 0.1, 0.0)
    acc0 = torch.full((b,), 10, dtype=torch.int32, device="cuda")
    em0 = torch.zeros(b, dtype=torch.int32, device="cuda")
    out, acc, em = sampling.chain_speculative_sampling(draft, ids, target, acc0, em0, seed=1,
                                                       offset=0)
    assert acc is acc0 and em is em0
    prefix = accept.int().cumprod(1).sum(1)
    assert torch.equal(acc, 10 + accept.int().sum(1))
    assert torch.equal(em, prefix.int())
    assert torch.equal((out != -1).sum(1), em + 1)
    for i in range(b):
        k = prefix[i].item()
        assert torch.equal(out[i, :k], ids[i, :k].int())
        tok = out[i, k].item()
        if k < n:  # resampled from relu(target - draft): never a token where target <= draft
            assert target[i, k, tok] > draft[i, k, tok]
        assert (out[i, k + 1:] == -1).all()


@pytest.mark.gpu
def test_chain_speculative_distribution():
    # One draft token; the first emitted token must follow the target distribution.
    v, reps = 6, 1 << 17
    target = torch.tensor([0.1, 0.3, 0.2, 0.15, 0.05, 0.2], device="cuda")
    draft = torch.tensor([0.3, 0.1, 0.2, 0.1, 0.2, 0.1], device="cuda")
    tokens = torch.multinomial(draft, reps, replacement=True, generator=torch.Generator(
        device="cuda").manual_seed(0))
    out, _, _ = sampling.chain_speculative_sampling(
        draft.expand(reps, 1, v).contiguous(), tokens[:, None],
        target.expand(reps, 2, v).contiguous(), seed=3, offset=0)
    _assert_freq(out[:, 0], target.cpu())


def _lower_bound_rows(b, v, pad, seed):
    """Rows for the top-k lower bound's edge cases: (logits, probs, k). Row strides v + pad (row
    tails of 1-3 floats), a row with a third -inf, a row of many ties, an all-equal last row, a
    negative probability; k = 1..20000 and k >= V."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(b, v + pad, device="cuda", generator=g) * 3)[:, :v]
    logits[1, : v // 3] = -float("inf")
    logits[2] = logits[2].round()  # many ties
    logits[-1] = 0.5  # all equal
    probs = torch.empty(b, v + pad, device="cuda")[:, :v]
    probs.copy_(torch.softmax(logits, -1))
    probs[1, 0] = -0.25  # negatives count as 0
    k = torch.tensor([1, 2, 50, 300, 5000, 20000, v, v + 5] * (b // 8 + 1), device="cuda")[:b]
    return logits, probs, k


@pytest.mark.gpu
@pytest.mark.parametrize("b, v, pad", [(40, 1000, 0), (16, 256000, 0), (24, 50001, 3),
                                       (8, 4097, 7)])
def test_top_k_transforms_lower_bound_edges(b, v, pad):
    """Top-k renorm and mask against the sort oracle where the per-thread-maxima lower bound on
    the threshold (topk_lower_prefix) is tight or below the window: k = 1..20000 and k > V, row
    tails of 1-3 floats (row stride v + pad), many ties, an all-equal row, -inf, negatives."""
    logits, probs, k = _lower_bound_rows(b, v, pad, v + b)
    clamped = probs.clamp(min=0)
    keep = ref_top_k_keep(clamped, k)
    out = sampling.top_k_renorm_probs(probs, k)
    assert ((out != 0) <= keep).all()
    torch.testing.assert_close(out, renorm(clamped, keep).float(), rtol=1e-5, atol=0)
    keep = ref_top_k_keep(logits, k)
    masked = sampling.top_k_mask_logits(logits, k)
    assert torch.equal(masked, torch.where(keep, logits, -float("inf")))


@pytest.mark.gpu
@pytest.mark.parametrize("b, v, pad", [(40, 1000, 0), (16, 256000, 0), (24, 50001, 3)])
def test_top_k_sampling_lower_bound_edges(b, v, pad):
    """The top-k filters' samples where the per-thread-maxima lower bound narrows the search's
    window (and its later rounds visit only the window's quads): every sample in the sort
    oracle's kept set for k = 1..20000 and k > V, row tails, ties, an all-equal row, negatives;
    the forced one-CTA path (no narrowing past 64 quads a thread) gives the same samples."""
    _, probs, k = _lower_bound_rows(b, v, pad, v + b + 1)
    clamped = probs.clamp(min=0)
    keep = ref_top_k_keep(clamped, k) & (clamped > 0)
    rows = torch.arange(b, device="cuda")
    for seed in range(3):
        s = sampling.top_k_sampling_from_probs(probs, k, seed=seed, offset=0)
        assert keep[rows, s.long()].all()
        j = sampling.top_k_top_p_sampling_from_probs(probs, k, 0.9, seed=seed, offset=0)
        assert keep[rows, j.long()].all()
    from flashinfer import knobs

    with knobs.sampling.scope():
        knobs.sampling.no_cluster = True
        one = sampling.top_k_sampling_from_probs(probs, k, seed=5, offset=0)
    assert torch.equal(one, sampling.top_k_sampling_from_probs(probs, k, seed=5, offset=0))


def _philox_first(seed: int, row: int, offset: int) -> int:
    """The first output of row `row`'s Philox-4x32-10 generator (sampling_common.cuh's Philox:
    key = seed, counter = (offset / 4, row), output offset % 4)."""
    m = 0xFFFFFFFF
    block = offset // 4
    c = [block & m, (block >> 32) & m, row & m, (row >> 32) & m]
    k0, k1 = seed & m, (seed >> 32) & m
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & m, p1 & m, ((p0 >> 32) ^ c[3] ^ k1) & m, p0 & m]
        k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
    return c[offset % 4]


def _top_p_cut(x: torch.Tensor, w: torch.Tensor, target: int) -> float:
    """The largest value v of row x with sum(w[x >= v]) >= target (integer weights)."""
    xs, order = x.sort(descending=True)
    hit = torch.nonzero(w[order].cumsum(0) >= target)
    return xs[hit[0]].item() if len(hit) else -1.0


def ref_top_k_sample(probs: torch.Tensor, k, seed: int, offset: int, top_p=None,
                     order: str = "") -> list:
    """The top-k draw exactly as specified (sampling_common.cuh's draw): negatives count as 0;
    kept = values >= the k-th largest (ties kept); weights floor(x * 2^(40 - e)), 2^e <= the
    row's max < 2^(e + 1); K their sum; the sample is the first column whose running kept
    weight exceeds floor(r * K / 2^32), r the row's first Philox output. With `top_p` (order
    "top_k_first" or "joint"), the kept set is also cut at the largest value whose mass at or
    above it reaches floor(p * M) + 1, M the top-k set's mass or the row's."""
    x = probs.float().clamp(min=0)
    keep = ref_top_k_keep(x, k)
    out = []
    for i in range(x.shape[0]):
        mx = x[i].max().item()
        e = math.frexp(mx)[1] - 1
        full = torch.floor(x[i].double() * 2.0 ** (40 - e)).long()
        w = torch.where(keep[i], full, 0)
        if top_p is not None:
            mass = int((w if order == "top_k_first" else full).sum().item())
            target = math.floor(float(top_p) * float(mass)) + 1
            if int(w.sum().item()) >= target:
                w = torch.where(x[i] >= _top_p_cut(x[i], w, target), w, 0)
        K = int(w.sum().item())
        if K == 0:
            out.append(0)
            continue
        target = (K * _philox_first(seed, i, offset)) >> 32
        out.append(int(torch.nonzero(w.cumsum(0) > target)[0].item()))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("v", [1000, 50001, 128256])
def test_top_k_sampling_exact_draw(v):
    """Top-k samples (alone, and with top-p applied first or jointly) equal the specified draw
    bit for bit: k small (the thresholds from the row's candidates above the per-thread-maxima
    bound), k large (more candidates than a list holds: the radix searches), and rows whose
    candidates overflow through ties at the top."""
    g = torch.Generator(device="cuda").manual_seed(v)
    probs = torch.softmax(torch.randn(12, v, device="cuda", generator=g) * 3, -1)
    probs[3, : v // 2] = probs[3].max()  # half the row tied at the max: overflows any list
    probs[4, 7] = -0.5  # a negative counts as 0
    probs[5] = probs[5].round(decimals=4)  # many ties
    k = torch.tensor([1, 2, 50, 50, 50, 50, 300, 700, 2000, 5000, v - 1, 37], device="cuda")
    for seed, offset in [(0, 0), (123456789012, 8)]:
        got = sampling.top_k_sampling_from_probs(probs, k, seed=seed, offset=offset)
        assert got.tolist() == ref_top_k_sample(probs, k, seed, offset)
        for order, top_p in [("top_k_first", 0.9), ("joint", 0.5), ("joint", 0.999)]:
            got = sampling.top_k_top_p_sampling_from_probs(
                probs, k, top_p, seed=seed, offset=offset, filter_apply_order=order)
            assert got.tolist() == ref_top_k_sample(probs, k, seed, offset, torch.tensor(
                top_p, dtype=torch.float32).item(), order), (order, top_p)
    from flashinfer import knobs

    with knobs.sampling.scope():
        knobs.sampling.no_cluster = True
        one = sampling.top_k_sampling_from_probs(probs, k, seed=0, offset=0)
    assert one.tolist() == ref_top_k_sample(probs, k, 0, 0)
    # From logits (the candidates' bound on the logits' keys, kLogitShift): in the top-k set,
    # and the same samples as from their softmax.
    logits = torch.randn(12, v, device="cuda", generator=g) * 2
    logits[3, : v // 2] = logits[3].max()
    kk = k.clamp(max=v - 1)
    a = sampling.top_k_top_p_sampling_from_logits(logits, kk, 0.9, seed=1, offset=0,
                                                  filter_apply_order="joint")
    keep = ref_top_k_keep(logits, kk)
    assert keep[torch.arange(12, device="cuda"), a.long()].all()
    b = sampling.top_k_top_p_sampling_from_probs(torch.softmax(logits, -1), kk, 0.9, seed=1,
                                                 offset=0, filter_apply_order="joint")
    assert (a == b).float().mean() >= 0.9


def _capture(fns):
    """(graph, outputs) of `fns` captured in one CUDA graph, after a warm-up on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [f() for f in fns]
    return graph, outs


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    probs = _probs(64, 32000)
    seed = torch.tensor([1], dtype=torch.int64, device="cuda")
    offset = torch.tensor([0], dtype=torch.int64, device="cuda")
    fns = [
        lambda: sampling.top_k_top_p_sampling_from_probs(probs, 50, 0.9, seed=seed, offset=offset),
        lambda: sampling.top_p_renorm_probs(probs, 0.9),
        lambda: sampling.top_k_mask_logits(probs, 10),
        lambda: sampling.softmax(probs),
    ]
    eager = [f() for f in fns]
    graph, outs = _capture(fns)
    graph.replay()
    for a, b in zip(outs, eager):
        assert torch.equal(a, b)
    offset.fill_(4)  # a new offset between replays draws new samples
    graph.replay()
    assert not torch.equal(outs[0], eager[0])


@pytest.mark.gpu
def test_cuda_graph_capture_with_generator():
    """During capture the seed/offset come from the default generator's graph-safe state (which
    every capture registers; torch requires a custom generator to be registered with the graph):
    every replay samples anew, and the samples stay in the kept set."""
    probs = _probs(64, 32000)
    graph, (out, out_plain) = _capture([lambda: sampling.top_p_sampling_from_probs(probs, 0.9),
                                        lambda: sampling.sampling_from_probs(probs)])
    graph.replay()
    first = out.clone()
    graph.replay()
    assert not torch.equal(out, first)
    keep = ref_top_p_keep(probs, 0.9, 1e-6)
    assert keep.gather(1, out.long()[:, None]).all() and out_plain.shape == (64,)


@pytest.mark.gpu
def test_cuda_graph_replay_reads_the_generators_graph_state():
    """A seedless op captured in a graph reads the generator's graph-safe state as torch's own
    kernels do (the graph's seed and offset, set before each replay, plus the offset within the
    graph; csrc/torch_rng.cc), not a node of its own: after the same manual_seed a replay draws
    exactly what eager calls draw, op by op, and no fallback warning is raised."""
    probs = _probs(64, 32000)
    ops = [lambda: sampling.top_p_sampling_from_probs(probs, 0.9),
           lambda: sampling.top_k_sampling_from_probs(probs, 50),
           lambda: sampling.sampling_from_probs(probs)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        graph, outs = _capture(ops)
    torch.cuda.manual_seed(7)
    graph.replay()
    replayed = [o.clone() for o in outs]
    torch.cuda.manual_seed(7)
    eager = [op() for op in ops]
    for a, b in zip(replayed, eager):
        assert torch.equal(a, b)
    graph.replay()  # the generator advanced: new draws
    assert not torch.equal(outs[0], replayed[0])
    torch.cuda.manual_seed(7)
    graph.replay()
    assert all(torch.equal(a, b) for a, b in zip(outs, replayed))


def test_captured_rng_without_the_torch_glue_falls_back_with_a_warning(monkeypatch):
    """Where the torch glue module can't be built (no compiler, JIT disabled), a captured op
    draws its seed and offset in a node of its own, and says so once."""
    sampling._warn_no_graph_philox.cache_clear()
    monkeypatch.setattr(sampling, "_graph_philox", lambda: OSError("no compiler"))
    g = torch.Generator().manual_seed(0)
    with pytest.warns(RuntimeWarning, match="no compiler"):
        s, o, seed, offset = sampling._captured_rng(g, 32, torch.device("cpu"))
    assert (s, o) == (0, 0) and seed.shape == offset.shape == (1,)
    assert seed.dtype == offset.dtype == torch.int64
    sampling._warn_no_graph_philox.cache_clear()


def test_the_torch_glue_is_keyed_by_torch_and_never_precompiled():
    """csrc/torch_rng.cc is built against the installed torch's C++ API: its key holds torch's
    version and ABI, and the jit-cache wheel (the AOT registry) does not hold it."""
    from flashinfer import aot
    from flashinfer.jit.torch_rng import gen_torch_rng_module

    spec = gen_torch_rng_module()
    assert f"-DFLASHINFER_TORCH_VERSION={torch.__version__}" in spec.extra_cflags
    assert f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}" in spec.extra_cflags
    assert not spec.precompiled and spec.name not in {s.name for s in aot.registered_specs()}


@pytest.mark.gpu
def test_default_device_cuda():
    torch.set_default_device("cuda")
    try:
        probs = torch.softmax(torch.randn(8, 1000), -1)
        s = flashinfer.top_k_top_p_sampling_from_probs(probs, 10, 0.9)
        assert s.device.type == "cuda"
        s = flashinfer.sampling_from_logits(torch.randn(8, 1000))
        assert s.device.type == "cuda"
        out, acc, em = flashinfer.chain_speculative_sampling(
            torch.softmax(torch.randn(2, 3, 50), -1), torch.zeros(2, 3, dtype=torch.int64),
            torch.softmax(torch.randn(2, 4, 50), -1))
        assert out.shape == (2, 4)
    finally:
        torch.set_default_device(None)


# ---------------------------------------------------------------------------------------------
# The one-CTA-per-row path (what SM80/89 run), forced on this GPU: the same results


def _all_ops(v, dtype, b=24):
    """Every op on one input; results as a list of tensors."""
    g = torch.Generator(device="cuda").manual_seed(v)
    logits = (torch.randn(b, v, device="cuda", generator=g) * 3).to(dtype)
    logits[1, : v // 3] = -float("inf")
    probs = torch.softmax(logits.float(), -1).to(dtype)
    probs[2, 5] = float("nan")
    probs[3] = 0
    k = torch.randint(1, 300, (b,), device="cuda", generator=g, dtype=torch.int32)
    p = torch.rand(b, device="cuda", generator=g) * 0.9 + 0.1
    idx = torch.randint(0, b, (3 * b,), device="cuda", generator=g)
    kw = dict(seed=7, offset=12)
    out = [
        sampling.sampling_from_probs(probs, return_valid=True, **kw)[0],
        sampling.sampling_from_probs(probs, indices=idx, **kw),
        sampling.sampling_from_logits(logits, **kw),
        sampling.top_p_sampling_from_probs(probs, p, **kw),
        sampling.top_p_sampling_from_probs(probs, 0.999, **kw),
        sampling.top_p_sampling_from_probs(probs, 0.01, **kw),  # mostly the exact fallback
        sampling.top_p_sampling_from_probs(probs, 1.0, **kw),
        sampling.top_k_sampling_from_probs(probs, k, **kw),
        sampling.min_p_sampling_from_probs(probs, 0.05, **kw),
        sampling.top_k_top_p_sampling_from_probs(probs, k, p, **kw),
        sampling.top_k_top_p_sampling_from_probs(probs, k, p, filter_apply_order="joint", **kw),
        sampling.top_p_renorm_probs(probs, p),
        sampling.top_k_renorm_probs(probs, k),
        sampling.top_k_mask_logits(logits, k),
    ]
    if dtype == torch.float32:
        n = 3
        target = torch.softmax(torch.randn(b, n + 1, v, device="cuda", generator=g), -1)
        draft = torch.softmax(torch.randn(b, n, v, device="cuda", generator=g), -1)
        ids = torch.randint(0, v, (b, n), device="cuda", generator=g)
        out += list(sampling.chain_speculative_sampling(draft, ids, target, **kw))
    return out, sampling.softmax(logits, 0.8)


@pytest.mark.gpu
@pytest.mark.parametrize("v, dtype", [(1000, torch.float32), (50001, torch.bfloat16),
                                      (128256, torch.float32), (256000, torch.float16)])
def test_one_cta_path_matches_cluster_path(v, dtype):
    from flashinfer import knobs

    ours, soft = _all_ops(v, dtype)
    with knobs.sampling.scope():
        knobs.sampling.no_cluster = True
        assert sampling._scratch(torch.device("cuda"), 4, v) is not None
        theirs, soft_1 = _all_ops(v, dtype)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert torch.equal(a, b), f"op {i} differs"
    # softmax sums in float in another order: equal to rounding
    torch.testing.assert_close(soft, soft_1, rtol=1e-5, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("b, v", [(64, 128256), (160, 128256), (64, 256000), (1100, 1000), (400, 4097)])
def test_direct_path_matches_one_cta_path(b, v):
    """Plain and min-p sampling of batches too large for one wave of the copy path's clusters
    read float32 probabilities where they lie (SampleKernel's kDirect, plan_direct): the same
    samples as the one-CTA path, bit for bit, with negatives (clamped to 0), a NaN row, a zero
    row, -0.0 and the indices path (more output rows than input rows); top-p too where a row
    takes 2 or more CTAs (128256 columns: its mass histogram decides the candidates, the flat
    row's go to the counting pass, p = 0.01 to the radix search)."""
    from flashinfer import knobs

    g = torch.Generator(device="cuda").manual_seed(b + v)
    probs = torch.softmax(torch.randn(b, v, device="cuda", generator=g) * 3, -1)
    probs[1, ::7] = -0.25
    probs[2, 5] = float("nan")
    probs[3] = 0
    probs[4, ::3] = -0.0
    probs[5] = 1.0 / v  # flat: every block holds kept values
    p = torch.rand(b, device="cuda", generator=g) * 0.9 + 0.1
    idx = torch.randint(0, b, (2 * b,), device="cuda", generator=g)
    kw = dict(seed=11, offset=8)

    def ops():
        return [
            *sampling.sampling_from_probs(probs, return_valid=True, **kw),
            sampling.sampling_from_probs(probs, indices=idx, **kw),
            sampling.top_p_sampling_from_probs(probs, p, **kw),
            sampling.top_p_sampling_from_probs(probs, 0.01, **kw),
            sampling.top_p_sampling_from_probs(probs, 1.0, **kw),
            sampling.top_p_sampling_from_probs(probs, 0.9, **kw),
            sampling.top_p_sampling_from_probs(probs, p.repeat(2), indices=idx, **kw),
            sampling.min_p_sampling_from_probs(probs, 0.05, **kw),
            # most blocks kept, and per-row min_p
            sampling.min_p_sampling_from_probs(probs, 0.001, **kw),
            sampling.min_p_sampling_from_probs(probs, p, **kw),
        ]

    ours = ops()
    with knobs.sampling.scope():
        knobs.sampling.no_cluster = True
        theirs = ops()
    for i, (a, c) in enumerate(zip(ours, theirs)):
        assert torch.equal(a, c), f"op {i} differs"
    assert not ours[1][2] and ours[1][:2].all(), "validity: the NaN row only"

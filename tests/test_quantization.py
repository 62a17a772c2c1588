"""flashinfer.quantization: packbits, segment_packbits (numpy.packbits semantics)."""

from __future__ import annotations

import pytest
import torch

import flashinfer
import flashinfer.quantization as quantization

BITORDERS = ["big", "little"]


def reference_packbits(x: torch.Tensor, bitorder: str) -> torch.Tensor:
    """numpy.packbits(x != 0, bitorder=bitorder) in plain torch, on x's device."""
    flags = x.reshape(-1).to(torch.bool).to(torch.int32)
    pad = (-flags.numel()) % 8
    flags = torch.cat([flags, flags.new_zeros(pad)]).view(-1, 8)
    shifts = torch.arange(8, device=x.device, dtype=torch.int32)
    if bitorder == "big":
        shifts = 7 - shifts
    return (flags << shifts).sum(1).to(torch.uint8)


def reference_segment_packbits(x: torch.Tensor, indptr: torch.Tensor, bitorder: str):
    bounds = indptr.tolist()
    parts = [reference_packbits(x[a:b], bitorder) for a, b in zip(bounds[:-1], bounds[1:])]
    y = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=x.device)
    lens = [0] + [p.numel() for p in parts]
    indptr_new = torch.tensor(lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    return y, indptr_new.to(x.device)


def random_values(n: int, dtype: torch.dtype, device: str = "cuda") -> torch.Tensor:
    """About half zeros; floats also get -0.0 (a zero), NaN and inf (nonzeros)."""
    keep = torch.rand(n, device=device) < 0.5
    if dtype == torch.bool:
        return keep
    if dtype.is_floating_point or dtype.is_complex:
        v = torch.randn(n, device=device).to(dtype)
        v = torch.where(keep, v, torch.zeros_like(v))
        if n >= 4:
            v[0], v[1] = -0.0, float("nan")
            v[2], v[3] = float("inf"), -0.0
        return v
    v = torch.randint(-3, 4, (n,), device=device)
    if dtype == torch.uint8:
        v = v.abs()
    return torch.where(keep, v, torch.zeros_like(v)).to(dtype)


# ---------------------------------------------------------------------------------------------
# Reference self-check (CPU): the reference must itself be numpy.packbits.


def test_reference_matches_numpy_examples():
    # numpy.packbits docs: [[1,0,1],[0,1,0]] with axis=None -> [[0b10101000]] (big).
    x = torch.tensor([1, 0, 1, 0, 1, 0], dtype=torch.uint8)
    assert reference_packbits(x, "big").tolist() == [0b10101000]
    assert reference_packbits(x, "little").tolist() == [0b00010101]
    x = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1], dtype=torch.bool)
    assert reference_packbits(x, "big").tolist() == [176, 128]
    assert reference_packbits(x, "little").tolist() == [13, 1]
    assert reference_packbits(torch.empty(0), "big").tolist() == []


# ---------------------------------------------------------------------------------------------
# Validation (CPU, nothing compiles)


@pytest.fixture
def no_compile(monkeypatch):
    def refuse():
        raise RuntimeError("validation must fail before the module is built")

    monkeypatch.setattr(quantization, "get_quantization_module", refuse)


def test_both_import_paths():
    assert flashinfer.packbits is quantization.packbits
    assert flashinfer.segment_packbits is quantization.segment_packbits


def test_packbits_cpu_input_is_rejected(no_compile):
    with pytest.raises(ValueError, match="CUDA"):
        flashinfer.packbits(torch.ones(9, dtype=torch.bool))


@pytest.mark.parametrize("bitorder", ["Big", "LITTLE", "", "middle", None])
def test_bad_bitorder(bitorder, no_compile):
    with pytest.raises(ValueError, match="bitorder"):
        flashinfer.packbits(torch.ones(9, dtype=torch.bool), bitorder=bitorder)
    with pytest.raises(ValueError, match="bitorder"):
        flashinfer.segment_packbits(
            torch.ones(9, dtype=torch.bool), torch.tensor([0, 9]), bitorder=bitorder
        )


def test_non_tensor_is_rejected(no_compile):
    with pytest.raises(TypeError, match="torch.Tensor"):
        flashinfer.packbits([1, 0, 1])
    with pytest.raises(TypeError, match="torch.Tensor"):
        flashinfer.segment_packbits(torch.ones(4), [0, 4])


def test_segment_packbits_validation(no_compile):
    x = torch.ones(10, dtype=torch.bool)
    indptr = torch.tensor([0, 3, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="CUDA"):
        flashinfer.segment_packbits(x, indptr)
    with pytest.raises(ValueError, match="x must be 1-D"):
        flashinfer.segment_packbits(x.view(2, 5), indptr)
    with pytest.raises(ValueError, match="indptr must be 1-D"):
        flashinfer.segment_packbits(x, indptr.view(1, 3))
    for dtype in (torch.float32, torch.int16, torch.uint8):
        with pytest.raises(ValueError, match="indptr must be int32 or int64"):
            flashinfer.segment_packbits(x, indptr.to(dtype))
    with pytest.raises(ValueError, match="at least 1 element"):
        flashinfer.segment_packbits(x, torch.empty(0, dtype=torch.int64))


# ---------------------------------------------------------------------------------------------
# packbits (GPU)

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000, 12345])
@pytest.mark.parametrize("bitorder", BITORDERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_packbits(n, bitorder, dtype):
    torch.manual_seed(n)
    x = random_values(n, dtype)
    y = flashinfer.packbits(x, bitorder)
    assert y.dtype == torch.uint8 and y.shape == ((n + 7) // 8,) and y.device == x.device
    assert torch.equal(y, reference_packbits(x, bitorder))


@pytest.mark.gpu
def test_packbits_default_bitorder_is_big():
    x = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1], dtype=torch.bool, device="cuda")
    assert flashinfer.packbits(x).tolist() == [176, 128]
    assert flashinfer.quantization.packbits(x, bitorder="little").tolist() == [13, 1]


@pytest.mark.gpu
def test_packbits_signed_zero_and_nan():
    x = torch.tensor([-0.0, 0.0, float("nan"), -float("inf"), 1e-40, -1e-45, 0.0, -0.0],
                     dtype=torch.float32, device="cuda")
    # -0.0 and 0.0 are zero; NaN, -inf and subnormals are nonzero.
    assert flashinfer.packbits(x).tolist() == [0b00111100]
    if hasattr(torch, "float8_e4m3fn"):
        x8 = torch.tensor([-0.0, 1.0, 0.0, -2.0, 0, 0, 0, 0], device="cuda").to(torch.float8_e4m3fn)
        assert flashinfer.packbits(x8).tolist() == [0b01010000]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bool, torch.int16, torch.float32, torch.int64])
@pytest.mark.parametrize("bitorder", BITORDERS)
def test_packbits_unaligned_and_strided(dtype, bitorder):
    base = random_values(4099, dtype)
    for x in (base[1:], base[3:4000], base[::3], base[5::2]):
        assert torch.equal(flashinfer.packbits(x, bitorder), reference_packbits(x, bitorder))


@pytest.mark.gpu
def test_packbits_flattens_like_numpy():
    x = random_values(3 * 17, torch.bool).view(3, 17)
    assert torch.equal(flashinfer.packbits(x), reference_packbits(x.reshape(-1), "big"))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [(1 << 20) + 3, 50_000_000])
def test_packbits_many_blocks(n):
    x = random_values(n, torch.bool)
    assert torch.equal(flashinfer.packbits(x, "little"), reference_packbits(x, "little"))


# ---------------------------------------------------------------------------------------------
# segment_packbits (GPU)


def random_indptr(lengths, start=0, dtype=torch.int32):
    return torch.tensor([start] + lengths, dtype=torch.int64).cumsum(0).to(dtype).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("bitorder", BITORDERS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(
    "dtype", [torch.bool, torch.uint8, torch.int32, torch.float16, torch.float32]
)
@pytest.mark.parametrize(
    "lengths, start, tail",
    [
        ([10], 0, 0),
        ([0], 0, 0),
        ([0, 0, 0], 2, 3),
        ([1, 7, 8, 9, 0, 16, 17, 0, 0, 1000, 12345], 0, 0),
        ([3, 0, 5, 0, 0, 64, 1], 5, 7),  # segments start past x[0] and end before x[-1]
    ],
)
def test_segment_packbits(bitorder, index_dtype, dtype, lengths, start, tail):
    torch.manual_seed(len(lengths) + start)
    x = random_values(start + sum(lengths) + tail, dtype)
    indptr = random_indptr(lengths, start, index_dtype)
    y, indptr_new = flashinfer.segment_packbits(x, indptr, bitorder)
    y_ref, indptr_new_ref = reference_segment_packbits(x, indptr, bitorder)
    assert indptr_new.dtype == torch.int32 and indptr_new.device == x.device
    assert torch.equal(indptr_new, indptr_new_ref)
    assert y.dtype == torch.uint8 and torch.equal(y, y_ref)


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_segment_packbits_many_random_segments(index_dtype):
    torch.manual_seed(0)
    lengths = torch.randint(0, 300, (2000,))
    lengths[torch.rand(2000) < 0.2] = 0  # plenty of empty segments
    lengths = lengths.tolist()
    x = random_values(sum(lengths), torch.bool)
    indptr = random_indptr(lengths, 0, index_dtype)
    for bitorder in BITORDERS:
        y, indptr_new = flashinfer.segment_packbits(x, indptr, bitorder)
        y_ref, indptr_new_ref = reference_segment_packbits(x, indptr, bitorder)
        assert torch.equal(indptr_new, indptr_new_ref) and torch.equal(y, y_ref)


@pytest.mark.gpu
def test_segment_packbits_no_segments():
    x = torch.ones(5, dtype=torch.bool, device="cuda")
    y, indptr_new = flashinfer.segment_packbits(x, torch.zeros(1, dtype=torch.int32, device="cuda"))
    assert y.shape == (0,) and y.dtype == torch.uint8
    assert indptr_new.tolist() == [0] and indptr_new.dtype == torch.int32


@pytest.mark.gpu
def test_segment_packbits_bad_indptr_values():
    x = torch.ones(10, dtype=torch.bool, device="cuda")
    bad = {
        "non-decreasing": [0, 5, 3, 10],
        "within": [0, 5, 11],
    }
    for match, values in bad.items():
        indptr = torch.tensor(values, dtype=torch.int32, device="cuda")
        with pytest.raises(ValueError, match=match):
            flashinfer.segment_packbits(x, indptr)
    with pytest.raises(ValueError, match="within"):
        flashinfer.segment_packbits(x, torch.tensor([-1, 5], dtype=torch.int64, device="cuda"))


@pytest.mark.gpu
def test_segment_packbits_cpu_indptr_is_rejected():
    x = torch.ones(10, dtype=torch.bool, device="cuda")
    with pytest.raises(ValueError, match="indptr must be on"):
        flashinfer.segment_packbits(x, torch.tensor([0, 10]))


@pytest.mark.large
def test_packbits_over_2_31_elements():
    # 2^31 + 77 elements (2 GB of uint8 0/1); more output bytes than the grid covers in one pass.
    n = (1 << 31) + 77
    x = torch.randint(0, 2, (n,), dtype=torch.uint8, device="cuda")
    y = flashinfer.packbits(x, "big")
    assert y.shape == ((n + 7) // 8,)
    chunk = 1 << 28  # elements per reference chunk (a multiple of 8)
    for i in range(0, n, chunk):
        ref = reference_packbits(x[i : i + chunk], "big")
        assert torch.equal(y[i // 8 : i // 8 + ref.numel()], ref)
    # One segment of everything but the first 3 elements: offsets past 2^31, unaligned loads.
    indptr = torch.tensor([3, n], dtype=torch.int64, device="cuda")
    ys, indptr_new = flashinfer.segment_packbits(x, indptr, "little")
    assert indptr_new.tolist() == [0, (n - 3 + 7) // 8]
    for i in range(0, n - 3, chunk):
        ref = reference_packbits(x[3 + i : 3 + i + chunk], "little")
        assert torch.equal(ys[i // 8 : i // 8 + ref.numel()], ref)

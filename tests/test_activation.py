"""flashinfer.activation: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import flashinfer
import flashinfer.activation as activation

OPS = {
    "silu_and_mul": lambda x: F.silu(x),
    "gelu_and_mul": lambda x: F.gelu(x),
    "gelu_tanh_and_mul": lambda x: F.gelu(x, approximate="tanh"),
}
HALF = [torch.float16, torch.bfloat16]
# One rounding of a float32 result on each side: at most 1 ulp apart (bf16 2^-7, fp16 2^-10
# relative); atol covers results that round to zero or a subnormal on one side only.
TOL = {torch.float16: dict(rtol=2e-3, atol=1e-4), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-4)}


def reference(op: str, x: torch.Tensor) -> torch.Tensor:
    """act(x[..., :d]) * x[..., d:] in float32, rounded once to x's dtype."""
    d = x.shape[-1] // 2
    xf = x.float()
    return (OPS[op](xf[..., :d]) * xf[..., d:]).to(x.dtype)


def call(op: str, *args, **kwargs):
    return getattr(flashinfer, op)(*args, **kwargs)


def check(op: str, x: torch.Tensor, got: torch.Tensor) -> None:
    torch.testing.assert_close(got, reference(op, x), **TOL[x.dtype])


# ---------------------------------------------------------------------------------------------
# Validation (CPU, nothing compiles)


@pytest.fixture
def no_compile(monkeypatch):
    def refuse():
        raise RuntimeError("validation must fail before the module is built")

    monkeypatch.setattr(activation, "get_activation_module", refuse)


def test_both_import_paths():
    for op in OPS:
        assert getattr(flashinfer, op) is getattr(activation, op)


def test_signatures_match_the_contract():
    from test_norm import contract_params

    E = inspect.Parameter.empty
    for op in OPS:
        assert contract_params(getattr(activation, op)) == (
            [("input", E), ("out", None), ("enable_pdl", None)], {"backend": "auto"})


@pytest.mark.parametrize("op", OPS)
def test_cpu_input_is_rejected(op, no_compile):
    with pytest.raises(ValueError, match="CUDA"):
        call(op, torch.ones(4, 128, dtype=torch.float16))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int16, torch.int32])
def test_non_half_dtype_is_rejected(op, dtype, no_compile):
    with pytest.raises(ValueError, match="input must be float16 or bfloat16"):
        call(op, torch.ones(4, 128, dtype=dtype))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("width", [2, 6, 12, 204, 2 * 11008 + 4])
def test_16_byte_rule_rejects(op, dtype, width, no_compile):
    with pytest.raises(ValueError) as e:
        call(op, torch.ones(3, width, dtype=dtype))
    assert str(e.value) == "The pointers must be multiple of 16 bytes."


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("width", [8, 128, 200, 2 * 11008])
def test_16_byte_rule_accepts(op, dtype, width, no_compile):
    # 200 = 2 * 100: each half is 200 bytes (8-byte aligned only), still accepted. On CPU the
    # next check to fail is the device check.
    with pytest.raises(ValueError, match="CUDA"):
        call(op, torch.ones(3, width, dtype=dtype))


@pytest.mark.parametrize("op", OPS)
def test_0d_input_is_rejected(op, no_compile):
    with pytest.raises(ValueError, match="at least 1 dimension"):
        call(op, torch.tensor(1.0, dtype=torch.float16))


@pytest.mark.parametrize("op", OPS)
def test_non_tensor_is_rejected(op, no_compile):
    with pytest.raises(TypeError, match="torch.Tensor"):
        call(op, [[1.0] * 16])
    with pytest.raises(TypeError, match="torch.Tensor"):
        call(op, torch.ones(2, 16, dtype=torch.float16), out=[1.0])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    "out_shape",
    [
        (4, 64),  # rank
        (2, 5, 64),  # leading dims
        (2, 4, 128),  # last dim 2d instead of d
        (2, 4, 63),
        (4, 2, 64),
    ],
)
def test_out_shape_mismatch_is_assertion_error(op, out_shape, no_compile):
    x = torch.ones(2, 4, 128, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="out"):
        call(op, x, out=torch.empty(out_shape, dtype=torch.bfloat16))


@pytest.mark.parametrize("op", OPS)
def test_out_dtype_mismatch(op, no_compile):
    x = torch.ones(2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dtype"):
        call(op, x, out=torch.empty(2, 64, dtype=torch.float16))


# ---------------------------------------------------------------------------------------------
# Results (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize("d", [64, 100, 128, 4096, 11008, 14336])
def test_matches_reference(op, dtype, rows, d):
    torch.manual_seed(rows * 100003 + d)
    x = torch.randn(rows, 2 * d, dtype=dtype, device="cuda") * 3
    got = call(op, x)
    assert got.shape == (rows, d) and got.dtype == dtype
    check(op, x, got)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("enable_pdl", [None, True, False])
def test_out_given_and_pdl(op, dtype, enable_pdl):
    x = torch.randn(2, 5, 2 * 1024, dtype=dtype, device="cuda")
    out = torch.full((2, 5, 1024), float("nan"), dtype=dtype, device="cuda")
    got = call(op, x, out=out, enable_pdl=enable_pdl)
    assert got is out
    check(op, x, out)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", [(256,), (1, 1, 256), (3, 5, 7, 2 * 96)])
def test_other_ranks(op, dtype, shape):
    x = torch.randn(shape, dtype=dtype, device="cuda")
    got = call(op, x)
    assert got.shape == (*shape[:-1], shape[-1] // 2)
    check(op, x, got)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "extra, offset",
    [
        (16, 0),  # row stride a multiple of 16 bytes: 16-byte accesses
        (4, 0),  # row stride 8 (mod 16) bytes: 8-byte accesses
        (8, 4),  # base pointer 8 bytes past 16-byte alignment: 8-byte accesses
        (3, 1),  # odd row stride and a 2-byte offset: element accesses
    ],
)
def test_strided_rows(op, dtype, extra, offset):
    rows, d = 37, 1024
    base = torch.randn(rows, 2 * d + extra, dtype=dtype, device="cuda")
    x = base[:, offset : offset + 2 * d]
    out_base = torch.full((rows, d + extra), float("nan"), dtype=dtype, device="cuda")
    out = out_base[:, offset : offset + d]
    got = call(op, x, out=out)
    assert got is out
    check(op, x, got)
    # The columns around the output view are untouched.
    assert out_base[:, :offset].isnan().all() and out_base[:, offset + d :].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_leading_dims_without_a_single_row_stride(op):
    # input (4, 6, 2d) whose two leading dims are transposed: no (24, 2d) view exists.
    x = torch.randn(6, 4, 2 * 512, dtype=torch.bfloat16, device="cuda").transpose(0, 1)
    out = torch.full((6, 4, 512), float("nan"), dtype=torch.bfloat16, device="cuda").transpose(0, 1)
    got = call(op, x, out=out)
    assert got is out
    check(op, x, out)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", [(1, 2 * 28672), (3, 2 * 64), (1000, 2 * 64), (4097, 2 * 200)])
def test_launch_geometries(op, dtype, shape):
    # One long row (split over many small blocks), many short rows (stacked several per block).
    x = torch.randn(shape, dtype=dtype, device="cuda") * 4
    check(op, x, call(op, x))


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF)
def test_extreme_values(op, dtype):
    big = 60000.0 if dtype == torch.float16 else 1e30
    vals = [0.0, -0.0, 1e-3, -1e-3, 5.0, -5.0, 10.0, -10.0, 30.0, -30.0, 87.5, -87.5, 100.0,
            -100.0, 1000.0, -1000.0, big, -big]
    d = 20  # a multiple of 4: passes the 16-byte rule; the tail is zeros
    a = torch.zeros(d, dtype=dtype, device="cuda")
    a[: len(vals)] = torch.tensor(vals, dtype=dtype)
    gate = torch.tensor([1.0, -2.0] * (d // 2), dtype=dtype, device="cuda")
    x = torch.cat([a, gate]).view(1, 2 * d)
    got = call(op, x)
    assert not got.isnan().any()
    check(op, x, got)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(0, 256), (5, 0), (0, 3, 64)])
def test_empty(op, shape):
    x = torch.randn(shape, dtype=torch.float16, device="cuda")
    got = call(op, x)
    assert got.shape == (*shape[:-1], shape[-1] // 2)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_cuda_graph(op):
    x = torch.randn(16, 2 * 4096, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(16, 4096, dtype=torch.bfloat16, device="cuda")
    call(op, x, out=out)  # build + warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(op, x, out=out)
    x.copy_(torch.randn_like(x))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(op, x, out)


@pytest.mark.large
@pytest.mark.parametrize("op", ["silu_and_mul"])
def test_over_2_31_elements(op):
    # input 131080 x 16384 bf16 = 2^31 + 131072 elements (4.3 GB); checked in row chunks.
    rows, d = (1 << 31) // (2 * 8192) + 8, 8192
    x = torch.empty(rows, 2 * d, dtype=torch.bfloat16, device="cuda")
    for i in range(0, rows, 8192):
        x[i : i + 8192].normal_()
    got = call(op, x)
    for i in range(0, rows, 16384):
        check(op, x[i : i + 16384], got[i : i + 16384])


@pytest.mark.large
@pytest.mark.parametrize("op", OPS)
def test_row_stride_over_2_31(op):
    # Two rows 2^31 + 256 elements apart (8.6 GB buffer).
    stride = (1 << 31) + 256
    base = torch.empty(2, stride, dtype=torch.bfloat16, device="cuda")
    x = base[:, : 2 * 128]
    x.copy_(torch.randn(2, 2 * 128, dtype=torch.bfloat16, device="cuda"))
    assert x.stride(0) == stride
    check(op, x, call(op, x))

"""flashinfer.scale: the tutorial op."""

import pytest
import torch

import flashinfer


def reference(x: torch.Tensor, factor: float) -> torch.Tensor:
    return (x.double() * factor).to(x.dtype)


def test_cpu_input_is_rejected_before_compiling():
    with pytest.raises(ValueError, match="CUDA"):
        flashinfer.scale(torch.ones(4), 2.0)


def test_validation():
    with pytest.raises(ValueError, match="input must be"):
        flashinfer.scale(torch.ones(4, dtype=torch.int32), 2.0)
    x = torch.ones(4, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="shape"):
        flashinfer.scale(x, 2.0, out=torch.empty(4, 9, dtype=torch.float16))
    with pytest.raises(ValueError, match="dtype"):
        flashinfer.scale(x, 2.0, out=torch.empty(4, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="torch.Tensor"):
        flashinfer.scale([1.0], 2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 129), (1024, 4096 + 3)])
@pytest.mark.parametrize("enable_pdl", [None, False, True])
def test_matches_reference(dtype, shape, enable_pdl):
    x = torch.randn(shape, dtype=dtype, device="cuda")
    out = torch.full_like(x, float("nan"))
    got = flashinfer.scale(x, -1.75, out=out, enable_pdl=enable_pdl)
    assert got is out
    torch.testing.assert_close(got, reference(x, -1.75), rtol=0, atol=0)


@pytest.mark.gpu
def test_strided_input_and_fresh_output():
    base = torch.randn(64, 256, dtype=torch.bfloat16, device="cuda")
    x = base[:, 3:200]
    torch.testing.assert_close(flashinfer.scale(x, 3.0), reference(x, 3.0), rtol=0, atol=0)

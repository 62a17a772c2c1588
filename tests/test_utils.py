"""flashinfer.utils: device queries, ALiBi slopes, integer helpers."""

from __future__ import annotations

import math

import pytest
import torch

from flashinfer import utils
from flashinfer.utils import ceil_div, get_alibi_slopes, round_up

# ---------------------------------------------------------------------------------------------
# ALiBi slopes and integer helpers


def _alibi_reference(n_heads: int) -> list:
    n = 2 ** math.floor(math.log2(n_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (n_heads - n), 2)]
    return slopes


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 8, 12, 28, 32, 40, 64, 96])
def test_alibi_slopes(n_heads):
    slopes = get_alibi_slopes(n_heads)
    assert slopes.dtype == torch.float32 and slopes.shape == (n_heads,)
    expected = torch.tensor(_alibi_reference(n_heads), dtype=torch.float64).to(torch.float32)
    torch.testing.assert_close(slopes, expected, rtol=0, atol=0)


def test_alibi_slopes_known_values():
    torch.testing.assert_close(
        get_alibi_slopes(4), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])
    )
    # 12 heads: 8 powers of 1/2, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    tail = get_alibi_slopes(12)[8:]
    torch.testing.assert_close(tail, torch.tensor([2.0 ** -(k / 2) for k in (1, 3, 5, 7)]))


@pytest.mark.parametrize("bad", [0, -4, True, 2.0])
def test_alibi_slopes_rejects_bad_head_counts(bad):
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        get_alibi_slopes(bad)


@pytest.mark.parametrize(
    "a, b, q", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (2**40 + 1, 2, 2**39 + 1)]
)
def test_ceil_div(a, b, q):
    assert ceil_div(a, b) == q


@pytest.mark.parametrize(
    "x, m, r", [(0, 16, 0), (1, 16, 16), (16, 16, 16), (17, 16, 32), (100, 3, 102)]
)
def test_round_up(x, m, r):
    assert round_up(x, m) == r


# ---------------------------------------------------------------------------------------------
# Device queries


def test_get_compute_capability_rejects_a_cpu_device():
    with pytest.raises(ValueError, match="must be a CUDA device"):
        utils.get_compute_capability("cpu")


@pytest.mark.gpu
def test_device_queries_on_the_real_device():
    major, minor = torch.cuda.get_device_capability(0)
    assert utils.get_compute_capability(torch.device("cuda:0")) == (major, minor)
    assert utils.get_compute_capability(0) == (major, minor)
    assert utils.device_support_pdl("cuda") == (major >= 9)

"""Device queries and small helpers used by the ops and by tests.

Each op states its own backends (``backend=`` and the tuple it is checked against with
:func:`flashinfer._checks.check_backend`); there is no decorator layer for them.
"""

from __future__ import annotations

import functools
from typing import Tuple, Union

import torch

__all__ = [
    "ceil_div",
    "device_support_pdl",
    "get_alibi_slopes",
    "get_compute_capability",
    "round_up",
]


def _device_index(device: Union[torch.device, str, int, None]) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, torch.device) and device.type == "cuda" and device.index is not None:
        return device.index  # a tensor's device (every op's call): no new torch.device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {device}")
    return torch.cuda.current_device() if device.index is None else device.index


@functools.cache
def _capability(index: int) -> Tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def get_compute_capability(device: Union[torch.device, str, int, None] = None) -> Tuple[int, int]:
    """(major, minor) compute capability of a CUDA device, cached per device."""
    return _capability(_device_index(device))


def device_support_pdl(device: Union[torch.device, str, int, None] = None) -> bool:
    """Programmatic Dependent Launch needs SM90 or newer."""
    return get_compute_capability(device)[0] >= 9


# --------------------------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------------------------


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, without going through floats."""
    return -(-a // b)


def round_up(x: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is ``>= x``."""
    return ceil_div(x, multiple) * multiple


def get_alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi slopes of Press et al., one per attention head.

    With ``n`` the largest power of two ``<= n_heads``, head ``i < n`` gets ``2^(-8(i+1)/n)``;
    the remaining ``n_heads - n`` heads get the odd powers ``1, 3, 5, ...`` of ``2^(-4/n)``
    (the slopes of ``2n`` heads that the first ``n`` skipped).

    Parameters
    ----------
    n_heads : int
        Number of query heads, ``>= 1``.

    Returns
    -------
    torch.Tensor
        float32 ``(n_heads,)`` on the CPU.

    Examples
    --------
    >>> get_alibi_slopes(4)
    tensor([0.2500, 0.0625, 0.0156, 0.0039])
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}")
    n = 1 << (n_heads.bit_length() - 1)
    # float64 math, one rounding to float32 at the end.
    slopes = torch.pow(2.0 ** (-8.0 / n), torch.arange(1, n + 1, dtype=torch.float64))
    if n < n_heads:
        odd = torch.arange(1, 2 * (n_heads - n), 2, dtype=torch.float64)
        slopes = torch.cat([slopes, torch.pow(2.0 ** (-4.0 / n), odd)])
    return slopes.to(torch.float32)

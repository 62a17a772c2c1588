"""``flashinfer.scale``: the tutorial op, the smallest example of every layer.

The module is not called ``scale.py``: importing a submodule binds its name on the package,
which would shadow the function ``flashinfer.scale``.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from ._checks import FLOAT_DTYPES, check_cuda, check_dtype, check_out, check_tensor, resolve_pdl
from .api_logging import flashinfer_api
from .jit.scale import gen_scale_module


@functools.cache
def get_scale_module():
    return gen_scale_module().build_and_load()


# [scale_api.begin]
@flashinfer_api
def scale(
    input: torch.Tensor,
    factor: float,
    out: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Multiply every element by a scalar.

    Parameters
    ----------
    input : torch.Tensor
        Any shape, float16, bfloat16 or float32, on a CUDA device. Non-contiguous inputs are
        copied to a contiguous tensor first.
    factor : float
        The multiplier.
    out : torch.Tensor, optional
        Contiguous, same shape and dtype as ``input``; written and returned.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+.

    Returns
    -------
    torch.Tensor
        ``input * factor`` (computed in float32, rounded once), ``out`` when given.

    Examples
    --------
    >>> x = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
    >>> y = flashinfer.scale(x, 2.0)
    """
    check_tensor(input, "input")
    check_dtype(input, "input", FLOAT_DTYPES)
    if out is not None:
        check_out(out, "out", shape=input.shape, dtype=input.dtype, device=input.device)
        if not out.is_contiguous():
            raise ValueError(f"out must be contiguous, got strides {tuple(out.stride())}")
    check_cuda(input, "input")
    input = input.contiguous()
    if out is None:
        out = torch.empty_like(input)
    get_scale_module().scale(out, input, float(factor), resolve_pdl(enable_pdl, input.device))
    return out
# [scale_api.end]

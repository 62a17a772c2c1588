"""``flashinfer.norm``: RMSNorm (plain, Gemma-style and fused with the residual add) and LayerNorm.

Each op reads every element once and writes it once: a row is held in registers between its
load and its store (``include/flashinfer/norm.cuh``), with float32 math and one final rounding.
Rows may be strided (any leading strides, the last dim contiguous), including strides and
tensors beyond 2**31 elements.
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from ._checks import (
    FLOAT_DTYPES,
    ModuleFunctions,
    check_backend,
    check_cuda,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
    check_out,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
    resolve_pdl,
)
from .api_logging import flashinfer_api
from .jit.norm import gen_norm_module

__all__ = [
    "rmsnorm",
    "fused_add_rmsnorm",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "layernorm",
]


@functools.cache
def get_norm_module():
    return gen_norm_module().build_and_load()


_fns = ModuleFunctions(lambda: get_norm_module())


# Gemma's variants apply the weight as (1 + w): the same kernels with an offset of 1.
_WEIGHT_OFFSET = {
    "rmsnorm": 0.0,
    "gemma_rmsnorm": 1.0,
    "fused_add_rmsnorm": 0.0,
    "gemma_fused_add_rmsnorm": 1.0,
}


def _check_rows(x: torch.Tensor, name: str, ndims: Sequence[int]) -> None:
    check_tensor(x, name)
    check_ndim(x, name, ndims)
    check_last_dim_contiguous(x, name)


def _check_like(input: torch.Tensor, x: torch.Tensor, name: str) -> None:
    """``x`` must have ``input``'s shape, dtype and device, last dim contiguous."""
    check_tensor(x, name)
    check_shape(x, name, input.shape)
    check_same_dtype(input, "input", x, name)
    check_same_device(input, "input", x, name)
    check_last_dim_contiguous(x, name)


def _check_param(input: torch.Tensor, v: torch.Tensor, name: str, dtype: torch.dtype) -> None:
    """A per-channel parameter: contiguous ``(hidden,)`` of ``dtype`` on ``input``'s device."""
    check_tensor(v, name)
    check_shape(v, name, (input.shape[-1],))
    if v.dtype != dtype:
        raise ValueError(f"{name} must be {str(dtype).replace('torch.', '')}, got {v.dtype}")
    check_same_device(input, "input", v, name)
    check_last_dim_contiguous(v, name)


def _rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: Optional[torch.Tensor],
    enable_pdl: Optional[bool],
    op: str,
    backend: str = "auto",
) -> torch.Tensor:
    fn = _fns.loaded.get(op)
    if fn is not None and backend == "auto":  # fast path: the binding's checks (ModuleFunctions)
        try:
            o = torch.empty_like(input) if out is None else out
            fn(o, input, weight, float(eps), resolve_pdl(enable_pdl, input.device))
            return o
        except Exception:
            pass  # the checked path raises the error
    check_backend(backend)
    _check_rows(input, "input", (2, 3))
    check_dtype(input, "input", FLOAT_DTYPES)
    _check_param(input, weight, "weight", input.dtype)
    if out is not None:
        check_out(out, "out", shape=input.shape, dtype=input.dtype, device=input.device)
        check_last_dim_contiguous(out, "out")
    check_cuda(input, "input")
    if out is None:
        out = torch.empty_like(input)
    pdl = resolve_pdl(enable_pdl, input.device)
    if backend == "cubin":
        from .artifacts import kernels as cubin

        cubin.rmsnorm(out, input, weight, float(eps), _WEIGHT_OFFSET[op], pdl)
    else:
        _fns(op)(out, input, weight, float(eps), pdl)
    return out


def _fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    enable_pdl: Optional[bool],
    op: str,
    backend: str = "auto",
) -> None:
    fn = _fns.loaded.get(op)
    if fn is not None and backend == "auto":  # fast path: the binding's checks (ModuleFunctions)
        try:
            fn(input, residual, weight, float(eps), resolve_pdl(enable_pdl, input.device))
            return
        except Exception:
            pass  # the checked path raises the error
    check_backend(backend)
    _check_rows(input, "input", (2,))
    check_dtype(input, "input", FLOAT_DTYPES)
    _check_like(input, residual, "residual")
    _check_param(input, weight, "weight", input.dtype)
    check_cuda(input, "input")
    pdl = resolve_pdl(enable_pdl, input.device)
    if backend == "cubin":
        from .artifacts import kernels as cubin

        cubin.fused_add_rmsnorm(input, residual, weight, float(eps), _WEIGHT_OFFSET[op], pdl)
    else:
        _fns(op)(input, residual, weight, float(eps), pdl)


# [rmsnorm_api.begin]
@flashinfer_api
def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    r"""Root mean square normalization over the last dim.

    ``out[i] = input[i] / sqrt(mean(input[i]**2) + eps) * weight``, in float32, rounded once.

    Parameters
    ----------
    input : torch.Tensor
        ``(batch, hidden)``, or ``(batch, num_heads, head_dim)`` to normalize each head (QK-norm);
        float16 or bfloat16 (float32 also accepted), on a CUDA device. The last dim must be
        contiguous; the leading strides are arbitrary.
    weight : torch.Tensor
        ``(hidden,)``, contiguous, ``input``'s dtype.
    eps : float
        Added to the mean square.
    out : torch.Tensor, optional
        ``input``'s shape and dtype, last dim contiguous (may be ``input`` itself); written and
        returned.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+. Never changes results.
    backend : str
        ``"auto"`` (default): the JIT-compiled module; ``"cubin"``: the kernel binary of the
        pinned artifact release, loaded through the CUDA driver (no nvcc; same results).

    Returns
    -------
    torch.Tensor
        The normalized tensor (``out`` when given).

    Examples
    --------
    >>> x = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
    >>> w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    >>> y = flashinfer.rmsnorm(x, w)
    >>> q = torch.randn(4, 32, 128, dtype=torch.bfloat16, device="cuda")  # per-head QK-norm
    >>> q_normed = flashinfer.rmsnorm(q, torch.ones(128, dtype=torch.bfloat16, device="cuda"))
    """
    return _rmsnorm(input, weight, eps, out, enable_pdl, "rmsnorm", backend)
# [rmsnorm_api.end]


@flashinfer_api
def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    r"""Gemma's RMSNorm: the weight is applied as ``(1 + weight)``.

    ``out[i] = input[i] / sqrt(mean(input[i]**2) + eps) * (1 + weight)``, in float32, rounded
    once.

    Parameters
    ----------
    input : torch.Tensor
        ``(batch, hidden)`` or ``(batch, num_heads, head_dim)``; float16 or bfloat16 (float32 also
        accepted); last dim contiguous, leading strides arbitrary.
    weight : torch.Tensor
        ``(hidden,)``, contiguous, ``input``'s dtype.
    eps : float
        Added to the mean square.
    out : torch.Tensor, optional
        ``input``'s shape and dtype, last dim contiguous; written and returned.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+. Never changes results.
    backend : str
        ``"auto"`` (default): the JIT-compiled module; ``"cubin"``: the kernel binary of the
        pinned artifact release, loaded through the CUDA driver (no nvcc; same results).

    Returns
    -------
    torch.Tensor
        The normalized tensor (``out`` when given).

    Examples
    --------
    >>> x = torch.randn(4, 3072, dtype=torch.bfloat16, device="cuda")
    >>> w = torch.zeros(3072, dtype=torch.bfloat16, device="cuda")  # (1 + 0): plain RMS scaling
    >>> y = flashinfer.gemma_rmsnorm(x, w)
    """
    return _rmsnorm(input, weight, eps, out, enable_pdl, "gemma_rmsnorm", backend)


@flashinfer_api
def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: Optional[bool] = None,
    *,
    backend: str = "auto",
) -> None:
    r"""Residual add then RMSNorm, in place on both tensors.

    With ``t = float(input) + float(residual)`` (float32): ``residual <- round(t)`` and
    ``input <- round(t / sqrt(mean(t**2) + eps) * weight)``, the norm computed from the
    unrounded ``t``.

    Parameters
    ----------
    input : torch.Tensor
        ``(batch, hidden)``, float16 or bfloat16 (float32 also accepted), last dim contiguous;
        overwritten with the normalized sum.
    residual : torch.Tensor
        ``input``'s shape and dtype, last dim contiguous; overwritten with the sum.
    weight : torch.Tensor
        ``(hidden,)``, contiguous, ``input``'s dtype.
    eps : float
        Added to the mean square.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+. Never changes results.
    backend : str
        ``"auto"`` (default): the JIT-compiled module; ``"cubin"``: the kernel binary of the
        pinned artifact release, loaded through the CUDA driver (no nvcc; same results).

    Returns
    -------
    None

    Examples
    --------
    >>> x = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
    >>> r = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
    >>> w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    >>> flashinfer.fused_add_rmsnorm(x, r, w)  # r = x + r; x = rmsnorm(x + r)
    """
    _fused_add_rmsnorm(input, residual, weight, eps, enable_pdl, "fused_add_rmsnorm", backend)


@flashinfer_api
def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: Optional[bool] = None,
    *,
    backend: str = "auto",
) -> None:
    r"""Residual add then Gemma RMSNorm (weight applied as ``(1 + weight)``), in place on both.

    With ``t = float(input) + float(residual)``: ``residual <- round(t)`` and
    ``input <- round(t / sqrt(mean(t**2) + eps) * (1 + weight))``, from the unrounded ``t``.

    Parameters
    ----------
    input : torch.Tensor
        ``(batch, hidden)``, float16 or bfloat16 (float32 also accepted), last dim contiguous.
    residual : torch.Tensor
        ``input``'s shape and dtype, last dim contiguous.
    weight : torch.Tensor
        ``(hidden,)``, contiguous, ``input``'s dtype.
    eps : float
        Added to the mean square.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+. Never changes results.
    backend : str
        ``"auto"`` (default): the JIT-compiled module; ``"cubin"``: the kernel binary of the
        pinned artifact release, loaded through the CUDA driver (no nvcc; same results).

    Returns
    -------
    None

    Examples
    --------
    >>> x = torch.randn(4, 3072, dtype=torch.bfloat16, device="cuda")
    >>> r = torch.randn(4, 3072, dtype=torch.bfloat16, device="cuda")
    >>> flashinfer.gemma_fused_add_rmsnorm(x, r, torch.zeros(3072, dtype=torch.bfloat16, device="cuda"))
    """
    _fused_add_rmsnorm(input, residual, weight, eps, enable_pdl, "gemma_fused_add_rmsnorm", backend)


@flashinfer_api
def layernorm(
    input: torch.Tensor,
    gemma: torch.Tensor,
    beta: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    r"""Layer normalization over the last dim.

    ``out[i] = (input[i] - mean(input[i])) / sqrt(var(input[i]) + eps) * gemma + beta`` with the
    biased variance, in float32, rounded once.

    Parameters
    ----------
    input : torch.Tensor
        ``(batch, hidden)``, bfloat16, last dim contiguous.
    gemma : torch.Tensor
        ``(hidden,)`` float32, contiguous: the scale (named ``gemma`` as in FlashInfer).
    beta : torch.Tensor
        ``(hidden,)`` float32, contiguous: the shift.
    eps : float
        Added to the variance.

    Returns
    -------
    torch.Tensor
        A new tensor of ``input``'s shape and dtype.

    Examples
    --------
    >>> x = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
    >>> g = torch.ones(4096, dtype=torch.float32, device="cuda")
    >>> b = torch.zeros(4096, dtype=torch.float32, device="cuda")
    >>> y = flashinfer.layernorm(x, g, b)
    """
    _check_rows(input, "input", (2,))
    check_dtype(input, "input", (torch.bfloat16,))
    _check_param(input, gemma, "gemma", torch.float32)
    _check_param(input, beta, "beta", torch.float32)
    check_cuda(input, "input")
    out = torch.empty_like(input)
    get_norm_module().layernorm(
        out, input, gemma, beta, float(eps), resolve_pdl(None, input.device)
    )
    return out

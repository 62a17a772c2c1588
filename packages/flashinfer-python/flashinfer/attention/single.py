"""Attention of one request: :func:`single_prefill_with_kv_cache` and
:func:`single_decode_with_kv_cache` run the batch kernel on a batch of one, with the plan made
once per problem and kept (``run_single``).

Semantics (api-contract sections 7 and 9): ``logit = sm_scale * q.k`` (``sm_scale`` defaults to
``1/sqrt(head_dim)``), optionally soft-capped ``c * tanh(logit / c)`` and ALiBi-biased; causal
masks are bottom-right aligned (row i of a request sees keys ``j <= kv_len - qo_len + i``);
``window_left = w`` keeps keys ``j >= kv_len - qo_len + i - w``; rows that see no key give 0 and
lse ``-inf``. Every lse is base 2: ``log2(sum_j exp(logit_j))``.
"""

from __future__ import annotations

import functools
from typing import Optional, Union

import torch

from .._checks import check_cuda, resolve_pdl
from ..api_logging import flashinfer_api
from ..jit.attention import check_fp8_head_dims
from . import runtime as rt
from .plan import schedule
from .wrapper import (
    check_head_dim,
    check_heads,
    check_single_kv,
    device_num_sms,
    make_variant,
    pack_mask,
    refuse_unsupported,
    upload,
)


@flashinfer_api
def single_prefill_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale_q: Optional[torch.Tensor] = None,
    scale_k: Optional[torch.Tensor] = None,
    scale_v: Optional[torch.Tensor] = None,
    o_dtype: Optional[torch.dtype] = None,
    custom_mask: Optional[torch.Tensor] = None,
    packed_custom_mask: Optional[torch.Tensor] = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    backend: str = "auto",
    return_lse: bool = False,
    kv_cache_sf: Optional[torch.Tensor] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Attention of one request's queries over its keys.

    Parameters
    ----------
    q : torch.Tensor
        ``(qo_len, num_qo_heads, head_dim)``, fp16 or bf16, last dim contiguous.
    k, v : torch.Tensor
        ``(kv_len, num_kv_heads, head_dim)`` (NHD) or ``(num_kv_heads, kv_len, head_dim)`` (HND),
        q's dtype or fp8 (``float8_e4m3fn``, ``float8_e5m2``; then ``k_scale`` / ``v_scale``
        dequantize: logits ``sm_scale * k_scale * q.k``, output ``v_scale * softmax . v``); any
        leading strides (K and V may differ). v's head dim may differ where the pair is
        supported (192 / 128); the output has v's. fp8 takes head_dim 64, 128 or 256.
    custom_mask : torch.Tensor, optional
        ``(qo_len, kv_len)`` bool, True = attend; overrides ``causal``. Or ``packed_custom_mask``
        (``packbits(mask.flatten(), "little")``).
    causal : bool
        Bottom-right aligned causal mask.
    return_lse : bool
        Also return the base-2 log-sum-exp ``(qo_len, num_qo_heads)`` float32.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        ``(qo_len, num_qo_heads, head_dim)`` in ``o_dtype`` (default q's), and the lse.

    Examples
    --------
    >>> q = torch.randn(128, 32, 128, dtype=torch.bfloat16, device="cuda")
    >>> k = torch.randn(512, 8, 128, dtype=torch.bfloat16, device="cuda")
    >>> o = single_prefill_with_kv_cache(q, k, k, causal=True)  # doctest: +SKIP
    """
    layout = rt.check_kv_layout(kv_layout)
    rt.check_pos_encoding(pos_encoding_mode)
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q must be a 3-D tensor, got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    check_single_kv(q, k, v)
    refuse_unsupported("single_prefill_with_kv_cache",
                       use_fp16_qk_reduction=use_fp16_qk_reduction)
    for name, value in (("scale_q", scale_q), ("scale_k", scale_k), ("scale_v", scale_v),
                        ("kv_cache_sf", kv_cache_sf)):
        if value is not None:
            raise NotImplementedError(f"single_prefill_with_kv_cache({name}=...) is not "
                                      f"supported by this implementation (fp8/fp4 inputs)")
    qo_len, num_qo_heads, head_dim = q.shape
    kv_len = k.shape[0] if layout == 0 else k.shape[1]
    num_kv_heads = k.shape[1] if layout == 0 else k.shape[0]
    check_head_dim(head_dim, v.shape[-1])
    check_fp8_head_dims(rt.dtype_name(k.dtype), head_dim, v.shape[-1])
    if k.shape[-1] != head_dim or v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"k and v must have shape {tuple(k.shape[:-1])} with head dims "
                         f"{head_dim} and {v.shape[-1]}, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    check_heads(num_qo_heads, num_kv_heads)
    if custom_mask is not None and tuple(custom_mask.shape) != (qo_len, kv_len):
        raise ValueError(f"custom_mask must have shape {(qo_len, kv_len)}, got "
                         f"{tuple(custom_mask.shape)}")
    o_dtype = rt.parse_dtype(o_dtype, "o_dtype") or q.dtype
    rt.check_half(o_dtype, "o_dtype")
    sm, o_scale = rt.resolve_scales(head_dim, sm_scale, None, k_scale, v_scale)
    check_cuda(q, "q")
    return run_single(q, k, v, layout, custom_mask, packed_custom_mask, causal, pos_encoding_mode,
                   sm, o_scale, window_left, logits_soft_cap, rope_scale, rope_theta,
                   return_lse, o_dtype, fixed_split_size=None, backend=backend)


@flashinfer_api
def single_decode_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    return_lse: bool = False,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Attention of one query token ``q (Hq, D)`` over ``k``, ``v`` ``(kv_len, Hkv, D)`` (NHD)
    or ``(Hkv, kv_len, D)`` (HND). Returns ``(Hq, D)``, or ``(o, lse (Hq,))`` with
    ``return_lse``. The query sits at position ``kv_len - 1`` (RoPE). ``k``/``v`` may be fp8
    (``float8_e4m3fn``, ``float8_e5m2``) under a half q: ``q_scale * k_scale`` multiplies the
    logits, ``v_scale`` the output."""
    layout = rt.check_kv_layout(kv_layout)
    rt.check_pos_encoding(pos_encoding_mode)
    if not isinstance(q, torch.Tensor) or q.dim() != 2:
        raise ValueError(f"q must be 2-D (num_qo_heads, head_dim), got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    check_single_kv(q, k, v)
    num_qo_heads, head_dim = q.shape
    check_head_dim(head_dim)
    check_fp8_head_dims(rt.dtype_name(k.dtype), head_dim, head_dim)
    if k.shape[-1] != head_dim or v.shape != k.shape:
        raise ValueError(f"k and v must have the same shape with head_dim {head_dim}, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    check_heads(num_qo_heads, k.shape[1] if layout == 0 else k.shape[0])
    sm, o_scale = rt.resolve_scales(head_dim, sm_scale, q_scale, k_scale, v_scale)
    check_cuda(q, "q")
    result = run_single(q.unsqueeze(0), k, v, layout, None, None, False, pos_encoding_mode,
                     sm, o_scale, window_left, logits_soft_cap, rope_scale, rope_theta,
                     return_lse, q.dtype, fixed_split_size=None)
    if return_lse:
        return result[0].squeeze(0), result[1].squeeze(0)
    return result.squeeze(0)



def run_single(q, k, v, layout, custom_mask, packed_custom_mask, causal, pos_encoding_mode,
               sm, o_scale, window_left, logits_soft_cap, rope_scale, rope_theta, return_lse,
               o_dtype, fixed_split_size, backend="auto"):
    """Shared by single prefill and single decode: one request through the batch kernel, its
    launch (plan, upload, parameter record) made once per problem (``runtime.single_launches``).
    ``sm``, ``o_scale``: the caller's ``runtime.resolve_scales`` (checked once per call)."""
    qo_len, num_qo_heads, head_dim = q.shape
    use_mask = custom_mask is not None or packed_custom_mask is not None
    device = q.device
    key = (device, q.dtype, k.dtype, o_dtype, q.shape, k.shape, v.shape[-1], layout, causal,
           pos_encoding_mode,
           window_left, logits_soft_cap, rope_scale, rope_theta, fixed_split_size, backend)
    launch = None if use_mask else rt.single_launches.get(key)
    if launch is None:
        launch = _single_launch(q, k, v.shape[-1], layout, custom_mask, packed_custom_mask,
                                causal,
                                pos_encoding_mode, sm, o_scale, window_left, logits_soft_cap,
                                rope_scale, rope_theta, o_dtype, fixed_split_size, backend)
        if not use_mask:
            cache = rt.single_launches
            if len(cache) >= _SINGLE_CACHE_SIZE:
                cache.pop(next(iter(cache)))
            cache[key] = launch
    o = torch.empty(qo_len, num_qo_heads, v.shape[-1], dtype=o_dtype, device=device)
    lse = torch.empty(qo_len, num_qo_heads, dtype=torch.float32, device=device) \
        if return_lse else None
    launch(q, k, v, o, lse, sm, o_scale, resolve_pdl(None, device))
    return (o, lse) if return_lse else o


# Single-request launches by problem (device, dtypes, shapes, layout, mask and every option the
# plan or the record depends on): a call with a problem seen before neither schedules nor
# uploads (the plan is the same; scheduling and uploading it cost 30-100 us of host time). The
# oldest entry goes when the cache is full. A split-KV plan's partial states are its entry's
# own buffers, shared by the calls of that problem, as FlashInfer shares one scratch buffer
# among all its single-request calls: concurrent calls of one problem on different streams are
# not supported.
_SINGLE_CACHE_SIZE = 64


def _single_launch(q, k, head_dim_vo, layout, custom_mask, packed_custom_mask, causal,
                   pos_encoding_mode, sm, o_scale, window_left, logits_soft_cap, rope_scale,
                   rope_theta, o_dtype, fixed_split_size, backend) -> rt.Launch:
    """Plan one request, upload the plan and resolve its launch (its options checked first:
    nothing is compiled for arguments that are wrong)."""
    window_left = rt.check_window_left(window_left)
    softcap = rt.soft_cap(logits_soft_cap)
    rs, rth = rt.rope_defaults(rope_scale, rope_theta)
    device = q.device
    qo_len, num_qo_heads, head_dim = q.shape
    kv_len = k.shape[0] if layout == 0 else k.shape[1]
    num_kv_heads = k.shape[1] if layout == 0 else k.shape[0]
    use_mask = custom_mask is not None or packed_custom_mask is not None
    mask_mode = "custom" if use_mask else ("causal" if causal else "none")
    variant = make_variant(q.dtype, o_dtype, head_dim, mask_mode, pos_encoding_mode, paged=False,
                           kv_dtype=k.dtype, head_dim_vo=head_dim_vo)
    plan, buf = schedule([qo_len], [kv_len], group_size=num_qo_heads // num_kv_heads,
                         num_kv_heads=num_kv_heads, head_dim=head_dim, head_dim_vo=head_dim_vo,
                         num_sms=device_num_sms(device), causal=mask_mode == "causal",
                         kv_chunk_size=fixed_split_size,
                         backend=rt.resolve_backend(device, variant, backend))
    # One upload: the plan, the two indptrs, and (split KV) the merge counters, all 0.
    counters = plan.item_capacity * num_kv_heads if plan.split_kv else 0
    dev = torch.cat([buf, torch.tensor([0, qo_len, 0, kv_len], dtype=torch.int32),
                     torch.zeros(counters, dtype=torch.int32)])
    dev = upload(dev, device)
    n = buf.numel()
    partials = None
    if plan.split_kv:
        partials = (torch.empty(plan.num_partials * num_qo_heads * head_dim_vo,
                                dtype=torch.float32, device=device),
                    torch.empty(plan.num_partials * num_qo_heads, dtype=torch.float32,
                                device=device))
    mask = mask_indptr = None
    if use_mask:
        mask, mask_indptr = pack_mask(custom_mask, packed_custom_mask, [qo_len], [kv_len], device)
        mask_indptr = upload(mask_indptr, device)
    return rt.prepare(
        rt.get_attention_module(variant), plan, dev[:n], num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads, kv_layout=layout, qo_indptr=dev[n:n + 2],
        kv_indptr=dev[n + 2:n + 4], partials=partials,
        counters=dev[n + 4:] if counters else None, custom_mask=mask, mask_indptr=mask_indptr,
        alibi_slopes=rt.alibi_slopes_for(pos_encoding_mode, num_qo_heads, device),
        sm_scale=sm, logits_soft_cap=softcap, o_scale=o_scale,
        rope_scale=rs, rope_theta=rth, window_left=window_left,
        enable_pdl=resolve_pdl(None, device))


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache,
                                                            return_lse=True)


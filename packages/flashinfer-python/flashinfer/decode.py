"""Decode attention: one query token per request, over a paged KV cache for a batch
(:class:`BatchDecodeWithPagedKVCacheWrapper`) or over one request's K/V
(:func:`single_decode_with_kv_cache`). The public names only; the engine is
:mod:`flashinfer.attention`."""

from .attention.decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    fast_decode_plan,
)
from .attention.single import single_decode_with_kv_cache

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "fast_decode_plan",
    "single_decode_with_kv_cache",
]

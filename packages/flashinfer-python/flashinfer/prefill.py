"""Prefill attention: one request (:func:`single_prefill_with_kv_cache`) and batches over a paged
(:class:`BatchPrefillWithPagedKVCacheWrapper`) or ragged (:class:`BatchPrefillWithRaggedKVCacheWrapper`)
KV cache. The public names only; the engine is :mod:`flashinfer.attention`."""

from .attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from .attention.single import (
    single_prefill_with_kv_cache,
    single_prefill_with_kv_cache_return_lse,
)

__all__ = [
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
]

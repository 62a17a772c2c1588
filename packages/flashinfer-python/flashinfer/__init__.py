"""FlashInfer: GPU kernels for LLM serving.

``import flashinfer`` is cheap: it imports neither torch nor TVM-FFI and touches no file. Each
op's submodule (and torch with it) is imported on first use of one of its names. One exception:
in a process that has already imported torch (every process that calls an op), TVM-FFI, which
binds every kernel, is imported here, so its 20-60 ms land at import, as they do upstream, and
not on the first op call.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

try:
    from ._build_meta import __git_commit__, __version__
except ImportError:  # a source tree that was never built
    __version__ = "0.0.0+unknown"
    __git_commit__ = "unknown"

__git_version__ = __git_commit__

# public name -> submodule that defines it
_OPS = {
    "tutorial": ["scale"],
    "norm": [
        "rmsnorm",
        "fused_add_rmsnorm",
        "gemma_rmsnorm",
        "gemma_fused_add_rmsnorm",
        "layernorm",
    ],
    "activation": ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"],
    "rope": [
        "apply_rope",
        "apply_rope_inplace",
        "apply_rope_pos_ids",
        "apply_rope_pos_ids_inplace",
        "apply_llama31_rope",
        "apply_llama31_rope_inplace",
        "apply_llama31_rope_pos_ids",
        "apply_llama31_rope_pos_ids_inplace",
        "apply_rope_with_cos_sin_cache",
        "apply_rope_with_cos_sin_cache_inplace",
    ],
    "quantization": ["packbits", "segment_packbits"],
    "page": ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"],
    "cascade": ["merge_state", "merge_state_in_place", "merge_states",
                "MultiLevelCascadeAttentionWrapper"],
    "decode": ["single_decode_with_kv_cache", "BatchDecodeWithPagedKVCacheWrapper",
               "CUDAGraphBatchDecodeWithPagedKVCacheWrapper", "fast_decode_plan"],
    "sampling": ["softmax", "sampling_from_probs", "sampling_from_logits",
                 "top_p_sampling_from_probs", "top_k_sampling_from_probs",
                 "min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs",
                 "top_k_top_p_sampling_from_logits", "top_p_renorm_probs", "top_k_renorm_probs",
                 "top_k_mask_logits", "chain_speculative_sampling", "top_p_renorm_prob",
                 "top_k_renorm_prob"],
    "prefill": ["single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse",
                "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"],
    "topk": ["top_k", "top_k_page_table_transform", "top_k_ragged_transform", "TopKTieBreak"],
}
_LAZY_NAMES = {name: module for module, names in _OPS.items() for name in names}
_SUBMODULES = {
    "activation",
    "aot",
    "api_logging",
    "artifacts",
    "attention",
    "cascade",
    "decode",
    "exceptions",
    "jit",
    "knobs",
    "norm",
    "page",
    "prefill",
    "quantization",
    "rope",
    "sampling",
    "testing",
    "topk",
    "utils",
}

__all__ = sorted(_LAZY_NAMES) + ["__version__", "__git_commit__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'flashinfer' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_NAMES) | _SUBMODULES)


if "torch" in sys.modules:
    try:
        import tvm_ffi  # noqa: F401
    except (ImportError, OSError):
        pass  # the first op that needs it imports it again and raises the error there

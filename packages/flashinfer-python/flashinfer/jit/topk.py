"""Build spec of the top-k module (top_k, top_k_page_table_transform, top_k_ragged_transform:
one translation unit, one kernel per input dtype)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_topk_module() -> JitSpec:
    return JitSpec(name="topk", precompiled=True, sources=("topk.cu",), supported_major_versions=SM80_AND_NEWER)

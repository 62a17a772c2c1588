"""Build spec of the norm module (rmsnorm, gemma_rmsnorm, fused_add_rmsnorm,
gemma_fused_add_rmsnorm, layernorm: one translation unit)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_norm_module() -> JitSpec:
    return JitSpec(name="norm", precompiled=True, sources=("norm.cu",),
                   supported_major_versions=SM80_AND_NEWER)

"""Build spec of the activation module (silu/gelu/gelu_tanh and mul)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_activation_module() -> JitSpec:
    return JitSpec(name="activation", precompiled=True, sources=("activation.cu",),
                   supported_major_versions=SM80_AND_NEWER)

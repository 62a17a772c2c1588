"""Build spec of the quantization module (packbits, segment_packbits)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_quantization_module() -> JitSpec:
    return JitSpec(name="quantization", precompiled=True, sources=("quantization.cu",),
                   supported_major_versions=SM80_AND_NEWER)

"""Build spec of the quantization module (packbits, segment_packbits)."""

from .core import JitSpec


def gen_quantization_module() -> JitSpec:
    return JitSpec(name="quantization", sources=("quantization.cu",))

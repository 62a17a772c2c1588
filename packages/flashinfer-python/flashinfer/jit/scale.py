"""Build spec of the scale module."""

from .core import JitSpec


def gen_scale_module() -> JitSpec:
    return JitSpec(name="scale", sources=("scale.cu",))

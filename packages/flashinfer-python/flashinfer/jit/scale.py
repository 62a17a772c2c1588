"""Build spec of the scale module."""

from .core import SM80_AND_NEWER, JitSpec


def gen_scale_module() -> JitSpec:
    return JitSpec(name="scale", precompiled=True, sources=("scale.cu",),
                   supported_major_versions=SM80_AND_NEWER)

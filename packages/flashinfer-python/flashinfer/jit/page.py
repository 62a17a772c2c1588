"""Build spec of the page module (csrc/page.cu, include/flashinfer/page.cuh)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_page_module() -> JitSpec:
    # One TU: the append copy for 1-, 2- and 4-byte elements (fp8, half, float), 16-byte vectors
    # or one element per access, and the ragged-to-COO index kernel.
    return JitSpec(name="page", precompiled=True, sources=("page.cu",),
                   supported_major_versions=SM80_AND_NEWER)

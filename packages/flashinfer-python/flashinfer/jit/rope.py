"""Build spec of the rope module (csrc/rope.cu, include/flashinfer/rope.cuh)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_rope_module() -> JitSpec:
    # One TU: 48 kernels (fp16/bf16 x int32/int64 x 16-byte/scalar x NeoX/GPT-J x three
    # position sources), ~25 s of nvcc for one arch.
    return JitSpec(name="rope", precompiled=True, sources=("rope.cu",),
                   supported_major_versions=SM80_AND_NEWER)

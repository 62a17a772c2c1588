"""Build spec of the cascade module (csrc/cascade.cu, include/flashinfer/cascade.cuh)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_cascade_module() -> JitSpec:
    # One TU: merge_state, merge_state_in_place, merge_states and merge_states_varlen, each for
    # fp16/bf16/fp32 and for 16-byte vectors or one element per access (24 kernels).
    return JitSpec(name="cascade", precompiled=True, sources=("cascade.cu",),
                   supported_major_versions=SM80_AND_NEWER)

"""Build spec of the sampling module (csrc/sampling.cu, include/flashinfer/sampling*.cuh)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_sampling_module() -> JitSpec:
    # One TU: a sampling, a transform kernel per input dtype (fp32/fp16/bf16; the filter and the
    # transform are runtime arguments) and the chain speculative kernel, 7 kernels. Each runs
    # one thread-block cluster per row on SM90+, one CTA per row (global scratch) on SM80/89.
    return JitSpec(name="sampling", precompiled=True, sources=("sampling.cu",),
                   supported_major_versions=SM80_AND_NEWER)

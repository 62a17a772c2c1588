"""Build spec of the sampling module (csrc/sampling.cu, include/flashinfer/sampling*.cuh)."""

from .core import JitSpec

# Thread-block clusters and distributed shared memory: SM90 and newer.
SM90_AND_NEWER = (9, 10, 11, 12)


def gen_sampling_module() -> JitSpec:
    # One TU: a sampling, a transform kernel per input dtype (fp32/fp16/bf16; the filter and the
    # transform are runtime arguments) and the chain speculative kernel, 7 kernels.
    return JitSpec(name="sampling", precompiled=True, sources=("sampling.cu",),
                   supported_major_versions=SM90_AND_NEWER)

"""Build spec of the sampling module (csrc/sampling*.cu, include/flashinfer/sampling*.cuh)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_sampling_module() -> JitSpec:
    # Two TUs, compiled side by side: the sampling kernel per input dtype (fp32/fp16/bf16; the
    # filter is a runtime argument), then the transform kernel per dtype and the chain
    # speculative kernel, 7 kernels. Each runs one thread-block cluster per row on SM90+, one
    # CTA per row (global scratch) on SM80/89. One TU took 16.4 s for sm_90a on the 2-core CPU
    # machine; the two take 11.9 and 11.4 s (each parses the same headers, ~6.5 s of it).
    return JitSpec(name="sampling", precompiled=True,
                   sources=("sampling.cu", "sampling_transform.cu"),
                   supported_major_versions=SM80_AND_NEWER)

"""Build spec of the sampling module (csrc/sampling*.cu, include/flashinfer/sampling*.cuh)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_sampling_module() -> JitSpec:
    # Seventeen TUs, compiled side by side: the two bindings (sampling.cu: `sample`;
    # sampling_transform.cu: `transform`, `chain_speculative` and its kernel), which spend most
    # of their time in the host compiler (TVM-FFI's headers), and the kernels: the sampling
    # kernel per filter set (the draw alone: plain and min-p; top-p; top-k; top-k with top-p:
    # each holds only the code its filters run, which keeps it out of spills at the register
    # cap), the heavy sets and the transform kernel one input dtype a TU, top-p's direct path and
    # the on-chip transforms (top-p renorm, top-k, softmax) a TU each. A kernel is compiled only
    # in the TU that instantiates its launcher (templates declared extern in the header): with
    # the on-chip kernels compiled in all 13 TUs of 674b747 the first call took 22.5-24.6 s after
    # the import on the H100 machine's 16 cores, with them apart 14.2-14.7 s (target 20 s).
    return JitSpec(name="sampling", precompiled=True,
                   sources=("sampling.cu", "sampling_draw.cu", "sampling_top_p.cu",
                            "sampling_top_p_direct.cu", "sampling_top_p_half.cu",
                            "sampling_top_p_bf16.cu", "sampling_top_k.cu",
                            "sampling_top_k_top_p.cu", "sampling_top_k_top_p_half.cu",
                            "sampling_top_k_top_p_bf16.cu", "sampling_transform.cu",
                            "sampling_transform_float.cu", "sampling_transform_half.cu",
                            "sampling_transform_bf16.cu", "sampling_resident_top_p.cu",
                            "sampling_resident_top_k.cu", "sampling_resident_softmax.cu"),
                   supported_major_versions=SM80_AND_NEWER)

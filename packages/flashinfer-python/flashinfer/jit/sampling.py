"""Build spec of the sampling module (csrc/sampling*.cu, include/flashinfer/sampling*.cuh)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_sampling_module() -> JitSpec:
    # Thirteen TUs, compiled side by side: the two bindings (sampling.cu: `sample`;
    # sampling_transform.cu: `transform`, `chain_speculative` and its kernel), which spend most
    # of their time in the host compiler (TVM-FFI's headers), and the kernels: the sampling
    # kernel per filter set (the draw alone: plain and min-p; top-p; top-k; top-k with top-p:
    # each holds only the code its filters run, which keeps it out of spills at the register
    # cap), the heavy sets and the transform kernel one input dtype a TU. Each runs one
    # thread-block cluster per row on SM90+, one CTA per row (global scratch) on SM80/89. With
    # five TUs (three dtypes each, kernels beside the bindings) the first-call build took 25-26 s
    # on the H100 machine's 16 cores with nothing else building (target 20 s).
    return JitSpec(name="sampling", precompiled=True,
                   sources=("sampling.cu", "sampling_draw.cu", "sampling_top_p.cu",
                            "sampling_top_p_half.cu", "sampling_top_p_bf16.cu",
                            "sampling_top_k.cu", "sampling_top_k_top_p.cu",
                            "sampling_top_k_top_p_half.cu", "sampling_top_k_top_p_bf16.cu",
                            "sampling_transform.cu", "sampling_transform_float.cu",
                            "sampling_transform_half.cu", "sampling_transform_bf16.cu"),
                   supported_major_versions=SM80_AND_NEWER)

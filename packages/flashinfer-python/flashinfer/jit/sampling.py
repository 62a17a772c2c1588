"""Build spec of the sampling module (csrc/sampling*.cu, include/flashinfer/sampling*.cuh)."""

from .core import SM80_AND_NEWER, JitSpec


def gen_sampling_module() -> JitSpec:
    # Five TUs, compiled side by side: the sampling kernel per input dtype and filter set (the
    # draw alone: plain and min-p, with the binding; top-p; top-k; top-k with top-p: each kernel
    # holds only the code its filters run, which keeps it out of spills at the register cap),
    # then the transform kernel per dtype and the chain speculative kernel. Each runs one
    # thread-block cluster per row on SM90+, one CTA per row (global scratch) on SM80/89. On the
    # 2-core CPU machine (sm_90a) the binding's TU takes ~13 s (it parses TVM-FFI's headers), the
    # kernel-only ones ~8 s each.
    return JitSpec(name="sampling", precompiled=True,
                   sources=("sampling.cu", "sampling_top_p.cu", "sampling_top_k.cu",
                            "sampling_top_k_top_p.cu", "sampling_transform.cu"),
                   supported_major_versions=SM80_AND_NEWER)

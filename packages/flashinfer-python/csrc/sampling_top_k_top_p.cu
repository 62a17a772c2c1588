// SampleKernel for top-k with top-p (joint, or top-k first), float32 input: a translation unit of
// its own (kernels only; one dtype a unit, so that the first-call build compiles them side by
// side), built beside csrc/sampling.cu, which launches it.
#include <flashinfer/sampling.cuh>

namespace flashinfer::sampling {
FLASHINFER_SAMPLE_FILTER(, float, kTopKTopPFilters)
}  // namespace flashinfer::sampling

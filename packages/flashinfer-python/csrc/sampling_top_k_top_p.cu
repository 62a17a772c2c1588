// SampleKernel for top-k with top-p (joint, or top-k first), every input dtype: a translation
// unit of its own (kernels only), built beside csrc/sampling.cu, which launches it.
#include <flashinfer/sampling.cuh>

namespace flashinfer::sampling {
FLASHINFER_SAMPLE_FILTERS(, kTopKTopPFilters)
}  // namespace flashinfer::sampling

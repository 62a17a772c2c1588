// SampleKernel for the draw alone (plain and min-p sampling, the direct path included), every
// input dtype: a translation unit of its own (kernels only), built beside csrc/sampling.cu, which
// launches it.
#include <flashinfer/sampling.cuh>

namespace flashinfer::sampling {
FLASHINFER_SAMPLE_FILTERS(, kDrawFilters)
}  // namespace flashinfer::sampling

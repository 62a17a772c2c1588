// SampleKernel for top-k alone, every input dtype: a translation unit of its own (kernels only),
// built beside csrc/sampling.cu, which launches it.
#include <flashinfer/sampling.cuh>

namespace flashinfer::sampling {
FLASHINFER_SAMPLE_FILTERS(, kTopKFilters)
}  // namespace flashinfer::sampling

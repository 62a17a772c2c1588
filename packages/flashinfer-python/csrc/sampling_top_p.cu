// SampleKernel for top-p (the rejection; the radix search where it falls back), every input
// dtype: a translation unit of its own (kernels only), built beside csrc/sampling.cu, which
// launches it.
#include <flashinfer/sampling.cuh>

namespace flashinfer::sampling {
FLASHINFER_SAMPLE_FILTERS(, kTopPFilters)
}  // namespace flashinfer::sampling

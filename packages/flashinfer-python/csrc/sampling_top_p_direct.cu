// SampleKernel for top-p on the direct path (each float32 row on chip in a cluster): a
// translation unit of its own (kernels only, so that the first-call build compiles it side by
// side with top-p's other float32 kernel, csrc/sampling_top_p.cu, whose SampleFilters launches it).
#include <flashinfer/sampling.cuh>

namespace flashinfer::sampling {
FLASHINFER_SAMPLE_DIRECT(, kTopPFilters)
}  // namespace flashinfer::sampling

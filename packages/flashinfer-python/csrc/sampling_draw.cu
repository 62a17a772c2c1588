// SampleKernel for the draw alone (plain and min-p sampling, the direct path included), every
// input dtype: a translation unit of its own (kernels only), built beside csrc/sampling.cu, which
// launches it.
#include <flashinfer/sampling.cuh>

namespace flashinfer::sampling {
FLASHINFER_SAMPLE_FILTERS(, kDrawFilters)
#if FLASHINFER_SAMPLING_PROBE_TRACE
/// The trace probe's stamps of this unit's kernels (the draw set) into `dst` on the host.
cudaError_t DrawTraceCopy(void* dst) {
  return cudaMemcpyFromSymbol(dst, sampling_trace, sizeof(sampling_trace));
}
#endif
}  // namespace flashinfer::sampling

// TransformKernel for float32 input: a translation unit of its own (kernels only; one dtype a unit,
// so that the first-call build compiles them side by side), built beside
// csrc/sampling_transform.cu, which launches it.
#include <flashinfer/sampling.cuh>

namespace flashinfer::sampling {
FLASHINFER_TRANSFORM_ROWS(, float)
}  // namespace flashinfer::sampling

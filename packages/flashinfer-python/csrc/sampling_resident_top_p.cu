// TopPResidentKernel (top-p renorm of float32 rows on chip): a translation unit of its own
// (kernels only, so that the first-call build compiles it side by side), built beside
// csrc/sampling_transform_float.cu, whose TransformRows<float> launches it (transform_resident).
#include <flashinfer/sampling.cuh>

namespace flashinfer::sampling {
FLASHINFER_RESIDENT(, topp_resident)
}  // namespace flashinfer::sampling

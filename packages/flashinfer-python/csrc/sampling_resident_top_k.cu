// TopKStreamKernel and TopKResidentKernel (top-k mask / renorm of float32 rows on chip): a
// translation unit of their own (kernels only, so that the first-call build compiles them side
// by side), built beside csrc/sampling_transform_float.cu, whose TransformRows<float> launches
// them (transform_resident).
#include <flashinfer/sampling.cuh>

namespace flashinfer::sampling {
FLASHINFER_RESIDENT(, topk_resident)
}  // namespace flashinfer::sampling

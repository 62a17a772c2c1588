// Cubin entry for the gated activations (artifacts/kernels.json, families *_and_mul): one
// explicit instantiation of ActAndMulKernel from include/flashinfer/activation.cuh per cubin.
//   FI_T       element type (__half, __nv_bfloat16)
//   FI_ACCESS  bytes per access: 16, 8, or 0 for one element
//   FI_ACT     the activation functor (flashinfer::activation::SiluOp, GeluOp, GeluTanhOp)
// See norm.cu for why these are instantiations rather than extern "C" wrappers.
#include <flashinfer/activation.cuh>

#include "entry.cuh"

namespace fi_act = flashinfer::activation;
constexpr int kBytes = FI_ACCESS == 0 ? static_cast<int>(sizeof(FI_T)) : FI_ACCESS;

template __global__ void fi_act::ActAndMulKernel<FI_T, kBytes, FI_ACT>(const FI_T*, FI_T*,
                                                                       fi_act::ActAndMulParams);

#include FI_LAYOUT_CHECK

// Cubin entry for the norm kernels (artifacts/kernels.json, families rmsnorm and
// fused_add_rmsnorm). One cubin holds exactly one explicit instantiation of a kernel template
// from include/flashinfer/norm.cuh, chosen by the macros the builder passes:
//   FI_T       element type (__half, __nv_bfloat16, float)
//   FI_ACCESS  bytes per access: 16 (N = 16 / sizeof(T) elements), or 0 for one element (N = 1)
//   FI_VECS    vectors per thread: 4 or 8 (register kernels), 0 = the loop kernel for long rows
//
// Why instantiations and not extern "C" wrappers: the kernels are __global__ templates, and a
// __global__ function cannot call another, so a wrapper would have to copy the kernel body. An
// explicit instantiation is the very code the JIT module runs (same header, same flags); the
// builder reads its entry symbol from the cubin's ELF symbol table and records it in the
// manifest, and the loader asks the driver for that symbol.
#include <flashinfer/norm.cuh>

#include "entry.cuh"

namespace fi_norm = flashinfer::norm;
constexpr int kN = FI_ACCESS == 0 ? 1 : FI_ACCESS / static_cast<int>(sizeof(FI_T));
static_assert(FI_ACCESS == 0 || kN == flashinfer::kVec16<FI_T>, "norm kernels access 16 bytes or one element");

#if defined(FI_KERNEL_RMSNORM) && FI_VECS == 0
template __global__ void fi_norm::RMSNormLoopKernel<FI_T, kN>(const fi_norm::RMSNormParams<FI_T>);
#elif defined(FI_KERNEL_RMSNORM)
template __global__ void fi_norm::RMSNormKernel<FI_T, kN, FI_VECS>(
    const fi_norm::RMSNormParams<FI_T>);
#elif defined(FI_KERNEL_FUSED_ADD_RMSNORM)
template __global__ void fi_norm::FusedAddRMSNormKernel<FI_T, kN, FI_VECS>(
    const fi_norm::RMSNormParams<FI_T>);
#else
#error "define FI_KERNEL_RMSNORM or FI_KERNEL_FUSED_ADD_RMSNORM"
#endif

#include FI_LAYOUT_CHECK

// Kernel launch with an optional Programmatic Dependent Launch (PDL) attribute.
//
// With PDL on (SM90+), a kernel may start while the previous kernel in the stream is still
// finishing; it must call pdl_wait() before reading anything that kernel wrote, and may call
// pdl_launch_dependents() once its own inputs are consumed so the next kernel can start early.
// Both are no-ops on older architectures and when the launch did not ask for PDL.
#pragma once
#include <cuda_runtime.h>

namespace flashinfer {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/*!
 * @brief Launch `kernel` on `stream`, allowing programmatic dependent launch when `enable_pdl`.
 * @return the launch's cudaError_t (configuration errors surface here, not later).
 */
template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                          cudaStream_t stream, bool enable_pdl, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = enable_pdl ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
}

inline constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace flashinfer

// Kernel launch with an optional Programmatic Dependent Launch (PDL) attribute.
//
// With PDL on (SM90+), a kernel may start while the previous kernel in the stream is still
// finishing; it must call pdl_wait() before reading anything that kernel wrote, and may call
// pdl_launch_dependents() once its own inputs are consumed so the next kernel can start early.
// Both are no-ops on older architectures and when the launch did not ask for PDL.
#pragma once
#include <cuda_runtime.h>

#include <utility>

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
 * @brief Launch `kernel` on `stream`, allowing programmatic dependent launch when `enable_pdl`,
 *   with the grid's CTAs in thread-block clusters of `cluster_x` along x where it is not 0.
 * @return the launch's cudaError_t (configuration errors surface here, not later).
 */
template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel_clustered(void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                                    size_t smem_bytes, cudaStream_t stream, bool enable_pdl,
                                    unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = enable_pdl ? 1 : 0;
  attribute[1].id = cudaLaunchAttributeClusterDimension;
  attribute[1].val.clusterDim.x = cluster_x;
  attribute[1].val.clusterDim.y = 1;
  attribute[1].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = cluster_x ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
}

/// launch_kernel_clustered without clusters.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                          cudaStream_t stream, bool enable_pdl, Args&&... args) {
  return launch_kernel_clustered(kernel, grid, block, smem_bytes, stream, enable_pdl, 0u,
                                 std::forward<Args>(args)...);
}

inline constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace flashinfer

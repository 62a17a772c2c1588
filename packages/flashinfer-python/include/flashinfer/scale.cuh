// scale: out = input * factor. The smallest complete op; every layer of a kernel family in
// one screen. Framework-free: raw pointers in, cudaError_t out.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.cuh"
#include "vec.cuh"

namespace flashinfer {
namespace scale {

// [scale_kernel.begin]
/*!
 * @brief out[i] = input[i] * factor over n contiguous elements.
 * @tparam T element type; each thread moves 16 bytes per step, the tail element-wise.
 */
template <typename T>
__global__ void ScaleKernel(const T* __restrict__ input, T* __restrict__ out, float factor,
                            int64_t n) {
  constexpr int kVec = kVec16<T>;
  pdl_wait();
  const int64_t num_vecs = n / kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < num_vecs;
       i += stride) {
    auto v = Vec<T, kVec>::load_stream(input + i * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = from_float<T>(to_float(v[j]) * factor);
    v.store(out + i * kVec);
  }
  for (int64_t i = num_vecs * kVec + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += stride) {
    out[i] = from_float<T>(to_float(input[i]) * factor);
  }
  pdl_launch_dependents();
}
// [scale_kernel.end]

/// Launch ScaleKernel; `input` and `out` must be 16-byte aligned.
template <typename T>
cudaError_t Scale(const T* input, T* out, float factor, int64_t n, bool enable_pdl,
                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  // Enough blocks to fill every SM several times over; the grid-stride loop covers the rest.
  const int64_t blocks = ceil_div(ceil_div(n, kVec16<T>), kThreads);
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
  return launch_kernel(ScaleKernel<T>, dim3(grid), dim3(kThreads), 0, stream, enable_pdl, input,
                       out, factor, n);
}

}  // namespace scale
}  // namespace flashinfer

// Warp- and block-wide reductions over float.
#pragma once
#include <cuda_runtime.h>

namespace flashinfer {

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

/*!
 * @brief Sum of `x` over the block; every thread receives the result.
 * @param scratch shared memory of at least 32 floats, not in use by the caller during the call.
 */
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = (blockDim.x + 31) / 32;
  x = warp_sum(x);
  if (num_warps == 1) return x;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < num_warps ? scratch[lane] : 0.f;
  return warp_sum(x);
}

}  // namespace flashinfer

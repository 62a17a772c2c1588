// Bit packing (numpy.packbits semantics): eight "nonzero?" flags per output byte, bit order
// "big" (first element in the most significant bit) or "little" (first element in bit 0).
// packbits packs one 1-D array; segment_packbits packs each segment x[indptr[i]:indptr[i+1]]
// on its own, each padded to whole bytes. Framework-free: raw pointers in, cudaError_t out.
//
// Elements arrive as unsigned integers of their width (the caller reinterprets the tensor):
// an element counts as nonzero iff (bits & mask) != 0, with mask = all ones for integers and
// bool, and everything but the sign bit for IEEE floats (so -0.0 is zero, NaN is nonzero).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "launch.cuh"
#include "vec.cuh"

namespace flashinfer {
namespace quantization {

/// Threads per block; the op is a stream, so any multiple of a warp that keeps blocks resident
/// works.
inline constexpr int kThreads = 256;
/// Output bytes per thread per tile, all inputs loaded before any is packed: for bool input
/// that is 4 independent 8-byte loads in flight per thread.
inline constexpr int kBytesPerThread = 4;

/// Unsigned integer of the same width as one input element.
template <typename U>
inline constexpr bool is_element_type_v =
    std::is_same_v<U, uint8_t> || std::is_same_v<U, uint16_t> || std::is_same_v<U, uint32_t> ||
    std::is_same_v<U, uint64_t>;

/*!
 * @brief The 8 elements x[0..8) (16-byte or narrower vector loads), which must be aligned to
 *        min(16, 8 * sizeof(U)) bytes.
 */
template <typename U>
__device__ __forceinline__ void load8_aligned(const U* x, U (&v)[8]) {
  constexpr int kPerLoad = 8 * sizeof(U) < 16 ? 8 : static_cast<int>(16 / sizeof(U));
  using W = std::conditional_t<8 * sizeof(U) < 16, uint2, uint4>;  // uint2 only for 1-byte U
#pragma unroll
  for (int i = 0; i < 8; i += kPerLoad) {
    const W w = __ldcs(reinterpret_cast<const W*>(x + i));
    memcpy(&v[i], &w, sizeof(W));
  }
}

/// Pack flags of v[0..count) into one byte; elements past `count` read as zero.
template <typename U>
__device__ __forceinline__ uint8_t pack_byte(const U (&v)[8], int count, U mask, bool little) {
  uint32_t byte = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t bit = (k < count && (v[k] & mask) != 0) ? 1u : 0u;
    byte |= bit << (little ? k : 7 - k);
  }
  return static_cast<uint8_t>(byte);
}

/// Load up to 8 elements x[start .. start+count): one aligned vector load when possible.
template <typename U>
__device__ __forceinline__ void load8(const U* x, int64_t start, int count, bool vec_ok,
                                      U (&v)[8]) {
  if (vec_ok && count == 8 && start % 8 == 0) {
    load8_aligned(x + start, v);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = k < count ? x[start + k] : U{0};
  }
}

// [packbits_kernel.begin]
/*!
 * @brief y[j] = flags of x[8j .. 8j+8) for j < ceil(n / 8).
 * @tparam U unsigned integer of the element width
 * @param x_aligned x is aligned to min(16, 8 * sizeof(U)) bytes (then every 8-element group is)
 */
template <typename U>
__global__ void __launch_bounds__(kThreads)
    PackBitsKernel(const U* __restrict__ x, int64_t n, U mask, bool little, bool x_aligned,
                   uint8_t* __restrict__ y, int64_t num_bytes) {
  static_assert(is_element_type_v<U>, "U must be uint8_t, uint16_t, uint32_t or uint64_t");
  pdl_wait();
  const int64_t tile_bytes = static_cast<int64_t>(blockDim.x) * kBytesPerThread;
  for (int64_t base = blockIdx.x * tile_bytes + threadIdx.x; base < num_bytes;
       base += static_cast<int64_t>(gridDim.x) * tile_bytes) {
    U v[kBytesPerThread][8];
    int count[kBytesPerThread];
#pragma unroll
    for (int b = 0; b < kBytesPerThread; ++b) {
      const int64_t j = base + b * static_cast<int64_t>(blockDim.x);
      const int64_t left = n - j * 8;  // <= 0 past the end
      count[b] = static_cast<int>(left < 8 ? (left > 0 ? left : 0) : 8);
      load8(x, j * 8, count[b], x_aligned, v[b]);
    }
#pragma unroll
    for (int b = 0; b < kBytesPerThread; ++b) {
      const int64_t j = base + b * static_cast<int64_t>(blockDim.x);
      if (j < num_bytes) y[j] = pack_byte(v[b], count[b], mask, little);
    }
  }
  pdl_launch_dependents();
}
// [packbits_kernel.end]

/*!
 * @brief Segment-wise packbits. Output byte j belongs to the segment i with
 *        indptr_new[i] <= j < indptr_new[i+1] (found by binary search, so uneven segments
 *        balance across threads) and holds the flags of x[indptr[i] + 8k ...],
 *        k = j - indptr_new[i].
 * @param indptr num_segments + 1 input offsets (int32 or int64)
 * @param indptr_new num_segments + 1 output offsets,
 *        indptr_new[i+1] - indptr_new[i] = ceil(len_i / 8)
 */
template <typename U, typename IdType>
__global__ void __launch_bounds__(kThreads)
    SegmentPackBitsKernel(const U* __restrict__ x, const IdType* __restrict__ indptr,
                          const int32_t* __restrict__ indptr_new, int64_t num_segments, U mask,
                          bool little, bool x_aligned, uint8_t* __restrict__ y, int64_t num_bytes) {
  static_assert(is_element_type_v<U>, "U must be uint8_t, uint16_t, uint32_t or uint64_t");
  pdl_wait();
  const int64_t tile_bytes = static_cast<int64_t>(blockDim.x) * kBytesPerThread;
  for (int64_t base = blockIdx.x * tile_bytes + threadIdx.x; base < num_bytes;
       base += static_cast<int64_t>(gridDim.x) * tile_bytes) {
    U v[kBytesPerThread][8];
    int count[kBytesPerThread];
#pragma unroll
    for (int b = 0; b < kBytesPerThread; ++b) {
      const int64_t j = base + b * static_cast<int64_t>(blockDim.x);
      count[b] = 0;
      int64_t start = 0;
      if (j < num_bytes) {
        // Largest i with indptr_new[i] <= j; empty segments (equal offsets) are skipped because
        // j < total = indptr_new[num_segments] guarantees indptr_new[i+1] > j.
        int64_t lo = 0, hi = num_segments;  // invariant: indptr_new[lo] <= j < indptr_new[hi]
        while (hi - lo > 1) {
          const int64_t mid = (lo + hi) / 2;
          if (__ldg(indptr_new + mid) <= j) lo = mid; else hi = mid;
        }
        const int64_t seg_begin = static_cast<int64_t>(__ldg(indptr + lo));
        const int64_t seg_end = static_cast<int64_t>(__ldg(indptr + lo + 1));
        start = seg_begin + (j - __ldg(indptr_new + lo)) * 8;
        const int64_t left = seg_end - start;
        count[b] = static_cast<int>(left < 8 ? (left > 0 ? left : 0) : 8);
      }
      load8(x, start, count[b], x_aligned, v[b]);
    }
#pragma unroll
    for (int b = 0; b < kBytesPerThread; ++b) {
      const int64_t j = base + b * static_cast<int64_t>(blockDim.x);
      if (j < num_bytes) y[j] = pack_byte(v[b], count[b], mask, little);
    }
  }
  pdl_launch_dependents();
}

/// Blocks for `num_bytes` outputs: one tile per block, capped where the grid-stride loop takes
/// over (a few waves of blocks on any current GPU).
inline unsigned packbits_grid(int64_t num_bytes) {
  const int64_t blocks = ceil_div(num_bytes, static_cast<int64_t>(kThreads) * kBytesPerThread);
  constexpr int64_t kMaxBlocks = 65536;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

/// Alignment that makes every 8-element group of x one or more aligned vector loads.
template <typename U>
bool packbits_aligned(const U* x) {
  return is_aligned(x, 8 * sizeof(U) < 16 ? static_cast<int>(8 * sizeof(U)) : 16);
}

/*!
 * @brief y[0 .. ceil(n/8)) = bit-packed flags (x[i] & mask) != 0.
 * @param little bit order: false = "big" (x[8j] -> bit 7), true = "little" (x[8j] -> bit 0)
 */
template <typename U>
cudaError_t PackBits(const U* x, int64_t n, U mask, bool little, uint8_t* y, bool enable_pdl,
                     cudaStream_t stream) {
  const int64_t num_bytes = ceil_div(n, 8);
  if (num_bytes == 0) return cudaSuccess;
  return launch_kernel(PackBitsKernel<U>, dim3(packbits_grid(num_bytes)), dim3(kThreads), 0,
                       stream, enable_pdl, x, n, mask, little, packbits_aligned(x), y, num_bytes);
}

/*!
 * @brief Segment-wise PackBits; `num_bytes` = indptr_new[num_segments] (the caller knows it:
 *        it had to size y).
 */
template <typename U, typename IdType>
cudaError_t SegmentPackBits(const U* x, const IdType* indptr, const int32_t* indptr_new,
                            int64_t num_segments, U mask, bool little, uint8_t* y,
                            int64_t num_bytes, bool enable_pdl, cudaStream_t stream) {
  if (num_bytes == 0 || num_segments == 0) return cudaSuccess;
  return launch_kernel(SegmentPackBitsKernel<U, IdType>, dim3(packbits_grid(num_bytes)),
                       dim3(kThreads), 0, stream, enable_pdl, x, indptr, indptr_new, num_segments,
                       mask, little, packbits_aligned(x), y, num_bytes);
}

}  // namespace quantization
}  // namespace flashinfer

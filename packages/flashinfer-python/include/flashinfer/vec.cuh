// Vector types and element conversions shared by the elementwise and row kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashinfer {

/// The integer type of one access of `Bytes` bytes. Copying through it keeps loads and stores
/// one instruction wide: a struct of __half copied member-wise compiles to 2-byte stores.
template <int Bytes>
struct Word;
template <>
struct Word<16> {
  using type = int4;
};
template <>
struct Word<8> {
  using type = int2;
};
template <>
struct Word<4> {
  using type = int;
};
template <>
struct Word<2> {
  using type = short;
};

/*!
 * @brief N elements of T moved as one aligned access (16 bytes when N * sizeof(T) == 16).
 * @tparam T element type (float, __half, __nv_bfloat16)
 * @tparam N elements per vector
 */
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  static_assert(sizeof(T) * N <= 16 && (sizeof(T) * N & (sizeof(T) * N - 1)) == 0,
                "Vec must be 2, 4, 8 or 16 bytes");
  using W = typename Word<sizeof(T) * N>::type;
  T data[N];

  __device__ __forceinline__ static Vec load(const T* ptr) {
    Vec v;
    *reinterpret_cast<W*>(v.data) = *reinterpret_cast<const W*>(ptr);
    return v;
  }
  // Streaming load: data read once should not evict what is reused (weights).
  __device__ __forceinline__ static Vec load_stream(const T* ptr) {
    Vec v;
    *reinterpret_cast<W*>(v.data) = __ldcs(reinterpret_cast<const W*>(ptr));
    return v;
  }
  __device__ __forceinline__ void store(T* ptr) const {
    *reinterpret_cast<W*>(ptr) = *reinterpret_cast<const W*>(data);
  }
  __device__ __forceinline__ T& operator[](int i) { return data[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return data[i]; }
};

/// Elements of T in one 16-byte access.
template <typename T>
inline constexpr int kVec16 = 16 / sizeof(T);

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// True when `ptr` can be accessed with `bytes`-wide vector instructions.
__host__ __device__ __forceinline__ bool is_aligned(const void* ptr, int bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

}  // namespace flashinfer

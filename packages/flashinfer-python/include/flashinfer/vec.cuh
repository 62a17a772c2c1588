// Vector types and element conversions shared by the elementwise and row kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace flashinfer {

/// 2^x in one instruction (MUFU.EX2, ~2 ulp); subnormal results flush to 0. The softmax-style
/// kernels' exponential (attention, the cascade merges, sampling's resident transforms): exp2f
/// costs 5 instructions, __expf's subnormal fix-up 3 more.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

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

/*!
 * @brief N elements of T held as raw 32-bit words (16-bit types two to a word) and converted to
 *        float32 at use. An array of 16-bit values costs one register per element; raw words
 *        cost one per two (measured: bf16 rows spilled under a 64-register cap as __half2/bf16
 *        arrays, not as words). Kernels add their own loads (cache hints, L2 prefetch) in
 *        `Derived`, which pack() returns.
 * @tparam Derived the kernel's vector type (CRTP)
 * @tparam T float, __half or __nv_bfloat16
 * @tparam N elements: 2, 4, 8 or 16 bytes in all
 */
template <typename Derived, typename T, int N>
struct PackedWords {
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  static_assert(kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16,
                "a packed vector is 2, 4, 8 or 16 bytes");
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16- and 32-bit elements only");
  static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  uint32_t w[kWords];

  __device__ __forceinline__ void store(T* ptr) const {
    if constexpr (kBytes == 16) {
      *reinterpret_cast<uint4*>(ptr) = make_uint4(w[0], w[1], w[2], w[3]);
    } else if constexpr (kBytes == 8) {
      *reinterpret_cast<uint2*>(ptr) = make_uint2(w[0], w[1]);
    } else if constexpr (kBytes == 4) {
      *reinterpret_cast<uint32_t*>(ptr) = w[0];
    } else {
      *reinterpret_cast<uint16_t*>(ptr) = static_cast<uint16_t>(w[0]);
    }
  }

  /// Element j as float32 (j a compile-time constant after unrolling).
  __device__ __forceinline__ float get(int j) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(w[j]);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const uint32_t word = w[j / 2];  // little-endian: element 2k is the low half
      return __uint_as_float(j % 2 == 0 ? word << 16 : word & 0xffff0000u);
    } else {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j / 2]));
      return j % 2 == 0 ? f.x : f.y;
    }
  }

  /// N floats rounded to T (to nearest even), two per instruction for 16-bit types.
  __device__ __forceinline__ static Derived pack(const float (&f)[N]) {
    Derived r;
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int j = 0; j < N; ++j) r.w[j] = __float_as_uint(f[j]);
    } else if constexpr (N == 1) {
      r.w[0] = std::is_same_v<T, __nv_bfloat16> ? __bfloat16_as_ushort(__float2bfloat16_rn(f[0]))
                                                : __half_as_ushort(__float2half_rn(f[0]));
    } else {
#pragma unroll
      for (int k = 0; k < kWords; ++k) {
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
          const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
          r.w[k] = *reinterpret_cast<const uint32_t*>(&h);
        } else {
          const __half2 h = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
          r.w[k] = *reinterpret_cast<const uint32_t*>(&h);
        }
      }
    }
    return r;
  }
};

/// True when `ptr` can be accessed with `bytes`-wide vector instructions.
__host__ __device__ __forceinline__ bool is_aligned(const void* ptr, int bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

}  // namespace flashinfer

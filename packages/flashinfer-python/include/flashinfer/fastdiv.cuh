// Division by a runtime-invariant divisor with a multiply-high and a shift.
//
// A 32-bit integer division is a ~20-instruction sequence on NVIDIA GPUs and a 64-bit one ~70;
// kernels that map a flat item index to (row, head, vector) do one or two per item. With the
// divisor fixed for a launch, the host computes a magic multiplier once and the device divides
// with __umulhi + shift. Granlund & Montgomery, "Division by invariant integers using
// multiplication" (PLDI 1994), Theorem 4.2 with N = 31: for d >= 2, l = ceil(log2 d) and
// m = floor(2^(31+l) / d) + 1 (< 2^32), floor(n / d) == floor(n * m / 2^(31+l)) for every
// 0 <= n < 2^31. d == 1 is encoded as m == 0.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace flashinfer {

/*!
 * @brief floor(n / d) and n % d for a divisor d fixed at launch time, for n < 2^31.
 *
 * Built on the host (kernel parameter), used on the device. Dividends at or above 2^31 must go
 * through div64(), which falls back to a hardware division for them.
 */
struct FastDiv {
  uint32_t d = 1;
  uint32_t mul = 0;    // 0 encodes d == 1
  uint32_t shift = 0;  // l - 1: __umulhi already shifts by 32

  FastDiv() = default;
  /// @param divisor in [1, 2^31)
  explicit FastDiv(uint32_t divisor) : d(divisor == 0 ? 1 : divisor) {
    if (d == 1) return;
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    mul = static_cast<uint32_t>((uint64_t{1} << (31 + l)) / d + 1);
    shift = l - 1;
  }

  /// floor(n / d) for n < 2^31.
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return mul == 0 ? n : __umulhi(n, mul) >> shift;
  }

  /// (floor(n / d), n % d) for n < 2^31.
  __device__ __forceinline__ void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * d;
  }

  /// (floor(n / d), n % d) for any n >= 0: the fast path below 2^31, a 64-bit division above.
  __device__ __forceinline__ void divmod64(int64_t n, int64_t& q, int64_t& r) const {
    if (n < (int64_t{1} << 31)) {
      const uint32_t q32 = div(static_cast<uint32_t>(n));
      q = q32;
      r = n - int64_t{q32} * d;
    } else {
      q = n / d;
      r = n - q * d;
    }
  }
};

}  // namespace flashinfer

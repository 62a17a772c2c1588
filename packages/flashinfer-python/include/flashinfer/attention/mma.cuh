// Warp-level building blocks of the attention kernels: asynchronous global->shared copies,
// ldmatrix, the m16n8k16 tensor-core MMA (fp32 accumulate) and the swizzled shared-memory tile
// layout they read. Plain inline PTX, sm_80 and newer.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../mbarrier.cuh"  // smem_addr
#include "../vec.cuh"

namespace flashinfer {
namespace attn {

/// 16-byte asynchronous copy; with `pred` false the destination is zero-filled and nothing is
/// read (rows past the end of a sequence must be zeros, not garbage: 0 * NaN is NaN).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(pred ? 16 : 0));
}

/// Fetches the 128-byte line holding `gmem` into the L2 (no registers, no completion to wait for).
__device__ __forceinline__ void prefetch_l2(const void* gmem) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gmem));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Wait until at most `N` committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// Four 8x8 b16 matrices; lane l gives the row address of matrix l/8, row l%8 (a shared-state
/// space address: smem_addr).
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// As ldmatrix_x4_at, each matrix transposed (the B operand from a row-major [k][n] tile).
__device__ __forceinline__ void ldmatrix_x4_trans_at(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// ldmatrix_x4_at of a generic pointer into shared memory.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem) {
  ldmatrix_x4_at(r, smem_addr(smem));
}

/// ldmatrix_x4_trans_at of a generic pointer into shared memory.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* smem) {
  ldmatrix_x4_trans_at(r, smem_addr(smem));
}

/// c += a * b for one m16n8k16 tile: a row-major 16x16, b "col" 16x8, c fp32 16x8.
template <typename T>
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b0,
                                          const uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float c[4], const uint32_t a[4],
                                                  const uint32_t b0, const uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                         const uint32_t b0, const uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// a * b as a 64-bit product of two 32-bit ints (one IMAD.WIDE; C++ would widen both first).
__device__ __forceinline__ int64_t mul_wide(int a, int b) {
  int64_t c;
  asm("mul.wide.s32 %0, %1, %2;" : "=l"(c) : "r"(a), "r"(b));
  return c;
}

/// 2^x in one instruction (MUFU.EX2): flashinfer::fast_exp2 (vec.cuh). Subnormal results flush
/// to 0, which for softmax weights (all <= 1, summed with at least one 1) changes nothing.
using flashinfer::fast_exp2;

/// Two floats rounded into one register of two T (the A operand of P*V).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

/*!
 * @brief A [rows][HEAD_DIM] tile of 2-byte elements in shared memory, 16-byte chunks swizzled.
 *
 * ldmatrix reads one 16-byte chunk from each of 8 consecutive rows; unswizzled, those rows are
 * HEAD_DIM * 2 bytes apart (a multiple of 128) and all 8 hit the same 4 banks. XOR-ing the chunk
 * index with row % 8 spreads them over all 32 banks, for reads and for the cp.async writes.
 */
template <int HEAD_DIM>
struct SwizzledTile {
  static_assert(HEAD_DIM % 64 == 0, "HEAD_DIM must be a multiple of 64 (8 chunks per row)");
  static constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row

  /// Element offset of chunk `chunk` of row `row`.
  __device__ __forceinline__ static uint32_t offset(uint32_t row, uint32_t chunk) {
    return row * HEAD_DIM + ((chunk ^ (row & 7)) << 3);
  }
  /// Element offset of element `col` of row `row`.
  __device__ __forceinline__ static uint32_t elem(uint32_t row, uint32_t col) {
    return offset(row, col >> 3) + (col & 7);
  }
};

}  // namespace attn
}  // namespace flashinfer

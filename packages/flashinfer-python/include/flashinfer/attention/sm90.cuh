// Hopper (sm_90a) building blocks of the attention kernels: mbarriers, the async-proxy fence,
// warpgroup MMA (wgmma) with its shared-memory matrix descriptors, and the 128-byte swizzled
// tile layout those descriptors describe. Plain inline PTX; only sm_90a has wgmma, so every
// caller guards its use with FLASHINFER_SM90_ENABLED.
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../mbarrier.cuh"
#include "mma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHINFER_SM90_ENABLED 1
#endif

namespace flashinfer {
namespace attn {
namespace sm90 {

// ---- mbarriers (one 64-bit word in shared memory each): mbarrier.cuh ---------------------------

using flashinfer::mbar_arrive;
using flashinfer::mbar_arrive_expect_tx;
using flashinfer::mbar_init;
using flashinfer::mbar_wait;

/// An arrival on `bar` once every cp.async this thread has issued so far has landed (counted
/// against the barrier's expected arrivals: "noinc").
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}

/// A TMA store of `smem` to the box at coordinates (c0, c1, c2) of a 3-D tensor map, in this
/// thread's current bulk async-group (tma_store_commit). The shared-memory writes it reads must
/// be made visible to the async proxy first (fence_proxy_async by every writing thread).
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* smem, int c0,
                                             int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(smem)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

/// Closes this thread's bulk async-group (the TMA stores issued since the last one).
__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/// Waits until every committed TMA store of this thread has read its shared memory (the source
/// may be overwritten then).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

/// Waits until every committed TMA store of this thread has completed (its writes are visible).
__device__ __forceinline__ void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

/// A TMA copy of the box at coordinates (c0, c1, c2) of a 3-D tensor map into shared memory;
/// its bytes complete on `bar`. `map` is a __grid_constant__ kernel parameter's address.
__device__ __forceinline__ void tma_load_3d(void* smem, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

/// Makes this thread's ordinary (generic-proxy) shared-memory writes, cp.async included,
/// visible to the tensor cores' (async-proxy) reads that a later barrier orders after it.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/// Barrier among `count` threads on hardware barrier `id` (0 is __syncthreads').
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/// Shrink / grow this warpgroup's registers per thread (all its warps execute it). Takes effect
/// only under a register cap at kernel entry: __launch_bounds__(threads, 1).
template <int N>
__device__ __forceinline__ void set_max_regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void set_max_regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/// Arrive at hardware barrier `id` without waiting (the other `count` - 32 x warps wait there).
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ---- wgmma -----------------------------------------------------------------------------------

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/// Wait until at most N committed wgmma groups of this warpgroup are in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/// Tells the compiler that `r` may change here: keeps reads of wgmma accumulators after the
/// wait that completes them, and an A fragment alive until the wgmma reading it is done.
template <typename R, int N>
__device__ __forceinline__ void fence_operands(R (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (std::is_same_v<R, float>) {
      asm volatile("" : "+f"(r[i])::"memory");
    } else {
      asm volatile("" : "+r"(r[i])::"memory");
    }
  }
}

/*!
 * @brief Shared-memory matrix descriptor of a 128-byte swizzled operand (PTX ISA, "Matrix
 *   Descriptor Format"): start address, leading and stride byte offsets, swizzle mode 1.
 *
 * K-major (rows of K contiguous elements): `sbo` is the distance between groups of 8 rows
 * (1024 bytes when rows are 128 bytes); `lbo` is unused. MN-major (rows of N contiguous
 * elements, K rows): `lbo` is the distance between 64-element column blocks, `sbo` between
 * groups of 8 K rows.
 */
__device__ __forceinline__ uint64_t smem_desc(const void* ptr, uint32_t lbo, uint32_t sbo) {
  const uint64_t addr = smem_addr(ptr);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

/*!
 * @brief A [ROWS][COLS] tile of 2-byte elements laid out for wgmma's 128-byte swizzle: COLS / 64
 *   column blocks one after another, each ROWS rows of 128 bytes, the 16-byte chunk index of a
 *   row XOR-ed with row % 8. The tile must start at a 1024-byte boundary.
 */
template <int ROWS, int COLS>
struct Sw128Tile {
  static_assert(COLS % 64 == 0 && ROWS % 8 == 0, "whole 8 x 64 swizzle atoms");
  static constexpr int kRows = ROWS, kCols = COLS;
  static constexpr int kBlockElems = ROWS * 64;
  static constexpr uint32_t kBlockBytes = ROWS * 128;

  /// Element offset of 16-byte chunk `chunk` (0 .. COLS / 8 - 1) of row `row`.
  __device__ __forceinline__ static uint32_t offset(uint32_t row, uint32_t chunk) {
    return (chunk / 8) * kBlockElems + row * 64 + (((chunk % 8) ^ (row % 8)) << 3);
  }
};

template <typename T, int N>
struct Wgmma;

// wgmma m64nNk16 with fp32 accumulators, for fp16 and bf16: the accumulator operands
// ("+f"(d[i]), N / 2 of them) and their PTX register lists, then one macro per shape that
// writes both instructions (A from shared memory, or from registers with B MN-major). N is
// 64 or 128 (head_dim 64 / 128 tiles and the P V of each 128 output columns) or a narrower
// K/V tile of the wide heads (80, 96 and 112 for tuning builds: Sm90Traits).
#define FI_WGMMA_D32 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
  "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
  "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
  "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
  "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FI_WGMMA_D40 FI_WGMMA_D32, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), \
  "+f"(d[39])
#define FI_WGMMA_D48 FI_WGMMA_D40, \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), \
  "+f"(d[47])
#define FI_WGMMA_D56 FI_WGMMA_D48, \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), \
  "+f"(d[55])
#define FI_WGMMA_D64 FI_WGMMA_D56, \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
  "+f"(d[63])
#define FI_WGMMA_L32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FI_WGMMA_L40 FI_WGMMA_L32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FI_WGMMA_L48 FI_WGMMA_L40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define FI_WGMMA_L56 FI_WGMMA_L48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define FI_WGMMA_L64 FI_WGMMA_L56 ", %56, %57, %58, %59, %60, %61, %62, %63"

// T, its PTX type, N, the accumulator count; after the accumulators come the operands of ss
// (a, b, then the accumulate predicate) and of rs_mn (a[0..3], b, then the predicate).
#define FI_WGMMA(T, PTX, N, ACC, SS_OPS, SS_PRED, RS_OPS, RS_PRED)                           \
  template <>                                                                                  \
  struct Wgmma<T, N> {                                                                         \
    /* d (+)= A B: A [64 x 16] and B [16 x N] from shared memory, both K-major. */             \
    __device__ __forceinline__ static void ss(float (&d)[ACC], uint64_t a, uint64_t b,       \
                                              int accumulate) {                                \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SS_PRED ", 0;\n"                      \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " "           \
                   "{" FI_WGMMA_L##ACC "}, " SS_OPS ", p, 1, 1, 0, 0;\n}\n"                        \
                   : FI_WGMMA_D##ACC                                                           \
                   : "l"(a), "l"(b), "r"(accumulate));                                         \
    }                                                                                          \
    /* d += A B: A [64 x 16] from registers (the mma.m16n8k16 A fragment of each warp's 16   \
       rows), B [16 x N] from shared memory, MN-major (rows of N contiguous elements). */      \
    __device__ __forceinline__ static void rs_mn(float (&d)[ACC], const uint32_t (&a)[4],    \
                                                 uint64_t b, int accumulate) {                 \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " RS_PRED ", 0;\n"                      \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " "           \
                   "{" FI_WGMMA_L##ACC "}, " RS_OPS ", p, 1, 1, 1;\n}\n"                           \
                   : FI_WGMMA_D##ACC                                                           \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));   \
    }                                                                                          \
  };

FI_WGMMA(__half, "f16", 64, 32, "%32, %33", "%34", "{%32, %33, %34, %35}, %36", "%37")
FI_WGMMA(__nv_bfloat16, "bf16", 64, 32, "%32, %33", "%34", "{%32, %33, %34, %35}, %36", "%37")
FI_WGMMA(__half, "f16", 80, 40, "%40, %41", "%42", "{%40, %41, %42, %43}, %44", "%45")
FI_WGMMA(__nv_bfloat16, "bf16", 80, 40, "%40, %41", "%42", "{%40, %41, %42, %43}, %44", "%45")
FI_WGMMA(__half, "f16", 96, 48, "%48, %49", "%50", "{%48, %49, %50, %51}, %52", "%53")
FI_WGMMA(__nv_bfloat16, "bf16", 96, 48, "%48, %49", "%50", "{%48, %49, %50, %51}, %52", "%53")
FI_WGMMA(__half, "f16", 112, 56, "%56, %57", "%58", "{%56, %57, %58, %59}, %60", "%61")
FI_WGMMA(__nv_bfloat16, "bf16", 112, 56, "%56, %57", "%58", "{%56, %57, %58, %59}, %60", "%61")
FI_WGMMA(__half, "f16", 128, 64, "%64, %65", "%66", "{%64, %65, %66, %67}, %68", "%69")
FI_WGMMA(__nv_bfloat16, "bf16", 128, 64, "%64, %65", "%66", "{%64, %65, %66, %67}, %68", "%69")

#undef FI_WGMMA
#undef FI_WGMMA_L64
#undef FI_WGMMA_D64
#undef FI_WGMMA_L56
#undef FI_WGMMA_D56
#undef FI_WGMMA_L48
#undef FI_WGMMA_D48
#undef FI_WGMMA_L40
#undef FI_WGMMA_D40
#undef FI_WGMMA_L32
#undef FI_WGMMA_D32

}  // namespace sm90
}  // namespace attn
}  // namespace flashinfer

// Row normalizations: RMSNorm (plain and Gemma's (1 + w)), fused residual-add + RMSNorm, and
// LayerNorm. Framework-free: raw pointers, sizes and int64 strides in, cudaError_t out.
//
// Why the kernels look the way they do. These ops are pure bandwidth: every element is read once
// and written once, and the only arithmetic is a row reduction. FlashInfer's kernels re-read the
// row (from L2 or shared memory) after the reduction and reach ~87% of copy bandwidth on H100.
// Here each thread holds its slice of the row in registers (compile-time `kVecs` 16-byte vectors,
// all loads issued before the first use), so global memory is touched exactly once per element:
//
//   load slice -> partial sum -> group reduction (shuffles, or a block reduction) -> scale -> store
//
// A row is handled by a "group" of threads: a power of two <= 32 threads for rows of <= 128
// vectors (several rows per 256-thread block, no __syncthreads), or the whole block (up to 1024
// threads) for longer rows. The launch plan (plan_launch below) picks the group size so each
// thread holds 4 (or 8) vectors. Rows too long for registers (half H > 64K for RMSNorm and
// LayerNorm, > 32K for the fused add) take a loop kernel that re-reads the row, mostly from L2.
//
// Occupancy (H100, bf16): RMSNorm H = 8192 runs 256-thread blocks at 40 registers, 6 blocks
// (96 KB of loads in flight) per SM. The fused add keeps t = x + r in float32, a full 32-bit
// register per element, so a 28672-wide row (896 threads x 4 vectors, 64 registers) is one
// block per SM; the other SMs' loads keep DRAM busy while one reduces and stores.
//
// Vector width: 16-byte accesses (N = 16 / sizeof(T) elements) need every base pointer and row
// stride 16-byte aligned and N to divide H; otherwise (an odd hidden size, say) the kernels use one
// element per access (N = 1), still one pass, at lower bandwidth. Real models' hidden sizes are
// multiples of 8.
//
// Registers: the row is kept as raw 32-bit words (two halves per register) and converted to
// float32 at each use. Held as 16-bit values, or with the float conversions of the first use kept
// alive for the second, a row slice costs twice the registers. ptxas -v, bf16 RMSNorm with 4
// vectors per thread: 60 registers with 16-bit values, 46 packed, 40 packed under __maxnreg__
// (no spills; the 4 row loads still issue back to back) = 6 instead of 4 blocks of 256 per SM.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "launch.cuh"
#include "reduce.cuh"
#include "vec.cuh"  // kVec16, is_aligned

// Evict-first (.cs) row loads (LoadMode::kStream). Measured on the H100 with
// benchmarks/tuning/tune.py (benchmarks/notes/norm-evict-first-loads.md): plain loads are
// faster for RMSNorm/LayerNorm (96.7 -> 98.1% of copy at 16384x8192, 90 -> 93% for QK-norm),
// so those kernels use kCached; the fused-add kernel keeps kStream, because plain loads there
// made two instantiations spill under their register cap and cost 3% (99.4 -> 96.4%). This
// switch turns kStream into plain loads everywhere.
#ifndef FLASHINFER_NORM_STREAMING_LOADS
#define FLASHINFER_NORM_STREAMING_LOADS 1
#endif

namespace flashinfer {
namespace norm {

/*!
 * @brief Element strides of the row dims of a 2-D (B, H) or 3-D (B, N, H) tensor: row (b, n) starts
 * at b * outer + n * inner (inner unused for 2-D). int64: strides and offsets above 2^31
 * elements occur (packed QKV views, > 2^31-element tensors).
 */
struct RowStrides {
  int64_t outer = 0;
  int64_t inner = 0;

  /// True when every row start is `bytes`-aligned relative to the base pointer.
  bool aligned(int64_t elem_bytes, int64_t bytes) const {
    return (outer * elem_bytes) % bytes == 0 && (inner * elem_bytes) % bytes == 0;
  }
};

/*!
 * @brief Row r of a (B, N, H) tensor as (b, n) = (r / N, r % N); one division per thread, shared
 * by every tensor the kernel touches (they have the same shape, not the same strides).
 */
struct RowPos {
  int64_t b, n;
  __device__ __forceinline__ RowPos(int64_t row, int64_t heads) {
    if (heads == 1) {
      b = row, n = 0;
    } else if (row <= 0xffffffffLL && heads <= 0xffffffffLL) {  // 32-bit division: ~4x cheaper
      const uint32_t r = static_cast<uint32_t>(row), h = static_cast<uint32_t>(heads);
      b = r / h, n = r % h;
    } else {
      b = row / heads, n = row % heads;
    }
  }
  __device__ __forceinline__ int64_t offset(RowStrides s) const {
    return b * s.outer + n * s.inner;
  }
};

// ------------------------------------------------------------------------------------------------
// Launch plan: a pure host function, so the policy can be read (and reasoned about) in one place.
// ------------------------------------------------------------------------------------------------

/// Largest block: a row of the block path may use all 1024 threads.
inline constexpr int kMaxThreads = 1024;
/// Block size of the warp path (group <= 32 threads): 8 warps, 8 to 256 rows per block.
inline constexpr int kWarpPathThreads = 256;

struct LaunchPlan {
  int vecs;    ///< vectors per thread (a template parameter: 4 or 8); 0 = use the loop kernel
  int group;   ///< threads per row: a power of two <= 32, or == block (one row per block)
  int block;   ///< threads per block
  int64_t rows_per_block;
};

inline int next_pow2(int64_t x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

/*!
 * @brief Choose vectors per thread and threads per row for rows of `num_vecs` vectors.
 * @param max_vecs 8 where a thread can hold 8 vectors without spilling, else 4.
 *
 * Four 16-byte vectors per thread is the sweet spot: 64 bytes of loads in flight per thread keeps
 * >= 64 KB in flight per SM at the occupancy these kernels get (Little's law on H100 wants about
 * 3.35 TB/s x ~1.5 us / 132 SMs ~ 38 KB), while a register budget of ~40 leaves room for 6+
 * blocks per SM. Worked examples (bf16, N = 8): H = 128 -> 16 vecs -> 4 threads x 4, 64 rows per
 * block; H = 8192 -> 1024 vecs -> 256 threads x 4; H = 28672 -> 3584 vecs -> 896 threads x 4.
 */
inline LaunchPlan plan_launch(int64_t num_vecs, int max_vecs) {
  if (num_vecs <= 32 * 4) {
    const int group = next_pow2((num_vecs + 3) / 4);
    return LaunchPlan{4, group, kWarpPathThreads, kWarpPathThreads / group};
  }
  if (num_vecs <= int64_t{kMaxThreads} * 4) {
    const int group = static_cast<int>((num_vecs + 4 * 32 - 1) / (4 * 32) * 32);
    return LaunchPlan{4, group, group, 1};
  }
  if (max_vecs >= 8 && num_vecs <= int64_t{kMaxThreads} * 8) {
    const int group = static_cast<int>((num_vecs + 8 * 32 - 1) / (8 * 32) * 32);
    return LaunchPlan{8, group, group, 1};
  }
  return LaunchPlan{0, kMaxThreads, kMaxThreads, 1};
}

// ------------------------------------------------------------------------------------------------
// Device helpers
// ------------------------------------------------------------------------------------------------

enum class LoadMode { kStream, kReadOnly, kCached };

/*!
 * @brief N elements of T as raw 32-bit words: one 16-byte access (N = 16 / sizeof(T)) or one
 * element (N = 1, low half of the word for 16-bit types).
 */
template <typename T, int N>
struct Packed : PackedWords<Packed<T, N>, T, N> {
  static_assert(sizeof(T) * N == 16 || N == 1, "Packed holds one 16-byte vector or one element");
  using Base = PackedWords<Packed<T, N>, T, N>;
  using Base::kWords;
  using Base::w;

  __device__ __forceinline__ static Packed zero() {
    Packed p;
#pragma unroll
    for (int k = 0; k < kWords; ++k) p.w[k] = 0u;
    return p;
  }

  /*!
   * @tparam kMode kStream: read once, evict first (fused-add rows, the loop kernels' second
   * pass); kReadOnly: read-only for the kernel's lifetime (the weight), through the non-coherent
   * path; kCached: plain load (RMSNorm/LayerNorm rows, measured faster; the loop kernels' first
   * pass over rows they later write).
   */
  template <LoadMode kMode>
  __device__ __forceinline__ static Packed load(const T* ptr) {
    using Word = std::conditional_t<sizeof(T) * N == 16, uint4,
                                    std::conditional_t<sizeof(T) == 4, unsigned, unsigned short>>;
    const auto* q = reinterpret_cast<const Word*>(ptr);
    Word v;
    if constexpr (kMode == LoadMode::kStream && FLASHINFER_NORM_STREAMING_LOADS) {
      v = __ldcs(q);
    } else if constexpr (kMode == LoadMode::kReadOnly) {
      v = __ldg(q);
    } else {
      v = *q;
    }
    Packed p;
    if constexpr (sizeof(T) * N == 16) {
      p.w[0] = v.x, p.w[1] = v.y, p.w[2] = v.z, p.w[3] = v.w;
    } else {
      p.w[0] = v;
    }
    return p;
  }

  /*!
   * @brief Make the compiler forget what the words hold (an empty asm "rewrites" each word).
   * The row is used twice (reduction, then output). Left alone, the compiler keeps the float32
   * conversions of the first use alive for the second, doubling the registers of a half row.
   * Converting again costs one instruction per element; these kernels are bandwidth-bound.
   */
  __device__ __forceinline__ void forget() {
#pragma unroll
    for (int k = 0; k < kWords; ++k) asm("" : "+r"(w[k]));
  }
};

/*!
 * @brief The weight slice of a thread, loaded one slot ahead of its use.
 * The weight is read by every block, so it is an L1 (or L2) hit; loading it with the row would
 * cost kVecs more packed registers through the reduction (measured: 46 -> 58 registers for bf16
 * with 4 vectors, 5 -> 4 blocks of 256 threads per SM). One slot ahead keeps a load in flight
 * while the previous slot is scaled and stored, for 1/kVecs of those registers.
 */
template <typename T, int N, int kVecs>
struct WeightPipe {
  using P = Packed<T, N>;
  const T* weight;
  int group, lane, hidden;
  P ahead;

  __device__ __forceinline__ P load(int i) const {
    const int col = (i * group + lane) * N;
    return col < hidden ? P::template load<LoadMode::kReadOnly>(weight + col) : P::zero();
  }
  __device__ __forceinline__ WeightPipe(const T* w, int g, int l, int h)
      : weight(w), group(g), lane(l), hidden(h), ahead(load(0)) {}
  /// The slice of slot i (called with i = 0, 1, ..., kVecs - 1); starts the load of slot i + 1.
  __device__ __forceinline__ P next(int i) {
    const P cur = ahead;
    if (i + 1 < kVecs) ahead = load(i + 1);
    return cur;
  }
};

/*!
 * @brief The row a thread works on, and its lane in the row's group of `group` threads.
 * Groups past the last row (the last block of the warp path) work on the last row, so every lane
 * takes part in the group's shuffles, but must not store (`ok` is false).
 */
struct RowSlot {
  int lane;
  int64_t row;
  bool ok;
  __device__ __forceinline__ RowSlot(int group, int64_t rows) {
    if (group >= static_cast<int>(blockDim.x)) {
      lane = threadIdx.x;
      row = blockIdx.x;
    } else {  // group is a power of two <= 32
      lane = threadIdx.x & (group - 1);
      row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / group) + threadIdx.x / group;
    }
    ok = row < rows;
    if (!ok) row = rows - 1;
  }
};

/*!
 * @brief Sum over the threads of a group; every thread of the group receives it.
 * A group of <= 32 threads is an aligned power-of-two slice of a warp, so xor shuffles stay inside
 * it; a larger group is the whole block.
 */
__device__ __forceinline__ float group_sum(float x, int group, float* scratch) {
  if (group > 32) return block_sum(x, scratch);
  for (int offset = group / 2; offset > 0; offset >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

/// N float32 values (LayerNorm's gamma/beta), as 16-byte loads when N is a multiple of 4.
template <int N>
__device__ __forceinline__ void load_floats(const float* p, float (&out)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int j = 0; j < N; j += 4) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p + j));
      out[j] = v.x, out[j + 1] = v.y, out[j + 2] = v.z, out[j + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = __ldg(p + j);
  }
}

// ------------------------------------------------------------------------------------------------
// Kernel parameters
// ------------------------------------------------------------------------------------------------

/// RMSNorm: out = input * rsqrt(mean(input^2) + eps) * (weight + weight_offset).
/// Fused add (residual != nullptr): t = input + residual; residual <- t; input <- norm(t).
template <typename T>
struct RMSNormParams {
  const T* input;
  RowStrides input_strides;
  T* out;  ///< == input for the fused add
  RowStrides out_strides;
  T* residual;  ///< fused add only
  RowStrides residual_strides;
  const T* weight;
  int64_t rows;   ///< B * N
  int64_t heads;  ///< N (1 for 2-D tensors)
  int hidden;
  int group;  ///< threads per row (set by the launcher)
  float inv_hidden;  ///< 1 / hidden: a multiply, not an IEEE division per row
  float eps;
  float weight_offset;  ///< 0, or 1 for Gemma's (1 + w)
};

/// LayerNorm: out = (input - mean) * rsqrt(var + eps) * gamma + beta, gamma/beta float32.
template <typename T>
struct LayerNormParams {
  const T* input;
  RowStrides input_strides;
  T* out;
  RowStrides out_strides;
  const float* gamma;
  const float* beta;
  int64_t rows;
  int64_t heads;
  int hidden;
  int group;
  float inv_hidden;
  float eps;
};

/// Registers per thread that let a 1024-thread block launch (64 K registers per SM).
inline constexpr int kMaxRegs = 64;

/*!
 * @brief Register budget of a kernel holding kVecs packed N-element vectors per thread.
 * A slice of <= 64 bytes (16 registers) fits in 40 (ptxas -v: 46 unconstrained, 40 without
 * spills or serialized loads), which is 6 instead of 5 blocks of 256 threads per SM; larger slices
 * get the 64 every 1024-thread block can have.
 */
template <typename T, int N, int kVecs>
inline constexpr int kRowRegs = kVecs * N * sizeof(T) <= 64 ? 40 : kMaxRegs;
/// LayerNorm keeps the mean and gamma/beta live as well.
template <typename T, int N, int kVecs>
inline constexpr int kLayerNormRegs = kRowRegs<T, N, kVecs> < kMaxRegs ? 48 : kMaxRegs;
static_assert(kMaxRegs * kMaxThreads <= 64 * 1024,
              "a 1024-thread block of any register kernel must fit one SM's 64 K registers");
static_assert(kWarpPathThreads % 32 == 0 && kWarpPathThreads <= kMaxThreads,
              "the warp path stacks whole warps of groups in a block");

// ------------------------------------------------------------------------------------------------
// Register kernels: the row lives in registers between its one load and its one store.
// Thread `lane` of a group of G owns vectors lane, lane + G, ..., lane + (kVecs - 1) G, so each
// load instruction of a warp covers contiguous memory. Slots past the row's end hold zeros.
// ------------------------------------------------------------------------------------------------

/*!
 * @brief RMSNorm / Gemma RMSNorm with the thread's slice of the row held packed in registers.
 * @tparam N elements per access (16 bytes, or 1); kVecs accesses per thread.
 */
template <typename T, int N, int kVecs>
__global__ void __maxnreg__((kRowRegs<T, N, kVecs>)) RMSNormKernel(const RMSNormParams<T> p) {
  using P = Packed<T, N>;
  __shared__ float scratch[32];
  const RowSlot s(p.group, p.rows);
  const RowPos pos(s.row, p.heads);
  pdl_wait();
  const T* in = p.input + pos.offset(p.input_strides);
  T* out = p.out + pos.offset(p.out_strides);
  P x[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int col = (i * p.group + s.lane) * N;
    x[i] = col < p.hidden ? P::template load<LoadMode::kCached>(in + col) : P::zero();
  }
  float sum_sq = 0.f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) sum_sq += x[i].get(j) * x[i].get(j);
    x[i].forget();
  }
  sum_sq = group_sum(sum_sq, p.group, scratch);
  pdl_launch_dependents();  // the block's inputs are read
  const float rstd = rsqrtf(sum_sq * p.inv_hidden + p.eps);
  if (!s.ok) return;
  WeightPipe<T, N, kVecs> w(p.weight, p.group, s.lane, p.hidden);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int col = (i * p.group + s.lane) * N;
    const P wi = w.next(i);
    float y[N];
#pragma unroll
    for (int j = 0; j < N; ++j) y[j] = x[i].get(j) * rstd * (wi.get(j) + p.weight_offset);
    if (col < p.hidden) P::pack(y).store(out + col);
  }
}

/*!
 * @brief Fused residual add + RMSNorm, in place on input (p.out) and residual.
 * t = input + residual stays in float32 registers: the residual gets round(t) as soon as it is
 * formed (spreading the stores over the load phase), the input gets norm(t) * w from unrounded t.
 */
template <typename T, int N, int kVecs>
__global__ void __maxnreg__(kMaxRegs) FusedAddRMSNormKernel(const RMSNormParams<T> p) {
  using P = Packed<T, N>;
  __shared__ float scratch[32];
  const RowSlot s(p.group, p.rows);
  const RowPos pos(s.row, p.heads);
  pdl_wait();
  const int64_t in_offset = pos.offset(p.input_strides);  // also the output's: in place
  const T* in = p.input + in_offset;
  T* res = p.residual + pos.offset(p.residual_strides);
  P x[kVecs], r[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int col = (i * p.group + s.lane) * N;
    x[i] = col < p.hidden ? P::template load<LoadMode::kStream>(in + col) : P::zero();
    r[i] = col < p.hidden ? P::template load<LoadMode::kStream>(res + col) : P::zero();
  }
  float t[kVecs][N];
  float sum_sq = 0.f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int col = (i * p.group + s.lane) * N;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      t[i][j] = x[i].get(j) + r[i].get(j);
      sum_sq += t[i][j] * t[i][j];
    }
    // Groups past the last row read it too; only its own group may write it.
    if (s.ok && col < p.hidden) P::pack(t[i]).store(res + col);
  }
  sum_sq = group_sum(sum_sq, p.group, scratch);
  pdl_launch_dependents();
  const float rstd = rsqrtf(sum_sq * p.inv_hidden + p.eps);
  if (!s.ok) return;
  T* out = p.out + in_offset;
  WeightPipe<T, N, kVecs> w(p.weight, p.group, s.lane, p.hidden);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int col = (i * p.group + s.lane) * N;
    const P wi = w.next(i);
    float y[N];
#pragma unroll
    for (int j = 0; j < N; ++j) y[j] = t[i][j] * rstd * (wi.get(j) + p.weight_offset);
    if (col < p.hidden) P::pack(y).store(out + col);
  }
}

/*!
 * @brief LayerNorm with the row in registers: the mean, then the variance as mean((x - mean)^2)
 * from the same registers (no E[x^2] - mean^2 cancellation), then one store.
 */
template <typename T, int N, int kVecs>
__global__ void __maxnreg__((kLayerNormRegs<T, N, kVecs>))
    LayerNormKernel(const LayerNormParams<T> p) {
  using P = Packed<T, N>;
  __shared__ float scratch[32];
  const RowSlot s(p.group, p.rows);
  const float inv_hidden = p.inv_hidden;
  const RowPos pos(s.row, p.heads);
  pdl_wait();
  const T* in = p.input + pos.offset(p.input_strides);
  P x[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int col = (i * p.group + s.lane) * N;
    x[i] = col < p.hidden ? P::template load<LoadMode::kCached>(in + col) : P::zero();
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) sum += x[i].get(j);
    x[i].forget();
  }
  const float mean = group_sum(sum, p.group, scratch) * inv_hidden;
  float sum_sq = 0.f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int col = (i * p.group + s.lane) * N;
    if (col < p.hidden) {  // zero padding would add mean^2
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float d = x[i].get(j) - mean;
        sum_sq += d * d;
      }
    }
    x[i].forget();
  }
  sum_sq = group_sum(sum_sq, p.group, scratch);
  pdl_launch_dependents();
  const float rstd = rsqrtf(sum_sq * inv_hidden + p.eps);
  if (!s.ok) return;
  T* out = p.out + pos.offset(p.out_strides);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int col = (i * p.group + s.lane) * N;
    if (col < p.hidden) {
      float gamma[N], beta[N], y[N];
      load_floats<N>(p.gamma + col, gamma);
      load_floats<N>(p.beta + col, beta);
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = (x[i].get(j) - mean) * rstd * gamma[j] + beta[j];
      P::pack(y).store(out + col);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Loop kernels for rows too long for registers: one row per 1024-thread block. The reduction pass
// reads the row with normal caching and the output pass re-reads it, from L2: 132 SMs x one row of
// a few hundred KB in flight is well inside H100's 50 MB L2.
// ------------------------------------------------------------------------------------------------

template <typename T, int N>
__global__ void __launch_bounds__(kMaxThreads) RMSNormLoopKernel(const RMSNormParams<T> p) {
  using P = Packed<T, N>;
  __shared__ float scratch[32];
  const bool fused = p.residual != nullptr;
  const RowPos pos(blockIdx.x, p.heads);
  pdl_wait();
  const T* in = p.input + pos.offset(p.input_strides);
  T* res = fused ? p.residual + pos.offset(p.residual_strides) : nullptr;
  float sum_sq = 0.f;
  for (int col = threadIdx.x * N; col < p.hidden; col += blockDim.x * N) {
    const P x = P::template load<LoadMode::kCached>(in + col);
    const P r = fused ? P::template load<LoadMode::kCached>(res + col) : P::zero();
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float t = x.get(j) + r.get(j);
      sum_sq += t * t;
    }
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float rstd = rsqrtf(sum_sq * p.inv_hidden + p.eps);
  T* out = p.out + pos.offset(p.out_strides);
  // Each element is re-read and then written by the same thread, so in place (out == input, and
  // the fused residual) is safe; t is recomputed from the same inputs, so it is bit-identical.
  for (int col = threadIdx.x * N; col < p.hidden; col += blockDim.x * N) {
    const P x = P::template load<LoadMode::kStream>(in + col);
    const P r = fused ? P::template load<LoadMode::kStream>(res + col) : P::zero();
    const P w = P::template load<LoadMode::kReadOnly>(p.weight + col);
    float t[N], y[N];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      t[j] = x.get(j) + r.get(j);
      y[j] = t[j] * rstd * (w.get(j) + p.weight_offset);
    }
    if (fused) P::pack(t).store(res + col);
    P::pack(y).store(out + col);
  }
  pdl_launch_dependents();
}

template <typename T, int N>
__global__ void __launch_bounds__(kMaxThreads) LayerNormLoopKernel(const LayerNormParams<T> p) {
  using P = Packed<T, N>;
  __shared__ float scratch[32];
  const RowPos pos(blockIdx.x, p.heads);
  const float inv_hidden = p.inv_hidden;
  pdl_wait();
  const T* in = p.input + pos.offset(p.input_strides);
  float sum = 0.f;
  for (int col = threadIdx.x * N; col < p.hidden; col += blockDim.x * N) {
    const P x = P::template load<LoadMode::kCached>(in + col);
#pragma unroll
    for (int j = 0; j < N; ++j) sum += x.get(j);
  }
  const float mean = block_sum(sum, scratch) * inv_hidden;
  float sum_sq = 0.f;
  for (int col = threadIdx.x * N; col < p.hidden; col += blockDim.x * N) {
    const P x = P::template load<LoadMode::kCached>(in + col);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float d = x.get(j) - mean;
      sum_sq += d * d;
    }
  }
  const float rstd = rsqrtf(block_sum(sum_sq, scratch) * inv_hidden + p.eps);
  T* out = p.out + pos.offset(p.out_strides);
  for (int col = threadIdx.x * N; col < p.hidden; col += blockDim.x * N) {
    const P x = P::template load<LoadMode::kStream>(in + col);
    float gamma[N], beta[N], y[N];
    load_floats<N>(p.gamma + col, gamma);
    load_floats<N>(p.beta + col, beta);
#pragma unroll
    for (int j = 0; j < N; ++j) y[j] = (x.get(j) - mean) * rstd * gamma[j] + beta[j];
    P::pack(y).store(out + col);
  }
  pdl_launch_dependents();
}

// ------------------------------------------------------------------------------------------------
// Host launchers
// ------------------------------------------------------------------------------------------------

namespace detail {

/*!
 * @brief Fold (B, N, H) into (B * N, H) when every tensor's rows are evenly spaced (the usual
 * contiguous QK-norm input), so the kernels skip the per-row division.
 */
template <typename... Strides>
void fold_heads(int64_t& heads, Strides&... strides) {
  if (heads <= 1) return;
  if (((strides.outer == heads * strides.inner) && ...)) {
    ((strides = RowStrides{strides.inner, 0}), ...);
    heads = 1;
  }
}

/*!
 * @brief Call `launch(std::integral_constant<int, N>{}, plan, grid)` with N = 16-byte accesses when
 * `aligned` and N divides `hidden`, else N = 1, and the plan and grid for that N.
 */
template <typename T, typename F>
cudaError_t with_plan(bool aligned, int64_t rows, int hidden, int max_vecs, F&& launch) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  auto go = [&](auto n) -> cudaError_t {
    constexpr int N = decltype(n)::value;
    const LaunchPlan plan = plan_launch(hidden / N, max_vecs);
    const int64_t blocks = ceil_div(rows, plan.rows_per_block);
    // One row group per block: 2^31 - 1 blocks of rows longer than 512 elements (block path) or
    // of 8 to 256 rows (warp path) is more memory than a GPU has.
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    return launch(n, plan, dim3(static_cast<unsigned>(blocks)));
  };
  if (aligned && hidden % kVec16<T> == 0) return go(std::integral_constant<int, kVec16<T>>{});
  return go(std::integral_constant<int, 1>{});
}

template <typename T>
cudaError_t launch_rmsnorm(RMSNormParams<T> p, bool aligned, bool enable_pdl, cudaStream_t stream) {
  const bool fused = p.residual != nullptr;
  // Packed half registers: 8 vectors per thread (32 registers) fit the 64-register budget of a
  // 1024-thread block. The fused add holds t in float32 (2x the registers), so it stops at 4.
  return with_plan<T>(
      aligned, p.rows, p.hidden, fused ? 4 : 8,
      [&](auto n, const LaunchPlan& plan, dim3 grid) -> cudaError_t {
        constexpr int N = decltype(n)::value;
        p.group = plan.group;
        const dim3 block(plan.block);
        if (plan.vecs == 0) {
          return launch_kernel(RMSNormLoopKernel<T, N>, grid, block, 0, stream, enable_pdl, p);
        }
        if (fused) {
          return launch_kernel(FusedAddRMSNormKernel<T, N, 4>, grid, block, 0, stream, enable_pdl,
                               p);
        }
        if (plan.vecs == 4) {
          return launch_kernel(RMSNormKernel<T, N, 4>, grid, block, 0, stream, enable_pdl, p);
        }
        return launch_kernel(RMSNormKernel<T, N, 8>, grid, block, 0, stream, enable_pdl, p);
      });
}

}  // namespace detail

/*!
 * @brief out = input * rsqrt(mean(input^2) + eps) * (weight + weight_offset) over each row of a
 *        (batch, heads, hidden) tensor (heads = 1 for 2-D); rows may be strided, the hidden dim
 *        is contiguous.
 * @param input, out may be the same memory (in place is safe).
 * @param weight (hidden,) contiguous.
 * @param weight_offset 0 for RMSNorm, 1 for Gemma RMSNorm.
 */
template <typename T>
cudaError_t RMSNorm(const T* input, RowStrides input_strides, T* out, RowStrides out_strides,
                    const T* weight, int64_t batch, int64_t heads, int hidden, float eps,
                    float weight_offset, bool enable_pdl, cudaStream_t stream) {
  const int64_t rows = batch * heads;  // row r of the folded view is row r of the unfolded one
  detail::fold_heads(heads, input_strides, out_strides);
  RMSNormParams<T> p{};
  p.input = input;
  p.input_strides = input_strides;
  p.out = out;
  p.out_strides = out_strides;
  p.weight = weight;
  p.rows = rows;
  p.heads = heads;
  p.hidden = hidden;
  p.inv_hidden = 1.f / static_cast<float>(hidden);
  p.eps = eps;
  p.weight_offset = weight_offset;
  const bool aligned = is_aligned(input, 16) && is_aligned(out, 16) && is_aligned(weight, 16) &&
                       input_strides.aligned(sizeof(T), 16) && out_strides.aligned(sizeof(T), 16);
  return detail::launch_rmsnorm(p, aligned, enable_pdl, stream);
}

/*!
 * @brief In place over (batch, hidden): t = input + residual in float32; residual <- t;
 *        input <- t * rsqrt(mean(t^2) + eps) * (weight + weight_offset), from the unrounded t.
 */
template <typename T>
cudaError_t FusedAddRMSNorm(T* input, RowStrides input_strides, T* residual,
                            RowStrides residual_strides, const T* weight, int64_t batch,
                            int hidden, float eps, float weight_offset, bool enable_pdl,
                            cudaStream_t stream) {
  RMSNormParams<T> p{};
  p.input = input;
  p.input_strides = input_strides;
  p.out = input;
  p.out_strides = input_strides;
  p.residual = residual;
  p.residual_strides = residual_strides;
  p.weight = weight;
  p.rows = batch;
  p.heads = 1;
  p.hidden = hidden;
  p.inv_hidden = 1.f / static_cast<float>(hidden);
  p.eps = eps;
  p.weight_offset = weight_offset;
  const bool aligned = is_aligned(input, 16) && is_aligned(residual, 16) &&
                       is_aligned(weight, 16) && input_strides.aligned(sizeof(T), 16) &&
                       residual_strides.aligned(sizeof(T), 16);
  return detail::launch_rmsnorm(p, aligned, enable_pdl, stream);
}

/*!
 * @brief out = (input - mean) * rsqrt(var + eps) * gamma + beta over each row of (batch, hidden)
 *        (biased variance).
 * @param gamma, beta (hidden,) float32, contiguous.
 */
template <typename T>
cudaError_t LayerNorm(const T* input, RowStrides input_strides, T* out, RowStrides out_strides,
                      const float* gamma, const float* beta, int64_t batch, int hidden, float eps,
                      bool enable_pdl, cudaStream_t stream) {
  LayerNormParams<T> p{};
  p.input = input;
  p.input_strides = input_strides;
  p.out = out;
  p.out_strides = out_strides;
  p.gamma = gamma;
  p.beta = beta;
  p.rows = batch;
  p.heads = 1;
  p.hidden = hidden;
  p.inv_hidden = 1.f / static_cast<float>(hidden);
  p.eps = eps;
  const bool aligned = is_aligned(input, 16) && is_aligned(out, 16) && is_aligned(gamma, 16) &&
                       is_aligned(beta, 16) && input_strides.aligned(sizeof(T), 16) &&
                       out_strides.aligned(sizeof(T), 16);
  return detail::with_plan<T>(
      aligned, p.rows, hidden, 8, [&](auto n, const LaunchPlan& plan, dim3 grid) -> cudaError_t {
        constexpr int N = decltype(n)::value;
        p.group = plan.group;
        const dim3 block(plan.block);
        if (plan.vecs == 0) {
          return launch_kernel(LayerNormLoopKernel<T, N>, grid, block, 0, stream, enable_pdl, p);
        }
        if (plan.vecs == 4) {
          return launch_kernel(LayerNormKernel<T, N, 4>, grid, block, 0, stream, enable_pdl, p);
        }
        return launch_kernel(LayerNormKernel<T, N, 8>, grid, block, 0, stream, enable_pdl, p);
      });
}

}  // namespace norm
}  // namespace flashinfer

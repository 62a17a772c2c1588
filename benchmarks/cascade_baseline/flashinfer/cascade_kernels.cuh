// Kernels and launch policy of the state merges (see cascade.cuh for the math and the public
// launchers). Framework-free; included by cascade.cuh.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fastdiv.cuh"
#include "launch.cuh"
#include "vec.cuh"  // PackedWords

// The FLASHINFER_CASCADE_* macros exist for side-by-side tuning builds; the defaults follow the
// copy-like kernels measured on the H100 (rope.cuh, benchmarks/NOTES.md).
#ifndef FLASHINFER_CASCADE_THREADS
#define FLASHINFER_CASCADE_THREADS 128
#endif
#ifndef FLASHINFER_CASCADE_ITEMS_PER_THREAD
#define FLASHINFER_CASCADE_ITEMS_PER_THREAD 4
#endif
#ifndef FLASHINFER_CASCADE_MIN_BLOCKS_PER_SM
#define FLASHINFER_CASCADE_MIN_BLOCKS_PER_SM 8
#endif
// 0: no hint; 128 or 256: ask L2 to fetch that many bytes around each 16-byte load (the RoPE
// kernel measured +0.3% of copy bandwidth with 256).
#ifndef FLASHINFER_CASCADE_L2_PREFETCH
#define FLASHINFER_CASCADE_L2_PREFETCH 256
#endif

namespace flashinfer {
namespace cascade {

namespace detail {

inline constexpr int kThreads = FLASHINFER_CASCADE_THREADS;
// 4 items x 2 loads of 16 bytes in flight per thread, 128 KB per SM at 8 blocks of 128 threads
// (64 registers each): the configuration that brought the RoPE kernel to 95.5% of copy.
inline constexpr int kItemsPerThread = FLASHINFER_CASCADE_ITEMS_PER_THREAD;
inline constexpr int kTileItems = kThreads * kItemsPerThread;
inline constexpr int kMinBlocksPerSM = FLASHINFER_CASCADE_MIN_BLOCKS_PER_SM;
static_assert(kItemsPerThread <= 32, "the live-item mask is 32 bits");

// MergeManyKernel: parts whose loads are in flight per thread; groups per state (a block of
// 32 groups x 32 threads covers one state of 132 float32 parts, head_dim 128, in ~4 parts
// per thread: one round of loads); preferred block size when states are plentiful.
inline constexpr int kUnroll = 4;
inline constexpr int64_t kMaxGroups = 32;
inline constexpr int64_t kMaxBlockThreads = 1024;
inline constexpr int64_t kManyBlockThreads = 256;

/// Normalized weights of two states and their merged log-sum-exp.
struct PairWeights {
  float wa, wb, s;
};

__device__ __forceinline__ PairWeights pair_weights(float sa, float sb) {
  const float m = fmaxf(sa, sb);
  if (m == -INFINITY) return {0.f, 0.f, -INFINITY};  // both empty
  const float ea = exp2f(sa - m), eb = exp2f(sb - m);
  const float sum = ea + eb;  // in [1, 2]
  const float inv = __frcp_rn(sum);  // correctly rounded, without the IEEE division's slow path
  return {ea * inv, eb * inv, m + log2f(sum)};
}

/// A PackedWords vector (vec.cuh) with this file's loads: 16-byte ones may ask L2 to fetch the
/// whole 128/256-byte line (FLASHINFER_CASCADE_L2_PREFETCH).
template <typename T, int N>
struct Raw : PackedWords<Raw<T, N>, T, N> {
  using Base = PackedWords<Raw<T, N>, T, N>;
  using Base::kBytes;
  using Base::w;

  __device__ __forceinline__ void load(const T* ptr) {
    if constexpr (kBytes == 16) {
#if FLASHINFER_CASCADE_L2_PREFETCH == 256
      asm volatile("ld.global.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                   : "l"(ptr));
#elif FLASHINFER_CASCADE_L2_PREFETCH == 128
      asm volatile("ld.global.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                   : "l"(ptr));
#else
      const uint4 v = *reinterpret_cast<const uint4*>(ptr);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#endif
    } else if constexpr (kBytes == 8) {
      const uint2 v = *reinterpret_cast<const uint2*>(ptr);
      w[0] = v.x, w[1] = v.y;
    } else if constexpr (kBytes == 4) {
      w[0] = *reinterpret_cast<const uint32_t*>(ptr);
    } else {
      w[0] = *reinterpret_cast<const uint16_t*>(ptr);
    }
  }

};

/// wa * a + wb * b; an operand whose weight is 0 is left out, not multiplied (it may be garbage:
/// 0 * inf is NaN).
template <typename T, int N>
__device__ __forceinline__ Raw<T, N> combine(const Raw<T, N>& a, const Raw<T, N>& b,
                                             const PairWeights& w) {
  float o[N];
#pragma unroll
  for (int e = 0; e < N; ++e) {
    o[e] = w.wb != 0.f ? w.wb * b.get(e) : 0.f;
    if (w.wa != 0.f) o[e] = fmaf(w.wa, a.get(e), o[e]);
  }
  return Raw<T, N>::pack(o);
}

// ---------------------------------------------------------------------------------------------
// MergeTwoKernel
// ---------------------------------------------------------------------------------------------

template <typename T>
struct MergeTwoParams {
  const T* va;
  const T* vb;
  T* vo;
  const float* sa;
  const float* sb;
  float* so;
  const bool* mask;
  int64_t va_sn, va_sh, vb_sn, vb_sh, vo_sn, vo_sh;
  int64_t sa_sn, sa_sh, sb_sn, sb_sh, so_sn, so_sh;
  int64_t num_states;     // seq_len * num_heads
  uint32_t tile_states;   // states per block
  FastDiv vph;            // vectors per head row
  FastDiv heads;          // num_heads
};

/// Row and head of state j of a tile that starts at row l0, head h0.
struct RowHead {
  int64_t l, h;
};

__device__ __forceinline__ RowHead tile_state(int64_t l0, int64_t h0, uint32_t j,
                                              const FastDiv& heads) {
  uint32_t dl, h;
  heads.divmod(static_cast<uint32_t>(h0) + j, dl, h);  // h0 < num_heads, j < tile_states
  return {l0 + dl, h};
}

template <typename T, int N, bool kInPlace>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM)
    MergeTwoKernel(const __grid_constant__ MergeTwoParams<T> p) {
  const int64_t tile_begin = int64_t{blockIdx.x} * p.tile_states;
  int64_t l0, h0;
  p.heads.divmod64(tile_begin, l0, h0);
  const uint32_t tile_states =
      static_cast<uint32_t>(min(int64_t{p.tile_states}, p.num_states - tile_begin));
  const uint32_t tile_items = tile_states * p.vph.d;
  pdl_wait();
  for (uint32_t base = 0; base < tile_items; base += kTileItems) {
    Raw<T, N> a[kItemsPerThread], b[kItemsPerThread];
    float sa[kItemsPerThread], sb[kItemsPerThread];
    uint32_t live = 0;
    // Issue every load of this thread's items before using any.
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      const uint32_t i = base + k * kThreads + threadIdx.x;
      if (i >= tile_items) continue;
      uint32_t j, vec;
      p.vph.divmod(i, j, vec);
      const RowHead s = tile_state(l0, h0, j, p.heads);
      if (kInPlace && p.mask != nullptr && !p.mask[s.l]) continue;
      live |= 1u << k;
      a[k].load(p.va + s.l * p.va_sn + s.h * p.va_sh + vec * N);
      b[k].load(p.vb + s.l * p.vb_sn + s.h * p.vb_sh + vec * N);
      sa[k] = p.sa[s.l * p.sa_sn + s.h * p.sa_sh];
      sb[k] = p.sb[s.l * p.sb_sn + s.h * p.sb_sh];
    }
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      if (!(live & (1u << k))) continue;
      const uint32_t i = base + k * kThreads + threadIdx.x;  // recomputed: cheaper than registers
      uint32_t j, vec;
      p.vph.divmod(i, j, vec);
      const RowHead s = tile_state(l0, h0, j, p.heads);
      const PairWeights w = pair_weights(sa[k], sb[k]);
      combine(a[k], b[k], w).store(p.vo + s.l * p.vo_sn + s.h * p.vo_sh + vec * N);
      if constexpr (!kInPlace) {
        if (vec == 0) p.so[s.l * p.so_sn + s.h * p.so_sh] = w.s;
      }
    }
  }
  pdl_launch_dependents();
  if constexpr (kInPlace) {
    // s_out aliases s_a: write the tile's s only after every thread of the block has read it.
    __syncthreads();
    for (uint32_t j = threadIdx.x; j < tile_states; j += kThreads) {
      const RowHead s = tile_state(l0, h0, j, p.heads);
      if (p.mask != nullptr && !p.mask[s.l]) continue;
      float* out = p.so + s.l * p.so_sn + s.h * p.so_sh;
      *out = pair_weights(*out, p.sb[s.l * p.sb_sn + s.h * p.sb_sh]).s;
    }
  }
}

/// Grid of MergeTwoKernel: whole-state tiles of about kTileItems items; smaller tiles (down to
/// one state) when there are fewer states than one wave of blocks needs, so every SM works.
/// Worked example (8192 x 32 heads x 128, bf16): 16 vectors per head, 32 states per tile,
/// 8192 blocks of 128 threads, 4 items each.
inline int64_t plan_tile_states(int64_t num_states, int64_t vph, int num_sms) {
  const int64_t full = std::max<int64_t>(1, kTileItems / vph);
  const int64_t spread = ceil_div(num_states, int64_t{num_sms} * kMinBlocksPerSM);
  return std::max<int64_t>(1, std::min(full, spread));
}

// ---------------------------------------------------------------------------------------------
// MergeManyKernel
// ---------------------------------------------------------------------------------------------

template <typename TIn, typename TOut>
struct MergeManyParams {
  const TIn* v;
  const float* s;
  const int32_t* indptr;
  TOut* vo;
  float* so;
  int64_t num_parts;
  int64_t num_states;
  FastDiv heads;
  int64_t v_sr, v_sp, v_sh, s_sr, s_sp, s_sh;
  int64_t vo_sn, vo_sh, so_sn, so_sh;
  uint32_t vph;           // threads per group: one per vector of the head row
  uint32_t groups;        // groups per state, splitting its parts
  uint32_t block_states;  // states per block
};

/// Running merge of a group's parts: max m, sum d of 2^(s - m), acc = sum 2^(s - m) v.
template <int N>
struct Running {
  float m = -INFINITY;
  float d = 0.f;
  float acc[N] = {};

  /// Bring in parts with log-sum-exps sv[u] and values x[u] (those with sv == -inf are skipped).
  template <typename TIn>
  __device__ __forceinline__ void add(const float (&sv)[kUnroll],
                                      const Raw<TIn, N> (&x)[kUnroll]) {
    float mc = m;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) mc = fmaxf(mc, sv[u]);
    if (mc == -INFINITY) return;  // nothing but empty parts so far
    const float scale = exp2f(m - mc);  // 0 while m == -inf (acc and d are 0 then)
    d *= scale;
#pragma unroll
    for (int e = 0; e < N; ++e) acc[e] *= scale;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float w = exp2f(sv[u] - mc);
      if (w > 0.f) {
        d += w;
#pragma unroll
        for (int e = 0; e < N; ++e) acc[e] = fmaf(w, x[u].get(e), acc[e]);
      }
    }
    m = mc;
  }
};

template <typename TIn, typename TOut, int N>
__global__ void __launch_bounds__(kMaxBlockThreads)
    MergeManyKernel(const __grid_constant__ MergeManyParams<TIn, TOut> p) {
  extern __shared__ float smem[];  // groups > 1: [N][blockDim] partial acc, then m and d per slot
  const uint32_t t = threadIdx.x;
  const uint32_t slot = t / p.vph;  // (state of the block, group): one division per thread
  const uint32_t vec = t - slot * p.vph;
  const uint32_t local = slot / p.groups;
  const uint32_t g = slot - local * p.groups;
  const int64_t state = int64_t{blockIdx.x} * p.block_states + local;
  const bool active = local < p.block_states && state < p.num_states;
  int64_t r = 0, h = 0;
  Running<N> run;
  pdl_wait();
  if (active) {
    p.heads.divmod64(state, r, h);
    int64_t count, v_base, s_base;
    if (p.indptr != nullptr) {
      const int64_t first = p.indptr[r];
      count = p.indptr[r + 1] - first;
      v_base = first * p.v_sp;
      s_base = first * p.s_sp;
    } else {
      count = p.num_parts;
      v_base = r * p.v_sr;
      s_base = r * p.s_sr;
    }
    const TIn* vp = p.v + v_base + h * p.v_sh + int64_t{vec} * N;
    const float* sp = p.s + s_base + h * p.s_sh;
    const int64_t step = int64_t{p.groups} * kUnroll;
    for (int64_t i0 = g; i0 < count; i0 += step) {
      float sv[kUnroll];
      Raw<TIn, N> x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + int64_t{u} * p.groups;
        sv[u] = -INFINITY;
        if (i < count) {
          sv[u] = sp[i * p.s_sp];
          x[u].load(vp + i * p.v_sp);
        }
      }
      run.add(sv, x);
    }
  }
  pdl_launch_dependents();
  if (p.groups > 1) {
    // Combine the groups of each state in its group 0 (one barrier).
    float* m_of = smem + size_t{blockDim.x} * N;
    float* d_of = m_of + (blockDim.x + p.vph - 1) / p.vph;
    if (active) {
#pragma unroll
      for (int e = 0; e < N; ++e) smem[e * blockDim.x + t] = run.acc[e];
      if (vec == 0) m_of[slot] = run.m, d_of[slot] = run.d;
    }
    __syncthreads();
    if (!active || g != 0) return;
    const uint32_t first_slot = local * p.groups;
    float m = -INFINITY;
    for (uint32_t k = 0; k < p.groups; ++k) m = fmaxf(m, m_of[first_slot + k]);
    run = Running<N>{};
    run.m = m;
    if (m != -INFINITY) {
#pragma unroll 4
      for (uint32_t k = 0; k < p.groups; ++k) {
        const float mk = m_of[first_slot + k];
        if (mk == -INFINITY) continue;  // a group that saw only empty parts
        const float w = exp2f(mk - m);
        run.d = fmaf(w, d_of[first_slot + k], run.d);
        const uint32_t at = (first_slot + k) * p.vph + vec;
#pragma unroll
        for (int e = 0; e < N; ++e) run.acc[e] = fmaf(w, smem[e * blockDim.x + at], run.acc[e]);
      }
    }
  }
  if (!active || g != 0) return;
  const float inv = run.d > 0.f ? 1.f / run.d : 0.f;
  float o[N];
#pragma unroll
  for (int e = 0; e < N; ++e) o[e] = run.acc[e] * inv;
  Raw<TOut, N>::pack(o).store(p.vo + r * p.vo_sn + h * p.vo_sh + int64_t{vec} * N);
  if (p.so != nullptr && vec == 0) {
    p.so[r * p.so_sn + h * p.so_sh] = run.d > 0.f ? run.m + log2f(run.d) : -INFINITY;
  }
}

/// Launch shape of MergeManyKernel.
struct ManyPlan {
  int64_t groups, block_states, threads, blocks;
  size_t smem_bytes;
};

/*!
 * @brief Groups per state and states per block (pure host policy).
 * @param max_parts parts per state when known (uniform merge), -1 when on the device (varlen).
 *
 * Groups double while the grid stays under ~1024 threads per SM (half of the resident
 * threads: enough loads in flight, cheap combine) and each group keeps >= 2 parts.
 * Worked examples (float32 parts, head_dim 128: 32 threads per group, 132 SMs):
 * 1 row x 32 heads -> 32 groups, 32 blocks of 1024 threads (~4 parts per thread);
 * 64 rows x 32 heads -> 2 groups, 4 states per 256-thread block;
 * 8192 rows x 32 heads -> 1 group, 8 states per block.
 */
inline ManyPlan plan_merge_many(int64_t num_states, int64_t vph, int64_t max_parts, int n_elems,
                                int num_sms) {
  const int64_t target_threads = int64_t{num_sms} * 1024;
  int64_t groups = 1;
  while (groups * 2 <= kMaxGroups && groups * 2 * vph <= kMaxBlockThreads &&
         num_states * vph * groups * 2 <= target_threads &&
         (max_parts < 0 || groups * 2 <= ceil_div(max_parts, 2))) {
    groups *= 2;
  }
  const int64_t group_threads = groups * vph;
  int64_t block_states = std::max<int64_t>(1, kManyBlockThreads / group_threads);
  block_states = std::min(block_states, std::max<int64_t>(1, ceil_div(num_states, num_sms)));
  const int64_t threads = ceil_div(block_states * group_threads, 32) * 32;
  size_t smem = 0;
  if (groups > 1) {
    const int64_t slots = ceil_div(threads, vph);
    smem = sizeof(float) * static_cast<size_t>(threads * n_elems + 2 * slots);
  }
  return {groups, block_states, threads, ceil_div(num_states, block_states), smem};
}

inline cudaError_t num_sms_of_current_device(int* num_sms) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  return cudaDeviceGetAttribute(num_sms, cudaDevAttrMultiProcessorCount, device);
}

inline bool divisible(int64_t x, int64_t n) { return x % n == 0; }

}  // namespace detail

}  // namespace cascade
}  // namespace flashinfer

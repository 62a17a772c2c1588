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

// The FLASHINFER_CASCADE_* macros exist for side-by-side tuning builds
// (benchmarks/tuning/tune_cascade.py); the defaults follow the copy-like kernels measured on the
// H100 (rope.cuh, benchmarks/notes/cascade-merge-kernels.md).
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
// 1: MergeTwoKernel addresses states of head-packed tensors (row stride == heads x head
// stride, the layout attention writes) as one index, without the (row, head) split.
#ifndef FLASHINFER_CASCADE_FLAT
#define FLASHINFER_CASCADE_FLAT 1
#endif
// MergeManyKernel: parts whose loads each thread issues before it uses one.
#ifndef FLASHINFER_CASCADE_MANY_UNROLL
#define FLASHINFER_CASCADE_MANY_UNROLL 6
#endif
// MergeManyKernel: 1 reads indptr before the PDL wait, overlapping that load with the previous
// kernel's tail. Only correct when no kernel still running may write indptr (split-KV attention:
// plan() uploads it before the attention kernel). A measuring switch, off by default.
#ifndef FLASHINFER_CASCADE_INDPTR_BEFORE_PDL_WAIT
#define FLASHINFER_CASCADE_INDPTR_BEFORE_PDL_WAIT 0
#endif
// MergeManyKernel: narrowest column slice of a head row one block may own (in 16-byte
// vectors; 8 = one 128-byte line per part); a large value turns slicing off.
#ifndef FLASHINFER_CASCADE_MIN_SLICE_VECS
#define FLASHINFER_CASCADE_MIN_SLICE_VECS 8
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
inline constexpr bool kFlatStates = FLASHINFER_CASCADE_FLAT != 0;
static_assert(kItemsPerThread >= 1 && kItemsPerThread <= 32, "the live-item mask is 32 bits");
static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one block");

// MergeManyKernel: parts whose loads are in flight per thread (8: the split-KV decode shape,
// 132 parts over 32 groups, is one round of loads, not two); groups per state; preferred block
// size when states are plentiful.
inline constexpr int kUnroll = FLASHINFER_CASCADE_MANY_UNROLL;
inline constexpr int64_t kMaxGroups = 32;
inline constexpr int64_t kMaxBlockThreads = 1024;
inline constexpr int64_t kManyBlockThreads = 256;
inline constexpr int64_t kMinSliceVecs = FLASHINFER_CASCADE_MIN_SLICE_VECS;
static_assert(kUnroll >= 1 && kUnroll <= 16, "parts in flight per thread");

// Fast base-2 exponential, logarithm and reciprocal (one MUFU instruction each). Their errors
// (ex2, rcp: ~2 ulp; lg2: 2^-22 absolute) are far below the float32 tolerance of the merges, and
// the accurate library forms cost 5 (exp2f), ~25 (log2f) and ~10 plus a slow-path call
// (__frcp_rn) instructions, which the two-way merge paid per 16-byte item. ftz: a weight under
// 2^-126 becomes 0, so its operand is left out (a change below 2^-126 relative). fast_exp2:
// vec.cuh.
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// Normalized weights of two states (0 for an empty one).
struct PairWeights {
  float wa, wb;
};

__device__ __forceinline__ PairWeights pair_weights(float sa, float sb) {
  const float m = fmaxf(sa, sb);
  if (m == -INFINITY) return {0.f, 0.f};  // both empty
  const float ea = fast_exp2(sa - m), eb = fast_exp2(sb - m);
  const float inv = fast_rcp(ea + eb);  // ea + eb in [1, 2]
  return {ea * inv, eb * inv};
}

/// log2(2^sa + 2^sb), -inf when both are.
__device__ __forceinline__ float pair_lse(float sa, float sb) {
  const float m = fmaxf(sa, sb);
  if (m == -INFINITY) return -INFINITY;
  return m + fast_log2(fast_exp2(sa - m) + fast_exp2(sb - m));
}

/// A PackedWords vector (vec.cuh) with this file's loads: 16-byte ones may ask L2 to fetch the
/// whole 128/256-byte line (FLASHINFER_CASCADE_L2_PREFETCH).
template <typename T, int N>
struct Raw : PackedWords<Raw<T, N>, T, N> {
  using Base = PackedWords<Raw<T, N>, T, N>;
  using Base::kBytes;
  using Base::kWords;
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

  /// The same vector, or zeros when `keep` is false (one select per 32-bit word).
  __device__ __forceinline__ Raw kept_if(bool keep) const {
    Raw r;
#pragma unroll
    for (int k = 0; k < kWords; ++k) r.w[k] = keep ? w[k] : 0u;
    return r;
  }
};

/// wa * a + wb * b; an operand whose weight is 0 is zeroed first, not multiplied (it may be
/// garbage: 0 * inf is NaN).
template <typename T, int N>
__device__ __forceinline__ Raw<T, N> combine(const Raw<T, N>& a, const Raw<T, N>& b,
                                             const PairWeights& w) {
  const Raw<T, N> a0 = a.kept_if(w.wa != 0.f), b0 = b.kept_if(w.wb != 0.f);
  float o[N];
#pragma unroll
  for (int e = 0; e < N; ++e) o[e] = fmaf(w.wa, a0.get(e), w.wb * b0.get(e));
  return Raw<T, N>::pack(o);
}

// ---------------------------------------------------------------------------------------------
// MergeTwoKernel
// ---------------------------------------------------------------------------------------------

/// Element strides of one tensor over (row, head). With flat addressing, `h` is the stride
/// between consecutive states (row-major over (row, head)) and `n` is unused.
struct Stride2 {
  int64_t n, h;
};

template <typename T>
struct MergeTwoParams {
  const T* va;
  const T* vb;
  T* vo;
  const float* sa;
  const float* sb;
  float* so;
  const bool* mask;
  Stride2 va_s, vb_s, vo_s, sa_s, sb_s, so_s;
  int64_t num_states;     // seq_len * num_heads
  uint32_t tile_states;   // states per block
  FastDiv vph;            // vectors per head row
  FastDiv heads;          // num_heads
};

/// State j of a block's tile, as the kernel addresses it: flat, the state index; otherwise
/// (row, head).
template <bool kFlat>
struct StateAt {
  int64_t l;   // flat: the state index
  uint32_t h;  // flat: 0

  __device__ __forceinline__ int64_t off(const Stride2& s) const {
    if constexpr (kFlat) {
      return l * s.h;
    } else {
      return l * s.n + int64_t{h} * s.h;
    }
  }
  __device__ __forceinline__ int64_t row() const { return l; }  // general form only
};

/// The tile of states [begin, begin + count) of one block, and the map from tile-local state j
/// to StateAt (one 32-bit division by num_heads per lookup in the general form).
template <bool kFlat>
struct Tile {
  int64_t begin;
  int64_t l0;  // general form: row and head of the first state
  uint32_t h0;

  __device__ __forceinline__ Tile(int64_t tile_begin, const FastDiv& heads) : begin(tile_begin) {
    if constexpr (kFlat) {
      l0 = 0, h0 = 0;
    } else {
      int64_t h;
      heads.divmod64(tile_begin, l0, h);
      h0 = static_cast<uint32_t>(h);
    }
  }

  __device__ __forceinline__ StateAt<kFlat> at(uint32_t j, const FastDiv& heads) const {
    if constexpr (kFlat) {
      return {begin + j, 0};
    } else {
      uint32_t dl, h;
      heads.divmod(h0 + j, dl, h);  // h0 < num_heads, j < tile_states
      return {l0 + dl, h};
    }
  }
};

/*!
 * @brief One block merges a tile of whole states. Items are the 16-byte vectors of the tile,
 *        numbered state by state; thread t takes items t, t + kThreads, ... and issues all their
 *        loads (v_a, v_b and the two s of the item's state) before it uses one. The merged s of
 *        tile state j is computed and stored by thread j (one coalesced store per warp, not one
 *        store per state by its first vector's thread).
 * @tparam kInPlace v_out/s_out alias v_a/s_a; mask rows; s is written after a block barrier
 *         (every s of the tile is read before it).
 * @tparam kFlat states addressed as one index (every tensor head-packed, see Stride2); never
 *         launched with a row mask, which needs the row (MergeTwo takes the (row, head) form)
 */
template <typename T, int N, bool kInPlace, bool kFlat>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM)
    MergeTwoKernel(const __grid_constant__ MergeTwoParams<T> p) {
  const uint32_t t = threadIdx.x;
  const Tile<kFlat> tile(int64_t{blockIdx.x} * p.tile_states, p.heads);
  const uint32_t tile_states =
      static_cast<uint32_t>(min(int64_t{p.tile_states}, p.num_states - tile.begin));
  const uint32_t tile_items = tile_states * p.vph.d;
  pdl_wait();
  // s of the state this thread stores, loaded with the first round of items.
  float own_sa = -INFINITY, own_sb = -INFINITY;
  bool own = t < tile_states;
  if (own) {
    const StateAt<kFlat> s = tile.at(t, p.heads);
    if constexpr (kInPlace && !kFlat) own = p.mask == nullptr || p.mask[s.row()];
    if (own) own_sa = p.sa[s.off(p.sa_s)], own_sb = p.sb[s.off(p.sb_s)];
  }
  for (uint32_t base = 0; base < tile_items; base += kTileItems) {
    Raw<T, N> a[kItemsPerThread], b[kItemsPerThread];
    float sa[kItemsPerThread], sb[kItemsPerThread];
    uint32_t live = 0;
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      const uint32_t i = base + k * kThreads + t;
      if (i >= tile_items) continue;
      uint32_t j, vec;
      p.vph.divmod(i, j, vec);
      const StateAt<kFlat> s = tile.at(j, p.heads);
      if constexpr (kInPlace && !kFlat) {
        if (p.mask != nullptr && !p.mask[s.row()]) continue;
      }
      live |= 1u << k;
      a[k].load(p.va + s.off(p.va_s) + vec * N);
      b[k].load(p.vb + s.off(p.vb_s) + vec * N);
      sa[k] = p.sa[s.off(p.sa_s)];
      sb[k] = p.sb[s.off(p.sb_s)];
    }
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      if (!(live & (1u << k))) continue;
      const uint32_t i = base + k * kThreads + t;  // recomputed: cheaper than registers
      uint32_t j, vec;
      p.vph.divmod(i, j, vec);
      const StateAt<kFlat> s = tile.at(j, p.heads);
      combine(a[k], b[k], pair_weights(sa[k], sb[k])).store(p.vo + s.off(p.vo_s) + vec * N);
    }
  }
  pdl_launch_dependents();
  // In place, s_out aliases s_a: write the tile's s only after every thread has read it.
  if constexpr (kInPlace) __syncthreads();
  if (own) p.so[tile.at(t, p.heads).off(p.so_s)] = pair_lse(own_sa, own_sb);
  // Tiles of more states than threads (head rows of fewer than kItemsPerThread vectors).
  for (uint32_t j = t + kThreads; j < tile_states; j += kThreads) {
    const StateAt<kFlat> s = tile.at(j, p.heads);
    if constexpr (kInPlace && !kFlat) {
      if (p.mask != nullptr && !p.mask[s.row()]) continue;
    }
    p.so[s.off(p.so_s)] = pair_lse(p.sa[s.off(p.sa_s)], p.sb[s.off(p.sb_s)]);
  }
}

/// Grid of MergeTwoKernel: whole-state tiles of about kTileItems items; smaller tiles (down to
/// one state) when there are fewer states than one wave of blocks needs, so every SM works.
/// Worked example (8192 x 32 heads x 128, bf16, defaults): 16 vectors per head, 32 states per
/// tile, 8192 blocks of 128 threads, 4 items each.
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
  int64_t num_slices;     // num_states * slices: the units blocks are planned over
  FastDiv heads;
  FastDiv slices;         // column slices per head row
  int64_t v_sr, v_sp, v_sh, s_sr, s_sp, s_sh;
  int64_t vo_sn, vo_sh, so_sn, so_sh;
  uint32_t width;         // threads per group: one per vector of a slice
  uint32_t groups;        // groups per slice, splitting its parts
  uint32_t block_slices;  // slices per block
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
    const float scale = fast_exp2(m - mc);  // 0 while m == -inf (acc and d are 0 then)
    d *= scale;
#pragma unroll
    for (int e = 0; e < N; ++e) acc[e] *= scale;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float w = fast_exp2(sv[u] - mc);
      if (w > 0.f) {
        d += w;
#pragma unroll
        for (int e = 0; e < N; ++e) acc[e] = fmaf(w, x[u].get(e), acc[e]);
      }
    }
    m = mc;
  }
};

/*!
 * @brief Many-way merge. The unit of work is a column slice of one state's head row (the whole
 *        row unless there are too few states to fill the SMs, see plan_merge_many): a group of
 *        `width` threads, one per vector of the slice, walks the parts of its state with an
 *        online log-sum-exp, kUnroll parts' loads in flight at a time. `groups` groups split one
 *        slice's parts and combine through shared memory. Slices of one state need no
 *        combining: each owns its columns, and each reads the same log-sum-exps.
 */
template <typename TIn, typename TOut, int N>
__global__ void __launch_bounds__(kMaxBlockThreads)
    MergeManyKernel(const __grid_constant__ MergeManyParams<TIn, TOut> p) {
  extern __shared__ float smem[];  // groups > 1: [N][blockDim] partial acc, then m and d per slot
  const uint32_t t = threadIdx.x;
  const uint32_t slot = t / p.width;  // (slice of the block, group): one division per thread
  const uint32_t lane = t - slot * p.width;
  const uint32_t local = slot / p.groups;
  const uint32_t g = slot - local * p.groups;
  const int64_t unit = int64_t{blockIdx.x} * p.block_slices + local;
  const bool active = local < p.block_slices && unit < p.num_slices;
  int64_t r = 0, h = 0, state = 0, slice = 0;
  p.slices.divmod64(unit, state, slice);
  p.heads.divmod64(state, r, h);
  const uint32_t vec = static_cast<uint32_t>(slice) * p.width + lane;
  Running<N> run;
  int32_t first = 0, last = 0;  // varlen: this row's parts
  const bool varlen = p.indptr != nullptr;
#if FLASHINFER_CASCADE_INDPTR_BEFORE_PDL_WAIT
  if (active && varlen) first = p.indptr[r], last = p.indptr[r + 1];
#endif
  pdl_wait();
  if (active) {
#if !FLASHINFER_CASCADE_INDPTR_BEFORE_PDL_WAIT
    if (varlen) first = p.indptr[r], last = p.indptr[r + 1];
#endif
    // Parts counted in int32 (indptr's type; the host checks num_parts).
    const int32_t count = varlen ? last - first : static_cast<int32_t>(p.num_parts);
    const int64_t v_base = varlen ? first * p.v_sp : r * p.v_sr;
    const int64_t s_base = varlen ? first * p.s_sp : r * p.s_sr;
    const TIn* vp = p.v + v_base + h * p.v_sh + int64_t{vec} * N;
    const float* sp = p.s + s_base + h * p.s_sh;
    const int32_t groups = static_cast<int32_t>(p.groups);
    for (int32_t i0 = static_cast<int32_t>(g); i0 < count; i0 += groups * kUnroll) {
      float sv[kUnroll];
      Raw<TIn, N> x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int32_t i = i0 + u * groups;
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
    // Combine the groups of each slice in its group 0 (one barrier).
    float* m_of = smem + size_t{blockDim.x} * N;
    float* d_of = m_of + (blockDim.x + p.width - 1) / p.width;
    if (active) {
#pragma unroll
      for (int e = 0; e < N; ++e) smem[e * blockDim.x + t] = run.acc[e];
      if (lane == 0) m_of[slot] = run.m, d_of[slot] = run.d;
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
        const float w = fast_exp2(mk - m);
        run.d = fmaf(w, d_of[first_slot + k], run.d);
        const uint32_t at = (first_slot + k) * p.width + lane;
#pragma unroll
        for (int e = 0; e < N; ++e) run.acc[e] = fmaf(w, smem[e * blockDim.x + at], run.acc[e]);
      }
    }
  }
  if (!active || g != 0) return;
  const float inv = run.d > 0.f ? fast_rcp(run.d) : 0.f;  // d >= 1 when > 0
  float o[N];
#pragma unroll
  for (int e = 0; e < N; ++e) o[e] = run.acc[e] * inv;
  Raw<TOut, N>::pack(o).store(p.vo + r * p.vo_sn + h * p.vo_sh + int64_t{vec} * N);
  if (p.so != nullptr && vec == 0) {
    p.so[r * p.so_sn + h * p.so_sh] = run.d > 0.f ? run.m + fast_log2(run.d) : -INFINITY;
  }
}

/// Launch shape of MergeManyKernel.
struct ManyPlan {
  int64_t slices, width, groups, block_slices, threads, blocks;
  size_t smem_bytes;
};

/*!
 * @brief Slices per head row, groups per slice and slices per block (pure host policy).
 * @param max_parts parts per state when known (uniform merge), -1 when on the device (varlen).
 *
 * Slices: while the states alone would give fewer blocks than SMs, head rows are split in
 * halves (down to kMinSliceVecs vectors), so one state's parts are read by several SMs; one
 * block reading all 132 float32 parts of a head-128 row pulls 66 KB through one SM, a quarter
 * slice 17 KB. Groups double while the grid stays under ~1024 threads per SM (one wave: an SM
 * holds 1024 threads of this 64-register kernel; enough loads in flight, a cheap combine) and
 * each group keeps >= 2 parts.
 * Worked examples (132 SMs):
 * 1 row x 32 heads, float32 parts of 128 (32 vectors): 4 slices of 8 vectors, 32 groups,
 *   128 blocks of 256 threads; 132 parts are ~4 per group: one round of kUnroll loads;
 * 64 rows x 32 heads, float32: 1 slice, 2 groups, 4 states per 256-thread block;
 * 8192 rows x 32 heads: 1 slice, 1 group, 8 states per block.
 */
inline ManyPlan plan_merge_many(int64_t num_states, int64_t vph, int64_t max_parts, int n_elems,
                                int num_sms) {
  int64_t slices = 1;
  while (vph % (slices * 2) == 0 && vph / (slices * 2) >= kMinSliceVecs &&
         num_states * slices * 2 <= num_sms) {
    slices *= 2;
  }
  const int64_t width = vph / slices;
  const int64_t units = num_states * slices;
  const int64_t target_threads = int64_t{num_sms} * 1024;
  int64_t groups = 1;
  while (groups * 2 <= kMaxGroups && groups * 2 * width <= kMaxBlockThreads &&
         units * width * groups * 2 <= target_threads &&
         (max_parts < 0 || groups * 2 <= ceil_div(max_parts, 2))) {
    groups *= 2;
  }
  const int64_t group_threads = groups * width;
  int64_t block_slices = std::max<int64_t>(1, kManyBlockThreads / group_threads);
  block_slices = std::min(block_slices, std::max<int64_t>(1, ceil_div(units, num_sms)));
  const int64_t threads = ceil_div(block_slices * group_threads, 32) * 32;
  size_t smem = 0;
  if (groups > 1) {
    const int64_t slots = ceil_div(threads, width);
    smem = sizeof(float) * static_cast<size_t>(threads * n_elems + 2 * slots);
  }
  return {slices, width, groups, block_slices, threads, ceil_div(units, block_slices), smem};
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

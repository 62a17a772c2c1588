// RoPE: rotary position embedding of q and k in one pass. Framework-free: raw pointers, sizes
// and strides in, cudaError_t out.
//
// Layout. q is (nnz, Hq, D) and k is (nnz, Hk, D), last dim contiguous, any row and head stride
// (packed-QKV views). Channels [0, rotary_dim) are rotated in pairs, channels [rotary_dim, D)
// pass through (copied when out of place). NeoX pairs channel i with i + rotary_dim/2; GPT-J
// ("interleave") pairs 2i with 2i+1. Pair i of token t rotates by the angle pos_t * freq_i.
//
// Work decomposition. A work item is (token, head group, unit). A rotary unit is two N-wide
// vectors of one head row: `lo` at channel u*N and `hi` at channel rotary_dim/2 + u*N; both
// layouts fit this addressing (for GPT-J each vector holds N/2 whole pairs), so the threads of
// a warp read contiguous 128-byte runs in either mode. The thread computes the N angles of its
// unit once (one accurate sincos each) and reuses them for every head of its group (about 8
// heads, q heads then k heads), with kHeadBatch heads' loads in flight. The kernel is a copy
// with a few FMAs per element, so it runs at memory bandwidth when accesses are 16 bytes wide
// and enough of them are in flight; any other layout takes the same code with N = 1.
//
// Positions. pos_ids: one load per item. indptr/offsets: a binary search of indptr per item
// (log2(batch) loads that hit L1/L2, overlapped with the item's first q/k loads); cheaper than
// a second kernel and its scratch buffer, and nothing to allocate under CUDA graphs.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "launch.cuh"
#include "vec.cuh"

namespace flashinfer {
namespace rope {

/// Largest rotary_dim: the frequency table (rotary_dim/2 floats) travels in the kernel
/// parameters (1 KB; the classic limit is 4 KB) so no device buffer or upload is needed.
inline constexpr int kMaxRotaryDim = 512;

/// Where the position of a token comes from, and where its angles come from.
enum class PosMode : int {
  kPosIds = 0,       ///< pos = pos_ids[token]; angle = pos * freq (frequency table)
  kIndptr = 1,       ///< pos = offsets[b] + token - indptr[b]; angle = pos * freq
  kCosSinCache = 2,  ///< pos = pos_ids[token]; cos/sin read from a float32 (max_pos, rd) cache
};

/// Frequency schedule of the pos-ids and indptr modes (ignored with a cos/sin cache).
struct FreqConfig {
  double rope_scale = 1.0;
  double rope_theta = 1e4;
  bool llama31 = false;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double old_context_len = 8192.0;
};

/*!
 * @brief Everything one RoPE launch needs. Strides are in elements; a stride of a size-1
 *        dimension is ignored. For in-place, q_out == q and k_out == k (with equal strides).
 * @tparam T __half or __nv_bfloat16
 * @tparam IdType int32_t or int64_t (pos_ids, indptr and offsets)
 */
template <typename T, typename IdType>
struct RopeArgs {
  const T* q = nullptr;
  const T* k = nullptr;
  T* q_out = nullptr;
  T* k_out = nullptr;
  int64_t nnz = 0;
  int64_t num_q_heads = 0;
  int64_t num_k_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  int64_t q_stride_n = 0, q_stride_h = 0, k_stride_n = 0, k_stride_h = 0;
  int64_t q_out_stride_n = 0, q_out_stride_h = 0, k_out_stride_n = 0, k_out_stride_h = 0;
  bool interleave = false;
  PosMode mode = PosMode::kPosIds;
  const IdType* pos_ids = nullptr;  // (nnz,): kPosIds, kCosSinCache
  const IdType* indptr = nullptr;   // (batch_size + 1,): kIndptr
  const IdType* offsets = nullptr;  // (batch_size,): kIndptr
  int64_t batch_size = 0;
  const float* cos_sin_cache = nullptr;  // (max_pos, rotary_dim): kCosSinCache
  int64_t cache_stride = 0;
  int64_t max_pos = 0;
  FreqConfig freq;
};

namespace detail {

inline constexpr int kThreads = 256;
// 4 blocks of 256 threads per SM (half the SM's threads) caps registers at 64/thread. With
// kHeadBatch = 2 a thread has 4 x 16 B loads in flight, 64 KB per SM: ~5x the ~12 KB of reads
// per SM that cover ~1 us of loaded DRAM latency at ~3 TB/s. (kHeadBatch = 4 spills at 64.)
inline constexpr int kMinBlocksPerSM = 4;
inline constexpr int kHeadBatch = 2;
// Head groups. A thread visits the heads of its group one batch after another, one DRAM
// latency (~1 us loaded) per batch, so a group of all 40 heads of a 32/8 model is a ~20 us
// chain: when the grid is a little over one wave, the last blocks run that chain nearly alone
// (up to +18% at 16k tokens). Groups of about kHeadsPerGroup heads keep the chain at ~4
// batches and the tail at a few percent, while the angles are still reused over 8 heads (the
// recomputed sincos is < 10% of the issue slots of a kernel that is far from compute bound).
inline constexpr int kHeadsPerGroup = 8;
// Few tokens (decode): split heads further until the grid has this many threads per SM.
inline constexpr int kTargetThreadsPerSM = 512;

/// Kernel parameters, passed as a __grid_constant__ so the frequency table is indexed in the
/// constant bank instead of being copied to local memory.
template <typename T, typename IdType, PosMode kMode>
struct Params {
  static constexpr int kTableSize = kMode == PosMode::kCosSinCache ? 1 : kMaxRotaryDim / 2;
  const T* q;
  const T* k;
  T* q_out;
  T* k_out;
  int64_t q_sn, q_sh, k_sn, k_sh, qo_sn, qo_sh, ko_sn, ko_sh;
  const IdType* pos_ids;
  const IdType* indptr;
  const IdType* offsets;
  int64_t batch_size;
  const float* cache;
  int64_t cache_stride;
  int64_t max_pos;
  int64_t token_begin;   // first token of this launch
  uint32_t num_items;    // tokens of this launch * num_groups * units_total (< 2^31)
  uint32_t units_total;  // num_rot_units + num_copy_units
  uint32_t num_groups;
  int num_q_heads;
  int num_k_heads;
  int half_rotary;       // rotary_dim / 2
  int q_per_group;       // q heads per head group
  int k_per_group;       // k heads per head group
  int num_rot_units;     // rotary units per head
  int num_copy_units;    // pass-through units per head (0 in place)
  int num_copy_vecs;     // (head_dim - rotary_dim) / N
  float freq[kTableSize];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* ptr) {
  return Vec<T, N>::load_stream(ptr);
}

// Each output element is written once and not read again by this kernel: stream it.
template <typename T, int N>
__device__ __forceinline__ void store_vec(T* ptr, const Vec<T, N>& v) {
  if constexpr (sizeof(Vec<T, N>) == 16) {
    __stcs(reinterpret_cast<int4*>(ptr), *reinterpret_cast<const int4*>(&v));
  } else {
    v.store(ptr);
  }
}

/// Channel of the `lo` vector of rotary unit `u` (the `hi` vector is at +half_rotary, except
/// for GPT-J with N == 1, where a unit is the pair (2u, 2u+1)).
template <int N, bool kInterleave>
__device__ __forceinline__ int lo_channel(int u) {
  return (kInterleave && N == 1) ? 2 * u : u * N;
}
template <int N, bool kInterleave>
__device__ __forceinline__ int hi_channel(int u, int half_rotary) {
  return (kInterleave && N == 1) ? 2 * u + 1 : half_rotary + u * N;
}

/// Pair index of angle slot j of rotary unit u. NeoX (and GPT-J with N == 1): slot j rotates
/// (lo[j], hi[j]). GPT-J with N >= 2: slots j < N/2 rotate (lo[2j], lo[2j+1]) and slots
/// j >= N/2 rotate (hi[2j-N], hi[2j-N+1]).
template <int N, bool kInterleave>
__device__ __forceinline__ int pair_index(int u, int j, int half_rotary) {
  if constexpr (!kInterleave || N == 1) {
    return u * N + j;
  } else {
    return j < N / 2 ? u * (N / 2) + j : half_rotary / 2 + u * (N / 2) + (j - N / 2);
  }
}

/*!
 * @brief sin and cos of an fp32 angle to ~2e-7 absolute, for angles up to ~1e9 rad.
 *
 * The angle is fl(float(pos) * freq): the frequency is rounded to float once (on the host),
 * the product once; that is the fp32 math of the contract. Positions reach 1e5+, so the angle
 * does too, where the fast __sincosf has no usable accuracy. sincosf is accurate there but
 * inlines a Payne-Hanek slow path per call (local memory, ~10 extra registers each, spills
 * with 8 calls per thread). Instead: a/pi in double (relative error 1e-16), reduced exactly
 * modulo 2, then sincospif, whose own reduction is exact and needs no slow path.
 */
__device__ __forceinline__ void accurate_sincos(float angle, float* s, float* c) {
  double t = static_cast<double>(angle) * 0.31830988618379067154;  // 1/pi
  t -= 2.0 * rint(0.5 * t);                                          // exact; |t| <= 1
  sincospif(static_cast<float>(t), s, c);
}

/// Position of `token`, or false when the token belongs to no request (kIndptr only: rows
/// outside [indptr[0], indptr[batch_size]) are left unrotated).
template <typename T, typename IdType, PosMode kMode>
__device__ __forceinline__ bool token_position(const Params<T, IdType, kMode>& p, int64_t token,
                                               int64_t* pos) {
  if constexpr (kMode == PosMode::kIndptr) {
    const int64_t first = static_cast<int64_t>(__ldg(p.indptr));
    const int64_t last = static_cast<int64_t>(__ldg(p.indptr + p.batch_size));
    if (token < first || token >= last) return false;
    // Largest b with indptr[b] <= token; empty requests (equal indptr entries) are skipped
    // because the search keeps the last of equal entries.
    int64_t lo = 0, hi = p.batch_size;  // indptr[lo] <= token < indptr[hi]
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) >> 1;
      if (static_cast<int64_t>(__ldg(p.indptr + mid)) <= token) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    const int64_t start = static_cast<int64_t>(__ldg(p.indptr + lo));
    *pos = static_cast<int64_t>(__ldg(p.offsets + lo)) + (token - start);
    return true;
  } else {
    *pos = static_cast<int64_t>(__ldg(p.pos_ids + token));
    // A position outside the cache would read out of bounds; such rows are left unrotated.
    if constexpr (kMode == PosMode::kCosSinCache) return *pos >= 0 && *pos < p.max_pos;
    return true;
  }
}

/*!
 * @brief Rotate (and for out of place, copy the pass-through channels of) q and k.
 * @tparam N elements per vector access: 8 (16 bytes) when every pointer and stride allows it,
 *         else 1.
 */
template <typename T, typename IdType, int N, bool kInterleave, PosMode kMode>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM)
    RopeKernel(const __grid_constant__ Params<T, IdType, kMode> p) {
  static_assert(N == 1 || N % 2 == 0,
                "vector width must be 1 or even (GPT-J pairs must not straddle vectors)");
  using V = Vec<T, N>;
  pdl_wait();
  // 32-bit item math: 64-bit division is a subroutine call whose register convention made
  // the 16-byte variants spill; the host splits launches so items fit in 31 bits.
  const uint32_t item = blockIdx.x * kThreads + threadIdx.x;
  if (item < p.num_items) {
    const int unit = static_cast<int>(item % p.units_total);
    const uint32_t rest = item / p.units_total;
    const int group = static_cast<int>(rest % p.num_groups);
    const int64_t token = p.token_begin + rest / p.num_groups;

    const int hq0 = group * p.q_per_group;
    const int hk0 = group * p.k_per_group;
    const int nq = max(0, min(p.num_q_heads - hq0, p.q_per_group));
    const int nk = max(0, min(p.num_k_heads - hk0, p.k_per_group));
    const int num_slots = nq + nk;
    // Slot s < nq is q head hq0 + s, slot s >= nq is k head hk0 + s - nq.
    const T* q_in = p.q + token * p.q_sn + hq0 * p.q_sh;
    const T* k_in = p.k + token * p.k_sn + hk0 * p.k_sh;
    T* q_o = p.q_out + token * p.qo_sn + hq0 * p.qo_sh;
    T* k_o = p.k_out + token * p.ko_sn + hk0 * p.ko_sh;
    auto src_row = [&](int s) { return s < nq ? q_in + s * p.q_sh : k_in + (s - nq) * p.k_sh; };
    auto dst_row = [&](int s) { return s < nq ? q_o + s * p.qo_sh : k_o + (s - nq) * p.ko_sh; };

    if (unit < p.num_rot_units) {
      const int lo_c = lo_channel<N, kInterleave>(unit);
      const int hi_c = hi_channel<N, kInterleave>(unit, p.half_rotary);
      V lo[kHeadBatch], hi[kHeadBatch];
      auto load_batch = [&](int s0) {
#pragma unroll
        for (int i = 0; i < kHeadBatch; ++i) {
          if (s0 + i < num_slots) {
            const T* row = src_row(s0 + i);
            lo[i] = load_vec<T, N>(row + lo_c);
            hi[i] = load_vec<T, N>(row + hi_c);
          }
        }
      };
      // The first loads do not depend on the position: issue them before the lookup and the
      // sincos so their latency overlaps.
      load_batch(0);

      float cos_v[N], sin_v[N];
      int64_t pos = 0;
      const bool rotate = token_position(p, token, &pos);
      if constexpr (kMode == PosMode::kCosSinCache) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          cos_v[j] = 1.f;
          sin_v[j] = 0.f;
        }
        if (rotate) {
          const float* cs = p.cache + pos * p.cache_stride;
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const int pi = pair_index<N, kInterleave>(unit, j, p.half_rotary);
            cos_v[j] = __ldg(cs + pi);
            sin_v[j] = __ldg(cs + p.half_rotary + pi);
          }
        }
      } else {
        const float fpos = static_cast<float>(pos);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float angle = fpos * p.freq[pair_index<N, kInterleave>(unit, j, p.half_rotary)];
          accurate_sincos(angle, &sin_v[j], &cos_v[j]);
          // Identity rotation (exact: x*1 - y*0 == x) for rows outside every request.
          cos_v[j] = rotate ? cos_v[j] : 1.f;
          sin_v[j] = rotate ? sin_v[j] : 0.f;
        }
      }

      for (int s0 = 0;;) {
#pragma unroll
        for (int i = 0; i < kHeadBatch; ++i) {
          if (s0 + i < num_slots) {
            if constexpr (!kInterleave || N == 1) {
#pragma unroll
              for (int j = 0; j < N; ++j) {
                const float x = to_float(lo[i][j]), y = to_float(hi[i][j]);
                lo[i][j] = from_float<T>(x * cos_v[j] - y * sin_v[j]);
                hi[i][j] = from_float<T>(y * cos_v[j] + x * sin_v[j]);
              }
            } else {
#pragma unroll
              for (int j = 0; j < N / 2; ++j) {
                const float x0 = to_float(lo[i][2 * j]), y0 = to_float(lo[i][2 * j + 1]);
                lo[i][2 * j] = from_float<T>(x0 * cos_v[j] - y0 * sin_v[j]);
                lo[i][2 * j + 1] = from_float<T>(y0 * cos_v[j] + x0 * sin_v[j]);
                const float x1 = to_float(hi[i][2 * j]), y1 = to_float(hi[i][2 * j + 1]);
                const float c1 = cos_v[N / 2 + j], s1 = sin_v[N / 2 + j];
                hi[i][2 * j] = from_float<T>(x1 * c1 - y1 * s1);
                hi[i][2 * j + 1] = from_float<T>(y1 * c1 + x1 * s1);
              }
            }
            T* row = dst_row(s0 + i);
            store_vec<T, N>(row + lo_c, lo[i]);
            store_vec<T, N>(row + hi_c, hi[i]);
          }
        }
        s0 += kHeadBatch;
        if (s0 >= num_slots) break;
        load_batch(s0);
      }
    } else {
      // Pass-through unit c copies vectors c and c + num_copy_units of the channels
      // [rotary_dim, head_dim), mirroring the lo/hi split so warps stay coalesced.
      const int c = unit - p.num_rot_units;
      const int a_c = 2 * p.half_rotary + c * N;
      const bool has_b = c + p.num_copy_units < p.num_copy_vecs;
      const int b_c = a_c + p.num_copy_units * N;
      for (int s0 = 0; s0 < num_slots; s0 += kHeadBatch) {
        V a[kHeadBatch], b[kHeadBatch];
#pragma unroll
        for (int i = 0; i < kHeadBatch; ++i) {
          if (s0 + i < num_slots) {
            const T* row = src_row(s0 + i);
            a[i] = load_vec<T, N>(row + a_c);
            if (has_b) b[i] = load_vec<T, N>(row + b_c);
          }
        }
#pragma unroll
        for (int i = 0; i < kHeadBatch; ++i) {
          if (s0 + i < num_slots) {
            T* row = dst_row(s0 + i);
            store_vec<T, N>(row + a_c, a[i]);
            if (has_b) store_vec<T, N>(row + b_c, b[i]);
          }
        }
      }
    }
  }
  pdl_launch_dependents();
}

/// Frequency of pair i (before rounding to float): theta^(-2i/rotary_dim) / rope_scale, or
/// the Llama-3.1 blend of the scaled and unscaled frequency. Double precision on the host, so
/// the table holds the correctly rounded value of the formula.
inline double pair_frequency(const FreqConfig& f, int64_t i, int64_t rotary_dim) {
  const double freq = std::pow(f.rope_theta, -2.0 * static_cast<double>(i) / rotary_dim);
  if (!f.llama31) return freq / f.rope_scale;
  const double two_pi = 6.283185307179586476925286766559;
  const double span = f.high_freq_factor - f.low_freq_factor;
  double smooth = freq * f.old_context_len / (two_pi * span) - f.low_freq_factor / span;
  smooth = std::fmin(1.0, std::fmax(0.0, smooth));
  return (1.0 - smooth) * freq / f.rope_scale + smooth * freq;
}

inline int64_t norm_stride(int64_t size, int64_t stride) { return size <= 1 ? 0 : stride; }

template <typename T, typename IdType, int N, bool kInterleave, PosMode kMode>
cudaError_t Launch(const RopeArgs<T, IdType>& a, bool enable_pdl, cudaStream_t stream) {
  Params<T, IdType, kMode> p{};
  p.q = a.q;
  p.k = a.k;
  p.q_out = a.q_out;
  p.k_out = a.k_out;
  p.q_sn = norm_stride(a.nnz, a.q_stride_n);
  p.q_sh = norm_stride(a.num_q_heads, a.q_stride_h);
  p.k_sn = norm_stride(a.nnz, a.k_stride_n);
  p.k_sh = norm_stride(a.num_k_heads, a.k_stride_h);
  p.qo_sn = norm_stride(a.nnz, a.q_out_stride_n);
  p.qo_sh = norm_stride(a.num_q_heads, a.q_out_stride_h);
  p.ko_sn = norm_stride(a.nnz, a.k_out_stride_n);
  p.ko_sh = norm_stride(a.num_k_heads, a.k_out_stride_h);
  p.pos_ids = a.pos_ids;
  p.indptr = a.indptr;
  p.offsets = a.offsets;
  p.batch_size = a.batch_size;
  p.cache = a.cos_sin_cache;
  p.cache_stride = a.cache_stride;
  p.max_pos = a.max_pos;
  p.num_q_heads = static_cast<int>(a.num_q_heads);
  p.num_k_heads = static_cast<int>(a.num_k_heads);
  p.half_rotary = static_cast<int>(a.rotary_dim / 2);
  if constexpr (kMode != PosMode::kCosSinCache) {
    for (int64_t i = 0; i < a.rotary_dim / 2; ++i) {
      p.freq[i] = static_cast<float>(pair_frequency(a.freq, i, a.rotary_dim));
    }
  }
  const bool in_place = a.q_out == a.q && a.k_out == a.k;
  p.num_rot_units = (kInterleave && N == 1) ? p.half_rotary : p.half_rotary / N;
  p.num_copy_vecs = static_cast<int>((a.head_dim - a.rotary_dim) / N);
  p.num_copy_units = in_place ? 0 : (p.num_copy_vecs + 1) / 2;
  p.units_total = static_cast<uint32_t>(p.num_rot_units + p.num_copy_units);

  int device = 0, num_sms = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  status = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  if (status != cudaSuccess) return status;

  // Head groups (see kHeadsPerGroup): about 8 heads each, more groups when there are too few
  // tokens to fill the GPU, never more groups than heads.
  const int64_t max_heads = a.num_q_heads > a.num_k_heads ? a.num_q_heads : a.num_k_heads;
  const int64_t base_items = a.nnz * p.units_total;
  const int64_t target = static_cast<int64_t>(num_sms) * kTargetThreadsPerSM;
  const int64_t by_size = ceil_div(a.num_q_heads + a.num_k_heads, kHeadsPerGroup);
  const int64_t by_occupancy = ceil_div(target, base_items);
  int64_t groups = by_size > by_occupancy ? by_size : by_occupancy;
  groups = groups < 1 ? 1 : (groups > max_heads ? max_heads : groups);
  p.q_per_group = static_cast<int>(ceil_div(a.num_q_heads, groups));
  p.k_per_group = static_cast<int>(ceil_div(a.num_k_heads, groups));
  // With rounded-up group sizes fewer groups may cover all heads.
  const int64_t gq = p.q_per_group > 0 ? ceil_div(a.num_q_heads, p.q_per_group) : 0;
  const int64_t gk = p.k_per_group > 0 ? ceil_div(a.num_k_heads, p.k_per_group) : 0;
  p.num_groups = static_cast<uint32_t>(gq > gk ? gq : gk);

  // One thread per item, at most 2^31 items per launch (a token's items never straddle two).
  const int64_t items_per_token = static_cast<int64_t>(p.units_total) * p.num_groups;
  const int64_t max_tokens = (int64_t{1} << 31) / items_per_token;
  for (int64_t begin = 0; begin < a.nnz; begin += max_tokens) {
    const int64_t tokens = a.nnz - begin < max_tokens ? a.nnz - begin : max_tokens;
    p.token_begin = begin;
    p.num_items = static_cast<uint32_t>(tokens * items_per_token);
    status = launch_kernel(RopeKernel<T, IdType, N, kInterleave, kMode>,
                           dim3(static_cast<unsigned>(ceil_div(p.num_items, kThreads))),
                           dim3(kThreads), 0, stream, enable_pdl, p);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

template <typename T, typename IdType, int N, bool kInterleave>
cudaError_t DispatchMode(const RopeArgs<T, IdType>& a, bool enable_pdl, cudaStream_t stream) {
  switch (a.mode) {
    case PosMode::kPosIds:
      return Launch<T, IdType, N, kInterleave, PosMode::kPosIds>(a, enable_pdl, stream);
    case PosMode::kIndptr:
      return Launch<T, IdType, N, kInterleave, PosMode::kIndptr>(a, enable_pdl, stream);
    case PosMode::kCosSinCache:
      return Launch<T, IdType, N, kInterleave, PosMode::kCosSinCache>(a, enable_pdl, stream);
  }
  return cudaErrorInvalidValue;
}

/// True when every access of q, k, q_out, k_out can be `n` elements wide.
template <typename T, typename IdType>
bool vector_width_ok(const RopeArgs<T, IdType>& a, int64_t n) {
  if (n == 1) return true;
  // Rotary halves and the head must split into whole vectors (and, for GPT-J, whole pairs).
  if ((a.rotary_dim / 2) % n != 0 || a.head_dim % n != 0) return false;
  const int bytes = static_cast<int>(n * sizeof(T));
  if (!is_aligned(a.q, bytes) || !is_aligned(a.k, bytes) || !is_aligned(a.q_out, bytes) ||
      !is_aligned(a.k_out, bytes)) {
    return false;
  }
  const int64_t strides[] = {
      norm_stride(a.nnz, a.q_stride_n),         norm_stride(a.num_q_heads, a.q_stride_h),
      norm_stride(a.nnz, a.k_stride_n),         norm_stride(a.num_k_heads, a.k_stride_h),
      norm_stride(a.nnz, a.q_out_stride_n),     norm_stride(a.num_q_heads, a.q_out_stride_h),
      norm_stride(a.nnz, a.k_out_stride_n),     norm_stride(a.num_k_heads, a.k_out_stride_h)};
  for (int64_t s : strides) {
    if (s % n != 0) return false;
  }
  return true;
}

}  // namespace detail

/*!
 * @brief Apply RoPE to q and k (in place when q_out == q and k_out == k).
 * @return cudaErrorInvalidValue for a rotary_dim that is odd, above head_dim or above
 *         kMaxRotaryDim; otherwise the launch's status.
 */
template <typename T, typename IdType>
cudaError_t ApplyRope(const RopeArgs<T, IdType>& a, bool enable_pdl, cudaStream_t stream) {
  if (a.rotary_dim <= 0 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_dim ||
      a.rotary_dim > kMaxRotaryDim) {
    return cudaErrorInvalidValue;
  }
  if (a.nnz == 0 || a.num_q_heads + a.num_k_heads == 0) return cudaSuccess;
  constexpr int kVec = kVec16<T>;
  const bool wide = detail::vector_width_ok(a, kVec);
  if (a.interleave) {
    return wide ? detail::DispatchMode<T, IdType, kVec, true>(a, enable_pdl, stream)
                : detail::DispatchMode<T, IdType, 1, true>(a, enable_pdl, stream);
  }
  return wide ? detail::DispatchMode<T, IdType, kVec, false>(a, enable_pdl, stream)
              : detail::DispatchMode<T, IdType, 1, false>(a, enable_pdl, stream);
}

}  // namespace rope
}  // namespace flashinfer

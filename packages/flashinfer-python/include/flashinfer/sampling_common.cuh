// Building blocks of the sampling kernels (include/flashinfer/sampling.cuh): launch-shape and
// parameter types, the Philox generator, block and cluster reductions, the chunk loader, the
// radix select over order-preserving keys and the fixed-point draw. Framework-free device code;
// sampling.cuh explains the design.
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.cuh"
#include "vec.cuh"

namespace flashinfer {
namespace sampling {

namespace cg = cooperative_groups;

/// Filters of the sampling kernel (runtime: one kernel per input dtype serves them all).
enum Filter : int {
  kNoFilter = 0,
  kTopP = 1,
  kTopK = 2,
  kMinP = 3,
  kTopKTopPJoint = 4,  ///< keep what both filters keep, each on the original distribution
  kTopKFirstTopP = 5,  ///< top-k, then top-p on the renormalized top-k set
};

/// Row transforms that write a (B, V) output.
enum Transform : int {
  kSoftmax = 0,     ///< float32 out = softmax(x / temperature)
  kTopPRenorm = 1,  ///< float32 out = top-p kept probs / their sum, else 0
  kTopKRenorm = 2,  ///< T out = top-k kept probs / their sum, else 0
  kTopKMask = 3,    ///< T out = x where among the k largest, else -inf
};

inline constexpr int kBins = 256;
/// Threads per CTA. Measured on the H200 at 128 x 128256: 256 beats 512 (sampling 55 vs 64 us,
/// top-k 89 vs 103): 3 CTAs (64 KB chunks) per SM, so one CTA loads while the others compute.
inline constexpr int kThreads = 256;
/// Largest chunk a CTA holds (floats): 200 KB, under the 227 KB of dynamic shared memory.
inline constexpr int64_t kMaxChunk = 200 * 1024 / 4;
/// Preferred chunk (floats): 64 KB lets 3 CTAs (of different rows) share an SM.
inline constexpr int64_t kPreferredChunk = 64 * 1024 / 4;

/// A per-row parameter: row i reads arr[i] when arr is set, else the scalar.
template <typename V>
struct RowParam {
  const V* arr = nullptr;
  V value{};
  __device__ __forceinline__ V operator()(int64_t i) const { return arr ? arr[i] : value; }
};

/// Philox-4x32-10: four 32-bit outputs per counter; draw() walks the counter.
struct Philox {
  uint4 ctr;
  uint2 key;
  uint4 out;
  int idx;  ///< next output of `out` (4 = compute the next block)

  __device__ __forceinline__ Philox(uint64_t seed, uint64_t subsequence, uint64_t offset) {
    key = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    const uint64_t block = offset / 4;
    ctr = make_uint4(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                     static_cast<uint32_t>(subsequence), static_cast<uint32_t>(subsequence >> 32));
    out = rounds(ctr, key);
    idx = static_cast<int>(offset % 4);
  }

  __device__ __forceinline__ static uint4 rounds(uint4 c, uint2 k) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
      const uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
      const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
      c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
      k.x += 0x9E3779B9u;
      k.y += 0xBB67AE85u;
    }
    return c;
  }

  __device__ __forceinline__ uint32_t next() {
    if (idx == 4) {
      if (++ctr.x == 0 && ++ctr.y == 0 && ++ctr.z == 0) ++ctr.w;
      out = rounds(ctr, key);
      idx = 0;
    }
    const uint32_t v = idx == 0 ? out.x : idx == 1 ? out.y : idx == 2 ? out.z : out.w;
    ++idx;
    return v;
  }
};

/// Philox (seed, offset), as scalars or as int64/uint64 device tensors of length 1 or B.
struct RngArgs {
  const int64_t* seed_arr = nullptr;
  const int64_t* offset_arr = nullptr;
  int64_t seed_len = 0, offset_len = 0;
  uint64_t seed = 0, offset = 0;

  __device__ __forceinline__ Philox make(int64_t row) const {
    const uint64_t s = seed_arr ? static_cast<uint64_t>(seed_arr[seed_len == 1 ? 0 : row]) : seed;
    const uint64_t o =
        offset_arr ? static_cast<uint64_t>(offset_arr[offset_len == 1 ? 0 : row]) : offset;
    return Philox(s, static_cast<uint64_t>(row), o);
  }
};

/// Which rows to read: out row i reads in row indices[i] (int32 or int64) when set, else i.
struct RowMap {
  const void* indices = nullptr;
  bool indices_64 = false;
  int64_t num_in_rows = 0;
  __device__ __forceinline__ int64_t operator()(int64_t i) const {
    if (!indices) return i;
    return indices_64 ? static_cast<const int64_t*>(indices)[i]
                      : static_cast<int64_t>(static_cast<const int32_t*>(indices)[i]);
  }
};

/// Host-side launch shape for rows of `vocab` elements: cluster size, chunk and threads.
struct RowPlan {
  int cluster;    ///< CTAs per row (power of two, <= 16)
  int64_t chunk;  ///< elements per CTA (multiple of 8)
  int threads;    ///< threads per CTA
  size_t smem;    ///< dynamic shared memory bytes
};

// ------------------------------------------------------------------------------------------------
// Device helpers
// ------------------------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

/// Order-preserving key of a non-negative float (probabilities): the sign bit is 0, drop it.
__device__ __forceinline__ uint32_t key_nonneg(float x) { return __float_as_uint(x) << 1; }
/// Order-preserving key of any float (logits): flip negatives, set the sign of positives.
__device__ __forceinline__ uint32_t key_signed(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct CM {
  unsigned long long c, m;  ///< count and fixed-point mass
};

/// What a CTA keeps in shared memory beside its chunk of the row.
struct Shared {
  unsigned int cnt[2][kBins];  ///< histogram counts, double-buffered across rounds
  /// Histogram masses (fixed point w < 2^41) as three u32 sums: bits 32-40, 16-31 and 0-15 of
  /// each w. A CTA holds <= 51200 < 2^16 elements, so no sum overflows, and the u64 mass is
  /// rebuilt exactly at the merge. (64-bit shared-memory atomics are a CAS loop: measured 5x
  /// slower on top-p, 559 vs ~100 us for the whole op.)
  unsigned int mass[2][3][kBins];
  unsigned long long xu[8];           ///< cluster exchange slots (one per exchange)
  float xf[8];
  CM warp_tot[32];
  float red[32];
  uint32_t pick[4];
  unsigned long long pick_u[4];
};

/// The state of one CTA's work on one row.
struct RowCtx {
  float* vals;    ///< this CTA's chunk, in shared memory
  int n;          ///< elements in the chunk
  int64_t begin;  ///< the chunk's first column
  Shared* s;
  int rank, csize, tid, nthreads;
  int parity;     ///< histogram buffer of the next round
  float scale;    ///< fixed-point scale, 2^(40 - e)
  bool signed_keys;

  __device__ __forceinline__ uint32_t key(float x) const {
    return signed_keys ? key_signed(x) : key_nonneg(x);
  }
  __device__ __forceinline__ unsigned long long fixed(float x) const {
    return __float2ull_rz(x * scale);
  }
};

template <typename V>
__device__ __forceinline__ V warp_max(V x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum_f(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

/// Inclusive block scan of (count, mass); `total` receives the block's sum. Deterministic.
__device__ __forceinline__ CM block_scan(CM v, Shared* s, CM* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long c = __shfl_up_sync(0xffffffffu, v.c, o);
    const unsigned long long m = __shfl_up_sync(0xffffffffu, v.m, o);
    if (lane >= o) v.c += c, v.m += m;
  }
  if (lane == 31) s->warp_tot[warp] = v;
  __syncthreads();
  if (warp == 0) {
    CM t = lane < nw ? s->warp_tot[lane] : CM{0, 0};
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long c = __shfl_up_sync(0xffffffffu, t.c, o);
      const unsigned long long m = __shfl_up_sync(0xffffffffu, t.m, o);
      if (lane >= o) t.c += c, t.m += m;
    }
    if (lane < nw) s->warp_tot[lane] = t;
  }
  __syncthreads();
  if (warp > 0) v.c += s->warp_tot[warp - 1].c, v.m += s->warp_tot[warp - 1].m;
  *total = s->warp_tot[nw - 1];
  __syncthreads();  // warp_tot may be rewritten by the next call
  return v;
}

/// Block-wide max and "any" flag; every thread receives both.
__device__ __forceinline__ float block_max(float x, Shared* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = warp_max(x);
  if (lane == 0) s->red[warp] = x;
  __syncthreads();
  x = lane < nw ? s->red[lane] : -INFINITY;
  x = warp_max(x);
  __syncthreads();
  return x;
}

__device__ __forceinline__ float block_sum_f(float x, Shared* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = warp_sum_f(x);
  if (lane == 0) s->red[warp] = x;
  __syncthreads();
  x = lane < nw ? s->red[lane] : 0.f;
  x = warp_sum_f(x);
  __syncthreads();
  return x;
}

/// Publish one float per CTA in slot `slot`, barrier, and combine the cluster's values in rank
/// order (max when `is_max`, else sum). Every thread receives the result.
__device__ __forceinline__ float cluster_reduce_f(const RowCtx& ctx, float mine, int slot,
                                                  bool is_max) {
  cg::cluster_group cluster = cg::this_cluster();
  if (ctx.tid == 0) ctx.s->xf[slot] = mine;
  cluster.sync();
  float acc = is_max ? -INFINITY : 0.f;
  for (int r = 0; r < ctx.csize; ++r) {
    const float v = *cluster.map_shared_rank(&ctx.s->xf[slot], r);
    acc = is_max ? fmaxf(acc, v) : acc + v;
  }
  return acc;
}

/// As cluster_reduce_f for a u64: returns the cluster sum and, in *before, the ranks below ours.
__device__ __forceinline__ unsigned long long cluster_sum_u(const RowCtx& ctx,
                                                            unsigned long long mine, int slot,
                                                            unsigned long long* before) {
  cg::cluster_group cluster = cg::this_cluster();
  if (ctx.tid == 0) ctx.s->xu[slot] = mine;
  cluster.sync();
  unsigned long long acc = 0, pre = 0;
  for (int r = 0; r < ctx.csize; ++r) {
    if (r == ctx.rank) pre = acc;
    acc += *cluster.map_shared_rank(&ctx.s->xu[slot], r);
  }
  *before = pre;
  return acc;
}

/// Load this CTA's chunk of a row into shared memory as float, through `get(v)` (a per-value
/// map: clamping, scaling). 16-byte loads when `vec` (row start and chunk 16-byte aligned).
template <typename T, typename Map>
__device__ __forceinline__ void load_chunk(const RowCtx& ctx, const T* row, bool vec, Map get) {
  constexpr int N = 16 / sizeof(T);
  constexpr int U = 4;  // vectors in flight per thread
  const T* src = row + ctx.begin;
  int done = 0;
  if (vec) {
    const int nv = ctx.n / N;
    const int step = ctx.nthreads * U;
    for (int g0 = 0; g0 < nv; g0 += step) {
      Vec<T, N> v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int g = g0 + u * ctx.nthreads + ctx.tid;
        if (g < nv) v[u] = Vec<T, N>::load(src + int64_t{g} * N);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int g = g0 + u * ctx.nthreads + ctx.tid;
        if (g < nv) {
          float f[N];
#pragma unroll
          for (int j = 0; j < N; ++j) f[j] = get(to_float(v[u][j]));
#pragma unroll
          for (int j = 0; j < N; j += 4)
            *reinterpret_cast<float4*>(ctx.vals + g * N + j) = make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
        }
      }
    }
    done = nv * N;
  }
  constexpr int S = 32 / sizeof(T);
  for (int i0 = done; i0 < ctx.n; i0 += ctx.nthreads * S) {
    T v[S];
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int i = i0 + u * ctx.nthreads + ctx.tid;
      if (i < ctx.n) v[u] = src[i];
    }
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int i = i0 + u * ctx.nthreads + ctx.tid;
      if (i < ctx.n) ctx.vals[i] = get(to_float(v[u]));
    }
  }
  __syncthreads();
}

/// Max of the chunk, and whether it holds a NaN (returned through *nan); block-wide.
__device__ __forceinline__ float chunk_max(const RowCtx& ctx, bool* nan) {
  float m = -INFINITY;
  bool bad = false;
  for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) {
    const float x = ctx.vals[i];
    bad |= isnan(x);
    m = fmaxf(m, x);
  }
  *nan = __syncthreads_or(bad);
  return block_max(m, ctx.s);
}

/// Add a fixed-point mass w < 2^41 to bin d of a three-word histogram (see Shared::mass).
__device__ __forceinline__ void add_mass(unsigned int (*mass)[kBins], int d,
                                         unsigned long long w) {
  const unsigned int hi = static_cast<unsigned int>(w >> 32);
  const unsigned int mid = static_cast<unsigned int>(w >> 16) & 0xffffu;
  if (hi) atomicAdd(&mass[0][d], hi);
  if (mid) atomicAdd(&mass[1][d], mid);
  atomicAdd(&mass[2][d], static_cast<unsigned int>(w) & 0xffffu);
}

/// 2^(40 - e) for 2^e <= mx < 2^(e+1): fixed(x) < 2^41 for every x <= mx.
__device__ __forceinline__ float fixed_scale(float mx) {
  if (!(mx > 0.f) || isinf(mx)) return 1.f;
  return exp2f(static_cast<float>(40 - ilogbf(mx)));
}

/// Result of a radix search: keep keys >= key; (c, m) = count and mass kept; all = keep all.
struct Threshold {
  uint32_t key;
  CM kept;
  bool all;
};

/*!
 * @brief The largest key t with F(t) >= target, F(t) = sum over the row's elements with key >= t
 *   of 1 (by_mass false) or fixed(x) (by_mass true). `target_of(total)` gives the target from
 *   the row's total (count, mass), known after the first round. Cluster-wide; every thread of
 *   every CTA of the cluster receives the same result.
 */
template <typename TargetOf>
__device__ Threshold radix_search(RowCtx& ctx, bool by_mass, bool need_mass, TargetOf target_of) {
  cg::cluster_group cluster = cg::this_cluster();
  Shared* s = ctx.s;
  uint32_t prefix = 0, mask = 0;
  CM above{0, 0};
  unsigned long long target = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    const int buf = ctx.parity;
    ctx.parity ^= 1;
    // 1. This CTA's histogram of the digit at `shift` among keys matching the prefix.
    for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) {
      const float x = ctx.vals[i];
      const uint32_t k = ctx.key(x);
      if ((k & mask) == prefix) {
        const int d = (k >> shift) & (kBins - 1);
        atomicAdd(&s->cnt[buf][d], 1u);
        if (need_mass) add_mass(s->mass[buf], d, ctx.fixed(x));
      }
    }
    cluster.sync();
    // The other buffer was last read by peers before this barrier: clear it for the next round.
    for (int b = ctx.tid; b < kBins; b += ctx.nthreads) {
      s->cnt[buf ^ 1][b] = 0;
      s->mass[buf ^ 1][0][b] = s->mass[buf ^ 1][1][b] = s->mass[buf ^ 1][2][b] = 0;
    }
    // 2. Merge the cluster's histograms: thread j holds bin 255 - j (largest values first).
    CM v{0, 0};
    if (ctx.tid < kBins) {
      // Remote loads in groups of 4 issued before their adds (DSMEM latency is ~hundreds of
      // cycles; all 16 at once cost 110 registers, one CTA per SM).
      const int b = kBins - 1 - ctx.tid;
      for (int r0 = 0; r0 < ctx.csize; r0 += 4) {
        unsigned int c[4];
        unsigned long long m[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const bool in = r0 + r < ctx.csize;
          c[r] = in ? *cluster.map_shared_rank(&s->cnt[buf][b], r0 + r) : 0u;
          m[r] = 0;
          if (in && need_mass) {
            const unsigned int(*rm)[kBins] = cluster.map_shared_rank(s->mass[buf], r0 + r);
            m[r] = (static_cast<unsigned long long>(rm[0][b]) << 32) +
                   (static_cast<unsigned long long>(rm[1][b]) << 16) + rm[2][b];
          }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) v.c += c[r], v.m += m[r];
      }
    }
    CM total;
    CM incl = block_scan(v, s, &total);
    if (shift == 24) target = target_of(total);
    incl.c += above.c, incl.m += above.m;
    const bool reached = (by_mass ? incl.m : incl.c) >= target;
    const int before = __syncthreads_count(ctx.tid < kBins && !reached);
    if (before == kBins) return Threshold{0, total, true};  // only in the first round
    if (ctx.tid == before) {
      s->pick[0] = kBins - 1 - before;
      s->pick[1] = static_cast<uint32_t>(v.c);
      s->pick_u[0] = incl.c - v.c;
      s->pick_u[1] = incl.m - v.m;
      s->pick_u[2] = incl.m;
    }
    __syncthreads();
    prefix |= s->pick[0] << shift;
    mask |= (kBins - 1u) << shift;
    above = CM{s->pick_u[0], s->pick_u[1]};
    const unsigned long long bin_c = s->pick[1];
    const CM kept{above.c + bin_c, s->pick_u[2]};
    __syncthreads();  // pick is rewritten next round
    // One element in the chosen bin: keeping the whole bin is the answer.
    if (bin_c == 1 || shift == 0) return Threshold{prefix, kept, false};
  }
  return Threshold{prefix, CM{0, 0}, false};  // not reached
}

/*!
 * @brief Draw from the kept elements (key >= t) with weight fixed(x) using the 32-bit uniform r;
 *   returns the column on the CTA that finds it (and -1 elsewhere) in *col; *kept_mass receives
 *   the cluster's kept mass. Cluster-wide.
 */
__device__ __forceinline__ int64_t draw(const RowCtx& ctx, uint32_t t, uint32_t r, int slot,
                                        unsigned long long* kept_mass) {
  unsigned long long mine = 0;
  for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) {
    const float x = ctx.vals[i];
    if (ctx.key(x) >= t) mine += ctx.fixed(x);
  }
  CM total;
  const CM incl = block_scan(CM{0, mine}, ctx.s, &total);
  unsigned long long before;
  const unsigned long long K = cluster_sum_u(ctx, total.m, slot, &before);
  *kept_mass = K;
  if (K == 0) return -1;
  const unsigned long long target = __umul64hi(K, static_cast<unsigned long long>(r) << 32);
  if (target < before || target >= before + total.m) return -1;
  const unsigned long long local = target - before;
  const unsigned long long excl = incl.m - mine;
  if (!(local >= excl && local < incl.m)) return -1;
  unsigned long long acc = excl;
  int last = -1;
  for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) {
    const float x = ctx.vals[i];
    if (ctx.key(x) >= t) {
      const unsigned long long w = ctx.fixed(x);
      if (w) last = i;
      acc += w;
      if (acc > local) return ctx.begin + i;
    }
  }
  return ctx.begin + last;  // unreachable: the thread's kept mass exceeds local
}

__device__ __forceinline__ RowCtx make_ctx(float* vals, Shared* s, int64_t vocab, int64_t chunk,
                                           bool signed_keys) {
  cg::cluster_group cluster = cg::this_cluster();
  RowCtx ctx;
  ctx.vals = vals;
  ctx.s = s;
  ctx.rank = static_cast<int>(cluster.block_rank());
  ctx.csize = static_cast<int>(cluster.num_blocks());
  ctx.tid = threadIdx.x;
  ctx.nthreads = blockDim.x;
  ctx.begin = ctx.rank * chunk;
  const int64_t left = vocab - ctx.begin;
  ctx.n = static_cast<int>(left < 0 ? 0 : (left < chunk ? left : chunk));
  ctx.parity = 0;
  ctx.scale = 1.f;
  ctx.signed_keys = signed_keys;
  for (int b = ctx.tid; b < kBins; b += ctx.nthreads) {
    s->cnt[0][b] = s->cnt[1][b] = 0;
    for (int j = 0; j < 3; ++j) s->mass[0][j][b] = s->mass[1][j][b] = 0;
  }
  __syncthreads();
  return ctx;
}

/// Write a sample (and its validity) from the CTA that holds it; rank 0 writes fallbacks.
__device__ __forceinline__ void write_sample(void* out, bool out_64, bool* valid, int64_t i,
                                             int64_t col, bool ok) {
  if (out_64) {
    static_cast<int64_t*>(out)[i] = col;
  } else {
    static_cast<int32_t*>(out)[i] = static_cast<int32_t>(col);
  }
  if (valid) valid[i] = ok;
}

}  // namespace sampling
}  // namespace flashinfer

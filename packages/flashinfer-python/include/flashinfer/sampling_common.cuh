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
#include <type_traits>

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
/// Top-p by rejection (sampling.cuh, top_p_rejection): candidates tested per pass, passes before
/// the exact fallback. 8 attempts and the fallback's uniform use 9 of the 32 Philox outputs a row
/// may consume per top-p call.
inline constexpr int kTopPCandidates = 4;
inline constexpr int kTopPPasses = 2;
/// Threads per CTA. Measured on the H200 at 128 x 128256: 256 beats 512 (sampling 55 vs 64 us,
/// top-k 89 vs 103): 3 CTAs (64 KB chunks) per SM, so one CTA loads while the others compute.
inline constexpr int kThreads = 256;
/// Largest chunk a CTA holds (floats): 200 KB, under the 227 KB of dynamic shared memory.
inline constexpr int64_t kMaxChunk = 200 * 1024 / 4;
/// Preferred chunk (floats): 64 KB lets 3 CTAs (of different rows) share an SM.
inline constexpr int64_t kPreferredChunk = 64 * 1024 / 4;

// PROBE_TRACE (a timing probe with correct outputs; off by default, the kernels then unchanged):
// thread 0 of each CTA of the draw set's kernels stamps %globaltimer at the points of
// SampleTrace into sampling_trace[CTA] (its translation unit's copy), which the module's
// trace_copy reads back (benchmarks/probes/trace_sampling.py).
#ifndef FLASHINFER_SAMPLING_PROBE_TRACE
#define FLASHINFER_SAMPLING_PROBE_TRACE 0
#endif
/// The points PROBE_TRACE stamps, in kernel order; kTraceSm holds the CTA's SM.
enum SampleTrace : int {
  kTraceEntry = 0,   ///< kernel entry
  kTraceLoaded,      ///< the chunk in shared memory (the copy path; the direct path: entry)
  kTraceFilled,      ///< block sums filled, the CTA's max known
  kTraceExchanged,   ///< the group's max known (first cluster exchange)
  kTraceRefined,     ///< the threshold's block sums refined (min-p; plain: = exchanged)
  kTracePrefixed,    ///< the draw's block prefix known (second cluster exchange)
  kTraceEnd,         ///< the sample written (or the CTA done)
  kTraceSm,
  kTraceSlots,
};
inline constexpr int kTraceCtas = 4096;
#if FLASHINFER_SAMPLING_PROBE_TRACE
static __device__ unsigned long long sampling_trace[kTraceCtas][kTraceSlots];
#endif
/// PROBE_TRACE: thread 0 stamps the time of `event` for its CTA (nothing otherwise).
__device__ __forceinline__ void trace(SampleTrace event) {
#if FLASHINFER_SAMPLING_PROBE_TRACE
  if (threadIdx.x != 0 || blockIdx.x >= kTraceCtas) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  sampling_trace[blockIdx.x][event] = t;
  if (event == kTraceEntry) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    sampling_trace[blockIdx.x][kTraceSm] = sm;
  }
#else
  (void)event;
#endif
}

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

/// Philox (seed, offset), as scalars or as int64/uint64 device tensors of length 1 or B; with an
/// offset tensor, `offset` is added to it (torch's graph-safe state: the graph's offset and the
/// offset within the graph).
struct RngArgs {
  const int64_t* seed_arr = nullptr;
  const int64_t* offset_arr = nullptr;
  int64_t seed_len = 0, offset_len = 0;
  uint64_t seed = 0, offset = 0;

  /// Row `row`'s generator, `skip` outputs in (the same as calling next() `skip` times).
  __device__ __forceinline__ Philox make(int64_t row, uint64_t skip = 0) const {
    const uint64_t s = seed_arr ? static_cast<uint64_t>(seed_arr[seed_len == 1 ? 0 : row]) : seed;
    const uint64_t o =
        (offset_arr ? static_cast<uint64_t>(offset_arr[offset_len == 1 ? 0 : row]) : 0) + offset;
    return Philox(s, static_cast<uint64_t>(row), o + skip);
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
  int cluster;    ///< CTAs per row (<= 16; a power of two but in plan_direct's)
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
  /// Histogram masses (fixed point) as three u32 sums: bits 32 and up, 16-31 and 0-15 of each
  /// added w. A CTA's masses sum below 2^57 and its counts below 2^16 per element added, so no
  /// word overflows, and the u64 mass is rebuilt exactly at the merge. (64-bit shared-memory
  /// atomics are a CAS loop: measured 5x slower on top-p, 559 vs ~100 us for the whole op.)
  unsigned int mass[2][3][kBins];
  unsigned long long xu[8];           ///< cluster exchange slots (one per exchange)
  float xf[8];
  unsigned long long wsum[32];        ///< the draw's per-warp kept masses
  CM warp_tot[32];
  float red[32];
  uint32_t pick[4];
  unsigned long long pick_u[4];
  // Top-p by rejection: the candidates' keys and masses above them (and, in the first pass, the
  // row's mass after them), exchanged in the group, the group's sums, the columns (on the CTA
  // that drew each) and the per-warp partial masses.
  unsigned long long cand_key[kTopPCandidates];
  unsigned long long cand_above[kTopPCandidates + 1];
  unsigned long long cand_sum[kTopPCandidates + 1];
  long long cand_col[kTopPCandidates];
  unsigned long long cand_warp[kThreads / 32][kTopPCandidates + 1];
};

/// The state of one CTA's work on one row.
struct RowCtx {
  float* vals;    ///< this CTA's chunk: shared memory (clusters) or a global scratch row
  int n;          ///< elements in the chunk
  int64_t begin;  ///< the chunk's first column
  Shared* s;
  int rank, csize, tid, nthreads;
  int parity;     ///< histogram buffer of the next round
  float scale;    ///< fixed-point scale, 2^(40 - e)
  bool signed_keys;
  bool clustered;  ///< the row is spread over a thread-block cluster (SM90+); else one CTA
  /// vals is the input row itself (float32 probabilities in global memory: SampleKernel's
  /// kDirect): read-only, and its readers (quad_col, val) clamp negatives to 0 as the copy's
  /// first pass would.
  bool direct;
  /// Top-p on the direct path: the CTA's histogram of mass by key prefix (sampling.cuh,
  /// mass_hist_add), and the right shift of the 24-bit significands it sums; nullptr elsewhere.
  uint32_t* hist;
  int hist_shift;

  /// The quad at column c (a multiple of 4) and value i, as the draw set's passes see them.
  __device__ __forceinline__ float4 quad_col(int c) const {
    const float4 x = *reinterpret_cast<const float4*>(vals + c);
    return direct ? make_float4(nonneg(x.x), nonneg(x.y), nonneg(x.z), nonneg(x.w)) : x;
  }
  __device__ __forceinline__ float val(int i) const { return direct ? nonneg(vals[i]) : vals[i]; }
  /// Probabilities' map: negatives to 0, NaN kept.
  __device__ __forceinline__ static float nonneg(float x) { return x < 0.f ? 0.f : x; }

  __device__ __forceinline__ uint32_t key(float x) const {
    return signed_keys ? key_signed(x) : key_nonneg(x);
  }
  __device__ __forceinline__ unsigned long long fixed(float x) const {
    return __float2ull_rz(x * scale);
  }
};

// ------------------------------------------------------------------------------------------------
// The row's group: a cluster (SM90+, DSMEM) or a single CTA (any arch). Same results either way.
// ------------------------------------------------------------------------------------------------

/// Barrier of every thread working on the row.
__device__ __forceinline__ void row_sync(const RowCtx& ctx) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ctx.clustered) {
    cg::this_cluster().sync();
    return;
  }
#endif
  __syncthreads();
}

/// `p` (in this CTA's shared memory) as seen in the CTA of rank r of the row's group.
template <typename P>
__device__ __forceinline__ P* peer(const RowCtx& ctx, P* p, int r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ctx.clustered) return cg::this_cluster().map_shared_rank(p, r);
#endif
  return p;
}

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

__device__ __forceinline__ unsigned long long warp_sum_u(unsigned long long x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

/// Inclusive warp scan of a u64.
__device__ __forceinline__ unsigned long long warp_scan_u(unsigned long long x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
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

/// Block-wide max; every thread receives it.
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

/// Publish two floats per CTA in slots `slot`, `slot + 1`, one barrier, and combine the group's
/// values (max when `is_max`, else a fixed-order tree sum): every lane r < csize reads rank r's
/// slots at once (one DSMEM round trip, not csize). Every thread receives both results.
__device__ __forceinline__ void cluster_reduce2_f(const RowCtx& ctx, float a, float b, int slot,
                                                  bool is_max, float* ra, float* rb) {
  if (ctx.tid == 0) ctx.s->xf[slot] = a, ctx.s->xf[slot + 1] = b;
  row_sync(ctx);
  const int lane = ctx.tid & 31;
  const float id = is_max ? -INFINITY : 0.f;
  float x = id, y = id;
  if (lane < ctx.csize) {
    const float* remote = peer(ctx, &ctx.s->xf[slot], lane);
    x = remote[0];
    y = remote[1];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float xo = __shfl_xor_sync(0xffffffffu, x, o);
    const float yo = __shfl_xor_sync(0xffffffffu, y, o);
    x = is_max ? fmaxf(x, xo) : x + xo;
    y = is_max ? fmaxf(y, yo) : y + yo;
  }
  *ra = x;
  *rb = y;
}

__device__ __forceinline__ float cluster_reduce_f(const RowCtx& ctx, float mine, int slot,
                                                  bool is_max) {
  float r, unused;
  cluster_reduce2_f(ctx, mine, 0.f, slot, is_max, &r, &unused);
  return r;
}

/// The group's sum of a u64 (one per CTA); *before receives the sum over lower ranks.
__device__ __forceinline__ unsigned long long cluster_sum_u(const RowCtx& ctx,
                                                            unsigned long long mine, int slot,
                                                            unsigned long long* before) {
  if (ctx.tid == 0) ctx.s->xu[slot] = mine;
  row_sync(ctx);
  const int lane = ctx.tid & 31;
  unsigned long long v = lane < ctx.csize ? *peer(ctx, &ctx.s->xu[slot], lane) : 0ull;
  const unsigned long long incl = warp_scan_u(v);
  *before = __shfl_sync(0xffffffffu, incl - v, ctx.rank);
  return __shfl_sync(0xffffffffu, incl, 31);
}

/// Load this CTA's chunk of a row into ctx.vals as float (no transformation: first_pass maps).
/// 16-byte accesses when `vec` (row start and chunk 16-byte aligned); float32 rows into shared
/// memory go through cp.async (every copy of the chunk in flight at once, no registers).
template <typename T>
__device__ __forceinline__ void load_chunk(const RowCtx& ctx, const T* row, bool vec) {
  constexpr int N = 16 / sizeof(T);
  const T* src = row + ctx.begin;
  int done = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, float>) {
    if (vec && ctx.clustered) {
      const int nv = ctx.n / 4;
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.vals));
      for (int g = ctx.tid; g < nv; g += ctx.nthreads) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + g * 16),
                     "l"(src + int64_t{g} * 4)
                     : "memory");
      }
      asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
      done = nv * 4;
      vec = false;
    }
  }
#endif
  if (vec) {
    constexpr int U = 4;  // vectors in flight per thread
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
          for (int j = 0; j < N; ++j) f[j] = to_float(v[u][j]);
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
      if (i < ctx.n) ctx.vals[i] = to_float(v[u]);
    }
  }
  __syncthreads();
}

/// f(x) for every value x of the loaded chunk (whose start is 16-byte aligned): 16-byte loads,
/// then the tail. In no fixed order: for passes whose results do not depend on it (counts,
/// integer masses, shared-memory atomics). The radix rounds' scalar loops
/// (one 4-byte load and the loop's address and bound work per element) were 35% of the top-k
/// kernel's instructions (ncu source counts, H100, benchmarks/notes/sampling-cluster-radix.md).
/// On the direct path (the input row in global memory, negatives read as 0): fq(quad) for every
/// quad of the chunk, kInFlight loads in flight a thread, then ft(x) for the values of the tail.
template <int kInFlight = 4, typename FQ, typename FT>
__device__ __forceinline__ void for_each_direct_quad(const RowCtx& ctx, FQ fq, FT ft) {
  const int n4 = ctx.n / 4;
  int i = ctx.tid;
  for (; i + (kInFlight - 1) * ctx.nthreads < n4; i += kInFlight * ctx.nthreads) {
    float4 x[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) x[u] = ctx.quad_col(4 * (i + u * ctx.nthreads));
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) fq(x[u]);
  }
  for (; i < n4; i += ctx.nthreads) fq(ctx.quad_col(4 * i));
  for (int j = n4 * 4 + ctx.tid; j < ctx.n; j += ctx.nthreads) ft(ctx.val(j));
}

template <typename F>
__device__ __forceinline__ void for_each_value(const RowCtx& ctx, F f) {
  if (ctx.direct) {
    for_each_direct_quad(ctx, [&](float4 x) { f(x.x), f(x.y), f(x.z), f(x.w); }, f);
    return;
  }
  const int n4 = ctx.n / 4;
  const float4* v4 = reinterpret_cast<const float4*>(ctx.vals);
  for (int i = ctx.tid; i < n4; i += ctx.nthreads) {
    const float4 x = v4[i];
    f(x.x), f(x.y), f(x.z), f(x.w);
  }
  for (int i = n4 * 4 + ctx.tid; i < ctx.n; i += ctx.nthreads) f(ctx.vals[i]);
}

/// One pass over the loaded chunk: x = map(x) in place (when `apply`), the chunk's max of the
/// mapped values, and whether it held a NaN before mapping (*nan); block-wide. Also this
/// thread's own max (*thread_max; meaningful when *any: the thread saw an element).
template <typename Map>
__device__ __forceinline__ float first_pass_threads(const RowCtx& ctx, bool apply, Map map,
                                                    bool* nan, float* thread_max, bool* any) {
  float m = -INFINITY;
  bool bad = false, seen = false;
  const int n4 = ctx.n / 4;
  float4* v4 = reinterpret_cast<float4*>(ctx.vals);
  for (int i = ctx.tid; i < n4; i += ctx.nthreads) {
    float4 x = v4[i];
    bad |= isnan(x.x) || isnan(x.y) || isnan(x.z) || isnan(x.w);
    if (apply) {
      x = make_float4(map(x.x), map(x.y), map(x.z), map(x.w));
      v4[i] = x;
    }
    m = fmaxf(m, fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)));
    seen = true;
  }
  for (int i = n4 * 4 + ctx.tid; i < ctx.n; i += ctx.nthreads) {
    float x = ctx.vals[i];
    bad |= isnan(x);
    if (apply) ctx.vals[i] = x = map(x);
    m = fmaxf(m, x);
    seen = true;
  }
  *thread_max = m;
  *any = seen;
  *nan = __syncthreads_or(bad);
  return block_max(m, ctx.s);
}

/// first_pass_threads without the thread's own max.
template <typename Map>
__device__ __forceinline__ float first_pass(const RowCtx& ctx, bool apply, Map map, bool* nan) {
  float thread_max;
  bool any;
  return first_pass_threads(ctx, apply, map, nan, &thread_max, &any);
}

/// atomicAdd(p, v) for a word of this CTA's shared memory, issued as a shared-memory atomic
/// (ATOMS). Through `ctx.s` (a pointer held in a struct) the compiler no longer knows the
/// address space and emits the generic ATOM.E for a plain atomicAdd.
__device__ __forceinline__ void shared_add(unsigned int* p, unsigned int v) {
  asm volatile("red.shared.add.u32 [%0], %1;"
               :
               : "r"(static_cast<unsigned int>(__cvta_generic_to_shared(p))), "r"(v)
               : "memory");
}

/// Add a fixed-point mass to bin d of histogram `buf` (see Shared::mass). One CTA holding a whole
/// row (up to 2^20 elements) would overflow the 16-bit words' sums: it adds u64s instead.
__device__ __forceinline__ void add_mass(const RowCtx& ctx, int buf, int d, unsigned long long w) {
  unsigned int(*mass)[kBins] = ctx.s->mass[buf];
  if (!ctx.clustered) {
    atomicAdd(reinterpret_cast<unsigned long long*>(mass) + d, w);
    return;
  }
  const unsigned int hi = static_cast<unsigned int>(w >> 32);
  const unsigned int mid = static_cast<unsigned int>(w >> 16) & 0xffffu;
  if (hi) shared_add(&mass[0][d], hi);
  if (mid) shared_add(&mass[1][d], mid);
  shared_add(&mass[2][d], static_cast<unsigned int>(w) & 0xffffu);
}

/// The mass of bin b of a histogram written by add_mass (possibly a peer's).
__device__ __forceinline__ unsigned long long bin_mass(const RowCtx& ctx,
                                                       const unsigned int (*mass)[kBins], int b) {
  if (!ctx.clustered) return reinterpret_cast<const unsigned long long*>(mass)[b];
  return (static_cast<unsigned long long>(mass[0][b]) << 32) +
         (static_cast<unsigned long long>(mass[1][b]) << 16) + mass[2][b];
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

/// Round 0 of the radix search bins the 11-bit key prefix (for probabilities: the exponent and
/// the top 3 mantissa bits) in a window of the kWindowBins prefixes at and below the max's, and
/// everything lower in bin 0.
inline constexpr int kWindowShift = 21;
inline constexpr int kWindowBins = kBins - 1;

/// The quads (16-byte loads) of a thread's walk through the chunk that held a value of round 0's
/// window, bit j for the thread's j-th quad: the later rounds' digits lie inside the window, so
/// they visit only these quads. Tracked only where a lower bound from the per-thread maxima
/// narrowed the window (a handful of quads per CTA); the default window holds nearly every quad
/// and the mask's walk cost more than it saved (top-p renorm +8%, H100). `valid` false: not
/// tracked, or the walk has more than 64 quads (the one-CTA path's long rows): the later rounds
/// read the whole chunk.
struct QuadMask {
  unsigned long long bits;
  bool valid;
};

/// Round 0's histogram over the window [top - span, top] of key prefixes (span <=
/// kWindowBins - 1; default the whole window): shared-memory atomics for the window's bins (a
/// row's values spread over them, so a warp's atomics rarely conflict), registers for the bin
/// below it. (Counting round 0 in 8 register bins of two exponents each, with no atomics,
/// measured slower on an H200: top-p 195 vs 160 us, top-k 112 vs 94 us at 128 x 128256, since
/// the next round's atomics then cover a whole pair of exponents.)
/// kTrack: the window's quads as a QuadMask.
template <bool kCount, bool kMass, bool kTrack>
__device__ __forceinline__ QuadMask window_histogram(const RowCtx& ctx, int buf, uint32_t top,
                                                     uint32_t span = kWindowBins - 1) {
  unsigned int tc = 0;
  unsigned long long tm = 0;
  auto bin = [&](float x) {
    const uint32_t p = ctx.key(x) >> kWindowShift;
    const uint32_t r = p >= top ? 0u : top - p;
    if (r > span) {
      tc += 1;
      if (kMass) tm += ctx.fixed(x);
      return false;
    }
    const int d = kBins - 1 - static_cast<int>(r);
    if (kCount) shared_add(&ctx.s->cnt[buf][d], 1u);
    if (kMass) add_mass(ctx, buf, d, ctx.fixed(x));
    return true;
  };
  QuadMask q{0ull, false};
  if constexpr (kTrack) {
    const int n4 = ctx.n / 4;
    const float4* v4 = reinterpret_cast<const float4*>(ctx.vals);
    q.valid = n4 <= 64 * ctx.nthreads;
    int j = 0;
    for (int i = ctx.tid; i < n4; i += ctx.nthreads, ++j) {
      const float4 x = v4[i];
      const bool in = bin(x.x) | bin(x.y) | bin(x.z) | bin(x.w);  // (all four binned)
      if (in && j < 64) q.bits |= 1ull << j;
    }
    for (int i = n4 * 4 + ctx.tid; i < ctx.n; i += ctx.nthreads) bin(ctx.vals[i]);
  } else {
    for_each_value(ctx, bin);
  }
  tc = __reduce_add_sync(0xffffffffu, tc);
  tm = warp_sum_u(tm);
  if ((ctx.tid & 31) == 0) {
    if (kCount && tc) shared_add(&ctx.s->cnt[buf][0], tc);
    if (kMass && tm) add_mass(ctx, buf, 0, tm);
  }
  return q;
}

/// f(x) for the values of the quads in `q` (every value when !q.valid) and the chunk's tail.
template <typename F>
__device__ __forceinline__ void for_each_masked_value(const RowCtx& ctx, const QuadMask& q, F f) {
  if (!q.valid) {
    for_each_value(ctx, f);
    return;
  }
  const int n4 = ctx.n / 4;
  const float4* v4 = reinterpret_cast<const float4*>(ctx.vals);
  for (unsigned long long b = q.bits; b; b &= b - 1) {
    const float4 x = v4[ctx.tid + (__ffsll(static_cast<long long>(b)) - 1) * ctx.nthreads];
    f(x.x), f(x.y), f(x.z), f(x.w);
  }
  for (int i = n4 * 4 + ctx.tid; i < ctx.n; i += ctx.nthreads) f(ctx.vals[i]);
}

/*!
 * @brief The largest key t with F(t) >= target, F(t) = sum over the row's elements with key >= t
 *   of 1 (by_mass false) or fixed(x) (by_mass true). `target_of(total)` gives the target from
 *   the row's total (count, mass), known after the first round; `max_key` is the key of the
 *   row's largest value. Group-wide; every thread of every CTA receives the same result.
 *
 *   Round 0 (window_histogram) finds which of the 11-bit key prefixes at and below the max's
 *   holds the threshold; later rounds take 8-bit digits of the remaining 21 bits over the
 *   elements of that prefix. When the threshold is lower than the window, the search restarts
 *   with 8-bit digits over the elements below it.
 *
 *   `lo_prefix`: round 0's window starts there when it is above the default window's lowest
 *   prefix (and at most the max's); keys below it are counted in registers, not with
 *   shared-memory atomics, so a caller that knows the threshold is at or above it (a top-k's
 *   lower bound from per-thread maxima) pays atomics only for the keys above it. The result is
 *   exact either way: a threshold below the window restarts over the keys under it.
 */
template <typename TargetOf>
__device__ Threshold radix_search_from(RowCtx& ctx, bool by_mass, bool need_mass, uint32_t max_key,
                                       uint32_t lo_prefix, TargetOf target_of) {
  Shared* s = ctx.s;
  const uint32_t top = max_key >> kWindowShift;
  uint32_t lo = top >= kWindowBins ? top - (kWindowBins - 1) : 0;  // window: [lo, top]
  uint32_t span = kWindowBins - 1;  // (top - lo, or more where lo is 0: nothing lies below)
  const bool narrowed = lo_prefix > lo && lo_prefix <= top;
  if (narrowed) lo = lo_prefix, span = top - lo_prefix;
  uint32_t prefix = 0, mask = 0, kmax = 0xffffffffu;
  CM above{0, 0};
  unsigned long long target = 0;
  // Rounds: 0 = the window; then digits at `shift` (13, 5, 0). The tail: 24, 16, 8, 0.
  int shift = -1;
  bool tail = false;
  QuadMask quads{0ull, false};
  for (int round = 0; round < 8; ++round) {
    const int buf = ctx.parity;
    ctx.parity ^= 1;
    // 1. This CTA's histogram.
    if (round == 0) {
      if (by_mass) {  // a mass search needs no counts here (nor a lower bound)
        window_histogram<false, true, false>(ctx, buf, top, span);
      } else if (need_mass) {
        quads = narrowed ? window_histogram<true, true, true>(ctx, buf, top, span)
                         : window_histogram<true, true, false>(ctx, buf, top, span);
      } else {
        quads = narrowed ? window_histogram<true, false, true>(ctx, buf, top, span)
                         : window_histogram<true, false, false>(ctx, buf, top, span);
      }
    } else {
      // A mass search's first digit round picks a bin of the bulk (never of one element): its
      // counts are not kept either.
      const bool count = !(by_mass && round == 1);
      // Digits inside the window: only its quads (the tail below it: every quad).
      if (tail) quads.valid = false;
      for_each_masked_value(ctx, quads, [&](float x) {
        const uint32_t k = ctx.key(x);
        if ((k & mask) == prefix && k <= kmax) {
          const int d = (k >> shift) & (kBins - 1);
          if (count) shared_add(&s->cnt[buf][d], 1u);
          if (need_mass) add_mass(ctx, buf, d, ctx.fixed(x));
        }
      });
    }
    row_sync(ctx);
    // The other buffer was last read by peers before this barrier: clear it for the next round.
    for (int b = ctx.tid; b < kBins; b += ctx.nthreads) {
      s->cnt[buf ^ 1][b] = 0;
      s->mass[buf ^ 1][0][b] = s->mass[buf ^ 1][1][b] = s->mass[buf ^ 1][2][b] = 0;
    }
    // 2. Merge the group's histograms: thread j holds bin 255 - j (largest values first).
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
          c[r] = in ? *peer(ctx, &s->cnt[buf][b], r0 + r) : 0u;
          m[r] = 0;
          if (in && need_mass) {
            m[r] = bin_mass(ctx, peer(ctx, s->mass[buf], r0 + r), b);
          }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) v.c += c[r], v.m += m[r];
      }
    }
    CM total;
    CM incl = block_scan(v, s, &total);
    if (round == 0) target = target_of(total);
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
    const uint32_t d = s->pick[0];
    above = CM{s->pick_u[0], s->pick_u[1]};
    unsigned long long bin_c = s->pick[1];
    const CM kept{above.c + bin_c, s->pick_u[2]};  // (count unknown after a mass window)
    __syncthreads();  // pick is rewritten next round
    if (by_mass && round <= 1) bin_c = 2;  // not counted: never stop here
    if (round == 0) {
      if (d == 0 && lo > 0) {
        // Below the window: 8-bit digits from the top over the keys under it.
        tail = true;
        kmax = (lo << kWindowShift) - 1u;
        shift = 24;
        continue;
      }
      prefix = (top - (kBins - 1 - d)) << kWindowShift;
      mask = ~0u << kWindowShift;
      if (bin_c == 1) return Threshold{prefix, kept, false};
      shift = kWindowShift - 8;  // then 8 less down to 0 (whose top bits the prefix fixes)
      continue;
    }
    prefix |= d << shift;
    mask |= (kBins - 1u) << shift;
    // One element in the chosen bin: keeping the whole bin is the answer.
    if (bin_c == 1 || shift == 0) return Threshold{prefix, kept, false};
    shift = shift > 8 ? shift - 8 : 0;
  }
  return Threshold{prefix, CM{0, 0}, false};  // not reached
}

/// radix_search_from with the default window (lo_prefix 0).
template <typename TargetOf>
__device__ __forceinline__ Threshold radix_search(RowCtx& ctx, bool by_mass, bool need_mass,
                                                  uint32_t max_key, TargetOf target_of) {
  return radix_search_from(ctx, by_mass, need_mass, max_key, 0u, target_of);
}

/// Lane `lane`'s 4 values of 128-column step `step` of the chunk (see draw) into f, 0 past the
/// chunk; returns the first one's column in the chunk.
__device__ __forceinline__ int lane_values(const RowCtx& ctx, int step, int lane, float (&f)[4]) {
  const int c = step * 128 + lane * 4;
  if (c + 4 <= ctx.n) {
    const float4 v = *reinterpret_cast<const float4*>(ctx.vals + c);
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) f[j] = c + j < ctx.n ? ctx.vals[c + j] : 0.f;
  }
  return c;
}

/// The kept mass (key >= t, weight fixed(x)) of lane `lane`'s 4 columns of 128-column step
/// `step` of the chunk (see draw). Warp-wide.
__device__ __forceinline__ unsigned long long lane_mass(const RowCtx& ctx, uint32_t t, int step,
                                                        int lane) {
  float f[4];
  lane_values(ctx, step, lane, f);
  // A threshold keeps few elements (top-k): most quads of a warp's step hold none, and the warp
  // then skips the 4 fixed-point conversions (warp-wide: every caller runs it on whole warps).
  const uint32_t kq = max(max(ctx.key(f[0]), ctx.key(f[1])), max(ctx.key(f[2]), ctx.key(f[3])));
  if (!__any_sync(0xffffffffu, kq >= t)) return 0;
  unsigned long long m = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (ctx.key(f[j]) >= t) m += ctx.fixed(f[j]);
  return m;
}

/// The kept masses a draw locates its target in: the row's kept mass K, and where this thread's
/// warp sits in column order (steps [s0, s1), the mass before it, its own).
struct DrawPrefix {
  unsigned long long K, before, mine;
  int s0, s1;
};

/// The 128-column steps [*s0, *s1) of the chunk that this thread's warp owns.
__device__ __forceinline__ void warp_steps(const RowCtx& ctx, int* s0, int* s1) {
  const int warp = ctx.tid >> 5, nw = ctx.nthreads >> 5;
  const int steps = (ctx.n + 127) / 128;
  const int per_warp = (steps + nw - 1) / nw;
  *s0 = warp * per_warp;
  *s1 = min(steps, *s0 + per_warp);
}

/// Group-wide: d's K (the row's kept mass), this warp's mass d.mine (the sum of the lanes'
/// `mine`) and the mass before this warp's share in column order, through one CTA barrier and the
/// group exchange `slot` (the warps' shares are contiguous and in warp order).
__device__ __forceinline__ void prefix_of_warp_masses(const RowCtx& ctx, unsigned long long mine,
                                                      int slot, DrawPrefix* d) {
  const int lane = ctx.tid & 31, warp = ctx.tid >> 5, nw = ctx.nthreads >> 5;
  d->mine = warp_sum_u(mine);
  if (lane == 0) ctx.s->wsum[warp] = d->mine;
  __syncthreads();
  unsigned long long total = 0, warp_before = 0;
  for (int w = 0; w < nw; ++w) {
    if (w == warp) warp_before = total;
    total += ctx.s->wsum[w];
  }
  unsigned long long before;  // (cluster_sum_u's barrier orders wsum's next rewrite)
  d->K = cluster_sum_u(ctx, total, slot, &before);
  d->before = before + warp_before;
}

/// Group-wide: one pass over the chunk and one group barrier (exchange slot `slot`).
__device__ __forceinline__ DrawPrefix draw_prefix(const RowCtx& ctx, uint32_t t, int slot) {
  const int lane = ctx.tid & 31;
  DrawPrefix d;
  warp_steps(ctx, &d.s0, &d.s1);
  unsigned long long mine = 0;
  for (int st = d.s0; st < d.s1; ++st) mine += lane_mass(ctx, t, st, lane);
  prefix_of_warp_masses(ctx, mine, slot, &d);
  return d;
}

/// The column of kept element `local` (in mass order) of lane `lane`'s 4 columns of `step`, whose
/// kept masses before it sum to `acc`.
__device__ __forceinline__ int64_t lane_column(const RowCtx& ctx, uint32_t t, int step, int lane,
                                               unsigned long long acc, unsigned long long local) {
  const int c = step * 128 + lane * 4;
  int last = -1;
  for (int j = 0; j < 4 && c + j < ctx.n; ++j) {
    const float x = ctx.vals[c + j];
    if (ctx.key(x) >= t) {
      const unsigned long long w = ctx.fixed(x);
      if (w) last = c + j;
      acc += w;
      if (acc > local) return ctx.begin + c + j;
    }
  }
  return ctx.begin + last;  // unreachable: the lane's kept mass exceeds local
}

/// The column of the draw with 32-bit uniform r (see draw) on the thread that finds it, -1 on
/// every other thread. Warp-local: no barrier, so several draws from one prefix run in parallel
/// in different warps.
__device__ __forceinline__ int64_t draw_locate(const RowCtx& ctx, uint32_t t, const DrawPrefix& d,
                                               uint32_t r) {
  if (d.K == 0) return -1;
  const int lane = ctx.tid & 31;
  const unsigned long long target = __umul64hi(d.K, static_cast<unsigned long long>(r) << 32);
  if (target < d.before || target >= d.before + d.mine) return -1;
  // This warp holds the target: walk its steps in order.
  unsigned long long local = target - d.before;
  int st = d.s0;
  for (; st + 4 <= d.s1; st += 4) {  // groups of 4 steps: 4 loads and one reduction at a time
    const unsigned long long g =
        warp_sum_u(lane_mass(ctx, t, st, lane) + lane_mass(ctx, t, st + 1, lane) +
                   lane_mass(ctx, t, st + 2, lane) + lane_mass(ctx, t, st + 3, lane));
    if (local < g) break;
    local -= g;
  }
  for (; st < d.s1; ++st) {
    const unsigned long long lm = lane_mass(ctx, t, st, lane);
    const unsigned long long incl = warp_scan_u(lm);
    const unsigned long long step_total = __shfl_sync(0xffffffffu, incl, 31);
    if (local >= step_total) {
      local -= step_total;
      continue;
    }
    const unsigned int hit = __ballot_sync(0xffffffffu, incl > local);
    const int src = __ffs(hit) - 1;
    if (lane != src) return -1;
    return lane_column(ctx, t, st, lane, incl - lm, local);
  }
  return -1;  // unreachable: the warp's kept mass exceeds local
}

/*!
 * @brief Draw from the kept elements (key >= t) with weight fixed(x) using the 32-bit uniform r:
 *   the first column, in column order, whose running kept mass exceeds floor(r K / 2^32), K the
 *   row's kept mass (so the answer does not depend on how the row is split among CTAs and
 *   threads). Returns the column on the CTA that finds it (and -1 elsewhere); *kept_mass receives
 *   K. Group-wide.
 *
 *   Layout: warp w of a CTA owns a contiguous run of 128-column steps of the chunk, lane l the
 *   columns 4l..4l+3 of each step (one 16-byte load), so every level (CTA, warp, step, lane,
 *   element) is in column order.
 */
__device__ __forceinline__ int64_t draw(const RowCtx& ctx, uint32_t t, uint32_t r, int slot,
                                        unsigned long long* kept_mass) {
  const DrawPrefix d = draw_prefix(ctx, t, slot);
  *kept_mass = d.K;
  return draw_locate(ctx, t, d, r);
}

// ------------------------------------------------------------------------------------------------
// A top-k threshold from its candidates. Where topk_lower_prefix bounds the threshold's 11-bit key
// prefix from below, the row's elements at or above the bound are few (about k, plus the rest of
// the bound's prefix): each CTA lists its own in column order, the group exchanges the lists'
// lengths once and gathers the lists, and the k-th largest key, the kept count and mass, and the
// draw come from the list. That replaces the radix search's rounds (a group exchange each) and
// the draw's pass over the chunk. Same threshold set, masses and samples as the search and draw.
// ------------------------------------------------------------------------------------------------

/// Entries a CTA's candidate list holds, its own and (gathered) its peers': keys in s->mass[0],
/// columns in s->mass[1]. The histogram masses are not used by then, and a list that is given up
/// is cleared before a fallback search uses them.
inline constexpr int kCandidates = 3 * kBins;
static_assert(sizeof(Shared::mass[0]) == kCandidates * sizeof(uint32_t), "candidate lists");

__device__ __forceinline__ uint32_t* cand_keys(const RowCtx& ctx) { return &ctx.s->mass[0][0][0]; }
__device__ __forceinline__ uint32_t* cand_cols(const RowCtx& ctx) { return &ctx.s->mass[1][0][0]; }

/// The keys of lane `lane`'s 4 columns of 128-column step `step` of the chunk (see draw); columns
/// past the chunk get key 0, below every bound. `mass` (not null): their fixed-point masses are
/// added to it.
__device__ __forceinline__ void lane_keys(const RowCtx& ctx, int step, int lane, uint32_t (&k)[4],
                                          unsigned long long* mass = nullptr) {
  float f[4];
  const int c = lane_values(ctx, step, lane, f);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    k[j] = c + j < ctx.n ? ctx.key(f[j]) : 0u;
    if (mass) *mass += ctx.fixed(f[j]);
  }
}


/// Lists this CTA's elements with key >= `tkey` (> 0) in column order (warps' contiguous steps
/// in warp order, lanes in order within a step) when at most kCandidates; returns their number.
/// Block-wide: a counting pass, a barrier, a writing pass over the steps that held one. `mass`
/// (not null): receives the chunk's whole fixed-point mass (non-negative values), summed in the
/// counting pass.
__device__ __forceinline__ int list_candidates(const RowCtx& ctx, uint32_t tkey,
                                               unsigned long long* mass) {
  const int lane = ctx.tid & 31, warp = ctx.tid >> 5, nw = ctx.nthreads >> 5;
  int s0, s1;
  warp_steps(ctx, &s0, &s1);
  const bool track = s1 - s0 <= 64;  // the steps that held one, as bits (cluster chunks)
  unsigned long long hit = 0, chunk_mass = 0;
  unsigned int mine = 0;
  for (int st = s0; st < s1; ++st) {
    uint32_t k[4];
    lane_keys(ctx, st, lane, k, mass ? &chunk_mass : nullptr);
    const unsigned int c = (k[0] >= tkey) + (k[1] >= tkey) + (k[2] >= tkey) + (k[3] >= tkey);
    mine += c;
    if (c) hit |= 1ull << ((st - s0) & 63);
  }
  const unsigned int wcount = __reduce_add_sync(0xffffffffu, mine);
  if (lane == 0) ctx.s->wsum[warp] = wcount;
  if (mass) {
    CM total;
    block_scan(CM{0, chunk_mass}, ctx.s, &total);  // (its barriers order wsum's writes)
    *mass = total.m;
  }
  __syncthreads();
  int n = 0, off = 0;
  for (int w = 0; w < nw; ++w) {
    if (w == warp) off = n;
    n += static_cast<int>(ctx.s->wsum[w]);
  }
  if (n <= kCandidates && wcount > 0) {  // (warp-uniform)
    uint32_t* keys = cand_keys(ctx);
    uint32_t* cols = cand_cols(ctx);
    const unsigned long long steps =
        (static_cast<unsigned long long>(
             __reduce_or_sync(0xffffffffu, static_cast<unsigned int>(hit >> 32)))
         << 32) |
        __reduce_or_sync(0xffffffffu, static_cast<unsigned int>(hit));
    for (int st = s0; st < s1; ++st) {
      if (track && !((steps >> (st - s0)) & 1ull)) continue;
      uint32_t k[4];
      lane_keys(ctx, st, lane, k);
      const unsigned int c = (k[0] >= tkey) + (k[1] >= tkey) + (k[2] >= tkey) + (k[3] >= tkey);
      unsigned int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      int pos = off + static_cast<int>(incl - c);
      const uint32_t col = static_cast<uint32_t>(ctx.begin + st * 128 + lane * 4);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (k[j] >= tkey) keys[pos] = k[j], cols[pos] = col + j, ++pos;
      }
      off += static_cast<int>(__shfl_sync(0xffffffffu, incl, 31));
    }
  }
  __syncthreads();
  return n;
}

/*!
 * @brief Group-wide, after list_candidates (this CTA listed `n`): one group exchange of the
 *   lists' lengths, then (`gather`) the peers' lists copied into this CTA's after its own, in
 *   rank order (on rank 0: the row's candidates in column order). Returns the row's number of
 *   candidates N, or -1 (on every CTA) where a list did not fit or N < `k`: this CTA's list is
 *   then cleared. Peers read this CTA's list until they arrive at a later group barrier.
 *   Exchange slots xu[slot] and (`mass`, not null: this CTA's mass in, the row's out)
 *   xu[slot + 1]; the per-rank table in s->wsum.
 */
__device__ __forceinline__ int gather_candidates(const RowCtx& ctx, int n, int k, int slot,
                                                 bool gather, unsigned long long* mass) {
  Shared* s = ctx.s;
  if (ctx.tid == 0) {
    s->xu[slot] = static_cast<unsigned long long>(n);
    if (mass) s->xu[slot + 1] = *mass;
  }
  row_sync(ctx);
  const int lane = ctx.tid & 31;
  const unsigned long long v = lane < ctx.csize ? *peer(ctx, &s->xu[slot], lane) : 0ull;
  if (mass) {
    const unsigned long long mr = lane < ctx.csize ? *peer(ctx, &s->xu[slot + 1], lane) : 0ull;
    *mass = warp_sum_u(mr);
  }
  const bool over = __any_sync(0xffffffffu, v > static_cast<unsigned long long>(kCandidates));
  const unsigned long long incl = warp_scan_u(v);
  const unsigned long long N = __shfl_sync(0xffffffffu, incl, 31);
  uint32_t* keys = cand_keys(ctx);
  uint32_t* cols = cand_cols(ctx);
  if (over || N > static_cast<unsigned long long>(kCandidates) ||
      N < static_cast<unsigned long long>(k)) {
    if (n <= kCandidates) {
      for (int i = ctx.tid; i < n; i += ctx.nthreads) keys[i] = cols[i] = 0u;
    }
    __syncthreads();
    return -1;
  }
  if (gather && ctx.csize > 1) {
    // Rank r's list goes to [dst_r, dst_r + n_r): after this CTA's own, in rank order.
    if (ctx.tid < ctx.csize) {
      const unsigned long long ex = incl - v;
      s->wsum[ctx.tid] = ex;  // where rank r's entries start in rank order
      s->wsum[16 + ctx.tid] = ctx.tid < ctx.rank ? ex + n : ex;
    }
    __syncthreads();
    for (int i = ctx.tid; i < static_cast<int>(N); i += ctx.nthreads) {
      int r = 0;
      while (r + 1 < ctx.csize && static_cast<unsigned long long>(i) >= s->wsum[r + 1]) ++r;
      if (r == ctx.rank) continue;
      const int j = i - static_cast<int>(s->wsum[r]);
      const uint32_t key = peer(ctx, keys, r)[j], col = peer(ctx, cols, r)[j];
      const int d = static_cast<int>(s->wsum[16 + r]) + j;
      keys[d] = key, cols[d] = col;
    }
  }
  __syncthreads();
  return static_cast<int>(N);
}

/// Block-wide max of a u32 (through the float slots s->red, bit for bit); every thread of the
/// CTA receives it.
__device__ __forceinline__ uint32_t block_max_u(const RowCtx& ctx, uint32_t x) {
  x = __reduce_max_sync(0xffffffffu, x);
  if ((ctx.tid & 31) == 0) ctx.s->red[ctx.tid >> 5] = __uint_as_float(x);
  __syncthreads();
  uint32_t m = 0;
  for (int w = 0; w < (ctx.nthreads >> 5); ++w) m = max(m, __float_as_uint(ctx.s->red[w]));
  __syncthreads();  // red is rewritten by the next block reduction
  return m;
}

/*!
 * @brief The threshold of the k largest of this CTA's list of N keys (k <= N), the row's keys
 *   >= `floor_key` (the bound the list was made with): the largest key t with at least k keys >= t
 *   and (`need_kept`) the kept count and (`need_mass`: non-negative keys) fixed-point mass of the
 *   keys >= t. Block-wide. `by_rank` and up to one key a thread: each thread counts the keys at
 *   or above its own (one pass over the list, then a block max: 2 barriers; rank 0's draw, H100:
 *   top-k 69.5 -> 67.8 us at 128 x 128256, but the transforms, whose CTAs all select, lost 1-4 us
 *   with it); else radix select (8-bit digits in histogram s->cnt[0], left clean; ~6 barriers a
 *   digit).
 *
 *   A digit's bin that holds one listed key ends the search at the bin's lowest key, as in
 *   radix_search; the row's elements outside the list lie below floor_key but may share that
 *   bin, so the returned key is at least floor_key: keys >= it are the same set in the list and
 *   in the row.
 */
__device__ __forceinline__ Threshold list_select(const RowCtx& ctx, int N, unsigned int k,
                                                 bool need_kept, bool need_mass,
                                                 uint32_t floor_key, bool by_rank) {
  Shared* s = ctx.s;
  const uint32_t* keys = cand_keys(ctx);
  unsigned int* h = s->cnt[0];
  uint32_t prefix = 0, mask = 0;
  unsigned int need = k;
  if (by_rank && N <= ctx.nthreads) {
    // The largest listed key with at least k listed keys at or above it.
    uint32_t best = 0;
    if (ctx.tid < N) {
      const uint32_t mine = keys[ctx.tid];
      unsigned int ge = 0;
      for (int j = 0; j < N; ++j) ge += keys[j] >= mine;
      if (ge >= k) best = mine;
    }
    prefix = block_max_u(ctx, best);
  } else {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = ctx.tid; i < N; i += ctx.nthreads) {
        const uint32_t key = keys[i];
        if ((key & mask) == prefix) shared_add(&h[(key >> shift) & (kBins - 1)], 1u);
      }
      __syncthreads();
      // Thread j holds bin 255 - j (largest first); the digit is the first bin reaching `need`.
      const unsigned int v = ctx.tid < kBins ? h[kBins - 1 - ctx.tid] : 0u;
      CM total;
      const CM incl = block_scan(CM{v, 0}, s, &total);  // (its barriers order the reads of h)
      const int before = __syncthreads_count(ctx.tid < kBins && incl.c < need);
      if (ctx.tid == before) {
        s->pick[0] = kBins - 1 - before;
        s->pick[1] = static_cast<uint32_t>(incl.c - v);
        s->pick[2] = v;
      }
      if (ctx.tid < kBins) h[ctx.tid] = 0u;
      __syncthreads();
      prefix |= s->pick[0] << shift;
      mask |= (kBins - 1u) << shift;
      need -= s->pick[1];
      const bool one = s->pick[2] == 1u;
      __syncthreads();  // pick is rewritten next round
      if (one) break;   // the bin's one key: keeping the bin is the answer
    }
  }
  prefix = max(prefix, floor_key);
  if (!need_kept) return Threshold{prefix, CM{0, 0}, false};
  unsigned long long c = 0, m = 0;
  for (int i = ctx.tid; i < N; i += ctx.nthreads) {
    const uint32_t key = keys[i];
    if (key >= prefix) {
      ++c;
      if (need_mass) m += ctx.fixed(__uint_as_float(key >> 1));
    }
  }
  CM kept;
  block_scan(CM{c, m}, s, &kept);
  return Threshold{prefix, kept, false};
}

/// The largest listed key t >= lo_key whose listed keys at or above it weigh at least `target`
/// (fixed point; non-negative keys): a top-p threshold inside the list, where the keys >= lo_key
/// reach the target. Each thread weighs the keys at or above its own. Block-wide.
__device__ __forceinline__ uint32_t list_mass_select(const RowCtx& ctx, int N, uint32_t lo_key,
                                                     unsigned long long target) {
  const uint32_t* keys = cand_keys(ctx);
  uint32_t best = 0;
  for (int i = ctx.tid; i < N; i += ctx.nthreads) {
    const uint32_t mine = keys[i];
    if (mine < lo_key) continue;
    unsigned long long F = 0;
    for (int j = 0; j < N; ++j) {
      const uint32_t kj = keys[j];
      if (kj >= mine) F += ctx.fixed(__uint_as_float(kj >> 1));
    }
    if (F >= target) best = max(best, mine);
  }
  return block_max_u(ctx, best);
}

/// The draw (see draw) from this CTA's list of N candidates in column order (rank 0's gathered
/// list) with threshold t and uniform r: the column on the thread that finds it, -1 on every
/// other thread (and everywhere when the kept mass is 0); *kept_mass receives it. Block-wide.
__device__ __forceinline__ int64_t list_draw(const RowCtx& ctx, int N, uint32_t t, uint32_t r,
                                             unsigned long long* kept_mass) {
  const uint32_t* keys = cand_keys(ctx);
  const uint32_t* cols = cand_cols(ctx);
  const int per = (N + ctx.nthreads - 1) / ctx.nthreads;
  const int a = min(N, ctx.tid * per), b = min(N, a + per);
  auto weight = [&](int i) -> unsigned long long {
    const uint32_t key = keys[i];
    return key >= t ? ctx.fixed(__uint_as_float(key >> 1)) : 0ull;
  };
  unsigned long long mine = 0;
  for (int i = a; i < b; ++i) mine += weight(i);
  CM total;
  const CM incl = block_scan(CM{0, mine}, ctx.s, &total);
  const unsigned long long K = total.m;
  *kept_mass = K;
  if (K == 0) return -1;
  const unsigned long long target = __umul64hi(K, static_cast<unsigned long long>(r) << 32);
  unsigned long long acc = incl.m - mine;
  if (target < acc || target >= incl.m) return -1;
  for (int i = a; i < b; ++i) {
    acc += weight(i);
    if (acc > target) return cols[i];
  }
  return -1;  // unreachable: this thread's mass exceeds the target
}

/// A CTA's part of a row: the whole row (one CTA, `scratch` a global row) or its rank's chunk of
/// a cluster (shared memory `vals`).
__device__ __forceinline__ RowCtx make_ctx(float* vals, Shared* s, int64_t vocab, int64_t chunk,
                                           bool signed_keys, bool clustered) {
  RowCtx ctx;
  ctx.vals = vals;
  ctx.s = s;
  ctx.rank = 0;
  ctx.csize = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (clustered) {
    cg::cluster_group cluster = cg::this_cluster();
    ctx.rank = static_cast<int>(cluster.block_rank());
    ctx.csize = static_cast<int>(cluster.num_blocks());
  }
#endif
  ctx.clustered = clustered;
  ctx.direct = false;
  ctx.hist = nullptr;
  ctx.hist_shift = 0;
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

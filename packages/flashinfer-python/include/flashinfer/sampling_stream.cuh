// Plain sampling from probabilities as one streaming pass (sampling_from_probs without indices).
//
// Why. The cluster kernels of sampling.cuh hold a row on chip and run several serial phases per
// row (load, max, a cluster barrier, the draw's prefix, another barrier, the locate); at 128 x
// 128256 float32 that is 2.6 waves of CTAs that load and then compute with HBM idle (55 us on an
// H200 where one read of the probabilities takes ~15 us). A plain draw needs far less: one sum
// per tile of the row, then the draw resolved inside the one tile that holds it.
//
// How. A row is cut into fixed tiles of kStreamTile columns (independent of the GPU and the
// grid, so every path gives the same samples); CTA (row, tile) reads its tile once with 16-byte
// loads (all in flight at once), finds the tile's max and sums the tile's fixed-point masses
// relative to it (below), and publishes (mass, exponent, NaN) to global memory. The last CTA
// of the row to finish (an atomic counter per row) combines the row's tiles, draws the tile that
// holds the target, re-reads that tile (from L2: 16 KB) and locates the column. HBM is read
// once; the grid (rows x tiles CTAs, 4096 at 128 x 128256) streams all rows at once. (16
// columns per thread: 32 spilled at the 64 registers that give 4 CTAs per SM.)
//
// Exactness. Element weights are fixed point relative to the tile's max: with 2^e <= max(tile)
// < 2^(e+1), w(x) = floor(x * 2^(40 - e)), computed from the float's bits (no scale constant, so
// denormal tiles cannot overflow it). A tile's mass M_t = sum w (< 2^53) is exact and order-free.
// At the row, tile t weighs W_t = floor(M_t / 2^(E - e_t)) (E the largest tile exponent; a tile
// 2^64 below it weighs 0), K = sum W_t, and the draw takes target = floor(u K / 2^32) for the
// row's 32-bit uniform u (Philox output 0 of the row, as every other draw), the tile whose
// running W holds the target, the local target (target - before) * 2^(E - e_t) < M_t, and the
// first column of the tile whose running w exceeds it. An element's probability differs from
// x / sum(x) by at most 2^-40 of the row's max (the same resolution as the cluster draw);
// elements of weight 0 (negatives, zeros) are never drawn. The result depends only on the row,
// u and the tile size: the one-CTA path (SM80/89) runs this same kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.cuh"
#include "sampling_common.cuh"
#include "vec.cuh"

namespace flashinfer {
namespace sampling {

inline constexpr int kStreamThreads = 256;
inline constexpr int kStreamPerThread = 16;
/// Columns per tile: 4096 (16 KB of float32 per CTA).
inline constexpr int64_t kStreamTile = kStreamThreads * kStreamPerThread;
/// Tiles a row may have (the last CTA of a row gives each tile one thread).
inline constexpr int64_t kStreamMaxTiles = kStreamThreads;

/// A tile's result: its fixed-point mass, the bits of its (clamped) max and whether it held a
/// NaN.
struct TilePartial {
  unsigned long long mass;
  uint32_t max_bits;
  int nan;
};

/// Biased exponent of a tile max (denormals as 1; 0: the tile is all zero).
__device__ __forceinline__ int tile_exp(uint32_t max_bits) {
  return max_bits ? max(static_cast<int>(max_bits >> 23), 1) : 0;
}

/// Top-p by rejection over streaming passes (see TopPCountKernel): per row, the candidates
/// drawn by SampleStreamKernel and what decides them.
struct TopPStream {
  int64_t* cols;                ///< rows x kTopPStreamCandidates
  unsigned long long* keys;     ///< rows x kTopPStreamCandidates: the candidates' value bits
  unsigned long long* sums;     ///< rows x (kTopPStreamCandidates + 1), zero: masses above, K
  unsigned long long* row_max;  ///< rows: the row max's bits
  unsigned long long* counters; ///< rows, zero
  int64_t* state;               ///< rows, zero: 0 undecided, 1 written, 2 needs the exact search
  RowParam<float> top_p;
};

/// Candidates a top-p row draws in one streaming pass: the cluster path's 2 passes of 4.
inline constexpr int kTopPStreamCandidates = kTopPCandidates * kTopPPasses;

struct StreamParams {
  RngArgs rng;
  /// Min-p: keep x >= min_p * max(row), the row maxima (as float bits) from RowMaxKernel;
  /// nullptr: keep every x.
  const unsigned long long* row_max;
  RowParam<float> min_p;
  /// Top-p: draw kTopPStreamCandidates candidates into topp (out and valid untouched but for
  /// rows with a NaN or no mass); else one sample into out.
  bool top_p;
  TopPStream topp;
  int32_t* out;
  bool* valid;
  TilePartial* partials;          ///< rows x tiles
  unsigned long long* counters;   ///< rows, zero before the launch
  int tiles;
};

/// floor(x * 2^(40 - (e - 127))) for x >= 0 (sign bit clear) and e the biased exponent of a
/// value >= x (denormals count as biased exponent 1): the 24-bit significand shifted.
__device__ __forceinline__ unsigned long long tile_weight(float x, int e) {
  const uint32_t u = __float_as_uint(x);
  const int eb = static_cast<int>(u >> 23);
  const unsigned long long mant = (u & 0x7fffffu) | (eb ? 0x800000u : 0u);
  const int sh = max(eb, 1) + 17 - e;  // <= 17: the max gets [2^40, 2^41)
  return sh >= 0 ? mant << sh : (sh > -24 ? mant >> -sh : 0ull);
}

/// Probabilities: negatives, -0 and NaN weigh 0 (NaN is reported separately).
__device__ __forceinline__ float clamp_prob(float x) { return x > 0.f ? x : 0.f; }

/// Load kStreamPerThread elements of a tile of n columns at src as float, in vectors of N =
/// 16 / sizeof(T): vector j holds columns base + j * vstride + [0, N) (columns at and past n read
/// 0). Phase 1 passes base = tid * N, vstride = 256 N (every warp access contiguous; order-free);
/// a locate passes vstride = N (16 contiguous columns). `vec`: 16-byte loads (src and base
/// 16-byte aligned).
template <typename T>
__device__ __forceinline__ void load_tile(const T* __restrict__ src, int n, bool vec, int base,
                                          int vstride, float (&x)[kStreamPerThread]) {
  constexpr int N = 16 / sizeof(T);
  constexpr int U = kStreamPerThread / N;
  if (vec) {
    Vec<T, N> v[U];
#pragma unroll
    for (int j = 0; j < U; ++j)
      if (base + j * vstride + N <= n) v[j] = Vec<T, N>::load(src + base + j * vstride);
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int i0 = base + j * vstride;
#pragma unroll
      for (int q = 0; q < N; ++q)
        x[j * N + q] = i0 + N <= n ? to_float(v[j][q]) : (i0 + q < n ? to_float(src[i0 + q]) : 0.f);
    }
  } else {
#pragma unroll
    for (int j = 0; j < U; ++j) {
#pragma unroll
      for (int q = 0; q < N; ++q) {
        const int i = base + j * vstride + q;
        x[j * N + q] = i < n ? to_float(src[i]) : 0.f;
      }
    }
  }
}

/// The weight-bearing value of input x in a row whose kept values are >= thr (0: all).
__device__ __forceinline__ float kept_prob(float x, float thr) {
  x = clamp_prob(x);
  return x >= thr ? x : 0.f;
}

/// Block-wide inclusive scan of a u64 (256 threads); *total receives the sum.
__device__ __forceinline__ unsigned long long stream_scan(unsigned long long v,
                                                          unsigned long long* warp_tot,
                                                          unsigned long long* total) {
  constexpr int nw = kStreamThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_scan_u(v);
  if (lane == 31) warp_tot[warp] = v;
  __syncthreads();
  unsigned long long before = 0, all = 0;
#pragma unroll
  for (int w = 0; w < nw; ++w) {
    if (w < warp) before += warp_tot[w];
    all += warp_tot[w];
  }
  *total = all;
  __syncthreads();  // warp_tot is rewritten by the next call
  return v + before;
}

/// Warp-wide: the column of a tile (columns [0, n) at src, weights tile_weight(kept_prob(x,
/// thr), e)) whose running weight, in column order, first exceeds `local` (< the tile's mass);
/// lane l holds columns [128 l, 128 l + 128). Returns the column (and *bits, the value's bits) on
/// the lane that finds it, -1 elsewhere.
template <typename T>
__device__ __forceinline__ int locate_in_tile(const T* __restrict__ src, int n, bool vec, int e,
                                              float thr, unsigned long long local,
                                              uint32_t* bits) {
  constexpr int kLaneCols = kStreamTile / 32;
  const int lane = threadIdx.x & 31;
  float x[kStreamPerThread];
  unsigned long long m = 0;
#pragma unroll 1
  for (int c = 0; c < kLaneCols; c += kStreamPerThread) {
    load_tile<T>(src, n, vec, lane * kLaneCols + c, 16 / sizeof(T), x);
#pragma unroll
    for (int k = 0; k < kStreamPerThread; ++k) m += tile_weight(kept_prob(x[k], thr), e);
  }
  const unsigned long long incl = warp_scan_u(m);
  unsigned long long acc = incl - m;
  if (!(m && local >= acc && local < incl)) return -1;
#pragma unroll 1
  for (int c = 0; c < kLaneCols; c += kStreamPerThread) {
    load_tile<T>(src, n, vec, lane * kLaneCols + c, 16 / sizeof(T), x);
#pragma unroll 1
    for (int k = 0; k < kStreamPerThread; ++k) {
      const float v = kept_prob(x[k], thr);
      acc += tile_weight(v, e);
      if (acc > local) {
        *bits = __float_as_uint(v);
        return lane * kLaneCols + c + k;
      }
    }
  }
  return -1;  // unreachable: the lane's mass exceeds local
}

/// CTA (row, tile): the tile's partial; the row's last CTA draws (warp j locates draw j: the
/// sample, or top-p's candidates). Grid: rows * tiles CTAs.
template <typename T>
__global__ void __launch_bounds__(kStreamThreads, 4) SampleStreamKernel(const T* __restrict__ in,
                                                                     int64_t stride, int64_t vocab,
                                                                     bool vec, StreamParams p) {
  static_assert(kTopPStreamCandidates <= kStreamThreads / 32, "a warp per candidate");
  __shared__ unsigned long long warp_tot[kStreamThreads / 32];
  __shared__ uint32_t warp_max[kStreamThreads / 32];
  __shared__ int pick_tile[kTopPStreamCandidates], pick_exp[kTopPStreamCandidates], is_last;
  __shared__ unsigned long long pick_local[kTopPStreamCandidates];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row = blockIdx.x / p.tiles;
  const int tile = static_cast<int>(blockIdx.x % p.tiles);
  pdl_wait();
  const float thr = p.row_max ? p.min_p(row) * __uint_as_float(static_cast<uint32_t>(p.row_max[row])) : 0.f;

  // Phase 1: the tile's max, NaN and mass.
  {
    const int64_t t0 = tile * kStreamTile;
    const int n = static_cast<int>(vocab - t0 < kStreamTile ? vocab - t0 : kStreamTile);
    constexpr int N = 16 / sizeof(T);
    float x[kStreamPerThread];
    load_tile<T>(in + row * stride + t0, n, vec, tid * N, kStreamThreads * N, x);
    pdl_launch_dependents();
    bool nan = false;
    uint32_t mx = 0;  // non-negative floats order as their bits
#pragma unroll
    for (int k = 0; k < kStreamPerThread; ++k) {
      nan |= isnan(x[k]);
      x[k] = kept_prob(x[k], thr);
      mx = max(mx, __float_as_uint(x[k]));
    }
    mx = __reduce_max_sync(0xffffffffu, mx);
    if (lane == 0) warp_max[warp] = mx;
    nan = __syncthreads_or(nan);
#pragma unroll
    for (int w = 0; w < kStreamThreads / 32; ++w) mx = max(mx, warp_max[w]);
    const int e = tile_exp(mx);
    unsigned long long m = 0;
    if (e) {
#pragma unroll
      for (int k = 0; k < kStreamPerThread; ++k) m += tile_weight(x[k], e);
    }
    m = warp_sum_u(m);
    if (lane == 0) warp_tot[warp] = m;
    __syncthreads();
    if (tid == 0) {
      unsigned long long sum = 0;
      for (int w = 0; w < kStreamThreads / 32; ++w) sum += warp_tot[w];
      TilePartial* slot = p.partials + row * p.tiles + tile;
      slot->mass = sum;
      slot->max_bits = mx;
      slot->nan = nan;
      __threadfence();  // the partial is visible before the count says so
      is_last = atomicAdd(p.counters + row, 1ull) == static_cast<unsigned long long>(p.tiles - 1);
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
  }

  // Phase 2 (the row's last CTA): combine the tiles, pick the tile of each draw, locate.
  TilePartial tp{0, 0, 0};
  if (tid < p.tiles) {
    const TilePartial* slot = p.partials + row * p.tiles + tid;
    tp.mass = __ldcg(&slot->mass);
    tp.max_bits = __ldcg(&slot->max_bits);
    tp.nan = __ldcg(&slot->nan);
  }
  const int te = tile_exp(tp.max_bits);
  const bool any_nan = __syncthreads_or(tp.nan != 0);
  uint32_t rmax = __reduce_max_sync(0xffffffffu, tp.max_bits);
  if (lane == 0) warp_max[warp] = rmax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kStreamThreads / 32; ++w) rmax = max(rmax, warp_max[w]);
  const int shift = tile_exp(rmax) - te;
  const unsigned long long W = tp.mass && shift < 64 ? tp.mass >> shift : 0ull;
  if (tid < kTopPStreamCandidates) pick_tile[tid] = 0, pick_exp[tid] = 0, pick_local[tid] = 0;
  unsigned long long K;
  const unsigned long long incl = stream_scan(W, warp_tot, &K);  // (its barriers order the above)
  if (any_nan || K == 0) {  // a NaN row: sample 0, invalid; nothing to draw from: sample 0
    if (tid == 0) {
      p.out[row] = 0;
      if (p.valid) p.valid[row] = !any_nan;
      if (p.top_p) p.topp.state[row] = 1;
    }
    return;
  }
  const int draws = p.top_p ? kTopPStreamCandidates : 1;
  {
    Philox rng = p.rng.make(row);  // draw j: Philox output j of the row
    for (int j = 0; j < draws; ++j) {
      const unsigned long long target =
          __umul64hi(K, static_cast<unsigned long long>(rng.next()) << 32);
      if (W && target >= incl - W && target < incl) {
        pick_tile[j] = tid;
        pick_exp[j] = te;
        pick_local[j] = (target - (incl - W)) << shift;  // < the tile's mass
      }
    }
  }
  if (p.top_p && tid == 0) p.topp.row_max[row] = rmax;
  __syncthreads();
  if (warp >= draws) return;
  const int64_t t0 = pick_tile[warp] * kStreamTile;
  const int n = static_cast<int>(vocab - t0 < kStreamTile ? vocab - t0 : kStreamTile);
  uint32_t bits = 0;
  const int c = locate_in_tile<T>(in + row * stride + t0, n, vec, pick_exp[warp], thr,
                                  pick_local[warp], &bits);
  if (c < 0) return;
  if (!p.top_p) {
    p.out[row] = static_cast<int32_t>(t0 + c);
    if (p.valid) p.valid[row] = true;
    return;
  }
  p.topp.cols[row * kTopPStreamCandidates + warp] = t0 + c;
  p.topp.keys[row * kTopPStreamCandidates + warp] = bits;
}

/*!
 * @brief Top-p's counting pass. CTA (row, tile), rows in reverse order (the candidate pass
 *   read them last: L2): the tile's masses above each candidate, A(x_j), and its total, in the
 *   cluster path's row weights fixed(x) = floor(x * fixed_scale(max)), added to the row's sums
 *   (integers: order-free). The row's last CTA keeps the first candidate, in draw order, with
 *   A(x_j) <= floor(p K): exactly the set radix_search keeps (see top_p_rejection in
 *   sampling.cuh); a row that rejects all is left to SampleKernel's exact search (state 2).
 */
template <typename T>
__global__ void __launch_bounds__(kStreamThreads, 4) TopPCountKernel(const T* __restrict__ in,
                                                                     int64_t stride, int64_t vocab,
                                                                     bool vec, int tiles,
                                                                     int64_t rows, TopPStream p,
                                                                     int32_t* out, bool* valid) {
  constexpr int C = kTopPStreamCandidates;
  __shared__ unsigned long long warp_sums[kStreamThreads / 32][C + 1];
  __shared__ int is_last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row = rows - 1 - blockIdx.x / tiles;
  const int tile = static_cast<int>(blockIdx.x % tiles);
  pdl_wait();
  if (p.state[row] != 0) return;  // decided by the candidate pass (NaN, no mass)
  const float scale = fixed_scale(__uint_as_float(static_cast<uint32_t>(p.row_max[row])));
  uint32_t key[C], lowest = 0xffffffffu;
#pragma unroll
  for (int j = 0; j < C; ++j) {
    key[j] = static_cast<uint32_t>(p.keys[row * C + j]);
    lowest = min(lowest, key[j]);
  }
  const int64_t t0 = tile * kStreamTile;
  const int n = static_cast<int>(vocab - t0 < kStreamTile ? vocab - t0 : kStreamTile);
  constexpr int N = 16 / sizeof(T);
  float x[kStreamPerThread];
  load_tile<T>(in + row * stride + t0, n, vec, tid * N, kStreamThreads * N, x);
  pdl_launch_dependents();
  unsigned long long above[C + 1];
#pragma unroll
  for (int j = 0; j <= C; ++j) above[j] = 0;
#pragma unroll
  for (int k = 0; k < kStreamPerThread; ++k) {
    const float v = clamp_prob(x[k]);
    const unsigned long long w = __float2ull_rz(v * scale);
    above[C] += w;
    const uint32_t b = __float_as_uint(v);
    if (b > lowest) {  // most of a peaked row is below every candidate
#pragma unroll
      for (int j = 0; j < C; ++j)
        if (b > key[j]) above[j] += w;
    }
  }
#pragma unroll
  for (int j = 0; j <= C; ++j) {
    const unsigned long long a = warp_sum_u(above[j]);
    if (lane == 0) warp_sums[warp][j] = a;
  }
  __syncthreads();
  if (tid <= C) {
    unsigned long long a = 0;
    for (int w = 0; w < kStreamThreads / 32; ++w) a += warp_sums[w][tid];
    atomicAdd(p.sums + row * (C + 1) + tid, a);
  }
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    is_last = atomicAdd(p.counters + row, 1ull) == static_cast<unsigned long long>(tiles - 1);
  }
  __syncthreads();
  if (!is_last || tid != 0) return;
  __threadfence();
  const unsigned long long K = __ldcg(p.sums + row * (C + 1) + C);
  const unsigned long long limit = static_cast<unsigned long long>(
      floor(static_cast<double>(p.top_p(row)) * static_cast<double>(K)));
  for (int j = 0; j < C; ++j) {
    if (__ldcg(p.sums + row * (C + 1) + j) <= limit) {
      out[row] = static_cast<int32_t>(p.cols[row * C + j]);
      if (valid) valid[row] = true;
      p.state[row] = 1;
      return;
    }
  }
  p.state[row] = 2;
}

/// Min-p's first pass: row_max[row] = the bits of the row's largest clamped value (atomicMax;
/// zero before the launch). Rows in reverse order, so that the sampling pass, which starts from
/// row 0, finds the rows read last still in L2.
template <typename T>
__global__ void __launch_bounds__(kStreamThreads, 4) RowMaxKernel(const T* __restrict__ in,
                                                                  int64_t stride, int64_t vocab,
                                                                  bool vec, int tiles, int64_t rows,
                                                                  unsigned long long* row_max) {
  __shared__ uint32_t warp_max[kStreamThreads / 32];
  const int64_t row = rows - 1 - blockIdx.x / tiles;
  const int tile = static_cast<int>(blockIdx.x % tiles);
  pdl_wait();
  const int64_t t0 = tile * kStreamTile;
  const int n = static_cast<int>(vocab - t0 < kStreamTile ? vocab - t0 : kStreamTile);
  constexpr int N = 16 / sizeof(T);
  float x[kStreamPerThread];
  load_tile<T>(in + row * stride + t0, n, vec, threadIdx.x * N, kStreamThreads * N, x);
  uint32_t mx = 0;
#pragma unroll
  for (int k = 0; k < kStreamPerThread; ++k) mx = max(mx, __float_as_uint(clamp_prob(x[k])));
  mx = __reduce_max_sync(0xffffffffu, mx);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = mx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < kStreamThreads / 32; ++w) mx = max(mx, warp_max[w]);
    if (mx) atomicMax(row_max + row, static_cast<unsigned long long>(mx));
  }
}

/// Tiles per row of `vocab` columns.
inline int64_t stream_tiles(int64_t vocab) { return ceil_div(vocab, kStreamTile); }

/// Plain (row_max nullptr), min-p or top-p (params.top_p) sampling of `rows` rows: out[i] from
/// row i. `partials` holds rows * stream_tiles(vocab) TilePartials, `counters` rows zeros;
/// min-p: `row_max` rows zeros (RowMaxKernel fills them first); top-p: params.topp (zeros), and
/// the rows left in state 2 then go to SampleKernel's exact search (the caller launches it).
template <typename T>
cudaError_t SampleStream(const T* in, int64_t stride, int64_t rows, int64_t vocab,
                         StreamParams params, unsigned long long* row_max, bool enable_pdl,
                         cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  params.tiles = static_cast<int>(stream_tiles(vocab));
  if (params.tiles > kStreamMaxTiles) return cudaErrorInvalidValue;
  const bool vec = is_aligned(in, 16) && (stride * sizeof(T)) % 16 == 0;  // tiles start aligned
  const dim3 grid(rows * params.tiles), block(kStreamThreads);
  params.row_max = row_max;
  if (row_max) {
    const cudaError_t e = launch_kernel(RowMaxKernel<T>, grid, block, 0, stream, enable_pdl, in,
                                        stride, vocab, vec, params.tiles, rows, row_max);
    if (e != cudaSuccess) return e;
  }
  cudaError_t e = launch_kernel(SampleStreamKernel<T>, grid, block, 0, stream, enable_pdl, in,
                                stride, vocab, vec, params);
  if (e != cudaSuccess || !params.top_p) return e;
  return launch_kernel(TopPCountKernel<T>, grid, block, 0, stream, enable_pdl, in, stride, vocab,
                       vec, params.tiles, rows, params.topp, params.out, params.valid);
}

}  // namespace sampling
}  // namespace flashinfer

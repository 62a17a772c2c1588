// Plain, min-p and top-p sampling from probabilities as streaming passes (the sampling ops'
// probs path without indices).
//
// Why. The cluster kernels of sampling.cuh hold a row on chip and run several serial phases per
// row (load, max, a cluster barrier, the draw's prefix, another barrier, the locate); at 128 x
// 128256 float32 that is 2.6 waves of CTAs that load and then compute with HBM idle (55 us on an
// H200 where one read of the probabilities takes ~15 us). A draw needs far less: one sum per
// tile of the row, then the draw resolved inside the one tile that holds it.
//
// How. A row is cut into fixed tiles of kStreamTile columns (independent of the GPU and the
// grid, so every path gives the same samples); CTA (row, tile) copies its tile into shared
// memory with cp.async (32 KB of float32 in flight per CTA without registers, 6 CTAs per SM),
// finds the tile's max, sums the fixed-point masses (below) of each 256-column sub-block and
// publishes (mass, max, NaN) and the 32 sub-block masses to global memory. The last CTA of the
// row to finish (an atomic counter per row) combines the row's tiles and, one warp per draw,
// finds the tile, the sub-block (32 masses: one L2 read) and the column (the sub-block's 256
// values: one L2 read, then 8 warp scans). HBM is read once; the grid (rows x tiles CTAs) streams all rows at once.
// (A first version held 16 values per thread in registers, 4 CTAs of 16 KB per SM, and located
// a draw by re-reading its whole tile: measured slower than the cluster kernels on an H200,
// sampling 65.9 vs 55 us at 128 x 128256.)
//
// Exactness. Element weights are fixed point relative to the tile's max: with 2^e <= max(tile)
// < 2^(e+1), w(x) = floor(x * 2^(40 - e)), computed from the float's bits (no scale constant, so
// denormal tiles cannot overflow it). A tile's mass M_t = sum w (< 2^54) is exact and order-free.
// At the row, tile t weighs W_t = floor(M_t / 2^(E - e_t)) (E the largest tile exponent; a tile
// 2^64 below it weighs 0), K = sum W_t, and draw j takes target = floor(u_j K / 2^32) for the
// row's Philox output j, the tile whose running W holds the target, the local target (target -
// before) * 2^(E - e_t) < M_t, and the first column of the tile whose running w exceeds it. An
// element's probability differs from x / sum(x) by at most 2^-40 of the row's max (the
// resolution of the cluster draw); elements of weight 0 (negatives, zeros) are never drawn. The
// result depends only on the row, u and the tile size: SM80/89 run these same kernels.
//
// Min-p first finds the row maxima (RowMaxKernel, a second read, rows in reverse order so the
// sampling pass starts on rows still in L2). Top-p draws kTopPStreamCandidates candidates in the
// sampling pass, counts the masses above them in TopPCountKernel (a second read) and leaves the
// rows that reject all to SampleKernel's exact search.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.cuh"
#include "sampling_common.cuh"
#include "vec.cuh"

namespace flashinfer {
namespace sampling {

inline constexpr int kStreamThreads = 256;
/// Columns per tile: 8192 (32 KB of float32 per CTA, in shared memory).
inline constexpr int kStreamTile = 8192;
/// Columns per sub-block (a warp's 8 per lane when locating) and sub-blocks per tile (one per lane).
inline constexpr int kSubCols = 256;
inline constexpr int kSubs = kStreamTile / kSubCols;
static_assert(kSubs == 32, "a lane per sub-block");
/// CTAs per SM the kernels are built for: 5 x 33 KB of shared memory (160 KB of tiles in flight;
/// 6 spilled 96 bytes at 40 registers; SampleStreamKernel, 46 registers unbounded, spilled at
/// the bound of 5 and gets 5 anyway).
inline constexpr int kStreamCtas = 5;
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
  unsigned long long* subs;       ///< rows x tiles x kSubs: the sub-blocks' masses
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

/// Copy a tile (columns [0, n) at src) into shared memory `dst` as T: cp.async 16-byte copies
/// when `vec` (src 16-byte aligned; all in flight at once, no registers), else plain loads.
/// Block-wide; ends with a barrier.
template <typename T>
__device__ __forceinline__ void load_tile(const T* __restrict__ src, int n, bool vec, T* dst) {
  constexpr int N = 16 / sizeof(T);
  int done = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (vec) {
    const int nv = n / N;
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    for (int g = threadIdx.x; g < nv; g += kStreamThreads) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d + g * 16),
                   "l"(src + g * N)
                   : "memory");
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    done = nv * N;
  }
#endif
  for (int i = done + threadIdx.x; i < n; i += kStreamThreads) dst[i] = src[i];
  __syncthreads();
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

/// Shared memory of the streaming kernels: the tile (as T) and small exchange slots.
struct StreamShared {
  alignas(16) unsigned char tile[kStreamTile * sizeof(float)];
  unsigned long long warp_tot[kStreamThreads / 32][kTopPStreamCandidates + 1];
  uint32_t warp_max[kStreamThreads / 32];
  unsigned long long subs[kSubs];
  int pick_tile[kTopPStreamCandidates], pick_exp[kTopPStreamCandidates], is_last;
  unsigned long long pick_local[kTopPStreamCandidates];
};

/// Block-wide max of non-negative float bits; every thread receives it.
__device__ __forceinline__ uint32_t stream_max(uint32_t v, StreamShared& sh) {
  v = __reduce_max_sync(0xffffffffu, v);
  if ((threadIdx.x & 31) == 0) sh.warp_max[threadIdx.x >> 5] = v;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kStreamThreads / 32; ++w) v = max(v, sh.warp_max[w]);
  __syncthreads();  // warp_max is rewritten by the next call
  return v;
}

/// Columns [t0, t0 + n) of the row: n = min(kStreamTile, vocab - t0).
__device__ __forceinline__ int tile_cols(int64_t vocab, int64_t t0) {
  return static_cast<int>(vocab - t0 < kStreamTile ? vocab - t0 : kStreamTile);
}

/// Warp-wide: the column (relative to the tile) whose running weight, in column order, first
/// exceeds `local` (< the tile's mass), from the tile's sub-block masses `subs` and its values at
/// src (n columns; weights tile_weight(kept_prob(x, thr), e)): the sub-block from one read of
/// the 32 masses (a lane each), then the column from one read of its 256 values (lane l holds
/// columns l + 32 k: coalesced, and 8 warp scans in column order). Returns the column (and
/// *bits, the value's bits) on the lane that finds it, -1 elsewhere.
template <typename T>
__device__ __forceinline__ int locate_in_tile(const T* __restrict__ src, int n,
                                              const unsigned long long* subs, int e, float thr,
                                              unsigned long long local, uint32_t* bits) {
  const int lane = threadIdx.x & 31;
  const unsigned long long sm = __ldcg(subs + lane);
  const unsigned long long sincl = warp_scan_u(sm);
  const int sb = __ffs(__ballot_sync(0xffffffffu, sincl > local)) - 1;  // local < the total
  local -= __shfl_sync(0xffffffffu, sincl - sm, sb);
  constexpr int kSteps = kSubCols / 32;
  float x[kSteps];
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    const int c = sb * kSubCols + 32 * k + lane;
    x[k] = c < n ? kept_prob(to_float(src[c]), thr) : 0.f;
  }
  unsigned long long acc = 0;  // the sub-block's weight before step k
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    const unsigned long long w = tile_weight(x[k], e);
    const unsigned long long incl = warp_scan_u(w);
    const unsigned long long step = __shfl_sync(0xffffffffu, incl, 31);
    if (local < acc + step) {
      const int hit = __ffs(__ballot_sync(0xffffffffu, acc + incl > local)) - 1;
      if (lane != hit) return -1;
      *bits = __float_as_uint(x[k]);
      return sb * kSubCols + 32 * k + lane;
    }
    acc += step;
  }
  return -1;  // unreachable: the sub-block's mass exceeds local
}

/// CTA (row, tile): the tile's partial; the row's last CTA draws (warp j locates draw j: the
/// sample, or top-p's candidates). Grid: rows * tiles CTAs.
template <typename T>
__global__ void __launch_bounds__(kStreamThreads) SampleStreamKernel(const T* __restrict__ in,
                                                                     int64_t stride, int64_t vocab,
                                                                     bool vec, StreamParams p) {
  static_assert(kTopPStreamCandidates <= kStreamThreads / 32, "a warp per candidate");
  __shared__ StreamShared sh;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row = blockIdx.x / p.tiles;
  const int tile = static_cast<int>(blockIdx.x % p.tiles);
  pdl_wait();
  const float thr = p.row_max ? p.min_p(row) * __uint_as_float(static_cast<uint32_t>(p.row_max[row])) : 0.f;

  // Phase 1: the tile's max, NaN, sub-block masses and mass.
  {
    const int64_t t0 = int64_t{tile} * kStreamTile;
    const int n = tile_cols(vocab, t0);
    const T* vals = reinterpret_cast<const T*>(sh.tile);
    load_tile<T>(in + row * stride + t0, n, vec, reinterpret_cast<T*>(sh.tile));
    pdl_launch_dependents();
    bool nan = false;
    uint32_t mx = 0;  // non-negative floats order as their bits
    for (int i = tid; i < n; i += kStreamThreads) {
      const float x = to_float(vals[i]);
      nan |= isnan(x);
      mx = max(mx, __float_as_uint(kept_prob(x, thr)));
    }
    nan = __syncthreads_or(nan);
    mx = stream_max(mx, sh);
    const int e = tile_exp(mx);
    // Warp w sums sub-blocks w, w + 8, ...: lane l its columns l + 32 k (conflict-free).
    for (int sb = warp; sb < kSubs; sb += kStreamThreads / 32) {
      unsigned long long m = 0;
#pragma unroll
      for (int k = 0; k < kSubCols / 32; ++k) {
        const int c = sb * kSubCols + 32 * k + lane;
        if (c < n) m += tile_weight(kept_prob(to_float(vals[c]), thr), e);
      }
      m = warp_sum_u(m);
      if (lane == 0) sh.subs[sb] = m;
    }
    __syncthreads();
    const int64_t slot = row * p.tiles + tile;
    if (tid < kSubs) p.subs[slot * kSubs + tid] = sh.subs[tid];
    if (tid == 0) {
      unsigned long long sum = 0;
      for (int sb = 0; sb < kSubs; ++sb) sum += sh.subs[sb];
      p.partials[slot] = TilePartial{sum, mx, nan};
    }
    __threadfence();  // every thread's writes are visible before the count says so
    __syncthreads();
    if (tid == 0)
      sh.is_last = atomicAdd(p.counters + row, 1ull) == static_cast<unsigned long long>(p.tiles - 1);
    __syncthreads();
    if (!sh.is_last) return;
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
  const uint32_t rmax = stream_max(tp.max_bits, sh);
  const int shift = tile_exp(rmax) - te;
  const unsigned long long W = tp.mass && shift < 64 ? tp.mass >> shift : 0ull;
  if (tid < kTopPStreamCandidates) sh.pick_tile[tid] = 0, sh.pick_exp[tid] = 0, sh.pick_local[tid] = 0;
  unsigned long long K;
  const unsigned long long incl = stream_scan(W, &sh.warp_tot[0][0], &K);  // (barriers order it)
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
        sh.pick_tile[j] = tid;
        sh.pick_exp[j] = te;
        sh.pick_local[j] = (target - (incl - W)) << shift;  // < the tile's mass
      }
    }
  }
  if (p.top_p && tid == 0) p.topp.row_max[row] = rmax;
  __syncthreads();
  if (warp >= draws) return;
  const int c = sh.pick_tile[warp];
  const int64_t t0 = int64_t{c} * kStreamTile;
  uint32_t bits = 0;
  const int col = locate_in_tile<T>(in + row * stride + t0, tile_cols(vocab, t0),
                                    p.subs + (row * p.tiles + c) * kSubs, sh.pick_exp[warp], thr,
                                    sh.pick_local[warp], &bits);
  if (col < 0) return;
  if (!p.top_p) {
    p.out[row] = static_cast<int32_t>(t0 + col);
    if (p.valid) p.valid[row] = true;
    return;
  }
  p.topp.cols[row * kTopPStreamCandidates + warp] = t0 + col;
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
__global__ void __launch_bounds__(kStreamThreads, kStreamCtas) TopPCountKernel(const T* __restrict__ in,
                                                                  int64_t stride, int64_t vocab,
                                                                  bool vec, int tiles,
                                                                  int64_t rows, TopPStream p,
                                                                  int32_t* out, bool* valid) {
  constexpr int C = kTopPStreamCandidates;
  __shared__ StreamShared sh;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row = rows - 1 - blockIdx.x / tiles;
  const int tile = static_cast<int>(blockIdx.x % tiles);
  pdl_wait();
  if (p.state[row] != 0) return;  // decided by the candidate pass (NaN, no mass)
  const int64_t t0 = int64_t{tile} * kStreamTile;
  const int n = tile_cols(vocab, t0);
  const T* vals = reinterpret_cast<const T*>(sh.tile);
  load_tile<T>(in + row * stride + t0, n, vec, reinterpret_cast<T*>(sh.tile));
  pdl_launch_dependents();
  const float scale = fixed_scale(__uint_as_float(static_cast<uint32_t>(p.row_max[row])));
  uint32_t key[C], lowest = 0xffffffffu;
#pragma unroll
  for (int j = 0; j < C; ++j) {
    key[j] = static_cast<uint32_t>(p.keys[row * C + j]);
    lowest = min(lowest, key[j]);
  }
  unsigned long long above[C + 1];
#pragma unroll
  for (int j = 0; j <= C; ++j) above[j] = 0;
  for (int i = tid; i < n; i += kStreamThreads) {
    const float v = clamp_prob(to_float(vals[i]));
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
    if (lane == 0) sh.warp_tot[warp][j] = a;
  }
  __syncthreads();
  if (tid <= C) {
    unsigned long long a = 0;
    for (int w = 0; w < kStreamThreads / 32; ++w) a += sh.warp_tot[w][tid];
    atomicAdd(p.sums + row * (C + 1) + tid, a);
  }
  __threadfence();
  __syncthreads();
  if (tid == 0)
    sh.is_last = atomicAdd(p.counters + row, 1ull) == static_cast<unsigned long long>(tiles - 1);
  __syncthreads();
  if (!sh.is_last || tid != 0) return;
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
__global__ void __launch_bounds__(kStreamThreads, kStreamCtas) RowMaxKernel(const T* __restrict__ in,
                                                               int64_t stride, int64_t vocab,
                                                               bool vec, int tiles, int64_t rows,
                                                               unsigned long long* row_max) {
  __shared__ StreamShared sh;
  const int64_t row = rows - 1 - blockIdx.x / tiles;
  const int tile = static_cast<int>(blockIdx.x % tiles);
  pdl_wait();
  const int64_t t0 = int64_t{tile} * kStreamTile;
  const int n = tile_cols(vocab, t0);
  const T* vals = reinterpret_cast<const T*>(sh.tile);
  load_tile<T>(in + row * stride + t0, n, vec, reinterpret_cast<T*>(sh.tile));
  uint32_t mx = 0;
  for (int i = threadIdx.x; i < n; i += kStreamThreads)
    mx = max(mx, __float_as_uint(clamp_prob(to_float(vals[i]))));
  mx = stream_max(mx, sh);
  if (threadIdx.x == 0 && mx) atomicMax(row_max + row, static_cast<unsigned long long>(mx));
}

/// Tiles per row of `vocab` columns.
inline int64_t stream_tiles(int64_t vocab) { return ceil_div(vocab, kStreamTile); }

/// Plain (row_max nullptr), min-p or top-p (params.top_p) sampling of `rows` rows: out[i] from
/// row i. `partials` holds rows * stream_tiles(vocab) TilePartials, `subs` kSubs times as many
/// u64, `counters` rows zeros; min-p: `row_max` rows zeros (RowMaxKernel fills them first);
/// top-p: params.topp (zeros), and the rows left in state 2 then go to SampleKernel's exact
/// search (the caller launches it).
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
  // All of the unified L1/shared memory as shared memory: kStreamCtas tiles per SM.
  for (const void* k : {reinterpret_cast<const void*>(RowMaxKernel<T>),
                        reinterpret_cast<const void*>(SampleStreamKernel<T>),
                        reinterpret_cast<const void*>(TopPCountKernel<T>)}) {
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                               cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
  }
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

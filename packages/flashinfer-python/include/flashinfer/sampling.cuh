// Sampling from (filtered) probability rows, the filters' renormalizations, softmax and chain
// speculative sampling. Framework-free: raw pointers, sizes and strides in, cudaError_t out.
//
// Why the kernels look the way they do. A vocabulary row (128256 float32 = 513 KB) is larger than
// one SM's shared memory, and sampling needs several passes over it (max, the filter's threshold,
// the kept mass, the draw). So a row is handled by a thread-block cluster of C CTAs (C <= 8 for
// rows up to ~512K float32 elements): each CTA loads its contiguous chunk of the row once from
// HBM into shared memory (<= 64 KB, so 2-3 CTAs of different rows share an SM and one loads while
// another computes), and every later pass runs over shared memory. The CTAs exchange only small
// partial results through distributed shared memory (DSMEM) after a cluster barrier. (Plain,
// min-p and top-p sampling of float32 batches too large for one wave of such clusters read the
// rows where they lie instead, every row's cluster resident at once: SampleKernel's kDirect.)
//
// Thresholds are found by a radix select over order-preserving 32-bit keys of the values. The
// first round bins the 11-bit key prefix (exponent and 3 mantissa bits) in a window of the 255
// prefixes at and below the row max's, everything lower in one bin counted in registers: a row's
// values spread over these bins, so the shared-memory atomics rarely conflict (a plain exponent
// digit puts a warp's 32 values into a handful of bins). Later rounds take 8-bit digits of the
// remaining bits. Each round is a pass that builds a 256-bin histogram (count and mass) of the
// elements matching the prefix chosen so far, a cluster barrier, and a merge of the C histograms
// from DSMEM followed by a block scan that picks the bin where the cumulative count/mass (from the
// largest values down) reaches the target. A round stops the search early when the chosen bin
// holds one element. The result is exact: the largest key t with F(t) >= target, where F(t) is
// the count (top-k) or mass (top-p) of the elements with key >= t; ties at t are all kept.
//
// Masses are 64-bit fixed point: w(x) = floor(x * 2^(40 - e)) with 2^e <= max(row) < 2^(e+1).
// Integer sums do not depend on the order of the additions, so histogram atomics, block and
// cluster reductions are deterministic. SampleKernel's draw weighs 512-column blocks instead (see
// "draw by 512-column blocks" below): W_b = fixed(S_b), S_b a float sum in a fixed order, then
// target = floor(u * K) for K = sum of W_b and a 32-bit uniform u, the block whose running W
// exceeds it, the element by a float scan of the block. Blocks start at multiples of 512 columns
// of the row, so the draw does not depend on how a row is split: the one-CTA-per-row path below
// gives the cluster path's samples bit for bit. (The top-k filters (kBlockDraw) and ChainKernel
// draw per element: the first column whose running fixed(x) exceeds the target; also split-free.)
//
// SM80/89 (no clusters) and FLASHINFER_SAMPLING_NO_CLUSTER: one CTA per row, the row in a global
// scratch row (L2-resident passes instead of shared memory), the same code with a group of one.
//
// RNG: Philox-4x32-10 (Salmon et al., SC'11; the generator torch and curand use), counter =
// (offset / 4, subsequence = output row), key = seed; (seed, offset) per call or per row. Written
// here (30 lines) rather than taken from curand_kernel.h, which not every toolkit install ships.
#pragma once
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "launch.cuh"
#include "mbarrier.cuh"
#include "sampling_common.cuh"

namespace flashinfer {
namespace sampling {

namespace cg = cooperative_groups;

// ------------------------------------------------------------------------------------------------
// Kernels
// ------------------------------------------------------------------------------------------------

/// Where a kernel's rows live. Clusters (scratch == nullptr): CTA i works on row i / C, its
/// chunk in shared memory. One CTA per row (SM80 and newer; scratch set): CTA i works on row
/// row0 + i, the whole row in its global scratch row i (stride scratch_stride floats); the host
/// launches once per scratch-full of rows. (A loop over rows in the kernel made it spill.)
struct RowGrid {
  int64_t rows;
  int64_t row0;
  float* scratch;
  int64_t scratch_stride;
};

/// This CTA's RowCtx for a row: its chunk in shared memory (after the chunk: the Shared block),
/// or its scratch row (shared memory holds only the Shared block).
__device__ __forceinline__ RowCtx row_ctx(unsigned char* smem, const RowGrid& g, int64_t vocab,
                                          int64_t chunk, bool signed_keys) {
  if (g.scratch) {
    return make_ctx(g.scratch + blockIdx.x * g.scratch_stride, reinterpret_cast<Shared*>(smem),
                    vocab, vocab, signed_keys, false);
  }
  return make_ctx(reinterpret_cast<float*>(smem),
                  reinterpret_cast<Shared*>(smem + chunk * sizeof(float)), vocab, chunk,
                  signed_keys, true);
}

/// This CTA's row.
__device__ __forceinline__ int64_t row_of(const RowGrid& g, const RowCtx& ctx) {
  return g.row0 + blockIdx.x / ctx.csize;
}

/// Write f(x) for the chunk's values x to out[0, n): 16-byte loads and stores where aligned.
template <typename O, typename F>
__device__ __forceinline__ void write_chunk(const RowCtx& ctx, O* out, F f) {
  int done = 0;
  if constexpr (std::is_same_v<O, float>) {
    if ((reinterpret_cast<uintptr_t>(out) & 15) == 0) {
      const int n4 = ctx.n / 4;
      const float4* v4 = reinterpret_cast<const float4*>(ctx.vals);
      for (int i = ctx.tid; i < n4; i += ctx.nthreads) {
        const float4 x = v4[i];
        reinterpret_cast<float4*>(out)[i] = make_float4(f(x.x), f(x.y), f(x.z), f(x.w));
      }
      done = n4 * 4;
    }
  }
  for (int i = done + ctx.tid; i < ctx.n; i += ctx.nthreads) out[i] = from_float<O>(f(ctx.vals[i]));
}

struct SampleParams {
  int filter;
  bool logits;  ///< input holds logits: weights exp(x - max)
  RowParam<float> top_p;
  RowParam<int> top_k;
  RowParam<float> min_p;
  RngArgs rng;
  RowMap rows;
  void* out;
  bool out_64;
  bool* valid;
};

// ------------------------------------------------------------------------------------------------
// SampleKernel's draw by 512-column blocks
// ------------------------------------------------------------------------------------------------
//
// A row's final draw weighs each 512-column block by W_b = fixed(S_b), S_b the float sum of the
// block's kept values in a fixed order (each lane's 16 values in a fixed tree, then a butterfly
// over the warp, which gives every lane the same bits since a + b == b + a), and then the
// element within the block by its float value (a float scan over the block's lanes, then the
// lane's values in order). Blocks start at multiples of 512 columns of the row (SampleKernel's
// chunks hold whole blocks), so S_b, the integer K = sum of W_b and with them every sample
// depend only on the row: the one-CTA path gives the cluster path's samples bit for bit, and
// equal seed/offset give equal samples. Filling the sums costs an add and a max per element
// and 6 warp-wide instructions per 512 (no 64-bit conversion per element); they stay in shared
// memory after the Shared block with each block's max key, so a threshold found later keeps
// them without another pass (refine_block_sums), and the locate reads them (two short warp
// scans) instead of walking the warp's columns again.

/// Columns of a draw block: lane l of a warp holds columns 128 s + 4 l .. + 3, s < 4.
inline constexpr int kBlockCols = 512;
inline constexpr int kBlockSteps = kBlockCols / 128;

/// The float sums S_b of this CTA's blocks (shared memory after the Shared block).
__device__ __forceinline__ float* block_sums(const RowCtx& ctx) {
  return reinterpret_cast<float*>(ctx.s + 1);
}

__device__ __forceinline__ int num_blocks(const RowCtx& ctx) {
  return (ctx.n + kBlockCols - 1) / kBlockCols;
}

/// The 4 values at column c of the chunk, mapped by `map` (stored back where they change when
/// kWrite), 0 past the chunk's end.
template <bool kWrite, typename Map>
__device__ __forceinline__ float4 lane_quad(const RowCtx& ctx, int c, Map map) {
  if (c + 4 <= ctx.n) {
    const float4 x = ctx.quad_col(c);
    const float4 y = make_float4(map(x.x), map(x.y), map(x.z), map(x.w));
    if (kWrite && !ctx.direct && (__float_as_uint(x.x) != __float_as_uint(y.x) ||
                   __float_as_uint(x.y) != __float_as_uint(y.y) ||
                   __float_as_uint(x.z) != __float_as_uint(y.z) ||
                   __float_as_uint(x.w) != __float_as_uint(y.w)))
      *reinterpret_cast<float4*>(ctx.vals + c) = y;
    return y;
  }
  float f[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f[j] = 0.f;
    if (c + j < ctx.n) {
      f[j] = map(ctx.val(c + j));
      if (kWrite && !ctx.direct) ctx.vals[c + j] = f[j];
    }
  }
  return make_float4(f[0], f[1], f[2], f[3]);
}

/// Lane `lane`'s 16 values of block b (see kBlockCols), mapped as lane_quad.
template <bool kWrite, typename Map>
__device__ __forceinline__ void block_lane(const RowCtx& ctx, int b, int lane, Map map,
                                           float4 (&v)[kBlockSteps]) {
#pragma unroll
  for (int st = 0; st < kBlockSteps; ++st)
    v[st] = lane_quad<kWrite>(ctx, b * kBlockCols + st * 128 + lane * 4, map);
}

/// x when its key is >= t (kept), else 0.
__device__ __forceinline__ float kept_value(const RowCtx& ctx, float x, uint32_t t) {
  return ctx.key(x) >= t ? x : 0.f;
}

/// The kept values of a lane's 16, in column-within-block order (st, j).
__device__ __forceinline__ void lane_kept(const RowCtx& ctx, const float4 (&v)[kBlockSteps],
                                          uint32_t t, float (&k)[4 * kBlockSteps]) {
#pragma unroll
  for (int st = 0; st < kBlockSteps; ++st) {
    k[4 * st] = kept_value(ctx, v[st].x, t);
    k[4 * st + 1] = kept_value(ctx, v[st].y, t);
    k[4 * st + 2] = kept_value(ctx, v[st].z, t);
    k[4 * st + 3] = kept_value(ctx, v[st].w, t);
  }
}

/// A lane's sum of its 16 kept values in a fixed tree.
__device__ __forceinline__ float lane_sum(const float (&k)[4 * kBlockSteps]) {
  static_assert(kBlockSteps == 4, "the tree below sums 16 values");
  float q[4];
#pragma unroll
  for (int st = 0; st < 4; ++st) q[st] = (k[4 * st] + k[4 * st + 1]) + (k[4 * st + 2] + k[4 * st + 3]);
  return (q[0] + q[1]) + (q[2] + q[3]);
}

/// The max keys of this CTA's blocks (after the sums).
__device__ __forceinline__ uint32_t* block_max_keys(const RowCtx& ctx) {
  return reinterpret_cast<uint32_t*>(block_sums(ctx) + num_blocks(ctx));
}

/// The direct path's max keys of its blocks by 128-column step, their upper 16 bits (block b's:
/// steps 0 and 1 in [b].x, 2 and 3 in [b].y, low half first; after the block max keys): a step
/// whose upper half is below a threshold's holds no kept value, so refine_block_sums re-reads
/// only the others from global memory (min-p: a few percent of the row instead of a third).
/// The copy path keeps none: its refine reads shared memory.
__device__ __forceinline__ uint2* step_max_keys(const RowCtx& ctx) {
  return reinterpret_cast<uint2*>(block_max_keys(ctx) + num_blocks(ctx));
}

/// Shared memory a block's sum and max key take, and on the direct path its step max keys.
inline constexpr size_t kBlockBytes = sizeof(float) + sizeof(uint32_t);
inline constexpr size_t kDirectBlockBytes = kBlockBytes + kBlockSteps * sizeof(uint16_t);

// Top-p on the direct path: a histogram of the row's mass by key prefix (the exponent and
// kMassMantissa mantissa bits: bins of 1/16 octave), filled in the streaming pass with one
// shared-memory atomic per value, so that most of the rejection's candidates are decided without
// a counting pass (which reads the row from HBM again). Bin b = bits >> (23 - kMassMantissa)
// sums (s >> hist_shift) for the values there, s the 24-bit significand: exact integers,
// whatever the order of the atomics. In a bin of exponent E, every value's fixed-point weight
// floor(s 2^(E - Emax + 17)) (Emax the row max's exponent; fixed()) follows from s, so the bin's
// sum bounds the exact fixed-point mass there within 2^(hist_shift - 23) of it; the window's
// bounds are scanned from the top (mass_window) and a candidate whose bounds put the mass above
// it clearly at or below floor(p K), or clearly above, is decided (mass_verdict). Only a
// candidate in the bin of the threshold needs the counting pass: on rows of softmax(2 randn)
// over 128256 columns at p = 0.9 that bin holds ~1% of the mass at 1/8 octave, ~0.47% at 1/16,
// ~0.24% at 1/32. (1/16: 16 KB of bins, so that 4 CTAs of the direct kernel share an SM and 128
// rows run in clusters of 3; 1/32 took 32 KB and clusters of 2: H100, wave 22 of the notes.)
// Values of exponent Emax - 41 or less weigh 0 exactly.

/// Mantissa bits of the histogram's prefix, its bins (every prefix of a non-negative float
/// below +inf) and the window of prefixes whose values may weigh 1 or more (exponents
/// Emax - 40 .. Emax).
inline constexpr int kMassMantissa = 4;
inline constexpr int kMassPerOctave = 1 << kMassMantissa;
inline constexpr int kMassBins = 256 * kMassPerOctave;
inline constexpr int kMassWindow = 41 * kMassPerOctave;
/// Ranks whose histogram reads mass_window_merge has in flight at once (a cluster's 8 at most:
/// one DSMEM round trip; two ranks at a time cost 1.5 us at 128 x 128256, H100, wave 32).
inline constexpr int kMergeRanks = 8;
/// Shared memory of the direct top-p kernel's histogram and window scans.
inline constexpr size_t kMassHistBytes =
    kMassBins * sizeof(uint32_t) + (2 * kMassWindow + 2) * sizeof(unsigned long long);

/// The histogram's right shift for rows of `vocab` values: a CTA's bin sums stay below 2^32
/// (fewer than 2^c values of at most 2^(24 - shift) - 1 each, c = ceil(log2 vocab)).
__host__ __device__ constexpr int mass_hist_shift(int64_t vocab) {
  int c = 0;
  while ((int64_t{1} << c) < vocab) ++c;
  return c <= 16 ? 8 : c - 8;
}

/// Add x (>= 0, or NaN / -0.0: skipped) to the histogram unless its exponent is at most
/// floor_e (a bound below which values weigh 0: the thread's max exponent - 41). One
/// `red.shared` without a memory clobber, so the streaming loads around it keep their order.
__device__ __forceinline__ void mass_hist_add(uint32_t* h, float x, uint32_t floor_e, int shift) {
  const uint32_t u = __float_as_uint(x), e = u >> 23;
  if (e > floor_e && e < 255u) {
    asm volatile("red.shared.add.u32 [%0], %1;" ::"r"(static_cast<uint32_t>(
                     __cvta_generic_to_shared(h + (u >> (23 - kMassMantissa))))),
                 "r"(((u & 0x7fffffu) | 0x800000u) >> shift));
  }
}

/// Where mass_window leaves its results (after the histogram): for window index w (prefix
/// top - w), the lower bound of the mass strictly above prefix top - w, and the upper bound of
/// the mass at or above it; the bounds of the row's mass K (k[0] <= K <= k[1]).
struct MassScan {
  unsigned long long* above_lo;
  unsigned long long* upto_hi;
  unsigned long long* k;
};
__device__ __forceinline__ MassScan mass_scan(const RowCtx& ctx) {
  auto* base = reinterpret_cast<unsigned long long*>(ctx.hist + kMassBins);
  return MassScan{base, base + kMassWindow, base + 2 * kMassWindow};
}

/*!
 * @brief The per-thread half of mass_window (no barrier): thread first + t merges window
 *   indices 8t .. 8t + 7 over the group's histograms (two 16-byte DSMEM reads a rank), writes
 *   each bin's bounds to mass_scan's arrays and returns their sums ({0, 0} on the threads
 *   outside the window's range, e.g. below `first`, busy with other work).
 */
__device__ __forceinline__ CM mass_window_merge(const RowCtx& ctx, float mx, int first) {
  static_assert(kMassWindow <= 8 * (kThreads / 2) && kMassPerOctave % 8 == 0,
                "8 bins a thread of the block's upper half");
  const uint32_t emax = __float_as_uint(mx) >> 23;
  const bool ok = emax >= 42u && emax < 255u;
  const MassScan m = mass_scan(ctx);
  const int sh = ctx.hist_shift, top = static_cast<int>(emax) * kMassPerOctave + kMassPerOctave - 1;
  const int w0 = 8 * (ctx.tid - first);
  // Each bin's bounds go to the scan's arrays (mass_window_scan makes them running sums), so
  // that none stays in registers across the scan's barriers.
  CM part{0, 0};
  if (w0 >= 0 && w0 < kMassWindow) {
    const int b0 = top - w0 - 7;  // bins b0 .. b0 + 7 (ascending) are w0 + 7 .. w0
    unsigned long long H[8] = {};
    if (ok) {
      auto add = [&H](uint4 x, uint4 y) {
        const uint32_t h[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) H[i] += h[i];
      };
      // kMergeRanks ranks' reads in flight: a DSMEM round trip while the peers' SMs still
      // stream is slow, and the merge runs beside the locates.
      for (int r = 0; r < ctx.csize; r += kMergeRanks) {
        uint4 x[kMergeRanks], y[kMergeRanks];
#pragma unroll
        for (int k = 0; k < kMergeRanks; ++k) {
          x[k] = y[k] = make_uint4(0u, 0u, 0u, 0u);
          if (r + k < ctx.csize) {
            const uint4* a = reinterpret_cast<const uint4*>(peer(ctx, ctx.hist + b0, r + k));
            x[k] = a[0], y[k] = a[1];
          }
        }
#pragma unroll
        for (int k = 0; k < kMergeRanks; ++k) add(x[k], y[k]);
      }
    }
    const int d = (b0 / kMassPerOctave) - static_cast<int>(emax) + 17;  // -23 .. 17, one octave
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // window index w0 + i is bin b0 + 7 - i
      const unsigned long long h = H[7 - i];
      const unsigned long long T = h << sh, n = h >> (23 - sh), S = T + n * ((1ull << sh) - 1);
      unsigned long long lo, hi;
      if (d >= 0) {
        lo = T << d, hi = S << d;
      } else {
        const unsigned long long f = T >> -d;
        lo = f > n ? f - n : 0ull, hi = S >> -d;
      }
      m.above_lo[w0 + i] = lo, m.upto_hi[w0 + i] = hi;
      part.c += lo, part.m += hi;
    }
  }
  return part;
}

/// The block-wide half of mass_window: the scan of every thread's mass_window_merge part (the
/// threads that merged nothing pass {0, 0}) into the running bounds and the bounds of K. Ends
/// with a barrier; false where the bounds do not hold (see mass_window).
__device__ __forceinline__ bool mass_window_scan(const RowCtx& ctx, float mx, CM part, int first) {
  const uint32_t emax = __float_as_uint(mx) >> 23;
  const MassScan m = mass_scan(ctx);
  const int w0 = 8 * (ctx.tid - first);
  CM total;
  const CM incl = block_scan(part, ctx.s, &total);
  if (w0 >= 0 && w0 < kMassWindow) {  // each bin's bounds -> the running bounds
    unsigned long long al = incl.c - part.c, uh = incl.m - part.m;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const unsigned long long lo = m.above_lo[w0 + i];
      uh += m.upto_hi[w0 + i];
      m.above_lo[w0 + i] = al, m.upto_hi[w0 + i] = uh;
      al += lo;
    }
  }
  if (ctx.tid == 0) m.k[0] = total.c, m.k[1] = total.m;
  __syncthreads();
  return emax >= 42u && emax < 255u;
}

/*
 * mass_window (mass_window_merge, then mass_window_scan). Group-wide, after the exchange that
 *   follows fill_block_sums<true> (every rank's histogram is complete): merge the group's histograms over the window below the row max
 *   `mx` (>= 0) and scan the bounds of the exact fixed-point masses (fixed(), scale 2^(40 - e))
 *   from the top into mass_scan. In a bin of exponent E with sum H (shift sh): the values'
 *   significands sum to S in [H 2^sh, H 2^sh + n (2^sh - 1)], n <= H >> (23 - sh) values; with
 *   d = E - Emax + 17 their weights sum to S 2^d exactly (d >= 0), else to within n below
 *   floor(S / 2^-d). Returns false where the bounds do not hold (a max below 2^-85, whose
 *   subnormals may weigh something, or not finite): no verdict is then asked. Ends with a
 *   barrier. The direct top-p kernel runs the merge on the warps that do not locate candidates.
 */

/// top_p_rejection's limit floor(p K), computed as its exact test computes it (monotone in K).
__device__ __forceinline__ unsigned long long top_p_limit(float top_p, unsigned long long K) {
  return static_cast<unsigned long long>(floor(static_cast<double>(top_p) * static_cast<double>(K)));
}

/// The verdict of mass_window's bounds on a candidate of key `key` of a row whose max has
/// exponent field emax: 2 kept (the mass above it is at most floor(p K) for any K the bounds
/// allow), 1 rejected (above it for any), 0 undecided (the counting pass decides).
__device__ __forceinline__ unsigned mass_verdict(const RowCtx& ctx, uint32_t key, uint32_t emax,
                                                 float top_p) {
  const MassScan m = mass_scan(ctx);
  const unsigned long long k_lo = m.k[0], k_hi = m.k[1];
  const int w = static_cast<int>(emax) * kMassPerOctave + kMassPerOctave - 1 -
                static_cast<int>(key >> (24 - kMassMantissa));
  if (w < 0) return 0u;
  // Below the window a value weighs 0: everything in the window is above it.
  const unsigned long long above = w < kMassWindow ? m.above_lo[w] : k_lo;
  const unsigned long long upto = w < kMassWindow ? m.upto_hi[w] : k_hi;
  if (upto <= top_p_limit(top_p, k_lo)) return 2u;
  if (above > top_p_limit(top_p, k_hi)) return 1u;
  return 0u;
}

/// What fill_block_sums saw on this thread: the max of the mapped values (NaNs skipped) and
/// whether a block sum was NaN (a NaN the map kept).
struct BlockStats {
  float max;
  bool nan;
};

/*!
 * @brief Block-wide: map every value of the chunk by `map` (stored back where it changes) and
 *   write each block's kept (key >= t) sum S_b and max key to block_sums / block_max_keys; ends
 *   with a barrier. Summed with t = 0 before a threshold is known, refine_block_sums keeps the
 *   sums of the threshold found later.
 */
template <bool kHist = false, typename Map>
__device__ __forceinline__ BlockStats fill_block_sums(const RowCtx& ctx, uint32_t t, Map map) {
  float* sums = block_sums(ctx);
  uint32_t* max_keys = block_max_keys(ctx);
  const int lane = ctx.tid & 31, warp = ctx.tid >> 5, nw = ctx.nthreads >> 5;
  const int nb = num_blocks(ctx);
  BlockStats st{-INFINITY, false};
  for (int b = warp; b < nb; b += nw) {
    float4 v[kBlockSteps];
    block_lane<true>(ctx, b, lane, map, v);
    uint32_t mk;
    if (ctx.direct) {  // the max key of each step, and of the block as their max
      uint32_t sk[kBlockSteps];
#pragma unroll
      for (int q = 0; q < kBlockSteps; ++q) {
        const float m = fmaxf(fmaxf(v[q].x, v[q].y), fmaxf(v[q].z, v[q].w));
        st.max = fmaxf(st.max, m);
        sk[q] = __reduce_max_sync(0xffffffffu, ctx.key(m));
        if constexpr (kHist) {  // (st.max >= 0 here: the values are clamped, NaNs skipped)
          const uint32_t e = __float_as_uint(st.max) >> 23, floor_e = e > 41u ? e - 41u : 0u;
          mass_hist_add(ctx.hist, v[q].x, floor_e, ctx.hist_shift);
          mass_hist_add(ctx.hist, v[q].y, floor_e, ctx.hist_shift);
          mass_hist_add(ctx.hist, v[q].z, floor_e, ctx.hist_shift);
          mass_hist_add(ctx.hist, v[q].w, floor_e, ctx.hist_shift);
        }
      }
      mk = max(max(sk[0], sk[1]), max(sk[2], sk[3]));
      static_assert(kBlockSteps == 4, "the step keys' upper halves fill one uint2");
      if (lane == 0)
        step_max_keys(ctx)[b] = make_uint2(sk[0] >> 16 | (sk[1] >> 16) << 16,
                                           sk[2] >> 16 | (sk[3] >> 16) << 16);
    } else {
      float m = -INFINITY;
#pragma unroll
      for (int q = 0; q < kBlockSteps; ++q) m = fmaxf(m, fmaxf(fmaxf(v[q].x, v[q].y), fmaxf(v[q].z, v[q].w)));
      st.max = fmaxf(st.max, m);
      mk = __reduce_max_sync(0xffffffffu, ctx.key(m));
    }
    float k[4 * kBlockSteps];
    lane_kept(ctx, v, t, k);
    const float sum = warp_sum_f(lane_sum(k));
    st.nan |= isnan(sum);
    if (lane == 0) sums[b] = sum, max_keys[b] = mk;
  }
  __syncthreads();
  return st;
}

/*!
 * @brief Block-wide: turn fill_block_sums's t = 0 sums into the kept (key >= t) sums: 0 for a
 *   block whose max key is below t, recomputed (the same order, so the same bits as summing
 *   with t from the start) for a block that holds a kept element; on the direct path from only
 *   its steps that may hold one (step_max_keys: the others' values are all dropped, and zeros
 *   add exactly). After a top-k or min-p threshold few blocks hold one: no pass over the chunk.
 *   Ends with a barrier.
 */
__device__ __forceinline__ void refine_block_sums(const RowCtx& ctx, uint32_t t) {
  if (t == 0) return;
  float* sums = block_sums(ctx);
  const uint32_t* max_keys = block_max_keys(ctx);
  const int lane = ctx.tid & 31, warp = ctx.tid >> 5, nw = ctx.nthreads >> 5;
  const int nb = num_blocks(ctx);
  for (int b = warp; b < nb; b += nw) {
    float sum = 0.f;
    if (max_keys[b] >= t) {  // warp-uniform
      float4 v[kBlockSteps];
      if (ctx.direct) {
        const uint2 sk = step_max_keys(ctx)[b];
        const uint32_t th = t >> 16, m[kBlockSteps] = {sk.x & 0xffffu, sk.x >> 16,
                                                       sk.y & 0xffffu, sk.y >> 16};
#pragma unroll
        for (int q = 0; q < kBlockSteps; ++q)
          v[q] = m[q] >= th ? lane_quad<false>(ctx, b * kBlockCols + q * 128 + lane * 4,
                                               [](float x) { return x; })
                            : make_float4(0.f, 0.f, 0.f, 0.f);
      } else {
        block_lane<false>(ctx, b, lane, [](float x) { return x; }, v);
      }
      float k[4 * kBlockSteps];
      lane_kept(ctx, v, t, k);
      sum = warp_sum_f(lane_sum(k));
    }
    if (lane == 0) sums[b] = sum;
  }
  __syncthreads();
}

/// Arrive at the cluster barrier that the kernel's last cluster_wait completes: the CTA has read
/// the last of its peers' shared memory.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
#endif
}

/// This warp's blocks [d.s0, d.s1) of the chunk (contiguous) and, on every lane, its lanes'
/// shares of their fixed-point weights (the warp's sum is theirs).
__device__ __forceinline__ unsigned long long warp_block_masses(const RowCtx& ctx, DrawPrefix* d) {
  const float* sums = block_sums(ctx);
  const int lane = ctx.tid & 31, warp = ctx.tid >> 5, nw = ctx.nthreads >> 5;
  const int nb = num_blocks(ctx), per = (nb + nw - 1) / nw;
  d->s0 = min(nb, warp * per);
  d->s1 = min(nb, d->s0 + per);
  unsigned long long mine = 0;
  for (int b = d->s0 + lane; b < d->s1; b += 32) mine += ctx.fixed(sums[b]);
  return mine;
}

/*!
 * @brief Group-wide, after fill_block_sums: the row's kept mass K = sum of W_b, and this warp's
 *   share of it (blocks [s0, s1), contiguous, and the mass before them in column order). Where
 *   its exchange is the row's last (`last`), a clustered CTA then arrives at the cluster barrier
 *   (the kernel waits on it before it exits), so no CTA waits for the peers' locate.
 */
__device__ __forceinline__ DrawPrefix block_prefix(const RowCtx& ctx, int slot, bool last = true) {
  DrawPrefix d;
  const unsigned long long mine = warp_block_masses(ctx, &d);
  prefix_of_warp_masses(ctx, mine, slot, &d);
  if (last && ctx.clustered) cluster_arrive();
  return d;
}

/// The columns of a full chunk of the row (every rank's but the last; one CTA: the row's).
__device__ __forceinline__ int64_t full_chunk(const RowCtx& ctx) {
  return ctx.rank ? ctx.begin / ctx.rank : ctx.n;
}

/// The columns of rank r's chunk of the row (every rank's chunk but the last is full).
__device__ __forceinline__ int64_t rank_columns(const RowCtx& ctx, int64_t vocab, int r,
                                                int64_t* begin) {
  const int64_t chunk = full_chunk(ctx);
  *begin = r * chunk;
  return min(chunk, vocab - *begin);
}

/// Lane `lane`'s block sums b0 + 32 k + lane (k < 4) of `sums` (nb of them; 0 past the end):
/// four DSMEM loads in flight.
__device__ __forceinline__ void lane_block_sums4(const float* sums, int b0, int nb, int lane,
                                                 float (&w)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) w[k] = b0 + 32 * k + lane < nb ? sums[b0 + 32 * k + lane] : 0.f;
}

/*!
 * @brief block_prefix without its exchange, where every rank's block sums are final since the
 *   group's last barrier (fill_block_sums's t = 0 sums of probabilities, after the exchange of
 *   the max): every CTA reads its peers' sums from distributed shared memory (the same offset
 *   on every rank) and adds their fixed-point weights itself. Integer sums: K and the prefix
 *   are block_prefix's, bit for bit, with one group barrier less. Warp w adds ranks w, w + 8,
 *   ... into wsum[16 + rank] (ranks <= 16; wsum[0, 8) hold the warps' own masses).
 */
__device__ __forceinline__ DrawPrefix block_prefix_peers(const RowCtx& ctx, int64_t vocab) {
  static_assert(kThreads / 32 <= 16, "wsum[16 + rank] past the warps' slots");
  const float* sums = block_sums(ctx);
  const int lane = ctx.tid & 31, warp = ctx.tid >> 5, nw = ctx.nthreads >> 5;
  DrawPrefix d;
  const unsigned long long mine = warp_block_masses(ctx, &d);
  d.mine = warp_sum_u(mine);
  if (lane == 0) ctx.s->wsum[warp] = d.mine;
  for (int r = warp; r < ctx.csize; r += nw) {
    int64_t begin;
    const int64_t n = rank_columns(ctx, vocab, r, &begin);
    const int nbr = static_cast<int>((n + kBlockCols - 1) / kBlockCols);
    const float* ps = peer(ctx, sums, r);
    unsigned long long m = 0;
    for (int b0 = 0; b0 < nbr; b0 += 128) {
      float w4[4];
      lane_block_sums4(ps, b0, nbr, lane, w4);
#pragma unroll
      for (int k = 0; k < 4; ++k) m += ctx.fixed(w4[k]);
    }
    m = warp_sum_u(m);
    if (lane == 0) ctx.s->wsum[16 + r] = m;
  }
  __syncthreads();
  unsigned long long warp_before = 0, before = 0, K = 0;
  for (int w = 0; w < warp; ++w) warp_before += ctx.s->wsum[w];
  for (int r = 0; r < ctx.csize; ++r) {
    if (r == ctx.rank) before = K;
    K += ctx.s->wsum[16 + r];
  }
  d.K = K;
  d.before = before + warp_before;
  if (ctx.clustered) cluster_arrive();
  return d;
}

/// Warp-wide: the column of block b's kept element where the block's float running sum (lanes
/// in order, a lane's 16 values in order) first exceeds lb / scale (lb < W_b), on the lane that
/// holds it (-1 elsewhere; *value, where given, its value on that lane). Where rounding puts the
/// target past the block's float sum, the block's last element of positive weight.
__device__ __forceinline__ int64_t block_column(const RowCtx& ctx, uint32_t t, int b,
                                                unsigned long long lb, float* value = nullptr) {
  const int lane = ctx.tid & 31;
  float4 v[kBlockSteps];
  block_lane<false>(ctx, b, lane, [](float x) { return x; }, v);
  float k[4 * kBlockSteps];
  lane_kept(ctx, v, t, k);
  const float ls = lane_sum(k);
  float incl = ls;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  float excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) excl = 0.f;
  const float tf = __fdiv_rn(static_cast<float>(lb), ctx.scale);  // exact: scale is 2^j
  const unsigned hit = __ballot_sync(0xffffffffu, incl > tf);
  const unsigned pos = __ballot_sync(0xffffffffu, ls > 0.f);  // W_b > 0: some lane's sum is
  const int src = hit ? __ffs(hit) - 1 : 31 - __clz(pos);
  if (lane != src) return -1;
  float a = excl;
  int last = 0;
#pragma unroll
  for (int i = 0; i < 4 * kBlockSteps; ++i) {
    if (k[i] > 0.f) {
      if (hit && a + k[i] > tf) {
        last = i;
        break;
      }
      last = i;
      a += k[i];
    }
  }
  if (value) {  // its value as read (a static index: k stays in registers)
    float x = k[0];
#pragma unroll
    for (int i = 1; i < 4 * kBlockSteps; ++i) x = i == last ? k[i] : x;
    *value = x;
  }
  return ctx.begin + b * kBlockCols + (last >> 2) * 128 + lane * 4 + (last & 3);
}

/// Warp-wide, one weight w a lane (in order): the first lane whose running sum exceeds `local`
/// and the weights before it (src -1 where the warp's weights do not reach it: `before` is then
/// their total).
struct WarpFind {
  int src;
  unsigned long long before;
};
__device__ __forceinline__ WarpFind warp_find(unsigned long long w, unsigned long long local) {
  const unsigned long long incl = warp_scan_u(w);
  const unsigned long long tot = __shfl_sync(0xffffffffu, incl, 31);
  if (local >= tot) return WarpFind{-1, tot};
  const int src = __ffs(__ballot_sync(0xffffffffu, incl > local)) - 1;
  return WarpFind{src, __shfl_sync(0xffffffffu, incl - w, src)};
}

/*!
 * @brief The draw with 32-bit uniform r from block_prefix's d: target = floor(r K / 2^32), the
 *   block whose running W exceeds it (a warp scan of the owning warp's block masses), then the
 *   element in the block (block_column). The column on the thread that finds it, -1 elsewhere.
 *   Warp-local.
 */
__device__ __forceinline__ int64_t block_locate(const RowCtx& ctx, uint32_t t,
                                                const DrawPrefix& d, uint32_t r) {
  if (d.K == 0) return -1;
  const unsigned long long target = __umul64hi(d.K, static_cast<unsigned long long>(r) << 32);
  if (target < d.before || target >= d.before + d.mine) return -1;
  const int lane = ctx.tid & 31;
  const float* sums = block_sums(ctx);
  unsigned long long local = target - d.before;
  for (int b0 = d.s0; b0 < d.s1; b0 += 32) {
    const WarpFind f = warp_find(b0 + lane < d.s1 ? ctx.fixed(sums[b0 + lane]) : 0ull, local);
    if (f.src >= 0) return block_column(ctx, t, b0 + f.src, local - f.before);
    local -= f.before;
  }
  return -1;  // unreachable: the warp's mass exceeds local
}

/// The warps that weigh a row's block sums together in locate_in_row (named barrier 1), and the
/// most blocks a row may have there (their sums staged in Shared::mass, the 32-block totals in
/// Shared::cnt): rows of up to 786432 columns take the direct path.
inline constexpr int kLocateWarps = 4;
inline constexpr int kLocateMaxBlocks = 1536;
static_assert(sizeof(Shared::mass) >= kLocateMaxBlocks * sizeof(float) &&
                  sizeof(Shared::cnt) >= kLocateMaxBlocks / 32 * sizeof(unsigned long long),
              "locate_in_row's staging");

/// Where locate_in_row stages a row's nb block sums (in groups of 32, ng of them) and the groups'
/// fixed-point totals: where the radix search counts (clear_locate_staging before a search).
struct LocateStaging {
  float* sums;
  unsigned long long* totals;
  int nb, ng;
};
__device__ __forceinline__ LocateStaging locate_staging(const RowCtx& ctx, int64_t vocab) {
  const int nb = static_cast<int>((vocab + kBlockCols - 1) / kBlockCols);
  return LocateStaging{reinterpret_cast<float*>(ctx.s->mass),
                       reinterpret_cast<unsigned long long*>(ctx.s->cnt), nb, (nb + 31) / 32};
}

/// Zero what locate_in_row staged in Shared::cnt and ::mass (clean before a radix search).
/// Block-wide; ends with a barrier.
__device__ __forceinline__ void clear_locate_staging(const RowCtx& ctx, int64_t vocab) {
  const LocateStaging st = locate_staging(ctx, vocab);
  for (int i = ctx.tid; i < 32 * st.ng; i += ctx.nthreads) st.sums[i] = 0.f;
  for (int i = ctx.tid; i < st.ng; i += ctx.nthreads) st.totals[i] = 0ull;
  __syncthreads();
}

/*!
 * @brief On the direct path, by the threads tid < 32 kLocateWarps of a CTA once every rank's
 *   block sums are final (fill_block_sums's t = 0 sums since the exchange of the max,
 *   refine_block_sums's after a group barrier; ctx.vals: this rank's chunk of the row in global
 *   memory): the draw with 32-bit uniform r from the whole row, no block prefix and no group
 *   barrier. Warp w reads the block sums of groups w, w + kLocateWarps, ... of 32 consecutive
 *   blocks from the ranks that own them (DSMEM, coalesced), stages them in shared memory with
 *   each group's fixed-point total; after one barrier of those warps, each warp that `draws`
 *   adds the totals into K and finds target = floor(r K / 2^32): the group, the block in it, and
 *   the element by block_column (keys >= t kept). The integers are block_locate's (K and the
 *   weights before the block), so the column is the one the owning rank's block_locate finds.
 *   Returns it and its value on the lane that finds it, -1 elsewhere, where K = 0 and on the
 *   warps that only weigh; *K_out (drawing warps): K.
 */
__device__ __forceinline__ int64_t locate_in_row(const RowCtx& ctx, int64_t vocab, uint32_t t,
                                                 uint32_t r, bool draws, float* value,
                                                 unsigned long long* K_out = nullptr) {
  const int lane = ctx.tid & 31, warp = ctx.tid >> 5;
  // Every rank's chunk but the last holds nbr whole blocks (plan_direct; one CTA: all of the
  // row's): block g of the row is block g % nbr of rank g / nbr.
  const int nbr = static_cast<int>((full_chunk(ctx) + kBlockCols - 1) / kBlockCols);
  const LocateStaging st = locate_staging(ctx, vocab);
  const int nb = st.nb, ng = st.ng;
  float* stage = st.sums;
  unsigned long long* gtot = st.totals;
  const float* sums = block_sums(ctx);
  for (int g0 = warp; g0 < ng; g0 += 2 * kLocateWarps) {  // two groups' loads in flight
    const int gr[2] = {g0, g0 + kLocateWarps};
    float x[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int g = 32 * gr[k] + lane;
      x[k] = g < nb ? *peer(ctx, sums + g % nbr, g / nbr) : 0.f;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (gr[k] >= ng) break;
      stage[32 * gr[k] + lane] = x[k];
      const unsigned long long w = ctx.fixed(x[k]);
      unsigned long long tot;
      if (!__any_sync(0xffffffffu, (w >> 51) != 0)) {
        // A block weighs below 2^51 (its sum is at most 512 times the row max, which scales
        // below 2^41): the total of two 26-bit halves in u32 warp reductions, exactly.
        const unsigned lo = __reduce_add_sync(0xffffffffu, static_cast<unsigned>(w) & 0x3ffffffu);
        const unsigned hi = __reduce_add_sync(0xffffffffu, static_cast<unsigned>(w >> 26));
        tot = (static_cast<unsigned long long>(hi) << 26) + lo;
      } else {  // +inf sums (fixed() saturates): the u64 sum, wrapping as elsewhere
        tot = warp_sum_u(w);
      }
      if (lane == 0) gtot[gr[k]] = tot;
    }
  }
  asm volatile("bar.sync 1, %0;" ::"n"(32 * kLocateWarps) : "memory");
  if (!draws) return -1;
  unsigned long long K = 0;
  for (int c = lane; c < ng; c += 32) K += gtot[c];
  K = warp_sum_u(K);
  if (K_out) *K_out = K;
  if (K == 0) return -1;
  unsigned long long local = __umul64hi(K, static_cast<unsigned long long>(r) << 32);
  for (int c0 = 0; c0 < ng; c0 += 32) {  // the group, then the block in it
    const WarpFind f = warp_find(c0 + lane < ng ? gtot[c0 + lane] : 0ull, local);
    if (f.src < 0) {
      local -= f.before;
      continue;
    }
    const int grp = c0 + f.src;
    const WarpFind b = warp_find(ctx.fixed(stage[32 * grp + lane]), local - f.before);
    RowCtx o = ctx;  // the whole row
    o.vals = ctx.vals - ctx.begin, o.begin = 0, o.n = static_cast<int>(vocab);
    return block_column(o, t, 32 * grp + b.src, local - f.before - b.before, value);
  }
  return -1;  // unreachable: target < K
}

/// Sums over the row's group of this CTA's arr[j], j < N, into s->cand_sum (every thread may
/// read them on return). Starts with a group barrier: write arr first.
template <int N>
__device__ __forceinline__ void group_sum_candidates(const RowCtx& ctx, unsigned long long* arr) {
  row_sync(ctx);
  const int j = ctx.tid >> 4, r = ctx.tid & 15;  // 16 lanes per value, one per rank
  if (ctx.tid < (N * 16 + 31) / 32 * 32) {       // whole warps: the shuffles take all lanes
    unsigned long long v = j < N && r < ctx.csize ? *peer(ctx, arr + j, r) : 0ull;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (r == 0 && j < N) ctx.s->cand_sum[j] = v;
  }
  __syncthreads();
}

/// This thread's share of top-p's counting pass: above[j] += fixed(x) for the values x whose key
/// is above candidate j's, and (kTotal) *total += fixed(x) for every value.
template <bool kTotal>
__device__ __forceinline__ void count_above(const RowCtx& ctx,
                                            const uint32_t (&key)[kTopPCandidates],
                                            uint32_t lowest,
                                            unsigned long long (&above)[kTopPCandidates],
                                            unsigned long long* total) {
  unsigned long long tot = 0;
  for_each_value(ctx, [&](float x) {
    const uint32_t k = ctx.key(x);
    if (!kTotal && k <= lowest) return;  // below every candidate: no conversion
    const unsigned long long w = ctx.fixed(x);
    if (kTotal) tot += w;
#pragma unroll
    for (int j = 0; j < kTopPCandidates; ++j)
      if (k > key[j]) above[j] += w;
  });
  *total = tot;
}

/*!
 * @brief Top-p on the direct path, for a candidate of key `key` that mass_verdict left
 *   undecided (its prefix holds the threshold): the group's exact fixed-point mass above it,
 *   one pass over the chunk with one accumulator and no branch per value (a warp's lanes would
 *   take both sides), against floor(p K) at mass_window's bounds of K: 2 kept, 1 rejected, 0
 *   still undecided (the mass within ~2^-14 K of the limit: the counting pass decides). One
 *   group exchange (slot `slot` of xu). Group-wide.
 */
__device__ __forceinline__ unsigned top_p_one(const RowCtx& ctx, uint32_t key, float top_p,
                                              int slot) {
  unsigned long long a[4] = {0, 0, 0, 0};  // one per value of a quad: four independent chains
  auto add = [&](unsigned long long& acc, float x) {
    const unsigned long long w = ctx.fixed(x);
    acc += ctx.key(x) > key ? w : 0ull;
  };
  // 8 loads a batch: the pass runs for one row while the others are done, so HBM latency, not
  // bandwidth, sets its time (~31 quads a thread at 128256 columns in clusters of 4). (The
  // compiler keeps ~4 in flight at the kernel's register cap; all 8 in flight by one asm block,
  // with or without a bulk L2 prefetch of the chunk, spilled and was slower for every seed:
  // wave 32.)
  for_each_direct_quad<8>(
      ctx, [&](float4 x) { add(a[0], x.x), add(a[1], x.y), add(a[2], x.z), add(a[3], x.w); },
      [&](float x) { add(a[0], x); });
  CM total;
  block_scan(CM{0, (a[0] + a[1]) + (a[2] + a[3])}, ctx.s, &total);
  unsigned long long before;
  const unsigned long long A = cluster_sum_u(ctx, total.m, slot, &before);
  const MassScan m = mass_scan(ctx);
  if (A <= top_p_limit(top_p, m.k[0])) return 2u;
  if (A > top_p_limit(top_p, m.k[1])) return 1u;
  return 0u;
}

/*!
 * @brief Top-p by rejection: draw a candidate x from the whole row (the block draw, t = 0, of
 *   fill_block_sums's sums) and keep it when it is in the top-p set, i.e. when the mass of the
 *   elements with a larger key, A(x), is below the radix search's target floor(p K) + 1 (K the
 *   row's per-element fixed-point mass, as the search's histograms sum it). The two agree
 *   exactly: radix_search keeps key >= t for the largest t with F(t) >= target (F(t) the mass of
 *   keys >= t). key(x) >= t: A(x) = F(key(x) + 1) < target, since key(x) + 1 > t; key(x) < t:
 *   A(x) >= F(t) >= target. Ties with x are never above it, so they are kept or rejected
 *   together, as the threshold keeps or drops them. A kept draw is distributed as the top-p set
 *   renormalized (the plain draw from the whole row restricted to a set); its probability is the
 *   set's mass, >= p.
 *
 *   kTopPPasses passes of kTopPCandidates candidates each (Philox outputs 0, 1, ... of the row):
 *   locating them is warp-local (block_locate, from one block prefix of the row), then one
 *   barrier broadcasts their keys, one pass over the chunk sums A for all of them (the first
 *   pass also K) and one barrier adds the group's sums; the first kept candidate in draw order
 *   wins. On the direct path (ctx.hist: the mass histogram of the streaming pass) every CTA
 *   asks mass_verdict about the exchanged keys first; an undecided candidate (its prefix holds
 *   the threshold) gets top_p_one's pass for it alone, and only one that pass leaves undecided
 *   the counting pass. The samples are the counting pass's, bit for bit. The direct kernel
 *   (kDirect) has its locating warps weigh the row's block sums together (locate_in_row: no
 *   block prefix, no group barrier before the locates) and takes each candidate's value from
 *   its locate.
 *   Returns true when one was kept (*col its column on the CTA that writes it, -1 on the
 *   others; *arrived: the CTA arrived at the kernel's last cluster barrier, as soon as the
 *   histogram kept a candidate on the direct path) or the row has no mass (*col 0 on rank 0);
 *   false: the caller searches the threshold and draws with Philox output
 *   kTopPCandidates * kTopPPasses. ctx.scale set (mx: the row max, >= 0); the block sums filled
 *   with t = 0.
 */
template <bool kDirect>
__device__ __forceinline__ bool top_p_rejection(const RowCtx& ctx, float top_p,
                                                const RngArgs& rng_args, int64_t row,
                                                float mx, int64_t vocab,
                                                int64_t* col, bool* arrived) {
  Shared* s = ctx.s;
  constexpr int C = kTopPCandidates;
  *col = -1;
  *arrived = false;
  // The direct path (probabilities only: sample_direct): every rank's block sums are final
  // since the exchange of the max, and every CTA can read the row: each locates every candidate
  // itself (no exchange of the keys). (The direct kernel only: in the copy kernel, at its
  // register cap, the same code spills.)
  constexpr bool anywhere = kDirect;
  static_assert(kLocateWarps == C, "the locating warps weigh the row's blocks together");
  // The direct path's histogram bounds (mass_window): most candidates decided without a pass.
  // Where every CTA locates every candidate, the warps above the locating ones merge the window
  // while the first candidates are located.
  const bool window = ctx.hist != nullptr && top_p < 1.f;  // (the direct path's only)
  bool hist = false;
  const uint32_t emax = __float_as_uint(mx) >> 23;
  // Where every CTA locates every candidate, the locating warps weigh the row's blocks
  // themselves (locate_in_row): no block prefix, no group barrier before the locates.
  DrawPrefix d{};
  if (!anywhere) {
    d = block_prefix(ctx, 0, false);
    if (d.K == 0) {  // nothing to draw from
      if (ctx.rank == 0 && ctx.tid == 0) *col = 0;
      return true;
    }
  }
  const int lane = ctx.tid & 31, warp = ctx.tid >> 5, nw = ctx.nthreads >> 5;
  unsigned long long limit = 0;  // floor(p K): after the first counting pass's exchange
  bool counted = false;          // K summed (the first counting pass)
  for (int pass = 0; pass < kTopPPasses; ++pass) {
    if (anywhere) {  // warp j locates candidate j (every CTA every candidate)
      CM part{0, 0};
      if (warp < C) {
        Philox rng = rng_args.make(row, static_cast<uint64_t>(pass) * C);
        uint32_t u = rng.next();
        for (int j = 1; j <= warp; ++j) u = rng.next();
        // The previous pass's verdicts read cand_col / cand_sum before its last barrier.
        if (lane == 0) s->cand_col[warp] = -1;
        __syncwarp();
        float x;
        const int64_t c = locate_in_row(ctx, vocab, 0, u, true, &x);
        if (c >= 0) s->cand_col[warp] = c, s->cand_sum[warp] = ctx.key(x);
      } else if (pass == 0 && window) {
        part = mass_window_merge(ctx, mx, C * 32);
      }
      if (pass == 0 && window) {
        hist = mass_window_scan(ctx, mx, part, C * 32);  // (its barriers publish the keys)
      } else {
        __syncthreads();
      }
    } else {
      // Peers read cand_key before the last barrier of the previous pass: safe to reset.
      if (ctx.tid < C) s->cand_col[ctx.tid] = -1, s->cand_key[ctx.tid] = 0;
      __syncthreads();
      Philox rng = rng_args.make(row, static_cast<uint64_t>(pass) * C);
#pragma unroll
      for (int j = 0; j < C; ++j) {
        const int64_t c = block_locate(ctx, 0, d, rng.next());
        if (c >= 0)
          s->cand_col[j] = c, s->cand_key[j] = ctx.key(ctx.val(static_cast<int>(c - ctx.begin)));
      }
    }
    if (anywhere && s->cand_col[0] < 0) {  // K = 0 (else every locate finds): nothing to draw
      if (ctx.rank == 0 && ctx.tid == 0) *col = 0;
      return true;
    }
    // The CTA that writes a kept candidate: the one that drew it, or rank 0 where every CTA
    // located every candidate.
    const bool writer = ctx.tid == 0 && (!anywhere || ctx.rank == 0);
    if (top_p >= 1.f) {  // floor(p K) >= K > A(x): every candidate is kept
      __syncthreads();
      if (writer) *col = s->cand_col[0];
      return true;
    }
    if (!anywhere) group_sum_candidates<C>(ctx, s->cand_key);  // exactly one CTA drew each
    if (hist) {  // the verdicts in draw order, up to the first kept candidate
      bool exact = false;
      int slot = 2;  // top_p_one's exchange slots, alternating
      for (int j = 0; j < C && !exact; ++j) {
        const uint32_t key = static_cast<uint32_t>(s->cand_sum[j]);
        unsigned v = mass_verdict(ctx, key, emax, top_p);
        if (v == 0u) {  // undecided: the mass above it alone, K at the histogram's bounds
          v = top_p_one(ctx, key, top_p, slot);
          slot ^= 1;
          exact = v == 0u;
        }
        if (v == 2u) {
          if (writer) *col = s->cand_col[j];  // -1 on the other CTAs
          if (anywhere && ctx.clustered) {  // no DSMEM read follows: the kernel's last barrier
            cluster_arrive();
            *arrived = true;
          }
          return true;
        }
      }
      if (!exact) {  // every candidate rejected
        if (anywhere) {
          __syncthreads();  // the verdicts read the keys
        } else {
          row_sync(ctx);  // the peers have read this CTA's cand_key
        }
        continue;
      }
    }
    uint32_t key[C], lowest = 0xffffffffu;
    unsigned long long above[C], total;
#pragma unroll
    for (int j = 0; j < C; ++j) {
      key[j] = static_cast<uint32_t>(s->cand_sum[j]), above[j] = 0;
      lowest = min(lowest, key[j]);
    }
    if (!counted) {
      count_above<true>(ctx, key, lowest, above, &total);
    } else {
      count_above<false>(ctx, key, lowest, above, &total);
    }
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const unsigned long long a = warp_sum_u(above[j]);
      if (lane == 0) s->cand_warp[warp][j] = a;
    }
    if (!counted) {
      const unsigned long long t = warp_sum_u(total);
      if (lane == 0) s->cand_warp[warp][C] = t;
    }
    __syncthreads();
    if (ctx.tid <= C) {
      unsigned long long a = 0;
      for (int w = 0; w < nw; ++w) a += s->cand_warp[w][ctx.tid];
      s->cand_above[ctx.tid] = a;
    }
    if (!counted) {
      group_sum_candidates<C + 1>(ctx, s->cand_above);
      limit = top_p_limit(top_p, s->cand_sum[C]);
      counted = true;
    } else {
      group_sum_candidates<C>(ctx, s->cand_above);
    }
#pragma unroll
    for (int j = 0; j < C; ++j) {
      if (s->cand_sum[j] <= limit) {
        if (writer) *col = s->cand_col[j];  // -1 on the other CTAs
        return true;
      }
    }
  }
  // The radix search that follows counts in Shared::cnt and ::mass from zero: locate_in_row's
  // staging there cleared (every read of it precedes the passes' last barriers).
  if (anywhere) clear_locate_staging(ctx, vocab);
  return false;
}

/// A set of filters (bit f for filter f): each SampleKernel instance takes one set, so the code
/// of the others is not in it. The radix search sits at the 80-register cap of
/// __launch_bounds__(kThreads, 3): a kernel that also holds code it does not run can make ptxas
/// allocate it worse (Wave 5: 8 bytes of spill in the one kernel for every filter, 0 before).
__host__ __device__ constexpr unsigned filter_bit(int f) { return 1u << f; }
__host__ __device__ constexpr bool has_filter(unsigned set, int f) {
  return f >= 0 && f < 32 && (set & filter_bit(f)) != 0;
}
/// The draw alone: no threshold (plain) or one known up front (min-p).
inline constexpr unsigned kDrawFilters = filter_bit(kNoFilter) | filter_bit(kMinP);
/// Top-p: the rejection, the radix search when it falls back. (Top-p and the top-k filters in
/// one kernel still spill 8 bytes for float32 on sm_90a; apart, neither kernel does.)
inline constexpr unsigned kTopPFilters = filter_bit(kTopP);
/// Top-k, and top-k with top-p (joint or top-k first): thresholds from the row's candidates
/// (list_candidates) or by radix select. Two kernels: with the top-p cut in the same kernel, top-k
/// spilled 24-32 bytes at the register cap and took 76.0 us against 67.8 without it (H100,
/// 128 x 128256, k = 50).
inline constexpr unsigned kTopKFilters = filter_bit(kTopK);
inline constexpr unsigned kTopKTopPFilters =
    filter_bit(kTopKTopPJoint) | filter_bit(kTopKFirstTopP);
/// Whether filter set kFilters draws by 512-column blocks. The top-k filters draw per element
/// (draw: a pass over the kept elements after the threshold) from plan_rows's chunks: in one
/// H100 call (Wave 8) their block draw, with its whole-block chunks (16384 columns on 7 of 8
/// CTAs at 128256 instead of 16032), cost 4-10% on top-k and the joint filters; summing no
/// block in the first pass won back under 1%.
template <unsigned kFilters>
inline constexpr bool kBlockDraw = kFilters != kTopKFilters && kFilters != kTopKTopPFilters;

/*!
 * @brief A lower bound for the 11-bit key prefix of a row's top-k threshold from this CTA's
 *   per-thread maxima: the prefix of its kc-th largest thread maximum, kc = ceil(k / group
 *   size), found among the kWindowBins prefixes at and below the CTA max's (0 when fewer than kc
 *   thread maxima lie there). A CTA's kc maxima are distinct elements at or above its bound, so
 *   at least k elements of the row lie at or above the group's smallest bound: the threshold
 *   does too. Block-wide; counts in histogram buffer cnt[parity] (clean before a search) and
 *   leaves it clean. `shift`: the prefix is key >> shift (kLogitShift: the finer prefix of
 *   signed keys, whose 11 bits hold only 2 of the mantissa).
 */
__device__ __forceinline__ uint32_t topk_lower_prefix(const RowCtx& ctx, uint32_t thread_max_key,
                                                      bool any, uint32_t cta_max_key, int k,
                                                      int shift = kWindowShift) {
  unsigned int* h = ctx.s->cnt[ctx.parity];
  const int kc = (k + ctx.csize - 1) / ctx.csize;
  const uint32_t top = cta_max_key >> shift, p = thread_max_key >> shift;
  const uint32_t r = p >= top ? 0u : top - p;
  const bool in = any && r < static_cast<uint32_t>(kWindowBins);
  if (in) shared_add(&h[r], 1u);
  __syncthreads();
  const unsigned long long c = ctx.tid < kBins ? h[ctx.tid] : 0u;
  CM total;
  const CM incl = block_scan(CM{c, 0}, ctx.s, &total);  // (its barriers order the reads of h)
  const int before = __syncthreads_count(ctx.tid < kBins && incl.c < static_cast<unsigned>(kc));
  if (in) h[r] = 0;
  __syncthreads();
  if (total.c < static_cast<unsigned long long>(kc) || before >= kWindowBins) return 0;
  return top - static_cast<uint32_t>(before);
}

/// The top-k mask's bound prefix shift (signed keys of logits): 14 bits (sign, exponent, 5
/// mantissa bits) make buckets of 1/32 octave and a window of ~8 octaves below the max, where
/// the 11-bit prefix's buckets (a quarter octave) hold several hundred logits of an N(0, 2) row
/// of 128256 above its top 50. H100, k = 50: mask 87.2 -> 84.8 us (main's radix path: 85.6).
inline constexpr int kLogitShift = 18;

/// The group's max of `mx`, max of `nan` and min of `lo` (one barrier; exchange slots xf[slot],
/// xf[slot + 1] and xu[6 + slot / 2]). Every thread receives the results.
__device__ __forceinline__ void group_max_nan_lo(const RowCtx& ctx, float mx, float nan,
                                                 uint32_t lo, int slot, float* mx_all,
                                                 float* nan_all, uint32_t* lo_all) {
  if (ctx.tid == 0) {
    ctx.s->xf[slot] = mx, ctx.s->xf[slot + 1] = nan;
    ctx.s->xu[6 + slot / 2] = lo;
  }
  row_sync(ctx);
  const int lane = ctx.tid & 31;
  float a = -INFINITY, b = -INFINITY;
  uint32_t l = 0xffffffffu;
  if (lane < ctx.csize) {
    a = *peer(ctx, &ctx.s->xf[slot], lane);
    b = *peer(ctx, &ctx.s->xf[slot + 1], lane);
    l = static_cast<uint32_t>(*peer(ctx, &ctx.s->xu[6 + slot / 2], lane));
  }
  *mx_all = warp_max(a);
  *nan_all = warp_max(b);
  *lo_all = __reduce_min_sync(0xffffffffu, l);
}

/// Load, filter and draw one token for output row `out_row`. Group-wide. Returns whether this
/// CTA arrived at the cluster barrier (block_prefix): the kernel then waits on it to exit.
/// kDirect: SampleKernel's direct path (float32 probabilities read where they lie).
template <typename T, unsigned kFilters, bool kDirect = false>
__device__ __forceinline__ bool sample_row(RowCtx& ctx, const T* __restrict__ in, int64_t stride,
                                           int64_t vocab, bool vec, const SampleParams& p,
                                           int64_t out_row) {
  const int64_t in_row = p.rows(out_row);
  const bool row_ok = in_row >= 0 && in_row < p.rows.num_in_rows;
  const bool is_probs = !p.logits;
  // The filter, known false at compile time for those this kernel does not take.
  const int filter = p.filter;
  auto is = [filter](int x) { return has_filter(kFilters, x) && filter == x; };
  auto stamp = [](SampleTrace e) {  // the trace probe: the draw set's kernels only
    if (kFilters == kDrawFilters) trace(e);
  };
  // Top-p on the direct path: the mass histogram of the streaming pass.
  constexpr bool kHist = kDirect && kFilters == kTopPFilters;
  // The draw's block sums in the first pass (top-p's rejection draws its candidates from them);
  // the top-k filters sum none (kBlockDraw).
  const bool sums_first = kBlockDraw<kFilters>;
  float mx = -INFINITY;
  bool nan = false;
  // The top-k filters' lower bound for their threshold's key prefix (topk_lower_prefix): the
  // candidates' bound (list_candidates) and round 0 of the radix search's (its shared-memory
  // atomics then only for the keys near the top). Probabilities only: the top-k filters from
  // logits run on torch.softmax's probabilities (the contract's bit-exact parity).
  const int k_row = !kBlockDraw<kFilters> ? p.top_k(out_row) : 0;
  const bool bound = !kBlockDraw<kFilters> && is_probs && row_ok && k_row > 0 && k_row < vocab &&
                     (is(kTopK) || is(kTopKTopPJoint) || is(kTopKFirstTopP));
  uint32_t lo = 0;
  if (row_ok) {
    if (ctx.direct) {  // float32 probabilities only (SampleFilters)
      if constexpr (std::is_same_v<T, float>)
        ctx.vals = const_cast<float*>(in + in_row * stride) + ctx.begin;
    } else {
      load_chunk<T>(ctx, in + in_row * stride, vec);
    }
    stamp(kTraceLoaded);
    if (is_probs && sums_first) {
      // Negatives clamped to 0, the draw's block sums (they do not depend on the row's max,
      // only their fixed-point weights do). A NaN stays (its block's sum shows it): the row is
      // then not drawn from.
      const BlockStats st =
          fill_block_sums<kHist>(ctx, 0, [](float x) { return RowCtx::nonneg(x); });
      nan = __syncthreads_or(st.nan);
      mx = block_max(st.max, ctx.s);
      stamp(kTraceFilled);
    } else if (bound) {
      float tm;
      bool any;
      mx = first_pass_threads(ctx, true, [](float x) { return fmaxf(x, 0.f); }, &nan, &tm, &any);
      lo = topk_lower_prefix(ctx, ctx.key(tm), any, ctx.key(mx), k_row);
    } else {
      mx = first_pass(ctx, is_probs, [](float x) { return fmaxf(x, 0.f); }, &nan);
    }
  }
  float nan_f;
  if (bound) {
    group_max_nan_lo(ctx, mx, nan ? 1.f : 0.f, lo, 0, &mx, &nan_f, &lo);
  } else {
    cluster_reduce2_f(ctx, mx, nan ? 1.f : 0.f, 0, true, &mx, &nan_f);
  }
  const bool any_nan = nan_f > 0.f;
  stamp(kTraceExchanged);
  int64_t col = -1;
  bool arrived = false;
  if (row_ok && !any_nan) {
    if (is_probs) {
      mx = fmaxf(mx, 0.f);
    } else {  // logits: weights exp(x - max), max weight 1
      const bool dead = isinf(mx) && mx < 0;
      const float m = mx;
      auto weight = [dead, m](float x) { return dead ? 0.f : __expf(x - m); };
      if (sums_first) {
        fill_block_sums(ctx, 0, weight);  // the weights and the draw's block sums in one pass
      } else {
        for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) ctx.vals[i] = weight(ctx.vals[i]);
        __syncthreads();
      }
      mx = dead ? 0.f : 1.f;
    }
    ctx.scale = fixed_scale(mx);
    if (is(kTopP) && top_p_rejection<kDirect>(ctx, p.top_p(out_row), p.rng, out_row, mx, vocab,
                                              &col, &arrived)) {
      if (col >= 0) write_sample(p.out, p.out_64, p.valid, out_row, col, true);
      return arrived;
    }
    const uint32_t max_key = key_nonneg(mx);
    uint32_t t = 0;
    if (is(kMinP)) {
      t = key_nonneg(p.min_p(out_row) * mx);
    }
    const uint32_t floor_key = lo << kWindowShift;
    if (bound && floor_key > 0) {
      // The top-k filters from the row's candidates (at or above the bound): rank 0 gathers
      // the list in column order, finds the thresholds and draws from it; the others are done
      // once they have shown their lists. The joint filter's top-p needs the row's whole mass.
      const bool joint = is(kTopKTopPJoint);
      unsigned long long row_mass = 0;
      const int n = list_candidates(ctx, floor_key, joint ? &row_mass : nullptr);
      const int N = gather_candidates(ctx, n, k_row, 4, ctx.rank == 0, &row_mass);
      if (N >= 0) {
        if (ctx.clustered) cluster_arrive();  // peers' lists read (rank 0) or not needed
        if (ctx.rank != 0) return ctx.clustered;
        const Threshold th = list_select(ctx, N, static_cast<unsigned int>(k_row), !is(kTopK),
                                         true, floor_key, true);
        uint32_t tk = th.key;
        if (!is(kTopK)) {
          // Top-p's target: p times the top-k set's mass (top-k first) or the row's (joint);
          // where the top-k set reaches it, its threshold lies in the list.
          const double P = static_cast<double>(p.top_p(out_row)) *
                           static_cast<double>(joint ? row_mass : th.kept.m);
          const unsigned long long target = static_cast<unsigned long long>(floor(P)) + 1ull;
          if (th.kept.m >= target) tk = max(tk, list_mass_select(ctx, N, tk, target));
        }
        Philox rng = p.rng.make(out_row, 0);
        unsigned long long K;
        col = list_draw(ctx, N, tk, rng.next(), &K);
        if (K == 0 && ctx.tid == 0) col = 0;  // nothing to draw from
        if (col >= 0) write_sample(p.out, p.out_64, p.valid, out_row, col, true);
        return ctx.clustered;
      }
    }
    if (is(kTopK) || is(kTopKTopPJoint) || is(kTopKFirstTopP)) {
      const int k = k_row;
      if (k > 0 && k < vocab) {
        const Threshold th = radix_search_from(
            ctx, false, is(kTopKFirstTopP), max_key, lo,
            [k](CM) { return static_cast<unsigned long long>(k); });
        if (!th.all) t = th.key;
        if (is(kTopKFirstTopP) && !th.all) {
          // top-p over the renormalized top-k set: target mass p * kept(top-k).
          const double P = static_cast<double>(p.top_p(out_row)) * static_cast<double>(th.kept.m);
          const Threshold tp = radix_search(ctx, true, true, max_key, [P](CM) {
            return static_cast<unsigned long long>(floor(P)) + 1ull;
          });
          if (!tp.all && tp.key > t) t = tp.key;
        }
      }
    }
    if (is(kTopP) || is(kTopKTopPJoint) ||
        (is(kTopKFirstTopP) && t == 0)) {  // top-k kept everything: plain top-p
      const float tp_p = p.top_p(out_row);
      const Threshold tp = radix_search(ctx, true, true, max_key, [tp_p](CM total) {
        return static_cast<unsigned long long>(
                   floor(static_cast<double>(tp_p) * static_cast<double>(total.m))) + 1ull;
      });
      if (!tp.all && tp.key > t) t = tp.key;
    }
    // Top-p comes here after its rejected candidates: the uniform after theirs.
    Philox rng = p.rng.make(out_row, is(kTopP) ? kTopPCandidates * kTopPPasses : 0);
    const uint32_t r = rng.next();
    unsigned long long K;
    if constexpr (kBlockDraw<kFilters>) {
      if (sums_first) {
        refine_block_sums(ctx, t);
      } else {
        fill_block_sums(ctx, t, [](float x) { return x; });
      }
      stamp(kTraceRefined);
      if constexpr (kDirect) {
        // Rank 0's warp 0 draws from the whole row (locate_in_row, its first kLocateWarps
        // warps weighing the blocks) once every rank's sums are final: the t = 0 sums since the
        // exchange of the max, refined ones after a group barrier.
        // (Top-p's fallback: its radix search's last DSMEM reads of the peers' Shared::cnt and
        // ::mass, which locate_in_row reuses, are done too.)
        if (t != 0 || kFilters != kDrawFilters) row_sync(ctx);
        stamp(kTracePrefixed);
        K = 1;
        if (ctx.rank == 0 && ctx.tid < 32 * kLocateWarps) {
          float x;
          col = locate_in_row(ctx, vocab, t, r, ctx.tid < 32, &x, &K);
        }
        // After its reads of the peers' sums: the peers exit once every thread has arrived.
        if (ctx.clustered) cluster_arrive();
        arrived = ctx.clustered;
      } else {
        // The t = 0 sums of probabilities are final since the exchange of the max.
        const DrawPrefix d = sums_first && is_probs && t == 0 ? block_prefix_peers(ctx, vocab)
                                                              : block_prefix(ctx, 0);
        stamp(kTracePrefixed);
        arrived = ctx.clustered;
        col = block_locate(ctx, t, d, r);
        K = d.K;
      }
    } else {
      col = draw(ctx, t, r, 0, &K);
    }
    if (K == 0 && ctx.rank == 0 && ctx.tid == 0) col = 0;  // nothing to draw from
  } else if (ctx.rank == 0 && ctx.tid == 0) {
    col = 0;
  }
  if (col >= 0) write_sample(p.out, p.out_64, p.valid, out_row, col, row_ok && !any_nan);
  stamp(kTraceEnd);
  return arrived;
}

/// Top-p's direct kernel at 4 CTAs a SM (64 registers; its spills sit after the streaming pass):
/// 128 rows of 128256 then fit in resident clusters of 3 (124 fit at 3 CTAs a SM).
template <unsigned kFilters, bool kDirect>
inline constexpr int kSampleCtasPerSm = kDirect && kFilters == kTopPFilters ? 4 : 3;

/// One cluster (or one CTA) per output row: load, filter, draw one token. Shared memory: the
/// chunk (clusters), the Shared block, the chunk's block sums and max keys (see plan_sample).
/// kDirect (float32 probabilities, plain, min-p and top-p sampling; plan_direct): the cluster's
/// CTAs read their chunks of the input row where they lie instead of copying them into shared
/// memory, so that a cluster needs only the Shared block and the block sums and every row of a
/// large batch is in flight at once. The draw set reads a row once (fill_block_sums) and then
/// only the blocks it refines and locates; top-p also fills a histogram of the row's mass in
/// that pass, which decides most candidates (mass_window): its counting pass, which re-reads
/// the row (128 x 128256 took 106.8 us with it on every row, against the copy's 80.8 on the
/// H100), runs only for a candidate in the prefix of the threshold.
template <typename T, unsigned kFilters, bool kDirect = false>
__global__ void __launch_bounds__(kThreads, (kSampleCtasPerSm<kFilters, kDirect>)) SampleKernel(const T* __restrict__ in, int64_t stride,
                                                    int64_t vocab, int64_t chunk, bool vec,
                                                    RowGrid g, SampleParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (kFilters == kDrawFilters) trace(kTraceEntry);
  pdl_wait();
  // Top-p on the direct path: the mass histogram after the block arrays (a chunk's worth on
  // every rank, so that the peers find it at the same offset), cleared before make_ctx's barrier.
  constexpr bool kHist = kDirect && kFilters == kTopPFilters;
  static_assert(sizeof(Shared) % 16 == 0, "the block arrays and the histogram stay 16-byte aligned");
  uint32_t* hist = nullptr;
  if constexpr (kHist) {
    hist = reinterpret_cast<uint32_t*>(smem + sizeof(Shared) + (chunk / kBlockCols) * kDirectBlockBytes);
    for (int b = threadIdx.x; b < kMassBins / 4; b += blockDim.x)
      reinterpret_cast<uint4*>(hist)[b] = make_uint4(0u, 0u, 0u, 0u);
  }
  RowCtx ctx = kDirect
                   ? make_ctx(nullptr, reinterpret_cast<Shared*>(smem), vocab, chunk, false, true)
                   : row_ctx(smem, g, vocab, chunk, false);
  ctx.direct = kDirect;
  if constexpr (kHist) ctx.hist = hist, ctx.hist_shift = mass_hist_shift(vocab);
  // Peers may still read this CTA's shared memory until they arrive.
  if (sample_row<T, kFilters, kDirect>(ctx, in, stride, vocab, vec, p, row_of(g, ctx))) {
    cluster_wait();
  } else {
    row_sync(ctx);
  }
}

struct TransformParams {
  int kind;
  RowParam<float> top_p;
  RowParam<int> top_k;
  RowParam<float> temperature;
  void* out;  ///< float32 (softmax, top-p renorm) or T (top-k renorm, mask)
  int64_t out_stride;
};

/*!
 * @brief Softmax of this CTA's chunk (in ctx.vals, not yet scaled) with the row's group: one pass
 *   of online (max, sum of exp(x - max)) per thread, a block and a group combine (one group
 *   barrier; exchange slots `slot`, `slot + 1`), then one write pass. x = logit * inv_t. NaN
 *   anywhere (or +inf) makes the row NaN, a row of -inf is NaN, as torch.softmax.
 */
__device__ __forceinline__ void softmax_chunk(const RowCtx& ctx, float inv_t, float* out,
                                              int slot) {
  float m = -INFINITY, sum = 0.f;
  // -inf terms add 0 (also before any finite max); NaN terms add NaN.
  auto term = [](float x, float mx) { return x == -INFINITY ? 0.f : __expf(x - mx); };
  const int n4 = ctx.n / 4;
  const float4* v4 = reinterpret_cast<const float4*>(ctx.vals);
  for (int i = ctx.tid; i < n4; i += ctx.nthreads) {
    float4 x = v4[i];
    x = make_float4(x.x * inv_t, x.y * inv_t, x.z * inv_t, x.w * inv_t);
    const float mm = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
    if (mm > m) sum *= __expf(m - mm), m = mm;
    sum += (term(x.x, m) + term(x.y, m)) + (term(x.z, m) + term(x.w, m));
  }
  for (int i = n4 * 4 + ctx.tid; i < ctx.n; i += ctx.nthreads) {
    const float x = ctx.vals[i] * inv_t;
    if (x > m) sum *= __expf(m - x), m = x;
    sum += term(x, m);
  }
  // Combine (m, sum) pairs: the block's max, every sum rescaled to it, then the group's.
  const float bm = block_max(m, ctx.s);
  sum = block_sum_f(m == bm ? sum : sum * __expf(m - bm), ctx.s);
  if (ctx.tid == 0) ctx.s->xf[slot] = bm, ctx.s->xf[slot + 1] = sum;
  row_sync(ctx);
  const int lane = ctx.tid & 31;
  float gm = -INFINITY, gs = 0.f;
  if (lane < ctx.csize) {
    const float* remote = peer(ctx, &ctx.s->xf[slot], lane);
    gm = remote[0];
    gs = remote[1];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {  // the same tree on every CTA: the same (M, S)
    const float mo = __shfl_xor_sync(0xffffffffu, gm, o);
    const float so = __shfl_xor_sync(0xffffffffu, gs, o);
    const float M = fmaxf(gm, mo);
    gs = (gm == M ? gs : gs * __expf(gm - M)) + (mo == M ? so : so * __expf(mo - M));
    gm = M;
  }
  const float inv = 1.f / gs;
  write_chunk(ctx, out, [&](float x) { return __expf(x * inv_t - gm) * inv; });
}

/// out = x / (kept mass) for the elements the threshold keeps, 0 elsewhere (th.all: every
/// element, its mass summed here). ctx.scale set. Group-wide.
template <typename O>
__device__ __forceinline__ void renorm_write(const RowCtx& ctx, const Threshold& th, O* out) {
  unsigned long long kept_m = th.kept.m;
  uint32_t t = 0;
  if (th.all) {
    unsigned long long mine = 0;
    for_each_value(ctx, [&](float x) { mine += ctx.fixed(x); });
    CM total;
    block_scan(CM{0, mine}, ctx.s, &total);
    unsigned long long before;
    kept_m = cluster_sum_u(ctx, total.m, 0, &before);
  } else {
    t = th.key;
  }
  const float inv = kept_m ? static_cast<float>(static_cast<double>(ctx.scale) /
                                                static_cast<double>(kept_m))
                           : 0.f;
  write_chunk(ctx, out, [&](float x) { return ctx.key(x) >= t ? x * inv : 0.f; });
}

/// A transform's top-k threshold from the row's candidates at or above the bound `lo` (the key
/// prefix key >> shift; 0: none), every CTA gathering the whole list: false (nothing changed)
/// where there is no bound or the lists do not fit. Group-wide; the kernel's last group barrier
/// keeps each CTA's list readable for its peers.
__device__ __forceinline__ bool topk_from_candidates(RowCtx& ctx, uint32_t lo, int shift, int k,
                                                     bool need_mass, Threshold* th) {
  if (lo == 0) return false;
  const uint32_t floor_key = lo << shift;
  const int N = gather_candidates(ctx, list_candidates(ctx, floor_key, nullptr), k, 4, true,
                                  nullptr);
  if (N < 0) return false;
  *th = list_select(ctx, N, static_cast<unsigned int>(k), true, need_mass, floor_key, false);
  return true;
}

/// (top-k mask | top-p / top-k renorm | softmax) of row `row`, whose chunk ctx.vals holds (as
/// loaded, float). Group-wide.
template <typename T>
__device__ __forceinline__ void transform_chunk(RowCtx& ctx, int64_t vocab,
                                                const TransformParams& p, int64_t row) {
  const int kind = p.kind;
  float* out_f = static_cast<float*>(p.out) + row * p.out_stride + ctx.begin;
  T* out_t = static_cast<T*>(p.out) + row * p.out_stride + ctx.begin;
  bool nan;
  if (kind == kSoftmax) {
    softmax_chunk(ctx, 1.f / p.temperature(row), out_f, 0);
    return;
  }
  const int k = p.top_k(row);
  const bool topk_search = kind != kTopPRenorm && k > 0 && k < vocab;
  if (kind == kTopKMask || topk_search) {
    // Top-k: a lower bound for the threshold from the per-thread maxima (topk_lower_prefix)
    // narrows round 0's window, so only the keys near the top pay shared-memory atomics.
    const bool mask = kind == kTopKMask;
    float tm, mx_all, nan_f;
    bool any;
    const float mx = first_pass_threads(ctx, !mask, [](float x) { return fmaxf(x, 0.f); }, &nan,
                                        &tm, &any);
    // The mask's keys are signed: its bound at kLogitShift (the radix search takes it at
    // kWindowShift, a coarser prefix and so a bound too).
    const int shift = mask ? kLogitShift : kWindowShift;
    uint32_t lo = 0;
    if (topk_search) lo = topk_lower_prefix(ctx, ctx.key(tm), any, ctx.key(mx), k, shift);
    group_max_nan_lo(ctx, mx, nan ? 1.f : 0.f, lo, 0, &mx_all, &nan_f, &lo);
    uint32_t t = 0;
    Threshold th{0, CM{0, 0}, true};
    if (mask) {
      // A NaN's key may exceed the max's: then the window holds no finite value (exact, slower).
      const uint32_t max_key = nan_f > 0.f ? 0xffffffffu : key_signed(mx_all);
      if (topk_search) {
        if (!topk_from_candidates(ctx, nan_f > 0.f ? 0u : lo, shift, k, false, &th)) {
          th = radix_search_from(ctx, false, false, max_key,
                                 nan_f > 0.f ? 0u : lo >> (kWindowShift - shift),
                                 [k](CM) { return static_cast<unsigned long long>(k); });
        }
        if (!th.all) t = th.key;
      }
      const float ninf = -INFINITY;
      write_chunk(ctx, out_t, [&](float x) { return ctx.key(x) >= t ? x : ninf; });
      return;
    }
    ctx.scale = fixed_scale(mx_all);  // (the clamp removed NaNs)
    if (!topk_from_candidates(ctx, lo, kWindowShift, k, true, &th)) {
      th = radix_search_from(ctx, false, true, key_nonneg(mx_all), lo,
                             [k](CM) { return static_cast<unsigned long long>(k); });
    }
    renorm_write(ctx, th, out_t);
    return;
  }
  // Top-p renorm (top-k renorm keeping every element too): probabilities, negatives clamped to 0.
  const float mx =
      cluster_reduce_f(ctx, first_pass(ctx, true, [](float x) { return fmaxf(x, 0.f); }, &nan), 0,
                       true);
  ctx.scale = fixed_scale(mx);
  Threshold th{0, CM{0, 0}, true};
  if (kind == kTopPRenorm) {
    const float tp = p.top_p(row);
    th = radix_search(ctx, true, true, key_nonneg(mx), [tp](CM total) {
      return static_cast<unsigned long long>(
                 floor(static_cast<double>(tp) * static_cast<double>(total.m))) + 1ull;
    });
    renorm_write(ctx, th, out_f);
  } else {
    renorm_write(ctx, th, out_t);
  }
}

/// One cluster (or one CTA) per row: load, (softmax | find the filter's threshold), write.
template <typename T>
__global__ void __launch_bounds__(kThreads, 3) TransformKernel(const T* __restrict__ in, int64_t stride,
                                                       int64_t vocab, int64_t chunk, bool vec,
                                                       RowGrid g, TransformParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_wait();
  const bool signed_keys = p.kind == kTopKMask;
  RowCtx ctx = row_ctx(smem, g, vocab, chunk, signed_keys);
  const int64_t row = row_of(g, ctx);
  load_chunk<T>(ctx, in + row * stride, vec);
  if (p.kind == kSoftmax) pdl_launch_dependents();
  transform_chunk<T>(ctx, vocab, p, row);
  row_sync(ctx);
}

// ------------------------------------------------------------------------------------------------
// Softmax with every row on chip at once (SoftmaxResidentKernel)
// ------------------------------------------------------------------------------------------------
//
// TransformKernel's softmax holds a 64 KB chunk a CTA in shared memory, 3 CTAs an SM: 128 rows of
// 128256 floats take 2.6 waves, and each wave exposes its load, reduction, cluster barrier and
// write (77% of the copy at 128 x 128256 on the H100; benchmarks/notes/sampling-cluster-radix.md,
// waves 23, 24 and 26). Here one CTA a SM holds its chunk in registers (kResVecs float4 a thread,
// 197 KB a CTA) and shared memory (up to 230 KB): with `rows` <= SMs every row is read once while
// all SMs stream (one wave), one reduction, then every SM writes (88% of the copy). What does not
// fit (the remainder: 86 KB of a 513 KB row) is read first, evict-last, into the shared memory
// that later holds the kept part's end, and everything else evict-first: phase 2 reads it again
// from the L2 (1.7 us faster than at normal priority), then returns its lines to normal priority.
// The registers' code is unrolled once per slot and runs once per warp, so it is kept short: a
// straight-line kernel of 20K instructions ran at 5-30% of the copy (instruction fetch), 256
// threads of 48 slots (4.3K instructions) at 82%, 512 of 24 (3.1K) at 86% before the evict-last.

/// The resident kernels' threads (one CTA an SM) and the float4 registers each holds.
inline constexpr int kResThreads = 512;
inline constexpr int kResVecs = 24;

/// A 16-byte read-only load, not kept in L1, under L2 cache policy `policy` (createpolicy).
__device__ __forceinline__ float4 ld_row(const float4* p, uint64_t policy) {
  float4 v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p), "l"(policy));
#else
  v = *p;
#endif
  return v;
}

/// cp.async of 16 bytes to shared address `dst` under L2 cache policy `policy`.
__device__ __forceinline__ void cp_async16(uint32_t dst, const float4* src, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(src), "l"(policy)
               : "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// exp(d) as fast_exp2(d * log2(e)): __expf without its subnormal-range fix-up (results below
/// 2^-126 flush to 0), 3 instructions instead of 6 in the registers' unrolled code.
__device__ __forceinline__ float exp_ftz(float d) { return fast_exp2(d * 1.4426950408889634f); }

/// (max, sum of exp(x - max)) pairs: the online update and the combine.
struct OnlineSum {
  float m = -INFINITY, s = 0.f;
  __device__ __forceinline__ void add(float4 x, float inv_t) {
    // -inf terms add 0 (also before any finite max); NaN terms add NaN.
    auto term = [](float y, float mx) { return y == -INFINITY ? 0.f : exp_ftz(y - mx); };
    x = make_float4(x.x * inv_t, x.y * inv_t, x.z * inv_t, x.w * inv_t);
    const float mm = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
    if (mm > m) s *= exp_ftz(m - mm), m = mm;
    s += (term(x.x, m) + term(x.y, m)) + (term(x.z, m) + term(x.w, m));
  }
  __device__ __forceinline__ void merge(float mo, float so) {
    const float M = fmaxf(m, mo);
    s = (m == M ? s : s * exp_ftz(m - M)) + (mo == M ? so : so * exp_ftz(mo - M));
    m = M;
  }
  /// The same butterfly on every warp (and every CTA): the same result everywhere.
  __device__ __forceinline__ void warp_all() {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      merge(__shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  }
};

/// Where a CTA's chunk of its row lies (SoftmaxResidentKernel, TopKResidentKernel): [0, reg4)
/// in registers (slot j of thread t: float4 j * kResThreads + t), then the remainder
/// [reg4, reg4 + rem4) (read twice), then the shared memory's part [reg4 + rem4, n4) (kept4
/// float4; rem4 <= kept4, the plan's bound).
struct ResidentChunk {
  const float4* src;  ///< the chunk's first float4
  float4* held;       ///< shared memory: the kept part (and, in phase 1, first the remainder)
  uint32_t held_s;
  int reg4, rem4, kept4;
  int slots;  ///< this thread's valid register slots
  int tid;
  uint64_t first, last;  ///< L2 policies: evict-first, evict-last
  __device__ __forceinline__ const float4* rest() const { return src + reg4; }
  __device__ __forceinline__ const float4* kept() const { return src + reg4 + rem4; }
};

/// The chunk of rank `rank` (chunk4 float4 each) of the row at `row_ptr`. No global reads.
template <int kVecs>
__device__ __forceinline__ ResidentChunk resident_chunk(const float* row_ptr, int64_t vocab,
                                                        int64_t chunk4, int smem_vecs, int rank,
                                                        unsigned char* smem) {
  constexpr int T = kResThreads;
  ResidentChunk c;
  const int64_t begin4 = rank * chunk4;
  const int64_t left4 = vocab / 4 - begin4;
  const int n4 = static_cast<int>(left4 < 0 ? 0 : (left4 < chunk4 ? left4 : chunk4));
  c.reg4 = n4 < kVecs * T ? n4 : kVecs * T;
  c.rem4 = n4 - c.reg4 > smem_vecs ? n4 - c.reg4 - smem_vecs : 0;
  c.kept4 = n4 - c.reg4 - c.rem4;
  c.tid = threadIdx.x;
  c.slots = c.reg4 > c.tid ? (c.reg4 - c.tid + T - 1) / T : 0;
  c.src = reinterpret_cast<const float4*>(row_ptr) + begin4;
  c.held = reinterpret_cast<float4*>(smem);
  c.held_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  c.first = c.last = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(c.first));
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(c.last));
#endif
  return c;
}

/*!
 * @brief Phase 1: read the chunk once. The remainder first (evict-last; cp.async group 0) into
 *   the shared memory's first rem4 slots, the registers, the kept part beyond rem4 (group 1);
 *   add(x) sees the remainder's float4 (whose slots then take the kept part's: group 2), then
 *   regs(v) the registers (invalid slots hold -inf), then add(x) the kept part. Each thread
 *   reads back only the shared memory it copied itself, so its own waits order everything.
 */
template <int kVecs, typename Add, typename Regs>
__device__ __forceinline__ void resident_load(const ResidentChunk& c, float4 (&v)[kVecs], Add add,
                                              Regs regs) {
  constexpr int T = kResThreads;
  const float4* const rest = c.rest();
  const float4* const kept = c.kept();
  for (int s = c.tid; s < c.rem4; s += T) cp_async16(c.held_s + s * 16, rest + s, c.last);
  cp_async_commit();
  const float4* const mine = c.src + c.tid;
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
    v[j] = j < c.slots ? ld_row(mine + j * T, c.first)
                       : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
  for (int s = c.rem4 + c.tid; s < c.kept4; s += T)
    cp_async16(c.held_s + s * 16, kept + s, c.first);
  cp_async_commit();
  cp_async_wait<1>();
  for (int s = c.tid; s < c.rem4; s += T) {
    add(c.held[s]);
    cp_async16(c.held_s + s * 16, kept + s, c.first);  // the same slot, now the kept part's
  }
  cp_async_commit();
  regs(v);
  cp_async_wait<1>();
  for (int s = c.rem4 + c.tid; s < c.kept4; s += T) add(c.held[s]);
  cp_async_wait<0>();
  for (int s = c.tid; s < c.rem4; s += T) add(c.held[s]);
}

/// f(x, s) over the remainder's float4 (s: its index), read under L2 policy `policy` (from the
/// L2: phase 1 read it evict-last), 4 in flight a thread; `done(s)` after each.
template <typename F, typename Done>
__device__ __forceinline__ void resident_rest(const ResidentChunk& c, uint64_t policy, F f,
                                              Done done) {
  constexpr int T = kResThreads, U = 4;
  const float4* const rest = c.rest();
  for (int s0 = c.tid; s0 < c.rem4; s0 += U * T) {
    float4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s0 + u * T < c.rem4) r[u] = ld_row(rest + s0 + u * T, policy);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u * T;
      if (s < c.rem4) {
        f(r[u], s);
        done(s);
      }
    }
  }
}

/// f(x) for every float4 of the chunk's remainder (re-read, kept evict-last) and shared memory.
template <typename F>
__device__ __forceinline__ void resident_off_registers(const ResidentChunk& c, F f) {
  resident_rest(c, c.last, [&](float4 x, int) { f(x); }, [](int) {});
  for (int s = c.tid; s < c.kept4; s += kResThreads) f(c.held[s]);
}

/// f(x) for every float4 of the chunk held after phase 1.
template <int kVecs, typename F>
__device__ __forceinline__ void resident_for_each(const ResidentChunk& c, const float4 (&v)[kVecs],
                                                  F f) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
    if (j < c.slots) f(v[j]);
  resident_off_registers(c, f);
}

/// Phase 2: dst (the chunk's first float4 of the output) = map_reg(register slot) / map(x): the
/// registers, the remainder from the L2 (its lines then back to normal priority: the evict-last
/// of phase 1 leaves no trace), the shared memory's part.
template <int kVecs, typename MapReg, typename Map>
__device__ __forceinline__ void resident_store(const ResidentChunk& c, const float4 (&v)[kVecs],
                                               float4* dst, MapReg map_reg, Map map) {
  constexpr int T = kResThreads;
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
    if (j < c.slots) dst[j * T + c.tid] = map_reg(v[j]);
  const float4* const rest = c.rest();
  resident_rest(
      c, c.first, [&](float4 x, int s) { dst[c.reg4 + s] = map(x); },
      [&](int s) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(rest + s);
        if ((a & 127) == 0 || s == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
          asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(a & ~uintptr_t{127})
                       : "memory");
#endif
        }
      });
  for (int s = c.tid; s < c.kept4; s += T) dst[c.reg4 + c.rem4 + s] = map(c.held[s]);
}

/// This CTA's (cluster size, rank): (1, 0) without a cluster.
__device__ __forceinline__ void cluster_place(int* csize, int* rank) {
  *csize = 1;
  *rank = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  *csize = static_cast<int>(cg::this_cluster().num_blocks());
  *rank = static_cast<int>(cg::this_cluster().block_rank());
#endif
}

/*!
 * @brief Softmax of float32 rows, one CTA a chunk of chunk4 float4 (a cluster of C CTAs a row, C
 *   from the launch; the last chunks may be shorter or empty), laid out as ResidentChunk.
 *   vocab % 4 == 0; rows and out 16-byte aligned. Numerics as softmax_chunk: x = logit * inv_t,
 *   NaN or +inf anywhere makes the row NaN, a row of -inf is NaN.
 */
template <int kVecs>
__global__ void __launch_bounds__(kResThreads, 1)
    SoftmaxResidentKernel(const float* __restrict__ in, int64_t stride, int64_t vocab,
                          int64_t chunk4, int smem_vecs, RowParam<float> temperature,
                          float* __restrict__ out, int64_t out_stride) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kWarps = kResThreads / 32;
  __shared__ float red[2 * kWarps];
  const int tid = threadIdx.x, lane = tid & 31;
  int csize, rank;
  cluster_place(&csize, &rank);
  const int64_t row = blockIdx.x / csize;
  const ResidentChunk c =
      resident_chunk<kVecs>(in + row * stride, vocab, chunk4, smem_vecs, rank, smem);
  pdl_wait();
  const float inv_t = 1.f / temperature(row);
  float4 v[kVecs];
  OnlineSum acc;
  float rm = -INFINITY, rs = 0.f;
  resident_load(
      c, v, [&](float4 x) { acc.add(x, inv_t); },
      [&](float4(&r)[kVecs]) {
        // The registers: x * inv_t in place, their max, then one exponential each.
#pragma unroll
        for (int j = 0; j < kVecs; ++j) {
          r[j] = make_float4(r[j].x * inv_t, r[j].y * inv_t, r[j].z * inv_t, r[j].w * inv_t);
          rm = fmaxf(rm, fmaxf(fmaxf(r[j].x, r[j].y), fmaxf(r[j].z, r[j].w)));
        }
        if (rm != -INFINITY) {  // (-inf - -inf would be NaN; every term is 0 then)
#pragma unroll
          for (int j = 0; j < kVecs; ++j)
            rs += (exp_ftz(r[j].x - rm) + exp_ftz(r[j].y - rm)) +
                  (exp_ftz(r[j].z - rm) + exp_ftz(r[j].w - rm));
        }
      });
  acc.merge(rm, rs);
  pdl_launch_dependents();
  // The block's (max, sum), then the cluster's: the same tree on every warp and CTA.
  acc.warp_all();
  if (lane == 0) red[2 * (tid >> 5)] = acc.m, red[2 * (tid >> 5) + 1] = acc.s;
  __syncthreads();
  OnlineSum tot;
  if (lane < kWarps) tot.m = red[2 * lane], tot.s = red[2 * lane + 1];
  tot.warp_all();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (csize > 1) {
    __shared__ float slot[2];
    cg::cluster_group cluster = cg::this_cluster();
    if (tid == 0) slot[0] = tot.m, slot[1] = tot.s;
    cluster.sync();
    OnlineSum all;
    if (lane < csize) {
      const float* remote = cluster.map_shared_rank(slot, lane);
      all.m = remote[0];
      all.s = remote[1];
    }
    all.warp_all();
    tot = all;
    // Arrive now (every peer has read our slot by its own arrival), wait before exit.
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  }
#endif
  const float M = tot.m, inv = 1.f / tot.s;
  // Phase 2: the registers hold y = x * inv_t already.
  resident_store(
      c, v, reinterpret_cast<float4*>(out + row * out_stride) + rank * chunk4,
      [&](float4 y) {
        return make_float4(exp_ftz(y.x - M) * inv, exp_ftz(y.y - M) * inv,
                           exp_ftz(y.z - M) * inv, exp_ftz(y.w - M) * inv);
      },
      [&](float4 x) {
        return make_float4(exp_ftz(x.x * inv_t - M) * inv, exp_ftz(x.y * inv_t - M) * inv,
                           exp_ftz(x.z * inv_t - M) * inv, exp_ftz(x.w * inv_t - M) * inv);
      });
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (csize > 1) asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

/// Words of a thread's marks over its register slots (resident_mark: bit 4 j + i for slot j,
/// element i).
template <int kVecs>
inline constexpr int kMarkWords = (kVecs * 4 + 31) / 32;

/// A bit an element of this thread's register slots where pred(x) (a pass over the registers
/// whose unrolled code stays short: the marked elements are then read again from the row,
/// resident_marked).
template <int kVecs, typename Pred>
__device__ __forceinline__ void resident_mark(const ResidentChunk& c, const float4 (&v)[kVecs],
                                              Pred pred, uint32_t (&bits)[kMarkWords<kVecs>]) {
#pragma unroll
  for (int i = 0; i < kMarkWords<kVecs>; ++i) bits[i] = 0;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < c.slots) {
      const float4 x = v[j];
      bits[j * 4 / 32] |= (uint32_t{pred(x.x)} | uint32_t{pred(x.y)} << 1 |
                           uint32_t{pred(x.z)} << 2 | uint32_t{pred(x.w)} << 3)
                          << (j * 4 % 32);
    }
  }
}

/// The element of mark word w's lowest set bit in m, read again from the row at row_ptr (the
/// chunk of one CTA a row: slot j, element i of thread t is row_ptr[4 (T j + t) + i]).
__device__ __forceinline__ float resident_marked(const float* row_ptr, uint32_t w, uint32_t m) {
  const float* const mine = row_ptr + 4 * static_cast<int>(threadIdx.x);
  const int e = static_cast<int>(w * 32) + __ffs(m) - 1;
  return __ldg(mine + 4 * kResThreads * (e >> 2) + (e & 3));
}

/// Candidate keys a TopKResidentKernel CTA lists (16 KB): the keys above the bound.
inline constexpr int kResCandidates = 4096;

/// op over the block's u64s (every thread gets the result; op associative and commutative, 0
/// its identity: sum or max). `red`: kResThreads / 32 words, free again on return.
template <typename Op>
__device__ __forceinline__ unsigned long long block_all_u64(unsigned long long x,
                                                            unsigned long long* red, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();  // (red free: an earlier use is complete)
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  unsigned long long t = 0;
  for (int w = 0; w < kResThreads / 32; ++w) t = op(t, red[w]);
  return t;
}
struct SumU64 {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a + b;
  }
};
struct MaxU64 {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a > b ? a : b;
  }
};

/// Warp 0 of the block: the bin d of the 256-bin count histogram `hist` where the count from the
/// top reaches k (1 <= k <= the total), into pick[0], and the count above it into pick[1].
__device__ __forceinline__ void pick_digit(const uint32_t* hist, uint32_t k, uint32_t* pick) {
  const int lane = threadIdx.x & 31;
  // Lane l: bins 255 - 8l down to 248 - 8l; the counts above them by a warp scan.
  uint32_t cnt[8], sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += cnt[i] = hist[255 - 8 * lane - i];
  uint32_t incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  uint32_t run = incl - sum;
  if (run < k && k <= incl) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (run < k && k <= run + cnt[i]) pick[0] = 255 - 8 * lane - i, pick[1] = run;
      run += cnt[i];
    }
  }
}

/*!
 * @brief The k-th largest key (k >= 1, and at least k keys) among the keys every thread of the
 *   block hands to f in visit(f), its top `bits` bits exact and the rest 0 (a lower bound of
 *   the k-th largest where bits < 32): radix rounds of 8 bits from the top, each a histogram of
 *   the keys matching the digits chosen so far (shared-memory atomics, 256 bins) and one warp
 *   finding the digit where the count from the top reaches k. Block-wide.
 */
template <typename Visit>
__device__ __forceinline__ uint32_t block_kth_key(Visit visit, uint32_t k, int bits,
                                                  uint32_t* hist, uint32_t* pick) {
  const int tid = threadIdx.x;
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 32 - bits; shift -= 8) {
    for (int i = tid; i < 256; i += kResThreads) hist[i] = 0;
    __syncthreads();
    visit([&](uint32_t key) {
      // One atomic per distinct bin of the warp: keys of one magnitude share a bin, and 32
      // lanes adding to one shared word are serialized (the rounds cost ~8 us that way).
      const bool in = (key & mask) == prefix;
      const uint32_t bin = in ? (key >> shift) & 255u : 256u;
      const unsigned peers = __match_any_sync(__activemask(), bin);
      if (in && __ffs(peers) - 1 == static_cast<int>(threadIdx.x & 31))
        atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
    });
    __syncthreads();
    if (tid < 32) pick_digit(hist, k, pick);
    __syncthreads();
    const uint32_t d = pick[0];
    k -= pick[1];
    prefix |= d << shift;
    mask |= 255u << shift;
  }
  __syncthreads();  // (pick and hist reusable)
  return prefix;
}

/// Top-k's order key of x (TopKResidentKernel, topk_stream_row): mask key_signed(x), renorm
/// key_nonneg(max(x, 0)) (NaN counts as 0).
template <bool kMask>
__device__ __forceinline__ uint32_t topk_key(float x) {
  return kMask ? key_signed(x) : key_nonneg(fmaxf(x, 0.f));
}

/// The float whose key is q (mask: key_signed's inverse; renorm: q / 2's bits, rounded down).
template <bool kMask>
__device__ __forceinline__ float topk_key_value(uint32_t q) {
  return kMask ? __uint_as_float(q & 0x80000000u ? q & 0x7fffffffu : ~q) : __uint_as_float(q >> 1);
}

/// Renorm's weights in renorm_write's fixed point, at the scale of the row's largest key
/// (renorm_mass).
struct RenormMass {
  float scale;
  __device__ __forceinline__ unsigned long long fixed(uint32_t q) const {
    return __float2ull_rz(__uint_as_float(q >> 1) * scale);
  }
  /// The kept elements' factor for a kept mass `kept` (0 where nothing is kept).
  __device__ __forceinline__ float inv(unsigned long long kept) const {
    return kept ? static_cast<float>(static_cast<double>(scale) / static_cast<double>(kept)) : 0.f;
  }
};
__device__ __forceinline__ RenormMass renorm_mass(unsigned long long max_key) {
  return RenormMass{fixed_scale(__uint_as_float(static_cast<uint32_t>(max_key) >> 1))};
}

/// A float4's top-k output at threshold t: mask x where its key >= t, else -inf; renorm
/// max(x, 0) * inv where its key >= t, else 0.
template <bool kMask>
__device__ __forceinline__ float4 topk_out4(float4 x, uint32_t t, float inv) {
  auto one = [&](float y) {
    if constexpr (kMask) {
      return key_signed(y) >= t ? y : -INFINITY;
    } else {
      const float z = fmaxf(y, 0.f);
      return key_nonneg(z) >= t ? z * inv : 0.f;
    }
  };
  return make_float4(one(x.x), one(x.y), one(x.z), one(x.w));
}

/// topk_stream_row: the largest and smallest prefix it reads first (float4: 32K and 4K
/// elements; 128 KB of shared memory at most) and its list of (key, index) pairs (64 KB).
inline constexpr int kStreamPrefix4 = 8192;
inline constexpr int kStreamMinPrefix4 = 1024;
inline constexpr int kStreamList = 8192;
/// The listed keys' counts by their top 16 bits above the bound's (the last bin: all beyond).
inline constexpr int kStreamBins = 4096;
inline constexpr int kStreamSmem = kStreamPrefix4 * 16 + kStreamList * 8 + kStreamBins * 4 + 16;

/// Whether TopKStreamKernel may take a row (topk_stream_row): 0 < k < vocab, and k small
/// enough that the largest prefix bounds t tightly (~k x vocab / 32K keys listed, at most half
/// the list; k <= 1046 at vocab 128256). The host narrows it where TopKResidentKernel holds
/// the rows (topk_stream).
__host__ __device__ __forceinline__ bool topk_streams(int k, int64_t vocab) {
  return k > 0 && k < vocab && int64_t{k} * (vocab / 4) <= int64_t{4096} * kStreamPrefix4;
}

/*!
 * @brief The bin of kStreamBins counts (`bins`, the largest keys in the last) where the count
 *   from the top reaches k (1 <= k <= the total): into pick[0], and k less the count above it
 *   into hist[16]. One block suffix scan (each thread 8 bins); uses hist[0..15]; *reset (where
 *   given) zeroed once every thread has entered. Block-wide.
 */
__device__ __forceinline__ void bins_kth(const uint32_t* bins, uint32_t k, uint32_t* hist,
                                         uint32_t* pick, uint32_t* reset = nullptr) {
  constexpr int T = kResThreads, kPer = kStreamBins / T;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Thread t holds bins [kPer t, kPer t + kPer); the counts above them by a suffix scan.
  uint32_t c[kPer], sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) sum += c[j] = bins[tid * kPer + j];
  uint32_t incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_down_sync(0xffffffffu, incl, o);
    if (lane + o < 32) incl += y;
  }
  if (lane == 0) hist[warp] = incl;
  __syncthreads();
  if (reset && tid == 0) *reset = 0;
  uint32_t run = incl - sum;
  for (int w = warp + 1; w < T / 32; ++w) run += hist[w];
  if (run < k && k <= run + sum) {
#pragma unroll
    for (int j = kPer - 1; j >= 0; --j) {
      if (run < k && k <= run + c[j]) pick[0] = tid * kPer + j, hist[16] = k - run;
      run += c[j];
    }
  }
  __syncthreads();
}

/*!
 * @brief What block_kth_key(visit, k, 16, ...) gives (the k-th largest of the keys visit(f)
 *   hands to f, its top 16 bits exact and the rest 0; k >= 1, at least k keys) in two passes
 *   without its per-warp bin matching: the keys' top 12 bits counted in `bins` (kStreamBins
 *   words, zero on entry and again on return; plain shared atomics, a warp's keys falling in
 *   many bins), the bin by a block scan (bins_kth), then that bin's keys by their next 4 bits.
 *   Block-wide; uses hist[0..16], hist[32..47] and pick.
 */
template <typename Visit>
__device__ __forceinline__ uint32_t bins_kth16(Visit visit, uint32_t k, uint32_t* bins,
                                               uint32_t* hist, uint32_t* pick) {
  const int tid = threadIdx.x;
  if (tid < 16) hist[32 + tid] = 0;
  visit([&](uint32_t key) { atomicAdd(&bins[key >> 20], 1u); });
  __syncthreads();
  bins_kth(bins, k, hist, pick);
  const uint32_t bin = pick[0], kb = hist[16];
  visit([&](uint32_t key) {
    if ((key >> 20) == bin) atomicAdd(&hist[32 + ((key >> 16) & 15u)], 1u);
  });
  for (int i = tid; i < kStreamBins; i += kResThreads) bins[i] = 0;
  __syncthreads();
  if (tid == 0) {
    uint32_t run = 0, d = 0;
    for (int j = 15; j >= 0; --j) {
      const uint32_t c = hist[32 + j];
      if (run < kb && kb <= run + c) d = j;
      run += c;
    }
    pick[1] = d;
  }
  __syncthreads();
  return bin << 20 | pick[1] << 16;
}

/*!
 * @brief The k-th largest of the n listed keys from their counts by top 16 bits above the
 *   bound's (bins, kStreamBins words, a key q in bin min((q >> 16) - lo16, last)): one block
 *   scan finds the bin (bins_kth), one warp ranks the bin's keys (64 at most; more, or the last
 *   bin: 0, the caller's full select). Block-wide; uses `bins` for the bin's keys afterwards,
 *   `n_cand` as their count (zeroed once every thread has entered, so the caller's read of the
 *   list's count before the call stays valid), hist[0..16] and pick[0].
 */
__device__ __forceinline__ uint32_t binned_kth(uint32_t* bins, const uint32_t* lkey, uint32_t n,
                                               uint32_t k, uint32_t lo16, uint32_t* hist,
                                               uint32_t* pick, uint32_t& n_cand) {
  constexpr int T = kResThreads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  bins_kth(bins, k, hist, pick, &n_cand);
  const uint32_t bin = pick[0], kb = hist[16];
  if (bin == kStreamBins - 1) {  // (uniform: the caller selects from the whole list)
    __syncthreads();             // (hist and pick read by every thread)
    return 0;
  }
  for (uint32_t i = tid; i < n; i += T) {
    const uint32_t q = lkey[i];
    if ((q >> 16) - lo16 == bin) {
      const uint32_t at = atomicAdd(&n_cand, 1u);
      if (at < kStreamBins) bins[at] = q;
    }
  }
  __syncthreads();
  const uint32_t m = n_cand;
  if (m > 64) return 0;
  if (warp == 0) {  // the bin's keys, two a lane: the one with fewer than kb above, kb at or above
    const uint32_t a0 = lane < m ? bins[lane] : 0u, a1 = lane + 32 < m ? bins[lane + 32] : 0u;
    uint32_t g0 = 0, e0 = 0, g1 = 0, e1 = 0;
    for (int j = 0; j < 32; ++j) {
      const uint32_t u0 = __shfl_sync(0xffffffffu, a0, j), u1 = __shfl_sync(0xffffffffu, a1, j);
      const bool v0 = j < static_cast<int>(m), v1 = j + 32 < static_cast<int>(m);
      g0 += (v0 && u0 > a0) + (v1 && u1 > a0), e0 += (v0 && u0 >= a0) + (v1 && u1 >= a0);
      g1 += (v0 && u0 > a1) + (v1 && u1 > a1), e1 += (v0 && u0 >= a1) + (v1 && u1 >= a1);
    }
    if (lane < m && g0 < kb && kb <= e0) pick[0] = a0;
    if (lane + 32 < m && g1 < kb && kb <= e1) pick[0] = a1;
  }
  __syncthreads();
  const uint32_t t = pick[0];
  __syncthreads();  // (pick reusable)
  return t;
}

/*!
 * @brief Top-k mask / renorm of one float32 row in one stream (a TopKStreamKernel CTA, k with
 *   topk_streams(k, vocab); `out` must not overlap the row: it is written while the row is
 *   read): the same outputs as TransformKernel, bit for bit. The row's prefix
 *   (~k x vocab / 2048 elements, 4K to 32K) is read first into shared memory; its k-th largest
 *   key (to 16 bits) bounds the row's from below, L. Then every element is written as it
 *   streams past as if not kept (mask -inf, renorm 0), and those at or above L (~k x vocab /
 *   prefix: ~1600 at k = 50) are listed with their index. After the stream: t, the list's k-th
 *   largest, and the kept listed elements rewritten (mask x, from its key; renorm x times scale
 *   / kept mass, the mass from the list). The row is read once and written once, the writes
 *   overlapping the reads. Elements whose output t does not change (mask -inf, renorm <= 0 or
 *   NaN) are not listed, nor (mask) those below -inf's key (negative NaNs: below t wherever the
 *   list decides it). A list that overflows: its k-th largest (to 16 bits) bounds t too, and
 *   one more read of the row lists the keys at or above it. A list that overflows again, or
 *   (mask) fewer than k listed (-inf among the k largest): the row again from global memory,
 *   radix rounds for t, then mass and writes.
 */
template <bool kMask>
__device__ __forceinline__ void topk_stream_row(const float4* __restrict__ src, int64_t vocab,
                                                int k, float* out, unsigned char* smem,
                                                uint32_t* hist, unsigned long long* red64,
                                                uint32_t* pick, uint32_t& n_cand) {
  constexpr int T = kResThreads, U = 8;
  float4* const pre = reinterpret_cast<float4*>(smem);
  uint32_t* const lkey = reinterpret_cast<uint32_t*>(smem + kStreamPrefix4 * 16);
  uint32_t* const lidx = lkey + kStreamList;
  uint32_t* const bins = lidx + kStreamList;
  uint32_t* const top_key = bins + kStreamBins;  // the largest listed key
  const int tid = threadIdx.x;
  float4* const dst = reinterpret_cast<float4*>(out);
  const int n4 = static_cast<int>(vocab / 4);
  const uint32_t kk = static_cast<uint32_t>(k);
  // (A whole number of the threads' float4: the stream's loads then start on 512-byte lines.)
  const int64_t want4 = ((int64_t{k} * n4 + 2047) / 2048 + T - 1) / T * T;
  const int pre4 = static_cast<int>(min(
      int64_t{n4}, max(int64_t{kStreamMinPrefix4}, min(want4, int64_t{kStreamPrefix4}))));
  uint64_t first = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
#endif
  auto key = [](float x) { return topk_key<kMask>(x); };
  // The key whose output t does not change (mask: -inf's; renorm: 0's).
  const uint32_t trivial = kMask ? key_signed(-INFINITY) : 0u;
  const uint32_t pre_s = static_cast<uint32_t>(__cvta_generic_to_shared(pre));
  for (int s = tid; s < pre4; s += T) cp_async16(pre_s + s * 16, src + s, first);
  cp_async_commit();
  // The stream's first two batches (U float4 a thread each) in flight during the bound, and
  // (sm_90) after them x4 float4 bulk-copied into the prefix buffer's unused part once the
  // prefix is in: HBM busy during the bound without load instructions beside its atomics.
  // The registers stream the rest: their position `at` is the row's float4 `at` before the
  // copied part (xbeg), `at + x4` after it.
  const int xbeg = pre4 + 2 * U * T;
  int x4 = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  x4 = max(0, min(kStreamPrefix4 - pre4, n4 - xbeg));
#endif
  __shared__ __align__(8) uint64_t xbar;
  auto real = [xbeg, x4](int at) { return at < xbeg ? at : at + x4; };
  float4 a[U], b[U];
  auto load = [&](float4(&r)[U], int at) {
    const int ra = real(at);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (ra + u * T + tid < n4) r[u] = ld_row(src + ra + u * T + tid, first);
  };
  load(a, pre4);
  load(b, pre4 + U * T);
  if (tid == 0) n_cand = 0, *top_key = 0;
  for (int i = tid; i < kStreamBins; i += T) bins[i] = 0;
  cp_async_wait<0>();
  __syncthreads();
  if (tid == 0 && x4) {
    constexpr int kPiece = 1024;  // float4 a bulk copy (16 KB)
    mbar_init(&xbar, 1);
    mbar_fence_init();
    mbar_arrive_expect_tx(&xbar, static_cast<uint32_t>(x4) * 16u);
    for (int s = 0; s < x4; s += kPiece)
      bulk_load(pre + pre4 + s, src + xbeg + s, static_cast<uint32_t>(min(kPiece, x4 - s)) * 16u,
                &xbar, first);
  }
  const uint32_t L = bins_kth16(
      [&](auto f) {
        for (int s = tid; s < pre4; s += T) {
          const float4 x = pre[s];
          f(key(x.x)), f(key(x.y)), f(key(x.z)), f(key(x.w));
        }
      },
      kk, bins, hist, pick);
  pdl_launch_dependents();
  // Written: what an element not kept becomes (mask -inf, renorm 0). Listed: the keys at or
  // above L and above -inf's.
  const uint32_t lo = L > trivial ? L : trivial;
  const float none = kMask ? -INFINITY : 0.f;
  const float4 nones = make_float4(none, none, none, none);
  // A key at or above `bound` listed; in the stream (binned) also counted by its top 16 bits
  // above lo's, and the largest kept in top_key.
  const uint32_t lo16 = lo >> 16;
  auto list4 = [&](float4 x, int s, uint32_t bound, bool binned) {
    const uint32_t q[4] = {key(x.x), key(x.y), key(x.z), key(x.w)};
    const uint32_t c = (q[0] >= bound && q[0] != trivial) + (q[1] >= bound && q[1] != trivial) +
                       (q[2] >= bound && q[2] != trivial) + (q[3] >= bound && q[3] != trivial);
    if (c) {
      uint32_t at = atomicAdd(&n_cand, c);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (q[i] >= bound && q[i] != trivial) {
          if (at < kStreamList) lkey[at] = q[i], lidx[at] = 4 * s + i;
          ++at;
          if (binned) {
            atomicAdd(&bins[min((q[i] >> 16) - lo16, uint32_t{kStreamBins - 1})], 1u);
            atomicMax(top_key, q[i]);
          }
        }
    }
  };
  auto process = [&](float4 x, int s) {
    dst[s] = nones;
    list4(x, s, lo, true);
  };
  for (int s = tid; s < pre4; s += T) process(pre[s], s);
  // Each batch processed, then its registers load the batch two ahead; the copied part after
  // the first two.
  auto step = [&](float4(&r)[U], int at) {
    const int ra = real(at);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (ra + u * T + tid < n4) process(r[u], ra + u * T + tid);
    load(r, at + 2 * U * T);
  };
  for (int base = pre4; base < n4 - x4; base += 2 * U * T) {
    step(a, base);
    step(b, base + U * T);
    if (base == pre4 && x4) {
      mbar_wait(&xbar, 0);
      for (int s = tid; s < x4; s += T) process(pre[pre4 + s], xbeg + s);
    }
  }
  __syncthreads();
  uint32_t n = n_cand;
  const uint32_t top = *top_key;
  bool binned = true;  // bins and top describe the list
  if (n > kStreamList) {
    // The list overflowed (a prefix unlike the rest of the row, ties): the listed part's k-th
    // largest bounds the row's too; one more read lists the keys at or above it (no writes).
    uint32_t lo2 = block_kth_key(
        [&](auto f) {
          for (int i = tid; i < kStreamList; i += T) f(lkey[i]);
        },
        kk, 16, hist, pick);
    lo2 = lo2 > lo ? lo2 : lo;
    if (tid == 0) n_cand = 0;
    __syncthreads();
    for (int s = tid; s < n4; s += T) list4(__ldg(src + s), s, lo2, false);
    __syncthreads();
    n = n_cand;
    binned = false;
  }
  // Renorm with fewer than k listed: L was 0 and every positive element is listed (t = 0).
  if (n <= kStreamList && (n >= kk || !kMask)) {
    uint32_t t = 0;
    if (n >= kk && binned) {
      t = binned_kth(bins, lkey, n, kk, lo16, hist, pick, n_cand);
    }
    if (n >= kk && (!binned || t == 0))
      t = block_kth_key(
          [&](auto f) {
            for (uint32_t i = tid; i < n; i += T) f(lkey[i]);
          },
          kk, 32, hist, pick);
    if constexpr (kMask) {  // (x from its key)
      for (uint32_t i = tid; i < n; i += T) {
        const uint32_t q = lkey[i];
        if (q >= t) out[lidx[i]] = topk_key_value<true>(q);
      }
    } else {
      // The row's max is listed (its key >= t >= L).
      unsigned long long mx = top, kept = 0;
      if (!binned) {
        mx = 0;
        for (uint32_t i = tid; i < n; i += T)
          mx = max(mx, static_cast<unsigned long long>(lkey[i]));
        mx = block_all_u64(mx, red64, MaxU64{});
      }
      const RenormMass w = renorm_mass(mx);
      for (uint32_t i = tid; i < n; i += T)
        if (lkey[i] >= t) kept += w.fixed(lkey[i]);
      const float inv = w.inv(block_all_u64(kept, red64, SumU64{}));
      for (uint32_t i = tid; i < n; i += T)
        if (lkey[i] >= t) out[lidx[i]] = topk_key_value<false>(lkey[i]) * inv;
    }
    return;
  }
  // The passes from global memory (every element written again).
  auto each = [&](auto f) {
    for (int s = tid; s < n4; s += T) f(__ldg(src + s), s);
  };
  const uint32_t t = block_kth_key(
      [&](auto f) {
        each([&](float4 x, int) { f(key(x.x)), f(key(x.y)), f(key(x.z)), f(key(x.w)); });
      },
      kk, 32, hist, pick);
  float inv = 0.f;
  if constexpr (!kMask) {
    unsigned long long mx = 0, kept = 0;
    each([&](float4 x, int) {
      mx = max(mx, static_cast<unsigned long long>(
                       max(max(key(x.x), key(x.y)), max(key(x.z), key(x.w)))));
    });
    const RenormMass w = renorm_mass(block_all_u64(mx, red64, MaxU64{}));
    each([&](float4 x, int) {
      const uint32_t q[4] = {key(x.x), key(x.y), key(x.z), key(x.w)};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (q[i] >= t) kept += w.fixed(q[i]);
    });
    inv = w.inv(block_all_u64(kept, red64, SumU64{}));
  }
  each([&](float4 x, int s) { dst[s] = topk_out4<kMask>(x, t, inv); });
}

/*!
 * @brief Top-k mask (kMask: logits) or top-k renorm (probabilities) of float32 rows, one CTA a
 *   row (chunk = the row, laid out as ResidentChunk). The same outputs as TransformKernel, bit for
 *   bit: keys key_signed(x) (mask) or key_nonneg(max(x, 0)) (renorm; NaN counts as 0), t the k-th
 *   largest key (0: k <= 0 or k >= vocab, everything kept), kept x (mask; else -inf) or
 *   max(x, 0) * (scale / kept mass) (renorm; else 0), masses in renorm_write's 64-bit fixed
 *   point. The threshold: a lower bound L (the k-th largest of the threads' two largest keys, to
 *   16 bits: at least k keys lie at or above it), then passes that list the keys above L: fewer
 *   than k, t = L; a list that fits, its k-th largest; else (an overflow, k beyond the list, or
 *   no bound: k beyond the threads' keys) radix rounds, each pass binning the next 8 bits of
 *   the keys above L, until the keys at or above the chosen digits fit a list. The registers'
 *   unrolled code runs once per warp and is fetched once per SM, so it is kept minimal: a pass
 *   marks a bit per element above L and the marked elements (a few hundred a row) are read
 *   again from the row. (A scalar k that topk_streams takes TopKStreamKernel instead.)
 */
template <int kVecs, bool kMask>
__global__ void __launch_bounds__(kResThreads, 1)
    TopKResidentKernel(const float* __restrict__ in, int64_t stride, int64_t vocab, int smem_vecs,
                       TransformParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int T = kResThreads, kWarps = kResThreads / 32, kWords = kMarkWords<kVecs>;
  __shared__ uint32_t hist[256];
  __shared__ uint32_t cand[kResCandidates];
  __shared__ unsigned long long red64[kWarps];
  __shared__ uint32_t pick[2];
  __shared__ uint32_t n_cand;
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;
  const float* const row_ptr = in + row * stride;
  const ResidentChunk c = resident_chunk<kVecs>(row_ptr, vocab, vocab / 4, smem_vecs, 0, smem);
  pdl_wait();
  const int k = p.top_k(row);
  auto key = [](float x) { return topk_key<kMask>(x); };
  auto key_value = [](uint32_t q) { return topk_key_value<kMask>(q); };
  uint32_t mk = 0, mk2 = 0;  // this thread's two largest keys
  auto track = [&](float4 x) {
    const uint32_t q[4] = {key(x.x), key(x.y), key(x.z), key(x.w)};
#pragma unroll
    for (int i = 0; i < 4; ++i) mk2 = max(mk2, min(mk, q[i])), mk = max(mk, q[i]);
  };
  float4 v[kVecs];
  resident_load(c, v, track, [&](float4(&r)[kVecs]) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j)
      if (j < c.slots) track(r[j]);
  });
  pdl_launch_dependents();
  uint32_t t = 0, L = 0, n = 0;
  bool from_list = false;  // t is the list's k-th largest: the list holds every kept key
  if (k > 0 && k < vocab) {
    const uint32_t kk = static_cast<uint32_t>(k);
    // (The threads' two largest keys are distinct elements: the k-th largest of them bounds.)
    const bool bounded = kk <= 2 * T;
    L = bounded ? block_kth_key([&](auto f) { f(mk), f(mk2); }, kk, 16, hist, pick) : 0u;
    // Radix rounds where a list would overflow (k beyond it, or no bound), and after any pass
    // whose list did; a list again once the keys at or above the chosen digits fit it.
    bool radix = kk > kResCandidates || (!bounded && vocab > kResCandidates);
    uint32_t prefix = 0, pmask = 0;
    int shift = 24;
    for (;;) {
      if (tid == 0) n_cand = 0;
      if (radix)
        for (int i = tid; i < 256; i += T) hist[i] = 0;
      __syncthreads();
      // A key above L: listed, or (radix) binned where it matches the digits chosen so far.
      auto take = [&](uint32_t q, uint32_t& at) {
        if (radix) {
          if ((q & pmask) == prefix) atomicAdd(&hist[(q >> shift) & 255u], 1u);
        } else {
          if (at < kResCandidates) cand[at] = q;
          ++at;
        }
      };
      // A float test first (one compare an element): every key above L passes it (with
      // some at L, and NaNs on the mask); the exact key decides after.
      const float Lf = key_value(L);
      auto maybe = [Lf](float x) { return kMask ? !(x < Lf) : x >= Lf; };
      uint32_t bits[kWords];
      resident_mark(c, v, maybe, bits);
      uint32_t any = 0;
#pragma unroll
      for (int w = 0; w < kWords; ++w) any |= bits[w];
      if (any) {  // the marked elements read again from the row: count, then take
        auto marked_key = [&](uint32_t w, uint32_t m) { return key(resident_marked(row_ptr, w, m)); };
        uint32_t above = 0;
#pragma unroll
        for (int w = 0; w < kWords; ++w)
          for (uint32_t m = bits[w]; m; m &= m - 1) above += marked_key(w, m) > L;
        if (above) {
          uint32_t at = atomicAdd(&n_cand, above);
#pragma unroll
          for (int w = 0; w < kWords; ++w)
            for (uint32_t m = bits[w]; m; m &= m - 1) {
              const uint32_t q = marked_key(w, m);
              if (q > L) take(q, at);
            }
        }
      }
      resident_off_registers(c, [&](float4 x) {
        if (!(maybe(x.x) || maybe(x.y) || maybe(x.z) || maybe(x.w))) return;
        const uint32_t q[4] = {key(x.x), key(x.y), key(x.z), key(x.w)};
        const uint32_t above = (q[0] > L) + (q[1] > L) + (q[2] > L) + (q[3] > L);
        if (above) {
          uint32_t at = atomicAdd(&n_cand, above);
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (q[i] > L) take(q[i], at);
        }
      });
      __syncthreads();
      n = n_cand;
      if (n < kk) {  // L's own count makes up the rest: at least k keys are >= L
        t = L;
        break;
      }
      if (radix) {  // n >= k > the list: the next digit
        // The keys above the prefix's group (all above L) are n less the group's.
        uint32_t group = 0;
        for (int i = 0; i < 256; ++i) group += hist[i];
        if (tid < 32) pick_digit(hist, kk - (n - group), pick);
        __syncthreads();
        // The keys above L at or above the chosen digits: above the group, and the group's.
        const uint32_t at_least = (n - group) + pick[1] + hist[pick[0]];
        prefix |= pick[0] << shift;
        pmask |= 255u << shift;
        __syncthreads();  // (pick and hist reusable)
        if (shift == 0) {
          t = prefix;
          break;
        }
        shift -= 8;
        // Keys > L: the prefix's group and those above it (t > L stays: t > the old L too).
        L = prefix && prefix - 1 > L ? prefix - 1 : L;
        radix = at_least > kResCandidates;
        continue;
      }
      if (n > kResCandidates) {
        // The list overflowed: radix rounds from here (raising L to the listed part's k-th
        // largest and listing again crept up ~2% of the row a pass: 7.8 ms at k = 4000).
        radix = true;
        continue;
      }
      t = block_kth_key(
          [&](auto f) {
            for (uint32_t i = tid; i < n; i += T) f(cand[i]);
          },
          kk, 32, hist, pick);
      from_list = true;
      break;
    }
  }
  float4* const dst = reinterpret_cast<float4*>(static_cast<float*>(p.out) + row * p.out_stride);
  float inv = 0.f;
  if constexpr (!kMask) {
    // The kept mass at the row max's scale: from the list where it holds every kept key (t
    // above L), else a pass.
    const RenormMass w = renorm_mass(block_all_u64(mk, red64, MaxU64{}));
    unsigned long long kept = 0;
    if (!from_list) {
      resident_for_each(c, v, [&](float4 x) {
        const uint32_t q[4] = {key(x.x), key(x.y), key(x.z), key(x.w)};
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (q[i] >= t) kept += w.fixed(q[i]);
      });
    } else {
      for (uint32_t i = tid; i < n; i += T)
        if (cand[i] >= t) kept += w.fixed(cand[i]);
    }
    inv = w.inv(block_all_u64(kept, red64, SumU64{}));
  }
  auto m = [&](float4 x) { return topk_out4<kMask>(x, t, inv); };
  resident_store(c, v, dst, m, m);
}

/// Top-k mask / renorm of float32 rows by topk_stream_row, one CTA a row: k a scalar that
/// topk_streams (the host's choice), kStreamSmem of dynamic shared memory.
template <bool kMask>
__global__ void __launch_bounds__(kResThreads, 1)
    TopKStreamKernel(const float* __restrict__ in, int64_t stride, int64_t vocab,
                     TransformParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ uint32_t hist[256];
  __shared__ unsigned long long red64[kResThreads / 32];
  __shared__ uint32_t pick[2];
  __shared__ uint32_t n_cand;
  const int64_t row = blockIdx.x;
  pdl_wait();
  topk_stream_row<kMask>(reinterpret_cast<const float4*>(in + row * stride), vocab, p.top_k(row),
                         static_cast<float*>(p.out) + row * p.out_stride, smem, hist, red64,
                         pick, n_cand);
}

// ------------------------------------------------------------------------------------------------
// Top-p renorm with every row on chip (TopPResidentKernel)
//
// The threshold by mass needs the whole row before anything is written, so the row is held
// (ResidentChunk, one CTA a row) and searched on chip. While it loads, every value is counted in
// the direct path's bins of 1/16 octave (mass_hist_add's prefix), each bin's 24-bit significands
// summed exactly (two u32 words: the top 12 bits' sum and the low 12 bits'). Within 17 octaves
// of the row max a value's fixed-point weight is its significand shifted, so those bins' masses
// are exact; below, within a bound. The block scans the window below the max for the bins that
// may hold t (usually one) and the bounds of the row's mass M; one pass over the held row lists
// the keys in those bins, and t comes from the list by radix rounds of mass, against both ends
// of the target's bounds: where they agree (the bins exact, the target's uncertainty, a few
// thousand units of the inexact octaves, inside one step of the mass), t and its kept mass are
// exact without weighing the row value by value. Otherwise (rare: t deeper than 17 octaves, a
// list that overflows, a target whose bounds straddle a step, no window: a max below 2^-85, or
// of 2 or more) the held row is weighed value by value for M, and the rounds run over the
// list, or over the whole row read again from global memory where the list does not hold t.

/// TopPResidentKernel's histogram bins: the 1/16-octave prefixes of the values below 2 (a max
/// of 2 or more takes the slow path: larger values share the last bin).
inline constexpr int kTopPBins = 128 * kMassPerOctave;
/// Keys TopPResidentKernel lists (aliasing its histogram once scanned).
inline constexpr int kTopPList = 2 * kTopPBins;
/// Bins of the window below the max (exponents emax - 40 .. emax; lower ones weigh 0), and its
/// exact ones (emax - 17 .. emax: a weight is the significand shifted left).
inline constexpr int kTopPWindow = 41 * kMassPerOctave;
inline constexpr int kTopPExact = 18 * kMassPerOctave;

/// Add x to TopPResidentKernel's histogram (kTopPBins words of the top 12 bits' sums, then
/// kTopPBins of the low 12 bits'): max(x, 0)'s bin gets its 24-bit significand, exactly (below
/// 2^30 a word for 2^18 values). Branch-free (the registers' copy is unrolled: its size costs
/// time): zeros and subnormals go to the exponent-0 bins, values of 2 and more (+inf too) to the
/// last bin, which no window reads (42 <= emax < 128); NaN and negatives count as 0.
__device__ __forceinline__ void topp_hist_add(uint32_t hist_s, float x) {
  const uint32_t u = __float_as_uint(fmaxf(x, 0.f));
  const uint32_t at = hist_s + min(u >> (23 - kMassMantissa), uint32_t{kTopPBins - 1}) * 4;
  asm volatile("red.shared.add.u32 [%0], %1;" ::"r"(at), "r"(((u >> 12) & 0x7ffu) | 0x800u));
  asm volatile("red.shared.add.u32 [%0], %1;" ::"r"(at + kTopPBins * 4), "r"(u & 4095u));
}

/// TopPResidentKernel's block-shared state: the window scan's verdict (t's candidate keys [lo,
/// hi); a, the exact mass above them; the bounds of M) and the select's picks.
struct TopPShared {
  uint32_t lo, hi;
  int w_hi, w_lo;
  unsigned long long a, m_lo, m_hi;
  unsigned long long scan[2][kResThreads / 32];
  uint32_t pick;
  unsigned long long above, bin;
  uint32_t n;
};

/// Bounds of the fixed-point mass of window bin w (from the top; exponent emax's bins first)
/// of a row max with exponent field emax: significand sum S (exact), weights S 2^d for d = E -
/// emax + 17 >= 0, else within n (the bin's count, <= the top halves' sum / 2^11) below
/// floor(S / 2^-d) (mass_window_merge's bounds, whose sums are themselves bounds).
__device__ __forceinline__ void topp_bin(const uint32_t* hi, const uint32_t* lo, uint32_t emax,
                                         int w, unsigned long long* l, unsigned long long* h) {
  const int b = static_cast<int>(emax) * kMassPerOctave + kMassPerOctave - 1 - w;
  const int d = b / kMassPerOctave - static_cast<int>(emax) + 17;
  const unsigned long long S = (static_cast<unsigned long long>(hi[b]) << 12) + lo[b];
  if (d >= 0) {
    *l = *h = S << d;
  } else {
    const unsigned long long f = S >> -d, n = hi[b] >> 11;
    *l = f > n ? f - n : 0ull, *h = f;
  }
}

/*!
 * @brief Block-wide window scan (42 <= emax < 128): thread i holds window bins 2i and 2i + 1;
 *   the bounds of the mass at and above each bin by a block scan; t's bins run from the first
 *   (from the top) whose upper bound may reach the target's lower bound t_lo = floor(p m_lo) +
 *   1 to the first whose lower bound surely reaches t_hi (none: below the window). Leaves in
 *   `s`: m_lo, m_hi; lo, hi (keys; lo = hi = 0 where t_lo > m_hi: nothing to list, all kept,
 *   or where the bins reach below the exact octaves: the exact path decides); a, the mass above
 *   hi (exact: every bin above hi is). Ends with a barrier.
 */
__device__ __forceinline__ void topp_window(const uint32_t* hi, const uint32_t* lo, uint32_t emax,
                                            float top_p, TopPShared* s) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int w0 = 2 * tid;
  unsigned long long l0 = 0, h0 = 0, l1 = 0, h1 = 0;
  if (w0 < kTopPWindow) {
    topp_bin(hi, lo, emax, w0, &l0, &h0);
    topp_bin(hi, lo, emax, w0 + 1, &l1, &h1);
  }
  unsigned long long il = l0 + l1, ih = h0 + h1;  // inclusive scans from thread 0 (the top)
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long a = __shfl_up_sync(0xffffffffu, il, o),
                             b = __shfl_up_sync(0xffffffffu, ih, o);
    if (lane >= o) il += a, ih += b;
  }
  if (lane == 31) s->scan[0][warp] = il, s->scan[1][warp] = ih;
  if (tid == 0) s->w_hi = s->w_lo = kTopPWindow;
  __syncthreads();
  unsigned long long m_lo = 0, m_hi = 0;
  for (int v = 0; v < kResThreads / 32; ++v) {
    if (v < warp) il += s->scan[0][v], ih += s->scan[1][v];
    m_lo += s->scan[0][v], m_hi += s->scan[1][v];
  }
  const unsigned long long t_lo = top_p_limit(top_p, m_lo) + 1, t_hi = top_p_limit(top_p, m_hi) + 1;
  // Running bounds at and above bins w0 + 1 and w0 (exclusive: minus the bins themselves).
  if (w0 < kTopPWindow) {
    if (ih - h1 >= t_lo) atomicMin(&s->w_hi, w0);
    else if (ih >= t_lo) atomicMin(&s->w_hi, w0 + 1);
    if (il - l1 >= t_hi) atomicMin(&s->w_lo, w0);
    else if (il >= t_hi) atomicMin(&s->w_lo, w0 + 1);
  }
  __syncthreads();
  const int w_hi = s->w_hi, w_lo = s->w_lo;
  if (tid == 0) {
    s->m_lo = m_lo, s->m_hi = m_hi, s->lo = s->hi = 0u, s->a = 0;
  }
  // The thread of w_hi: the mass above it (exact where every bin above is).
  if (t_lo <= m_hi && (w0 == w_hi || w0 + 1 == w_hi)) {
    const int top = static_cast<int>(emax) * kMassPerOctave + kMassPerOctave - 1;
    // t's bins within the exact octaves (and so above the window's end).
    if (w_lo < kTopPExact) {
      s->hi = static_cast<uint32_t>(top - w_hi + 1) << 20;
      s->lo = static_cast<uint32_t>(top - w_lo) << 20;
      s->a = w0 == w_hi ? il - l0 - l1 : il - l1;
    }
  }
  __syncthreads();
}

/*!
 * @brief The largest key t in [lo, hi) whose visited keys in [t, hi) weigh at least `target`
 *   (>= 1; *ok false where all of them weigh less), a key's weight w.fixed(key); returns t and
 *   the weight of the visited keys in [t, hi) in *kept. Radix rounds of 8 bits below lo's and
 *   hi - 1's common prefix, each a histogram of the keys that match the digits chosen so far:
 *   their weights in three u32 words of 14 bits (exact up to 2^18 keys), their count and their
 *   largest key, so that a chosen bin of one key ends the search. visit(f) calls f(key, valid)
 *   on whole warps (every lane the same number of times: full-warp intrinsics); a warp whose
 *   keys share one bin adds once. Block-wide; h: 5 x 256 words.
 */
template <typename Visit>
__device__ uint32_t topp_select(Visit visit, unsigned long long target, uint32_t lo, uint32_t hi,
                                const RenormMass& w, uint32_t* h, TopPShared* s,
                                unsigned long long* kept, bool* ok) {
  constexpr unsigned kAll = 0xffffffffu;
  const int tid = threadIdx.x, lane = tid & 31;
  const uint32_t span = lo ^ (hi - 1u);
  int top_bit = span ? 32 - __clz(span) : 0;  // bits below the common prefix
  const uint32_t low_mask = top_bit >= 32 ? 0xffffffffu : (1u << top_bit) - 1u;
  uint32_t prefix = lo & ~low_mask, pmask = ~low_mask;
  *kept = 0;
  *ok = true;
  while (top_bit > 0) {
    const int shift = top_bit > 8 ? top_bit - 8 : 0, width = top_bit - shift;
    for (int i = tid; i < 5 * 256; i += kResThreads) h[i] = 0;
    __syncthreads();
    visit([&](uint32_t q, bool valid) {
      const bool in = valid && q >= lo && q < hi && (q & pmask) == prefix;
      const uint32_t d = in ? (q >> shift) & ((1u << width) - 1u) : 256u;
      const unsigned long long v = in ? w.fixed(q) : 0ull;
      const uint32_t p0 = static_cast<uint32_t>(v) & 0x3fffu,
                     p1 = static_cast<uint32_t>(v >> 14) & 0x3fffu,
                     p2 = static_cast<uint32_t>(v >> 28);
      if (__match_any_sync(kAll, d) == kAll) {  // (uniform: in too)
        if (in) {
          const uint32_t s0 = __reduce_add_sync(kAll, p0), s1 = __reduce_add_sync(kAll, p1),
                         s2 = __reduce_add_sync(kAll, p2), mx = __reduce_max_sync(kAll, q);
          if (lane == 0) {
            atomicAdd(h + d, s0), atomicAdd(h + 256 + d, s1), atomicAdd(h + 512 + d, s2);
            atomicAdd(h + 768 + d, 32u), atomicMax(h + 1024 + d, mx);
          }
        }
      } else if (in) {
        atomicAdd(h + d, p0), atomicAdd(h + 256 + d, p1), atomicAdd(h + 512 + d, p2);
        atomicAdd(h + 768 + d, 1u), atomicMax(h + 1024 + d, q);
      }
    });
    __syncthreads();
    if (tid < 32) {  // lane l: digits 255 - 8l down to 248 - 8l; the mass above them by a scan
      auto mass = [h](int d) {
        return h[d] + (static_cast<unsigned long long>(h[256 + d]) << 14) +
               (static_cast<unsigned long long>(h[512 + d]) << 28);
      };
      unsigned long long sum = 0;
#pragma unroll 1
      for (int i = 0; i < 8; ++i) sum += mass(255 - 8 * lane - i);
      unsigned long long incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(kAll, incl, o);
        if (lane >= o) incl += y;
      }
      unsigned long long run = incl - sum;
      if (run < target && target <= incl) {
#pragma unroll 1
        for (int i = 0; i < 8; ++i) {
          const unsigned long long m = mass(255 - 8 * lane - i);
          if (target <= run + m) {
            s->pick = 255 - 8 * lane - i, s->above = run, s->bin = m;
            break;
          }
          run += m;
        }
      }
      if (lane == 31 && incl < target) s->pick = 256u;  // the keys weigh less than the target
    }
    __syncthreads();
    const uint32_t d = s->pick;
    const unsigned long long above = s->above, bin = s->bin;
    const uint32_t count = d < 256u ? h[768 + d] : 0u, largest = d < 256u ? h[1024 + d] : 0u;
    __syncthreads();  // (s and h reusable)
    if (d == 256u) {
      *ok = false;
      break;
    }
    target -= above;
    *kept += above;
    prefix |= d << shift;
    pmask |= ((1u << width) - 1u) << shift;
    top_bit = shift;
    if (top_bit == 0 || count == 1u) {  // (one key in the bin: it is t)
      *kept += bin;
      if (count == 1u) prefix = largest;
      break;
    }
  }
  return prefix;
}

/*!
 * @brief Top-p renorm of float32 probability rows, one CTA a row (chunk = the row, laid out as
 *   ResidentChunk). The same outputs as TransformKernel, bit for bit: values clamped to 0 (NaN
 *   counts as 0), fixed-point weights at the row max's scale (fixed_scale), t the largest key
 *   whose mass at and above reaches floor(top_p M) + 1 (none: everything kept), kept values x *
 *   (scale / kept mass), others 0. The search: see the section's comment. The listing pass
 *   counts the registers' candidates, then lists them from the registers (unrolled, ~0.8K
 *   instructions: 2.3 us faster at p = 0.9 than re-reading bit-marked ones from the row, whose
 *   lines the load had read evict-first; the code fetch is not what costs here: a second
 *   listing pass in the same launch costs what the first does).
 */
template <int kVecs>
__global__ void __launch_bounds__(kResThreads, 1)
    TopPResidentKernel(const float* __restrict__ in, int64_t stride, int64_t vocab, int smem_vecs,
                       TransformParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int T = kResThreads;
  __shared__ uint32_t hist[2 * kTopPBins];  // (hi, lo); then the list
  __shared__ uint32_t hsel[5 * 256];  // the select's histograms
  __shared__ unsigned long long red64[T / 32];
  __shared__ TopPShared sh;
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;
  const float* const row_ptr = in + row * stride;
  const ResidentChunk c = resident_chunk<kVecs>(row_ptr, vocab, vocab / 4, smem_vecs, 0, smem);
  uint32_t* const hi = hist;
  uint32_t* const lo = hist + kTopPBins;
  for (int i = tid; i < 2 * kTopPBins; i += T) hist[i] = 0;
  if (tid == 0) sh.n = 0;
  __syncthreads();
  pdl_wait();
  const float top_p = p.top_p(row);
  auto key = [](float x) { return topk_key<false>(x); };
  const uint32_t hist_s = static_cast<uint32_t>(__cvta_generic_to_shared(hist));
  float mx = 0.f;
  auto add = [&](float4 x) {
    mx = fmaxf(mx, fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)));
    topp_hist_add(hist_s, x.x), topp_hist_add(hist_s, x.y);
    topp_hist_add(hist_s, x.z), topp_hist_add(hist_s, x.w);
  };
  float4 v[kVecs];
  resident_load(c, v, add, [&](float4(&r)[kVecs]) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j)
      if (j < c.slots) add(r[j]);
  });
  pdl_launch_dependents();
  const uint32_t max_key = static_cast<uint32_t>(block_all_u64(key(mx), red64, MaxU64{}));
  const RenormMass w = renorm_mass(max_key);
  const uint32_t emax = max_key >> 24;
  const bool window = emax >= 42u && emax < 128u;
  if (window) {
    topp_window(hi, lo, emax, top_p, &sh);
  } else {  // (uniform)
    if (tid == 0) sh.lo = sh.hi = 0u;
    __syncthreads();
  }
  // Keys in [lo, hi) listed (over the histogram, read by now: topp_window ends with a barrier).
  const uint32_t klo = sh.lo, khi = sh.hi;
  uint32_t* const list = hist;
  if (khi > klo) {
    const float flo = __uint_as_float(klo >> 1), fhi = __uint_as_float(khi >> 1);
    auto maybe = [flo, fhi](float x) { return x >= flo && x < fhi; };
    // The registers' candidates counted, then listed from the registers (invalid slots hold
    // -inf: never candidates).
    uint32_t marked = 0;
#pragma unroll
    for (int j = 0; j < kVecs; ++j)
      marked += (uint32_t{maybe(v[j].x)} + uint32_t{maybe(v[j].y)}) +
                (uint32_t{maybe(v[j].z)} + uint32_t{maybe(v[j].w)});
    if (marked) {
      uint32_t at = atomicAdd(&sh.n, marked);
      auto put = [&](float x) {
        if (maybe(x)) {
          if (at < kTopPList) list[at] = key(x);
          ++at;
        }
      };
#pragma unroll
      for (int j = 0; j < kVecs; ++j) put(v[j].x), put(v[j].y), put(v[j].z), put(v[j].w);
    }
    resident_off_registers(c, [&](float4 x) {
      const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (maybe(xs[i])) {
          const uint32_t at = atomicAdd(&sh.n, 1u);
          if (at < kTopPList) list[at] = key(xs[i]);
        }
    });
  }
  __syncthreads();
  const uint32_t n = sh.n;
  const bool listed = khi > klo && n <= static_cast<uint32_t>(kTopPList);
  const int lane = tid & 31;
  auto over_list = [&](auto f) {  // (whole warps)
    for (uint32_t i = tid - lane; i < n; i += T) f(i + lane < n ? list[i + lane] : 0u, i + lane < n);
  };
  uint32_t t = 0;
  unsigned long long kept = 0;
  bool done = false;
  if (window) {
    // The target's bounds from M's; t from the list where both give the same (exact) answer.
    const unsigned long long m_lo = sh.m_lo, m_hi = sh.m_hi, a = sh.a;
    const unsigned long long t_lo = top_p_limit(top_p, m_lo) + 1, t_hi = top_p_limit(top_p, m_hi) + 1;
    if (t_lo > m_lo && t_hi > m_hi) {
      // Everything kept (floor(p M) >= M at both ends: p = 1, or M = 0): inv from M's bounds
      // where they agree.
      done = w.inv(m_lo) == w.inv(m_hi);
      kept = m_lo;
    } else if (listed && a < t_lo) {
      bool ok;
      t = topp_select(over_list, t_lo - a, klo, khi, w, hsel, &sh, &kept, &ok);
      kept += a;
      done = ok && kept >= t_hi;
    }
  }
  if (!done) {  // (rare) M exactly: the held row weighed value by value
    unsigned long long m = 0;
    resident_for_each(c, v, [&](float4 x) {
      m += (w.fixed(key(x.x)) + w.fixed(key(x.y))) + (w.fixed(key(x.z)) + w.fixed(key(x.w)));
    });
    const unsigned long long M = block_all_u64(m, red64, SumU64{});
    const unsigned long long target = top_p_limit(top_p, M) + 1;
    t = 0, kept = M;
    if (target <= M) {
      bool ok = false;
      const unsigned long long a = sh.a;
      if (listed && a < target) {
        t = topp_select(over_list, target - a, klo, khi, w, hsel, &sh, &kept, &ok);
        kept += a;
      }
      if (!ok) {
        t = topp_select(
            [&](auto f) {  // (whole warps)
              for (int64_t i = tid - lane; i < vocab; i += T)
                f(i + lane < vocab ? key(__ldg(row_ptr + i + lane)) : 0u, i + lane < vocab);
            },
            target, 0u, 0xffffffffu, w, hsel, &sh, &kept, &ok);
      }
    }
  }
  const float inv = w.inv(kept);
  float4* const dst = reinterpret_cast<float4*>(static_cast<float*>(p.out) + row * p.out_stride);
  auto m = [&](float4 x) { return topk_out4<false>(x, t, inv); };
  resident_store(c, v, dst, m, m);
}

struct ChainParams {
  const float* draft;   ///< (b, n, V)
  const int32_t* ids;   ///< (b, n)
  const float* target;  ///< (b, n + 1, V)
  int64_t draft_s0, draft_s1, target_s0, target_s1, ids_s0;
  int n;
  int64_t vocab;
  RngArgs rng;
  int32_t* out;  ///< (b, n + 1)
  int32_t* accepted;
  int32_t* emitted;
};

/// Accept the draft prefix of batch row `row`, then draw the resampled or bonus token.
__device__ __forceinline__ void chain_row(RowCtx& ctx, const ChainParams& p, int64_t row) {
  Philox rng = p.rng.make(row);
  // Every thread runs the (short) acceptance chain: the same draws, the same answer. Four
  // positions' loads at a time (independent), then their tests in order.
  int reject = p.n, independent = 0;
  for (int i0 = 0; i0 < p.n; i0 += 4) {
    int32_t tok[4];
    float q[4], pt[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) tok[j] = i0 + j < p.n ? p.ids[row * p.ids_s0 + i0 + j] : -1;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool in = tok[j] >= 0 && tok[j] < p.vocab;
      q[j] = in ? p.draft[row * p.draft_s0 + (i0 + j) * p.draft_s1 + tok[j]] : 0.f;
      pt[j] = in ? p.target[row * p.target_s0 + (i0 + j) * p.target_s1 + tok[j]] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (i0 + j >= p.n) break;
      const float u = static_cast<float>(rng.next()) * 0x1p-32f;
      const bool ok = tok[j] >= 0 && tok[j] < p.vocab && u * q[j] < pt[j];
      independent += ok;
      if (!ok && reject == p.n) reject = i0 + j;
    }
  }
  const uint32_t r = rng.next();
  const float* t_row = p.target + row * p.target_s0 + reject * p.target_s1 + ctx.begin;
  const float* d_row = p.draft + row * p.draft_s0 + reject * p.draft_s1 + ctx.begin;
  const bool resample = reject < p.n;
  // max(target - draft, 0) (resampling) or max(target, 0) (the bonus token) into the chunk:
  // 16-byte loads, U per thread and row in flight, where both rows are 16-byte aligned.
  int done = 0;
  if (((reinterpret_cast<uintptr_t>(t_row) | reinterpret_cast<uintptr_t>(d_row)) & 15) == 0) {
    constexpr int U = 4;
    const float4* t4 = reinterpret_cast<const float4*>(t_row);
    const float4* d4 = reinterpret_cast<const float4*>(d_row);
    float4* v4 = reinterpret_cast<float4*>(ctx.vals);
    const int nv = ctx.n / 4;
    for (int g0 = 0; g0 < nv; g0 += U * ctx.nthreads) {
      float4 a[U], b[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int g = g0 + u * ctx.nthreads + ctx.tid;
        b[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (g < nv) {
          a[u] = __ldg(t4 + g);
          if (resample) b[u] = __ldg(d4 + g);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int g = g0 + u * ctx.nthreads + ctx.tid;
        if (g < nv)
          v4[g] = make_float4(fmaxf(a[u].x - b[u].x, 0.f), fmaxf(a[u].y - b[u].y, 0.f),
                              fmaxf(a[u].z - b[u].z, 0.f), fmaxf(a[u].w - b[u].w, 0.f));
      }
    }
    done = nv * 4;
  }
  for (int i = done + ctx.tid; i < ctx.n; i += ctx.nthreads) {
    const float tv = t_row[i];
    ctx.vals[i] = fmaxf(resample ? tv - d_row[i] : tv, 0.f);
  }
  __syncthreads();
  bool nan;
  const float mx =
      cluster_reduce_f(ctx, first_pass(ctx, false, [](float x) { return x; }, &nan), 0, true);
  ctx.scale = fixed_scale(mx);
  unsigned long long kept;
  int64_t col = draw(ctx, 0, r, 0, &kept);
  if (kept == 0 && ctx.rank == 0 && ctx.tid == 0) col = 0;
  if (col >= 0) {
    int32_t* o = p.out + row * (p.n + 1);
    for (int i = 0; i <= p.n; ++i) {
      o[i] = i < reject ? p.ids[row * p.ids_s0 + i] : (i == reject ? static_cast<int32_t>(col) : -1);
    }
    p.accepted[row] += independent;
    p.emitted[row] += reject;
  }
}

/// One cluster (or one CTA) per batch row. A template (of nothing) so that only the translation
/// unit that launches it compiles it.
template <int kUnused = 0>
__global__ void __launch_bounds__(kThreads, 3) ChainKernel(int64_t chunk, RowGrid g,
                                                           ChainParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_wait();
  RowCtx ctx = row_ctx(smem, g, p.vocab, chunk, false);
  chain_row(ctx, p, row_of(g, ctx));
  row_sync(ctx);
}

// ------------------------------------------------------------------------------------------------
// Host launchers
// ------------------------------------------------------------------------------------------------

/*!
 * @brief Cluster size, chunk and threads for rows of `vocab` elements: the smallest cluster
 *   (power of two, <= 8) whose chunk is <= 64 KB of float32; rows beyond 8 x 64 KB take 8 CTAs of
 *   up to 200 KB, then 16 (a non-portable cluster size, which the H100 supports); kThreads each.
 */
inline RowPlan plan_rows(int64_t vocab) {
  int c = 1;
  while (c < 8 && ceil_div(vocab, c) > kPreferredChunk) c *= 2;
  if (ceil_div(vocab, c) > kMaxChunk) c = 16;
  const int64_t chunk = ceil_div(ceil_div(vocab, c), 8) * 8;
  const int threads = kThreads;
  return RowPlan{c, chunk, threads, static_cast<size_t>(chunk) * sizeof(float) + sizeof(Shared)};
}

/// The one-CTA-per-row path's global scratch: `rows` rows of `stride` floats (stride >= vocab,
/// a multiple of 4; 16-byte aligned). ptr == nullptr: the cluster path.
struct Scratch {
  float* ptr = nullptr;
  int64_t rows = 0, stride = 0;
};

/// Largest vocabulary the kernels take (16 CTAs of kMaxChunk elements).
inline constexpr int64_t kMaxVocab = 16 * kMaxChunk;

/// The direct kernels' clusters placed by the hardware's load balancing
/// (cudaClusterSchedulingPolicyLoadBalancing). By default the H100 put 128 clusters of 3 CTAs
/// of the direct top-p kernel on 124 SMs, 4 CTAs on 12 of them and none on 8, and those 4-CTA
/// SMs ended the streaming pass last; under load balancing the occupancy query holds 128
/// clusters of 4 and every SM streams (benchmarks/notes/sampling-cluster-radix.md, wave 25).
/// Set before the occupancy query (resident_clusters) and the launch alike. A preference: where
/// the runtime refuses it, the kernels run under the default placement.
template <typename Kernel>
void balance_clusters(Kernel kernel) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeClusterSchedulingPolicyPreference,
                           cudaClusterSchedulingPolicyLoadBalancing) != cudaSuccess)
    (void)cudaGetLastError();  // a refused preference is no error of the op
}

template <typename Kernel>
cudaError_t prepare(Kernel kernel, const RowPlan& plan) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(plan.smem));
  if (e != cudaSuccess) return e;
  // All of the unified L1/shared memory as shared memory: 3 CTAs of 64 KB chunks per SM.
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  if (plan.cluster > 8) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  }
  return e;
}

/// 16-byte accesses need the row start and every chunk start 16-byte aligned.
template <typename T>
inline bool rows_vectorizable(const void* ptr, int64_t stride, int64_t chunk) {
  return is_aligned(ptr, 16) && (stride * sizeof(T)) % 16 == 0 && (chunk * sizeof(T)) % 16 == 0;
}

/// Launch a row kernel (SampleKernel, TransformKernel) over `rows` rows of `vocab` T's: one
/// cluster per row, or (scratch set: SM80 and newer) one CTA per row, each holding its row in a
/// scratch row, in launches of at most scratch.rows rows.
template <typename T, typename Params>
cudaError_t launch_rows(void (*kernel)(const T*, int64_t, int64_t, int64_t, bool, RowGrid, Params),
                        const T* in, int64_t stride, int64_t rows, int64_t vocab,
                        const Params& params, const Scratch& scratch, bool enable_pdl,
                        cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (scratch.ptr) {
    const bool vec = rows_vectorizable<T>(in, stride, vocab);
    for (int64_t r0 = 0; r0 < rows; r0 += scratch.rows) {
      const RowGrid g{rows, r0, scratch.ptr, scratch.stride};
      const int64_t n = rows - r0 < scratch.rows ? rows - r0 : scratch.rows;
      const cudaError_t e = launch_kernel(kernel, dim3(n), dim3(kThreads), sizeof(Shared), stream,
                                          enable_pdl, in, stride, vocab, vocab, vec, g, params);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  const RowPlan plan = plan_rows(vocab);
  cudaError_t e = prepare(kernel, plan);
  if (e != cudaSuccess) return e;
  const bool vec = rows_vectorizable<T>(in, stride, plan.chunk);
  const RowGrid g{rows, 0, nullptr, 0};
  return launch_kernel_clustered(kernel, dim3(rows * plan.cluster), dim3(plan.threads), plan.smem,
                                 stream, enable_pdl, plan.cluster, in, stride, vocab, plan.chunk,
                                 vec, g, params);
}

/// SampleKernel's plan: plan_rows's cluster, a chunk of whole 512-column blocks (so blocks start
/// at multiples of 512 columns of the row), and the chunk's block sums and max keys (64 KB +
/// 9.6 KB + 0.25 KB at 128256 columns: still 3 CTAs per SM).
inline RowPlan plan_sample(int64_t vocab) {
  RowPlan plan = plan_rows(vocab);
  plan.chunk = ceil_div(ceil_div(vocab, plan.cluster), kBlockCols) * kBlockCols;
  plan.smem = static_cast<size_t>(plan.chunk) * sizeof(float) + sizeof(Shared) +
              static_cast<size_t>(plan.chunk / kBlockCols) * kBlockBytes;
  return plan;
}

/// SampleKernel<..., kDirect>'s plan for `rows` rows where plan_sample's clusters would not all be
/// resident at once (more than one wave of kCtasPerSm CTAs a SM): the largest cluster up to
/// plan_sample's for which `clusters_of(c, smem)` (the clusters of c CTAs the device holds at
/// once) holds every row, else one CTA a row; its chunk of whole 512-column blocks, and shared
/// memory for the Shared block and the chunk's block sums and max keys only (and `extra` bytes
/// after them: top-p's mass histogram). cluster 0: one wave of plan_sample's clusters holds the
/// rows (the copy into shared memory is faster).
template <typename ClustersOf>
inline RowPlan plan_direct(int64_t vocab, int64_t rows, int sms, ClustersOf clusters_of,
                           size_t extra = 0) {
  constexpr int kCtasPerSm = 3;  // SampleKernel's __launch_bounds__ (and its 64 KB chunks)
  const RowPlan base = plan_sample(vocab);
  if (rows * base.cluster <= static_cast<int64_t>(sms) * kCtasPerSm || base.cluster > 8)
    return RowPlan{0, 0, 0, 0};
  auto plan_of = [vocab, extra](int c) {
    const int64_t chunk = ceil_div(ceil_div(vocab, c), kBlockCols) * kBlockCols;
    return RowPlan{c, chunk, kThreads,
                   sizeof(Shared) + static_cast<size_t>(chunk / kBlockCols) * kDirectBlockBytes +
                       extra};
  };
  for (int c = base.cluster; c > 1; --c) {
    const RowPlan plan = plan_of(c);
    if (rows <= clusters_of(c, plan.smem)) return plan;
  }
  return plan_of(1);
}

/// The clusters of `c` CTAs of `kernel` (`smem` bytes of dynamic shared memory each) that device
/// `dev` holds at once (cudaOccupancyMaxActiveClusters; 0 where the query fails), asked once per
/// device and size: the H100 held fewer than 4 CTAs a SM of the direct kernel in clusters of 4,
/// though its registers allow 4 (benchmarks/notes/sampling-cluster-radix.md, wave 17). kSet:
/// the kernel's filter set (each kernel's answers are kept apart); `threads` a CTA. (Kept per
/// size, not per `smem`: each kernel asks with one smem a size, or, SoftmaxResidentKernel, holds
/// one CTA a SM by its registers whatever its shared memory.)
template <unsigned kSet, typename Kernel>
inline int resident_clusters(Kernel kernel, int dev, int c, size_t smem, int threads = kThreads) {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices][9];  // clusters + 1; 0: not asked yet
  if (dev < kDevices && c <= 8) {
    const int k = known[dev][c].load(std::memory_order_relaxed);
    if (k) return k - 1;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(c);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = c;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int n = 0;
  // The launch's attributes (prepare, balance_clusters), the carveout included. (H100, 128256
  // columns, the default placement: 124 resident clusters of 3 of the 80-register top-p
  // kernel's 65 KB CTAs, so 128 rows took clusters of 2; 3 forced: 70.4 us against 51.5, the
  // last clusters in a second wave.)
  balance_clusters(kernel);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared) != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();  // a failed query leaves no sticky error: plan without it
    n = 0;
  }
  if (dev < kDevices && c <= 8) known[dev][c].store(n + 1, std::memory_order_relaxed);
  return n;
}

/// Device attribute kAttr of device `dev`, asked once per device (a nonzero answer is kept).
template <cudaDeviceAttr kAttr>
inline cudaError_t device_attribute(int dev, int* out) {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices];  // 0: not asked yet
  if (dev >= 0 && dev < kDevices) {
    const int n = known[dev].load(std::memory_order_relaxed);
    if (n) {
      *out = n;
      return cudaSuccess;
    }
  }
  const cudaError_t e = cudaDeviceGetAttribute(out, kAttr, dev);
  if (e == cudaSuccess && dev >= 0 && dev < kDevices)
    known[dev].store(*out, std::memory_order_relaxed);
  return e;
}

/// The SM count of device `dev`.
inline cudaError_t sm_count(int dev, int* out) {
  return device_attribute<cudaDevAttrMultiProcessorCount>(dev, out);
}

/// SampleKernel<float, kFilters, true> (the direct path: each row on chip in a cluster) where
/// its plan holds the rows. false: not taken (*err untouched). A template declared extern for
/// top-p below, so that its kernel compiles in a translation unit of its own
/// (csrc/sampling_top_p_direct.cu) beside top-p's other float32 kernel; the draw's in
/// csrc/sampling_draw.cu.
template <unsigned kFilters>
bool sample_direct(const float* in, int64_t stride, int64_t num_out, int64_t vocab,
                   const SampleParams& params, bool enable_pdl, cudaStream_t stream,
                   cudaError_t* err) {
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = sm_count(dev, &sms);
  if (e != cudaSuccess) {
    *err = e;
    return true;
  }
  auto* const direct = &SampleKernel<float, kFilters, true>;
  const RowPlan plan = plan_direct(
      vocab, num_out, sms,
      [&](int c, size_t smem) { return resident_clusters<kFilters>(direct, dev, c, smem); },
      kFilters == kTopPFilters ? kMassHistBytes : 0);
  // Min-p re-reads its kept steps (refine_block_sums), top-p its row where a candidate is
  // undecided: with one CTA a row min-p lost to the copy (H100, 256 x 128256: 98.7 vs 89.6
  // us; benchmarks/notes/sampling-cluster-radix.md).
  if (params.logits || !plan.cluster || (params.filter != kNoFilter && plan.cluster < 2) ||
      ceil_div(vocab, kBlockCols) > kLocateMaxBlocks ||
      !rows_vectorizable<float>(in, stride, plan.chunk))
    return false;
  e = prepare(direct, plan);
  if (e == cudaSuccess) {
    balance_clusters(direct);
    e = launch_kernel_clustered(direct, dim3(num_out * plan.cluster), dim3(plan.threads),
                                plan.smem, stream, enable_pdl, plan.cluster, in, stride, vocab,
                                plan.chunk, true, RowGrid{num_out, 0, nullptr, 0}, params);
  }
  *err = e;
  return true;
}

/// Declare (PREFIX extern) or define (PREFIX empty) sample_direct<SET>.
#define FLASHINFER_SAMPLE_DIRECT(PREFIX, SET)                                                      \
  PREFIX template bool sample_direct<SET>(const float*, int64_t, int64_t, int64_t,                \
                                          const SampleParams&, bool, cudaStream_t, cudaError_t*);
FLASHINFER_SAMPLE_DIRECT(extern, kTopPFilters)

/// Launch SampleKernel<T, kFilters> (params.filter is in kFilters). Not inline: the bindings
/// instantiate each filter set in a translation unit of its own (FLASHINFER_SAMPLE_FILTERS).
template <typename T, unsigned kFilters>
cudaError_t SampleFilters(const T* in, int64_t stride, int64_t num_out, int64_t vocab,
                          const SampleParams& params, const Scratch& scratch, bool enable_pdl,
                          cudaStream_t stream) {
  auto* const kernel = &SampleKernel<T, kFilters>;
  if (num_out == 0) return cudaSuccess;
  if constexpr (std::is_same_v<T, float> &&
                (kFilters == kDrawFilters || kFilters == kTopPFilters)) {
    cudaError_t e = cudaSuccess;
    if (!scratch.ptr &&
        sample_direct<kFilters>(in, stride, num_out, vocab, params, enable_pdl, stream, &e))
      return e;
  }
  if (scratch.ptr) {  // one CTA per row: Shared and the row's block sums and max keys
    const size_t smem =
        sizeof(Shared) +
        (kBlockDraw<kFilters> ? ceil_div(vocab, kBlockCols) * kBlockBytes : 0);
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    const bool vec = rows_vectorizable<T>(in, stride, vocab);
    for (int64_t r0 = 0; r0 < num_out; r0 += scratch.rows) {
      const RowGrid g{num_out, r0, scratch.ptr, scratch.stride};
      const int64_t n = num_out - r0 < scratch.rows ? num_out - r0 : scratch.rows;
      e = launch_kernel(kernel, dim3(n), dim3(kThreads), smem, stream, enable_pdl, in, stride,
                        vocab, vocab, vec, g, params);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  const RowPlan plan = kBlockDraw<kFilters> ? plan_sample(vocab) : plan_rows(vocab);
  cudaError_t e = prepare(kernel, plan);
  if (e != cudaSuccess) return e;
  const bool vec = rows_vectorizable<T>(in, stride, plan.chunk);
  return launch_kernel_clustered(kernel, dim3(num_out * plan.cluster), dim3(plan.threads),
                                 plan.smem, stream, enable_pdl, plan.cluster, in, stride, vocab,
                                 plan.chunk, vec, RowGrid{num_out, 0, nullptr, 0}, params);
}

/// Declare (PREFIX extern) or define (PREFIX empty) SampleFilters<T, SET> for one input dtype, or
/// for every one (FLASHINFER_SAMPLE_FILTERS). The heavy sets define one dtype a translation unit,
/// so that the first-call build compiles them side by side (csrc/sampling*.cu).
#define FLASHINFER_SAMPLE_FILTER(PREFIX, T, SET)                                                   \
  PREFIX template cudaError_t SampleFilters<T, SET>(const T*, int64_t, int64_t, int64_t,          \
                                                    const SampleParams&, const Scratch&, bool,     \
                                                    cudaStream_t);
#define FLASHINFER_SAMPLE_FILTERS(PREFIX, SET)         \
  FLASHINFER_SAMPLE_FILTER(PREFIX, float, SET)         \
  FLASHINFER_SAMPLE_FILTER(PREFIX, __half, SET)        \
  FLASHINFER_SAMPLE_FILTER(PREFIX, __nv_bfloat16, SET)

/// Draw one token per output row with params.filter: the kernel of its filter set.
template <typename T>
cudaError_t Sample(const T* in, int64_t stride, int64_t num_out, int64_t vocab,
                   const SampleParams& params, const Scratch& scratch, bool enable_pdl,
                   cudaStream_t stream) {
  const int f = params.filter;
  if (has_filter(kDrawFilters, f))
    return SampleFilters<T, kDrawFilters>(in, stride, num_out, vocab, params, scratch, enable_pdl,
                                          stream);
  if (has_filter(kTopPFilters, f))
    return SampleFilters<T, kTopPFilters>(in, stride, num_out, vocab, params, scratch, enable_pdl,
                                          stream);
  if (has_filter(kTopKFilters, f))
    return SampleFilters<T, kTopKFilters>(in, stride, num_out, vocab, params, scratch, enable_pdl,
                                          stream);
  if (has_filter(kTopKTopPFilters, f))
    return SampleFilters<T, kTopKTopPFilters>(in, stride, num_out, vocab, params, scratch,
                                              enable_pdl, stream);
  return cudaErrorInvalidValue;
}

/// A resident kernel's plan (SoftmaxResidentKernel, TopKResidentKernel) for `rows` rows of
/// `vocab` floats: clusters of C = min(max_cluster, sms / rows) CTAs (one CTA a SM: every row on
/// chip at once; a smaller C where the device does not hold `rows` such clusters), chunks of
/// chunk4 float4 of which shared memory holds smem_vecs. cluster 0: not this kernel (vocab % 4,
/// more rows than SMs, one CTA a row for half the SMs or fewer (both allowed with `waves` where
/// the batch is large), or a chunk beyond the registers and twice the shared memory).
struct ResidentPlan {
  int cluster = 0;
  int64_t chunk4 = 0;
  int smem_vecs = 0;
};

/// The dynamic shared memory a resident kernel with `reserve` bytes of static shared memory may
/// take where a CTA may opt in to `optin` bytes.
inline int resident_smem_limit(int optin, int reserve) {
  return (optin - reserve - 1024) / 16 * 16;
}

template <typename Fits>
inline ResidentPlan plan_resident(int64_t vocab, int64_t rows, int sms, int smem_limit,
                                  int max_cluster, bool waves, Fits fits) {
  // One CTA a row (max_cluster 1) pays where the rows fill more than half the SMs (at 67 rows,
  // top-k mask 49.1 us on chip against 55.4 on the cluster path); with `waves`, also in any
  // batch of long rows (64K+ columns) with 46K+ elements an SM, in waves beyond the SMs. Fewer
  // fit the cluster path's clusters in ~1 wave. (H100, 128256 columns, top-p renorm p = 0.9 on
  // the cluster path against one CTA a row: 32 rows 51.2 against 61.0 us, 48 rows 82.4 against
  // 62.3, 160 rows 177.5 against 139.7, 256 rows 262.4 against 166.5; top-k renorm with a k
  // tensor of 50: 32 rows 32.0 against 44.2, 48 rows 49.3 / 46.0, 256 rows 153.8 / 132.1, not
  // taken: a large k's radix rounds there are unmeasured.)
  if (vocab % 4 != 0 || rows < 1) return {};
  if (max_cluster == 1) {
    const bool half = 2 * rows > sms && rows <= sms;
    if (!half && !(waves && vocab >= 65536 && rows * vocab >= int64_t{46000} * sms)) return {};
    rows = rows < sms ? rows : sms;  // (one CTA a row: the chunk is the row)
  } else if (rows > sms) {
    return {};
  }
  const int64_t regs = int64_t{kResVecs} * kResThreads;
  const int64_t smax = smem_limit / 16;
  const int64_t most = sms / rows < max_cluster ? sms / rows : max_cluster;
  for (int c = static_cast<int>(most); c >= 1; --c) {
    const int64_t chunk4 = ceil_div(vocab / 4, c);
    if (chunk4 > regs + 2 * smax) return {};
    const int64_t sm = chunk4 - regs < 0 ? 0 : (chunk4 - regs < smax ? chunk4 - regs : smax);
    const ResidentPlan plan{c, chunk4, static_cast<int>(sm)};
    if (fits(c)) return plan;
  }
  return {};
}

/// The largest dynamic shared memory a CTA may ask for on device `dev`.
inline cudaError_t smem_optin(int dev, int* out) {
  return device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(dev, out);
}

/// Rows in and out that are whole, 16-byte aligned float4 runs (their starts and strides).
inline bool float4_rows(const float* in, int64_t stride, const TransformParams& params) {
  return is_aligned(in, 16) && stride % 4 == 0 && is_aligned(params.out, 16) &&
         params.out_stride % 4 == 0;
}

/// The current device, its SMs and the most dynamic shared memory a CTA may ask for there.
inline cudaError_t device_limits(int* dev, int* sms, int* optin) {
  cudaError_t e = cudaGetDevice(dev);
  if (e == cudaSuccess) e = sm_count(*dev, sms);
  if (e == cudaSuccess) e = smem_optin(*dev, optin);
  return e;
}

/// Once per device (kSet keys the kernel): `kernel` may take `bytes` of dynamic shared memory,
/// with all of the L1 as shared memory.
template <unsigned kSet, typename Kernel>
inline cudaError_t smem_attributes_once(Kernel kernel, int dev, int bytes) {
  constexpr int kDevices = 64;
  static std::atomic<bool> ready[kDevices];
  if (dev < kDevices && ready[dev].load(std::memory_order_relaxed)) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
  if (e == cudaSuccess && dev < kDevices) ready[dev].store(true, std::memory_order_relaxed);
  return e;
}

/// Run a resident kernel where its plan holds the rows (16-byte aligned rows in and out, the
/// plan's conditions): launch(plan, smem bytes) -> cudaError_t. false: not taken (*err
/// untouched; the caller runs TransformKernel). kSet keys the kernel's occupancy answers;
/// `reserve` its static shared memory (bytes, an upper bound).
template <unsigned kSet, typename Kernel, typename Launch>
inline bool run_resident(Kernel kernel, int reserve, int max_cluster, bool waves, const float* in,
                         int64_t stride, int64_t rows, int64_t vocab, const TransformParams& params,
                         cudaError_t* err, Launch launch) {
  if (!float4_rows(in, stride, params)) return false;
  int dev = 0, sms = 0, optin = 0;
  cudaError_t e = device_limits(&dev, &sms, &optin);
  if (e != cudaSuccess) {
    *err = e;
    return true;
  }
  const int limit = resident_smem_limit(optin, reserve);
  // The occupancy query asks with the most shared memory (the attribute it sets stays what every
  // launch needs); one CTA a SM either way, by the registers.
  const ResidentPlan plan = plan_resident(vocab, rows, sms, limit, max_cluster, waves, [&](int c) {
    return c == 1 || resident_clusters<kSet>(kernel, dev, c, limit, kResThreads) >= rows;
  });
  if (!plan.cluster) return false;
  // The most shared memory any plan asks for.
  e = smem_attributes_once<kSet>(kernel, dev, limit);
  if (e == cudaSuccess) e = launch(plan, static_cast<size_t>(plan.smem_vecs) * 16);
  *err = e;
  return true;
}

/// Static shared memory (bytes, upper bounds) of the resident kernels.
inline constexpr int kSoftmaxResidentStatic = 1024;
inline constexpr int kTopKResidentStatic = kResCandidates * 4 + 4096;
inline constexpr int kTopKStreamStatic = 2048;
inline constexpr int kTopPResidentStatic = 2 * kTopPBins * 4 + 5 * 256 * 4 + 1536;  // (22.5 KB)

// The launchers of the on-chip kernels. Templates (with a dummy parameter), so that a translation
// unit that includes this header compiles their kernels only where it instantiates them: each in
// a unit of its own (csrc/sampling_resident_*.cu), beside TransformRows<float>'s, which calls
// them (before this, all seven kernels were compiled in each of the module's 13 units).

/// Declare (PREFIX extern) or define (PREFIX empty) an on-chip launcher: bool NAME<0>(...).
#define FLASHINFER_RESIDENT(PREFIX, NAME)                                                          \
  PREFIX template bool NAME<0>(const float*, int64_t, int64_t, int64_t, const TransformParams&,   \
                               bool, cudaStream_t, cudaError_t*);

/// TopKStreamKernel where it pays and fits (k a scalar that topk_streams: the caller's test):
/// 16-byte aligned rows in and out, kStreamSmem of shared memory a CTA, and a batch the rules
/// below give it (any number of rows: beyond the SMs, waves). false: not taken.
template <int = 0>
bool topk_stream(const float* in, int64_t stride, int64_t rows, int64_t vocab,
                 const TransformParams& params, bool enable_pdl, cudaStream_t stream,
                 cudaError_t* err) {
  if (!float4_rows(in, stride, params) || vocab % 4 != 0) return false;
  int dev = 0, sms = 0, optin = 0;
  cudaError_t e = device_limits(&dev, &sms, &optin);
  if (e == cudaSuccess && resident_smem_limit(optin, kTopKStreamStatic) < kStreamSmem) return false;
  // Half the SMs or fewer: one SM a row against the cluster path's many, which is faster below
  // ~40K elements an SM in all (H100, mask k = 50: 32 x 128256 32.1 us against 35.1 streamed;
  // 48 x 128256 49.2 against 36.1, 64 x 128256 55.4 / 38.0, 32 x 256000 80.6 / 50.9).
  if (e == cudaSuccess && 2 * rows <= sms && rows * vocab < int64_t{40000} * sms) return false;
  // Where TopKResidentKernel holds the rows (SMs / 2 < rows <= SMs), it is faster beyond a
  // quarter of the stream's range (128 x 128256 mask: k = 200 62.1 us against 67.2, k = 500 75.6
  // against 71.8); elsewhere the alternative is the cluster path (k = 500 at 256 rows: 148
  // against 206).
  const int64_t k_n4 = int64_t{params.top_k.value} * (vocab / 4);
  if (e == cudaSuccess && 2 * rows > sms && rows <= sms && k_n4 > int64_t{1024} * kStreamPrefix4)
    return false;
  auto go = [&](auto* kernel, auto set) {
    if (e == cudaSuccess) e = smem_attributes_once<decltype(set)::value>(kernel, dev, kStreamSmem);
    if (e == cudaSuccess)
      e = launch_kernel(kernel, dim3(rows), dim3(kResThreads), kStreamSmem, stream, enable_pdl,
                        in, stride, vocab, params);
    *err = e;
    return true;
  };
  if (params.kind == kTopKMask)
    return go(&TopKStreamKernel<true>, std::integral_constant<unsigned, 1u << 28>{});
  return go(&TopKStreamKernel<false>, std::integral_constant<unsigned, 1u << 27>{});
}

/// Top-p renorm with one CTA a row on chip (TopPResidentKernel; rows in waves beyond the SMs).
template <int = 0>
bool topp_resident(const float* in, int64_t stride, int64_t rows, int64_t vocab,
                   const TransformParams& params, bool enable_pdl, cudaStream_t stream,
                   cudaError_t* err) {
  auto* const kernel = &TopPResidentKernel<kResVecs>;
  return run_resident<1u << 26>(
      kernel, kTopPResidentStatic, 1, true, in, stride, rows, vocab, params, err,
      [&](const ResidentPlan& plan, size_t smem) {
        return launch_kernel(kernel, dim3(rows), dim3(kResThreads), smem, stream, enable_pdl, in,
                             stride, vocab, plan.smem_vecs, params);
      });
}

/// Softmax of rows on chip (SoftmaxResidentKernel: any rows <= SMs, clusters up to 8).
template <int = 0>
bool softmax_resident(const float* in, int64_t stride, int64_t rows, int64_t vocab,
                      const TransformParams& params, bool enable_pdl, cudaStream_t stream,
                      cudaError_t* err) {
  auto* const kernel = &SoftmaxResidentKernel<kResVecs>;
  return run_resident<1u << 31>(
      kernel, kSoftmaxResidentStatic, 8, false, in, stride, rows, vocab, params, err,
      [&](const ResidentPlan& plan, size_t smem) {
        return launch_kernel_clustered(kernel, dim3(rows * plan.cluster), dim3(kResThreads),
                                       smem, stream, enable_pdl,
                                       plan.cluster > 1 ? plan.cluster : 0, in, stride, vocab,
                                       plan.chunk4, plan.smem_vecs, params.temperature,
                                       static_cast<float*>(params.out), params.out_stride);
      });
}

/// Top-k mask / renorm on chip: a small scalar k streams (topk_stream), else one CTA a row
/// (TopKResidentKernel: rows beyond half the SMs).
template <int = 0>
bool topk_resident(const float* in, int64_t stride, int64_t rows, int64_t vocab,
                   const TransformParams& params, bool enable_pdl, cudaStream_t stream,
                   cudaError_t* err) {
  if (!params.top_k.arr && topk_streams(params.top_k.value, vocab))
    if (topk_stream(in, stride, rows, vocab, params, enable_pdl, stream, err)) return true;
  auto run = [&](auto* kernel, auto set) {
    return run_resident<decltype(set)::value>(
        kernel, kTopKResidentStatic, 1, false, in, stride, rows, vocab, params, err,
        [&](const ResidentPlan& plan, size_t smem) {
          return launch_kernel(kernel, dim3(rows), dim3(kResThreads), smem, stream, enable_pdl,
                               in, stride, vocab, plan.smem_vecs, params);
        });
  };
  if (params.kind == kTopKMask)
    return run(&TopKResidentKernel<kResVecs, true>, std::integral_constant<unsigned, 1u << 30>{});
  return run(&TopKResidentKernel<kResVecs, false>, std::integral_constant<unsigned, 1u << 29>{});
}

FLASHINFER_RESIDENT(extern, topp_resident)
FLASHINFER_RESIDENT(extern, softmax_resident)
FLASHINFER_RESIDENT(extern, topk_resident)

/// Softmax, top-p renorm and top-k mask / renorm of float32 rows on chip, where their plans hold
/// them. false: not taken (*err untouched; the caller runs TransformKernel).
inline bool transform_resident(const float* in, int64_t stride, int64_t rows, int64_t vocab,
                               const TransformParams& params, bool enable_pdl,
                               cudaStream_t stream, cudaError_t* err) {
  if (params.kind == kTopPRenorm)
    return topp_resident(in, stride, rows, vocab, params, enable_pdl, stream, err);
  if (params.kind == kSoftmax)
    return softmax_resident(in, stride, rows, vocab, params, enable_pdl, stream, err);
  if (params.kind == kTopKMask || params.kind == kTopKRenorm)
    return topk_resident(in, stride, rows, vocab, params, enable_pdl, stream, err);
  return false;
}

template <typename T>
cudaError_t TransformRows(const T* in, int64_t stride, int64_t rows, int64_t vocab,
                          const TransformParams& params, const Scratch& scratch, bool enable_pdl,
                          cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    cudaError_t e = cudaSuccess;
    if (!scratch.ptr && rows > 0 &&
        transform_resident(in, stride, rows, vocab, params, enable_pdl, stream, &e))
      return e;
  }
  return launch_rows(TransformKernel<T>, in, stride, rows, vocab, params, scratch, enable_pdl,
                     stream);
}

/// Declare (PREFIX extern) or define (PREFIX empty) TransformRows<T>: one dtype a translation unit.
#define FLASHINFER_TRANSFORM_ROWS(PREFIX, T)                                                       \
  PREFIX template cudaError_t TransformRows<T>(const T*, int64_t, int64_t, int64_t,               \
                                               const TransformParams&, const Scratch&, bool,       \
                                               cudaStream_t);

/// (A template, so that only the translation unit that calls it compiles ChainKernel.)
template <int = 0>
cudaError_t ChainSpeculative(const ChainParams& params, int64_t batch, const Scratch& scratch,
                             bool enable_pdl, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  if (scratch.ptr) {
    for (int64_t r0 = 0; r0 < batch; r0 += scratch.rows) {
      const RowGrid g{batch, r0, scratch.ptr, scratch.stride};
      const int64_t n = batch - r0 < scratch.rows ? batch - r0 : scratch.rows;
      const cudaError_t e = launch_kernel(ChainKernel<>, dim3(n), dim3(kThreads), sizeof(Shared),
                                          stream, enable_pdl, params.vocab, g, params);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  const RowPlan plan = plan_rows(params.vocab);
  cudaError_t e = prepare(ChainKernel<>, plan);
  if (e != cudaSuccess) return e;
  return launch_kernel_clustered(ChainKernel<>, dim3(batch * plan.cluster), dim3(plan.threads),
                                 plan.smem, stream, enable_pdl, plan.cluster, plan.chunk,
                                 RowGrid{batch, 0, nullptr, 0}, params);
}

}  // namespace sampling
}  // namespace flashinfer

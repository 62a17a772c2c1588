// Sampling from (filtered) probability rows, the filters' renormalizations, softmax and chain
// speculative sampling. Framework-free: raw pointers, sizes and strides in, cudaError_t out.
//
// Why the kernels look the way they do. A vocabulary row (128256 float32 = 513 KB) is larger than
// one SM's shared memory, and sampling needs several passes over it (max, the filter's threshold,
// the kept mass, the draw). So a row is handled by a thread-block cluster of C CTAs (C <= 8 for
// rows up to ~512K float32 elements): each CTA loads its contiguous chunk of the row once from
// HBM into shared memory (<= 64 KB, so 2-3 CTAs of different rows share an SM and one loads while
// another computes), and every later pass runs over shared memory. The CTAs exchange only small
// partial results through distributed shared memory (DSMEM) after a cluster barrier.
//
// Thresholds are found by a radix select over order-preserving 32-bit keys of the values: four
// rounds of 8 bits, each a pass that builds a 256-bin histogram (count and mass) of the elements
// whose key matches the prefix chosen so far, a cluster barrier, and a merge of the C histograms
// from DSMEM followed by a block scan that picks the bin where the cumulative count/mass (from the
// largest values down) reaches the target. A round stops the search early when the chosen bin
// holds one element. The result is exact: the largest key t with F(t) >= target, where F(t) is
// the count (top-k) or mass (top-p) of the elements with key >= t; ties at t are all kept.
//
// Masses are 64-bit fixed point: w(x) = floor(x * 2^(40 - e)) with 2^e <= max(row) < 2^(e+1).
// Integer sums do not depend on the order of the additions, so histogram atomics, block and
// cluster reductions are deterministic, and a draw is exact: target = floor(u * K) for the kept
// mass K and a 32-bit uniform u, then the first element (in the kernel's fixed order: CTA, thread,
// element) whose running kept mass exceeds target. Elements below 2^-41 of the row's max get
// weight 0 (probability < 2^-41 relative to the largest).
//
// RNG: Philox-4x32-10 (Salmon et al., SC'11; the generator torch and curand use), counter =
// (offset / 4, subsequence = output row), key = seed; (seed, offset) per call or per row. Written
// here (30 lines) rather than taken from curand_kernel.h, which not every toolkit install ships.
#pragma once
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.cuh"
#include "sampling_common.cuh"

namespace flashinfer {
namespace sampling {

namespace cg = cooperative_groups;

// ------------------------------------------------------------------------------------------------
// Kernels
// ------------------------------------------------------------------------------------------------

/// Dynamic shared memory: the chunk of `chunk` floats, then the Shared block.
__device__ __forceinline__ void carve(unsigned char* smem, int64_t chunk, float** vals,
                                      Shared** s) {
  *vals = reinterpret_cast<float*>(smem);
  *s = reinterpret_cast<Shared*>(smem + chunk * sizeof(float));
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

/// One cluster per output row: load, filter, draw one token.
template <typename T>
__global__ void __launch_bounds__(kThreads, 3) SampleKernel(const T* __restrict__ in, int64_t stride,
                                                    int64_t vocab, int64_t chunk, bool vec,
                                                    SampleParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* vals;
  Shared* s;
  carve(smem, chunk, &vals, &s);
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t out_row = blockIdx.x / cluster.num_blocks();
  pdl_wait();
  RowCtx ctx = make_ctx(vals, s, vocab, chunk, false);
  const int64_t in_row = p.rows(out_row);
  const bool row_ok = in_row >= 0 && in_row < p.rows.num_in_rows;
  const bool is_probs = !p.logits;
  if (row_ok) {
    load_chunk<T>(ctx, in + in_row * stride, vec, [](float x) { return x; });
  }
  bool nan = false;
  float mx = row_ok ? chunk_max(ctx, &nan) : 0.f;
  const bool any_nan = cluster_reduce_f(ctx, nan ? 1.f : 0.f, 0, true) > 0.f;
  mx = cluster_reduce_f(ctx, mx, 1, true);
  int64_t col = -1;
  if (row_ok && !any_nan) {
    // Probabilities: clamp negatives to 0. Logits: weights exp(x - max), max weight 1.
    if (is_probs) {
      for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) ctx.vals[i] = fmaxf(ctx.vals[i], 0.f);
      mx = fmaxf(mx, 0.f);
    } else {
      const bool dead = isinf(mx) && mx < 0;
      for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads)
        ctx.vals[i] = dead ? 0.f : __expf(ctx.vals[i] - mx);
      mx = dead ? 0.f : 1.f;
    }
    __syncthreads();
    ctx.scale = fixed_scale(mx);
    uint32_t t = 0;
    const int f = p.filter;
    if (f == kMinP) {
      t = key_nonneg(p.min_p(out_row) * mx);
    }
    if (f == kTopK || f == kTopKTopPJoint || f == kTopKFirstTopP) {
      const int k = p.top_k(out_row);
      if (k > 0 && k < vocab) {
        const Threshold th = radix_search(ctx, false, f == kTopKFirstTopP,
                                          [k](CM) { return static_cast<unsigned long long>(k); });
        if (!th.all) t = th.key;
        if (f == kTopKFirstTopP && !th.all) {
          // top-p over the renormalized top-k set: target mass p * kept(top-k).
          const double P = static_cast<double>(p.top_p(out_row)) * static_cast<double>(th.kept.m);
          const Threshold tp = radix_search(ctx, true, true, [P](CM) {
            return static_cast<unsigned long long>(floor(P)) + 1ull;
          });
          if (!tp.all && tp.key > t) t = tp.key;
        }
      }
    }
    if (f == kTopP || f == kTopKTopPJoint ||
        (f == kTopKFirstTopP && t == 0)) {  // top-k kept everything: plain top-p
      const float tp_p = p.top_p(out_row);
      const Threshold tp = radix_search(ctx, true, true, [tp_p](CM total) {
        return static_cast<unsigned long long>(
                   floor(static_cast<double>(tp_p) * static_cast<double>(total.m))) + 1ull;
      });
      if (!tp.all && tp.key > t) t = tp.key;
    }
    Philox rng = p.rng.make(out_row);
    const uint32_t r = rng.next();
    unsigned long long kept;
    col = draw(ctx, t, r, 0, &kept);
    if (kept == 0 && ctx.rank == 0 && ctx.tid == 0) col = 0;  // nothing to draw from
  } else if (ctx.rank == 0 && ctx.tid == 0) {
    col = 0;
  }
  if (col >= 0) write_sample(p.out, p.out_64, p.valid, out_row, col, row_ok && !any_nan);
  cluster.sync();  // peers may still read this CTA's shared memory
}

struct TransformParams {
  int kind;
  RowParam<float> top_p;
  RowParam<int> top_k;
  RowParam<float> temperature;
  void* out;  ///< float32 (softmax, top-p renorm) or T (top-k renorm, mask)
  int64_t out_stride;
};

/// One cluster per row: load, (softmax | find the filter's threshold), write the row.
template <typename T>
__global__ void __launch_bounds__(kThreads, 3) TransformKernel(const T* __restrict__ in, int64_t stride,
                                                       int64_t vocab, int64_t chunk, bool vec,
                                                       TransformParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* vals;
  Shared* s;
  carve(smem, chunk, &vals, &s);
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t row = blockIdx.x / cluster.num_blocks();
  pdl_wait();
  const int kind = p.kind;
  RowCtx ctx = make_ctx(vals, s, vocab, chunk, kind == kTopKMask);
  const T* src = in + row * stride;
  float* out_f = static_cast<float*>(p.out) + row * p.out_stride;
  T* out_t = static_cast<T*>(p.out) + row * p.out_stride;
  if (kind == kSoftmax) {
    const float inv_t = 1.f / p.temperature(row);
    load_chunk<T>(ctx, src, vec, [inv_t](float x) { return x * inv_t; });
    bool nan;
    const float mx = cluster_reduce_f(ctx, chunk_max(ctx, &nan), 0, true);
    float sum = 0.f;
    for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) sum += __expf(ctx.vals[i] - mx);
    sum = cluster_reduce_f(ctx, block_sum_f(sum, s), 1, false);
    const float inv = 1.f / sum;
    pdl_launch_dependents();
    for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads)
      out_f[ctx.begin + i] = __expf(ctx.vals[i] - mx) * inv;
    cluster.sync();
    return;
  }
  if (kind == kTopKMask) {
    load_chunk<T>(ctx, src, vec, [](float x) { return x; });
    const int k = p.top_k(row);
    uint32_t t = 0;
    if (k > 0 && k < vocab) {
      const Threshold th = radix_search(ctx, false, false,
                                        [k](CM) { return static_cast<unsigned long long>(k); });
      if (!th.all) t = th.key;
    }
    const T ninf = from_float<T>(-INFINITY);
    for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) {
      const float x = ctx.vals[i];
      out_t[ctx.begin + i] = ctx.key(x) >= t ? from_float<T>(x) : ninf;
    }
    cluster.sync();
    return;
  }
  // Renormalizations: probabilities, negatives clamped to 0.
  load_chunk<T>(ctx, src, vec, [](float x) { return fmaxf(x, 0.f); });
  bool nan;
  const float mx = cluster_reduce_f(ctx, chunk_max(ctx, &nan), 0, true);
  ctx.scale = fixed_scale(mx);
  uint32_t t = 0;
  Threshold th{0, CM{0, 0}, true};
  if (kind == kTopPRenorm) {
    const float tp = p.top_p(row);
    th = radix_search(ctx, true, true, [tp](CM total) {
      return static_cast<unsigned long long>(
                 floor(static_cast<double>(tp) * static_cast<double>(total.m))) + 1ull;
    });
  } else {
    const int k = p.top_k(row);
    if (k > 0 && k < vocab)
      th = radix_search(ctx, false, true, [k](CM) { return static_cast<unsigned long long>(k); });
  }
  unsigned long long kept_m = th.kept.m;
  if (th.all) {
    unsigned long long mine = 0;
    for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) mine += ctx.fixed(ctx.vals[i]);
    CM total;
    block_scan(CM{0, mine}, s, &total);
    unsigned long long before;
    kept_m = cluster_sum_u(ctx, total.m, 0, &before);
  } else {
    t = th.key;
  }
  const float inv = kept_m ? static_cast<float>(static_cast<double>(ctx.scale) /
                                                static_cast<double>(kept_m))
                           : 0.f;
  for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) {
    const float x = ctx.vals[i];
    const float y = ctx.key(x) >= t ? x * inv : 0.f;
    if (kind == kTopPRenorm) {
      out_f[ctx.begin + i] = y;
    } else {
      out_t[ctx.begin + i] = from_float<T>(y);
    }
  }
  cluster.sync();
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

/// One cluster per batch row: accept the draft prefix, then draw the resampled or bonus token.
__global__ void __launch_bounds__(kThreads, 3) ChainKernel(int64_t chunk, ChainParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* vals;
  Shared* s;
  carve(smem, chunk, &vals, &s);
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t row = blockIdx.x / cluster.num_blocks();
  pdl_wait();
  RowCtx ctx = make_ctx(vals, s, p.vocab, chunk, false);
  Philox rng = p.rng.make(row);
  // Every thread runs the (short) acceptance chain: the same draws, the same answer.
  int reject = p.n, independent = 0;
  for (int i = 0; i < p.n; ++i) {
    const float u = static_cast<float>(rng.next()) * 0x1p-32f;
    const int32_t tok = p.ids[row * p.ids_s0 + i];
    bool ok = false;
    if (tok >= 0 && tok < p.vocab) {
      const float q = p.draft[row * p.draft_s0 + i * p.draft_s1 + tok];
      const float pt = p.target[row * p.target_s0 + i * p.target_s1 + tok];
      ok = u * q < pt;
    }
    independent += ok;
    if (!ok && reject == p.n) reject = i;
  }
  const uint32_t r = rng.next();
  const float* t_row = p.target + row * p.target_s0 + reject * p.target_s1;
  const float* d_row = p.draft + row * p.draft_s0 + reject * p.draft_s1;
  const bool resample = reject < p.n;
  for (int i = ctx.tid; i < ctx.n; i += ctx.nthreads) {
    const int64_t c = ctx.begin + i;
    const float tv = t_row[c];
    ctx.vals[i] = fmaxf(resample ? tv - d_row[c] : tv, 0.f);
  }
  __syncthreads();
  bool nan;
  const float mx = cluster_reduce_f(ctx, chunk_max(ctx, &nan), 0, true);
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
  cluster.sync();
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

/// Largest vocabulary the kernels take (16 CTAs of kMaxChunk elements).
inline constexpr int64_t kMaxVocab = 16 * kMaxChunk;

template <typename Kernel>
cudaError_t prepare(Kernel kernel, const RowPlan& plan) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(plan.smem));
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

/// Launch a row kernel (SampleKernel, TransformKernel) over `rows` rows of `vocab` T's.
template <typename T, typename Params>
cudaError_t launch_rows(void (*kernel)(const T*, int64_t, int64_t, int64_t, bool, Params),
                        const T* in, int64_t stride, int64_t rows, int64_t vocab,
                        const Params& params, bool enable_pdl, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const RowPlan plan = plan_rows(vocab);
  cudaError_t e = prepare(kernel, plan);
  if (e != cudaSuccess) return e;
  const bool vec = rows_vectorizable<T>(in, stride, plan.chunk);
  return launch_kernel_clustered(kernel, dim3(rows * plan.cluster), dim3(plan.threads), plan.smem,
                                 stream, enable_pdl, plan.cluster, in, stride, vocab, plan.chunk,
                                 vec, params);
}

template <typename T>
cudaError_t Sample(const T* in, int64_t stride, int64_t num_out, int64_t vocab,
                   const SampleParams& params, bool enable_pdl, cudaStream_t stream) {
  return launch_rows(SampleKernel<T>, in, stride, num_out, vocab, params, enable_pdl, stream);
}

template <typename T>
cudaError_t TransformRows(const T* in, int64_t stride, int64_t rows, int64_t vocab,
                          const TransformParams& params, bool enable_pdl, cudaStream_t stream) {
  return launch_rows(TransformKernel<T>, in, stride, rows, vocab, params, enable_pdl, stream);
}

inline cudaError_t ChainSpeculative(const ChainParams& params, int64_t batch, bool enable_pdl,
                                    cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  const RowPlan plan = plan_rows(params.vocab);
  cudaError_t e = prepare(ChainKernel, plan);
  if (e != cudaSuccess) return e;
  return launch_kernel_clustered(ChainKernel, dim3(batch * plan.cluster), dim3(plan.threads),
                                 plan.smem, stream, enable_pdl, plan.cluster, plan.chunk, params);
}

}  // namespace sampling
}  // namespace flashinfer

// What every attention kernel does the same way, whatever its MMA: where a work item's rows and
// keys are, the logits transform and mask over a tile of S held in MMA accumulator layout, the
// online softmax (base 2), and the output stores (final or split-KV partial).
//
// Accumulator layout (mma.m16n8 and wgmma m64nN alike): a warp holds 16 rows of S; thread
// (g = lane / 4, t = lane % 4) holds, for each 8-key block n, s[n][0..1] at row g, keys
// 8n + 2t, 8n + 2t + 1 and s[n][2..3] at row g + 8. MQ such 16-row tiles per warp.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "mma.cuh"
#include "params.cuh"

// Timing probes for benchmarks/tuning/tune_attention.py (wrong outputs; never set in a build that is
// used): PROBE_NO_COMPUTE keeps the FA2 main loop's K/V loads and waits but not its math;
// PROBE_NO_MERGE skips the in-kernel split-KV merge (partial states are written, not merged).
#ifndef FLASHINFER_ATTENTION_PROBE_NO_COMPUTE
#define FLASHINFER_ATTENTION_PROBE_NO_COMPUTE 0
#endif
// PROBE_NO_LOADS (fp8 K/V converted in registers only): the K/V copies zero-fill instead of
// reading the cache (page lookups and all the math stay): the kernel's time without its bytes.
#ifndef FLASHINFER_ATTENTION_PROBE_NO_LOADS
#define FLASHINFER_ATTENTION_PROBE_NO_LOADS 0
#endif
#ifndef FLASHINFER_ATTENTION_PROBE_NO_MERGE
#define FLASHINFER_ATTENTION_PROBE_NO_MERGE 0
#endif
// PROBE_TRACE (a timing probe with correct outputs): thread 0 of each FA2 CTA stamps
// %globaltimer at the points of TraceEvent into attention_trace[CTA], which the module's
// trace_copy reads back (benchmarks/probes/trace_decode.py).
#ifndef FLASHINFER_ATTENTION_PROBE_TRACE
#define FLASHINFER_ATTENTION_PROBE_TRACE 0
#endif

namespace flashinfer {
namespace attn {

inline constexpr float kLog2e = 1.4426950408889634f;

/// The points PROBE_TRACE stamps, in kernel order; kTraceSm holds the CTA's SM.
enum TraceEvent : int {
  kTraceEntry = 0,    ///< kernel entry
  kTraceQ,            ///< Q in shared memory (after the plan and Q loads)
  kTraceFirstK,       ///< warp 0's first K tile landed
  kTraceLoopDone,     ///< warp 0's last tile done
  kTraceStreamsDone,  ///< every key stream's state in shared memory
  kTraceWritten,      ///< output or partial state stores issued
  kTraceCounted,      ///< merge count known (split KV)
  kTraceEnd,          ///< kernel exit
  kTraceSm,
  kTraceSlots,
};
inline constexpr int kTraceCtas = 4096;
#if FLASHINFER_ATTENTION_PROBE_TRACE
__device__ unsigned long long attention_trace[kTraceCtas][kTraceSlots];
#endif
/// PROBE_TRACE: thread 0 stamps the time of `event` for its CTA (nothing otherwise).
__device__ __forceinline__ void trace(TraceEvent event) {
#if FLASHINFER_ATTENTION_PROBE_TRACE
  const uint32_t cta = blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x != 0 || cta >= kTraceCtas) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  attention_trace[cta][event] = t;
  if (event == kTraceEntry) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    attention_trace[cta][kTraceSm] = sm;
  }
#else
  (void)event;
#endif
}

/// Packed row pr of KV head kv_head's group of G query heads: q row pr / G of query head
/// kv_head * G + pr % G, with G as a FastDiv (AttentionParams::group_div): a multiply-shift, not
/// a ~20-instruction division by a run-time value. Against the division, H100 (7 interleaved
/// rounds): Hopper ragged 16 x 1024 322 vs 335 us, 64 x 256 185 vs 191
/// (benchmarks/notes/sm90-dynamic-claims.md).
struct QoHead {
  int qo, head;
};
__device__ __forceinline__ QoHead qo_head(int pr, uint32_t kv_head, const FastDiv& G) {
  uint32_t q, h;
  G.divmod(uint32_t(pr), q, h);
  return {int(q), int(kv_head * G.d + h)};
}

/// Packed rows pr0, pr0 + step, pr0 + 2 step, ... of a group of G query heads as (q row, head
/// within the group) and, given a tensor's row and head strides, the element offset
/// qo * stride_n + h * stride_h: two divisions by the run-time G when built, then adds and one
/// compare per row (a 32-bit division by a run-time value is a ~20-instruction sequence, and
/// the FA2 kernel's Q copies and output stores took one per 16-byte chunk).
struct PackedRowWalk {
  int qo, h;            // of the current row: pr / G, pr % G
  int step_qo, step_h;  // step / G, step % G
  int G;
  int64_t off, off_step, off_wrap;  // the row's offset; its change per step; per carry of h

  __device__ __forceinline__ PackedRowWalk(int pr0, int step, int group, int64_t stride_n = 0,
                                           int64_t stride_h = 0)
      : qo(pr0 / group), h(pr0 % group), step_qo(step / group), step_h(step % group),
        G(group) {
    off = qo * stride_n + h * stride_h;
    off_step = step_qo * stride_n + step_h * stride_h;
    off_wrap = stride_n - group * stride_h;
  }
  __device__ __forceinline__ void next() {
    qo += step_qo;
    h += step_h;  // < 2 G
    off += off_step;
    if (h >= G) h -= G, ++qo, off += off_wrap;
  }
};

/// What the plan says of one work item: request, packed-row tile, KV chunk and merge slot, and
/// the request's q rows and keys (AttentionParams::item_qo_begin).
struct ItemIds {
  int b, qtile, chunk, slot;
  int qo_begin, qo_len, kv_begin, kv_len;
};

/// The plan's entries for item `item` (< the plan's item capacity: the loads need no bound).
__device__ __forceinline__ ItemIds load_item_ids(const AttentionParams& p, int item) {
  return {p.request_idx[item],   p.qo_tile_idx[item],
          p.kv_chunk_idx[item],  p.merge_counters != nullptr ? p.merge_slot[item] : 0,
          p.item_qo_begin[item], p.item_qo_len[item],
          p.item_kv_begin[item], p.item_kv_len[item]};
}

/// The rows and keys of one work item (request, packed-row tile, KV chunk) for one KV head.
struct ItemRange {
  int b;                   // request
  int chunk;               // KV chunk index (split KV)
  int slot;                // merge slot of the item's (request, tile): its counters' index
  int qo_begin, qo_len;    // q rows of the request
  int kv_len;              // keys of the request
  int64_t kv_token_begin;  // ragged: first token of the request
  int32_t page_begin;      // paged: first entry of the request in kv_indices
  int packed_len;          // qo_len * group_size
  int row_begin;           // first packed row of the tile
  int delta;               // q row i sits at key position delta + i
  int qo_first, qo_last;   // q rows the tile touches
  int kv_lo, kv_hi;        // keys the tile must see (causal and window bounds applied)
  int num_tiles;           // KV tiles of tile_kv keys over [kv_lo, kv_hi)
};

template <bool kPaged, bool kCausal>
__device__ __forceinline__ ItemRange item_range(const AttentionParams& p, const ItemIds& ids,
                                                int tile_q, int tile_kv) {
  ItemRange r;
  r.b = ids.b;
  const int qtile = ids.qtile;
  r.chunk = ids.chunk;
  r.slot = ids.slot;
  r.qo_begin = ids.qo_begin;
  r.qo_len = ids.qo_len;
  r.kv_len = ids.kv_len;
  r.kv_token_begin = kPaged ? 0 : ids.kv_begin;
  r.page_begin = kPaged ? ids.kv_begin : 0;
  const int chunk_size = *p.kv_chunk_size;
  const int chunk_begin = chunk_size > 0 ? r.chunk * chunk_size : 0;
  const int chunk_end = chunk_size > 0 ? min(r.kv_len, chunk_begin + chunk_size) : r.kv_len;
  const int G = p.group_size;
  r.packed_len = r.qo_len * G;
  r.row_begin = qtile * tile_q;
  r.delta = r.kv_len - r.qo_len;
  r.qo_first = r.row_begin / G;
  r.qo_last = max(0, min(r.packed_len, r.row_begin + tile_q) - 1) / G;
  r.kv_lo = chunk_begin;
  r.kv_hi = chunk_end;
  if constexpr (kCausal) r.kv_hi = min(r.kv_hi, r.delta + r.qo_last + 1);
  if (p.window_left >= 0) r.kv_lo = max(r.kv_lo, r.delta + r.qo_first - p.window_left);
  r.num_tiles = r.kv_hi > r.kv_lo ? (r.kv_hi - r.kv_lo + tile_kv - 1) / tile_kv : 0;
  return r;
}

template <bool kPaged, bool kCausal>
__device__ __forceinline__ ItemRange item_range(const AttentionParams& p, int item, int tile_q,
                                                int tile_kv) {
  return item_range<kPaged, kCausal>(p, load_item_ids(p, item), tile_q, tile_kv);
}

/// What the logits pass needs of each of a thread's rows: MQ tiles x (row g, row g + 8).
template <int MQ>
struct RowFacts {
  int qo[MQ][2];       // q row within the request
  float slope[MQ][2];  // ALiBi slope * log2(e), 0 otherwise

  /// `first_row`: the packed row of the warp's first MMA row (tile row 0 of mq = 0).
  template <PosEncoding kPos>
  __device__ __forceinline__ void init(const AttentionParams& p, const ItemRange& r,
                                       int first_row, uint32_t kv_head, int g) {
    const int G = p.group_size;
#pragma unroll
    for (int mq = 0; mq < MQ; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int pr = first_row + mq * 16 + g + 8 * h;
        qo[mq][h] = pr / G;
        slope[mq][h] = 0.f;
        if constexpr (kPos == PosEncoding::kAlibi) {
          if (pr < r.packed_len) slope[mq][h] = p.alibi_slopes[kv_head * G + pr % G] * kLog2e;
        }
      }
  }
};

/// f(x, mq, h, key) for every element x of S: tile mq, row half h (row g or g + 8), key index.
template <int MQ, int NB, class F>
__device__ __forceinline__ void for_each_s(float (&s)[MQ][NB][4], int base, int t, F&& f) {
#pragma unroll
  for (int mq = 0; mq < MQ; ++mq)
#pragma unroll
    for (int n = 0; n < NB; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(s[mq][n][e], mq, e / 2, base + n * 8 + 2 * t + (e & 1));
}

/*!
 * @brief Logits transform (scale or soft cap, then ALiBi) and mask of one S tile of `tile_kv`
 *   keys starting at key `base`: masked keys become -inf. Returns the factor softmax_step
 *   still has to apply: with `kDeferScale`, plain logits (no soft cap, no ALiBi) are left
 *   unscaled and the scale goes into softmax_step's exp2 argument (one FFMA per element
 *   instead of an FMUL pass and an FADD); 1 otherwise.
 *
 * Each is a straight pass over S with its run-time choice made once outside it (a per-element
 * branch splits the unrolled loop into hundreds of small blocks that the compiler then cannot
 * overlap with the MMAs around them); the mask pass runs only on tiles that need it.
 * `scale` false leaves plain logits unscaled (a caller that folds the scale into its exp2).
 */
/// Whether logits_and_mask<kDeferScale = true> leaves plain logits unscaled (no soft cap, no
/// ALiBi: its branches below): a caller may then fold a factor of S into the scale it returns
/// instead of a pass.
template <PosEncoding kPos>
__device__ __forceinline__ bool scale_deferred(const AttentionParams& p) {
  return p.softcap_post == 0.f && kPos != PosEncoding::kAlibi;
}

template <MaskMode kMask, PosEncoding kPos, bool kDeferScale = false, int MQ, int NB>
__device__ __forceinline__ float logits_and_mask(float (&s)[MQ][NB][4], const AttentionParams& p,
                                                 const ItemRange& r, const RowFacts<MQ>& rows,
                                                 int base, int tile_kv, int t, bool scale = true) {
  constexpr bool kCausal = kMask == MaskMode::kCausal;
  constexpr bool kCustom = kMask == MaskMode::kCustom;
  float deferred = 1.f;
  if (p.softcap_post != 0.f) {
    for_each_s(s, base, t,
               [&](float& x, int, int, int) { x = p.softcap_post * tanhf(x * p.softcap_pre); });
  } else if (kDeferScale && kPos != PosEncoding::kAlibi) {  // (scale_deferred: true here)
    deferred = p.sm_scale_log2;
  } else if (scale) {
    for_each_s(s, base, t, [&](float& x, int, int, int) { x *= p.sm_scale_log2; });
  }
  if constexpr (kPos == PosEncoding::kAlibi) {
    for_each_s(s, base, t, [&](float& x, int mq, int h, int kv) {
      x += rows.slope[mq][h] * float(kv - (r.delta + rows.qo[mq][h]));
    });
  }
  const bool need_mask = kCustom || base + tile_kv > r.kv_hi ||
                         (kCausal && base + tile_kv - 1 > r.delta + r.qo_first) ||
                         (p.window_left >= 0 && base < r.delta + r.qo_last - p.window_left);
  if (!need_mask) return deferred;
  if constexpr (!kCustom) {
    // Per row, the kept keys as column offsets from this thread's first column (kb): c <= hi
    // (the request's end; causal: the row's position) and, with a window, c >= lo. The offsets
    // n * 8 + (e & 1) are compile-time constants, so an element costs a compare and a select
    // (the per-element key arithmetic and three compares were ~35 M of the 192 / 128 kernel's
    // instructions: benchmarks/notes/sm90-dynamic-claims.md).
    const int kb = base + 2 * t;
    int hi[MQ][2], lo[MQ][2];
#pragma unroll
    for (int mq = 0; mq < MQ; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int q_pos = r.delta + rows.qo[mq][h];
        hi[mq][h] = kCausal ? min(r.kv_hi - 1, q_pos) - kb : r.kv_hi - 1 - kb;
        lo[mq][h] = p.window_left >= 0 ? q_pos - p.window_left - kb : 0;
      }
    if (p.window_left >= 0) {
      for_each_s(s, base, t, [&](float& x, int mq, int h, int kv) {
        const int c = kv - kb;
        x = c <= hi[mq][h] && c >= lo[mq][h] ? x : -INFINITY;
      });
    } else {
      for_each_s(s, base, t, [&](float& x, int mq, int h, int kv) {
        x = kv - kb <= hi[mq][h] ? x : -INFINITY;
      });
    }
    return deferred;
  }
  // With no window the lower bound lies far below every key.
  const int window = p.window_left >= 0 ? p.window_left : 0x3fffffff;
  const int kv_hi = r.kv_hi;
  for_each_s(s, base, t, [&](float& x, int mq, int h, int kv) {
    const int q_pos = r.delta + rows.qo[mq][h];
    bool keep = kv < kv_hi && kv >= q_pos - window;
    if constexpr (kCausal) keep = keep && kv <= q_pos;
    if constexpr (kCustom) {
      if (keep) {
        const int64_t bit = int64_t(rows.qo[mq][h]) * r.kv_len + kv;
        keep = rows.qo[mq][h] < r.qo_len &&
               ((p.custom_mask[p.mask_indptr[r.b] + (bit >> 3)] >> (bit & 7)) & 1);
      }
    }
    x = keep ? x : -INFINITY;
  });
  return deferred;
}

/*!
 * @brief One online-softmax step (base 2) over a masked logits tile: updates the row maxima m
 *   and (thread-partial) sums d, turns s into exp2(s - m) and returns each row's scale for the
 *   accumulated output; the result is true when some row of the warp raised its maximum (when
 *   none did every scale is exactly 1 and the output rescale can be skipped). With `kScaled`,
 *   `qk_scale` (> 0) is the factor logits_and_mask left to apply: the logits are qk_scale * s,
 *   their maximum is qk_scale * max(s) (the same float: rounding is monotonic), and
 *   exp2(qk_scale * s - m) is one FFMA and one MUFU.EX2 per element. `upper_rows` false: rows
 *   g + 8 of every tile lie past the item (a decode tile of at most 8 packed rows, warp-uniform):
 *   their step is skipped, with P = 0 and a row scale of 1 there.
 */
template <bool kScaled = false, int MQ, int NB>
__device__ __forceinline__ bool softmax_step(float (&s)[MQ][NB][4], float (&m)[MQ][2],
                                             float (&d)[MQ][2], float (&row_scale)[MQ][2],
                                             float qk_scale = 1.f, bool upper_rows = true) {
  bool rescale = false;
#pragma unroll
  for (int mq = 0; mq < MQ; ++mq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h == 1 && !upper_rows) {
        row_scale[mq][1] = 1.f;
#pragma unroll
        for (int n = 0; n < NB; ++n) s[mq][n][2] = s[mq][n][3] = 0.f;
        continue;
      }
      float mx = kScaled ? -INFINITY : m[mq][h];  // kScaled: of this tile's unscaled s
#pragma unroll
      for (int n = 0; n < NB; ++n) mx = fmaxf(mx, fmaxf(s[mq][n][2 * h], s[mq][n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
      if constexpr (kScaled) mx = fmaxf(m[mq][h], mx * qk_scale);  // m is in logit units
      const float m_safe = mx == -INFINITY ? 0.f : mx;
      rescale |= mx != m[mq][h];
      row_scale[mq][h] = fast_exp2(m[mq][h] - m_safe);  // m_old = -inf -> 0
      m[mq][h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        float& x0 = s[mq][n][2 * h];
        float& x1 = s[mq][n][2 * h + 1];
        x0 = fast_exp2(kScaled ? fmaf(x0, qk_scale, -m_safe) : x0 - m_safe);
        x1 = fast_exp2(kScaled ? fmaf(x1, qk_scale, -m_safe) : x1 - m_safe);
        sum += s[mq][n][2 * h] + s[mq][n][2 * h + 1];
      }
      d[mq][h] = d[mq][h] * row_scale[mq][h] + sum;
    }
  }
  return __any_sync(0xffffffff, rescale);
}

/// The P operand of keys [16 kk, 16 kk + 16) of MMA tile mq: the mma.m16n8k16 A fragment.
template <typename T, int MQ, int NB>
__device__ __forceinline__ void pack_p(uint32_t (&a)[4], const float (&s)[MQ][NB][4], int mq,
                                       int kk) {
  a[0] = pack2<T>(s[mq][2 * kk][0], s[mq][2 * kk][1]);
  a[1] = pack2<T>(s[mq][2 * kk][2], s[mq][2 * kk][3]);
  a[2] = pack2<T>(s[mq][2 * kk + 1][0], s[mq][2 * kk + 1][1]);
  a[3] = pack2<T>(s[mq][2 * kk + 1][2], s[mq][2 * kk + 1][3]);
}

/// Row sums of the quad (the four threads that share a row).
template <int MQ>
__device__ __forceinline__ void quad_sum(float (&d)[MQ][2]) {
#pragma unroll
  for (int mq = 0; mq < MQ; ++mq)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      d[mq][h] += __shfl_xor_sync(0xffffffff, d[mq][h], 1);
      d[mq][h] += __shfl_xor_sync(0xffffffff, d[mq][h], 2);
    }
}

/// Chunks of the item's request: 1 unless split KV (every q row of a request has as many, and
/// items exist only for qo_len > 0). Loaded where the epilogue needs it: a value held across
/// the main loop costs the decode kernel ~50 registers and 5% of its speed.
__device__ __forceinline__ int item_chunks(const AttentionParams& p, const ItemRange& r) {
  return p.split_kv ? p.merge_indptr[r.qo_begin + 1] - p.merge_indptr[r.qo_begin] : 1;
}

/// Whether an item writes a partial state: under split KV, except where the kernel merges its
/// own chunks (merge_counters set) and the request has one chunk (it writes o / lse directly).
__device__ __forceinline__ bool writes_partial(const AttentionParams& p, const ItemRange& r) {
  return p.split_kv && (p.merge_counters == nullptr || item_chunks(p, r) > 1);
}

/*!
 * @brief Folds the attention sink of q head `head` (AttentionParams::sinks) into one row's state
 *   as the row is written: its sum gains exp(sink) and its output nothing, so the base-2 `lse`
 *   (-inf: no key seen) becomes log2(2^lse + 2^(sink log2 e)); returns the factor of the row's
 *   output, 2^(lse before - lse after) (1 without sinks). Only the item of KV chunk 0 folds it:
 *   a split row's chunks then merge into a state that counts the sink once, and no merge (in
 *   the kernel, in a cluster, or the merge kernel) needs to know of sinks.
 */
__device__ __forceinline__ float fold_sink_log2(float sink_log2, float& lse) {
  if (sink_log2 == -INFINITY) return 1.f;  // no sink (or a sink of -inf): nothing to add
  const float hi = fmaxf(lse, sink_log2);
  const float total = hi + log2f(1.f + exp2f(fminf(lse, sink_log2) - hi));
  const float factor = exp2f(lse - total);  // lse = -inf -> 0 (the row's output is 0 anyway)
  lse = total;
  return factor;
}

/// fold_sink_log2's operand for q head `head` of an item: the sink in base 2, -inf where
/// nothing folds (no sinks, or not KV chunk 0). A caller may load it ahead of its epilogue.
__device__ __forceinline__ float sink_log2(const AttentionParams& p, const ItemRange& r,
                                           int head) {
  return p.sinks == nullptr || r.chunk != 0 ? -INFINITY : p.sinks[head] * kLog2e;
}

__device__ __forceinline__ float fold_sink(const AttentionParams& p, const ItemRange& r, int head,
                                           float& lse) {
  return fold_sink_log2(sink_log2(p, r, head), lse);
}

/// Output stores of one item: the final output (o, lse) or the float32 partial state of the
/// item's chunk (`partial`: writes_partial). Packed row pr is q row pr / G of head
/// kv_head * G + pr % G. D columns per row from column col0 of rows of kRowD (a group of warps
/// that computes a slice of the output columns: col0 = its first, kRowD the output's head dim).
template <typename TO, int D, int kRowD = D>
struct OutputWriter {
  const AttentionParams& p;
  const ItemRange& r;
  uint32_t kv_head;
  bool partial;
  int col0 = 0;

  /// Columns col, col + 1 (of the slice) of packed row pr (already divided by the row sum).
  __device__ __forceinline__ void pair(int pr, int col, float x0, float x1) const {
    const auto [qo, head] = qo_head(pr, kv_head, p.group_div);
    col += col0;
    if (partial) {
      const int64_t part = p.merge_indptr[r.qo_begin + qo] + r.chunk;
      float* dst = p.o_part + (part * p.num_qo_heads + head) * kRowD + col;
      *reinterpret_cast<float2*>(dst) = make_float2(x0 * p.o_scale, x1 * p.o_scale);
    } else {
      TO* dst = static_cast<TO*>(p.o) + (r.qo_begin + qo) * p.o_stride_n + head * p.o_stride_h +
                col;
      *reinterpret_cast<uint32_t*>(dst) = pack2<TO>(x0 * p.o_scale, x1 * p.o_scale);
    }
  }

  /// The base-2 lse of packed row pr.
  __device__ __forceinline__ void lse(int pr, float value) const {
    const auto [qo, head] = qo_head(pr, kv_head, p.group_div);
    lse_at(qo, head, value);
  }

  /// The base-2 lse of q row qo (of the request), q head `head`.
  __device__ __forceinline__ void lse_at(int qo, int head, float value) const {
    if (partial) {
      const int64_t part = p.merge_indptr[r.qo_begin + qo] + r.chunk;
      p.lse_part[part * p.num_qo_heads + head] = value;
    } else if (p.lse != nullptr) {
      p.lse[int64_t(r.qo_begin + qo) * p.num_qo_heads + head] = value;
    }
  }

  /// The sink of packed row pr folded into its base-2 lse (fold_sink): the output's factor.
  __device__ __forceinline__ float sink(int pr, float& lse_value) const {
    return fold_sink(p, r, qo_head(pr, kv_head, p.group_div).head, lse_value);
  }

  /// Rows of one warp straight from accumulator layout: o[mq][n][e] at column 8 n + 2 t (+1).
  template <int MQ>
  __device__ __forceinline__ void rows(const float (&o)[MQ][D / 8][4], const float (&m)[MQ][2],
                                       const float (&d)[MQ][2], int first_row, int g,
                                       int t) const {
#pragma unroll
    for (int mq = 0; mq < MQ; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int pr = first_row + mq * 16 + g + 8 * h;
        if (pr >= r.packed_len) continue;
        float row_lse = d[mq][h] > 0.f ? m[mq][h] + log2f(d[mq][h]) : -INFINITY;
        const float inv = (d[mq][h] > 0.f ? 1.f / d[mq][h] : 0.f) * sink(pr, row_lse);
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
          pair(pr, n * 8 + 2 * t, o[mq][n][2 * h] * inv, o[mq][n][2 * h + 1] * inv);
        if (t == 0 && col0 == 0) lse(pr, row_lse);
      }
  }
};

/// Merges the n partial states of one output row's four columns [col, col + 4) and stores
/// them (o, and the lse at col 0): load(c, s, v) fetches state c's base-2 lse and columns.
/// Sixteen states' loads are in flight together (two rounds for 32).
template <typename TO, class Load>
__device__ __forceinline__ void store_merged(const AttentionParams& p, int64_t qo_row, int head,
                                             int col, int n, Load&& load) {
  constexpr int kUnroll = 16;
  float m = -INFINITY, d = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int c0 = 0; c0 < n; c0 += kUnroll) {
    float s[kUnroll];
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      s[u] = -INFINITY;
      v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (c0 + u < n) load(c0 + u, s[u], v[u]);
    }
    float mx = m;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) mx = fmaxf(mx, s[u]);
    if (mx == -INFINITY) continue;  // no key seen yet: nothing to add
    const float scale = exp2f(m - mx);  // m = -inf -> 0
    d *= scale;
    acc.x *= scale, acc.y *= scale, acc.z *= scale, acc.w *= scale;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // An empty chunk (lse -inf) has weight exactly 0 and wrote v = 0.
      const float w = exp2f(s[u] - mx);
      d += w;
      acc.x += w * v[u].x, acc.y += w * v[u].y, acc.z += w * v[u].z, acc.w += w * v[u].w;
    }
    m = mx;
  }
  const float inv = d > 0.f ? 1.f / d : 0.f;
  TO* dst = static_cast<TO*>(p.o) + qo_row * p.o_stride_n + head * p.o_stride_h + col;
  reinterpret_cast<uint32_t*>(dst)[0] = pack2<TO>(acc.x * inv, acc.y * inv);
  reinterpret_cast<uint32_t*>(dst)[1] = pack2<TO>(acc.z * inv, acc.w * inv);
  if (col == 0 && p.lse != nullptr)
    p.lse[qo_row * p.num_qo_heads + head] = d > 0.f ? m + log2f(d) : -INFINITY;
}

/*!
 * @brief The split-KV merge inside the attention kernel: every thread of the CTA calls this
 *   once its item's partial state is written; the last of the n_chunks CTAs of the item's
 *   (request, tile, KV head), counted by an atomic in merge_counters, merges their partial
 *   states into o and lse and resets the counter for the next launch. This saves the merge
 *   kernel and the gap before it (the merge is dependent loads over a few KB per row, which a
 *   kernel of its own pays again at launch).
 *
 * The partial states of the other CTAs are read through L2 (ld.global.cg): they were written
 * by other SMs, and the count's release and acquire (or the fences around it) order them.
 *
 * `flag`: 4 bytes of the kernel's dynamic shared memory that nothing reads any more. Not a
 * static __shared__ variable: static shared memory goes first and would move the dynamic
 * buffer off its alignment, and the swizzled K/V tiles then conflict on banks (decode 7% slower).
 */
template <typename TO, int D, int kThreads>
__device__ __forceinline__ void merge_if_last(const AttentionParams& p, const ItemRange& r,
                                              uint32_t kv_head, int tile_q, int* flag) {
  if (!p.split_kv || p.merge_counters == nullptr || FLASHINFER_ATTENTION_PROBE_NO_MERGE) return;
  const int n = item_chunks(p, r);
  if (n <= 1) return;  // CTA-uniform, like the tests above
  int* counter = p.merge_counters + int64_t(r.slot) * p.num_kv_heads + kv_head;
  // One acq_rel atomic by thread 0 after the CTA's barrier: the release is cumulative over the
  // CTA's partial-state stores, the acquire covers the last CTA's reads of the others'.
  __syncthreads();  // every thread's partial-state stores come before thread 0's release
  if (threadIdx.x == 0) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;"
                 : "=r"(old)
                 : "l"(counter)
                 : "memory");
    *flag = old == n - 1;
  }
  __syncthreads();  // and the others' reads below come after its acquire
  trace(kTraceCounted);
  if (!*flag) return;

  const int rows = min(tile_q, r.packed_len - r.row_begin);
  for (int idx = threadIdx.x; idx < rows * (D / 4); idx += kThreads) {
    const int pr = r.row_begin + idx / (D / 4), col = (idx % (D / 4)) * 4;
    const auto [qo, head] = qo_head(pr, kv_head, p.group_div);
    const int64_t part0 = p.merge_indptr[r.qo_begin + qo];
    const float* lse_p = p.lse_part + part0 * p.num_qo_heads + head;
    const float* o_p = p.o_part + (part0 * p.num_qo_heads + head) * D + col;
    const int64_t step = p.num_qo_heads;
    store_merged<TO>(p, r.qo_begin + qo, head, col, n, [&](int c, float& s, float4& v) {
      s = __ldcg(lse_p + c * step);
      v = __ldcg(reinterpret_cast<const float4*>(o_p + c * step * D));
    });
  }
  if (threadIdx.x == 0) *counter = 0;  // every CTA of the item has counted: ready for the next run
}

/*!
 * @brief The split-KV merge within a thread-block cluster: the CTAs of one KV head are the n
 *   chunks of one query tile (AttentionParams::cluster_merge; a cluster of gridDim.x CTAs per
 *   KV head), each holding its partial state in shared memory, `part_o` [tile_q][D] (already
 *   divided by its row sum and scaled by o_scale) and `part_lse` [tile_q]. After the cluster's
 *   barrier CTA rank 0 reads them all through distributed shared memory and stores o and lse;
 *   the second barrier keeps every CTA's shared memory until it has. Instead of the partial
 *   states' round trip through L2, a fence and an atomic count (merge_if_last).
 */
template <typename TO, int D, int kThreads>
__device__ __forceinline__ void cluster_merge(const AttentionParams& p, const ItemRange& r,
                                              uint32_t kv_head, int tile_q, const float* part_o,
                                              const float* part_lse) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
  uint32_t rank, n;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  if (rank == 0) {
    const uint32_t o_base = static_cast<uint32_t>(__cvta_generic_to_shared(part_o));
    const uint32_t lse_base = static_cast<uint32_t>(__cvta_generic_to_shared(part_lse));
    const int rows = min(tile_q, r.packed_len - r.row_begin);
    for (int idx = threadIdx.x; idx < rows * (D / 4); idx += kThreads) {
      const int row = idx / (D / 4), col = (idx % (D / 4)) * 4;
      const auto [qo, head] = qo_head(r.row_begin + row, kv_head, p.group_div);
      const uint32_t o_at = o_base + uint32_t(row * D + col) * 4u;
      const uint32_t lse_at = lse_base + uint32_t(row) * 4u;
      store_merged<TO>(p, r.qo_begin + qo, head, col, int(n), [&](int c, float& s, float4& v) {
        uint32_t lse_c, o_c;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(lse_c) : "r"(lse_at), "r"(c));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(o_c) : "r"(o_at), "r"(c));
        asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(s) : "r"(lse_c) : "memory");
        asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                     : "r"(o_c)
                     : "memory");
      });
    }
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

}  // namespace attn
}  // namespace flashinfer

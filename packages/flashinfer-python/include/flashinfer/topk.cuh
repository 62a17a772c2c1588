// Radix top-k: one CTA per row, over the order-preserving integer key of each value.
//
// The first walk reads the row once: it histograms the top 11 bits of every key (2048 bins),
// keeps the first part of the row in shared memory, and stashes every key at or above a bin
// chosen from the first tile (a sample) so that about 1.5 k + 64 keys of the row are expected
// there. The bin that holds the k-th largest key is the threshold bin. Usually the stash holds
// all of it and the rest is resolved in shared memory (stash_select): the remaining key digits,
// then, for ties at the exact k-th key, the index digits as the tie-break asks; the k winners are
// written in index order (ranks from a bitmap of the row). Otherwise (an unrepresentative sample,
// a stash overflow) a second, ordered walk selects the keys above the threshold bin and stashes
// the bin's keys (candidates); their remaining digits are resolved in shared memory, or over the
// row itself when the bin holds more than fit (e.g. rows of a few distinct values). Every write
// position is a rank in index order, so the selection and its order are a pure function of the
// input (always deterministic). A few long rows (SM90: rows <= SMs / 2) take a cluster of CTAs
// a row instead (TopKClusterKernel): each walks its chunk, rank 0 merges the histograms and
// selects from the gathered stashes, with the same results.
//
// Key order: -inf < finite < +inf < NaN (every NaN, either sign, is one key, the largest, as
// torch.topk orders it); -0.0 and +0.0 are one key. Values are written back bit-exactly.
#pragma once
#include <cooperative_groups.h>

#include <atomic>

#include "launch.cuh"
#include "topk_select.cuh"

namespace flashinfer {
namespace topk {

/// Everything the kernel needs; pointers that a mode does not use are null.
struct Params {
  const void* input;
  int64_t row_stride;  // elements
  int num_rows;
  int max_len;  // input.shape[1]
  int k;
  int mode;       // Mode
  int tie_break;  // TieBreak
  bool sorted;    // only for k <= kMaxBufferK (the caller sorts larger k)
  const int32_t* lengths;     // (num_rows,) or null: every row is max_len long
  const int32_t* row_starts;  // (num_rows,) or null: rows start at 0
  // kValues
  void* out_values;        // (num_rows, k) of the input dtype
  int64_t* out_indices64;  // (num_rows, k)
  // kPageTable / kRagged
  int32_t* out_indices32;  // (num_rows, k)
  int32_t* out_raw;        // (num_rows, k) or null: the indices before the transform
  const int32_t* page_table;
  int64_t page_table_stride;
  int page_table_rows, page_table_cols;
  const int32_t* row_to_batch;    // or null: batch = row
  const int32_t* pt_row_starts;   // or null: 0
  int page_size_log2;
  const int32_t* offsets;  // kRagged
  // shared memory layout, set by the launcher
  int buffer_entries;   // power of two >= k when k <= kMaxBufferK, else 0
  int candidate_cap;
  int cache_vecs;       // 16-byte vectors of the row kept in shared memory between passes
};

namespace detail {

/// Writes selected element `pos` of a row (and padding) in the layout of the mode.
struct Output {
  const Params& P;
  int row, start;
  __device__ __forceinline__ void store(int pos, int idx, uint32_t raw, bool wide) const {
    const int64_t o = static_cast<int64_t>(row) * P.k + pos;
    if (P.mode == static_cast<int>(Mode::kValues)) {
      if (wide) {
        static_cast<uint32_t*>(P.out_values)[o] = raw;
      } else {
        static_cast<uint16_t*>(P.out_values)[o] = static_cast<uint16_t>(raw);
      }
      P.out_indices64[o] = idx;
      return;
    }
    if (P.out_raw) P.out_raw[o] = idx;
    int32_t v;
    if (P.mode == static_cast<int>(Mode::kRagged)) {
      v = idx + P.offsets[row];
    } else {
      const int b = P.row_to_batch ? P.row_to_batch[row] : row;
      const int64_t col = (P.pt_row_starts ? P.pt_row_starts[row] : 0) +
                          (static_cast<int64_t>(idx) >> P.page_size_log2);
      v = -1;
      if (b >= 0 && b < P.page_table_rows && col >= 0 && col < P.page_table_cols) {
        const int32_t page = P.page_table[b * P.page_table_stride + col];
        v = (page << P.page_size_log2) + (idx & ((1 << P.page_size_log2) - 1));
      }
    }
    P.out_indices32[o] = v;
  }
  __device__ __forceinline__ void pad(int pos) const {
    const int64_t o = static_cast<int64_t>(row) * P.k + pos;
    if (P.mode == static_cast<int>(Mode::kValues)) {
      P.out_indices64[o] = -1;
      return;
    }
    if (P.out_raw) P.out_raw[o] = -1;
    P.out_indices32[o] = -1;
  }
};

/// The kernel's shared memory, carved as the launcher laid it out: the Shared block, the row
/// cache (cache_vecs), the k-buffer (buffer_entries) and the stash / candidates (candidate_cap).
struct Smem {
  Shared* sh;
  uint4* cache;
  uint32_t* buf_raw;
  int32_t* buf_idx;
  uint32_t* cand_raw;
  int32_t* cand_idx;
  __device__ __forceinline__ Smem(uint8_t* smem, const Params& P) {
    sh = reinterpret_cast<Shared*>(smem);
    uint8_t* p = smem + ((sizeof(Shared) + 15) & ~size_t{15});
    cache = reinterpret_cast<uint4*>(p);
    p += static_cast<size_t>(P.cache_vecs) * 16;
    buf_raw = reinterpret_cast<uint32_t*>(p);
    buf_idx = reinterpret_cast<int32_t*>(buf_raw + P.buffer_entries);
    cand_raw = reinterpret_cast<uint32_t*>(buf_idx + P.buffer_entries);
    cand_idx = reinterpret_cast<int32_t*>(cand_raw + P.candidate_cap);
  }
};

/// Row `row`'s first element and length (row_starts and lengths clamped to the input).
__device__ __forceinline__ void row_span(const Params& P, int row, int* start, int* len) {
  *start = 0;
  *len = P.max_len;
  if (P.row_starts) *start = min(max(P.row_starts[row], 0), P.max_len);
  if (P.lengths) *len = min(max(P.lengths[row], 0), P.max_len - *start);
}

/// The end of every selection of n_sel = min(len, k) elements: the k-buffer (where there is
/// one) sorted where asked and written, the positions beyond n_sel padded.
template <typename K>
__device__ __forceinline__ void finish(const Params& P, const Smem& S, const Output& out,
                                       int n_sel, bool wide) {
  if (P.buffer_entries > 0) {
    if (P.sorted) bitonic_sort<K>(S.buf_raw, S.buf_idx, n_sel, P.buffer_entries);
    for (int j = threadIdx.x; j < P.k; j += kThreads) {
      if (j < n_sel) {
        out.store(j, S.buf_idx[j], S.buf_raw[j], wide);
      } else {
        out.pad(j);
      }
    }
  } else {
    for (int j = n_sel + threadIdx.x; j < P.k; j += kThreads) out.pad(j);
  }
}

/// The top-k of row `row` by this CTA alone (the file's comment); `smem` laid out as Smem.
/// TopKClusterKernel's rank 0 runs it where the cluster's stashes do not hold the selection.
/// TopKKernel keeps its own copy of these lines: calling this function instead (the Params a
/// reference, not the kernel's parameter) changed its register allocation and cost 7% at 128 x
/// 128256 (38.3 -> 41.1 us, k = 50, H100, same call); the copy compiles to the SASS of before.
template <typename T>
__device__ __forceinline__ void topk_row(const Params& P, int row, uint8_t* smem) {
  using K = KeyTraits<T>;
  constexpr bool kWide = sizeof(T) == 4;
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  uint8_t* p = smem + ((sizeof(Shared) + 15) & ~size_t{15});
  uint4* cache = reinterpret_cast<uint4*>(p);
  p += static_cast<size_t>(P.cache_vecs) * 16;
  uint32_t* buf_raw = reinterpret_cast<uint32_t*>(p);
  int32_t* buf_idx = reinterpret_cast<int32_t*>(buf_raw + P.buffer_entries);
  uint32_t* cand_raw = reinterpret_cast<uint32_t*>(buf_idx + P.buffer_entries);
  int32_t* cand_idx = reinterpret_cast<int32_t*>(cand_raw + P.candidate_cap);

  int start = 0, len = P.max_len;
  if (P.row_starts) start = min(max(P.row_starts[row], 0), P.max_len);
  if (P.lengths) len = min(max(P.lengths[row], 0), P.max_len - start);
  const T* ptr = static_cast<const T*>(P.input) + row * P.row_stride + start;
  const Output out{P, row, start};
  const int k = P.k;
  const int n_sel = min(len, k);
  const bool use_buf = P.buffer_entries > 0;
  auto emit = [&](int pos, int idx, uint32_t raw) {
    if (use_buf) {
      buf_raw[pos] = raw;
      buf_idx[pos] = idx;
    } else {
      out.store(pos, idx, raw, kWide);
    }
  };
  auto none = [](int, int, uint32_t) {};

  RowSource<T> rs(ptr, len, cache, P.cache_vecs);
  if (len <= k) {
    ordered_pass<K>(rs, sh, [](uint32_t) { return 1; }, emit, none);
  } else {
    // The stash of the first walk and the candidates of the ordered passes share memory.
    first_walk<K>(rs, sh, cand_raw, cand_idx, P.candidate_cap, k);
    const uint32_t stash_n = sh.stash_n, stash_lo = sh.stash_lo;
    select_bin(sh, kBins, k);
    Prefix pre{sh.bin << 21, 0xffe00000u, k - sh.above, sh.count};
    const uint32_t above = sh.above;
    __syncthreads();
    const int lo_tie = P.tie_break == static_cast<int>(TieBreak::kLarge);
    const int words = (len + 31) / 32;
    const bool from_stash = stash_lo != kNoStash &&
                            stash_n <= static_cast<uint32_t>(P.candidate_cap) &&
                            stash_lo <= (pre.value >> 21) && 2 * words <= 4 * P.cache_vecs;
    if (from_stash) {  // the bitmaps take the row cache's place: the row is not read again
      uint32_t* bits = reinterpret_cast<uint32_t*>(cache);
      stash_select<K>(sh, cand_raw, cand_idx, static_cast<int>(stash_n), pre, lo_tie != 0, bits,
                      bits + words, len, emit);
    } else if (pre.count <= static_cast<uint32_t>(P.candidate_cap)) {
      const uint32_t bin = pre.value >> 21;
      ordered_pass<K>(
          rs, sh, [&](uint32_t key) { return (key >> 21) > bin ? 1 : ((key >> 21) == bin ? 2 : 0); },
          emit,
          [&](uint32_t r, int idx, uint32_t raw) {
            cand_raw[r] = raw;
            cand_idx[r] = idx;
          });
      CandidateSource cs{cand_raw, cand_idx, static_cast<int>(pre.count)};
      const Prefix f = refine<K>(cs, sh, pre);
      const uint32_t n1 = (k - above) - f.remaining;  // candidates strictly above the ties
      const uint32_t lo = lo_tie ? f.count - f.remaining : 0;
      ordered_pass<K>(
          cs, sh,
          [&](uint32_t key) { return (key & f.mask) > f.value ? 1 : ((key & f.mask) == f.value ? 2 : 0); },
          [&](uint32_t r, int idx, uint32_t raw) { emit(above + r, idx, raw); },
          [&](uint32_t r, int idx, uint32_t raw) {
            if (r >= lo && r < lo + f.remaining) emit(above + n1 + (r - lo), idx, raw);
          });
    } else {
      const Prefix f = refine<K>(rs, sh, pre);
      const uint32_t n1 = k - f.remaining;
      const uint32_t lo = lo_tie ? f.count - f.remaining : 0;
      ordered_pass<K>(
          rs, sh,
          [&](uint32_t key) { return (key & f.mask) > f.value ? 1 : ((key & f.mask) == f.value ? 2 : 0); },
          emit,
          [&](uint32_t r, int idx, uint32_t raw) {
            if (r >= lo && r < lo + f.remaining) emit(n1 + (r - lo), idx, raw);
          });
    }
  }
  if (use_buf) {
    if (P.sorted) bitonic_sort<K>(buf_raw, buf_idx, n_sel, P.buffer_entries);
    for (int j = threadIdx.x; j < k; j += kThreads) {
      if (j < n_sel) {
        out.store(j, buf_idx[j], buf_raw[j], kWide);
      } else {
        out.pad(j);
      }
    }
  } else {
    for (int j = n_sel + threadIdx.x; j < k; j += kThreads) out.pad(j);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) TopKKernel(const Params P) {
  using K = KeyTraits<T>;
  constexpr bool kWide = sizeof(T) == 4;
  extern __shared__ __align__(16) uint8_t smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  uint8_t* p = smem + ((sizeof(Shared) + 15) & ~size_t{15});
  uint4* cache = reinterpret_cast<uint4*>(p);
  p += static_cast<size_t>(P.cache_vecs) * 16;
  uint32_t* buf_raw = reinterpret_cast<uint32_t*>(p);
  int32_t* buf_idx = reinterpret_cast<int32_t*>(buf_raw + P.buffer_entries);
  uint32_t* cand_raw = reinterpret_cast<uint32_t*>(buf_idx + P.buffer_entries);
  int32_t* cand_idx = reinterpret_cast<int32_t*>(cand_raw + P.candidate_cap);

  const int row = blockIdx.x;
  int start = 0, len = P.max_len;
  if (P.row_starts) start = min(max(P.row_starts[row], 0), P.max_len);
  if (P.lengths) len = min(max(P.lengths[row], 0), P.max_len - start);
  const T* ptr = static_cast<const T*>(P.input) + row * P.row_stride + start;
  const Output out{P, row, start};
  const int k = P.k;
  const int n_sel = min(len, k);
  const bool use_buf = P.buffer_entries > 0;
  auto emit = [&](int pos, int idx, uint32_t raw) {
    if (use_buf) {
      buf_raw[pos] = raw;
      buf_idx[pos] = idx;
    } else {
      out.store(pos, idx, raw, kWide);
    }
  };
  auto none = [](int, int, uint32_t) {};

  RowSource<T> rs(ptr, len, cache, P.cache_vecs);
  if (len <= k) {
    ordered_pass<K>(rs, sh, [](uint32_t) { return 1; }, emit, none);
  } else {
    // The stash of the first walk and the candidates of the ordered passes share memory.
    first_walk<K>(rs, sh, cand_raw, cand_idx, P.candidate_cap, k);
    const uint32_t stash_n = sh.stash_n, stash_lo = sh.stash_lo;
    select_bin(sh, kBins, k);
    Prefix pre{sh.bin << 21, 0xffe00000u, k - sh.above, sh.count};
    const uint32_t above = sh.above;
    __syncthreads();
    const int lo_tie = P.tie_break == static_cast<int>(TieBreak::kLarge);
    const int words = (len + 31) / 32;
    const bool from_stash = stash_lo != kNoStash &&
                            stash_n <= static_cast<uint32_t>(P.candidate_cap) &&
                            stash_lo <= (pre.value >> 21) && 2 * words <= 4 * P.cache_vecs;
    if (from_stash) {  // the bitmaps take the row cache's place: the row is not read again
      uint32_t* bits = reinterpret_cast<uint32_t*>(cache);
      stash_select<K>(sh, cand_raw, cand_idx, static_cast<int>(stash_n), pre, lo_tie != 0, bits,
                      bits + words, len, emit);
    } else if (pre.count <= static_cast<uint32_t>(P.candidate_cap)) {
      const uint32_t bin = pre.value >> 21;
      ordered_pass<K>(
          rs, sh, [&](uint32_t key) { return (key >> 21) > bin ? 1 : ((key >> 21) == bin ? 2 : 0); },
          emit,
          [&](uint32_t r, int idx, uint32_t raw) {
            cand_raw[r] = raw;
            cand_idx[r] = idx;
          });
      CandidateSource cs{cand_raw, cand_idx, static_cast<int>(pre.count)};
      const Prefix f = refine<K>(cs, sh, pre);
      const uint32_t n1 = (k - above) - f.remaining;  // candidates strictly above the ties
      const uint32_t lo = lo_tie ? f.count - f.remaining : 0;
      ordered_pass<K>(
          cs, sh,
          [&](uint32_t key) { return (key & f.mask) > f.value ? 1 : ((key & f.mask) == f.value ? 2 : 0); },
          [&](uint32_t r, int idx, uint32_t raw) { emit(above + r, idx, raw); },
          [&](uint32_t r, int idx, uint32_t raw) {
            if (r >= lo && r < lo + f.remaining) emit(above + n1 + (r - lo), idx, raw);
          });
    } else {
      const Prefix f = refine<K>(rs, sh, pre);
      const uint32_t n1 = k - f.remaining;
      const uint32_t lo = lo_tie ? f.count - f.remaining : 0;
      ordered_pass<K>(
          rs, sh,
          [&](uint32_t key) { return (key & f.mask) > f.value ? 1 : ((key & f.mask) == f.value ? 2 : 0); },
          emit,
          [&](uint32_t r, int idx, uint32_t raw) {
            if (r >= lo && r < lo + f.remaining) emit(n1 + (r - lo), idx, raw);
          });
    }
  }
  if (use_buf) {
    if (P.sorted) bitonic_sort<K>(buf_raw, buf_idx, n_sel, P.buffer_entries);
    for (int j = threadIdx.x; j < k; j += kThreads) {
      if (j < n_sel) {
        out.store(j, buf_idx[j], buf_raw[j], kWide);
      } else {
        out.pad(j);
      }
    }
  } else {
    for (int j = n_sel + threadIdx.x; j < k; j += kThreads) out.pad(j);
  }
}

/// Rows at least this long are split over the CTAs of a cluster (TopKClusterKernel): a chunk of
/// 4096+ elements a CTA.
constexpr int kClusterMinChunk = 4096;

/*!
 * @brief One row per cluster of C CTAs (small batches of long rows: a CTA a row leaves most SMs
 *   idle). Each CTA walks its chunk of the row as topk_row's first walk does (the 11-bit
 *   histogram and a stash sampled for ~1.5 k / C + 64 keys); rank 0 sums the histograms over
 *   DSMEM, finds the threshold bin and, where every stash holds that bin and above and they fit
 *   its own together, gathers them and selects from them exactly as topk_row's stash path
 *   (ranks in index order from a bitmap of the row). Otherwise rank 0 runs topk_row on the
 *   whole row alone. The same outputs as TopKKernel, bit for bit.
 */
template <typename T>
__global__ void __launch_bounds__(kThreads, 1) TopKClusterKernel(const Params P) {
  using K = KeyTraits<T>;
  extern __shared__ __align__(16) uint8_t smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int row = blockIdx.x / C;
  int start, len;
  row_span(P, row, &start, &len);
  if (len <= P.k || len < C * kClusterMinChunk) {  // (uniform over the cluster)
    if (rank == 0) topk_row<T>(P, row, smem);
    return;
  }
  const Smem S(smem, P);
  Shared& sh = *S.sh;
  // rank 0: each rank's stash size and offset, whether the stashes hold the selection (static:
  // the launcher leaves room for it)
  __shared__ uint32_t peer_n[8], peer_at[8];
  __shared__ int gather;
  const int chunk = (len + C - 1) / C;
  const int c0 = min(rank * chunk, len), c1 = min(c0 + chunk, len);
  const T* ptr = static_cast<const T*>(P.input) + row * P.row_stride + start;
  RowSource<T> rs(ptr + c0, c1 - c0, S.cache, 0);
  first_walk<K>(rs, sh, S.cand_raw, S.cand_idx, P.candidate_cap, (P.k + C - 1) / C);
  const int n_mine = static_cast<int>(min(sh.stash_n, static_cast<uint32_t>(P.candidate_cap)));
  for (int i = threadIdx.x; i < n_mine; i += kThreads) S.cand_idx[i] += c0;  // row indices
  cluster.sync();  // every rank's histogram and stash are final
  if (rank == 0) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      uint32_t sum = sh.hist[b];
      for (int r = 1; r < C; ++r) sum += cluster.map_shared_rank(sh.hist, r)[b];
      sh.hist[b] = sum;
    }
    if (threadIdx.x == 0) {  // the stashes: sizes, offsets, the highest of their lowest bins
      bool ok = true;
      uint32_t at = 0, lo_all = 0;
      for (int r = 0; r < C; ++r) {
        const Shared* q = cluster.map_shared_rank(&sh, r);
        const uint32_t n = q->stash_n, lo = q->stash_lo;
        ok = ok && lo != kNoStash && n <= static_cast<uint32_t>(P.candidate_cap);
        lo_all = max(lo_all, lo);
        peer_n[r] = n, peer_at[r] = at, at += n;
      }
      gather = ok && at <= static_cast<uint32_t>(P.candidate_cap);
      sh.stash_n = at;
      sh.stash_lo = lo_all;
    }
    __syncthreads();
    const uint32_t lo_all = sh.stash_lo;
    select_bin(sh, kBins, P.k);  // the threshold bin of the merged histogram
    const int words = (len + 31) / 32;
    if (threadIdx.x == 0) gather = gather && lo_all <= sh.bin && 2 * words <= 4 * P.cache_vecs;
    __syncthreads();
    if (gather) {  // the peers' stashes after rank 0's own
      for (int r = 1; r < C; ++r) {
        const uint32_t* raw = cluster.map_shared_rank(S.cand_raw, r);
        const int32_t* idx = cluster.map_shared_rank(S.cand_idx, r);
        for (uint32_t i = threadIdx.x; i < peer_n[r]; i += kThreads) {
          S.cand_raw[peer_at[r] + i] = raw[i];
          S.cand_idx[peer_at[r] + i] = idx[i];
        }
      }
    }
  }
  cluster.sync();  // the peers' shared memory is read: they are done
  if (rank != 0) return;
  if (!gather) {
    __syncthreads();
    topk_row<T>(P, row, smem);
    return;
  }
  constexpr bool kWide = sizeof(T) == 4;
  const Output out{P, row, start};
  const bool use_buf = P.buffer_entries > 0;
  auto emit = [&](int pos, int idx, uint32_t raw) {
    if (use_buf) {
      S.buf_raw[pos] = raw;
      S.buf_idx[pos] = idx;
    } else {
      out.store(pos, idx, raw, kWide);
    }
  };
  const Prefix pre{sh.bin << 21, 0xffe00000u, P.k - sh.above, sh.count};
  __syncthreads();
  const int words = (len + 31) / 32;
  uint32_t* bits = reinterpret_cast<uint32_t*>(S.cache);
  stash_select<K>(sh, S.cand_raw, S.cand_idx, static_cast<int>(sh.stash_n), pre,
                  P.tie_break == static_cast<int>(TieBreak::kLarge), bits, bits + words, len, emit);
  finish<K>(P, S, out, P.k, kWide);
#else
  if (blockIdx.x == 0 && threadIdx.x == 0) __trap();  // launched on SM90+ only
#endif
}

}  // namespace detail

/// Bytes of shared memory of everything but the row cache.
inline size_t FixedSmemBytes(int buffer_entries, int candidate_cap) {
  return ((sizeof(detail::Shared) + 15) & ~size_t{15}) +
         static_cast<size_t>(buffer_entries) * 8 + static_cast<size_t>(candidate_cap) * 8;
}

/// CTAs a row: a cluster of C = min(8, SMs / rows, max_len / kClusterMinChunk) on SM90+ where
/// that is 2 or more (a batch that leaves most SMs idle at one CTA a row: 64 x 65536 at k =
/// 2048, 1 x 256000) and the device holds such a cluster with `smem` bytes a CTA (asked once a
/// device and size; sets the kernel's shared-memory attribute), else 1.
template <typename T>
int cluster_size(const Params& P, int dev, int smem) {
  int sms = 0, major = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  int C = min(8, min(sms / P.num_rows, P.max_len / detail::kClusterMinChunk));
  if (major < 9 || C < 2 || P.max_len <= P.k) return 1;
  constexpr int kDevices = 64;
  static std::atomic<int> fits[kDevices][9];  // 0 unknown, 1 holds, 2 does not
  std::atomic<int>* known = dev < kDevices ? &fits[dev][C] : nullptr;
  if (known && known->load(std::memory_order_relaxed)) return known->load() == 1 ? C : 1;
  auto kernel = detail::TopKClusterKernel<T>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int clusters = 0;
  if (e == cudaSuccess) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(C);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = C;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  }
  if (e != cudaSuccess) (void)cudaGetLastError();
  const bool ok = e == cudaSuccess && clusters >= 1;
  if (known) known->store(ok ? 1 : 2);
  return ok ? C : 1;
}

/// Launch one CTA per row (or a cluster a row: cluster_size). Fills P's shared-memory layout
/// fields from the device's limit.
template <typename T>
cudaError_t TopK(Params P, cudaStream_t stream) {
  if (P.num_rows == 0 || P.k == 0) return cudaSuccess;
  int dev = 0, smem_optin = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return err;
  int entries = 0;
  if (P.k <= kMaxBufferK) {
    entries = 1;
    while (entries < P.k) entries <<= 1;
  }
  P.buffer_entries = entries;
  P.candidate_cap = P.max_len < kCandidateCap ? P.max_len : kCandidateCap;
  const size_t fixed = FixedSmemBytes(entries, P.candidate_cap);
  const int64_t row_vecs = (static_cast<int64_t>(P.max_len) * sizeof(T) + 15) / 16;
  int64_t room = (static_cast<int64_t>(smem_optin) - static_cast<int64_t>(fixed)) / 16;
  if (room < 0) room = 0;
  P.cache_vecs = static_cast<int>(row_vecs < room ? row_vecs : room);
  const size_t smem = fixed + static_cast<size_t>(P.cache_vecs) * 16;
  if (smem > static_cast<size_t>(smem_optin)) return cudaErrorInvalidConfiguration;
  // The cluster kernel's static shared memory (~100 B) comes out of the row cache.
  const int C = P.cache_vecs > 16 ? cluster_size<T>(P, dev, static_cast<int>(smem) - 256) : 1;
  if (C > 1) {
    P.cache_vecs -= 16;
    auto kernel = detail::TopKClusterKernel<T>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem) - 256);
    if (err != cudaSuccess) return err;
    return launch_kernel_clustered(kernel, dim3(P.num_rows * C), dim3(kThreads), smem - 256,
                                   stream, false, static_cast<unsigned>(C), P);
  }
  auto kernel = detail::TopKKernel<T>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<P.num_rows, kThreads, smem, stream>>>(P);
  return cudaGetLastError();
}

}  // namespace topk
}  // namespace flashinfer
// Paged KV-cache helpers: appending ragged K/V rows into pages, and the ragged-to-COO index
// conversion that feeds it. Framework-free: raw pointers, sizes and int64 element strides in,
// cudaError_t out.
//
// The paged cache. K and V are each a 4-D view, pages x slots x heads x head_dim in some order:
// NHD [P, page_size, H, D] or HND [P, H, page_size, D], last dim contiguous, every other stride
// free (a page dim of a 5-D [P, 2, ...] tensor, a slice, K and V with different strides). The
// kernels see only the three strides (page, slot, head), so both layouts are the same code.
// Request b owns the pages kv_indices[kv_indptr[b] .. kv_indptr[b+1]), in order; its token at
// position pos lives in page kv_indices[kv_indptr[b] + pos / page_size], slot pos % page_size.
//
// AppendPagedKVCache is a gather-free scatter copy: each 16-byte vector of an appended row is
// read once and written once. Work items are the vectors of token t's K rows (all heads), then
// its V rows, token after token; thread i of a block takes items i, i + kThreads, ... of the
// block's range and issues the source loads of all its items before resolving any destination
// (batch index -> indptr -> page index: three dependent, L1-cached loads), so the row loads are
// in flight while the page table is walked. The copy is by element size (1, 2 or 4 bytes), so
// fp8, half and float caches share the kernels; half rows appended to an fp8 cache are cast on
// the way (round to nearest even, saturating to the largest finite value, NaN kept), 8
// elements per item (16 bytes read, 8 written).
//
// Tokens whose batch index is negative (padding) or whose position falls outside the request's
// pages are skipped rather than written out of bounds, and so are page-table entries outside
// kv_indices and page ids outside [0, num_pages): the page table lives on the device, so the
// host cannot check it without a synchronization, and a bad id must never write outside the
// cache. Skipped rows are not reported (a report would need a device flag the host reads back,
// which a CUDA-graph-captured append cannot do); the appended rows simply do not appear.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fastdiv.cuh"
#include "launch.cuh"
#include "vec.cuh"

namespace flashinfer {
namespace page {

/*!
 * @brief Arguments of AppendPagedKVCache. Strides are in elements.
 * @tparam T the appended element's type: for a copy its storage type, uint8_t (fp8), uint16_t
 *   (half) or uint32_t (float); for a cast __half or __nv_bfloat16
 * @tparam TC the cache's element type: T (a copy), or __nv_fp8_e4m3 / __nv_fp8_e5m2 (a cast)
 */
template <typename T, typename TC = T>
struct AppendArgs {
  const T* key = nullptr;    ///< (nnz, num_heads, head_dim)
  const T* value = nullptr;  ///< (nnz, num_heads, head_dim)
  int64_t key_stride_n = 0, key_stride_h = 0, value_stride_n = 0, value_stride_h = 0;
  TC* k_cache = nullptr;
  TC* v_cache = nullptr;
  int64_t k_stride_page = 0, k_stride_slot = 0, k_stride_head = 0;
  int64_t v_stride_page = 0, v_stride_slot = 0, v_stride_head = 0;
  const int32_t* batch_indices = nullptr;  ///< (nnz,)
  const int32_t* positions = nullptr;      ///< (nnz,)
  const int32_t* kv_indices = nullptr;     ///< (kv_indptr[batch_size],)
  const int32_t* kv_indptr = nullptr;      ///< (batch_size + 1,)
  int64_t num_indices = 0;                 ///< length of kv_indices
  int64_t num_pages = 0;                   ///< pages of k_cache and v_cache: ids in [0, num_pages)
  int64_t nnz = 0, num_heads = 0, head_dim = 0, page_size = 0, batch_size = 0;
};

namespace detail {

inline constexpr int kThreads = 128;
// Four 16-byte rows in flight per thread before the page-table walk (the copy-kernel setting of
// the other streaming kernels: rope.cuh, cascade.cuh).
inline constexpr int kItemsPerThread = 4;
inline constexpr int kBlockItems = kThreads * kItemsPerThread;

/// N elements of T as one access: one 16-byte word, or one element; stored as TC (a copy where
/// TC is T, else an fp8 cast).
template <typename T, typename TC, int N, bool kCast = !std::is_same_v<T, TC>>
struct Chunk {
  static_assert(sizeof(T) * N == 16 || N == 1, "a chunk is 16 bytes or one element");
  using Word = std::conditional_t<N == 1, T, int4>;
  Word w;
  __device__ __forceinline__ void load(const T* p) { w = *reinterpret_cast<const Word*>(p); }
  __device__ __forceinline__ void store(TC* p) const { *reinterpret_cast<Word*>(p) = w; }
};

/// Two halves (__half or __nv_bfloat16, packed in `two`) as two fp8 values of type TC, packed.
template <typename T, typename TC>
__device__ __forceinline__ uint16_t cast_fp8x2(uint32_t two) {
  constexpr __nv_fp8_interpretation_t kKind =
      std::is_same_v<TC, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
  if constexpr (std::is_same_v<T, __half>) {
    __half2_raw h;
    h.x = static_cast<unsigned short>(two), h.y = static_cast<unsigned short>(two >> 16);
    return __nv_cvt_halfraw2_to_fp8x2(h, __NV_SATFINITE, kKind);
  } else {
    __nv_bfloat162_raw h;
    h.x = static_cast<unsigned short>(two), h.y = static_cast<unsigned short>(two >> 16);
    return __nv_cvt_bfloat16raw2_to_fp8x2(h, __NV_SATFINITE, kKind);
  }
}

template <typename T, typename TC, int N>
struct Chunk<T, TC, N, true> {
  static_assert(sizeof(T) == 2 && sizeof(TC) == 1, "the cast is half -> fp8");
  static_assert(N == 8 || N == 1, "a cast chunk is 16 bytes in, 8 out, or one element");
  using Word = std::conditional_t<N == 1, uint32_t, int4>;
  Word w;
  __device__ __forceinline__ void load(const T* p) {
    if constexpr (N == 1) {
      w = *reinterpret_cast<const uint16_t*>(p);
    } else {
      w = *reinterpret_cast<const int4*>(p);
    }
  }
  __device__ __forceinline__ void store(TC* p) const {
    if constexpr (N == 1) {
      *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(cast_fp8x2<T, TC>(w));
    } else {
      uint2 out;
      out.x = uint32_t(cast_fp8x2<T, TC>(w.x)) | (uint32_t(cast_fp8x2<T, TC>(w.y)) << 16);
      out.y = uint32_t(cast_fp8x2<T, TC>(w.z)) | (uint32_t(cast_fp8x2<T, TC>(w.w)) << 16);
      *reinterpret_cast<uint2*>(p) = out;
    }
  }
};

template <typename T, typename TC = T>
struct AppendParams {
  const T* key;
  const T* value;
  int64_t key_sn, key_sh, value_sn, value_sh;
  TC* k_cache;
  TC* v_cache;
  int64_t k_sp, k_ss, k_sh, v_sp, v_ss, v_sh;
  const int32_t* batch_indices;
  const int32_t* positions;
  const int32_t* kv_indices;
  const int32_t* kv_indptr;
  int64_t num_indices, num_pages;
  int64_t nnz, batch_size;
  FastDiv items_per_token;  // 2 * heads * vph: the K rows, then the V rows
  uint32_t k_items;         // heads * vph
  FastDiv vph;              // chunks per head row
  FastDiv page_size;
};

/// Token, K or V, head and chunk of item `local` of the block (counted from the block's first
/// token tok0 at offset rem0).
struct AppendItem {
  int64_t token;
  uint32_t head, chunk;
  bool is_v;
};

template <typename T, typename TC>
__device__ __forceinline__ AppendItem append_item(const AppendParams<T, TC>& p, int64_t tok0,
                                                  int64_t rem0, uint32_t k) {
  // rem0 < items_per_token and k < kBlockItems, so the dividend stays far below 2^31.
  uint32_t dt, r;
  p.items_per_token.divmod(static_cast<uint32_t>(rem0) + k * kThreads + threadIdx.x, dt, r);
  AppendItem it;
  it.token = tok0 + dt;
  it.is_v = r >= p.k_items;
  p.vph.divmod(it.is_v ? r - p.k_items : r, it.head, it.chunk);
  return it;
}

template <typename T, typename TC, int N>
__global__ void __launch_bounds__(kThreads) AppendPagedKVCacheKernel(
    const __grid_constant__ AppendParams<T, TC> p) {
  int64_t tok0, rem0;
  p.items_per_token.divmod64(int64_t{blockIdx.x} * kBlockItems, tok0, rem0);
  pdl_wait();
  Chunk<T, TC, N> c[kItemsPerThread];
#pragma unroll
  for (int k = 0; k < kItemsPerThread; ++k) {
    const AppendItem it = append_item(p, tok0, rem0, k);
    if (it.token >= p.nnz) continue;
    const T* src = it.is_v ? p.value + it.token * p.value_sn + it.head * p.value_sh
                           : p.key + it.token * p.key_sn + it.head * p.key_sh;
    c[k].load(src + int64_t{it.chunk} * N);
  }
#pragma unroll
  for (int k = 0; k < kItemsPerThread; ++k) {
    const AppendItem it = append_item(p, tok0, rem0, k);
    if (it.token >= p.nnz) continue;
    const int64_t b = p.batch_indices[it.token];
    const int64_t pos = p.positions[it.token];
    if (b < 0 || b >= p.batch_size || pos < 0) continue;
    uint32_t page_of_req, slot;
    p.page_size.divmod(static_cast<uint32_t>(pos), page_of_req, slot);  // pos < 2^31
    const int64_t entry = p.kv_indptr[b] + page_of_req;
    if (entry >= p.kv_indptr[b + 1]) continue;  // position beyond the request's pages
    if (entry < 0 || entry >= p.num_indices) continue;  // an indptr past kv_indices
    const int64_t page = p.kv_indices[entry];
    if (page < 0 || page >= p.num_pages) continue;  // a page id outside the cache
    TC* dst = it.is_v ? p.v_cache + page * p.v_sp + int64_t{slot} * p.v_ss + it.head * p.v_sh
                      : p.k_cache + page * p.k_sp + int64_t{slot} * p.k_ss + it.head * p.k_sh;
    c[k].store(dst + int64_t{it.chunk} * N);
  }
  pdl_launch_dependents();
}

inline bool divisible(int64_t x, int64_t n) { return x % n == 0; }

__global__ void BatchIndicesPositionsKernel(const int32_t* __restrict__ append_indptr,
                                            const int32_t* __restrict__ seq_lens,
                                            int64_t batch_size, int64_t nnz,
                                            int32_t* __restrict__ batch_indices,
                                            int32_t* __restrict__ positions,
                                            bool zero_unused) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  pdl_wait();
  if (i < nnz) {
    const int64_t first = append_indptr[0], last = append_indptr[batch_size];
    if (i < first || i >= last) {
      batch_indices[i] = -1;
      if (zero_unused) positions[i] = 0;
    } else {
      // Largest b with append_indptr[b] <= i: empty requests (equal entries) are passed over
      // because the search keeps the last of equal entries.
      int64_t lo = 0, hi = batch_size;  // append_indptr[lo] <= i < append_indptr[hi]
      while (hi - lo > 1) {
        const int64_t mid = (lo + hi) >> 1;
        if (append_indptr[mid] <= i) {
          lo = mid;
        } else {
          hi = mid;
        }
      }
      const int64_t start = append_indptr[lo], len = append_indptr[lo + 1] - start;
      batch_indices[i] = static_cast<int32_t>(lo);
      positions[i] = static_cast<int32_t>(seq_lens[lo] - len + (i - start));
    }
  }
  pdl_launch_dependents();
}

}  // namespace detail

/*!
 * @brief Copy (or cast, TC an fp8 type) row t of key/value (every head) into request
 *        batch_indices[t]'s page for position positions[t]. The page table must already cover
 *        the appended tokens.
 */
template <typename T, typename TC = T>
cudaError_t AppendPagedKVCache(const AppendArgs<T, TC>& a, bool enable_pdl,
                               cudaStream_t stream) {
  using namespace detail;
  if (a.nnz == 0 || a.num_heads == 0 || a.head_dim == 0) return cudaSuccess;
  if (a.page_size <= 0 || a.page_size >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok =
      divisible(a.head_dim, kVec) && is_aligned(a.key, 16) && is_aligned(a.value, 16) &&
      is_aligned(a.k_cache, kVec * sizeof(TC)) && is_aligned(a.v_cache, kVec * sizeof(TC)) &&
      divisible(a.key_stride_n, kVec) && divisible(a.key_stride_h, kVec) &&
      divisible(a.value_stride_n, kVec) && divisible(a.value_stride_h, kVec) &&
      divisible(a.k_stride_page, kVec) && divisible(a.k_stride_slot, kVec) &&
      divisible(a.k_stride_head, kVec) && divisible(a.v_stride_page, kVec) &&
      divisible(a.v_stride_slot, kVec) && divisible(a.v_stride_head, kVec);
  const int64_t vph = vec_ok ? a.head_dim / kVec : a.head_dim;
  const int64_t items_per_token = 2 * a.num_heads * vph;
  // Item offsets within a block are 32-bit (FastDiv): a token's items must stay below 2^30.
  if (items_per_token >= (int64_t{1} << 30)) return cudaErrorInvalidValue;
  const int64_t blocks = ceil_div(a.nnz * items_per_token, kBlockItems);
  if (blocks > (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;
  AppendParams<T, TC> p{a.key,
                    a.value,
                    a.key_stride_n,
                    a.key_stride_h,
                    a.value_stride_n,
                    a.value_stride_h,
                    a.k_cache,
                    a.v_cache,
                    a.k_stride_page,
                    a.k_stride_slot,
                    a.k_stride_head,
                    a.v_stride_page,
                    a.v_stride_slot,
                    a.v_stride_head,
                    a.batch_indices,
                    a.positions,
                    a.kv_indices,
                    a.kv_indptr,
                    a.num_indices,
                    a.num_pages,
                    a.nnz,
                    a.batch_size,
                    FastDiv(static_cast<uint32_t>(items_per_token)),
                    static_cast<uint32_t>(a.num_heads * vph),
                    FastDiv(static_cast<uint32_t>(vph)),
                    FastDiv(static_cast<uint32_t>(a.page_size))};
  const dim3 grid(static_cast<unsigned>(blocks));
  if (vec_ok) {
    return launch_kernel(AppendPagedKVCacheKernel<T, TC, kVec>, grid, dim3(kThreads), 0, stream,
                         enable_pdl, p);
  }
  return launch_kernel(AppendPagedKVCacheKernel<T, TC, 1>, grid, dim3(kThreads), 0, stream,
                       enable_pdl, p);
}

/*!
 * @brief Ragged offsets to (batch index, position): entry i of request b (append_indptr[b] <= i
 *        < append_indptr[b+1]) gets batch_indices[i] = b and positions[i] = seq_lens[b] -
 *        (append_indptr[b+1] - append_indptr[b]) + (i - append_indptr[b]). Entries i < nnz that
 *        belong to no request get batch index -1, and position 0 when `zero_unused`.
 */
inline cudaError_t GetBatchIndicesPositions(const int32_t* append_indptr, const int32_t* seq_lens,
                                            int64_t batch_size, int64_t nnz,
                                            int32_t* batch_indices, int32_t* positions,
                                            bool zero_unused, bool enable_pdl,
                                            cudaStream_t stream) {
  if (nnz == 0) return cudaSuccess;
  constexpr int kBlock = 256;
  const int64_t blocks = ceil_div(nnz, kBlock);
  if (blocks > (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;
  return launch_kernel(detail::BatchIndicesPositionsKernel, dim3(static_cast<unsigned>(blocks)),
                       dim3(kBlock), 0, stream, enable_pdl, append_indptr, seq_lens, batch_size,
                       nnz, batch_indices, positions, zero_unused);
}

}  // namespace page
}  // namespace flashinfer

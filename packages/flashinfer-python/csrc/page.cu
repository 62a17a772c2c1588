// TVM-FFI bindings of flashinfer::page (include/flashinfer/page.cuh): append_paged_kv_cache
// (a copy, or a cast of float16/bfloat16 rows into an fp8 cache), get_batch_indices_positions. The Python layer turns the paged cache (5-D tensor or (k, v)
// tuple, NHD or HND) into two 4-D views; here they arrive with the layout code.
#include <flashinfer/page.cuh>

#include <cstdint>
#include <utility>

#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;

namespace {

constexpr int64_t kLayoutNHD = 0;  // [pages, page_size, heads, head_dim]
constexpr int64_t kLayoutHND = 1;  // [pages, heads, page_size, head_dim]

/// Stride of dim d, 0 for a size-1 dim (never used to address anything; keeps such views on
/// the 16-byte path whatever torch left there).
int64_t stride(const TensorView& t, int d) { return t.size(d) == 1 ? 0 : t.stride(d); }

void check_int32_vector(const TensorView& ref, const TensorView& t, const char* name) {
  check_same_device(ref, "append_key", t, name);
  TVM_FFI_CHECK(is_dtype(t.dtype(), kDLInt, 32), TypeError)
      << name << " must be int32, got " << dtype_name(t.dtype());
  check_ndim(t, name, 1);
  check_contiguous(t, name);
}

/// K or V of the paged cache as a 4-D view [P, page, H, D] (NHD) / [P, H, page, D] (HND): a
/// 4-D tensor, or half `which` (0 = K, 1 = V) of a 5-D [P, 2, ...] tensor, which the Python
/// layer's fast path passes whole (as both k_cache and v_cache) so that no view is made per call.
struct CacheView {
  const TensorView& t;
  int which;
  /// The tensor dim of view dim d (0..3).
  int dim(int d) const { return t.ndim() == 5 && d > 0 ? d + 1 : d; }
  int64_t size(int d) const { return t.size(dim(d)); }
  int64_t stride(int d) const { return ::stride(t, dim(d)); }
  template <typename U>
  U* data() const {
    return data_ptr<U>(t) + (t.ndim() == 5 ? which * t.stride(1) : 0);
  }
};

/// Call `f(U{})` with U the unsigned integer of the element width: the append is a copy, so
/// fp8 (1 byte), half (2) and float (4) caches share the kernels. The dtypes are the Python
/// layer's CACHE_DTYPES (float16, bfloat16, float32, float8_e4m3fn, float8_e5m2).
template <typename F>
void dispatch_element_width(DLDataType dt, F&& f) {
  const bool ok = is_dtype(dt, kDLFloat, 16) || is_dtype(dt, kDLBfloat, 16) ||
                  is_dtype(dt, kDLFloat, 32) || is_dtype(dt, kDLFloat8_e4m3fn, 8) ||
                  is_dtype(dt, kDLFloat8_e5m2, 8);
  TVM_FFI_CHECK(ok, TypeError)
      << "append_key must be float16, bfloat16, float32, float8_e4m3fn or float8_e5m2, got "
      << dtype_name(dt);
  switch (dt.bits) {
    case 8: return f(uint8_t{});
    case 16: return f(uint16_t{});
    default: return f(uint32_t{});
  }
}

bool is_half(DLDataType dt) { return is_dtype(dt, kDLFloat, 16) || is_dtype(dt, kDLBfloat, 16); }
bool is_fp8(DLDataType dt) {
  return is_dtype(dt, kDLFloat8_e4m3fn, 8) || is_dtype(dt, kDLFloat8_e5m2, 8);
}

/// Call `f(T{}, TC{})` with the half type of the appended rows and the fp8 type of the cache.
template <typename F>
void dispatch_cast(DLDataType rows, DLDataType cache, F&& f) {
  const bool e4m3 = is_dtype(cache, kDLFloat8_e4m3fn, 8);
  if (is_dtype(rows, kDLFloat, 16)) {
    return e4m3 ? f(__half{}, __nv_fp8_e4m3{}) : f(__half{}, __nv_fp8_e5m2{});
  }
  return e4m3 ? f(__nv_bfloat16{}, __nv_fp8_e4m3{}) : f(__nv_bfloat16{}, __nv_fp8_e5m2{});
}

}  // namespace

// [append_paged_kv_cache_binding.begin]
/// k_cache/v_cache: 4-D views [P, page, H, D] (layout 0, NHD) or [P, H, page, D] (1, HND), or
/// one 5-D [P, 2, ...] tensor passed as both (CacheView); append_key/append_value (nnz, H, D),
/// the cache's dtype or float16/bfloat16 into an fp8 cache (cast); metadata int32.
void append_paged_kv_cache(TensorView k_cache, TensorView v_cache, TensorView append_key,
                           TensorView append_value, TensorView batch_indices,
                           TensorView positions, TensorView kv_indices, TensorView kv_indptr,
                           TensorView kv_last_page_len, int64_t layout, bool enable_pdl) {
  // 1. Validate inputs.
  check_cuda(append_key, "append_key");
  TVM_FFI_CHECK(layout == kLayoutNHD || layout == kLayoutHND, ValueError)
      << "layout must be 0 (NHD) or 1 (HND), got " << layout;
  check_ndim(append_key, "append_key", 3);
  check_last_dim_contiguous(append_key, "append_key");
  const int64_t nnz = append_key.size(0), heads = append_key.size(1), dim = append_key.size(2);
  check_same_device(append_key, "append_key", append_value, "append_value");
  check_same_dtype(append_key, "append_key", append_value, "append_value");
  check_ndim(append_value, "append_value", 3);
  for (int d = 0; d < 3; ++d) check_size(append_value, "append_value", d, append_key.size(d));
  check_last_dim_contiguous(append_value, "append_value");
  const int slot_dim = layout == kLayoutNHD ? 1 : 2;
  const int head_dim_of_cache = layout == kLayoutNHD ? 2 : 1;
  if (k_cache.ndim() == 5 || v_cache.ndim() == 5) {  // one [P, 2, ...] tensor, passed twice
    TVM_FFI_CHECK(k_cache.ndim() == 5 && v_cache.ndim() == 5 &&
                      k_cache.data_ptr() == v_cache.data_ptr() &&
                      k_cache.byte_offset() == v_cache.byte_offset(),
                  ValueError)
        << "a 5-D paged cache must be passed as both k_cache and v_cache";
    check_size(k_cache, "paged_kv_cache", 1, 2);
  }
  const CacheView k{k_cache, 0}, v{v_cache, 1};
  for (const auto& [cache, name] : {std::pair{k, "k_cache"}, std::pair{v, "v_cache"}}) {
    check_same_device(append_key, "append_key", cache.t, name);
    if (!(is_half(append_key.dtype()) && is_fp8(cache.t.dtype()))) {
      check_same_dtype(append_key, "append_key", cache.t, name);
    }
    if (cache.t.ndim() != 5) check_ndim(cache.t, name, 4);
    TVM_FFI_CHECK(cache.size(head_dim_of_cache) == heads && cache.size(3) == dim, ValueError)
        << name << " must have num_heads " << heads << " and head_dim " << dim
        << " (those of append_key), got shape " << shape_str(cache.t);
    check_last_dim_contiguous(cache.t, name);
  }
  check_same_dtype(k_cache, "k_cache", v_cache, "v_cache");
  TVM_FFI_CHECK(v.size(slot_dim) == k.size(slot_dim) && v.size(0) == k.size(0), ValueError)
      << "v_cache must have the page size and number of pages of k_cache, got shapes "
      << shape_str(k_cache) << " and " << shape_str(v_cache);
  const int64_t page_size = k.size(slot_dim);
  TVM_FFI_CHECK(page_size >= 1 && page_size < (int64_t{1} << 31), ValueError)
      << "the cache's page size must be in [1, 2^31), got " << page_size;
  check_int32_vector(append_key, batch_indices, "batch_indices");
  check_size(batch_indices, "batch_indices", 0, nnz);
  check_int32_vector(append_key, positions, "positions");
  check_size(positions, "positions", 0, nnz);
  check_int32_vector(append_key, kv_indices, "kv_indices");
  check_int32_vector(append_key, kv_indptr, "kv_indptr");
  check_int32_vector(append_key, kv_last_page_len, "kv_last_page_len");
  check_size(kv_indptr, "kv_indptr", 0, kv_last_page_len.size(0) + 1);
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(append_key.device().device_id);
  cudaStream_t stream = get_stream(append_key.device());
  // 3. Dispatch on the element width (a copy) or the two dtypes (a cast) and launch.
  auto launch = [&](auto u, auto uc) {
    using U = decltype(u);
    using UC = decltype(uc);
    flashinfer::page::AppendArgs<U, UC> a;
    a.key = data_ptr<U>(append_key);
    a.value = data_ptr<U>(append_value);
    a.key_stride_n = stride(append_key, 0), a.key_stride_h = stride(append_key, 1);
    a.value_stride_n = stride(append_value, 0), a.value_stride_h = stride(append_value, 1);
    a.k_cache = k.data<UC>();
    a.v_cache = v.data<UC>();
    a.k_stride_page = k.stride(0);
    a.k_stride_slot = k.stride(slot_dim);
    a.k_stride_head = k.stride(head_dim_of_cache);
    a.v_stride_page = v.stride(0);
    a.v_stride_slot = v.stride(slot_dim);
    a.v_stride_head = v.stride(head_dim_of_cache);
    a.batch_indices = data_ptr<int32_t>(batch_indices);
    a.positions = data_ptr<int32_t>(positions);
    a.kv_indices = data_ptr<int32_t>(kv_indices);
    a.kv_indptr = data_ptr<int32_t>(kv_indptr);
    a.num_indices = kv_indices.size(0);
    a.num_pages = k.size(0);
    a.nnz = nnz;
    a.num_heads = heads;
    a.head_dim = dim;
    a.page_size = page_size;
    a.batch_size = kv_last_page_len.size(0);
    check_launch(flashinfer::page::AppendPagedKVCache(a, enable_pdl, stream),
                 "append_paged_kv_cache");
  };
  if (is_half(append_key.dtype()) && is_fp8(k_cache.dtype())) {
    dispatch_cast(append_key.dtype(), k_cache.dtype(), launch);
  } else {
    dispatch_element_width(append_key.dtype(), [&](auto u) { launch(u, u); });
  }
}
// [append_paged_kv_cache_binding.end]

/// batch_indices/positions (nnz,) int32 from append_indptr (B+1,) and seq_lens (B,), int32.
/// zero_unused: entries outside every request also get position 0 (else left as they are).
void get_batch_indices_positions(TensorView batch_indices, TensorView positions,
                                 TensorView append_indptr, TensorView seq_lens, bool zero_unused,
                                 bool enable_pdl) {
  // 1. Validate inputs.
  check_cuda(append_indptr, "append_indptr");
  for (const auto& [t, name] :
       {std::pair{append_indptr, "append_indptr"}, std::pair{seq_lens, "seq_lens"},
        std::pair{batch_indices, "batch_indices"}, std::pair{positions, "positions"}}) {
    check_same_device(append_indptr, "append_indptr", t, name);
    TVM_FFI_CHECK(is_dtype(t.dtype(), kDLInt, 32), TypeError)
        << name << " must be int32, got " << dtype_name(t.dtype());
    check_ndim(t, name, 1);
    check_contiguous(t, name);
  }
  TVM_FFI_CHECK(append_indptr.size(0) >= 1, ValueError)
      << "append_indptr must have batch_size + 1 >= 1 entries, got shape "
      << shape_str(append_indptr);
  check_size(seq_lens, "seq_lens", 0, append_indptr.size(0) - 1);
  check_size(positions, "positions", 0, batch_indices.size(0));
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(append_indptr.device().device_id);
  cudaStream_t stream = get_stream(append_indptr.device());
  // 3. Launch.
  check_launch(flashinfer::page::GetBatchIndicesPositions(
                   data_ptr<int32_t>(append_indptr), data_ptr<int32_t>(seq_lens),
                   append_indptr.size(0) - 1, batch_indices.size(0),
                   data_ptr<int32_t>(batch_indices), data_ptr<int32_t>(positions), zero_unused,
                   enable_pdl, stream),
               "get_batch_indices_positions");
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(append_paged_kv_cache, append_paged_kv_cache);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(get_batch_indices_positions, get_batch_indices_positions);

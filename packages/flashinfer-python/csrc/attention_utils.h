// Argument checks and AttentionParams filling shared by the attention bindings (attention.cu,
// decode.cu). Every user-facing problem raises ValueError / TypeError naming the argument, what
// was expected and what was received.
#pragma once
#include <flashinfer/attention/params.cuh>

#include <cmath>

#include "tvm_ffi_utils.h"

namespace flashinfer {
namespace ffi_utils {

using attn::AttentionParams;
using tvm::ffi::Optional;

/// 0 = float16, 1 = bfloat16 (the FI_DTYPE_* codes).
template <typename T>
constexpr int dtype_code() {
  return std::is_same_v<T, __half> ? 0 : 1;
}

inline bool dtype_has_code(DLDataType dt, int code) {
  return code == 0 ? is_dtype(dt, kDLFloat, 16) : is_dtype(dt, kDLBfloat, 16);
}

inline const char* dtype_code_name(int code) { return code == 0 ? "float16" : "bfloat16"; }

/// K and V of one layer: base pointers and (page, token, head) strides in elements.
struct KVView {
  const void* k;
  const void* v;
  int64_t k_stride_page, k_stride_n, k_stride_h;
  int64_t v_stride_page, v_stride_n, v_stride_h;
  int64_t num_heads, page_size, head_dim;
};

/// cp.async moves 16-byte chunks: base and every stride of a row must be 16-byte multiples.
inline void check_vector_rows(const TensorView& t, const char* name) {
  TVM_FFI_CHECK(is_aligned(data_ptr(t), 16), ValueError)
      << name << " must start at a 16-byte aligned address";
  for (int i = 0; i + 1 < t.ndim(); ++i) {
    TVM_FFI_CHECK((t.stride(i) * 2) % 16 == 0 || t.size(i) == 1, ValueError)
        << name << ".stride(" << i << ") must be a multiple of 8 elements (16 bytes), got "
        << t.stride(i);
  }
}

inline void check_tensor(const TensorView& t, const char* name, const TensorView& q, int ndim,
                         int code) {
  check_same_device(q, "q", t, name);
  check_ndim(t, name, ndim);
  TVM_FFI_CHECK(dtype_has_code(t.dtype(), code), TypeError)
      << name << " must be " << dtype_code_name(code) << " for this module, got "
      << dtype_name(t.dtype());
  check_last_dim_contiguous(t, name);
  check_vector_rows(t, name);
}

/// q (rows, Hq, D); o like q with the output dtype; lse (rows, Hq) float32; k, v ragged
/// (N, Hkv, D) NHD / (Hkv, N, D) HND, or paged (P, page, Hkv, D) NHD / (P, Hkv, page, D) HND.
inline KVView check_attention_inputs(const TensorView& q, const TensorView& k,
                                     const TensorView& v, const TensorView& o,
                                     const Optional<TensorView>& lse, int64_t kv_layout,
                                     bool paged, int64_t head_dim, int q_code, int o_code) {
  check_cuda(q, "q");
  check_tensor(q, "q", q, 3, q_code);
  check_size(q, "q", 2, head_dim);
  check_tensor(o, "o", q, 3, o_code);
  for (int d = 0; d < 3; ++d) check_size(o, "o", d, q.size(d));
  if (lse.has_value()) {
    check_same_device(q, "q", *lse, "lse");
    check_ndim(*lse, "lse", 2);
    check_size(*lse, "lse", 0, q.size(0));
    check_size(*lse, "lse", 1, q.size(1));
    check_contiguous(*lse, "lse");
    TVM_FFI_CHECK(is_dtype(lse.value().dtype(), kDLFloat, 32), TypeError)
        << "lse must be float32, got " << dtype_name(lse.value().dtype());
  }
  TVM_FFI_CHECK(kv_layout == 0 || kv_layout == 1, ValueError)
      << "kv_layout must be 0 (NHD) or 1 (HND), got " << kv_layout;
  const int ndim = paged ? 4 : 3;
  check_tensor(k, "k", q, ndim, q_code);
  check_tensor(v, "v", q, ndim, q_code);
  for (int d = 0; d < ndim; ++d) check_size(v, "v", d, k.size(d));
  check_size(k, "k", ndim - 1, head_dim);
  KVView kv;
  kv.k = data_ptr(k);
  kv.v = data_ptr(v);
  kv.head_dim = head_dim;
  const int first = paged ? 1 : 0;  // the dim after the page dim
  const bool hnd = kv_layout == 1;
  kv.num_heads = k.size(first + (hnd ? 0 : 1));
  kv.page_size = paged ? k.size(first + (hnd ? 1 : 0)) : 1;
  kv.k_stride_page = paged ? k.stride(0) : 0;
  kv.v_stride_page = paged ? v.stride(0) : 0;
  kv.k_stride_n = k.stride(first + (hnd ? 1 : 0));
  kv.k_stride_h = k.stride(first + (hnd ? 0 : 1));
  kv.v_stride_n = v.stride(first + (hnd ? 1 : 0));
  kv.v_stride_h = v.stride(first + (hnd ? 0 : 1));
  // The kernel multiplies row indices by these strides in 32 x 32 -> 64-bit products.
  for (int64_t stride : {kv.k_stride_page, kv.k_stride_n, kv.k_stride_h, kv.v_stride_page,
                         kv.v_stride_n, kv.v_stride_h}) {
    TVM_FFI_CHECK(stride < (int64_t{1} << 31), ValueError)
        << "k and v strides must be below 2^31 elements, got " << stride;
  }
  TVM_FFI_CHECK(kv.num_heads > 0 && q.size(1) % kv.num_heads == 0, ValueError)
      << "the number of q heads (" << q.size(1) << ") must be a multiple of the number of kv "
      << "heads (" << kv.num_heads << ")";
  return kv;
}

inline void fill_tensor_params(AttentionParams& p, const TensorView& q, const TensorView& o,
                               const Optional<TensorView>& lse, const KVView& kv) {
  p.q = data_ptr(q);
  p.q_stride_n = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.o = data_ptr(o);
  p.o_stride_n = o.stride(0);
  p.o_stride_h = o.stride(1);
  p.lse = lse.has_value() ? data_ptr<float>(*lse) : nullptr;
  p.k = kv.k;
  p.v = kv.v;
  p.k_stride_page = kv.k_stride_page;
  p.k_stride_n = kv.k_stride_n;
  p.k_stride_h = kv.k_stride_h;
  p.v_stride_page = kv.v_stride_page;
  p.v_stride_n = kv.v_stride_n;
  p.v_stride_h = kv.v_stride_h;
  p.page_size = flashinfer::FastDiv(static_cast<uint32_t>(kv.page_size));
  p.num_qo_heads = static_cast<int32_t>(q.size(1));
  p.num_kv_heads = static_cast<int32_t>(kv.num_heads);
  p.group_size = p.num_qo_heads / p.num_kv_heads;
}

inline void check_int32_vector(const TensorView& t, const char* name, const TensorView& q) {
  check_same_device(q, "q", t, name);
  check_ndim(t, name, 1);
  check_contiguous(t, name);
  TVM_FFI_CHECK(is_dtype(t.dtype(), kDLInt, 32), TypeError)
      << name << " must be int32, got " << dtype_name(t.dtype());
}

inline void fill_batch_params(AttentionParams& p, const TensorView& q,
                              const TensorView& qo_indptr, const TensorView& kv_indptr,
                              const Optional<TensorView>& kv_indices,
                              const Optional<TensorView>& kv_last_page_len, bool paged) {
  check_int32_vector(qo_indptr, "qo_indptr", q);
  check_int32_vector(kv_indptr, "kv_indptr", q);
  check_size(kv_indptr, "kv_indptr", 0, qo_indptr.size(0));
  p.qo_indptr = data_ptr<int32_t>(qo_indptr);
  p.kv_indptr = data_ptr<int32_t>(kv_indptr);
  if (paged) {
    TVM_FFI_CHECK(kv_indices.has_value() && kv_last_page_len.has_value(), ValueError)
        << "a paged KV cache needs kv_indices and kv_last_page_len";
    check_int32_vector(*kv_indices, "kv_indices", q);
    check_int32_vector(*kv_last_page_len, "kv_last_page_len", q);
    check_size(*kv_last_page_len, "kv_last_page_len", 0, qo_indptr.size(0) - 1);
    p.kv_indices = data_ptr<int32_t>(*kv_indices);
    p.kv_last_page_len = data_ptr<int32_t>(*kv_last_page_len);
  }
}

/// The plan buffer (int32, on the device): [num_items, kv_chunk_size, 0, 0,
/// request_idx[cap], qo_tile_idx[cap], kv_chunk_idx[cap], merge_indptr[rows + 1]].
inline void fill_plan_params(AttentionParams& p, const TensorView& q, const TensorView& plan,
                             int64_t item_capacity, bool split_kv,
                             const Optional<TensorView>& o_part,
                             const Optional<TensorView>& lse_part, int64_t num_rows,
                             int64_t head_dim) {
  check_int32_vector(plan, "plan", q);
  TVM_FFI_CHECK(item_capacity > 0 && plan.size(0) >= 4 + 8 * item_capacity, ValueError)
      << "plan must hold 4 + 8 * item_capacity (" << item_capacity << ") ints, got "
      << plan.size(0);
  const int32_t* base = data_ptr<int32_t>(plan);
  p.num_items = base;
  p.kv_chunk_size = base + 1;
  p.request_idx = base + 4;
  p.qo_tile_idx = base + 4 + item_capacity;
  p.kv_chunk_idx = base + 4 + 2 * item_capacity;
  p.merge_slot = base + 4 + 3 * item_capacity;
  p.item_qo_begin = base + 4 + 4 * item_capacity;
  p.item_qo_len = base + 4 + 5 * item_capacity;
  p.item_kv_begin = base + 4 + 6 * item_capacity;
  p.item_kv_len = base + 4 + 7 * item_capacity;
  p.split_kv = split_kv;
  if (split_kv) {
    TVM_FFI_CHECK(plan.size(0) >= 4 + 8 * item_capacity + num_rows + 1, ValueError)
        << "a split-KV plan must hold merge_indptr of " << num_rows + 1 << " ints";
    TVM_FFI_CHECK(o_part.has_value() && lse_part.has_value(), ValueError)
        << "a split-KV plan needs o_part and lse_part";
    for (const TensorView* t : {&*o_part, &*lse_part}) {
      check_same_device(q, "q", *t, "o_part");
      check_contiguous(*t, "o_part");
      TVM_FFI_CHECK(is_dtype(t->dtype(), kDLFloat, 32), TypeError)
          << "o_part and lse_part must be float32, got " << dtype_name(t->dtype());
    }
    TVM_FFI_CHECK(o_part.value().numel() >= lse_part.value().numel() * head_dim, ValueError)
        << "o_part must hold head_dim floats per lse_part entry";
    p.merge_indptr = base + 4 + 8 * item_capacity;
    p.o_part = data_ptr<float>(*o_part);
    p.lse_part = data_ptr<float>(*lse_part);
  }
}

/// The split-KV merge counters (int32, item_capacity x num_kv_heads, all 0): with them the
/// kernel merges its own partial states (merge_if_last) and no merge kernel is launched.
inline void fill_merge_counters(AttentionParams& p, const TensorView& q,
                                const TensorView& counters, int64_t item_capacity) {
  check_int32_vector(counters, "merge_counters", q);
  TVM_FFI_CHECK(counters.size(0) >= item_capacity * p.num_kv_heads, ValueError)
      << "merge_counters must hold item_capacity x num_kv_heads (" << item_capacity << " x "
      << p.num_kv_heads << ") ints, got " << counters.size(0);
  p.merge_counters = data_ptr<int32_t>(counters);
}

inline void fill_mask_params(AttentionParams& p, const TensorView& q,
                             const TensorView& custom_mask, const TensorView& mask_indptr) {
  check_same_device(q, "q", custom_mask, "custom_mask");
  check_ndim(custom_mask, "custom_mask", 1);
  TVM_FFI_CHECK(is_dtype(custom_mask.dtype(), kDLUInt, 8), TypeError)
      << "custom_mask must be the packed uint8 mask, got " << dtype_name(custom_mask.dtype());
  check_int32_vector(mask_indptr, "mask_indptr", q);
  p.custom_mask = data_ptr<uint8_t>(custom_mask);
  p.mask_indptr = data_ptr<int32_t>(mask_indptr);
}

inline void fill_alibi_params(AttentionParams& p, const TensorView& q, const TensorView& slopes) {
  check_same_device(q, "q", slopes, "alibi_slopes");
  check_ndim(slopes, "alibi_slopes", 1);
  check_size(slopes, "alibi_slopes", 0, q.size(1));
  TVM_FFI_CHECK(is_dtype(slopes.dtype(), kDLFloat, 32), TypeError)
      << "alibi_slopes must be float32, got " << dtype_name(slopes.dtype());
  p.alibi_slopes = data_ptr<float>(slopes);
}

inline void fill_scalar_params(AttentionParams& p, double sm_scale, double logits_soft_cap,
                               double o_scale, double rope_scale, double rope_theta,
                               int64_t window_left) {
  constexpr double kLog2e = 1.4426950408889634;
  TVM_FFI_CHECK(sm_scale > 0, ValueError) << "sm_scale must be positive, got " << sm_scale;
  TVM_FFI_CHECK(logits_soft_cap >= 0, ValueError)
      << "logits_soft_cap must be >= 0 (0 = off), got " << logits_soft_cap;
  TVM_FFI_CHECK(rope_scale > 0 && rope_theta > 0, ValueError)
      << "rope_scale and rope_theta must be positive, got " << rope_scale << ", " << rope_theta;
  p.sm_scale_log2 = static_cast<float>(sm_scale * kLog2e);
  p.softcap_pre = logits_soft_cap > 0 ? static_cast<float>(sm_scale / logits_soft_cap) : 0.f;
  p.softcap_post = logits_soft_cap > 0 ? static_cast<float>(logits_soft_cap * kLog2e) : 0.f;
  p.o_scale = static_cast<float>(o_scale);
  p.rope_rcp_scale = static_cast<float>(1.0 / rope_scale);
  p.rope_log2_theta = static_cast<float>(std::log2(rope_theta));
  p.window_left = window_left < 0 ? -1 : static_cast<int32_t>(window_left);
}

}  // namespace ffi_utils
}  // namespace flashinfer

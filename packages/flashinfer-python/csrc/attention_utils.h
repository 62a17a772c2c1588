// Argument checks and AttentionParams filling of the attention binding (attention.cu): the
// tensors of a call, and the run-time parameter record. Every user-facing problem raises
// ValueError / TypeError naming the argument, what was expected and what was received.
#pragma once
#include <cuda_fp8.h>
#include <flashinfer/attention/params.cuh>

#include <cmath>
#include <cstring>

#include "tvm_ffi_utils.h"

namespace flashinfer {
namespace ffi_utils {

using attn::AttentionParams;
using tvm::ffi::Optional;

/// 0 = float16, 1 = bfloat16, 2 = float8_e4m3fn, 3 = float8_e5m2 (the FI_DTYPE_* codes; fp8
/// for k and v only).
template <typename T>
constexpr int dtype_code() {
  if constexpr (std::is_same_v<T, __half>) return 0;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return 1;
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) return 2;
  return 3;
}

inline bool dtype_has_code(DLDataType dt, int code) {
  switch (code) {
    case 0: return is_dtype(dt, kDLFloat, 16);
    case 1: return is_dtype(dt, kDLBfloat, 16);
    case 2: return is_dtype(dt, kDLFloat8_e4m3fn, 8);
    default: return is_dtype(dt, kDLFloat8_e5m2, 8);
  }
}

inline const char* dtype_code_name(int code) {
  static const char* const names[] = {"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"};
  return names[code];
}

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
  const int64_t bytes = t.dtype().bits / 8, elems = 16 / bytes;
  for (int i = 0; i + 1 < t.ndim(); ++i) {
    TVM_FFI_CHECK((t.stride(i) * bytes) % 16 == 0 || t.size(i) == 1, ValueError)
        << name << ".stride(" << i << ") must be a multiple of " << elems
        << " elements (16 bytes), got " << t.stride(i);
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

/// q (rows, Hq, D); o (rows, Hq, Dvo) with the output dtype; lse (rows, Hq) float32; k, v (the
/// kv dtype) ragged (N, Hkv, D) NHD / (Hkv, N, D) HND, or paged (P, page, Hkv, D) NHD /
/// (P, Hkv, page, D) HND; v like k with Dvo.
inline KVView check_attention_inputs(const TensorView& q, const TensorView& k,
                                     const TensorView& v, const TensorView& o,
                                     const Optional<TensorView>& lse, int64_t kv_layout,
                                     bool paged, int64_t head_dim, int64_t head_dim_vo,
                                     int q_code, int kv_code, int o_code) {
  check_cuda(q, "q");
  check_tensor(q, "q", q, 3, q_code);
  check_size(q, "q", 2, head_dim);
  check_tensor(o, "o", q, 3, o_code);
  for (int d = 0; d < 2; ++d) check_size(o, "o", d, q.size(d));
  check_size(o, "o", 2, head_dim_vo);
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
  check_tensor(k, "k", q, ndim, kv_code);
  check_tensor(v, "v", q, ndim, kv_code);
  for (int d = 0; d + 1 < ndim; ++d) check_size(v, "v", d, k.size(d));
  check_size(k, "k", ndim - 1, head_dim);
  check_size(v, "v", ndim - 1, head_dim_vo);
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
  p.group_div = flashinfer::FastDiv(static_cast<uint32_t>(p.group_size));
}

/// The run-time parameter record: one int64 host tensor, device addresses as integers and
/// floats as their float64 bits. Its layout is stated here and in flashinfer/attention/runtime.py
/// (RUN_PARAMS, the same names in snake case); the version and the length are checked on every
/// call, and tests/test_attention_layout.py holds the two lists together.
enum RunParam : int {
  kVersion,
  kLength,
  kDeviceId,
  kCta,
  kGridX,
  kKvLayout,
  kQoIndptr,
  kKvIndptr,
  kKvIndices,
  kKvLastPageLen,
  kPlan,
  kItemCapacity,
  kSplitKv,
  kClusterMerge,
  kSm90TmaQ,
  kOPart,
  kLsePart,
  kNumRows,
  kMergeCounters,
  kCustomMask,
  kMaskIndptr,
  kAlibiSlopes,
  kSinks,
  kSmScale,
  kLogitsSoftCap,
  kOScale,
  kRopeScale,
  kRopeTheta,
  kWindowLeft,
  kEnablePdl,
  kNumRunParams
};
inline constexpr int64_t kRunParamsVersion = 2;

/// Read access to a checked record.
struct RunRecord {
  const int64_t* r;
  int64_t operator[](RunParam k) const { return r[k]; }
  double real(RunParam k) const {
    double d;
    std::memcpy(&d, &r[k], sizeof(d));
    return d;
  }
  template <typename T>
  T* ptr(RunParam k) const {
    return reinterpret_cast<T*>(static_cast<uintptr_t>(r[k]));
  }
};

/// `params` is a record of this layout's version and length, for q's device.
inline RunRecord check_run_params(const TensorView& params, const TensorView& q) {
  TVM_FFI_CHECK(params.device().device_type == kDLCPU, ValueError)
      << "params must be a host (CPU) tensor, got device type " << params.device().device_type;
  check_ndim(params, "params", 1);
  check_contiguous(params, "params");
  TVM_FFI_CHECK(is_dtype(params.dtype(), kDLInt, 64), TypeError)
      << "params must be int64, got " << dtype_name(params.dtype());
  TVM_FFI_CHECK(params.size(0) == kNumRunParams, ValueError)
      << "params must hold " << int(kNumRunParams) << " entries (version " << kRunParamsVersion
      << "), got " << params.size(0);
  const RunRecord rec{data_ptr<int64_t>(params)};
  TVM_FFI_CHECK(rec[kVersion] == kRunParamsVersion && rec[kLength] == kNumRunParams, ValueError)
      << "params is a record of version " << rec[kVersion] << " and length " << rec[kLength]
      << "; this module takes version " << kRunParamsVersion << ", length " << int(kNumRunParams);
  TVM_FFI_CHECK(rec[kDeviceId] == q.device().device_id, ValueError)
      << "params were made for device " << rec[kDeviceId] << ", q is on device "
      << q.device().device_id;
  return rec;
}

/// The plan and batch metadata of a record (device addresses that plan() checked and keeps
/// alive): the plan buffer (int32 on the device) is [num_items, kv_chunk_size, the Hopper
/// kernel's two work counters (0 as uploaded, and again after each launch),
/// request_idx[cap], qo_tile_idx[cap], kv_chunk_idx[cap], merge_slot[cap], qo_begin[cap],
/// qo_len[cap], kv_begin[cap], kv_len[cap], merge_indptr[rows + 1] (split KV)].
inline void fill_record_params(AttentionParams& p, const RunRecord& rec, bool paged) {
  auto need = [&](RunParam k, const char* name) {
    TVM_FFI_CHECK(rec[k] != 0, ValueError) << "params." << name << " is missing";
  };
  need(kQoIndptr, "qo_indptr");
  need(kKvIndptr, "kv_indptr");
  need(kPlan, "plan");
  p.qo_indptr = rec.ptr<const int32_t>(kQoIndptr);
  p.kv_indptr = rec.ptr<const int32_t>(kKvIndptr);
  if (paged) {
    need(kKvIndices, "kv_indices");
    need(kKvLastPageLen, "kv_last_page_len");
    p.kv_indices = rec.ptr<const int32_t>(kKvIndices);
    p.kv_last_page_len = rec.ptr<const int32_t>(kKvLastPageLen);
  }
  const int64_t cap = rec[kItemCapacity];
  TVM_FFI_CHECK(cap > 0, ValueError) << "params.item_capacity must be positive, got " << cap;
  int32_t* base = rec.ptr<int32_t>(kPlan);
  p.num_items = base;
  p.kv_chunk_size = base + 1;
  p.work_counters = base + 2;
  p.request_idx = base + 4;
  p.qo_tile_idx = base + 4 + cap;
  p.kv_chunk_idx = base + 4 + 2 * cap;
  p.merge_slot = base + 4 + 3 * cap;
  p.item_qo_begin = base + 4 + 4 * cap;
  p.item_qo_len = base + 4 + 5 * cap;
  p.item_kv_begin = base + 4 + 6 * cap;
  p.item_kv_len = base + 4 + 7 * cap;
  p.split_kv = rec[kSplitKv] != 0;
  if (p.split_kv) {
    need(kOPart, "o_part");
    need(kLsePart, "lse_part");
    p.merge_indptr = base + 4 + 8 * cap;
    p.o_part = rec.ptr<float>(kOPart);
    p.lse_part = rec.ptr<float>(kLsePart);
    p.merge_counters = rec.ptr<int32_t>(kMergeCounters);  // null: the merge kernel merges
  }
  p.custom_mask = rec.ptr<const uint8_t>(kCustomMask);
  p.mask_indptr = rec.ptr<const int32_t>(kMaskIndptr);
  p.alibi_slopes = rec.ptr<const float>(kAlibiSlopes);
  p.sinks = rec.ptr<const float>(kSinks);  // [Hq] float32 or null (checked by the wrapper)
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

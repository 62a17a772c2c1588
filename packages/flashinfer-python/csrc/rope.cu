// TVM-FFI binding of flashinfer::rope (include/flashinfer/rope.cuh). Three entry points, one
// per position source; the public Python functions (in place or not, Llama-3.1 or not) map onto
// them. In place means q_out is q and k_out is k.
#include <flashinfer/rope.cuh>


#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;
using flashinfer::rope::FreqConfig;
using flashinfer::rope::kMaxRotaryDim;
using flashinfer::rope::PosMode;
using flashinfer::rope::RopeArgs;

namespace {

/// Checks shared by every entry point: q (nnz, Hq, D), k (nnz, Hk, D), outputs like them.
void check_qk(const TensorView& q, const TensorView& k, const TensorView& q_out,
              const TensorView& k_out, int64_t rotary_dim) {
  check_cuda(q, "q");
  check_same_device(q, "q", k, "k");
  check_same_device(q, "q", q_out, "q_out");
  check_same_device(q, "q", k_out, "k_out");
  check_ndim(q, "q", 3);
  check_ndim(k, "k", 3);
  check_ndim(q_out, "q_out", 3);
  check_ndim(k_out, "k_out", 3);
  check_same_dtype(q, "q", k, "k");
  check_same_dtype(q, "q", q_out, "q_out");
  check_same_dtype(q, "q", k_out, "k_out");
  check_size(k, "k", 0, q.size(0));
  check_size(k, "k", 2, q.size(2));
  for (int d = 0; d < 3; ++d) {
    check_size(q_out, "q_out", d, q.size(d));
    check_size(k_out, "k_out", d, k.size(d));
  }
  check_last_dim_contiguous(q, "q");
  check_last_dim_contiguous(k, "k");
  check_last_dim_contiguous(q_out, "q_out");
  check_last_dim_contiguous(k_out, "k_out");
  const int64_t head_dim = q.size(2);
  TVM_FFI_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim, ValueError)
      << "rotary_dim must be even and in (0, head_dim=" << head_dim << "], got " << rotary_dim;
  TVM_FFI_CHECK(rotary_dim <= kMaxRotaryDim, ValueError)
      << "rotary_dim must be at most " << kMaxRotaryDim << ", got " << rotary_dim;
  TVM_FFI_CHECK(q.size(1) <= INT32_MAX && k.size(1) <= INT32_MAX, ValueError)
      << "the number of heads must fit in int32, got " << q.size(1) << " and " << k.size(1);
}

void check_index(const TensorView& t, const char* name, const TensorView& q, int64_t size) {
  check_same_device(q, "q", t, name);
  check_ndim(t, name, 1);
  check_size(t, name, 0, size);
  check_contiguous(t, name);
}

template <typename T, typename IdType>
RopeArgs<T, IdType> make_args(const TensorView& q, const TensorView& k, const TensorView& q_out,
                              const TensorView& k_out, int64_t rotary_dim, bool interleave) {
  RopeArgs<T, IdType> a;
  a.q = data_ptr<T>(q);
  a.k = data_ptr<T>(k);
  a.q_out = data_ptr<T>(q_out);
  a.k_out = data_ptr<T>(k_out);
  a.nnz = q.size(0);
  a.num_q_heads = q.size(1);
  a.num_k_heads = k.size(1);
  a.head_dim = q.size(2);
  a.rotary_dim = rotary_dim;
  a.q_stride_n = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.k_stride_n = k.stride(0);
  a.k_stride_h = k.stride(1);
  a.q_out_stride_n = q_out.stride(0);
  a.q_out_stride_h = q_out.stride(1);
  a.k_out_stride_n = k_out.stride(0);
  a.k_out_stride_h = k_out.stride(1);
  a.interleave = interleave;
  return a;
}

FreqConfig make_freq(double rope_scale, double rope_theta, bool llama31, double low_freq_factor,
                     double high_freq_factor, double old_context_len) {
  TVM_FFI_CHECK(rope_scale != 0.0, ValueError) << "rope_scale must be nonzero, got 0";
  TVM_FFI_CHECK(rope_theta > 0.0, ValueError) << "rope_theta must be positive, got " << rope_theta;
  FreqConfig f;
  f.rope_scale = rope_scale;
  f.rope_theta = rope_theta;
  f.llama31 = llama31;
  f.low_freq_factor = low_freq_factor;
  f.high_freq_factor = high_freq_factor;
  f.old_context_len = old_context_len;
  return f;
}

}  // namespace

// [rope_binding.begin]
void apply_rope_pos_ids(TensorView q, TensorView k, TensorView q_out, TensorView k_out,
                        TensorView pos_ids, int64_t rotary_dim, bool interleave, double rope_scale,
                        double rope_theta, bool llama31, double low_freq_factor,
                        double high_freq_factor, double old_context_len, bool enable_pdl) {
  // 1. Validate inputs.
  check_qk(q, k, q_out, k_out, rotary_dim);
  check_index(pos_ids, "pos_ids", q, q.size(0));
  const FreqConfig freq = make_freq(rope_scale, rope_theta, llama31, low_freq_factor,
                                    high_freq_factor, old_context_len);
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(q.device().device_id);
  cudaStream_t stream = get_stream(q.device());
  // 3. Dispatch on dtypes and launch.
  dispatch_half_types(q.dtype(), "q", [&](auto t) {
    using T = decltype(t);
    dispatch_index_types(pos_ids.dtype(), "pos_ids", [&](auto i) {
      using IdType = decltype(i);
      auto a = make_args<T, IdType>(q, k, q_out, k_out, rotary_dim, interleave);
      a.mode = PosMode::kPosIds;
      a.pos_ids = data_ptr<IdType>(pos_ids);
      a.freq = freq;
      check_launch(flashinfer::rope::ApplyRope(a, enable_pdl, stream), "apply_rope_pos_ids");
    });
  });
}
// [rope_binding.end]

void apply_rope_indptr(TensorView q, TensorView k, TensorView q_out, TensorView k_out,
                       TensorView indptr, TensorView offsets, int64_t rotary_dim, bool interleave,
                       double rope_scale, double rope_theta, bool llama31, double low_freq_factor,
                       double high_freq_factor, double old_context_len, bool enable_pdl) {
  // 1. Validate inputs.
  check_qk(q, k, q_out, k_out, rotary_dim);
  check_ndim(indptr, "indptr", 1);
  TVM_FFI_CHECK(indptr.size(0) >= 1, ValueError)
      << "indptr must have batch_size + 1 >= 1 entries, got shape " << shape_str(indptr);
  const int64_t batch_size = indptr.size(0) - 1;
  check_index(indptr, "indptr", q, batch_size + 1);
  check_index(offsets, "offsets", q, batch_size);
  check_same_dtype(indptr, "indptr", offsets, "offsets");
  const FreqConfig freq = make_freq(rope_scale, rope_theta, llama31, low_freq_factor,
                                    high_freq_factor, old_context_len);
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(q.device().device_id);
  cudaStream_t stream = get_stream(q.device());
  // 3. Dispatch on dtypes and launch.
  dispatch_half_types(q.dtype(), "q", [&](auto t) {
    using T = decltype(t);
    dispatch_index_types(indptr.dtype(), "indptr", [&](auto i) {
      using IdType = decltype(i);
      auto a = make_args<T, IdType>(q, k, q_out, k_out, rotary_dim, interleave);
      a.mode = PosMode::kIndptr;
      a.indptr = data_ptr<IdType>(indptr);
      a.offsets = data_ptr<IdType>(offsets);
      a.batch_size = batch_size;
      a.freq = freq;
      check_launch(flashinfer::rope::ApplyRope(a, enable_pdl, stream), "apply_rope");
    });
  });
}

void apply_rope_cos_sin_cache(TensorView q, TensorView k, TensorView q_out, TensorView k_out,
                              TensorView cos_sin_cache, TensorView pos_ids, bool interleave,
                              bool enable_pdl) {
  // 1. Validate inputs.
  check_same_device(q, "q", cos_sin_cache, "cos_sin_cache");
  check_ndim(cos_sin_cache, "cos_sin_cache", 2);
  TVM_FFI_CHECK(is_dtype(cos_sin_cache.dtype(), kDLFloat, 32), ValueError)
      << "cos_sin_cache should be float32, got " << dtype_name(cos_sin_cache.dtype());
  check_last_dim_contiguous(cos_sin_cache, "cos_sin_cache");
  const int64_t rotary_dim = cos_sin_cache.size(1);
  check_qk(q, k, q_out, k_out, rotary_dim);
  check_index(pos_ids, "pos_ids", q, q.size(0));
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(q.device().device_id);
  cudaStream_t stream = get_stream(q.device());
  // 3. Dispatch on dtypes and launch.
  dispatch_half_types(q.dtype(), "q", [&](auto t) {
    using T = decltype(t);
    dispatch_index_types(pos_ids.dtype(), "positions", [&](auto i) {
      using IdType = decltype(i);
      auto a = make_args<T, IdType>(q, k, q_out, k_out, rotary_dim, interleave);
      a.mode = PosMode::kCosSinCache;
      a.pos_ids = data_ptr<IdType>(pos_ids);
      a.cos_sin_cache = data_ptr<float>(cos_sin_cache);
      a.cache_stride = cos_sin_cache.size(0) <= 1 ? 0 : cos_sin_cache.stride(0);
      a.max_pos = cos_sin_cache.size(0);
      check_launch(flashinfer::rope::ApplyRope(a, enable_pdl, stream),
                   "apply_rope_with_cos_sin_cache");
    });
  });
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(apply_rope_pos_ids, apply_rope_pos_ids);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(apply_rope_indptr, apply_rope_indptr);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(apply_rope_cos_sin_cache, apply_rope_cos_sin_cache);

// TVM-FFI bindings of flashinfer::cascade (include/flashinfer/cascade.cuh): merge_state,
// merge_state_in_place, merge_states, and merge_states_varlen (the split-KV reduction the
// attention kernels launch from C++, exported here so it can be tested on its own).
// One translation unit for the family: each TU re-parses the TVM-FFI headers (~7 s).
#include <flashinfer/cascade.cuh>

#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;
using flashinfer::cascade::MergeStateArgs;
using flashinfer::cascade::MergeStatesArgs;
using tvm::ffi::Optional;

namespace {

// The kernels give each vector of a head row a thread of one block (see cascade.cuh); rows of
// up to 1024 elements always fit, whatever the alignment. 2^30 heads keep head indices 32-bit.
constexpr int64_t kMaxHeadDim = flashinfer::cascade::kMaxVectorsPerHead;
constexpr int64_t kMaxHeads = int64_t{1} << 30;

/// Stride of dim d, 0 for a size-1 dim: such a stride never addresses anything, and torch may
/// leave any value there, which would push a launch off the 16-byte path for nothing.
int64_t stride(const TensorView& t, int d) { return t.size(d) == 1 ? 0 : t.stride(d); }

void check_float32(const TensorView& t, const char* name) {
  TVM_FFI_CHECK(is_dtype(t.dtype(), kDLFloat, 32), TypeError)
      << name << " must be float32, got " << dtype_name(t.dtype());
}

/// v (L, H, D) with its last dim contiguous, within the kernel limits.
void check_v(const TensorView& v, const char* name) {
  check_ndim(v, name, 3);
  check_last_dim_contiguous(v, name);
  TVM_FFI_CHECK(v.size(2) <= kMaxHeadDim, ValueError)
      << name << ".shape[2] (head_dim) must be at most " << kMaxHeadDim << ", got "
      << shape_str(v);
  TVM_FFI_CHECK(v.size(1) < kMaxHeads, ValueError)
      << name << ".shape[1] (num_heads) must be below " << kMaxHeads << ", got " << shape_str(v);
}

/// `other` must be a tensor like `v` (shape, dtype, device), last dim contiguous.
void check_like_v(const TensorView& v, const char* v_name, const TensorView& other,
                  const char* name) {
  check_same_device(v, v_name, other, name);
  check_same_dtype(v, v_name, other, name);
  check_ndim(other, name, 3);
  for (int d = 0; d < 3; ++d) check_size(other, name, d, v.size(d));
  check_last_dim_contiguous(other, name);
}

/// s must be float32 (L, H) matching v (L, H, D), on v's device.
void check_s(const TensorView& v, const char* v_name, const TensorView& s, const char* name) {
  check_same_device(v, v_name, s, name);
  check_float32(s, name);
  check_ndim(s, name, 2);
  check_size(s, name, 0, v.size(0));
  check_size(s, name, 1, v.size(1));
}

template <typename T>
MergeStateArgs<T> two_args(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                           const TensorView& s_b, const TensorView& v_out,
                           const TensorView& s_out) {
  MergeStateArgs<T> a;
  a.v_a = data_ptr<T>(v_a);
  a.s_a = data_ptr<float>(s_a);
  a.v_b = data_ptr<T>(v_b);
  a.s_b = data_ptr<float>(s_b);
  a.v_out = data_ptr<T>(v_out);
  a.s_out = data_ptr<float>(s_out);
  a.seq_len = v_a.size(0);
  a.num_heads = v_a.size(1);
  a.head_dim = v_a.size(2);
  a.va_stride_n = stride(v_a, 0), a.va_stride_h = stride(v_a, 1);
  a.vb_stride_n = stride(v_b, 0), a.vb_stride_h = stride(v_b, 1);
  a.vo_stride_n = stride(v_out, 0), a.vo_stride_h = stride(v_out, 1);
  a.sa_stride_n = stride(s_a, 0), a.sa_stride_h = stride(s_a, 1);
  a.sb_stride_n = stride(s_b, 0), a.sb_stride_h = stride(s_b, 1);
  a.so_stride_n = stride(s_out, 0), a.so_stride_h = stride(s_out, 1);
  return a;
}

}  // namespace

// [merge_state_binding.begin]
/// (v_out, s_out) = merge((v_a, s_a), (v_b, s_b)); v (L, H, D) half or float, s (L, H) float32.
void merge_state(TensorView v_out, TensorView s_out, TensorView v_a, TensorView s_a,
                 TensorView v_b, TensorView s_b, bool enable_pdl) {
  // 1. Validate inputs.
  check_cuda(v_a, "v_a");
  check_v(v_a, "v_a");
  check_like_v(v_a, "v_a", v_b, "v_b");
  check_like_v(v_a, "v_a", v_out, "v_out");
  check_s(v_a, "v_a", s_a, "s_a");
  check_s(v_a, "v_a", s_b, "s_b");
  check_s(v_a, "v_a", s_out, "s_out");
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(v_a.device().device_id);
  cudaStream_t stream = get_stream(v_a.device());
  // 3. Dispatch on dtype and launch.
  dispatch_float_types(v_a.dtype(), "v_a", [&](auto t) {
    using T = decltype(t);
    check_launch(flashinfer::cascade::MergeState<T>(two_args<T>(v_a, s_a, v_b, s_b, v_out, s_out),
                                                    enable_pdl, stream),
                 "merge_state");
  });
}
// [merge_state_binding.end]

/// (v, s) = merge((v, s), (v_other, s_other)) for the rows where mask (bool (L,)) is true.
void merge_state_in_place(TensorView v, TensorView s, TensorView v_other, TensorView s_other,
                          Optional<TensorView> mask, bool enable_pdl) {
  // 1. Validate inputs.
  check_cuda(v, "v");
  check_v(v, "v");
  check_like_v(v, "v", v_other, "v_other");
  check_s(v, "v", s, "s");
  check_s(v, "v", s_other, "s_other");
  const bool* mask_ptr = nullptr;
  if (mask.has_value()) {
    const TensorView& m = mask.value();
    check_same_device(v, "v", m, "mask");
    TVM_FFI_CHECK(is_dtype(m.dtype(), kDLBool, 8), TypeError)
        << "mask must be bool, got " << dtype_name(m.dtype());
    check_ndim(m, "mask", 1);
    check_size(m, "mask", 0, v.size(0));
    check_contiguous(m, "mask");
    mask_ptr = data_ptr<bool>(m);
  }
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(v.device().device_id);
  cudaStream_t stream = get_stream(v.device());
  // 3. Dispatch on dtype and launch.
  dispatch_float_types(v.dtype(), "v", [&](auto t) {
    using T = decltype(t);
    MergeStateArgs<T> a = two_args<T>(v, s, v_other, s_other, v, s);
    a.mask = mask_ptr;
    check_launch(flashinfer::cascade::MergeStateInPlace<T>(a, enable_pdl, stream),
                 "merge_state_in_place");
  });
}

/// (v_out, s_out)[l, h] = merge over i of (v, s)[l, i, h]; v (L, S, H, D), s (L, S, H) float32.
void merge_states(TensorView v_out, TensorView s_out, TensorView v, TensorView s,
                  bool enable_pdl) {
  // 1. Validate inputs.
  check_cuda(v, "v");
  check_ndim(v, "v", 4);
  check_last_dim_contiguous(v, "v");
  TVM_FFI_CHECK(v.size(3) <= kMaxHeadDim, ValueError)
      << "v.shape[3] (head_dim) must be at most " << kMaxHeadDim << ", got " << shape_str(v);
  TVM_FFI_CHECK(v.size(2) < kMaxHeads, ValueError)
      << "v.shape[2] (num_heads) must be below " << kMaxHeads << ", got " << shape_str(v);
  check_same_device(v, "v", s, "s");
  check_float32(s, "s");
  check_ndim(s, "s", 3);
  for (int d = 0; d < 3; ++d) check_size(s, "s", d, v.size(d));
  check_same_device(v, "v", v_out, "v_out");
  check_same_dtype(v, "v", v_out, "v_out");
  check_ndim(v_out, "v_out", 3);
  check_size(v_out, "v_out", 0, v.size(0));
  check_size(v_out, "v_out", 1, v.size(2));
  check_size(v_out, "v_out", 2, v.size(3));
  check_last_dim_contiguous(v_out, "v_out");
  check_s(v_out, "v_out", s_out, "s_out");
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(v.device().device_id);
  cudaStream_t stream = get_stream(v.device());
  // 3. Dispatch on dtype and launch.
  dispatch_float_types(v.dtype(), "v", [&](auto t) {
    using T = decltype(t);
    MergeStatesArgs<T, T> a;
    a.v = data_ptr<T>(v);
    a.s = data_ptr<float>(s);
    a.num_parts = v.size(1);
    a.v_out = data_ptr<T>(v_out);
    a.s_out = data_ptr<float>(s_out);
    a.num_rows = v.size(0);
    a.num_heads = v.size(2);
    a.head_dim = v.size(3);
    a.v_stride_row = stride(v, 0), a.v_stride_part = stride(v, 1), a.v_stride_h = stride(v, 2);
    a.s_stride_row = stride(s, 0), a.s_stride_part = stride(s, 1), a.s_stride_h = stride(s, 2);
    a.vo_stride_n = stride(v_out, 0), a.vo_stride_h = stride(v_out, 1);
    a.so_stride_n = stride(s_out, 0), a.so_stride_h = stride(s_out, 1);
    check_launch(flashinfer::cascade::MergeStates(a, enable_pdl, stream), "merge_states");
  });
}

/// v_out[r] (R, H, D) = merge of the float32 parts v_part[indptr[r]:indptr[r+1]] ([P, H, D],
/// contiguous) with lse_part ([P, H] float32); lse_out (R, H) float32 contiguous, optional.
void merge_states_varlen(TensorView v_out, Optional<TensorView> lse_out, TensorView v_part,
                         TensorView lse_part, TensorView indptr, bool enable_pdl) {
  // 1. Validate inputs.
  check_cuda(v_part, "v_part");
  check_float32(v_part, "v_part");
  check_ndim(v_part, "v_part", 3);
  check_contiguous(v_part, "v_part");
  const int64_t heads = v_part.size(1), head_dim = v_part.size(2);
  TVM_FFI_CHECK(head_dim <= kMaxHeadDim && heads < kMaxHeads, ValueError)
      << "v_part must have num_heads < " << kMaxHeads << " and head_dim <= " << kMaxHeadDim
      << ", got shape " << shape_str(v_part);
  check_same_device(v_part, "v_part", lse_part, "lse_part");
  check_float32(lse_part, "lse_part");
  check_ndim(lse_part, "lse_part", 2);
  check_size(lse_part, "lse_part", 0, v_part.size(0));
  check_size(lse_part, "lse_part", 1, heads);
  check_contiguous(lse_part, "lse_part");
  check_same_device(v_part, "v_part", indptr, "indptr");
  TVM_FFI_CHECK(is_dtype(indptr.dtype(), kDLInt, 32), TypeError)
      << "indptr must be int32, got " << dtype_name(indptr.dtype());
  check_ndim(indptr, "indptr", 1);
  check_contiguous(indptr, "indptr");
  check_same_device(v_part, "v_part", v_out, "v_out");
  check_ndim(v_out, "v_out", 3);
  check_size(v_out, "v_out", 0, indptr.size(0) - 1);
  check_size(v_out, "v_out", 1, heads);
  check_size(v_out, "v_out", 2, head_dim);
  check_last_dim_contiguous(v_out, "v_out");
  float* lse_ptr = nullptr;
  if (lse_out.has_value()) {
    const TensorView& l = lse_out.value();
    check_same_device(v_part, "v_part", l, "lse_out");
    check_float32(l, "lse_out");
    check_ndim(l, "lse_out", 2);
    check_size(l, "lse_out", 0, v_out.size(0));
    check_size(l, "lse_out", 1, heads);
    check_contiguous(l, "lse_out");
    lse_ptr = data_ptr<float>(l);
  }
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(v_part.device().device_id);
  cudaStream_t stream = get_stream(v_part.device());
  // 3. Dispatch on the output dtype and launch.
  dispatch_float_types(v_out.dtype(), "v_out", [&](auto t) {
    using T = decltype(t);
    check_launch(flashinfer::cascade::MergeStatesVarlen<T>(
                     data_ptr<float>(v_part), data_ptr<float>(lse_part), data_ptr<int32_t>(indptr),
                     data_ptr<T>(v_out), lse_ptr, v_out.size(0), heads, head_dim,
                     stride(v_out, 0), stride(v_out, 1), enable_pdl, stream),
                 "merge_states_varlen");
  });
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_state, merge_state);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_state_in_place, merge_state_in_place);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_states, merge_states);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_states_varlen, merge_states_varlen);

// TVM-FFI bindings of flashinfer::norm (include/flashinfer/norm.cuh): rmsnorm, gemma_rmsnorm,
// fused_add_rmsnorm, gemma_fused_add_rmsnorm, layernorm. One translation unit for the family:
// each TU re-parses the TVM-FFI headers (~7 s).
#include <flashinfer/norm.cuh>

#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;
using flashinfer::norm::RowStrides;

namespace {

// Column indices are int: a row of up to 2^31 - 2^16 elements keeps `col + block * N` in range.
constexpr int64_t kMaxHidden = (int64_t{1} << 31) - (int64_t{1} << 16);

/// Row strides of a 2-D (B, H) or 3-D (B, N, H) tensor whose last dim is contiguous. The stride
/// of a size-1 dim is never used to address anything, and may be any value (torch leaves odd
/// ones behind); the packed stride keeps such tensors on the 16-byte, division-free paths.
RowStrides row_strides(const TensorView& t) {
  const int64_t hidden = t.size(-1);
  if (t.ndim() == 2) return RowStrides{t.size(0) == 1 ? hidden : t.stride(0), 0};
  const int64_t inner = t.size(1) == 1 ? hidden : t.stride(1);
  return RowStrides{t.size(0) == 1 ? t.size(1) * inner : t.stride(0), inner};
}

void check_hidden(const TensorView& input) {
  TVM_FFI_CHECK(input.size(-1) <= kMaxHidden, ValueError)
      << "input.shape[-1] must be at most " << kMaxHidden << ", got " << input.size(-1);
}

/// weight (or gamma/beta) must be a contiguous (hidden,) vector on input's device.
void check_param_vector(const TensorView& input, const TensorView& v, const char* name) {
  check_same_device(input, "input", v, name);
  check_ndim(v, name, 1);
  check_size(v, name, 0, input.size(-1));
  check_contiguous(v, name);
}

/// `other` must have input's shape and dtype, on its device, last dim contiguous.
void check_like_input(const TensorView& input, const TensorView& other, const char* name) {
  check_same_device(input, "input", other, name);
  check_same_dtype(input, "input", other, name);
  check_ndim(other, name, input.ndim());
  for (int d = 0; d < input.ndim(); ++d) check_size(other, name, d, input.size(d));
  check_last_dim_contiguous(other, name);
}

void rmsnorm_impl(TensorView out, TensorView input, TensorView weight, double eps,
                  bool enable_pdl, float weight_offset, const char* op) {
  // 1. Validate inputs.
  check_cuda(input, "input");
  TVM_FFI_CHECK(input.ndim() == 2 || input.ndim() == 3, ValueError)
      << "input must be 2-D (batch, hidden) or 3-D (batch, heads, head_dim), got shape "
      << shape_str(input);
  check_last_dim_contiguous(input, "input");
  check_hidden(input);
  check_like_input(input, out, "out");
  check_param_vector(input, weight, "weight");
  check_same_dtype(input, "input", weight, "weight");
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(input.device().device_id);
  cudaStream_t stream = get_stream(input.device());
  // 3. Dispatch on dtype and launch.
  dispatch_float_types(input.dtype(), "input", [&](auto t) {
    using T = decltype(t);
    check_launch(flashinfer::norm::RMSNorm<T>(
                     data_ptr<T>(input), row_strides(input), data_ptr<T>(out), row_strides(out),
                     data_ptr<T>(weight), input.size(0), input.ndim() == 3 ? input.size(1) : 1,
                     static_cast<int>(input.size(-1)), static_cast<float>(eps), weight_offset,
                     enable_pdl, stream),
                 op);
  });
}

void fused_add_rmsnorm_impl(TensorView input, TensorView residual, TensorView weight, double eps,
                            bool enable_pdl, float weight_offset, const char* op) {
  // 1. Validate inputs.
  check_cuda(input, "input");
  check_ndim(input, "input", 2);
  check_last_dim_contiguous(input, "input");
  check_hidden(input);
  check_like_input(input, residual, "residual");
  check_param_vector(input, weight, "weight");
  check_same_dtype(input, "input", weight, "weight");
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(input.device().device_id);
  cudaStream_t stream = get_stream(input.device());
  // 3. Dispatch on dtype and launch.
  dispatch_float_types(input.dtype(), "input", [&](auto t) {
    using T = decltype(t);
    check_launch(flashinfer::norm::FusedAddRMSNorm<T>(
                     data_ptr<T>(input), row_strides(input), data_ptr<T>(residual),
                     row_strides(residual), data_ptr<T>(weight), input.size(0),
                     static_cast<int>(input.size(1)), static_cast<float>(eps), weight_offset,
                     enable_pdl, stream),
                 op);
  });
}

}  // namespace

// [norm_binding.begin]
/// out = input * rsqrt(mean(input^2) + eps) * weight over the last dim; input (B, H) or (B, N, H).
void rmsnorm(TensorView out, TensorView input, TensorView weight, double eps, bool enable_pdl) {
  rmsnorm_impl(out, input, weight, eps, enable_pdl, 0.f, "rmsnorm");
}
// [norm_binding.end]

/// Gemma RMSNorm: the weight is applied as (1 + weight).
void gemma_rmsnorm(TensorView out, TensorView input, TensorView weight, double eps,
                   bool enable_pdl) {
  rmsnorm_impl(out, input, weight, eps, enable_pdl, 1.f, "gemma_rmsnorm");
}

/// In place: residual <- input + residual; input <- rmsnorm(input + residual) (float32 sum).
void fused_add_rmsnorm(TensorView input, TensorView residual, TensorView weight, double eps,
                       bool enable_pdl) {
  fused_add_rmsnorm_impl(input, residual, weight, eps, enable_pdl, 0.f, "fused_add_rmsnorm");
}

void gemma_fused_add_rmsnorm(TensorView input, TensorView residual, TensorView weight, double eps,
                             bool enable_pdl) {
  fused_add_rmsnorm_impl(input, residual, weight, eps, enable_pdl, 1.f,
                         "gemma_fused_add_rmsnorm");
}

/// out = (input - mean) * rsqrt(var + eps) * gamma + beta; input (B, H) bf16, gamma/beta float32.
void layernorm(TensorView out, TensorView input, TensorView gamma, TensorView beta, double eps,
               bool enable_pdl) {
  // 1. Validate inputs.
  check_cuda(input, "input");
  check_ndim(input, "input", 2);
  check_last_dim_contiguous(input, "input");
  check_hidden(input);
  TVM_FFI_CHECK(is_dtype(input.dtype(), kDLBfloat, 16), TypeError)
      << "input must be bfloat16, got " << dtype_name(input.dtype());
  check_like_input(input, out, "out");
  check_param_vector(input, gamma, "gemma");
  check_param_vector(input, beta, "beta");
  TVM_FFI_CHECK(is_dtype(gamma.dtype(), kDLFloat, 32), TypeError)
      << "gemma must be float32, got " << dtype_name(gamma.dtype());
  TVM_FFI_CHECK(is_dtype(beta.dtype(), kDLFloat, 32), TypeError)
      << "beta must be float32, got " << dtype_name(beta.dtype());
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(input.device().device_id);
  cudaStream_t stream = get_stream(input.device());
  // 3. Launch (bf16 only, as upstream).
  using T = __nv_bfloat16;
  check_launch(flashinfer::norm::LayerNorm<T>(data_ptr<T>(input), row_strides(input),
                                              data_ptr<T>(out), row_strides(out),
                                              data_ptr<float>(gamma), data_ptr<float>(beta),
                                              input.size(0), static_cast<int>(input.size(1)),
                                              static_cast<float>(eps), enable_pdl, stream),
               "layernorm");
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm, rmsnorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemma_rmsnorm, gemma_rmsnorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fused_add_rmsnorm, fused_add_rmsnorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemma_fused_add_rmsnorm, gemma_fused_add_rmsnorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(layernorm, layernorm);

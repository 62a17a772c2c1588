// TVM-FFI binding of flashinfer::activation (include/flashinfer/activation.cuh):
// silu_and_mul, gelu_and_mul, gelu_tanh_and_mul. The Python layer flattens the leading dims,
// so the binding sees 2-D views: input (rows, 2d), out (rows, d), each with its own row stride.
#include <flashinfer/activation.cuh>


#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;

namespace {

// [act_and_mul_binding.begin]
template <typename Act>
void act_and_mul(TensorView out, TensorView input, bool enable_pdl, const char* op) {
  // 1. Validate inputs.
  check_cuda(input, "input");
  check_same_device(input, "input", out, "out");
  check_same_dtype(input, "input", out, "out");
  check_ndim(input, "input", 2);
  check_ndim(out, "out", 2);
  check_last_dim_contiguous(input, "input");
  check_last_dim_contiguous(out, "out");
  TVM_FFI_CHECK(input.size(1) % 2 == 0, ValueError)
      << "input.shape[-1] must be even (2 * d), got shape " << shape_str(input);
  // The Python layer's rule (FlashInfer's message): each row is a whole number of 16-byte words.
  TVM_FFI_CHECK(input.size(1) * ((input.dtype().bits + 7) / 8) % 16 == 0, ValueError)
      << "The pointers must be multiple of 16 bytes.";
  const int64_t d = input.size(1) / 2;
  check_size(out, "out", 0, input.size(0));
  check_size(out, "out", 1, d);
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(input.device().device_id);
  cudaStream_t stream = get_stream(input.device());
  // 3. Dispatch on dtype and launch.
  dispatch_half_types(input.dtype(), "input", [&](auto t) {
    using T = decltype(t);
    check_launch(flashinfer::activation::ActAndMul<Act, T>(
                     data_ptr<T>(input), data_ptr<T>(out), input.size(0), d, input.stride(0),
                     out.stride(0), enable_pdl, stream),
                 op);
  });
}
// [act_and_mul_binding.end]

}  // namespace

void silu_and_mul(TensorView out, TensorView input, bool enable_pdl) {
  act_and_mul<flashinfer::activation::SiluOp>(out, input, enable_pdl, "silu_and_mul");
}

void gelu_and_mul(TensorView out, TensorView input, bool enable_pdl) {
  act_and_mul<flashinfer::activation::GeluOp>(out, input, enable_pdl, "gelu_and_mul");
}

void gelu_tanh_and_mul(TensorView out, TensorView input, bool enable_pdl) {
  act_and_mul<flashinfer::activation::GeluTanhOp>(out, input, enable_pdl, "gelu_tanh_and_mul");
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(silu_and_mul, silu_and_mul);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_and_mul, gelu_and_mul);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_tanh_and_mul, gelu_tanh_and_mul);

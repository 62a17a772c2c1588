// TVM-FFI binding of flashinfer::scale (include/flashinfer/scale.cuh).
#include <flashinfer/scale.cuh>

#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;

// [scale_binding.begin]
void scale(TensorView out, TensorView input, double factor, bool enable_pdl) {
  // 1. Validate inputs.
  check_cuda(input, "input");
  check_same_device(input, "input", out, "out");
  check_same_dtype(input, "input", out, "out");
  check_contiguous(input, "input");
  check_contiguous(out, "out");
  TVM_FFI_CHECK(out.numel() == input.numel(), ValueError)
      << "out must have " << input.numel() << " elements like input, got " << out.numel();
  TVM_FFI_CHECK(is_aligned(data_ptr(input), 16) && is_aligned(data_ptr(out), 16), ValueError)
      << "input and out must be 16-byte aligned";
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(input.device().device_id);
  cudaStream_t stream = get_stream(input.device());
  // 3. Dispatch on dtype and launch.
  dispatch_float_types(input.dtype(), "input", [&](auto t) {
    using T = decltype(t);
    check_launch(flashinfer::scale::Scale<T>(data_ptr<T>(input), data_ptr<T>(out),
                                             static_cast<float>(factor), input.numel(),
                                             enable_pdl, stream),
                 "scale");
  });
}
// [scale_binding.end]

TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, scale);

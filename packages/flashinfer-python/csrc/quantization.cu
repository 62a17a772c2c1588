// TVM-FFI binding of flashinfer::quantization (include/flashinfer/quantization.cuh): packbits,
// segment_packbits. The Python layer reinterprets x as an integer tensor of the element width
// and passes the "nonzero" mask (see the header), so any dtype reaches these two functions.
#include <flashinfer/quantization.cuh>

#include <cstdint>
#include <type_traits>

#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;

namespace {

/// Call `f(U{})` with U the unsigned integer of x's element width (bool, int*, uint* elements).
template <typename F>
void dispatch_element_width(DLDataType dt, F&& f) {
  const bool integral = dt.lanes == 1 && (dt.code == kDLInt || dt.code == kDLUInt ||
                                          dt.code == kDLBool);
  TVM_FFI_CHECK(integral, TypeError)
      << "x must be bool or an integer dtype (the Python API reinterprets other dtypes), got "
      << dtype_name(dt);
  switch (dt.bits) {
    case 8: return f(uint8_t{});
    case 16: return f(uint16_t{});
    case 32: return f(uint32_t{});
    case 64: return f(uint64_t{});
    default: TVM_FFI_THROW(TypeError) << "x must have 8, 16, 32 or 64-bit elements, got "
                                       << dtype_name(dt);
  }
}

void check_packbits_output(const TensorView& y, const TensorView& x) {
  check_same_device(x, "x", y, "y");
  check_ndim(y, "y", 1);
  check_contiguous(y, "y");
  TVM_FFI_CHECK(is_dtype(y.dtype(), kDLUInt, 8), TypeError)
      << "y must be uint8, got " << dtype_name(y.dtype());
}

}  // namespace

// [packbits_binding.begin]
/// y[j] = bits of (x[8j + k] & mask) != 0, k < 8; `little` picks numpy's bitorder="little".
void packbits(TensorView y, TensorView x, int64_t mask, bool little) {
  // 1. Validate inputs.
  check_cuda(x, "x");
  check_ndim(x, "x", 1);
  check_contiguous(x, "x");
  check_packbits_output(y, x);
  check_size(y, "y", 0, (x.size(0) + 7) / 8);
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(x.device().device_id);
  cudaStream_t stream = get_stream(x.device());
  // 3. Dispatch on element width and launch.
  dispatch_element_width(x.dtype(), [&](auto u) {
    using U = decltype(u);
    check_launch(flashinfer::quantization::PackBits<U>(data_ptr<U>(x), x.size(0),
                                                       static_cast<U>(mask), little,
                                                       data_ptr<uint8_t>(y),
                                                       /*enable_pdl=*/false, stream),
                 "packbits");
  });
}
// [packbits_binding.end]

/*!
 * Segment i = x[indptr[i] : indptr[i+1]] packs into y[indptr_new[i] : indptr_new[i+1]].
 * The caller computed indptr_new (int32 cumsum of ceil(len_i / 8), indptr_new[0] = 0), sized y
 * as indptr_new[-1], and checked that indptr is non-decreasing within [0, x.size(0)]: those
 * need device data, which the binding does not read.
 */
void segment_packbits(TensorView y, TensorView x, TensorView indptr, TensorView indptr_new,
                      int64_t mask, bool little) {
  // 1. Validate inputs.
  check_cuda(x, "x");
  check_ndim(x, "x", 1);
  check_contiguous(x, "x");
  check_packbits_output(y, x);
  check_same_device(x, "x", indptr, "indptr");
  check_same_device(x, "x", indptr_new, "indptr_new");
  check_ndim(indptr, "indptr", 1);
  check_contiguous(indptr, "indptr");
  TVM_FFI_CHECK(indptr.size(0) >= 1, ValueError)
      << "indptr must have at least 1 element, got shape " << shape_str(indptr);
  check_ndim(indptr_new, "indptr_new", 1);
  check_contiguous(indptr_new, "indptr_new");
  check_size(indptr_new, "indptr_new", 0, indptr.size(0));
  TVM_FFI_CHECK(is_dtype(indptr_new.dtype(), kDLInt, 32), TypeError)
      << "indptr_new must be int32, got " << dtype_name(indptr_new.dtype());
  const int64_t num_segments = indptr.size(0) - 1;
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(x.device().device_id);
  cudaStream_t stream = get_stream(x.device());
  // 3. Dispatch on element width and index type, and launch.
  dispatch_element_width(x.dtype(), [&](auto u) {
    using U = decltype(u);
    dispatch_index_types(indptr.dtype(), "indptr", [&](auto i) {
      using IdType = decltype(i);
      check_launch(flashinfer::quantization::SegmentPackBits<U, IdType>(
                       data_ptr<U>(x), data_ptr<IdType>(indptr), data_ptr<int32_t>(indptr_new),
                       num_segments, static_cast<U>(mask), little, data_ptr<uint8_t>(y),
                       y.size(0), /*enable_pdl=*/false, stream),
                   "segment_packbits");
    });
  });
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(packbits, packbits);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(segment_packbits, segment_packbits);

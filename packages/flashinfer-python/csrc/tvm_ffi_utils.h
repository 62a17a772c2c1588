// Helpers shared by the TVM-FFI bindings in csrc/: argument checks that raise typed Python
// errors (ValueError / TypeError naming the argument, what was expected and what was received),
// the current stream, dtype dispatch, and the launch-error check.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <flashinfer/vec.cuh>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <string>

namespace flashinfer {
namespace ffi_utils {

using tvm::ffi::TensorView;
using flashinfer::is_aligned;

inline std::string dtype_name(DLDataType dt) {
  if (dt.lanes == 1) {
    if (dt.code == kDLFloat && dt.bits == 16) return "float16";
    if (dt.code == kDLBfloat && dt.bits == 16) return "bfloat16";
    if (dt.code == kDLFloat && dt.bits == 32) return "float32";
    if (dt.code == kDLFloat && dt.bits == 64) return "float64";
    if (dt.code == kDLInt) return "int" + std::to_string(dt.bits);
    if (dt.code == kDLUInt) return "uint" + std::to_string(dt.bits);
    if (dt.code == kDLBool) return "bool";
  }
  return "dtype(code=" + std::to_string(dt.code) + ", bits=" + std::to_string(dt.bits) +
         ", lanes=" + std::to_string(dt.lanes) + ")";
}

inline bool is_dtype(DLDataType dt, uint8_t code, uint8_t bits) {
  return dt.code == code && dt.bits == bits && dt.lanes == 1;
}

inline std::string shape_str(const TensorView& t) {
  std::string s = "(";
  for (int i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.ndim() == 1 ? ",)" : ")");
}

inline void check_cuda(const TensorView& t, const char* name) {
  TVM_FFI_CHECK(t.device().device_type == kDLCUDA, ValueError)
      << name << " must be a CUDA tensor, got device_type " << t.device().device_type;
}

inline void check_same_device(const TensorView& a, const char* a_name, const TensorView& b,
                              const char* b_name) {
  TVM_FFI_CHECK(a.device().device_type == b.device().device_type &&
                    a.device().device_id == b.device().device_id,
                ValueError)
      << b_name << " must be on the same device as " << a_name << " (cuda:"
      << a.device().device_id << "), got cuda:" << b.device().device_id;
}

inline void check_ndim(const TensorView& t, const char* name, int expected) {
  TVM_FFI_CHECK(t.ndim() == expected, ValueError)
      << name << " must be " << expected << "-D, got shape " << shape_str(t);
}

inline void check_size(const TensorView& t, const char* name, int dim, int64_t expected) {
  TVM_FFI_CHECK(t.size(dim) == expected, ValueError)
      << name << ".shape[" << dim << "] must be " << expected << ", got shape " << shape_str(t);
}

inline void check_same_dtype(const TensorView& a, const char* a_name, const TensorView& b,
                             const char* b_name) {
  TVM_FFI_CHECK(a.dtype() == b.dtype(), TypeError)
      << b_name << " must have the dtype of " << a_name << " (" << dtype_name(a.dtype())
      << "), got " << dtype_name(b.dtype());
}

inline void check_last_dim_contiguous(const TensorView& t, const char* name) {
  TVM_FFI_CHECK(t.ndim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1, ValueError)
      << name << " must be contiguous in its last dimension, got stride " << t.stride(-1);
}

inline void check_contiguous(const TensorView& t, const char* name) {
  TVM_FFI_CHECK(t.IsContiguous(), ValueError) << name << " must be contiguous";
}

/// Data pointer with the DLPack byte offset applied.
template <typename T = void>
inline T* data_ptr(const TensorView& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

/// The stream the caller's framework has current for t's device (torch's current stream).
inline cudaStream_t get_stream(DLDevice device) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
}

/// A trace probe's host copy of its stamps: int64 [ctas, slots] (the attention and sampling
/// modules' trace_copy, built with their PROBE_TRACE macros).
inline void check_trace_tensor(const TensorView& out, int64_t ctas, int64_t slots) {
  TVM_FFI_CHECK(out.ndim() == 2 && out.size(0) == ctas && out.size(1) == slots &&
                    out.dtype().bits == 64,
                ValueError)
      << "trace_copy takes an int64 tensor [" << ctas << ", " << slots << "]";
}

/// Raise a RuntimeError naming the op if a launch (or the launcher) failed.
inline void check_launch(cudaError_t status, const char* op) {
  TVM_FFI_CHECK(status == cudaSuccess, RuntimeError)
      << op << " failed to launch: " << cudaGetErrorString(status);
}

/// Call `f(T{})` with T = __half or __nv_bfloat16 for `dt`; TypeError naming `name` otherwise.
/// Only the half types are instantiated: no float kernel is compiled for ops that have none.
template <typename F>
inline void dispatch_half_types(DLDataType dt, const char* name, F&& f) {
  if (is_dtype(dt, kDLFloat, 16)) {
    f(__half{});
  } else if (is_dtype(dt, kDLBfloat, 16)) {
    f(__nv_bfloat16{});
  } else {
    TVM_FFI_THROW(TypeError) << name << " must be float16 or bfloat16, got " << dtype_name(dt);
  }
}

/// As dispatch_half_types, plus T = float for float32.
template <typename F>
inline void dispatch_float_types(DLDataType dt, const char* name, F&& f) {
  if (is_dtype(dt, kDLFloat, 32)) {
    f(float{});
  } else if (is_dtype(dt, kDLFloat, 16) || is_dtype(dt, kDLBfloat, 16)) {
    dispatch_half_types(dt, name, f);
  } else {
    TVM_FFI_THROW(TypeError) << name << " must be float16, bfloat16 or float32, got "
                             << dtype_name(dt);
  }
}

/// Call `f(T{})` with T = int32_t or int64_t for an index tensor; TypeError otherwise.
template <typename F>
inline void dispatch_index_types(DLDataType dt, const char* name, F&& f) {
  if (is_dtype(dt, kDLInt, 32)) {
    f(int32_t{});
  } else if (is_dtype(dt, kDLInt, 64)) {
    f(int64_t{});
  } else {
    TVM_FFI_THROW(TypeError) << name << " must be int32 or int64, got " << dtype_name(dt);
  }
}

}  // namespace ffi_utils
}  // namespace flashinfer

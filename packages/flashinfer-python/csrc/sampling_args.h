// The argument checks and per-row parameters the sampling bindings share (csrc/sampling.cu,
// csrc/sampling_transform.cu: two translation units, so the module's first-call build runs two
// nvcc processes side by side).
#pragma once

#include <flashinfer/sampling.cuh>

#include "tvm_ffi_utils.h"

namespace flashinfer::sampling_args {

using namespace flashinfer::ffi_utils;
using namespace flashinfer::sampling;
using tvm::ffi::Optional;

inline void check_rows(const TensorView& t, const char* name) {
  check_cuda(t, name);
  check_ndim(t, name, 2);
  check_last_dim_contiguous(t, name);
  TVM_FFI_CHECK(t.size(1) >= 1 && t.size(1) <= kMaxVocab, ValueError)
      << name << ".shape[1] must be in [1, " << kMaxVocab << "], got " << t.size(1);
}

/// A per-row parameter: a (num_rows,) tensor of `code`/`bits` on `ref`'s device, or the scalar.
template <typename V>
inline RowParam<V> row_param(const TensorView& ref, const Optional<TensorView>& arr, V value,
                             int64_t num_rows, const char* name, uint8_t code) {
  RowParam<V> p;
  p.value = value;
  if (arr.has_value()) {
    const TensorView& a = arr.value();
    check_same_device(ref, "input", a, name);
    check_ndim(a, name, 1);
    check_size(a, name, 0, num_rows);
    check_contiguous(a, name);
    TVM_FFI_CHECK(is_dtype(a.dtype(), code, 32), TypeError)
        << name << " must be " << (code == kDLFloat ? "float32" : "int32") << ", got "
        << dtype_name(a.dtype());
    p.arr = data_ptr<V>(a);
  }
  return p;
}

inline RngArgs rng_args(const TensorView& ref, const Optional<TensorView>& seed_arr,
                        const Optional<TensorView>& offset_arr, int64_t seed, int64_t offset,
                        int64_t num_rows) {
  RngArgs r;
  r.seed = static_cast<uint64_t>(seed);
  r.offset = static_cast<uint64_t>(offset);
  const Optional<TensorView>* arrs[2] = {&seed_arr, &offset_arr};
  const char* names[2] = {"seed", "offset"};
  for (int i = 0; i < 2; ++i) {
    if (!arrs[i]->has_value()) continue;
    const TensorView& a = arrs[i]->value();
    check_same_device(ref, "input", a, names[i]);
    check_ndim(a, names[i], 1);
    check_contiguous(a, names[i]);
    TVM_FFI_CHECK(a.size(0) == 1 || a.size(0) == num_rows, ValueError)
        << names[i] << " must have length 1 or " << num_rows << ", got " << a.size(0);
    TVM_FFI_CHECK(a.dtype().bits == 64 && (a.dtype().code == kDLInt || a.dtype().code == kDLUInt),
                  TypeError)
        << names[i] << " must be int64 or uint64, got " << dtype_name(a.dtype());
    (i == 0 ? r.seed_arr : r.offset_arr) = data_ptr<int64_t>(a);
    (i == 0 ? r.seed_len : r.offset_len) = a.size(0);
  }
  return r;
}

/// The one-CTA-per-row path's scratch (float32 (G, S), S >= vocab, S % 4 == 0, 16-byte
/// aligned), or the cluster path when absent.
inline Scratch scratch_of(const TensorView& ref, const Optional<TensorView>& scratch,
                          int64_t vocab) {
  Scratch sc;
  if (!scratch.has_value()) return sc;
  const TensorView& t = scratch.value();
  check_same_device(ref, "input", t, "scratch");
  check_ndim(t, "scratch", 2);
  check_last_dim_contiguous(t, "scratch");
  TVM_FFI_CHECK(is_dtype(t.dtype(), kDLFloat, 32), TypeError)
      << "scratch must be float32, got " << dtype_name(t.dtype());
  TVM_FFI_CHECK(t.size(0) >= 1 && t.size(1) >= vocab && t.stride(0) % 4 == 0 &&
                    is_aligned(data_ptr(t), 16),
                ValueError)
      << "scratch must be (>= 1, >= " << vocab << ") with rows of a multiple of 4 floats, "
      << "16-byte aligned, got shape (" << t.size(0) << ", " << t.size(1) << ")";
  sc.ptr = data_ptr<float>(t);
  sc.rows = t.size(0);
  sc.stride = t.stride(0);
  return sc;
}

}  // namespace flashinfer::sampling_args

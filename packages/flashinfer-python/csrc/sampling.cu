// TVM-FFI binding of flashinfer::sampling's draw (include/flashinfer/sampling.cuh): `sample`, every
// sampling op (the filter is a runtime argument). No kernels here: one per input dtype and filter
// set in translation units of their own (sampling_draw.cu: plain and min-p; sampling_top_p*.cu;
// sampling_top_k.cu; sampling_top_k_top_p*.cu), so that the first-call build compiles them side
// by side with this one and the transforms' (sampling_transform*.cu).
#include "sampling_args.h"

using namespace flashinfer::ffi_utils;
using namespace flashinfer::sampling;
using namespace flashinfer::sampling_args;
using tvm::ffi::Optional;

namespace flashinfer::sampling {
FLASHINFER_SAMPLE_FILTERS(extern, kTopPFilters)
FLASHINFER_SAMPLE_FILTERS(extern, kTopKFilters)
FLASHINFER_SAMPLE_FILTERS(extern, kTopKTopPFilters)
FLASHINFER_SAMPLE_FILTERS(extern, kDrawFilters)
#if FLASHINFER_SAMPLING_PROBE_TRACE
cudaError_t DrawTraceCopy(void* dst);  // sampling_draw.cu
#endif
}  // namespace flashinfer::sampling

/// out[i] = a token drawn from row indices[i] (or i) of input after `filter`; valid[i] = row has
/// no NaN and a valid index. input (B, V) probabilities (logits when `logits`).
void sample(TensorView out, Optional<TensorView> valid, TensorView input,
            Optional<TensorView> indices, int64_t filter, bool logits,
            Optional<TensorView> top_p_arr, double top_p, Optional<TensorView> top_k_arr,
            int64_t top_k, Optional<TensorView> min_p_arr, double min_p,
            Optional<TensorView> seed_arr, Optional<TensorView> offset_arr, int64_t seed,
            int64_t offset, Optional<TensorView> scratch, bool enable_pdl) {
  // 1. Validate inputs.
  check_rows(input, "probs");
  TVM_FFI_CHECK(filter >= kNoFilter && filter <= kTopKFirstTopP, ValueError)
      << "filter must be in [0, 5], got " << filter;
  check_same_device(input, "probs", out, "out");
  check_ndim(out, "out", 1);
  check_contiguous(out, "out");
  const int64_t num_out = out.size(0);
  SampleParams p;
  p.filter = static_cast<int>(filter);
  p.logits = logits;
  p.rows.num_in_rows = input.size(0);
  if (indices.has_value()) {
    const TensorView& idx = indices.value();
    check_same_device(input, "probs", idx, "indices");
    check_ndim(idx, "indices", 1);
    check_size(idx, "indices", 0, num_out);
    check_contiguous(idx, "indices");
    dispatch_index_types(idx.dtype(), "indices", [&](auto t) {
      p.rows.indices = data_ptr(idx);
      p.rows.indices_64 = sizeof(t) == 8;
    });
    TVM_FFI_CHECK(out.dtype() == idx.dtype(), TypeError)
        << "out must have the dtype of indices (" << dtype_name(idx.dtype()) << "), got "
        << dtype_name(out.dtype());
  } else {
    check_size(out, "out", 0, input.size(0));
    TVM_FFI_CHECK(is_dtype(out.dtype(), kDLInt, 32), TypeError)
        << "out must be int32, got " << dtype_name(out.dtype());
  }
  p.out = data_ptr(out);
  p.out_64 = out.dtype().bits == 64;
  p.valid = nullptr;
  if (valid.has_value()) {
    const TensorView& v = valid.value();
    check_same_device(input, "probs", v, "valid");
    check_ndim(v, "valid", 1);
    check_size(v, "valid", 0, num_out);
    TVM_FFI_CHECK(is_dtype(v.dtype(), kDLBool, 8), TypeError)
        << "valid must be bool, got " << dtype_name(v.dtype());
    p.valid = data_ptr<bool>(v);
  }
  p.top_p = row_param<float>(input, top_p_arr, static_cast<float>(top_p), num_out, "top_p", kDLFloat);
  p.top_k = row_param<int>(input, top_k_arr, static_cast<int>(top_k), num_out, "top_k", kDLInt);
  p.min_p = row_param<float>(input, min_p_arr, static_cast<float>(min_p), num_out, "min_p", kDLFloat);
  p.rng = rng_args(input, seed_arr, offset_arr, seed, offset, num_out);
  const Scratch sc = scratch_of(input, scratch, input.size(1));
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(input.device().device_id);
  cudaStream_t stream = get_stream(input.device());
  // 3. Dispatch on dtype and launch.
  dispatch_float_types(input.dtype(), "probs", [&](auto t) {
    using T = decltype(t);
    check_launch(Sample<T>(data_ptr<T>(input), input.stride(0), num_out, input.size(1), p, sc,
                           enable_pdl, stream),
                 "sampling");
  });
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(sample, sample);

#if FLASHINFER_SAMPLING_PROBE_TRACE
/// The trace probe's stamps of the draw set's kernels into `out`, int64 [kTraceCtas, kTraceSlots]
/// on the host (include/flashinfer/sampling_common.cuh; benchmarks/probes/trace_sampling.py).
void trace_copy(TensorView out) {
  check_trace_tensor(out, kTraceCtas, kTraceSlots);
  check_launch(DrawTraceCopy(out.data_ptr()), "trace copy");
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(trace_copy, trace_copy);
#endif

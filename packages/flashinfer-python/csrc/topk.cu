// TVM-FFI bindings of flashinfer::topk (include/flashinfer/topk.cuh): top_k and its two fused
// index transforms for sparse attention. One translation unit, one kernel per input dtype.
#include <flashinfer/topk.cuh>

#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;
using flashinfer::topk::Mode;
using flashinfer::topk::Params;
using tvm::ffi::Optional;

namespace {

// Indices are int32 and kPadIdx (2^31 - 1) marks padding in the sort: rows stay below it.
constexpr int64_t kMaxLen = (int64_t{1} << 31) - 2;

void check_scores(const TensorView& input, int64_t k, int64_t tie_break) {
  check_cuda(input, "input");
  check_ndim(input, "input", 2);
  check_last_dim_contiguous(input, "input");
  TVM_FFI_CHECK(input.size(1) <= kMaxLen, ValueError)
      << "input.shape[1] must be at most " << kMaxLen << ", got " << input.size(1);
  TVM_FFI_CHECK(k >= 1 && k <= kMaxLen, ValueError)
      << "k must be in [1, " << kMaxLen << "], got " << k;
  TVM_FFI_CHECK(tie_break >= 0 && tie_break <= 2, ValueError)
      << "tie_break must be 0 (none), 1 (smaller index) or 2 (larger index), got " << tie_break;
}

/// A (num_rows,) int32 vector on input's device.
const int32_t* row_vector(const TensorView& input, const TensorView& v, const char* name) {
  check_same_device(input, "input", v, name);
  check_ndim(v, name, 1);
  check_size(v, name, 0, input.size(0));
  check_contiguous(v, name);
  TVM_FFI_CHECK(is_dtype(v.dtype(), kDLInt, 32), TypeError)
      << name << " must be int32, got " << dtype_name(v.dtype());
  return data_ptr<int32_t>(v);
}

const int32_t* opt_row_vector(const TensorView& input, const Optional<TensorView>& v,
                              const char* name) {
  return v.has_value() ? row_vector(input, v.value(), name) : nullptr;
}

/// A contiguous (num_rows, k) int32 output.
int32_t* index_output(const TensorView& input, const TensorView& out, int64_t k,
                      const char* name) {
  check_same_device(input, "input", out, name);
  check_ndim(out, name, 2);
  check_size(out, name, 0, input.size(0));
  check_size(out, name, 1, k);
  check_contiguous(out, name);
  TVM_FFI_CHECK(is_dtype(out.dtype(), kDLInt, 32), TypeError)
      << name << " must be int32, got " << dtype_name(out.dtype());
  return data_ptr<int32_t>(out);
}

Params base_params(const TensorView& input, int64_t k, int64_t tie_break, Mode mode) {
  Params p{};
  p.input = data_ptr<void>(input);
  p.row_stride = input.size(0) == 1 ? input.size(1) : input.stride(0);
  p.num_rows = static_cast<int>(input.size(0));
  p.max_len = static_cast<int>(input.size(1));
  p.k = static_cast<int>(k);
  p.mode = static_cast<int>(mode);
  p.tie_break = static_cast<int>(tie_break);
  return p;
}

void launch(const TensorView& input, const Params& p, const char* op) {
  tvm::ffi::CUDADeviceGuard guard(input.device().device_id);
  cudaStream_t stream = get_stream(input.device());
  dispatch_float_types(input.dtype(), "input", [&](auto t) {
    using T = decltype(t);
    check_launch(flashinfer::topk::TopK<T>(p, stream), op);
  });
}

}  // namespace

/// values, indices (int64) <- the k largest of each row of input; sorted: descending, ties by
/// index. k <= input.shape[1].
void top_k(TensorView input, TensorView values, TensorView indices, int64_t k, bool sorted,
           int64_t tie_break) {
  // 1. Validate inputs.
  check_scores(input, k, tie_break);
  TVM_FFI_CHECK(k <= input.size(1), ValueError)
      << "k must be at most input.shape[1] (" << input.size(1) << "), got " << k;
  TVM_FFI_CHECK(!sorted || k <= flashinfer::topk::kMaxBufferK, ValueError)
      << "the kernel sorts k <= " << flashinfer::topk::kMaxBufferK << ", got k = " << k;
  for (const TensorView* o : {&values, &indices}) {
    const char* name = o == &values ? "values" : "indices";
    check_same_device(input, "input", *o, name);
    check_ndim(*o, name, 2);
    check_size(*o, name, 0, input.size(0));
    check_size(*o, name, 1, k);
    check_contiguous(*o, name);
  }
  check_same_dtype(input, "input", values, "values");
  TVM_FFI_CHECK(is_dtype(indices.dtype(), kDLInt, 64), TypeError)
      << "indices must be int64, got " << dtype_name(indices.dtype());
  Params p = base_params(input, k, tie_break, Mode::kValues);
  p.sorted = sorted;
  p.out_values = data_ptr<void>(values);
  p.out_indices64 = data_ptr<int64_t>(indices);
  // 2-3. Device guard, stream, dispatch and launch.
  launch(input, p, "top_k");
}

/// out[i, j] = src_page_table[b, pt_start + idx // page_size] * page_size + idx % page_size for
/// the j-th selected idx of row i (relative to row_starts[i]); -1 past lengths[i].
void top_k_page_table_transform(TensorView input, TensorView out, Optional<TensorView> out_raw,
                                TensorView src_page_table, TensorView lengths,
                                Optional<TensorView> row_to_batch, Optional<TensorView> row_starts,
                                Optional<TensorView> page_table_row_starts, int64_t k,
                                int64_t page_size_log2, int64_t tie_break) {
  // 1. Validate inputs.
  check_scores(input, k, tie_break);
  TVM_FFI_CHECK(page_size_log2 >= 0 && page_size_log2 <= 30, ValueError)
      << "page_size must be a power of two no greater than 2**30, got 2**" << page_size_log2;
  check_same_device(input, "input", src_page_table, "src_page_table");
  check_ndim(src_page_table, "src_page_table", 2);
  check_last_dim_contiguous(src_page_table, "src_page_table");
  TVM_FFI_CHECK(is_dtype(src_page_table.dtype(), kDLInt, 32), TypeError)
      << "src_page_table must be int32, got " << dtype_name(src_page_table.dtype());
  Params p = base_params(input, k, tie_break, Mode::kPageTable);
  p.out_indices32 = index_output(input, out, k, "out");
  p.out_raw = out_raw.has_value() ? index_output(input, out_raw.value(), k, "out_raw_indices")
                                  : nullptr;
  p.lengths = row_vector(input, lengths, "lengths");
  p.row_to_batch = opt_row_vector(input, row_to_batch, "row_to_batch");
  p.row_starts = opt_row_vector(input, row_starts, "row_starts");
  p.pt_row_starts = opt_row_vector(input, page_table_row_starts, "page_table_row_starts");
  p.page_table = data_ptr<int32_t>(src_page_table);
  p.page_table_rows = static_cast<int>(src_page_table.size(0));
  p.page_table_cols = static_cast<int>(src_page_table.size(1));
  p.page_table_stride = src_page_table.stride(0);
  p.page_size_log2 = static_cast<int>(page_size_log2);
  // 2-3. Device guard, stream, dispatch and launch.
  launch(input, p, "top_k_page_table_transform");
}

/// out[i, j] = (j-th selected index of row i, relative to row_starts[i]) + offsets[i]; -1 past
/// lengths[i].
void top_k_ragged_transform(TensorView input, TensorView out, TensorView offsets,
                            TensorView lengths, Optional<TensorView> row_starts, int64_t k,
                            int64_t tie_break) {
  // 1. Validate inputs.
  check_scores(input, k, tie_break);
  Params p = base_params(input, k, tie_break, Mode::kRagged);
  p.out_indices32 = index_output(input, out, k, "out");
  p.offsets = row_vector(input, offsets, "offsets");
  p.lengths = row_vector(input, lengths, "lengths");
  p.row_starts = opt_row_vector(input, row_starts, "row_starts");
  // 2-3. Device guard, stream, dispatch and launch.
  launch(input, p, "top_k_ragged_transform");
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_k, top_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_k_page_table_transform, top_k_page_table_transform);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_k_ragged_transform, top_k_ragged_transform);

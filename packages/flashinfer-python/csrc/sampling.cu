// TVM-FFI bindings of flashinfer::sampling (include/flashinfer/sampling.cuh): sample (every
// sampling op: the filter is a runtime argument), transform (softmax, top-p/top-k renorm, top-k
// mask) and chain_speculative. One translation unit: three kernels per input dtype and one chain
// kernel, so the first-call build is one nvcc run.
#include <flashinfer/sampling.cuh>

#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;
using namespace flashinfer::sampling;
using tvm::ffi::Optional;

namespace {

void check_rows(const TensorView& t, const char* name) {
  check_cuda(t, name);
  check_ndim(t, name, 2);
  check_last_dim_contiguous(t, name);
  TVM_FFI_CHECK(t.size(1) >= 1 && t.size(1) <= kMaxVocab, ValueError)
      << name << ".shape[1] must be in [1, " << kMaxVocab << "], got " << t.size(1);
}

/// A per-row parameter: a (num_rows,) tensor of `code`/`bits` on `ref`'s device, or the scalar.
template <typename V>
RowParam<V> row_param(const TensorView& ref, const Optional<TensorView>& arr, V value,
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

RngArgs rng_args(const TensorView& ref, const Optional<TensorView>& seed_arr,
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
Scratch scratch_of(const TensorView& ref, const Optional<TensorView>& scratch, int64_t vocab) {
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

}  // namespace

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

/// out (B, V) = transform `kind` of input (B, V): softmax (float32 out), top-p renorm (float32),
/// top-k renorm (input dtype), top-k mask (input dtype).
void transform(TensorView out, TensorView input, int64_t kind, Optional<TensorView> top_p_arr,
               double top_p, Optional<TensorView> top_k_arr, int64_t top_k,
               Optional<TensorView> temperature_arr, double temperature,
               Optional<TensorView> scratch, bool enable_pdl) {
  // 1. Validate inputs.
  check_rows(input, "input");
  TVM_FFI_CHECK(kind >= kSoftmax && kind <= kTopKMask, ValueError)
      << "kind must be in [0, 3], got " << kind;
  check_same_device(input, "input", out, "out");
  check_ndim(out, "out", 2);
  check_size(out, "out", 0, input.size(0));
  check_size(out, "out", 1, input.size(1));
  check_last_dim_contiguous(out, "out");
  const bool float_out = kind == kSoftmax || kind == kTopPRenorm;
  if (float_out) {
    TVM_FFI_CHECK(is_dtype(out.dtype(), kDLFloat, 32), TypeError)
        << "out must be float32, got " << dtype_name(out.dtype());
  } else {
    check_same_dtype(input, "input", out, "out");
  }
  const int64_t rows = input.size(0);
  TransformParams p;
  p.kind = static_cast<int>(kind);
  p.top_p = row_param<float>(input, top_p_arr, static_cast<float>(top_p), rows, "top_p", kDLFloat);
  p.top_k = row_param<int>(input, top_k_arr, static_cast<int>(top_k), rows, "top_k", kDLInt);
  p.temperature = row_param<float>(input, temperature_arr, static_cast<float>(temperature), rows,
                                   "temperature", kDLFloat);
  p.out = data_ptr(out);
  p.out_stride = out.stride(0);
  const Scratch sc = scratch_of(input, scratch, input.size(1));
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(input.device().device_id);
  cudaStream_t stream = get_stream(input.device());
  // 3. Dispatch on dtype and launch.
  dispatch_float_types(input.dtype(), "input", [&](auto t) {
    using T = decltype(t);
    check_launch(TransformRows<T>(data_ptr<T>(input), input.stride(0), rows, input.size(1), p,
                                  sc, enable_pdl, stream),
                 "sampling transform");
  });
}

/// Chain speculative sampling: out (b, n + 1) int32; accepted, emitted (b,) int32 are added to.
void chain_speculative(TensorView out, TensorView accepted, TensorView emitted, TensorView draft,
                       TensorView ids, TensorView target, Optional<TensorView> seed_arr,
                       Optional<TensorView> offset_arr, int64_t seed, int64_t offset,
                       Optional<TensorView> scratch, bool enable_pdl) {
  // 1. Validate inputs.
  check_cuda(draft, "draft_probs");
  check_ndim(draft, "draft_probs", 3);
  check_ndim(target, "target_probs", 3);
  check_ndim(ids, "draft_token_ids", 2);
  const int64_t b = draft.size(0), n = draft.size(1), vocab = draft.size(2);
  TVM_FFI_CHECK(vocab >= 1 && vocab <= kMaxVocab, ValueError)
      << "draft_probs.shape[2] must be in [1, " << kMaxVocab << "], got " << vocab;
  check_size(target, "target_probs", 0, b);
  check_size(target, "target_probs", 1, n + 1);
  check_size(target, "target_probs", 2, vocab);
  check_size(ids, "draft_token_ids", 0, b);
  check_size(ids, "draft_token_ids", 1, n);
  const TensorView* f32[2] = {&draft, &target};
  const char* f32_names[2] = {"draft_probs", "target_probs"};
  for (int i = 0; i < 2; ++i) {
    check_same_device(draft, "draft_probs", *f32[i], f32_names[i]);
    check_last_dim_contiguous(*f32[i], f32_names[i]);
    TVM_FFI_CHECK(is_dtype(f32[i]->dtype(), kDLFloat, 32), TypeError)
        << f32_names[i] << " must be float32, got " << dtype_name(f32[i]->dtype());
  }
  const TensorView* i32[4] = {&ids, &out, &accepted, &emitted};
  const char* i32_names[4] = {"draft_token_ids", "output", "accepted", "emitted"};
  for (int i = 0; i < 4; ++i) {
    check_same_device(draft, "draft_probs", *i32[i], i32_names[i]);
    TVM_FFI_CHECK(is_dtype(i32[i]->dtype(), kDLInt, 32), TypeError)
        << i32_names[i] << " must be int32, got " << dtype_name(i32[i]->dtype());
  }
  check_last_dim_contiguous(ids, "draft_token_ids");
  check_contiguous(out, "output");
  check_size(out, "output", 0, b);
  check_size(out, "output", 1, n + 1);
  check_ndim(accepted, "accepted", 1);
  check_size(accepted, "accepted", 0, b);
  check_contiguous(accepted, "accepted");
  check_ndim(emitted, "emitted", 1);
  check_size(emitted, "emitted", 0, b);
  check_contiguous(emitted, "emitted");
  ChainParams p;
  p.draft = data_ptr<float>(draft);
  p.ids = data_ptr<int32_t>(ids);
  p.target = data_ptr<float>(target);
  p.draft_s0 = draft.stride(0);
  p.draft_s1 = draft.stride(1);
  p.target_s0 = target.stride(0);
  p.target_s1 = target.stride(1);
  p.ids_s0 = ids.stride(0);
  p.n = static_cast<int>(n);
  p.vocab = vocab;
  p.rng = rng_args(draft, seed_arr, offset_arr, seed, offset, b);
  p.out = data_ptr<int32_t>(out);
  p.accepted = data_ptr<int32_t>(accepted);
  p.emitted = data_ptr<int32_t>(emitted);
  const Scratch sc = scratch_of(draft, scratch, vocab);
  // 2. Device guard and stream.
  tvm::ffi::CUDADeviceGuard guard(draft.device().device_id);
  cudaStream_t stream = get_stream(draft.device());
  // 3. Launch (float32 only, as upstream).
  check_launch(ChainSpeculative(p, b, sc, enable_pdl, stream), "chain_speculative_sampling");
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(sample, sample);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(transform, transform);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(chain_speculative, chain_speculative);

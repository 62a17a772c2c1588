// TVM-FFI bindings of flashinfer::sampling's transforms and chain speculative sampling
// (include/flashinfer/sampling.cuh): `transform` (softmax, top-p/top-k renorm, top-k mask; one
// kernel per input dtype, each in a translation unit of its own) and `chain_speculative`
// (float32). Built beside sampling.cu.
#include "sampling_args.h"

namespace flashinfer::sampling {  // the kernels: sampling_transform_{float,half,bf16}.cu
FLASHINFER_TRANSFORM_ROWS(extern, float)
FLASHINFER_TRANSFORM_ROWS(extern, __half)
FLASHINFER_TRANSFORM_ROWS(extern, __nv_bfloat16)
}  // namespace flashinfer::sampling

using namespace flashinfer::ffi_utils;
using namespace flashinfer::sampling;
using namespace flashinfer::sampling_args;
using tvm::ffi::Optional;

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

TVM_FFI_DLL_EXPORT_TYPED_FUNC(transform, transform);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(chain_speculative, chain_speculative);

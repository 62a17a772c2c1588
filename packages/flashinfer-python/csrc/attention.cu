// TVM-FFI binding of the attention kernels (include/flashinfer/attention/) for ONE variant,
// chosen at compile time by the -D flags that flashinfer/jit/attention.py derives from its
// variant dataclass:
//   FI_DTYPE_Q, FI_DTYPE_O  0 = float16, 1 = bfloat16
//   FI_DTYPE_KV             as FI_DTYPE_Q, or 2 = float8_e4m3fn, 3 = float8_e5m2 (converted to q's
//                           type in shared memory: include/flashinfer/attention/prefill.cuh;
//                           head_dim 64, 128, 256 with FI_HEAD_DIM_VO = FI_HEAD_DIM)
//   FI_HEAD_DIM             64, 128, 192, 256, 512 (q and k)
//   FI_HEAD_DIM_VO          v and the output: FI_HEAD_DIM, or 128 at 192 (default FI_HEAD_DIM)
//   FI_MASK_MODE            0 none, 1 causal, 2 custom (attn::MaskMode)
//   FI_POS_ENCODING         0 none, 1 RoPE (llama), 2 ALiBi (attn::PosEncoding)
//   FI_PAGED                0 ragged KV, 1 paged KV
// The CTA shapes, and what a launch of one runs, are include/flashinfer/attention/launch.cuh's.
// Exported: `run` (q, k, v, o, lse and the run-time parameter record: attention_utils.h),
// `cta_tile_q` (the packed-row tile of each CTA shape, 0 where the variant lacks the shape),
// `cluster_capacity` (whether a batch-1 split decode merges within clusters: tests,
// benchmarks), `run_params_version`, and with the trace probe compiled in, `trace_copy`.
#include <flashinfer/attention/launch.cuh>

#include <type_traits>

#include "attention_utils.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;
using namespace flashinfer::attn;
using tvm::ffi::Optional;

namespace {

template <int V>
using DTypeOf = std::conditional_t<
    V == 0, __half,
    std::conditional_t<V == 1, __nv_bfloat16,
                       std::conditional_t<V == 2, __nv_fp8_e4m3, __nv_fp8_e5m2>>>;

using DTypeQ = DTypeOf<FI_DTYPE_Q>;
using DTypeKV = DTypeOf<FI_DTYPE_KV>;
using DTypeO = DTypeOf<FI_DTYPE_O>;
constexpr int kHeadDim = FI_HEAD_DIM;
#ifndef FI_HEAD_DIM_VO
#define FI_HEAD_DIM_VO FI_HEAD_DIM
#endif
constexpr int kHeadDimVO = FI_HEAD_DIM_VO;
constexpr MaskMode kMask = static_cast<MaskMode>(FI_MASK_MODE);
constexpr PosEncoding kPos = static_cast<PosEncoding>(FI_POS_ENCODING);
constexpr bool kPaged = FI_PAGED != 0;
static_assert(FI_DTYPE_Q <= 1 && FI_DTYPE_O <= 1, "q and o are float16 or bfloat16");
using Launch = AttentionLaunch<DTypeQ, DTypeKV, DTypeO, kHeadDim, kHeadDimVO, kMask, kPos, kPaged>;

void check_cta(int64_t cta) {
  TVM_FFI_CHECK(cta >= 0 && cta < kNumCtaShapes, ValueError)
      << "cta must be 0 to " << kNumCtaShapes - 1 << ", got " << cta;
}

}  // namespace

/// The packed-row tile of CTA shape `cta` (0 where the module lacks that shape).
int64_t cta_tile_q(int64_t cta) {
  check_cta(cta);
  return Launch::tile_q(cta);
}

int64_t run_params_version() { return kRunParamsVersion; }

void run(TensorView q, TensorView k, TensorView v, TensorView o, Optional<TensorView> lse,
         TensorView params) {
  // 1. Validate: the record, the call's tensors, the plan's choices.
  const RunRecord rec = check_run_params(params, q);
  const KVView kv = check_attention_inputs(q, k, v, o, lse, rec[kKvLayout], kPaged, kHeadDim,
                                           kHeadDimVO, dtype_code<DTypeQ>(), dtype_code<DTypeKV>(),
                                           dtype_code<DTypeO>());
  const int64_t cta = rec[kCta], grid_x = rec[kGridX], cap = rec[kItemCapacity];
  check_cta(cta);
  if (cta == kCtaSm90) {
    TVM_FFI_CHECK(Launch::kHasSm90, ValueError)
        << "cta 3 (the Hopper kernel) takes head_dim 64, 128 or 256 (head_dim_vo equal) or "
        << "192 / 128 without "
        << "in-kernel RoPE and K/V of q's dtype; this module is head_dim " << kHeadDim
        << ", head_dim_vo " << kHeadDimVO << ", pos_encoding " << int(kPos) << ", kv dtype "
        << dtype_code_name(dtype_code<DTypeKV>());
    TVM_FFI_CHECK(device_has_sm90(q.device().device_id), ValueError)
        << "cta 3 (the Hopper kernel) needs a compute capability 9.0 GPU";
  }
  TVM_FFI_CHECK(cta != 5 || Launch::kHasCta5, ValueError)
      << "cta 5 (eight key streams) takes head_dim <= 128; this module is head_dim " << kHeadDim;
  // The FA2 kernels take the first item of CTA blockIdx.x without a bound check.
  TVM_FFI_CHECK(grid_x >= 0 && (cta == kCtaSm90 || grid_x <= cap), ValueError)
      << "params.grid_x (" << grid_x << ") must be in [0, item_capacity = " << cap << "]";
  const bool cluster_merge = rec[kClusterMerge] != 0;
  TVM_FFI_CHECK(!cluster_merge || (rec[kSplitKv] != 0 && grid_x == cap), ValueError)
      << "cluster_merge needs a split-KV plan with one CTA per item (grid_x " << grid_x
      << ", item_capacity " << cap << ")";
  AttentionParams p = {};
  fill_tensor_params(p, q, o, lse, kv);
  fill_record_params(p, rec, kPaged);
  if constexpr (kMask == MaskMode::kCustom) {
    TVM_FFI_CHECK(p.custom_mask != nullptr && p.mask_indptr != nullptr, ValueError)
        << "this module was built for a custom mask: params.custom_mask and mask_indptr are "
        << "required";
  }
  if constexpr (kPos == PosEncoding::kAlibi) {
    TVM_FFI_CHECK(p.alibi_slopes != nullptr, ValueError)
        << "this module was built for ALiBi: params.alibi_slopes is required";
  }
  fill_scalar_params(p, rec.real(kSmScale), rec.real(kLogitsSoftCap), rec.real(kOScale),
                     rec.real(kRopeScale), rec.real(kRopeTheta), rec[kWindowLeft]);

  // 2. Device and stream.
  tvm::ffi::CUDADeviceGuard guard(q.device().device_id);
  cudaStream_t stream = get_stream(q.device());

  // 3. Launch (attention, and the split-KV merge where the kernel does not merge).
  // Ragged k (N, Hkv, D) NHD / (Hkv, N, D) HND: N rows (v has k's rows, checked above).
  const int64_t kv_tokens = kPaged ? 0 : k.size(rec[kKvLayout] == 1 ? 1 : 0);
  const LaunchChoice choice{int(cta),  int(grid_x), cluster_merge, rec[kSm90TmaQ] != 0,
                            q.size(0), kv_tokens,   rec[kNumRows]};
  check_launch(Launch::run(p, choice, rec[kEnablePdl] != 0, stream), "attention");
}

/// Clusters of `cluster_size` CTAs of shape `cta` that one wave holds on the current device
/// (minus the CUDA error code where the query is refused; 0 for a shape without the cluster
/// merge).
int64_t cluster_capacity(int64_t cta, int64_t cluster_size) {
  TVM_FFI_CHECK(cluster_size >= 1 && cluster_size <= 16, ValueError)
      << "cluster_size must be 1 to 16, got " << cluster_size;
  return Launch::cluster_capacity(cta, int(cluster_size));
}

#if FLASHINFER_ATTENTION_PROBE_TRACE
/// The trace probe's stamps into `out`, int64 [kTraceCtas, kTraceSlots] on the host
/// (include/flashinfer/attention/common.cuh; benchmarks/probes/trace_decode.py).
void trace_copy(TensorView out) {
  check_trace_tensor(out, kTraceCtas, kTraceSlots);
  check_launch(cudaMemcpyFromSymbol(out.data_ptr(), attention_trace, sizeof(attention_trace)),
               "trace copy");
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(trace_copy, trace_copy);
#endif
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, run);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cluster_capacity, cluster_capacity);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cta_tile_q, cta_tile_q);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run_params_version, run_params_version);

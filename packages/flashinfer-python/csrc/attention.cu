// TVM-FFI binding of the tensor-core attention kernel (include/flashinfer/attention/prefill.cuh)
// for ONE variant, chosen at compile time by the -D flags that flashinfer/jit/attention.py
// derives from its variant dataclass:
//   FI_DTYPE_Q, FI_DTYPE_O  0 = float16, 1 = bfloat16
//   FI_HEAD_DIM             64, 128, 256
//   FI_MASK_MODE            0 none, 1 causal, 2 custom (attn::MaskMode)
//   FI_POS_ENCODING         0 none, 1 RoPE (llama), 2 ALiBi (attn::PosEncoding)
//   FI_PAGED                0 ragged KV, 1 paged KV
// The module holds five CTA shapes of the FA2 kernel and, where the variant allows it, the
// Hopper kernel (the plan picks one per batch), and the split-KV merge. Exported: `run`
// (attention, then the merge kernel when the plan splits KV and the kernel does not merge its
// own partial states: the FA2 shapes do, given merge_counters) and `cta_tile_q`.
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/prefill_sm90.cuh>
#include <flashinfer/cascade.cuh>

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <type_traits>

#include "attention_utils.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer::ffi_utils;
using namespace flashinfer::attn;
using tvm::ffi::Optional;

namespace {

template <int V>
using DTypeOf = std::conditional_t<V == 0, __half, __nv_bfloat16>;

using DTypeQ = DTypeOf<FI_DTYPE_Q>;
using DTypeO = DTypeOf<FI_DTYPE_O>;
constexpr int kHeadDim = FI_HEAD_DIM;
constexpr MaskMode kMask = static_cast<MaskMode>(FI_MASK_MODE);
constexpr PosEncoding kPos = static_cast<PosEncoding>(FI_POS_ENCODING);
constexpr bool kPaged = FI_PAGED != 0;

template <int WQ, int WKV, int MQ, int MKV, int STAGES = FLASHINFER_ATTENTION_STAGES>
using Traits =
    KernelTraits<DTypeQ, DTypeO, kHeadDim, kMask, kPos, kPaged, WQ, WKV, MQ, MKV, STAGES>;

// CTA shapes (the `cta` argument of run; flashinfer/attention_plan.py mirrors this table):
//   0: 16 rows,  1 x 4 warps (decode, short queries), 16-key steps
//   1: 64 rows,  4 x 1 warps, one 16-row MMA tile per warp
//   2: 128 rows, 4 x 1 warps, two MMA tiles per warp (head_dim <= 128: register budget)
//   3: the Hopper kernel (below)
//   4: 16 rows,  1 x 2 warps: shape 0 with two key streams (decode batches of 2-4 CTAs per SM)
//   5: 16 rows,  1 x 8 warps: shape 0 with eight key streams, one CTA per SM (small and split
//      decode batches; head_dim <= 128: shared memory)
// KV step: 64 keys for head_dim <= 128, 32 for 256 (shared memory: two stages of K and V).
constexpr int kStepKV = kHeadDim <= 128 ? 4 : 2;
// Split KV over one query tile (batch-1 decode) merged within a thread-block cluster per KV
// head (0: as other split plans, by the last CTA's count; a switch for tune_attention.py).
#ifndef FLASHINFER_ATTENTION_CLUSTER_MERGE
#define FLASHINFER_ATTENTION_CLUSTER_MERGE 1
#endif
// Shape knobs (FLASHINFER_ATTENTION_CTA{0,1,2}_*) for benchmarks/tune_attention.py, which
// compiles variants side by side.
#ifndef FLASHINFER_ATTENTION_CTA0_WARPS_KV
#define FLASHINFER_ATTENTION_CTA0_WARPS_KV 4
#endif
#ifndef FLASHINFER_ATTENTION_CTA0_MMA_KV
#define FLASHINFER_ATTENTION_CTA0_MMA_KV 1
#endif
// Decode streams K/V with one tile ahead per stream (68 KB of shared memory; its ~220 registers
// per thread hold it at two CTAs per SM either way). Against three stages, H100, pages in
// order: 64 x 4096 352.5 vs 356.1 us, 128 x 8192 1374 vs 1401 us, CUDA-graph 1 x 32768 56.6 vs
// 58.6 us (benchmarks/NOTES.md): fewer bytes in flight per stream read faster.
#ifndef FLASHINFER_ATTENTION_CTA0_STAGES
#define FLASHINFER_ATTENTION_CTA0_STAGES 2
#endif
using Cta0 = Traits<1, FLASHINFER_ATTENTION_CTA0_WARPS_KV, 1, FLASHINFER_ATTENTION_CTA0_MMA_KV,
                    FLASHINFER_ATTENTION_CTA0_STAGES>;
// Half the warps, so four CTAs per SM fit the registers: a decode batch of 2-4 CTAs per SM runs
// in one wave instead of two (H100, 64 x 4096 at 8 KV heads: 348.9 vs 351.2 us; it loses on
// larger and split batches, whose shape stays 0: benchmarks/NOTES.md).
using Cta4 = Traits<1, 2, 1, FLASHINFER_ATTENTION_CTA0_MMA_KV, FLASHINFER_ATTENTION_CTA0_STAGES>;
// Twice the warps, one CTA per SM (registers; 195 KB of shared memory at head_dim 128): twice
// the bytes in flight per CTA for batches that fill at most one CTA per SM, split or not (H100,
// against shape 0 at two per SM: 1 x 32768 55.0 vs 56.3 us, 1 x 131072 183.6 vs 186.2, 16 x
// 4096 95.3 vs 97.7, 4 x 16384 equal; benchmarks/NOTES.md). head_dim 256 needs twice the
// shared memory: there Cta5 names shape 4 as a stand-in that is never launched.
// flashinfer/attention_plan.py (choose_cta) mirrors this rule.
constexpr bool kHasCta5 = kHeadDim <= 128;
using Cta5 = Traits<1, kHasCta5 ? 8 : 2, 1, FLASHINFER_ATTENTION_CTA0_MMA_KV,
                    FLASHINFER_ATTENTION_CTA0_STAGES>;
#ifndef FLASHINFER_ATTENTION_CTA1_MMA_KV
#define FLASHINFER_ATTENTION_CTA1_MMA_KV kStepKV
#endif
using Cta1 = Traits<4, 1, 1, FLASHINFER_ATTENTION_CTA1_MMA_KV>;
// Two MMA tiles per warp hold 2 x head_dim/8 x 4 accumulators: 32-key steps keep S small
// enough that almost nothing spills at head_dim 128 (64-key steps spill 168 bytes and run 40%
// slower: benchmarks/results/*-tune-attention.json).
#ifndef FLASHINFER_ATTENTION_CTA2_MMA_KV
#define FLASHINFER_ATTENTION_CTA2_MMA_KV (kHeadDim == 128 ? 2 : kStepKV)
#endif
#ifndef FLASHINFER_ATTENTION_CTA2_WARPS_Q  // with CTA2_MMA_Q: warps x 16-row tiles = 128 rows
#define FLASHINFER_ATTENTION_CTA2_WARPS_Q 4
#endif
#ifndef FLASHINFER_ATTENTION_CTA2_MMA_Q
#define FLASHINFER_ATTENTION_CTA2_MMA_Q (kHeadDim <= 128 ? 2 : 1)
#endif
using Cta2 = Traits<FLASHINFER_ATTENTION_CTA2_WARPS_Q, 1, FLASHINFER_ATTENTION_CTA2_MMA_Q,
                    FLASHINFER_ATTENTION_CTA2_MMA_KV>;

// 3: the Hopper kernel (wgmma, 128 rows, sm_90 only): head_dim 64/128, no in-kernel RoPE.
// flashinfer/jit/attention.py (AttentionVariant.has_sm90) mirrors this rule.
constexpr bool kHasSm90 =
    (kHeadDim == 64 || kHeadDim == 128) && kPos != PosEncoding::kRopeLlama;
// Where the module has no Hopper kernel, Cta3 names a valid stand-in that is never launched.
using Cta3 = Sm90Traits<DTypeQ, DTypeO, kHasSm90 ? kHeadDim : 128, kMask,
                        kHasSm90 ? kPos : PosEncoding::kNone, kPaged>;
constexpr int kNumCta = 6;

int tile_q(int64_t cta) {
  switch (cta) {
    case 0: return Cta0::kTileQ;
    case 1: return Cta1::kTileQ;
    case 2: return Cta2::kTileQ;
    case 3: return kHasSm90 ? Cta3::kTileQ : 0;
    case 4: return Cta4::kTileQ;
    case 5: return kHasCta5 ? Cta5::kTileQ : 0;
  }
  return 0;
}

// Tuning switch: 1 = Q through the TMA where the plan asks for it (AttentionPlan.sm90_tma_q),
// 0 = never, 2 = always (benchmarks/tma_q_sweep.py); where q's layout allows.
#ifndef FLASHINFER_ATTENTION_SM90_TMA_Q
#define FLASHINFER_ATTENTION_SM90_TMA_Q 1
#endif

/// The driver's cuTensorMapEncodeTiled (through the runtime: no link against libcuda), or null.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn,
                                                             12000, cudaEnableDefault, &found);
#else  // toolkits 12.0 - 12.4 have only the unversioned query
    const cudaError_t err =
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

/// Q's tensor map for the Hopper kernel (Sm90Q), where the plan asks for one (`wanted`:
/// AttentionPlan.sm90_tma_q) and the layout allows it: the group size divides the 128-row
/// tile, and the base and strides are 16-byte multiples (any q the bindings take otherwise
/// loads with cp.async).
Sm90Q sm90_q(const AttentionParams& p, int64_t num_tokens, bool wanted) {
  Sm90Q qm = {};
  const int64_t g = p.group_size, bytes = sizeof(DTypeQ);
  const bool use =
      FLASHINFER_ATTENTION_SM90_TMA_Q == 2 || (FLASHINFER_ATTENTION_SM90_TMA_Q == 1 && wanted);
  if (!use || !kHasSm90 || num_tokens <= 0 ||
      128 % g != 0 || reinterpret_cast<uintptr_t>(p.q) % 16 != 0 ||
      (p.q_stride_h * bytes) % 16 != 0 || (p.q_stride_n * bytes) % 16 != 0) {
    return qm;
  }
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return qm;
  const cuuint64_t dims[3] = {cuuint64_t(kHeadDim), cuuint64_t(p.num_qo_heads),
                              cuuint64_t(num_tokens)};
  const cuuint64_t strides[2] = {cuuint64_t(p.q_stride_h * bytes),
                                 cuuint64_t(p.q_stride_n * bytes)};
  const cuuint32_t box[3] = {64, cuuint32_t(g), cuuint32_t(128 / g)};
  const cuuint32_t steps[3] = {1, 1, 1};
  const CUtensorMapDataType type = std::is_same_v<DTypeQ, __half>
                                       ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  qm.tma = encode(&qm.map, type, 3, const_cast<void*>(p.q), dims, strides, box, steps,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  return qm;
}

/// Launches the Hopper kernel; only instantiated (compiled) where the module has one.
template <bool kOn = kHasSm90>
cudaError_t launch_sm90(const AttentionParams& p, int64_t num_tokens, bool tma_q, int grid_x,
                        bool enable_pdl, cudaStream_t stream) {
  if constexpr (kOn) {
    return LaunchAttentionSm90<Cta3>(p, sm90_q(p, num_tokens, tma_q), grid_x, enable_pdl,
                                     stream);
  } else {
    return cudaErrorInvalidValue;
  }
}

/// The Hopper kernel runs on compute capability 9.0 only (wgmma is sm_90a's).
void check_sm90_device(int device_id) {
  TVM_FFI_CHECK(kHasSm90, ValueError)
      << "cta 3 (the Hopper kernel) takes head_dim 64 or 128 without in-kernel RoPE; this "
      << "module is head_dim " << kHeadDim << ", pos_encoding " << int(kPos);
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id);
  TVM_FFI_CHECK(major == 9 && minor == 0, ValueError)
      << "cta 3 (the Hopper kernel) needs a compute capability 9.0 GPU, got " << major << "."
      << minor;
}

}  // namespace

/// The packed-row tile of CTA shape `cta` (0 where the module lacks that shape).
int64_t cta_tile_q(int64_t cta) {
  TVM_FFI_CHECK(cta >= 0 && cta < kNumCta, ValueError) << "cta must be 0 to 5, got " << cta;
  return tile_q(cta);
}

void run(int64_t cta, int64_t grid_x, TensorView q, TensorView k, TensorView v, TensorView o,
         Optional<TensorView> lse, int64_t kv_layout, TensorView qo_indptr, TensorView kv_indptr,
         Optional<TensorView> kv_indices, Optional<TensorView> kv_last_page_len,
         TensorView plan, int64_t item_capacity, bool split_kv, bool cluster_merge,
         bool sm90_tma_q, Optional<TensorView> o_part,
         Optional<TensorView> lse_part, int64_t num_rows,
         Optional<TensorView> merge_counters, Optional<TensorView> custom_mask,
         Optional<TensorView> mask_indptr, Optional<TensorView> alibi_slopes, double sm_scale,
         double logits_soft_cap, double o_scale, double rope_scale, double rope_theta,
         int64_t window_left, bool enable_pdl) {
  // 1. Validate.
  TVM_FFI_CHECK(cta >= 0 && cta < kNumCta, ValueError) << "cta must be 0 to 5, got " << cta;
  if (cta == 3) check_sm90_device(q.device().device_id);
  TVM_FFI_CHECK(cta != 5 || kHasCta5, ValueError)
      << "cta 5 (eight key streams) takes head_dim <= 128; this module is head_dim " << kHeadDim;
  AttentionParams p = {};
  const KVView kv = check_attention_inputs(q, k, v, o, lse, kv_layout, kPaged, kHeadDim,
                                           dtype_code<DTypeQ>(), dtype_code<DTypeO>());
  fill_tensor_params(p, q, o, lse, kv);
  fill_batch_params(p, q, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kPaged);
  fill_plan_params(p, q, plan, item_capacity, split_kv, o_part, lse_part, num_rows, kHeadDim);
  // The FA2 kernels take the first item of CTA blockIdx.x without a bound check.
  TVM_FFI_CHECK(cta == 3 || grid_x <= item_capacity, ValueError)
      << "grid_x (" << grid_x << ") must not exceed item_capacity (" << item_capacity << ")";
  // The FA2 kernels merge split-KV partial states themselves; the Hopper kernel's are merged
  // by the merge kernel below.
  if (FLASHINFER_ATTENTION_FUSED_MERGE && split_kv && merge_counters.has_value() && cta != 3)
    fill_merge_counters(p, q, *merge_counters, item_capacity);
  // cluster_merge: the plan's items are the chunks of one query tile, one per CTA of each KV
  // head; the decode shapes then merge them within a cluster where one wave holds the clusters
  // (LaunchAttention says whether it did), the others as without it.
  TVM_FFI_CHECK(!cluster_merge || (split_kv && grid_x == item_capacity), ValueError)
      << "cluster_merge needs a split-KV plan with one CTA per item (grid_x " << grid_x
      << ", item_capacity " << item_capacity << ")";
  p.cluster_merge = FLASHINFER_ATTENTION_CLUSTER_MERGE && cluster_merge && cta != 3;
  if constexpr (kMask == MaskMode::kCustom) {
    TVM_FFI_CHECK(custom_mask.has_value() && mask_indptr.has_value(), ValueError)
        << "this module was built for a custom mask: custom_mask and mask_indptr are required";
    fill_mask_params(p, q, *custom_mask, *mask_indptr);
  }
  if constexpr (kPos == PosEncoding::kAlibi) {
    TVM_FFI_CHECK(alibi_slopes.has_value(), ValueError)
        << "this module was built for ALiBi: alibi_slopes is required";
    fill_alibi_params(p, q, *alibi_slopes);
  }
  fill_scalar_params(p, sm_scale, logits_soft_cap, o_scale, rope_scale, rope_theta, window_left);

  // 2. Device and stream.
  tvm::ffi::CUDADeviceGuard guard(q.device().device_id);
  cudaStream_t stream = get_stream(q.device());

  // 3. Launch: attention, then the merge of the split-KV partial states.
  cudaError_t status = cudaErrorInvalidValue;
  switch (cta) {
    case 0: status = LaunchAttention<Cta0>(p, int(grid_x), enable_pdl, stream); break;
    case 1: status = LaunchAttention<Cta1>(p, int(grid_x), enable_pdl, stream); break;
    case 2: status = LaunchAttention<Cta2>(p, int(grid_x), enable_pdl, stream); break;
    case 3:
      status = launch_sm90(p, q.size(0), sm90_tma_q, int(grid_x), enable_pdl, stream);
      break;
    case 4: status = LaunchAttention<Cta4>(p, int(grid_x), enable_pdl, stream); break;
    case 5: status = LaunchAttention<Cta5>(p, int(grid_x), enable_pdl, stream); break;
  }
  check_launch(status, "attention");
  if (split_kv && p.merge_counters == nullptr && !p.cluster_merge) {
    status = flashinfer::cascade::MergeStatesVarlen<DTypeO>(
        p.o_part, p.lse_part, p.merge_indptr, static_cast<DTypeO*>(p.o), p.lse, num_rows,
        p.num_qo_heads, kHeadDim, p.o_stride_n, p.o_stride_h, enable_pdl, stream);
    check_launch(status, "attention split-KV merge");
  }
}

/// Clusters of `cluster_size` CTAs of shape `cta` that one wave holds on the current device
/// (minus the CUDA error code where the query is refused; 0 for a shape without the cluster
/// merge): whether a batch-1 split decode merges within clusters (tests, benchmarks).
int64_t cluster_capacity(int64_t cta, int64_t cluster_size) {
  TVM_FFI_CHECK(cluster_size >= 1 && cluster_size <= 16, ValueError)
      << "cluster_size must be 1 to 16, got " << cluster_size;
  auto query = [&](auto traits) -> int64_t {
    using KT = decltype(traits);
    if constexpr (!KT::kClusterMerge) {
      return 0;
    } else {
      auto kernel = attention_kernel<KT>;
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(KT::kSmemBytes));
      const int n = flashinfer::attn::max_active_clusters(kernel, unsigned(cluster_size),
                                                          dim3(KT::kThreads), KT::kSmemBytes);
      cudaGetLastError();
      return n;
    }
  };
  switch (cta) {
    case 0: return query(Cta0{});
    case 4: return query(Cta4{});
    case 5: return kHasCta5 ? query(Cta5{}) : 0;
    default: return 0;
  }
}

#if FLASHINFER_ATTENTION_PROBE_TRACE
/// The trace probe's stamps into `out`, int64 [kTraceCtas, kTraceSlots] on the host
/// (include/flashinfer/attention/common.cuh; benchmarks/trace_decode.py).
void trace_copy(TensorView out) {
  using namespace flashinfer::attn;
  TVM_FFI_CHECK(out.ndim() == 2 && out.size(0) == kTraceCtas && out.size(1) == kTraceSlots &&
                    out.dtype().bits == 64,
                ValueError)
      << "trace_copy takes an int64 tensor [" << kTraceCtas << ", " << int(kTraceSlots) << "]";
  check_launch(cudaMemcpyFromSymbol(out.data_ptr(), attention_trace, sizeof(attention_trace)),
               "trace copy");
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(trace_copy, trace_copy);
#endif
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, run);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cluster_capacity, cluster_capacity);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cta_tile_q, cta_tile_q);

// Launch policy of the attention kernels, stated once: the CTA shapes a plan chooses among, what
// each shape is for one compiled variant, and what a launch of a shape runs (the kernel, the
// Q tensor map of the Hopper kernel, the split-KV merge). The binding (csrc/attention.cu) checks
// the arguments and calls AttentionLaunch<...>::run. flashinfer/attention/plan.py chooses the
// shape per batch; the tile of each shape and whether the variant has it are read from the
// compiled module (cta_tile_q), and tests/test_attention_layout.py holds plan.py's table to it.
// Numeric tuning parameters: tuning.cuh.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "../cascade.cuh"
#include "params.cuh"
#include "prefill.cuh"
#include "prefill_sm90.cuh"
#include "tuning.cuh"

namespace flashinfer {
namespace attn {

/// CTA shapes (the plan's `cta`):
///   0: 16 rows,  1 x 4 warps (decode, short queries), 16-key steps
///   1: 64 rows,  4 x 1 warps, one 16-row MMA tile per warp
///   2: 128 rows, 4 x 1 warps, two MMA tiles per warp (head_dim <= 128: register budget)
///   3: the Hopper kernel (wgmma, 128 rows, sm_90 only): head_dim 64/128/256 and 192 / 128,
///      no in-kernel RoPE
///   4: 16 rows,  1 x 2 warps: shape 0 with two key streams (decode batches of 2-4 CTAs per SM)
///   5: 16 rows,  1 x 8 warps: shape 0 with eight key streams, one CTA per SM (small and split
///      decode batches; head_dim <= 128: shared memory)
inline constexpr int kNumCtaShapes = 6;
inline constexpr int kCtaSm90 = 3;

/// The driver's cuTensorMapEncodeTiled (through the runtime: no link against libcuda), or null.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
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

/// Whether `device_id` runs the Hopper kernel (compute capability 9.0: wgmma is sm_90a's).
inline bool device_has_sm90(int device_id) {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id);
  return major == 9 && minor == 0;
}

/// Whether a CTA of the current device may take `bytes` of dynamic shared memory (the opt-in
/// limit: 227 KB on sm_90 and sm_100, 163 KB on sm_80, 99 KB on sm_86/89/120), asked once per
/// device.
inline bool device_smem_fits(size_t bytes) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];  // opt-in bytes + 1; 0 unknown
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= kMaxDevices) return false;
  int optin = known[device].load(std::memory_order_relaxed) - 1;
  if (optin < 0) {
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
        cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    known[device].store(optin + 1, std::memory_order_relaxed);
  }
  return bytes <= size_t(optin);
}

/// What a launch takes besides AttentionParams: the plan's choices for this launch.
struct LaunchChoice {
  int cta;             // CTA shape (above)
  int grid_x;          // CTAs per KV head (FA2 shapes) or the persistent grid (cta 3)
  bool cluster_merge;  // split KV over one query tile, merged within a cluster where it fits
  bool sm90_tma_q;     // the Hopper kernel loads Q through a TMA tensor map (where allowed)
  int64_t num_tokens;  // q's rows (the Q tensor map's extent)
  int64_t num_kv_tokens;  // ragged k's and v's rows (their tensor maps' extent; 0 if paged)
  int64_t num_rows;    // query rows the split-KV merge writes (merge_indptr has one more)
};

/*!
 * @brief The CTA shapes of one compiled attention variant and their launch.
 * @tparam DTypeQ q element type; DTypeKV k and v's (DTypeQ or fp8); DTypeO the output's
 * @tparam kHeadDim q and k head dim; kHeadDimVO v and output head dim
 *
 * Head dims past 256 (512). A warp computes at most 256 output columns: a 16-row MMA tile of
 * 512 would hold 256 fp32 accumulators per thread, past the 255 registers a thread has. Two
 * groups of warps in one CTA split the channels of S and the output columns, their partial S
 * tiles summed through shared memory (KernelTraits::kVoGroups). Shared memory per CTA (each
 * group: K and V tiles 256 wide): decode (shape 0) takes two key streams, 16 KB of Q +
 * 2 streams x 2 groups x 2 stages x 16 keys x 512 B + 8 KB of partial S = 152 KB; the 64-row
 * shapes take 16-key steps, 64 KB of Q + 2 groups x 2 stages x 16 keys x 1 KB + 16 KB =
 * 144 KB, or shape 1 32-key steps where the device allows 224 KB (sm_90; past sm_80's
 * 164 KB: Cta1Wide). One CTA per SM (8 or 4 warps).
 * Registers: 128 accumulators per thread, as at head_dim 256.
 */
template <typename DTypeQ, typename DTypeKV, typename DTypeO, int kHeadDim, int kHeadDimVO,
          MaskMode kMask, PosEncoding kPos, bool kPaged>
struct AttentionLaunch {
  template <int WQ, int WKV, int MQ, int MKV, int STAGES = FLASHINFER_ATTENTION_STAGES>
  using Traits = KernelTraits<DTypeQ, DTypeKV, DTypeO, kHeadDim, kHeadDimVO, kMask, kPos, kPaged,
                              WQ, WKV, MQ, MKV, STAGES>;

  static constexpr int kCta0WarpsKV =
      kHeadDim <= 256 ? FLASHINFER_ATTENTION_CTA0_WARPS_KV
                      : FLASHINFER_ATTENTION_CTA0_WARPS_KV_WIDE;
  // The 16-row shapes (0, 4, 5) over fp8 K/V converted in registers (head_dim 128, no in-kernel
  // RoPE: KernelTraits::kRegKV) take 32-key steps (tuning.cuh); the others 16.
  static constexpr bool kRegKV = !std::is_same_v<DTypeQ, DTypeKV> && kHeadDim == 128 &&
                                 kHeadDimVO == 128 && kPos != PosEncoding::kRopeLlama;
  static constexpr int kCta0MmaKV =
      kRegKV ? FLASHINFER_ATTENTION_CTA0_MMA_KV_FP8 : FLASHINFER_ATTENTION_CTA0_MMA_KV;
  using Cta0 = Traits<1, kCta0WarpsKV, 1, kCta0MmaKV,
                      FLASHINFER_ATTENTION_CTA0_STAGES>;
  using Cta1 = Traits<4, 1, 1, FLASHINFER_ATTENTION_CTA1_MMA_KV>;
  // head_dim 512 with column groups: shape 1 in FLASHINFER_ATTENTION_CTA1_MMA_KV_WIDE 16-key
  // steps where the device's shared memory takes them (sm_90: 224 KB, one CTA per SM), else
  // Cta1's 16-key steps (144 KB: sm_80). Same rows, so the plan does not see it.
  static constexpr bool kHasCta1Wide =
      Cta1::kVoGroups > 1 && FLASHINFER_ATTENTION_CTA1_MMA_KV_WIDE != Cta1::kMmaKV;
  using Cta1Wide = Traits<4, 1, 1, kHasCta1Wide ? FLASHINFER_ATTENTION_CTA1_MMA_KV_WIDE
                                                : FLASHINFER_ATTENTION_CTA1_MMA_KV>;
  using Cta2 = Traits<FLASHINFER_ATTENTION_CTA2_WARPS_Q, 1, FLASHINFER_ATTENTION_CTA2_MMA_Q,
                      FLASHINFER_ATTENTION_CTA2_MMA_KV, FLASHINFER_ATTENTION_CTA2_STAGES>;
  // Half the warps of shape 0, so four CTAs per SM fit the registers: a decode batch of 2-4
  // CTAs per SM runs in one wave instead of two (H100, 64 x 4096 at 8 KV heads: 348.9 vs 351.2
  // us; it loses on larger and split batches, whose shape stays 0: benchmarks/NOTES.md).
  using Cta4 = Traits<1, kRegKV ? FLASHINFER_ATTENTION_CTA4_WARPS_KV_FP8 : 2, 1, kCta0MmaKV,
                      FLASHINFER_ATTENTION_CTA0_STAGES>;
  // Twice the warps, one CTA per SM (registers; 195 KB of shared memory at head_dim 128): twice
  // the bytes in flight per CTA for batches that fill at most one CTA per SM, split or not
  // (H100, against shape 0 at two per SM: 1 x 32768 55.0 vs 56.3 us, 1 x 131072 183.6 vs 186.2,
  // 16 x 4096 95.3 vs 97.7, 4 x 16384 equal; benchmarks/NOTES.md). head_dim 256 needs twice
  // the shared memory: there Cta5 names shape 4 as a stand-in that is never launched.
  static constexpr bool kHasCta5 = kHeadDim <= 128;
  using Cta5 = Traits<1, kHasCta5 ? 8 : 2, 1, kCta0MmaKV,
                      FLASHINFER_ATTENTION_CTA0_STAGES>;
  static_assert(Cta0::kRegKV == kRegKV && Cta4::kRegKV == kRegKV && Cta5::kRegKV == kRegKV,
                "the 16-row shapes convert fp8 K/V in registers exactly where kRegKV says");
  // The Hopper kernel: head_dim 64/128/256 and 192 / 128 (MLA prefill; Sm90Traits sizes the
  // tiles per head dim), no in-kernel RoPE (it rotates K in shared memory, which only the FA2
  // kernel does), K/V of q's type: its TMA copies land in wgmma's operand layout, and wgmma
  // takes fp8 only with fp8 on both sides, so a half q over an fp8 cache would need a
  // conversion stage between the TMA and the wgmmas; fp8 K/V runs on the FA2 kernel, which
  // converts in registers or shared memory (decode, the bandwidth-bound case, is FA2's in any
  // case). Not head_dim 512: its O would be 256 fp32 registers per consumer thread (Sm90Traits).
  // Where the variant has none, Cta3 names a valid stand-in that is never launched.
  static constexpr bool kHasSm90 =
      ((kHeadDimVO == kHeadDim && (kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256)) ||
       (kHeadDim == 192 && kHeadDimVO == 128)) &&
      kPos != PosEncoding::kRopeLlama && std::is_same_v<DTypeQ, DTypeKV>;
  using Cta3 = Sm90Traits<DTypeQ, DTypeO, kHasSm90 ? kHeadDim : 128, kHasSm90 ? kHeadDimVO : 128,
                          kMask, kHasSm90 ? kPos : PosEncoding::kNone, kPaged>;

  /// Packed query rows per CTA of shape `cta`; 0 where this variant lacks the shape.
  static int tile_q(int64_t cta) {
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

  /// A 3-D tensor map (head_dim, heads, tokens) over `ptr` with 128-byte swizzle and box
  /// (64, box_heads, box_tokens), or false where the layout does not allow one: base and
  /// strides must be 16-byte multiples.
  template <typename T = DTypeQ>
  static bool encode_map(CUtensorMap* map, const void* ptr, int64_t head_dim, int64_t heads,
                         int64_t tokens, int64_t stride_h, int64_t stride_n, int box_heads,
                         int box_tokens) {
    static_assert(sizeof(T) == 2, "tensor maps of fp16 or bf16");
    const int64_t bytes = sizeof(T);
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr || tokens <= 0 || reinterpret_cast<uintptr_t>(ptr) % 16 != 0 ||
        (stride_h * bytes) % 16 != 0 || (stride_n * bytes) % 16 != 0 || stride_h <= 0 ||
        stride_n <= 0) {
      return false;
    }
    const cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(tokens)};
    const cuuint64_t strides[2] = {cuuint64_t(stride_h * bytes), cuuint64_t(stride_n * bytes)};
    const cuuint32_t box[3] = {64, cuuint32_t(box_heads), cuuint32_t(box_tokens)};
    const cuuint32_t steps[3] = {1, 1, 1};
    const CUtensorMapDataType type = std::is_same_v<T, __half>
                                         ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                         : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    // The L2 fetches 256 bytes per 128-byte box row only where every head's row is whole
    // 256-byte lines: at head_dim 192 (384-byte rows) every other line would be half of a
    // neighbouring head's row, fetched and not read (192 / 128 ragged 16 x 1024: DRAM reads
    // 2.44 -> 2.30 GB, L2 sectors from the SMs 248 -> 230 M, the peer's figure; Nsight Compute,
    // H100, benchmarks/notes/sm90-dynamic-claims.md).
    const bool whole_lines = (head_dim * bytes) % 256 == 0 && (stride_h * bytes) % 256 == 0 &&
                             (stride_n * bytes) % 256 == 0 &&
                             reinterpret_cast<uintptr_t>(ptr) % 256 == 0;
    const CUtensorMapL2promotion promotion =
        whole_lines ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    return encode(map, type, 3, const_cast<void*>(ptr), dims, strides, box, steps,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  }

  /// The Hopper kernel's tensor maps where the layout allows them (any q, k and v the binding
  /// takes otherwise load with cp.async). Ragged K and V always. Q where the group size
  /// divides the 128-row tile, and K/V come through the TMA or the plan asks for it (paged
  /// K/V by cp.async: TMA Q where a CTA takes many short items, plan.py). With TMA K/V, TMA Q
  /// measured faster on every case, long items included (H200, 4096: 264 vs 307 us, 16384:
  /// 3906 vs 4054; benchmarks/notes/sm90-tma-kv.md).
  static Sm90Maps sm90_maps(const AttentionParams& p, const LaunchChoice& c) {
    Sm90Maps tm = {};
    if (!kHasSm90) return tm;
    if constexpr (!kPaged) {
      tm.tma_kv = encode_map(&tm.k, p.k, kHeadDim, p.num_kv_heads, c.num_kv_tokens,
                             p.k_stride_h, p.k_stride_n, 1, Cta3::kTileKV) &&
                  encode_map(&tm.v, p.v, kHeadDimVO, p.num_kv_heads, c.num_kv_tokens,
                             p.v_stride_h, p.v_stride_n, 1, Cta3::kTileKV);
    }
    const int64_t g = p.group_size;
    const bool use_q = FLASHINFER_ATTENTION_SM90_TMA_Q == 2 ||
                       (FLASHINFER_ATTENTION_SM90_TMA_Q == 1 && (c.sm90_tma_q || tm.tma_kv));
    tm.tma_q = use_q && 128 % g == 0 &&
               encode_map(&tm.q, p.q, kHeadDim, p.num_qo_heads, c.num_tokens, p.q_stride_h,
                          p.q_stride_n, int(g), int(128 / g));
    // The output through TMA stores where a warp's 16 packed rows are whole tokens' heads and
    // the kernel writes the output itself (not split KV's partial states).
    if constexpr (sizeof(DTypeO) == 2) {
      tm.tma_o = FLASHINFER_ATTENTION_SM90_TMA_STORE != 0 && !p.split_kv && 16 % g == 0 &&
                 encode_map<DTypeO>(&tm.o, p.o, kHeadDimVO, p.num_qo_heads, c.num_tokens,
                                    p.o_stride_h, p.o_stride_n, int(g), int(16 / g));
    }
    return tm;
  }

  /*!
   * @brief One launch of shape `c.cta`, then the merge of the split-KV partial states where the
   *   kernel did not merge them itself. The FA2 shapes merge in the kernel (given
   *   p.merge_counters: the last CTA of a query tile to finish) or within a cluster (cluster
   *   merge, where a wave holds the clusters); the Hopper kernel's states go to the merge kernel.
   *   `p` must be filled but for the merge fields this sets.
   */
  static cudaError_t run(AttentionParams& p, const LaunchChoice& c, bool enable_pdl,
                         cudaStream_t stream) {
    // The merge kernel merges the Hopper kernel's split-KV states.
    if (c.cta == kCtaSm90) p.merge_counters = nullptr;
    p.cluster_merge = c.cluster_merge && c.cta != kCtaSm90;
    cudaError_t status = cudaErrorInvalidValue;
    switch (c.cta) {
      case 0: status = LaunchAttention<Cta0>(p, c.grid_x, enable_pdl, stream); break;
      case 1:
        if constexpr (kHasCta1Wide) {
          if (device_smem_fits(Cta1Wide::kSmemBytes)) {
            status = LaunchAttention<Cta1Wide>(p, c.grid_x, enable_pdl, stream);
            break;
          }
        }
        status = LaunchAttention<Cta1>(p, c.grid_x, enable_pdl, stream);
        break;
      case 2: status = LaunchAttention<Cta2>(p, c.grid_x, enable_pdl, stream); break;
      case 3: status = launch_sm90(p, c, enable_pdl, stream); break;
      case 4: status = LaunchAttention<Cta4>(p, c.grid_x, enable_pdl, stream); break;
      case 5:
        if constexpr (kHasCta5) status = LaunchAttention<Cta5>(p, c.grid_x, enable_pdl, stream);
        break;
    }
    if (status != cudaSuccess || !p.split_kv || p.merge_counters != nullptr || p.cluster_merge) {
      return status;
    }
    return cascade::MergeStatesVarlen<DTypeO>(p.o_part, p.lse_part, p.merge_indptr,
                                              static_cast<DTypeO*>(p.o), p.lse, c.num_rows,
                                              p.num_qo_heads, kHeadDimVO, p.o_stride_n,
                                              p.o_stride_h, enable_pdl, stream);
  }

  /// Clusters of `cluster_size` CTAs of shape `cta` that one wave holds on the current device
  /// (minus the CUDA error code where the query is refused; 0 for a shape without the cluster
  /// merge).
  static int64_t cluster_capacity(int64_t cta, int cluster_size) {
    auto query = [&](auto traits) -> int64_t {
      using KT = decltype(traits);
      if constexpr (!KT::kClusterMerge) {
        return 0;
      } else {
        auto kernel = attention_kernel<KT>;
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(KT::kSmemBytes));
        const int n = max_active_clusters(kernel, unsigned(cluster_size), dim3(KT::kThreads),
                                          KT::kSmemBytes);
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

 private:
  static cudaError_t launch_sm90(const AttentionParams& p, const LaunchChoice& c,
                                 bool enable_pdl, cudaStream_t stream) {
    if constexpr (kHasSm90) {
      return LaunchAttentionSm90<Cta3>(p, sm90_maps(p, c), c.grid_x, enable_pdl, stream);
    } else {
      return cudaErrorInvalidValue;
    }
  }
};

}  // namespace attn
}  // namespace flashinfer

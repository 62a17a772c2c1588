// The tensor-core attention kernel (FlashAttention-2 style, mma.sync m16n8k16), used for
// prefill over ragged or paged KV and for tensor-core decode.
//
// Rows. GQA queries are packed: the `group_size` query heads that share KV head h form the rows
// of one problem, packed row p = qo_idx * group_size + g. A CTA takes a tile of kTileQ packed
// rows of one request and one KV head, so a decode step with group size 4 fills 4 rows of a
// 16-row MMA tile and every key is read from shared memory once for all 4 heads.
//
// Warps. kWarpsQ warps split the rows (16 * kMmaQ each); kWarpsKV groups of them split the
// keys (group w takes KV tiles w, w + kWarpsKV, ...), each group with its own two-stage cp.async
// pipeline, and merge their softmax states through shared memory at the end. Prefill uses
// (4, 1): four warps share every K/V tile. Decode and short queries use (1, 4): one warp's 16
// rows would leave the memory system idle, four independent key streams keep it busy.
//
// Softmax. Online, in base 2: logits are pre-multiplied by log2(e) so exp2 is one instruction;
// the lse written out is log2(sum exp(logit)). Masked keys are -inf, and a row that sees no key
// at all ends with d = 0: it writes 0 and lse = -inf.
//
// Pipeline per KV tile j (kStages buffers, loads kAhead = kStages - 1 tiles ahead): look up the
// rows of tile j + kAhead -> wait K[j] -> S = Q K^T -> issue its K -> mask, softmax -> wait V[j]
// -> O += P V -> issue its V. Decode also gets bytes in flight from the kWarpsKV key streams.
#pragma once
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../launch.cuh"
#include "../vec.cuh"
#include "common.cuh"
#include "mma.cuh"
#include "params.cuh"
#include "tuning.cuh"

namespace flashinfer {
namespace attn {

/// Greatest common divisor (the loader's threads per row).
constexpr int gcd_int(int a, int b) { return b == 0 ? a : gcd_int(b, a % b); }

/*!
 * @brief Everything that is fixed at compile time for one attention kernel.
 * @tparam DTypeQ_ q element type (__half or __nv_bfloat16), the type of the MMAs
 * @tparam DTypeKV_ k and v element type: DTypeQ_, or __nv_fp8_e4m3 / __nv_fp8_e5m2 (converted
 *   in registers on the 16-row shapes at head_dim 128, kRegKV; to DTypeQ_ in shared memory
 *   elsewhere, kConvertKV)
 * @tparam DTypeO_ output element type
 * @tparam HEAD_DIM_ q and k head dim: 64, 128, 192, 256 or 512 (QK loads and MMAs)
 * @tparam HEAD_DIM_VO_ v and output head dim (PV and the output): HEAD_DIM_, or 128 at 192
 * @tparam PAGED_ paged KV cache (else ragged)
 * @tparam WARPS_Q_, WARPS_KV_ warps splitting rows, groups of warps splitting keys
 * @tparam MMA_Q_ 16-row MMA tiles per warp; MMA_KV_ 16-key MMA tiles per pipeline step
 * @tparam STAGES_ K/V tiles in flight per key stream at head_dim <= 128 (wider heads keep two)
 */
template <typename DTypeQ_, typename DTypeKV_, typename DTypeO_, int HEAD_DIM_, int HEAD_DIM_VO_,
          MaskMode MASK_, PosEncoding POS_, bool PAGED_, int WARPS_Q_, int WARPS_KV_, int MMA_Q_,
          int MMA_KV_, int STAGES_ = FLASHINFER_ATTENTION_STAGES>
struct KernelTraits {
  using DTypeQ = DTypeQ_;
  using DTypeKV = DTypeKV_;
  using DTypeO = DTypeO_;
  static constexpr int kHeadDim = HEAD_DIM_;
  static constexpr int kHeadDimVO = HEAD_DIM_VO_;
  // Output columns per warp: all of them up to 256. Wider outputs (head_dim 512) need 256 fp32
  // accumulators per thread for one 16-row MMA tile of 512 columns, so they are split in 256s.
  // kVoGroups (head_dim 512 = head_dim_vo): groups of warps of one CTA over the same rows,
  // group h taking Q and K channels [256 h, 256 h + 256) and output columns
  // [256 h, 256 h + 256): each computes a partial S over its channels, the partials are summed
  // through shared memory each step (the main loop), and each computes P V for its columns; no
  // MMA is duplicated and K is read once. (Two CTAs side by side, each computing S over all
  // 512 channels and P V for 256 columns, measured slower on the H200, same 16-key steps:
  // decode 519.0 vs 480.1 us, prefill 4404 vs 3440 us; benchmarks/notes/attention-wide-heads.md.)
  static constexpr int kVoTile = HEAD_DIM_VO_ <= 256 ? HEAD_DIM_VO_ : 256;
  static constexpr int kVoGroups = HEAD_DIM_VO_ / kVoTile;
  // Q and K channels of one group of warps (the whole head dim where kVoGroups is 1): the
  // width of its Q and K tiles in shared memory and of its S = Q K^T.
  static constexpr int kHeadDimG = HEAD_DIM_ / kVoGroups;
  using Tile = SwizzledTile<kHeadDimG>;
  using VTile = SwizzledTile<kVoTile>;
  static constexpr MaskMode kMask = MASK_;
  static constexpr PosEncoding kPos = POS_;
  static constexpr bool kPaged = PAGED_;
  static constexpr int kWarpsQ = WARPS_Q_;
  static constexpr int kWarpsKV = WARPS_KV_;
  static constexpr int kMmaQ = MMA_Q_;
  static constexpr int kMmaKV = MMA_KV_;
  static constexpr int kThreads = 32 * kWarpsQ * kWarpsKV * kVoGroups;
  static constexpr int kThreadsG = kThreads / kVoGroups;  // threads of one column group
  static constexpr int kGroupThreads = 32 * kWarpsQ;  // threads sharing one K/V pipeline
  static constexpr int kTileQ = 16 * kMmaQ * kWarpsQ;
  static constexpr int kTileKV = 16 * kMmaKV;
  static constexpr int kChunks = kHeadDimG / 8;
  static constexpr int kChunksVO = kVoTile / 8;
  // Q fragments stay in registers when they are few (decode, head_dim <= 128); otherwise they
  // are re-read from shared memory for each KV tile (the O accumulators need the registers).
  static constexpr bool kQInRegs = kMmaQ * kHeadDimG <= 128;
  // Tiles in flight per key stream (loads issued kAhead tiles ahead); wider heads keep two for
  // shared memory. fp8 K/V keep the same count: twice the tiles ahead on the fp8 decode shapes
  // measured no faster (H200, 64 x 4096: converted in shared memory 206.1 us against 206.6 at
  // one tile ahead; converted in registers, 32-key steps, 134.8 against 134.0 us), so bytes in
  // flight are not what limits fp8 decode (benchmarks/notes/attention-fp8-kv.md).
  static constexpr int kStages = HEAD_DIM_ <= 128 && kVoTile <= 128 ? STAGES_ : 2;
  static constexpr int kAhead = kStages - 1;
  static_assert(kStages >= 2, "the pipeline needs at least two stages");

  // fp8 K/V: the cp.async copies move fp8 bytes (16 per chunk) into a staging area of kStages
  // tiles per stream. Where kRegKV (below) does not apply, after its wait each thread converts
  // the chunks it copied itself (no extra barrier) into one DTypeQ K and one V tile per stream,
  // which the MMAs read as they read the half tiles. A tile is rewritten only after every warp of its group has passed the barrier
  // that follows its last read (the next tile's K or V wait), so one of each suffices.
  static constexpr bool kConvertKV = !std::is_same_v<DTypeKV, DTypeQ>;
  // The type of O += P V: q's, except over fp8 V, which is converted to half whatever q is (one
  // cvt per two values against four for bfloat16, on the decode kernel's critical issue slots;
  // every fp8 value is a half, and P in [0, 1] keeps more bits in half than in bfloat16).
  using DTypePV = std::conditional_t<kConvertKV, __half, DTypeQ>;
  static_assert(sizeof(DTypeKV) == sizeof(DTypeQ) || sizeof(DTypeKV) == 1,
                "kv is q's type or an fp8 type");
  // fp8 K/V at head_dim 64, 128 and 256 with v's head dim = k's (the host refuses the rest).
  static_assert(!kConvertKV || (HEAD_DIM_ <= 256 && HEAD_DIM_VO_ == HEAD_DIM_),
                "fp8 K/V takes head_dim 64, 128 or 256 with head_dim_vo = head_dim");
  static constexpr int kLoadElems = 16 / int(sizeof(DTypeKV));  // elements per 16-byte copy
  static constexpr int kLoadChunks = kHeadDimG / kLoadElems;    // copies per K row (of a group)
  static constexpr int kLoadChunksVO = kVoTile / kLoadElems;    // copies per V row (of a group)
  // fp8 K/V on the decode shapes at head_dim 128 (one warp of 16 rows per key stream, several
  // streams, no in-kernel RoPE): no DTypeQ tiles at all. Each lane reads the staged fp8 bytes
  // it needs for the MMAs with 16-byte shared loads and converts them in registers (one cvt per
  // two values): K's channels and V's output columns are permuted so that a lane's bytes are
  // contiguous (fp8_qk_regs, fp8_pv_regs), Q's fragments are loaded in the same channel order
  // and S = Q K^T runs in fp16 (a bfloat16 q is scaled by a power of two into fp16's range).
  // H200, 64 x 4096 (bf16 q, e4m3, 16-key steps): 159.3 us against 208.4 converting into
  // shared memory (benchmarks/notes/attention-fp8-kv.md).
  static constexpr bool kRegKV = kConvertKV && WARPS_Q_ == 1 && MMA_Q_ == 1 && WARPS_KV_ > 1 &&
                                 HEAD_DIM_ == 128 && HEAD_DIM_VO_ == 128 &&
                                 POS_ != PosEncoding::kRopeLlama;
  // DTypeQ K/V tiles per stream
  static constexpr int kHalfTiles = kConvertKV ? (kRegKV ? 0 : 1) : kStages;
  static constexpr size_t kStageSmem = kConvertKV ? size_t(kWarpsKV) * kStages * kTileKV *
                                                        (HEAD_DIM_ + kVoTile) * sizeof(DTypeKV)
                                                  : 0;

  // Q: one [kTileQ][kHeadDimG] tile per column group.
  static constexpr size_t kQSmem = size_t(kTileQ) * HEAD_DIM_ * sizeof(DTypeQ);
  static constexpr size_t kMergeSmem =
      kWarpsKV > 1 ? size_t(kVoGroups) * kWarpsKV * kTileQ * (kVoTile + 2) * sizeof(float) : 0;
  // The decode shapes can merge split KV within a cluster (cluster_merge): the CTA's final
  // partial state, [kTileQ][kVoTile] then [kTileQ] floats, after the key streams' merge area.
  // Not with column groups (head_dim 512: not planned for that shape).
  static constexpr size_t kClusterSmem = size_t(kTileQ) * (kVoTile + 1) * sizeof(float);
  // Per key stream and DTypeQ tile: a K tile [kTileKV][HEAD_DIM_], then a V tile
  // [kTileKV][kVoTile]; then the fp8 staging tiles. kRegKV's staging alone may be smaller than
  // the merge areas: it is padded to them (the cluster merge stays available).
  // (Per column group: kVoGroups x kWarpsKV key streams' tiles of kHeadDimG + kVoTile.)
  static constexpr size_t kKVSmem0 = size_t(kVoGroups) * kWarpsKV * kHalfTiles * kTileKV *
                                         (kHeadDimG + kVoTile) * sizeof(DTypeQ) +
                                     kStageSmem;
  static constexpr size_t kKVSmem = kRegKV && kKVSmem0 < kMergeSmem + kClusterSmem
                                        ? kMergeSmem + kClusterSmem
                                        : kKVSmem0;
  // kVoGroups > 1: the partial S tiles each thread hands to its peer in the other group, two
  // buffers (a tile is rewritten two steps later, behind the pair barrier of the step between),
  // after the K/V tiles (the merge areas may take those, never this).
  static constexpr int kXchgF4 = kMmaQ * 2 * kMmaKV;  // float4s of S per thread and step
  static constexpr size_t kXchgSmem =
      kVoGroups > 1 ? size_t(2) * kThreads * kXchgF4 * sizeof(float4) : 0;
  static constexpr size_t kXchgOffset = kQSmem + (kKVSmem > kMergeSmem ? kKVSmem : kMergeSmem);
  static constexpr size_t kSmemBytes = kXchgOffset + kXchgSmem;
  // A CTA takes at most 227 KB (sm_90): a tuning build past it would only fail at launch
  // (fp8 decode in 64-key steps on shape 5: 8 streams x 2 stages x 64 keys x 256 B = 256 KB).
  static_assert(kSmemBytes <= 227 * 1024, "shared memory: at most 227 KB per CTA");
  // kRegKV: Q's fp16 fragments kept in shared memory over the Q tile, not in registers
  // (FLASHINFER_ATTENTION_FP8_Q_SMEM; they fill it exactly: 8 steps x 32 lanes x 16 bytes).
  static constexpr bool kFp8QSmem = kRegKV && FLASHINFER_ATTENTION_FP8_Q_SMEM;
  static_assert(!kFp8QSmem || kQSmem == 8 * 32 * 16, "Q's fragments fill the Q tile");
  // __launch_bounds__'s minimum CTAs per SM: the 16-row shapes CTA0_MIN_BLOCKS, or under kRegKV
  // with FP8_MIN_WARPS set, that many warps per SM (tuning.cuh).
  static constexpr int kFp8MinBlocks = FLASHINFER_ATTENTION_FP8_MIN_WARPS / kWarpsKV;
  static constexpr int kMinBlocks =
      kWarpsQ != 1                                          ? 1
      : kRegKV && FLASHINFER_ATTENTION_FP8_MIN_WARPS > 0 ? (kFp8MinBlocks > 1 ? kFp8MinBlocks : 1)
                                                          : FLASHINFER_ATTENTION_CTA0_MIN_BLOCKS;
  static constexpr bool kClusterMerge =
      kWarpsQ == 1 && kWarpsKV > 1 && kVoGroups == 1 && kMergeSmem + kClusterSmem <= kKVSmem;

  static_assert(sizeof(DTypeQ) == 2, "the MMA path takes fp16 or bf16 q");
  static_assert(HEAD_DIM_VO_ % kVoTile == 0 && (kVoGroups == 1 || HEAD_DIM_ == HEAD_DIM_VO_),
                "past 256 output columns: q's head dim is v's, split evenly among column groups");
  // Threads sharing one K/V row in the loader: every 16-byte copy of it (one each), or where
  // FLASHINFER_ATTENTION_LOAD_ROW_THREADS is fewer, several copies each and fewer rows, so
  // fewer page ids and row offsets in registers (prefill shapes only: decode keeps one copy).
  // Where the copies of a row outnumber or do not divide the group's threads (head_dim 192:
  // 24 of K, 16 of V; 512: 64 of K, 32 of V), the most threads that divide the group and both
  // rows' copies share a row (decode: 8 at 192, 32 at 512), each doing several copies; K and V
  // then cover the same rows, whose page ids they share.
  static constexpr int kLoadRowThreads0 =
      gcd_int(gcd_int(kLoadChunks, kLoadChunksVO), kGroupThreads);
  static constexpr int kLoadRowThreads =
      kRegKV ? FLASHINFER_ATTENTION_FP8_LOAD_ROW_THREADS
      : kWarpsQ > 1 && FLASHINFER_ATTENTION_LOAD_ROW_THREADS < kLoadRowThreads0
          ? FLASHINFER_ATTENTION_LOAD_ROW_THREADS
          : kLoadRowThreads0;
  static_assert(kGroupThreads % kLoadRowThreads == 0 &&
                    (kTileKV * kLoadRowThreads) % kGroupThreads == 0 &&
                    kLoadChunks % kLoadRowThreads == 0 && kLoadChunksVO % kLoadRowThreads == 0,
                "a K/V tile must split evenly over the threads of a group");
  static_assert(kWarpsQ == 1 || kWarpsKV == 1 || kWarpsQ * kWarpsKV <= 16,
                "at most 16 warps per CTA");
  // Named barriers (group_sync, stream_sync, pair_sync): 1 + group, 1 + kVoGroups kWarpsKV +
  // stream, 15 - warp of a group; 16 per CTA.
  static_assert(kVoGroups == 1 || (kVoGroups == 2 && 3 * kWarpsKV + kWarpsQ * kWarpsKV <= 15),
                "column groups: two, and named barriers for their streams and warps");
};

/// Barrier among the threads of one K/V group (named barrier 1 + group when groups coexist;
/// with column groups, group = column group x kWarpsKV + key stream).
template <class KT>
__device__ __forceinline__ void group_sync(int group) {
  if constexpr (KT::kWarpsKV == 1 && KT::kVoGroups == 1) {
    __syncthreads();
  } else if constexpr (KT::kWarpsQ == 1) {
    __syncwarp();
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"r"(group + 1), "n"(KT::kGroupThreads));
  }
}

/// Column groups (KernelTraits::kVoGroups > 1): barrier among the threads of both groups
/// that share key stream `stream` (named barrier 1 + kVoGroups kWarpsKV + stream).
template <class KT>
__device__ __forceinline__ void stream_sync(int stream) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + KT::kVoGroups * KT::kWarpsKV + stream),
               "n"(KT::kVoGroups * KT::kGroupThreads));
}

/// Column groups: barrier of the warps that hold the same rows and keys in each group (warp
/// `w` of its group; named barrier 15 - w).
template <class KT>
__device__ __forceinline__ void pair_sync(int w) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(15 - w), "n"(32 * KT::kVoGroups));
}

/// Rotate rows [0, rows) of a swizzled tile by RoPE (rotate-half); row r sits at position
/// pos(r). Threads tid, tid + nthreads, ... each take one (row, pair). Channels [D / 2, D)
/// are in `hi`: `lo` itself, or with column groups (two of D / 2 channels) the second
/// group's tile.
template <class KT, typename T, typename Pos>
__device__ __forceinline__ void rope_tile(T* lo, T* hi, int rows, Pos pos, int tid, int nthreads,
                                          const AttentionParams& p) {
  constexpr int D = KT::kHeadDim;
  constexpr int kHalf = D / 2;
  static_assert(KT::kVoGroups == 1 || KT::kHeadDimG == kHalf, "rope over two column groups");
  constexpr int kHiCol = KT::kVoGroups == 1 ? kHalf : 0;
  for (int idx = tid; idx < rows * kHalf; idx += nthreads) {
    const int row = idx / kHalf, i = idx % kHalf;
    const float freq = p.rope_rcp_scale * exp2f(-(2.f * i / D) * p.rope_log2_theta);
    float s, c;
    sincosf(float(pos(row)) * freq, &s, &c);
    T* a = lo + KT::Tile::elem(row, i);
    T* b = hi + KT::Tile::elem(row, i + kHiCol);
    const float x1 = to_float(*a), x2 = to_float(*b);
    *a = from_float<T>(x1 * c - x2 * s);
    *b = from_float<T>(x2 * c + x1 * s);
  }
}

/// Two fp8 values (the low 16 bits of `two`) of kind TKV as a DTypeQ pair T, packed. Exact: every
/// e4m3 and e5m2 value is a half, and a bfloat16 (cvt.rn.f16x2.e4m3x2 on sm_89 and newer).
template <typename T, typename TKV>
__device__ __forceinline__ uint32_t fp8x2_to(uint32_t two) {
  constexpr __nv_fp8_interpretation_t kKind =
      std::is_same_v<TKV, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), kKind);
  const uint32_t bits = uint32_t(h.x) | (uint32_t(h.y) << 16);
  if constexpr (std::is_same_v<T, __half>) {
    return bits;
  } else {
    __half2 hh;
    memcpy(&hh, &bits, 4);
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(hh));
    uint32_t out;
    memcpy(&out, &b, 4);
    return out;
  }
}

/// Sixteen fp8 values (one 16-byte copy) as two 16-byte chunks of T.
template <typename T, typename TKV>
__device__ __forceinline__ void fp8x16_to(const uint4& in, uint4& lo, uint4& hi) {
  lo.x = fp8x2_to<T, TKV>(in.x), lo.y = fp8x2_to<T, TKV>(in.x >> 16);
  lo.z = fp8x2_to<T, TKV>(in.y), lo.w = fp8x2_to<T, TKV>(in.y >> 16);
  hi.x = fp8x2_to<T, TKV>(in.z), hi.y = fp8x2_to<T, TKV>(in.z >> 16);
  hi.z = fp8x2_to<T, TKV>(in.w), hi.w = fp8x2_to<T, TKV>(in.w >> 16);
}

/// Whether 16-byte stores reach every output row: a 16-byte aligned base and row strides.
__device__ __forceinline__ bool rows_aligned16(const void* o, int64_t stride_n, int64_t stride_h) {
  return reinterpret_cast<uintptr_t>(o) % 16 == 0 && stride_n % 8 == 0 && stride_h % 8 == 0;
}

/*!
 * @brief The final output of one warp's rows (a prefill shape: one key stream) through shared
 *   memory: each thread writes its accumulator pairs, divided by the row sum, into the warp's
 *   own rows [first, first + 16 kMmaQ) of the swizzled tile `stage` (the Q tile, which only
 *   this warp read there), then the warp stores whole 16-byte chunks, a row's 256 bytes (head
 *   dim 128) by 16 lanes. The lse as OutputWriter::rows writes it.
 */
template <class KT, class Out, int MQ, int NC>
__device__ __forceinline__ void store_o_staged(const AttentionParams& p, const Out& out,
                                               const ItemRange& r, uint32_t kv_head,
                                               const float (&o)[MQ][NC][4],
                                               const float (&m)[MQ][2], const float (&d)[MQ][2],
                                               typename KT::DTypeQ* stage, int first, int lane) {
  using TO = typename KT::DTypeO;
  using Tile = typename KT::Tile;
  const int g = lane / 4, t = lane % 4, G = p.group_size;
  const int head0 = int(kv_head) * G;
  __syncwarp();  // the warp's last ldmatrix of its Q rows is behind every lane
  // This thread's rows first + g + 8 i (i = 2 mq + h), walked 8 packed rows at a time. Their
  // row % 8 is g (first is a multiple of 16), so chunk n of row first + g + 8 i sits at
  // Tile::offset(first + g, 0) + 8 i D XOR 8 n (8 n < D, a power of two; + 2 t below bit 3):
  // one LOP3 per 4-byte store instead of the swizzle's index arithmetic.
  static_assert((KT::kHeadDimG & (KT::kHeadDimG - 1)) == 0, "the staged output's XOR offsets");
  const uint32_t lane_off = Tile::offset(first + g, 0) + 2 * t;
  PackedRowWalk w(r.row_begin + first + g, 8, G);
#pragma unroll
  for (int mq = 0; mq < MQ; ++mq)
#pragma unroll
    for (int h = 0; h < 2; ++h, w.next()) {
      const int row = first + mq * 16 + g + 8 * h, pr = r.row_begin + row;
      float row_lse = d[mq][h] > 0.f ? m[mq][h] + log2f(d[mq][h]) : -INFINITY;
      float inv = d[mq][h] > 0.f ? p.o_scale / d[mq][h] : 0.f;
      if (pr < r.packed_len) {
        inv *= fold_sink(p, r, head0 + w.h, row_lse);
        if (t == 0 && (KT::kVoGroups == 1 || out.col0 == 0))
          out.lse_at(w.qo, head0 + w.h, row_lse);
      }
      const uint32_t row_off = lane_off + uint32_t(mq * 16 + 8 * h) * KT::kHeadDimG;
#pragma unroll
      for (int n = 0; n < NC; ++n)
        *reinterpret_cast<uint32_t*>(stage + (row_off ^ (8 * n))) =
            pack2<TO>(o[mq][n][2 * h] * inv, o[mq][n][2 * h + 1] * inv);
    }
  __syncwarp();
  // Lane l stores chunk l % NC of rows first + l / NC + k (32 / NC): the chunk is fixed and
  // the rows advance by a constant, so their (q row, head) are walked, not divided.
  constexpr int kRowChunks = NC, kRows = 16 * MQ;
  static_assert(32 % kRowChunks == 0 && kRows % (32 / kRowChunks) == 0,
                "a warp stores whole rows of the staged tile per instruction");
  constexpr int kLaneRows = 32 / kRowChunks;
  const int c = lane % kRowChunks, row0 = first + lane / kRowChunks;
  PackedRowWalk wr(r.row_begin + row0, kLaneRows, G, p.o_stride_n, p.o_stride_h);
  TO* const o_rows = static_cast<TO*>(p.o) + int64_t(r.qo_begin) * p.o_stride_n +
                     int64_t(head0) * p.o_stride_h + (KT::kVoGroups > 1 ? out.col0 : 0) +
                     c * 8;
#pragma unroll 4
  for (int i = 0; i < kRows / kLaneRows; ++i, wr.next()) {
    const int row = row0 + i * kLaneRows;
    if (r.row_begin + row >= r.packed_len) break;  // rows only increase
    *reinterpret_cast<uint4*>(o_rows + wr.off) =
        *reinterpret_cast<const uint4*>(stage + Tile::offset(row, c));
  }
}

/// kRegKV: byte offset of 16-byte chunk `chunk` of row `row` in an fp8 staging tile of 128-byte
/// rows; the chunk index is XORed with row % 8, so that the 16-byte loads of fp8_qk_regs (eight
/// lanes: rows g, g + 1, chunks 2t ^ g) and fp8_pv_regs (rows 2t, chunk g ^ 2t) are free of bank
/// conflicts.
__device__ __forceinline__ int fp8_stage_offset(int row, int chunk) {
  return row * 128 + ((chunk ^ (row % 8)) * 16);
}

/*!
 * @brief kRegKV: S += Q K^T over one staged fp8 K tile of 16 * kMmaKV keys (head_dim 128), K
 *   converted in registers. MMA k index 2t + e of channel step kk is channel 32t + 4kk + e, and
 *   2t + 8 + e is 32t + 4kk + 2 + e (e = 0, 1): lane (g, t) reads its 32 contiguous bytes of
 *   keys 8n + g with two 16-byte loads, and every 4-byte word is one step's b0 (its low half)
 *   and b1 (its high half). `qf` holds Q in the same channel order, in fp16.
 */
template <class KT>
__device__ __forceinline__ void fp8_qk_regs(float (&s)[2 * KT::kMmaKV][4],
                                            const uint32_t (&qf)[KT::kHeadDim / 16][4],
                                            const uint8_t* tile, int g, int t) {
  using TKV = typename KT::DTypeKV;
#pragma unroll
  for (int n = 0; n < 2 * KT::kMmaKV; ++n) {
    const uint8_t* row = tile + (n * 8 + g) * 128;  // (n * 8 + g) % 8 == g
    const uint4 lo = *reinterpret_cast<const uint4*>(row + ((2 * t) ^ g) * 16);
    const uint4 hi = *reinterpret_cast<const uint4*>(row + ((2 * t + 1) ^ g) * 16);
    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      mma_16816<__half>(s[n], qf[kk], fp8x2_to<__half, TKV>(w[kk]),
                        fp8x2_to<__half, TKV>(w[kk] >> 16));
  }
}

/// fp8_qk_regs with Q's fragments in shared memory (KernelTraits::kFp8QSmem: [kk][lane], 16
/// bytes each): per 16-byte half of the lane's K bytes, one load of each of its four steps' Q
/// fragment instead of all eight held in registers across the main loop.
template <class KT>
__device__ __forceinline__ void fp8_qk_regs_sq(float (&s)[2 * KT::kMmaKV][4], const uint4* qf,
                                               const uint8_t* tile, int g, int t, int lane) {
  using TKV = typename KT::DTypeKV;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // chunk 2t + h of the lane's keys: channel steps 4h .. 4h + 3
    uint4 kw[2 * KT::kMmaKV];
#pragma unroll
    for (int n = 0; n < 2 * KT::kMmaKV; ++n)
      kw[n] = *reinterpret_cast<const uint4*>(tile + (n * 8 + g) * 128 + ((2 * t + h) ^ g) * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 q4 = qf[(4 * h + i) * 32 + lane];
      const uint32_t qa[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int n = 0; n < 2 * KT::kMmaKV; ++n) {
        const uint32_t w = i == 0 ? kw[n].x : i == 1 ? kw[n].y : i == 2 ? kw[n].z : kw[n].w;
        mma_16816<__half>(s[n], qa, fp8x2_to<__half, TKV>(w), fp8x2_to<__half, TKV>(w >> 16));
      }
    }
  }
}

/*!
 * @brief kRegKV: O += P V over one staged fp8 V tile of 16 * kMmaKV keys (head_dim 128), V
 *   converted in registers. Output column n of MMA block i is column 16 n + i: lane (g, t)
 *   reads 16 contiguous bytes (columns 16 g .. 16 g + 15) of its four keys 2t, 2t + 1, 2t + 8,
 *   2t + 9 of each 16-key step, and one byte permute pairs two keys of one column (b0 of
 *   blocks i and i + 1 in one word). Its accumulators o[i] then hold columns 32t + i (o[i][0],
 *   o[i][2]) and 32t + 16 + i (o[i][1], o[i][3]).
 */
template <class KT>
__device__ __forceinline__ void fp8_pv_regs(float (&o)[KT::kVoTile / 8][4],
                                            const float (&s)[1][2 * KT::kMmaKV][4],
                                            const uint8_t* tile, int g, int t) {
  using TKV = typename KT::DTypeKV;
#pragma unroll
  for (int kk = 0; kk < KT::kMmaKV; ++kk) {
    uint32_t pa[4];
    pack_p<__half>(pa, s, 0, kk);
    const int r = kk * 16 + 2 * t;
    const uint4 v0 = *reinterpret_cast<const uint4*>(tile + fp8_stage_offset(r, g));
    const uint4 v1 = *reinterpret_cast<const uint4*>(tile + fp8_stage_offset(r + 1, g));
    const uint4 v8 = *reinterpret_cast<const uint4*>(tile + fp8_stage_offset(r + 8, g));
    const uint4 v9 = *reinterpret_cast<const uint4*>(tile + fp8_stage_offset(r + 9, g));
    const uint32_t a[4] = {v0.x, v0.y, v0.z, v0.w}, b[4] = {v1.x, v1.y, v1.z, v1.w};
    const uint32_t c[4] = {v8.x, v8.y, v8.z, v8.w}, d[4] = {v9.x, v9.y, v9.z, v9.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // bytes 2h, 2h + 1 of the words: blocks 4q + 2h, + 1
        const uint32_t sel = h ? 0x7362u : 0x5140u;
        const uint32_t k01 = __byte_perm(a[q], b[q], sel), k89 = __byte_perm(c[q], d[q], sel);
        mma_16816<__half>(o[4 * q + 2 * h], pa, fp8x2_to<__half, TKV>(k01),
                          fp8x2_to<__half, TKV>(k89));
        mma_16816<__half>(o[4 * q + 2 * h + 1], pa, fp8x2_to<__half, TKV>(k01 >> 16),
                          fp8x2_to<__half, TKV>(k89 >> 16));
      }
    }
  }
}

/// With column groups (kVoGroups > 1) D below is a group's kHeadDimG channels and each group
/// runs this as if it were a CTA of that head dim over its slice of Q, K and V, but for the
/// partial S tiles it sums with its peer group (xchg) and the shared barriers.
template <class KT>
__device__ __forceinline__ void attention_item(const AttentionParams& p, const ItemIds& ids,
                                               uint32_t kv_head, uint8_t* smem) {
  using T = typename KT::DTypeQ;
  using TO = typename KT::DTypeO;
  using Tile = typename KT::Tile;
  using VTile = typename KT::VTile;
  constexpr int D = KT::kHeadDimG;
  constexpr int DV = KT::kVoTile;
  // S = Q K^T in steps of 16 channels, unrolled kQKStep at a time: all of them up to head_dim
  // 256; at 512 all 32 spill (112 bytes per thread, paged), eight at a time do not.
  constexpr int kQKStep = D > 256 ? 8 : D / 16;
  constexpr int kChunks = KT::kChunks;
  constexpr int kTileQ = KT::kTileQ;
  constexpr int kTileKV = KT::kTileKV;
  constexpr int kMmaQ = KT::kMmaQ;
  constexpr int kMmaKV = KT::kMmaKV;
  constexpr bool kCausal = KT::kMask == MaskMode::kCausal;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // Column group h (0 without groups) of warps [h kWarpsQ kWarpsKV, (h + 1) kWarpsQ kWarpsKV):
  // its warp warp_g, thread gt; grp: its key stream's barrier (group_sync) and K/V tiles.
  constexpr int kWarpsG = KT::kWarpsQ * KT::kWarpsKV;
  const int h = KT::kVoGroups > 1 ? warp / kWarpsG : 0;
  const int warp_g = KT::kVoGroups > 1 ? warp % kWarpsG : warp;
  const int gt = KT::kVoGroups > 1 ? tid % KT::kThreadsG : tid;
  const int wq = warp_g % KT::kWarpsQ, wkv = warp_g / KT::kWarpsQ;
  const int grp = h * KT::kWarpsKV + wkv;
  const int gtid = tid % KT::kGroupThreads;
  const int g = lane / 4, t = lane % 4;
  // The first output column (and V column) of this group's kVoTile.
  const int vo_col0 = h * DV;

  // 1. Where this item's rows and keys are.
  const ItemRange rng = item_range<KT::kPaged, kCausal>(p, ids, kTileQ, kTileKV);
  const int G = p.group_size;
  const int qo_begin = rng.qo_begin, packed_len = rng.packed_len, row_begin = rng.row_begin;
  const int delta = rng.delta, kv_lo = rng.kv_lo, kv_hi = rng.kv_hi, num_tiles = rng.num_tiles;
  const int my_tiles = num_tiles > wkv ? (num_tiles - wkv + KT::kWarpsKV - 1) / KT::kWarpsKV : 0;

  using TKV = typename KT::DTypeKV;
  // This group's Q tile, [kTileQ][D] (channels [h D, (h + 1) D)).
  constexpr uint32_t kQGroupBytes = uint32_t(kTileQ) * D * sizeof(T);
  T* q_smem = reinterpret_cast<T*>(smem + h * kQGroupBytes);
  constexpr int kStages = KT::kStages;
  constexpr int kHalfTiles = KT::kHalfTiles;
  // The DTypeQ tiles the MMAs read (with fp8 K/V one K and one V per stream, whatever the
  // stage): a K tile [kTileKV][D], then a V tile [kTileKV][DV].
  // (k_tile_bytes, v_tile_bytes: their byte offsets in the CTA's shared memory.)
  auto k_tile_bytes_of = [&](int group, int stage) {
    return uint32_t(KT::kQSmem) + uint32_t((group * kHalfTiles + (KT::kConvertKV ? 0 : stage)) *
                                           kTileKV * (D + DV) * int(sizeof(T)));
  };
  auto k_tile_bytes = [&](int stage) { return k_tile_bytes_of(grp, stage); };
  auto v_tile_bytes = [&](int stage) {
    return k_tile_bytes(stage) + uint32_t(kTileKV * D * int(sizeof(T)));
  };
  auto k_tile = [&](int stage) { return reinterpret_cast<T*>(smem + k_tile_bytes(stage)); };
  auto v_tile = [&](int stage) { return reinterpret_cast<T*>(smem + v_tile_bytes(stage)); };
  // fp8 K/V: the staging tiles the copies land in, [kTileKV][D] bytes, unswizzled (each thread
  // reads back its own 16-byte chunks: a warp covers 512 contiguous bytes per row step).
  uint8_t* kv_stage = smem + KT::kQSmem + (KT::kKVSmem - KT::kStageSmem);
  auto stage_tile = [&](int stage, bool is_v) {
    return kv_stage + ((grp * kStages + stage) * 2 + int(is_v)) * kTileKV * D * sizeof(TKV);
  };

  // 2. Q tile -> shared memory (rows past the request are zeros).
  const T* q = static_cast<const T*>(p.q);
  // (Each column group copies its own channels.)
  if constexpr (KT::kThreadsG % kChunks == 0) {
    // Thread gt copies chunk gt % kChunks of rows gt / kChunks + k kQRowStep: the chunk is
    // fixed and the rows advance by a constant, so their (q row, head) are walked, not divided.
    constexpr int kQRowStep = KT::kThreadsG / kChunks;
    constexpr int kQCopies = (kTileQ + kQRowStep - 1) / kQRowStep;
    const int c = gt % kChunks, r0 = gt / kChunks;
    PackedRowWalk w(row_begin + r0, kQRowStep, G, p.q_stride_n, p.q_stride_h);
    const T* const q_rows = q + int64_t(qo_begin) * p.q_stride_n +
                            int64_t(kv_head) * G * p.q_stride_h + h * D + c * 8;
#pragma unroll 4
    for (int i = 0; i < kQCopies; ++i, w.next()) {
      const int r = r0 + i * kQRowStep;
      if (kTileQ % kQRowStep != 0 && r >= kTileQ) break;  // (more threads than copies)
      const bool valid = row_begin + r < packed_len;
      cp_async_16(q_smem + Tile::offset(r, c), valid ? q_rows + w.off : q, valid);
    }
  } else {
    for (int i = gt; i < kTileQ * kChunks; i += KT::kThreadsG) {
      const int r = i / kChunks, c = i % kChunks;
      const int pr = row_begin + r;
      const bool valid = pr < packed_len;
      const T* src = q;
      if (valid) {
        const auto [qo, head] = qo_head(pr, kv_head, p.group_div);
        src = q + (qo_begin + qo) * p.q_stride_n + head * p.q_stride_h + h * D + c * 8;
      }
      cp_async_16(q_smem + Tile::offset(r, c), src, valid);
    }
  }
  cp_async_commit();

  // 3. K/V tile loader: thread gtid owns 16-byte copies gtid % kRowThreads + c * kRowThreads
  // (8 half or 16 fp8 elements each) of rows gtid / kRowThreads + j * step (kRowThreads =
  // kLoadChunks: one copy of each of its rows). K and V rows of different widths (192 / 128)
  // take different numbers of copies of the same rows.
  // The page ids of its rows are looked up one tile ahead into registers and shared by the K and
  // V loads of that tile: a page table read is a dependent global load, and issuing it just
  // before the copies it feeds would double the latency of each tile. Rows past the end are
  // clamped to the last key (an address that exists) and copied as zeros, so the loads need no
  // branches.
  const TKV* k = static_cast<const TKV*>(p.k);
  const TKV* v = static_cast<const TKV*>(p.v);
  constexpr int kRowThreads = KT::kLoadRowThreads;
  constexpr int kRowStep = KT::kGroupThreads / kRowThreads;
  constexpr int kRowsPerThread = kTileKV / kRowStep;
  constexpr int kCopiesK = KT::kLoadChunks / kRowThreads;  // per row and thread
  constexpr int kCopiesV = KT::kLoadChunksVO / kRowThreads;
  const int my_chunk = gtid % kRowThreads, my_row0 = gtid / kRowThreads;
  const TKV* k_base = k + int64_t(kv_head) * p.k_stride_h + h * D + my_chunk * KT::kLoadElems;
  const TKV* v_base = v + int64_t(kv_head) * p.v_stride_h + vo_col0 + my_chunk * KT::kLoadElems;
  if constexpr (!KT::kPaged) {
    k_base += rng.kv_token_begin * p.k_stride_n;
    v_base += rng.kv_token_begin * p.v_stride_n;
  }
  // Per row only the page id is kept (registers are scarce at 128 rows x 64 keys); token, slot
  // and validity are recomputed from the tile's first key when the copies are issued.
  int row_page[KT::kPaged ? kRowsPerThread : 1];
  int fetched_base = 0;  // first key of the tile the lookup was for
  auto lookup = [&](int tile) {
    fetched_base = kv_lo + tile * kTileKV;
    if constexpr (KT::kPaged) {
#pragma unroll
      for (int j = 0; j < kRowsPerThread; ++j) {
        const int tok = min(fetched_base + my_row0 + j * kRowStep, kv_hi - 1);
        row_page[j] = p.kv_indices[rng.page_begin + int(p.page_size.div(uint32_t(tok)))];
      }
    }
  };
  // is_v: std::true_type or std::false_type (K and V rows may take different copy counts).
  auto load = [&](int stage, auto is_v_c) {
    constexpr bool is_v = decltype(is_v_c)::value;
    constexpr int kCopies = is_v ? kCopiesV : kCopiesK;
    using DstTile = std::conditional_t<is_v, VTile, Tile>;
    [[maybe_unused]] T* dst = is_v ? v_tile(stage) : k_tile(stage);  // (the half tiles)
    const TKV* src0 = is_v ? v_base : k_base;
    // Strides are below 2^31 (checked by the binding): 32 x 32 -> 64-bit products.
    [[maybe_unused]] const int s_page = int(is_v ? p.v_stride_page : p.k_stride_page);
    const int s_n = int(is_v ? p.v_stride_n : p.k_stride_n);
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int tok = fetched_base + my_row0 + j * kRowStep;
      const int clamped = min(tok, kv_hi - 1);
      int64_t off;
      if constexpr (KT::kPaged) {
        uint32_t page, slot;
        p.page_size.divmod(uint32_t(clamped), page, slot);
        off = mul_wide(int(slot), s_n) + mul_wide(row_page[j], s_page);
      } else {
        off = mul_wide(clamped, s_n);
      }
      const int row = my_row0 + j * kRowStep;
#pragma unroll
      for (int c = 0; c < kCopies; ++c) {
        const int chunk = my_chunk + c * kRowThreads;
        const TKV* src = src0 + off + c * kRowThreads * KT::kLoadElems;
        if constexpr (KT::kRegKV) {
          cp_async_16(stage_tile(stage, is_v) + fp8_stage_offset(row, chunk), src,
                      tok < kv_hi && !FLASHINFER_ATTENTION_PROBE_NO_LOADS);
        } else if constexpr (KT::kConvertKV) {
          cp_async_16(stage_tile(stage, is_v) + (row * KT::kLoadChunks + chunk) * 16, src,
                      tok < kv_hi);
        } else {
          cp_async_16(dst + DstTile::offset(row, chunk), src, tok < kv_hi);
        }
      }
    }
  };
  // fp8 K/V, after the wait for a tile's copies: this thread's chunks of it (rows past the end
  // were zero-filled) into the group's K (DTypeQ) or V (DTypePV) tile, before the barrier that
  // publishes it.
  // (fp8 K/V: K and V of one width, D == DV: Tile is VTile and kCopiesK is kCopiesV.)
  auto convert = [&](int stage, auto is_v_c) {
    if constexpr (KT::kConvertKV && !KT::kRegKV) {
      constexpr bool is_v = decltype(is_v_c)::value;
      constexpr int kCopies = kCopiesK;
      T* dst = is_v ? v_tile(stage) : k_tile(stage);
      const uint8_t* staged = stage_tile(stage, is_v);
#pragma unroll
      for (int j = 0; j < kRowsPerThread; ++j) {
        const int row = my_row0 + j * kRowStep;
#pragma unroll
        for (int c = 0; c < kCopies; ++c) {
          const int chunk = my_chunk + c * kRowThreads;
          const uint4 in =
              *reinterpret_cast<const uint4*>(staged + (row * KT::kLoadChunks + chunk) * 16);
          uint4 lo, hi;
          if constexpr (is_v) {
            fp8x16_to<typename KT::DTypePV, TKV>(in, lo, hi);
          } else {
            fp8x16_to<T, TKV>(in, lo, hi);
          }
          *reinterpret_cast<uint4*>(dst + Tile::offset(row, 2 * chunk)) = lo;
          *reinterpret_cast<uint4*>(dst + Tile::offset(row, 2 * chunk + 1)) = hi;
        }
      }
    }
  };

  // Prologue: tiles 0 .. kAhead-1 in flight, K and V each one commit group.
  constexpr int kAhead = KT::kAhead;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < my_tiles) {
      lookup(wkv + s * KT::kWarpsKV);
      load(s, std::false_type{});
    }
    cp_async_commit();
    if (s < my_tiles) load(s, std::true_type{});
    cp_async_commit();
  }

  // 4. Per-thread row facts: rows g and g + 8 of each of the warp's MMA tiles.
  RowFacts<kMmaQ> rows;
  rows.template init<KT::kPos>(p, rng, row_begin + wq * 16 * kMmaQ, kv_head, g);

  cp_async_wait<2 * kAhead>();  // Q has landed (the prologue's K/V may not)
  __syncthreads();
  trace(kTraceQ);
  if constexpr (KT::kPos == PosEncoding::kRopeLlama) {
    // q row r sits at position delta + (row_begin + r) / G.
    // (Both column groups' Q tiles: pairs of channels i, i + 256 are one in each.)
    T* const q_all = reinterpret_cast<T*>(smem);
    rope_tile<KT>(q_all, q_all + (KT::kVoGroups > 1 ? kTileQ * D : 0), kTileQ,
                  [&](int r) { return delta + (row_begin + r) / G; }, tid, KT::kThreads, p);
    __syncthreads();
  }

  // This lane's ldmatrix offsets (elements) at chunk pair 0 of its rows; chunk pair j of the
  // same rows is the offset XOR 16 j: the swizzle XORs the chunk index with row % 8, chunk
  // 2 j + b is 2 j ^ b, and 16 j ^ 8 (b ^ row % 8) stays below D (a power of two). Q rows
  // wq * 16 * kMmaQ + mq * 16 + lane % 16, K rows n2 * 16 + lane % 8 + (lane / 16) * 8, V rows
  // kk * 16 + lane % 16. The main loop makes them opaque once per tile, so the compiler
  // recomputes each address with one LOP3 instead of holding one register per (rows, chunk
  // pair) across the loop (ptxas, sm_90a: 128 rows x 64 keys ragged spilled 164 bytes, now 116;
  // the decode shapes held 213-224 registers, now 200).
  // Where D is no power of two (192) the XOR acts on the column part alone: the offsets are
  // held as a row part (q_row0, k_row0: row * D) plus the column part, XORed. V's width is a
  // power of two at every head dim.
  constexpr bool kPow2D = (D & (D - 1)) == 0;
  const int q_row = wq * 16 * kMmaQ + lane % 16, k_row = lane % 8 + (lane / 16) * 8;
  const uint32_t q_row0 = kPow2D ? 0u : uint32_t(q_row * D);
  const uint32_t k_row0 = kPow2D ? 0u : uint32_t(k_row * D);
  // In bytes, and with the shared-state address of the CTA's shared memory (one register: the
  // ldmatrix addresses below are smem_base + tile + row part + (offset ^ 32 j) + immediates).
  // A shuffle makes each opaque to ptxas, which otherwise recomputes them from the thread
  // index at every tile once registers are tight (~40 instructions per tile at 128 x 64 on
  // sm_90a; ptxas sees through an empty asm).
  const uint32_t smem_base = __shfl_sync(0xffffffffu, smem_addr(smem), 0);
  // (q_off0 includes the group's Q tile: h kQGroupBytes, above every bit the XORs touch.)
  const uint32_t q_off0 = __shfl_sync(
      0xffffffffu, h * kQGroupBytes + 2 * (Tile::offset(q_row, lane / 16) - q_row0), lane);
  const uint32_t k_off0 =
      __shfl_sync(0xffffffffu, 2 * (Tile::offset(k_row, (lane / 8) % 2) - k_row0), lane);
  const uint32_t v_off0 =
      __shfl_sync(0xffffffffu, 2 * VTile::offset(lane % 16, lane / 16), lane);
  uint32_t q_frag[KT::kQInRegs ? kMmaQ : 1][KT::kQInRegs ? D / 16 : 1][4];
  auto load_q_frag = [&](uint32_t a[4], uint32_t q_off, int mq, int kk) {
    ldmatrix_x4_at(a, smem_base + 2 * q_row0 + (q_off ^ (32 * kk)) + mq * 32 * D);
  };
  // kRegKV: S is computed in fp16 with Q's channels in fp8_qk_regs's order; a bfloat16 q is
  // multiplied by 2^-sh (sh >= 0, the smallest that puts the warp's largest |q| below 2^15:
  // exact, but for values below 2^(sh - 14), which become fp16 subnormals) and S by q_unscale.
  [[maybe_unused]] float q_unscale = 1.f;
  if constexpr (KT::kRegKV) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e)  // rows g (e even) and g + 8, channels 32t + 4kk + 2(e / 2)
        q_frag[0][kk][e] = *reinterpret_cast<const uint32_t*>(
            q_smem + Tile::elem(g + 8 * (e % 2), 32 * t + 4 * kk + 2 * (e / 2)));
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      float mx = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&q_frag[0][kk][e]));
          mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
#pragma unroll
      for (int w = 16; w >= 1; w /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, w));
      int ex = 0;
      frexpf(mx, &ex);  // mx < 2^ex
      const int sh = ex > 15 ? ex - 15 : 0;
      const float down = ldexpf(1.f, -sh);
      q_unscale = ldexpf(1.f, sh);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&q_frag[0][kk][e]));
          const __half2 h = __floats2half2_rn(f.x * down, f.y * down);
          q_frag[0][kk][e] = *reinterpret_cast<const uint32_t*>(&h);
        }
    }
    if constexpr (KT::kFp8QSmem) {
      // The fragments over the Q tile (every warp holds the same: the key streams share the
      // rows), [kk][lane] 16 bytes each, for fp8_qk_regs_sq to read per step.
      __syncthreads();  // every warp has read its Q rows
      if (wkv == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          reinterpret_cast<uint4*>(q_smem)[kk * 32 + lane] =
              make_uint4(q_frag[0][kk][0], q_frag[0][kk][1], q_frag[0][kk][2], q_frag[0][kk][3]);
      }
      __syncthreads();
    }
  } else if constexpr (KT::kQInRegs) {
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) load_q_frag(q_frag[mq][kk], q_off0, mq, kk);
  }

  float o[kMmaQ][DV / 8][4];
  float m[kMmaQ][2], d[kMmaQ][2];
#pragma unroll
  for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
    for (int r = 0; r < 2; ++r) m[mq][r] = -INFINITY, d[mq][r] = 0.f;
#pragma unroll
    for (int n = 0; n < DV / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mq][n][e] = 0.f;
  }

  // kRegKV with FP8_LEAN: whether rows 8-15 of the warp's tile exist (a decode step of at most
  // 8 packed rows, e.g. group size 4 or 8, has none: softmax_step skips them). Elsewhere true.
  const bool upper_rows =
      !(KT::kRegKV && FLASHINFER_ATTENTION_FP8_LEAN) || row_begin + 8 < packed_len;

  // 5. The main loop over this group's KV tiles.
  for (int j = 0; j < my_tiles; ++j) {
    const int tile = wkv + j * KT::kWarpsKV;
    const int stage = j % kStages;
    const int ahead = j + kAhead;  // the tile whose loads this iteration issues
    const int base = kv_lo + tile * kTileKV;
    if (ahead < my_tiles) lookup(wkv + ahead * KT::kWarpsKV);  // lands while S is computed
    cp_async_wait<2 * kAhead - 1>();  // K[j] (V[j] and the later tiles may be in flight)
    convert(stage, std::false_type{});
    group_sync<KT>(grp);
    if (j == 0) trace(kTraceFirstK);
    uint32_t q_off = q_off0, k_off = k_off0, v_off = v_off0;
    asm volatile("" : "+r"(q_off), "+r"(k_off), "+r"(v_off));  // per tile (above)
    T* ks = k_tile(stage);
    const uint32_t ks_at = smem_base + k_tile_bytes(stage);
    if constexpr (KT::kPos == PosEncoding::kRopeLlama) {
      if constexpr (KT::kVoGroups > 1) {  // channel pairs i, i + 256: both groups' K tiles
        stream_sync<KT>(wkv);
        const auto tile_of = [&](int hh) {
          return reinterpret_cast<T*>(smem + k_tile_bytes_of(hh * KT::kWarpsKV + wkv, stage));
        };
        rope_tile<KT>(tile_of(0), tile_of(1), kTileKV, [&](int r) { return base + r; },
                      h * KT::kGroupThreads + gtid, KT::kVoGroups * KT::kGroupThreads, p);
        stream_sync<KT>(wkv);
      } else {
        rope_tile<KT>(ks, ks, kTileKV, [&](int r) { return base + r; }, gtid,
                      KT::kGroupThreads, p);
        group_sync<KT>(grp);
      }
    }

    // S = Q K^T
    float s[kMmaQ][2 * kMmaKV][4];
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int n = 0; n < 2 * kMmaKV; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mq][n][e] = 0.f;
    if constexpr (KT::kRegKV) {
      if constexpr (!FLASHINFER_ATTENTION_PROBE_NO_COMPUTE) {
        if constexpr (KT::kFp8QSmem) {
          fp8_qk_regs_sq<KT>(s[0], reinterpret_cast<const uint4*>(q_smem),
                             stage_tile(stage, false), g, t, lane);
        } else {
          fp8_qk_regs<KT>(s[0], q_frag[0], stage_tile(stage, false), g, t);
        }
        // (FP8_LEAN: folded into the softmax's scale below where it defers the scale)
        if (std::is_same_v<T, __nv_bfloat16> &&
            !(FLASHINFER_ATTENTION_FP8_LEAN && scale_deferred<KT::kPos>(p))) {
#pragma unroll
          for (int n = 0; n < 2 * kMmaKV; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[0][n][e] *= q_unscale;
        }
      }
    } else
#pragma unroll 1
    for (int kk0 = 0; kk0 < D / 16; kk0 += kQKStep)
#pragma unroll
    for (int kk = kk0; kk < (FLASHINFER_ATTENTION_PROBE_NO_COMPUTE ? 0 : kk0 + kQKStep); ++kk) {
      uint32_t a_tmp[kMmaQ][4];
      if constexpr (!KT::kQInRegs) {
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) load_q_frag(a_tmp[mq], q_off, mq, kk);
      }
#pragma unroll
      for (int n2 = 0; n2 < kMmaKV; ++n2) {
        uint32_t kb[4];
        ldmatrix_x4_at(kb, ks_at + 2 * k_row0 + (k_off ^ (32 * kk)) + n2 * 32 * D);
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) {
          const uint32_t* a = KT::kQInRegs ? q_frag[KT::kQInRegs ? mq : 0][KT::kQInRegs ? kk : 0]
                                           : a_tmp[mq];
          mma_16816<T>(s[mq][2 * n2], a, kb[0], kb[1]);
          mma_16816<T>(s[mq][2 * n2 + 1], a, kb[2], kb[3]);
        }
      }
    }

    if (ahead < my_tiles) load(ahead % kStages, std::false_type{});
    cp_async_commit();

    // Column groups: S is the sum of the two groups' partial tiles. Each thread hands its
    // partial to the thread of the same rows and keys in the other group through shared
    // memory (float4 i of lane l at [i][l]: a warp's 16-byte stores cover 512 contiguous
    // bytes) and adds the other's: s0 + s1 in both, the same float, so both groups take the
    // same softmax. Two buffers by tile parity: a group rewrites one only after the pair
    // barrier of the next tile, which its peer reaches after reading it.
    if constexpr (KT::kVoGroups > 1) {
      float4* const xb = reinterpret_cast<float4*>(smem + KT::kXchgOffset) +
                         (j & 1) * (KT::kThreads * KT::kXchgF4) + lane;
      float4* const mine = xb + (h * kWarpsG + warp_g) * (KT::kXchgF4 * 32);
      const float4* const other = xb + ((1 - h) * kWarpsG + warp_g) * (KT::kXchgF4 * 32);
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int n = 0; n < 2 * kMmaKV; ++n)
          mine[(mq * 2 * kMmaKV + n) * 32] =
              make_float4(s[mq][n][0], s[mq][n][1], s[mq][n][2], s[mq][n][3]);
      pair_sync<KT>(warp_g);
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int n = 0; n < 2 * kMmaKV; ++n) {
          const float4 x = other[(mq * 2 * kMmaKV + n) * 32];
          s[mq][n][0] += x.x, s[mq][n][1] += x.y, s[mq][n][2] += x.z, s[mq][n][3] += x.w;
        }
    }

    float qk_scale = 1.f;  // what the softmax still multiplies the logits by
    if constexpr (!FLASHINFER_ATTENTION_PROBE_NO_COMPUTE)
      qk_scale = logits_and_mask<KT::kMask, KT::kPos, true>(s, p, rng, rows, base, kTileKV, t);
    if constexpr (KT::kRegKV && FLASHINFER_ATTENTION_FP8_LEAN && std::is_same_v<T, __nv_bfloat16>)
      if (scale_deferred<KT::kPos>(p)) qk_scale *= q_unscale;

    // Online softmax (base 2). The O rescale is skipped when no row of the warp raised its
    // maximum (the usual case once a row has seen its largest logits).
    float row_scale[kMmaQ][2];
    if (!FLASHINFER_ATTENTION_PROBE_NO_COMPUTE &&
        softmax_step<true>(s, m, d, row_scale, qk_scale, upper_rows)) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int n = 0; n < DV / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mq][n][e] *= row_scale[mq][e / 2];
    }

    cp_async_wait<2 * kAhead - 1>();  // V[j]
    convert(stage, std::true_type{});
    group_sync<KT>(grp);
    const uint32_t vs_at = smem_base + v_tile_bytes(stage);
    // O += P V
    if constexpr (KT::kRegKV) {
      if constexpr (!FLASHINFER_ATTENTION_PROBE_NO_COMPUTE)
        fp8_pv_regs<KT>(o[0], s, stage_tile(stage, true), g, t);
    } else
#pragma unroll
    for (int kk = 0; kk < (FLASHINFER_ATTENTION_PROBE_NO_COMPUTE ? 0 : kMmaKV); ++kk) {
      uint32_t pa[kMmaQ][4];
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) pack_p<typename KT::DTypePV>(pa[mq], s, mq, kk);
#pragma unroll
      for (int n2 = 0; n2 < DV / 16; ++n2) {
        uint32_t vb[4];
        ldmatrix_x4_trans_at(vb, vs_at + (v_off ^ (32 * n2)) + kk * 32 * DV);
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) {
          mma_16816<typename KT::DTypePV>(o[mq][2 * n2], pa[mq], vb[0], vb[1]);
          mma_16816<typename KT::DTypePV>(o[mq][2 * n2 + 1], pa[mq], vb[2], vb[3]);
        }
      }
    }
    if (ahead < my_tiles) load(ahead % kStages, std::true_type{});
    cp_async_commit();
  }
  cp_async_wait<0>();
  trace(kTraceLoopDone);

  // 6. Row sums across the quad, then the epilogue.
  quad_sum(d);
  const OutputWriter<TO, DV, KT::kHeadDimVO> out{p, rng, kv_head, writes_partial(p, rng),
                                                 vo_col0};
  if constexpr (KT::kWarpsKV == 1) {
    // The final output through the warp's own Q rows in shared memory (read by no other warp,
    // and by this one no more): 16-byte stores of whole rows instead of 4-byte stores of a
    // quad's 16 bytes per row (half of each 32-byte sector per instruction). H200, bf16, 32/8
    // heads, backend="fa2", against the 4-byte stores in the same call: ragged causal 16 x 1024
    // 576.7 vs 642.5 us, 64 x 256 290.3 vs 346.0, paged 8 x 2048 1023.2 vs 1066.1, single
    // 16384 6559 vs 6696 (benchmarks/notes/fa2-batches.md). Partial states (float32), outputs
    // of another width than q's rows, and unaligned outputs keep the 4-byte stores.
    constexpr bool kStageO = sizeof(TO) == 2 && DV == D;
    bool staged = false;
    if constexpr (kStageO) {
      staged = !out.partial && rows_aligned16(p.o, p.o_stride_n, p.o_stride_h);
      if (staged) store_o_staged<KT>(p, out, rng, kv_head, o, m, d, q_smem, wq * 16 * kMmaQ, lane);
    }
    if (!staged) out.rows(o, m, d, row_begin + wq * 16 * kMmaQ, g, t);
  } else {
    // Groups merge through shared memory (over the K/V stages, all drained above).
    __syncthreads();
    // (Column groups: each its own merge area, of its columns.)
    float* merge = reinterpret_cast<float*>(smem + KT::kQSmem) +
                   h * (KT::kMergeSmem / KT::kVoGroups / sizeof(float));
    float* mo = merge;                                    // [kWarpsKV][kTileQ][DV]
    float* mm = merge + KT::kWarpsKV * kTileQ * DV;       // [kWarpsKV][kTileQ]
    float* md = mm + KT::kWarpsKV * kTileQ;               // [kWarpsKV][kTileQ]
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = wq * 16 * kMmaQ + mq * 16 + g + 8 * r;
        float* dst = mo + (wkv * kTileQ + row) * DV;
        if constexpr (KT::kRegKV) {  // columns 32t + i and 32t + 16 + i (fp8_pv_regs)
#pragma unroll
          for (int i = 0; i < 16; i += 4) {
            *reinterpret_cast<float4*>(dst + 32 * t + i) =
                make_float4(o[mq][i][2 * r], o[mq][i + 1][2 * r], o[mq][i + 2][2 * r],
                            o[mq][i + 3][2 * r]);
            *reinterpret_cast<float4*>(dst + 32 * t + 16 + i) =
                make_float4(o[mq][i][2 * r + 1], o[mq][i + 1][2 * r + 1],
                            o[mq][i + 2][2 * r + 1], o[mq][i + 3][2 * r + 1]);
          }
        } else {
#pragma unroll
          for (int n = 0; n < DV / 8; ++n)
            *reinterpret_cast<float2*>(dst + n * 8 + 2 * t) =
                make_float2(o[mq][n][2 * r], o[mq][n][2 * r + 1]);
        }
        if (t == 0) mm[wkv * kTileQ + row] = m[mq][r], md[wkv * kTileQ + row] = d[mq][r];
      }
    __syncthreads();
    trace(kTraceStreamsDone);
    // Cluster merge: the state goes to shared memory for the cluster's rank 0 to merge.
    const bool to_cluster = KT::kClusterMerge && p.cluster_merge;
    float* cluster_o = merge + KT::kMergeSmem / sizeof(float);  // [kTileQ][DV]
    float* cluster_lse = cluster_o + kTileQ * DV;               // [kTileQ]
    for (int idx = gt; idx < kTileQ * (DV / 2); idx += KT::kThreadsG) {
      const int row = idx / (DV / 2), col = (idx % (DV / 2)) * 2;
      const int pr = row_begin + row;
      if (pr >= packed_len) continue;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < KT::kWarpsKV; ++w) mx = fmaxf(mx, mm[w * kTileQ + row]);
      const float m_safe = mx == -INFINITY ? 0.f : mx;
      float dsum = 0.f, x0 = 0.f, x1 = 0.f;
#pragma unroll
      for (int w = 0; w < KT::kWarpsKV; ++w) {
        const float f = exp2f(mm[w * kTileQ + row] - m_safe);
        dsum += md[w * kTileQ + row] * f;
        const float2 ov = *reinterpret_cast<const float2*>(mo + (w * kTileQ + row) * DV + col);
        x0 += ov.x * f;
        x1 += ov.y * f;
      }
      float lse = dsum > 0.f ? mx + log2f(dsum) : -INFINITY;
      const float inv = (dsum > 0.f ? 1.f / dsum : 0.f) * out.sink(pr, lse);
      if (to_cluster) {
        *reinterpret_cast<float2*>(cluster_o + row * DV + col) =
            make_float2(x0 * inv * p.o_scale, x1 * inv * p.o_scale);
        if (col == 0) cluster_lse[row] = lse;
        continue;
      }
      out.pair(pr, col, x0 * inv, x1 * inv);
      if (col == 0 && vo_col0 == 0) out.lse(pr, lse);
    }
    if constexpr (KT::kClusterMerge) {
      if (to_cluster) {
        cluster_merge<TO, DV, KT::kThreads>(p, rng, kv_head, kTileQ, cluster_o, cluster_lse);
        return;
      }
    }
  }
  trace(kTraceWritten);
  // Split-KV partial states are merged by the last of the request's CTAs to finish (with
  // merge_counters; otherwise by the merge kernel). The flag takes the first word of the Q
  // tile, unread since the main loop.
  merge_if_last<TO, KT::kHeadDimVO, KT::kThreads>(p, rng, kv_head, kTileQ,
                                                  reinterpret_cast<int*>(smem));
}

template <class KT>
__global__ void __launch_bounds__(KT::kThreads, KT::kMinBlocks)
    attention_kernel(const __grid_constant__ AttentionParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  trace(kTraceEntry);
  const int num_items = *p.num_items;
  // CTA L = blockIdx.y * gridDim.x + blockIdx.x takes item L / H of KV head L % H (then items
  // + gridDim.x of that head): the KV heads of one item run side by side and read neighbouring
  // rows of the same pages (decode 128 x 8192 1421 vs 1437 us with (blockIdx.x, blockIdx.y)
  // on the H100; benchmarks/NOTES.md).
  // A cluster merge needs the CTAs of one KV head side by side: (blockIdx.x, blockIdx.y).
  const uint32_t block_x = blockIdx.x, grid_x = gridDim.x;
  const uint32_t linear = blockIdx.y * grid_x + block_x;
  const bool item_major = !(KT::kClusterMerge && p.cluster_merge);
  const int first = item_major ? int(linear / uint32_t(p.num_kv_heads)) : int(block_x);
  const uint32_t kv_head = item_major ? linear % uint32_t(p.num_kv_heads) : blockIdx.y;
  // The first item's plan entries are loaded together with num_items, not after it: each is a
  // dependent load ahead of the first K/V bytes (first < gridDim.x <= the item capacity).
  ItemIds ids = load_item_ids(p, first);
  // Only plan()'s host copy writes the plan, never a kernel (a copy ends before the next kernel
  // starts): its loads go out before the PDL wait, behind the previous kernel's tail. q, the
  // page ids and the cache may come from that kernel: they are read after.
  pdl_wait();
  for (int item = first; item < num_items; item += grid_x) {
    attention_item<KT>(p, ids, kv_head, smem);
    if (item + int(grid_x) < num_items) ids = load_item_ids(p, item + grid_x);
    __syncthreads();  // shared memory is reused by the next item
  }
  trace(kTraceEnd);
  pdl_launch_dependents();
}

/// Clusters of `cluster_x` CTAs of `kernel` that one wave holds (cudaOccupancyMaxActiveClusters),
/// or minus the CUDA error code where the query is refused.
template <class Kernel>
int max_active_clusters(Kernel* kernel, unsigned cluster_x, dim3 block, size_t smem) {
  if (cluster_x > 8) {
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return -int(err);
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(cluster_x, 1);
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = cluster_x;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  int clusters = 0;
  cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  return err == cudaSuccess ? clusters : -int(err);
}

/*!
 * @brief Whether one wave holds grid.y clusters of grid.x CTAs of `kernel` (clusters of more
 *   than 8 CTAs are non-portable; compute capability 9.0 and up). Asked once per device and
 *   cluster size for each kernel; a refused query means no.
 */
template <class Kernel>
bool clusters_fit(Kernel* kernel, dim3 grid, dim3 block, size_t smem) {
  constexpr int kMaxDevices = 64, kMaxCluster = 16;
  static std::atomic<int8_t> known[kMaxDevices][kMaxCluster + 1];  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (grid.x < 2 || grid.x > kMaxCluster || cudaGetDevice(&device) != cudaSuccess ||
      device >= kMaxDevices)
    return false;
  int8_t fits = known[device][grid.x].load(std::memory_order_relaxed);
  if (fits == 0) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    fits = major >= 9 && max_active_clusters(kernel, grid.x, block, smem) >= int(grid.y) ? 2 : 1;
    cudaGetLastError();  // a refused query or attribute is not the launch's error
    known[device][grid.x].store(fits, std::memory_order_relaxed);
  }
  return fits == 2;
}

/*!
 * @brief Launch the attention kernel of traits KT: grid (grid_x, num_kv_heads); the CTAs loop
 *   over the plan's *num_items work items, so one launch shape serves every later plan.
 */
template <class KT>
cudaError_t LaunchAttention(AttentionParams& p, int grid_x, bool enable_pdl, cudaStream_t stream) {
  auto kernel = attention_kernel<KT>;
  constexpr size_t smem = KT::kSmemBytes;
  if constexpr (smem > 48 * 1024) {
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return err;
  }
  if (grid_x <= 0) return cudaSuccess;
  const dim3 grid(grid_x, p.num_kv_heads), block(KT::kThreads);
  // A cluster merge where the shape has one and a wave holds every KV head's cluster; the
  // plan is a valid split-KV plan without it (merge_if_last). p.cluster_merge says which.
  if (p.cluster_merge)
    p.cluster_merge = KT::kClusterMerge && clusters_fit(kernel, grid, block, smem);
  return launch_kernel_clustered(kernel, grid, block, smem, stream, enable_pdl,
                                 p.cluster_merge ? unsigned(grid_x) : 0u, p);
}

}  // namespace attn
}  // namespace flashinfer

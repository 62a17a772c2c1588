// The Hopper (sm_90a) attention kernel for prefill: warpgroup MMA (wgmma) with a producer warp.
//
// CTA. Two consumer warpgroups (threads 0-255) each own 64 of the tile's 128 packed query rows;
// one producer warpgroup (threads 256-383) fills a ring of kStages K and V shared-memory buffers
// and each item's Q buffer. Ragged K/V (where the layout allows: Sm90Maps) and Q come through
// TMA tensor maps: one producer thread issues a whole tile and arms its "full" mbarrier with
// the tile's bytes, and the other producer threads leave. Paged K/V (any page table, any
// strides) come by cp.async, each warp a quarter of the tile's keys, each copy arriving on the tile's
// barrier when it lands (cp.async.mbarrier.arrive). Either way the producer waits only for a
// free buffer ("empty", handed back by the consumers), never for data. It also writes each
// item's bounds (ItemRange) into the slot of its Q buffer (one or two: Sm90Traits).
// No CTA-wide barrier in the main loop: the three warpgroups run decoupled.
// Registers move from the producer (88 per thread, 72 at head_dim 256) to the consumers (208,
// 216) with setmaxnreg.
//
// Consumer loop, per KV tile j (FlashAttention-3's intra-warpgroup overlap): issue S_j = Q K_j^T
// (wgmma, Q and K from shared memory) and O += P_{j-1} V_{j-1} (P from registers, V from shared
// memory), wait for S_j only, then mask and softmax S_j on the CUDA cores while the tensor cores
// finish P V; wait, rescale O, pack P_j. The softmax folds the logits' scale into its exp2
// (sm90_softmax_step); masks, soft cap and ALiBi are the FA2 kernel's (common.cuh).
//
// Work. The grid is persistent: each CTA claims its units of the num_items * num_kv_heads
// (item, KV head) pairs one at a time (WorkOrder), its producer claiming the next while it
// issues the current one's tiles, so that it starts on the next item while its consumers finish
// the current one. A slot with no KV head (kNoUnit) ends the consumers' loop.
//
// Shared memory (128-byte swizzle, wgmma's own layout): kQBuffers x Q [128 x D], kStages x K
// [kTileKV x D], kStages x V [kTileKV x D_vo], the mbarriers, an ItemRange slot per Q buffer and
// two ints that hand the producer's claims to its other threads; the sizes per head dim are in
// Sm90Traits (one CTA per SM). An item's Q buffer also stages its output rows for coalesced 16-byte
// stores once its last S = Q K^T is done (sm90_store_o_smem).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../launch.cuh"
#include "common.cuh"
#include "params.cuh"
#include "sm90.cuh"
#include "tuning.cuh"


// Work order of the persistent grid for a batch of several requests: head-major, w = kv_head *
// num_items + item, over the plan's items (longest first; request by request where one KV head's
// K/V outgrows the L2: plan.py), so the CTAs running at one time share a KV head, whose K/V the L2
// then serves; one request: item-major (WorkOrder). The CTAs claim the units in that order as they
// become free (WorkOrder::claim), which keeps them within a few units of each other: the static
// deal it replaced (CTA x took w = x, x + gridDim.x, ...) let CTAs that drew short items run tens
// of rounds ahead, and 192/128 ragged 16 x 1024 at 128 heads read 5.9 GB from DRAM (2.3 GB the
// peer, 2.15 GB Q + K + V; Nsight Compute, H100: benchmarks/notes/sm90-dynamic-claims.md). The
// epilogue stages each warp's 16 output rows in its rows of the item's Q buffer (or the staging
// regions of kStageO) and stores them with one TMA store per 64-column block where they lie in the
// request (Sm90Maps::tma_o), whole rows with 16-byte coalesced stores otherwise. The measurements
// that chose these, and ping-pong between the consumer warpgroups (measured slower twice), are in
// benchmarks/notes/attention-ab-switches.md.

namespace flashinfer {
namespace attn {

/// Work unit w of the persistent grid: (item, KV head).
struct WorkUnit {
  int item;
  uint32_t kv_head;
};

/// The KV head of the slot that tells the consumers there is no further item.
constexpr uint32_t kNoUnit = 0xffffffffu;

/*!
 * @brief The units of the persistent grid and their claiming. Head-major (above), w = kv_head *
 *   num_items + item; where every item is of one request (its K/V streams are only the KV
 *   heads, which the CTAs running together share in either order), item-major, w = item *
 *   num_kv_heads + kv_head. The plan puts the items longest first (within each request where
 *   it goes request by request), so the short units come last. CTA x takes unit x, then each
 *   time its producer looks ahead claims the next unclaimed one: gridDim.x + the first
 *   counter's old value (one atomic per unit). A CTA whose claim comes back past the end is
 *   done; the last CTA done resets both counters, so they are 0 again for the next launch on
 *   the stream (or a graph replay). The claims replace a static deal in rounds of gridDim.x
 *   with every other round reversed where item-major; the greedy claims balance the CTAs at
 *   least as well (the longest CTA over the mean: benchmarks/probes/sm90_l2_model.py).
 */
struct WorkOrder {
  int num_items, num_work;
  uint32_t num_kv_heads;
  bool item_major;
  int32_t* counters;  // [claimed past the first round, CTAs done claiming]

  __device__ __forceinline__ WorkOrder(const AttentionParams& p) {
    num_items = *p.num_items;
    num_kv_heads = uint32_t(p.num_kv_heads);
    num_work = num_items * p.num_kv_heads;
    item_major = num_items > 0 && p.request_idx[0] == p.request_idx[num_items - 1];
    counters = p.work_counters;
  }
  __device__ __forceinline__ int first() const { return int(blockIdx.x); }
  __device__ __forceinline__ int claim() const {
    return int(gridDim.x) + atomicAdd(counters, 1);
  }
  /// Once this CTA's last claim is made (or it had none to make).
  __device__ __forceinline__ void finish() const {
    __threadfence();  // this CTA's claims before its count
    if (atomicAdd(counters + 1, 1) == int(gridDim.x) - 1) {
      __threadfence();
      atomicExch(counters, 0);
      atomicExch(counters + 1, 0);
    }
  }
  __device__ __forceinline__ WorkUnit unit(int w) const {
    if (item_major) return {int(uint32_t(w) / num_kv_heads), uint32_t(w) % num_kv_heads};
    return {w % num_items, uint32_t(w / num_items)};
  }
};

/// One work item as the producer hands it to the consumers.
struct ItemSlot {
  ItemRange r;
  uint32_t kv_head;
};

/// The TMA tensor maps of one launch (set by the launch where the layout allows them).
/// Q: a 3-D map over q as (head_dim, q heads, tokens) with 128-byte swizzle and box
/// (64, G, 128 / G), so the box of a KV head's G heads and 128 / G tokens lands as one column
/// block of the 128 packed rows of a Q tile, in the layout the wgmma descriptors read. Its
/// bytes complete on the Q buffer's barrier on their own; cp.async copies would hold up every
/// K/V copy the producer issues after them (cp.async.mbarrier.arrive counts all of a thread's
/// earlier copies). K and V (ragged only): (head_dim, KV heads, tokens), box (64, 1, kTileKV),
/// one column block of a ring tile per copy; one producer thread issues a whole tile and arms
/// its barrier with the bytes, so no consumer waits behind per-row address arithmetic.
struct Sm90Maps {
  CUtensorMap q, k, v;
  // The output as (head_dim_vo, q heads, tokens), box (64, G, 16 / G): one warp's 16 packed
  // rows of one 64-column block.
  CUtensorMap o;
  int tma_q;   // 0: Q by cp.async (any layout)
  int tma_kv;  // 0: K/V by cp.async (paged, or a layout the TMA cannot describe)
  int tma_o;   // 0: the output by 16-byte stores from each lane (split KV, or a layout the TMA
               // cannot describe)
};

/*!
 * @brief Compile-time facts of one Hopper attention kernel, derived from its head dims.
 * @tparam HEAD_DIM_ q and k head dim: 64, 128, 192 or 256
 * @tparam HEAD_DIM_VO_ v and output head dim: HEAD_DIM_, or 128 under 192 (MLA prefill)
 * @tparam POS_ kNone or kAlibi (in-kernel RoPE rotates K in shared memory: the FA2 kernel)
 *
 * Registers. A consumer thread holds O (HEAD_DIM_VO / 2 fp32), S (kTileKV / 2), P (kTileKV / 4)
 * and the row state. At head_dim 256 O alone is 128 registers, so the K/V tile narrows to 64
 * keys (S 32, P 16) and the consumers take more of the producer's registers (72 / 216,
 * tuning.cuh).
 * head_dim 512 is not built here: its O would be 256 registers per thread, past the 255 a
 * thread may have, with nothing left for S (the FA2 kernel splits its columns over two groups
 * of warps of one CTA).
 * Shared memory (227 KB): Q [128 x D] in kQBuffers buffers, then kStages x (K [kTileKV x D] +
 * V [kTileKV x D_vo]): as many stages as fit, at most four. head_dim 128: 2 Q + 2 x 64 KB
 * = 192 KB; 64: 2 Q + 4 x 32 KB; 256: one Q buffer (64 KB) + 2 x 64 KB of 64-key tiles = 192
 * KB (two Q buffers would leave 48-key tiles); 192 / 128: one Q buffer (48 KB) + 2 x 80 KB of
 * 128-key tiles + 16 KB where the first warpgroup stages its output (kStageO) = 224 KB. With
 * one Q buffer the consumers hand it back after the item's last S (kEarlyQ), so the next
 * item's Q loads during the item's last softmax, P V and epilogue. Measured (H200,
 * benchmarks/notes/sm90-head-dims.md): 64-key tiles against 80 (224 KB, FlashAttention-3's
 * choice) at 256: ragged 16 x 1024 404 vs 452 us, paged 8 x 2048 701 vs 789, non-causal 8192
 * 1658 vs 1745, causal 8192 848 vs 810 (both before kEarlyQ); at 192 / 128 the second call's
 * A/B of one Q buffer handed back early with 128-key tiles against two Q buffers and 96.
 */
template <typename DTypeQ_, typename DTypeO_, int HEAD_DIM_, int HEAD_DIM_VO_, MaskMode MASK_,
          PosEncoding POS_, bool PAGED_>
struct Sm90Traits {
  using DTypeQ = DTypeQ_;
  using DTypeO = DTypeO_;
  static constexpr int kHeadDim = HEAD_DIM_;
  static constexpr int kHeadDimVO = HEAD_DIM_VO_;
  static constexpr MaskMode kMask = MASK_;
  static constexpr PosEncoding kPos = POS_;
  static constexpr bool kPaged = PAGED_;
  static constexpr int kTileQ = 128;  // two consumer warpgroups x 64 rows
#ifdef FLASHINFER_ATTENTION_SM90_TILE_KV  // tuning override (benchmarks/tuning)
  static constexpr int kTileKV = FLASHINFER_ATTENTION_SM90_TILE_KV;
#else
  static constexpr int kTileKV = HEAD_DIM_ <= 192 ? 128 : 64;
#endif
#ifdef FLASHINFER_ATTENTION_SM90_Q_BUFFERS  // tuning override
  static constexpr int kQBuffers = FLASHINFER_ATTENTION_SM90_Q_BUFFERS;
#else
  static constexpr int kQBuffers = HEAD_DIM_ <= 128 ? 2 : 1;
#endif
  static constexpr size_t kQBytes = size_t(kTileQ) * HEAD_DIM_ * 2;
  static constexpr size_t kKBytes = size_t(kTileKV) * HEAD_DIM_ * 2;
  static constexpr size_t kVBytes = size_t(kTileKV) * HEAD_DIM_VO_ * 2;
  static constexpr size_t kSmemLimit = 227 * 1024;
#ifdef FLASHINFER_ATTENTION_SM90_STAGES  // tuning override (benchmarks/tuning/tune_attention.py)
  static constexpr int kStages = FLASHINFER_ATTENTION_SM90_STAGES;
#else
  // As many as shared memory holds (less 2 KB: the alignment slack, barriers and slots).
  static constexpr int kFit = int((kSmemLimit - 2048 - kQBuffers * kQBytes) / (kKBytes + kVBytes));
  static constexpr int kStages = kFit < 4 ? kFit : 4;
#endif
  static constexpr int kConsumerThreads = 256;
  static constexpr int kProducerThreads = 128;
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  // setmaxnreg moves registers within what the CTA was given at launch: the 64K register file
  // over kThreads, in steps of 8 (168 at 384 threads). A split asking for more blocks the
  // consumers forever. The producer's share: tuning.cuh.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = FLASHINFER_ATTENTION_SM90_PRODUCER_REGS;
  static constexpr int kConsumerRegs =
      (kThreads * kLaunchRegs - kProducerThreads * kProducerRegs) / kConsumerThreads / 8 * 8;
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 &&
                    kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <=
                        kThreads * kLaunchRegs,
                "setmaxnreg takes multiples of 8 and cannot exceed the CTA's launch registers");
  using QTile = sm90::Sw128Tile<kTileQ, HEAD_DIM_>;
  using KTile = sm90::Sw128Tile<kTileKV, HEAD_DIM_>;
  using VTile = sm90::Sw128Tile<kTileKV, HEAD_DIM_VO_>;
  using OTile = sm90::Sw128Tile<kTileQ, HEAD_DIM_VO_>;  // the output staged in a Q buffer
  // One Q buffer: the consumers hand it back once the item's last S = Q K^T is done, so the
  // next item's Q loads during the last softmax, P V and the epilogue (tuning.cuh). Each
  // warpgroup then stages its 64 output rows elsewhere (kStageO): the first in a region of
  // its own past the ring, the second in the last tile's V buffer (once the first's last P V,
  // which read all of it, is done); where that does not fit (80-key tiles at head_dim 256),
  // the output is stored from registers.
  static constexpr bool kEarlyQ = kQBuffers == 1 && FLASHINFER_ATTENTION_SM90_EARLY_Q != 0;
  using WgOTile = sm90::Sw128Tile<64, HEAD_DIM_VO_>;  // one warpgroup's output rows
  static constexpr size_t kWgOBytes = size_t(64) * HEAD_DIM_VO_ * 2;
  static constexpr size_t kRingOffset = kQBuffers * kQBytes;  // after the Q buffers
  static constexpr size_t kVOffset = kRingOffset + kStages * kKBytes;  // V tiles after K's
  static constexpr size_t kOStageOffset = kVOffset + kStages * kVBytes;
  static constexpr int kBarriers = 4 * kStages + 2 * kQBuffers;
  static constexpr size_t kClaimBytes = 2 * sizeof(int);  // the producer's claims, by parity
  // Barriers, item slots, and + 1024: the dynamic shared memory base is aligned up to the
  // swizzle atom in the kernel.
  static constexpr size_t kTailBytes =
      kBarriers * sizeof(uint64_t) + kQBuffers * sizeof(ItemSlot) + kClaimBytes + 1024;
  static constexpr bool kStageO = kEarlyQ && FLASHINFER_ATTENTION_SM90_STAGE_O != 0 &&
                                  kVBytes >= kWgOBytes &&
                                  kOStageOffset + kWgOBytes + kTailBytes <= kSmemLimit;
  static constexpr size_t kBarrierOffset = kOStageOffset + (kStageO ? kWgOBytes : 0);
  static constexpr size_t kRangeOffset = kBarrierOffset + kBarriers * sizeof(uint64_t);
  static constexpr size_t kClaimOffset = kRangeOffset + kQBuffers * sizeof(ItemSlot);
  static constexpr size_t kSmemBytes = kClaimOffset + kClaimBytes + 1024;

  static_assert(sizeof(DTypeQ) == 2, "wgmma takes fp16 or bf16 q and kv");
  static_assert((HEAD_DIM_ == HEAD_DIM_VO_ &&
                 (HEAD_DIM_ == 64 || HEAD_DIM_ == 128 || HEAD_DIM_ == 256)) ||
                    (HEAD_DIM_ == 192 && HEAD_DIM_VO_ == 128),
                "the Hopper kernel takes head_dim 64, 128 or 256, or 192 / 128");
  static_assert(kTileKV % 16 == 0 && kTileKV <= 128 && kTileKV / 2 <= 64,
                "K/V tiles: whole k16 steps of P V, one wgmma N of at most 128 for S");
  static_assert(HEAD_DIM_VO_ <= 128 || HEAD_DIM_VO_ % 128 == 0, "O in 128-column wgmmas");
  static_assert(POS_ != PosEncoding::kRopeLlama, "in-kernel RoPE runs in the FA2 kernel");
  static_assert(kQBuffers == 1 || kQBuffers == 2, "one or two Q buffers");
  static_assert(kStages >= 2, "the producer needs two buffers to run ahead");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory: at most 227 KB per CTA");
};

/// Where the warpgroups meet in shared memory. The mbarriers of the K/V ring: full (cp.async:
/// each of the 128 producer threads arrives when its copies land; TMA: one arrival that
/// expects the tile's bytes) and empty (one lane of each of the 8 consumer warps arrives), for
/// K and V separately so S_j can start before V_j has landed. The Q buffers: q_full (cp.async:
/// the producer's 128 copy arrivals plus one plain arrival that publishes the item's ItemRange
/// and KV head; TMA: one arrival that expects the bytes and publishes) and q_empty (the
/// consumer warps, after the epilogue).
template <class KT>
struct Sm90Sync {
  uint8_t* smem;
  __device__ __forceinline__ uint64_t* bar(int i) const {
    return reinterpret_cast<uint64_t*>(smem + KT::kBarrierOffset) + i;
  }
  __device__ __forceinline__ uint64_t* full_k(int s) const { return bar(s); }
  __device__ __forceinline__ uint64_t* full_v(int s) const { return bar(KT::kStages + s); }
  __device__ __forceinline__ uint64_t* empty_k(int s) const { return bar(2 * KT::kStages + s); }
  __device__ __forceinline__ uint64_t* empty_v(int s) const { return bar(3 * KT::kStages + s); }
  __device__ __forceinline__ uint64_t* q_full(int b) const { return bar(4 * KT::kStages + b); }
  __device__ __forceinline__ uint64_t* q_empty(int b) const {
    return bar(4 * KT::kStages + KT::kQBuffers + b);
  }
  __device__ __forceinline__ ItemSlot* slot(int b) const {
    return reinterpret_cast<ItemSlot*>(smem + KT::kRangeOffset) + b;
  }
  __device__ __forceinline__ volatile int* claim(int n) const {
    return reinterpret_cast<volatile int*>(smem + KT::kClaimOffset) + (n & 1);
  }
  template <typename T>
  __device__ __forceinline__ T* q_tile(int b) const {
    return reinterpret_cast<T*>(smem + b * KT::kQBytes);
  }
};

#ifdef FLASHINFER_SM90_ENABLED

/*!
 * @brief The producer warpgroup. Per work item: Q and the item's bounds into a Q buffer (once
 *   the consumers are done with the item kQBuffers back), then for every KV tile: wait for its
 *   ring buffer to be free, then load K and V. Through the TMA (ragged): thread 0 alone, one
 *   copy per 64-column block; with one Q buffer the item's first K/V tile goes out before the
 *   wait for it, so that it lands during the previous item's epilogue. By cp.async (paged, or a
 *   layout the TMA cannot take): rows past the sequence as zeros, every copy arriving on its
 *   barrier when it lands; warp w copies keys kTileKV / 4 x w .. of each tile, the page ids of
 *   the next tile fetched while the current one is issued.
 */
template <class KT>
__device__ __forceinline__ void sm90_produce(const AttentionParams& p, const Sm90Maps& tm,
                                             Sm90Sync<KT> sync) {
  using T = typename KT::DTypeQ;
  constexpr int D = KT::kHeadDim, DV = KT::kHeadDimVO, S = KT::kStages, kTileKV = KT::kTileKV;
  constexpr int NQ = KT::kQBuffers;
  constexpr int kChunks = D / 8;  // 16-byte chunks per Q row
  // K/V copies: lane l moves chunk l % 8 of every 128-byte column block (swizzle atom) of rows
  // 4 g + l / 8, g = 0 .. kGroups - 1, of its warp's kRowsPerWarp keys. A warp-wide copy is
  // four whole 128-byte lines, and a row's address is worked out once per tile, not per copy.
  constexpr int kRowsPerCopy = 4, kRowsPerWarp = kTileKV / 4;
  constexpr int kGroups = kRowsPerWarp / kRowsPerCopy;
  constexpr bool kCausal = KT::kMask == MaskMode::kCausal;
  static_assert(KT::kProducerThreads == 128 && kRowsPerWarp % kRowsPerCopy == 0 &&
                    kRowsPerWarp <= 32,
                "four producer warps, each a lane per key of its quarter of a tile");
  const int ptid = threadIdx.x - KT::kConsumerThreads;
  const int lane = ptid % 32, pwarp = ptid / 32;
  const int sub_row = lane / 8, sub_chunk = lane % 8;
  T* kv_smem = reinterpret_cast<T*>(sync.smem + KT::kRingOffset);
  auto k_tile = [&](int s) { return kv_smem + s * kTileKV * D; };
  auto v_tile = [&](int s) { return kv_smem + S * kTileKV * D + s * kTileKV * DV; };
  // Strides are below 2^31 (checked by the binding): 32 x 32 -> 64-bit products.
  const int k_s_page = int(p.k_stride_page), k_s_n = int(p.k_stride_n);
  const int v_s_page = int(p.v_stride_page), v_s_n = int(p.v_stride_n);
  const T* q = static_cast<const T*>(p.q);

  uint32_t c = 0;  // tiles issued by this CTA so far: ring slot c % S, round c / S
  uint32_t k = 0;  // items so far: Q buffer k % NQ, round k / NQ
  // The bounds of the next item are looked up (two dependent global loads) while the current
  // item's tiles are issued, not at the item boundary, where the consumers wait for them.
  const WorkOrder order(p);
  const int num_work = order.num_work;
  auto range_of = [&](int w) {
    return item_range<KT::kPaged, kCausal>(p, order.unit(w).item, KT::kTileQ, kTileKV);
  };
  const bool tma_kv = !KT::kPaged && tm.tma_kv;
  // Q and K/V both through the TMA: thread 0 issues everything, the others have nothing to do.
  const bool solo = tma_kv && tm.tma_q;
  if (solo && ptid != 0) return;
  // The next unit: thread 0 claims it and, where the other producer threads copy too, hands it
  // to them through one of two ints (by parity: the barrier of claim n + 1 comes after every
  // thread's read of claim n).
  uint32_t claims = 0;
  auto claim_next = [&] {
    if (solo) return order.claim();
    if (ptid == 0) *sync.claim(claims) = order.claim();
    sm90::named_barrier(4, KT::kProducerThreads);
    return *sync.claim(claims++);
  };
  int w_next = order.first();
  ItemRange r_next = w_next < num_work ? range_of(w_next) : ItemRange{};
  for (int w = w_next; w < num_work; w = w_next) {
    const ItemRange r = r_next;
    const uint32_t kv_head = order.unit(w).kv_head;
    bool looked_up = false;
    // The next unit is claimed and its bounds looked up while this item's tiles are issued.
    // With its bounds known, the next item's Q rows are prefetched into the L2 (one row per
    // thread), so its Q load after this item's last tile hits the L2. That matters most for
    // the cp.async path, where every K/V copy issued after the Q copies waits for them too
    // (cp.async.mbarrier.arrive counts all of a thread's earlier copies). Issuing the Q load
    // itself earlier was slower (benchmarks/NOTES.md).
    auto look_up_next = [&] {
      if (looked_up) return;
      looked_up = true;
      w_next = claim_next();
      if (w_next < num_work) {
        r_next = range_of(w_next);
        const int pr = r_next.row_begin + ptid;
        if (pr < r_next.packed_len) {
          const auto [qo, head] =
              qo_head(pr, order.unit(w_next).kv_head, p.group_div);
          const T* src = q + (r_next.qo_begin + qo) * p.q_stride_n + head * p.q_stride_h;
#pragma unroll
          for (int b = 0; b < D / 64; ++b) prefetch_l2(src + 64 * b);  // 128-byte lines
        }
      }
    };

    // Tile i of the item through the TMA (thread 0): wait for the ring buffer, arm its
    // barrier with the tile's bytes, one copy per 64-column block. Keys past the item come in
    // as the next request's keys (zeros past the tensor): masked to -inf, and the consumers
    // zero V rows past the request (zero_v_tail) so no stale value meets P = 0.
    auto tma_tile = [&](int i) {
      const int s = c % S;
      const uint32_t free_phase = (c / S + 1) & 1;
      const int tok = int(r.kv_token_begin) + r.kv_lo + i * kTileKV;
      auto load = [&](T* dst, const CUtensorMap* map, uint64_t* full, uint64_t* empty,
                      auto blocks, uint32_t bytes, uint32_t block_elems) {
        if (c >= S) sm90::mbar_wait(empty, free_phase);
        sm90::mbar_arrive_expect_tx(full, bytes);
#pragma unroll
        for (int b = 0; b < decltype(blocks)::value; ++b) {
          sm90::tma_load_3d(dst + b * block_elems, map, full, 64 * b, int(kv_head), tok);
        }
      };
      load(k_tile(s), &tm.k, sync.full_k(s), sync.empty_k(s),
           std::integral_constant<int, D / 64>{}, uint32_t(KT::kKBytes),
           uint32_t(KT::KTile::kBlockElems));
      load(v_tile(s), &tm.v, sync.full_v(s), sync.empty_v(s),
           std::integral_constant<int, DV / 64>{}, uint32_t(KT::kVBytes),
           uint32_t(KT::VTile::kBlockElems));
    };
    int first_tile = 0;
    if (tma_kv && NQ == 1 && r.num_tiles > 0) {
      if (ptid == 0) tma_tile(0);
      ++c;
      first_tile = 1;
    }

    // Q [128 rows] and the item's facts.
    const int qb = k % NQ;
    if (k >= NQ) sm90::mbar_wait(sync.q_empty(qb), (k / NQ + 1) & 1);
    if (ptid == 0) *sync.slot(qb) = ItemSlot{r, kv_head};
    T* q_smem = sync.template q_tile<T>(qb);
    const int G = p.group_size;
    if (tm.tma_q) {
      // Rows past the request are the next request's (zeros past the tensor): finite, and
      // their outputs are not written.
      if (ptid == 0) {
        sm90::mbar_arrive_expect_tx(sync.q_full(qb), uint32_t(KT::kQBytes));  // publishes too
#pragma unroll
        for (int b = 0; b < D / 64; ++b) {
          sm90::tma_load_3d(q_smem + b * KT::QTile::kBlockElems, &tm.q, sync.q_full(qb),
                            64 * b, int(kv_head) * G, r.qo_begin + r.row_begin / G);
        }
      }
    } else {
      // Rows past the request as zeros.
      for (int i = ptid; i < KT::kTileQ * kChunks; i += KT::kProducerThreads) {
        const int row = i / kChunks, chunk = i % kChunks;
        const int pr = r.row_begin + row;
        const bool valid = pr < r.packed_len;
        const T* src = q;
        if (valid) {
          const auto [qo, head] = qo_head(pr, kv_head, p.group_div);
          src = q + (r.qo_begin + qo) * p.q_stride_n + head * p.q_stride_h + chunk * 8;
        }
        cp_async_16(q_smem + KT::QTile::offset(row, chunk), src, valid);
      }
      sm90::cp_async_arrive_noinc(sync.q_full(qb));
      if (ptid == 0) sm90::mbar_arrive(sync.q_full(qb));  // publishes the slot (release)
    }
    ++k;

    if (tma_kv) {
      for (int i = first_tile; i < r.num_tiles; ++i, ++c) {
        if (ptid == 0) tma_tile(i);
        look_up_next();
      }
      look_up_next();
      continue;
    }

    const T* k_base = static_cast<const T*>(p.k) + int64_t(kv_head) * p.k_stride_h + sub_chunk * 8;
    const T* v_base = static_cast<const T*>(p.v) + int64_t(kv_head) * p.v_stride_h + sub_chunk * 8;
    if constexpr (!KT::kPaged) {
      k_base += r.kv_token_begin * p.k_stride_n;
      v_base += r.kv_token_begin * p.v_stride_n;
    }
    // The page id of key kRowsPerWarp x pwarp + lane of tile i, one load per lane, issued a
    // tile ahead. Keys past the end are clamped to the last key and copied as zeros.
    auto lookup = [&](int i) {
      if constexpr (!KT::kPaged) return 0;
      const int tok = min(r.kv_lo + i * kTileKV + kRowsPerWarp * pwarp + lane, r.kv_hi - 1);
      return p.kv_indices[r.page_begin + int(p.page_size.div(uint32_t(tok)))];
    };
    int next_page = r.num_tiles > 0 ? lookup(0) : 0;
    for (int i = 0; i < r.num_tiles; ++i, ++c) {
      const int s = c % S;
      const uint32_t free_phase = (c / S + 1) & 1;  // completion of round c / S - 1
      const int base = r.kv_lo + i * kTileKV;
      // Paged: each lane turns its own key's page and slot into K and V offsets once per tile,
      // and a row group takes them from the owning lane (two shuffles). The division by the
      // page size and the 64-bit products per copy had made the producer the bottleneck of
      // paged prefill (Nsight Compute: 8 x 2048, benchmarks/NOTES.md).
      int64_t k_own = 0, v_own = 0;
      if constexpr (KT::kPaged) {
        const int tok = min(base + kRowsPerWarp * pwarp + lane, r.kv_hi - 1);
        const int slot = tok - int(p.page_size.div(uint32_t(tok)) * p.page_size.d);
        k_own = mul_wide(slot, k_s_n) + mul_wide(next_page, k_s_page);
        v_own = mul_wide(slot, v_s_n) + mul_wide(next_page, v_s_page);
      }
      // Rows past the end are zero-filled; only the last tile of an item has any.
      const bool full = base + kTileKV <= r.kv_hi;
      auto copy_tile = [&](T* dst, const T* src, int64_t own, int s_n, auto tile) {
        using Tile = decltype(tile);
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          const int key = kRowsPerCopy * g + sub_row;  // within the warp's kRowsPerWarp
          const int row = kRowsPerWarp * pwarp + key;
          int64_t off;
          if constexpr (KT::kPaged) {
            (void)s_n;
            off = __shfl_sync(0xffffffff, own, key);
          } else {
            (void)own;
            off = mul_wide(min(base + row, r.kv_hi - 1), s_n);
          }
          const bool valid = full || base + row < r.kv_hi;
#pragma unroll
          for (int b = 0; b < Tile::kCols / 64; ++b) {
            cp_async_16(dst + Tile::offset(row, 8 * b + sub_chunk), src + off + 64 * b, valid);
          }
        }
      };
      if (c >= S) sm90::mbar_wait(sync.empty_k(s), free_phase);
      copy_tile(k_tile(s), k_base, k_own, k_s_n, typename KT::KTile{});
      sm90::cp_async_arrive_noinc(sync.full_k(s));
      if (i + 1 < r.num_tiles) next_page = lookup(i + 1);  // lands while V is issued
      if (c >= S) sm90::mbar_wait(sync.empty_v(s), free_phase);
      copy_tile(v_tile(s), v_base, v_own, v_s_n, typename KT::VTile{});
      sm90::cp_async_arrive_noinc(sync.full_v(s));
      look_up_next();  // after the item's first tile is on its way
    }
    look_up_next();
  }
  if (ptid == 0) order.finish();
  // The end: a slot with no KV head, published as an item's would be (without its copies).
  const int qb = k % NQ;
  if (k >= NQ) sm90::mbar_wait(sync.q_empty(qb), (k / NQ + 1) & 1);
  if (ptid == 0) *sync.slot(qb) = ItemSlot{ItemRange{}, kNoUnit};
  if (!tm.tma_q) sm90::cp_async_arrive_noinc(sync.q_full(qb));
  if (ptid == 0) sm90::mbar_arrive(sync.q_full(qb));
}

/// Hands a buffer back to the producer: one arrival per warp, after the warp's wgmma wait (which
/// all its lanes have passed).
__device__ __forceinline__ void sm90_release(uint64_t* bar) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) sm90::mbar_arrive(bar);
}

/// Waits for a buffer the producer filled, then (`cp_async`: filled with cp.async) orders those
/// generic-proxy writes before this thread's wgmma (async-proxy) reads of it; TMA writes are
/// async-proxy writes already.
__device__ __forceinline__ void sm90_acquire(uint64_t* bar, uint32_t parity, bool cp_async = true) {
  sm90::mbar_wait(bar, parity);
  if (cp_async) sm90::fence_proxy_async();
}

/*!
 * @brief One online-softmax step over raw Q K^T logits (masked keys -inf) with the logits'
 *   scale folded into the exponent: the row maxima are taken over the raw values and scaled
 *   once, and each element becomes exp2(s * scale - m) in one FFMA before the ex2, where
 *   softmax_step (common.cuh) takes logits the logits pass has already scaled (a multiply and
 *   a subtraction per element). m is in the scaled domain either way. `scale` > 0.
 */
template <int NB>
__device__ __forceinline__ bool sm90_softmax_step(float (&s)[1][NB][4], float (&m)[1][2],
                                                  float (&d)[1][2], float (&row_scale)[1][2],
                                                  float scale) {
  bool rescale = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < NB; ++n) mx = fmaxf(mx, fmaxf(s[0][n][2 * h], s[0][n][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
    mx = fmaxf(m[0][h], mx * scale);
    const float m_safe = mx == -INFINITY ? 0.f : mx;
    rescale |= mx != m[0][h];
    row_scale[0][h] = fast_exp2(m[0][h] - m_safe);  // m_old = -inf -> 0
    m[0][h] = mx;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NB; ++n) {
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        s[0][n][e] = fast_exp2(fmaf(s[0][n][e], scale, -m_safe));
        sum += s[0][n][e];
      }
    }
    d[0][h] = d[0][h] * row_scale[0][h] + sum;
  }
  return __any_sync(0xffffffff, rescale);
}

/// The end of a thread's two rows (g and g + 8): the base-2 lse (the sink folded in) and the
/// factor of the output, 1 / (row sum) times the sink's share (o_scale not applied). Worked
/// out from the row state alone, so the consumer takes it while the item's last P V runs.
struct Sm90RowEnd {
  float lse[2];
  float inv[2];
};

/// Sm90RowEnd of the thread's rows from the quad-summed row sums `d`, the maxima `m` and the
/// sinks' sink_log2 (-inf: none).
__device__ __forceinline__ Sm90RowEnd sm90_row_end(const float (&m)[1][2], const float (&d)[1][2],
                                                   const float (&sink)[2]) {
  Sm90RowEnd e;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    e.lse[h] = d[0][h] > 0.f ? m[0][h] + log2f(d[0][h]) : -INFINITY;
    e.inv[h] = (d[0][h] > 0.f ? 1.f / d[0][h] : 0.f) * fold_sink_log2(sink[h], e.lse[h]);
  }
  return e;
}

/*!
 * @brief The final output of one warp's 16 rows through shared memory: the accumulators
 *   (normalized and scaled, in the output dtype) into rows `tile_row` .. `tile_row` + 15 of
 *   `stage`, a Tile (a Q buffer, or one warpgroup's rows: KT::WgOTile; the same swizzled
 *   layout: conflict-free for the 4-byte writes of the accumulator layout and for the 16-byte
 *   reads of whole rows), then each row to global memory as D / 8 16-byte chunks. Rows past
 *   the request are skipped; the lse as before. `e`: the rows' lse and output factor
 *   (sm90_row_end; o_scale applied here).
 */
template <class KT, class Tile = typename KT::OTile>
__device__ __forceinline__ void sm90_store_o_smem(const OutputWriter<typename KT::DTypeO,
                                                                      KT::kHeadDimVO>& out,
                                                  const float (&o)[1][KT::kHeadDimVO / 8][4],
                                                  const Sm90RowEnd& e,
                                                  typename KT::DTypeO* stage, int tile_row,
                                                  int first_row, int lane,
                                                  const CUtensorMap* o_map, bool tma_o) {
  using TO = typename KT::DTypeO;
  constexpr int D = KT::kHeadDimVO, kChunks = D / 8, kRowsPerPass = 32 / kChunks;
  static_assert(sizeof(TO) == 2, "the output tile is staged in a 2-byte Q buffer");
  const AttentionParams& p = out.p;
  const ItemRange& r = out.r;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = tile_row + g + 8 * h, pr = first_row + g + 8 * h;
    const float inv = e.inv[h] * p.o_scale;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(stage + Tile::offset(row, n) + 2 * t) =
          pack2<TO>(o[0][n][2 * h] * inv, o[0][n][2 * h + 1] * inv);
    }
    if (t == 0 && pr < r.packed_len) {
      out.lse(pr, e.lse[h]);
    }
  }
  __syncwarp();
  if (tma_o && first_row + 16 <= r.packed_len) {
    // The warp's 16 rows lie in the request: one TMA store per 64-column block, whose bytes
    // the engine reads from `stage` before lane 0 goes on (the stage is overwritten later;
    // waiting only before the next item's rows, where the stage is the warp's own, measured
    // the same: benchmarks/notes/sm90-dynamic-claims.md).
    sm90::fence_proxy_async();
    __syncwarp();
    if (lane == 0) {
      // (first_row is a multiple of 16, so of G: the box starts at head kv_head * G.)
      const auto [qo, head] = qo_head(first_row, out.kv_head, p.group_div);
#pragma unroll
      for (int b = 0; b < D / 64; ++b) {
        sm90::tma_store_3d(o_map, stage + Tile::offset(tile_row, 8 * b), 64 * b, head,
                           r.qo_begin + qo);
      }
      sm90::tma_store_commit();
      sm90::tma_store_wait_read();
    }
    __syncwarp();
    return;
  }
  // Packed row pr is q row pr / G, head pr % G of the KV head's group: this lane's rows step
  // by kRowsPerPass, so (qo, head) step by (kRowsPerPass / G, kRowsPerPass % G) with a carry
  // (two multiply-shifts in all, not a division per row).
  const int G = p.group_size, chunk = lane % kChunks;
  const int pr0 = first_row + lane / kChunks;
  auto [qo, head] = qo_head(pr0, 0, p.group_div);
  const auto [q_step, h_step] = qo_head(kRowsPerPass, 0, p.group_div);
  TO* o_base = static_cast<TO*>(p.o) + int64_t(r.qo_begin) * p.o_stride_n +
               int64_t(out.kv_head) * G * p.o_stride_h + chunk * 8;
#pragma unroll
  for (int it = 0; it < 16 / kRowsPerPass; ++it) {
    const int lr = it * kRowsPerPass + lane / kChunks;
    const uint4 v = *reinterpret_cast<const uint4*>(stage + Tile::offset(tile_row + lr, chunk));
    if (first_row + lr < r.packed_len) {
      *reinterpret_cast<uint4*>(o_base + qo * p.o_stride_n + head * p.o_stride_h) = v;
    }
    head += h_step;
    qo += q_step;
    if (head >= G) {
      head -= G;
      ++qo;
    }
  }
}

/*!
 * @brief The final output of one warp's 16 rows straight from the accumulators (one Q buffer
 *   handed back early, a V buffer too small to stage 128 rows): 4-byte stores (OutputWriter
 *   applies o_scale), the lse as sm90_store_o_smem.
 */
template <class KT>
__device__ __forceinline__ void sm90_store_o_regs(const OutputWriter<typename KT::DTypeO,
                                                                      KT::kHeadDimVO>& out,
                                                  const float (&o)[1][KT::kHeadDimVO / 8][4],
                                                  const Sm90RowEnd& e, int first_row, int g,
                                                  int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int pr = first_row + g + 8 * h;
    if (pr >= out.r.packed_len) continue;
    const float inv = e.inv[h];
#pragma unroll
    for (int n = 0; n < KT::kHeadDimVO / 8; ++n)
      out.pair(pr, n * 8 + 2 * t, o[0][n][2 * h] * inv, o[0][n][2 * h + 1] * inv);
    if (t == 0) out.lse(pr, e.lse[h]);
  }
}

/// A consumer warpgroup: 64 rows of every work item of this CTA.
template <class KT>
__device__ __forceinline__ void sm90_consume(const AttentionParams& p, const bool tma_kv,
                                             const CUtensorMap* o_map, const bool tma_o,
                                             Sm90Sync<KT> sync) {
  using T = typename KT::DTypeQ;
  using TO = typename KT::DTypeO;
  constexpr int D = KT::kHeadDim, DV = KT::kHeadDimVO, S = KT::kStages, kTileKV = KT::kTileKV;
  // O += P V in wgmmas of at most 128 columns (the instruction takes up to 256, but 128 fp32
  // accumulators per operand list would be one asm statement of 128 outputs).
  constexpr int kON = DV < 128 ? DV : 128, kOSplits = DV / kON;
  using Mma = sm90::Wgmma<T, kTileKV>;  // S = Q K^T: 64 x kTileKV per warpgroup
  using MmaO = sm90::Wgmma<T, kON>;     // O += P V: 64 x DV per warpgroup, kON at a time
  constexpr int NB = kTileKV / 8;  // 8-key blocks of S per thread
  constexpr bool kRescaleEarly = FLASHINFER_ATTENTION_SM90_RESCALE_EARLY != 0;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // The consumer warpgroup (rows 64 wg .. 64 wg + 63 of the tile), taken from lane 0 so that
  // ptxas knows it warp-uniform: the Q descriptors then live in uniform registers instead of
  // being rebuilt in vector registers (a 64-bit add and a move to a uniform register per k16
  // step of every S = Q K^T).
  const int wg = __shfl_sync(0xffffffff, warp / 4, 0);
  const int g = lane / 4, t = lane % 4;

  T* v_smem = reinterpret_cast<T*>(sync.smem + KT::kVOffset);
  // Descriptors: K-major Q and K (8-row groups 1024 bytes apart), MN-major V (64-column blocks
  // kBlockBytes apart). A k16 step moves 32 bytes along a 128-byte row; past 64 columns it
  // moves to the next column block. Offsets are added in 16-byte units.
  const uint64_t q_desc = sm90::smem_desc(sync.template q_tile<T>(0) + wg * 64 * 64, 16, 1024);
  const uint64_t k_desc = sm90::smem_desc(sync.smem + KT::kRingOffset, 16, 1024);
  const uint64_t v_desc = sm90::smem_desc(v_smem, KT::VTile::kBlockBytes, 1024);
  auto k_step = [](int kk) -> uint64_t {
    return ((kk / 4) * KT::KTile::kBlockBytes + (kk % 4) * 32) >> 4;
  };
  auto q_step = [](int kk) -> uint64_t {
    return ((kk / 4) * KT::QTile::kBlockBytes + (kk % 4) * 32) >> 4;
  };
  constexpr uint64_t kKStep = KT::kKBytes >> 4, kVStep = KT::kVBytes >> 4;
  constexpr uint64_t kQStep = KT::kQBytes >> 4;

  float s[1][NB][4];
  float o[1][DV / 8][4];
  uint32_t pf[kTileKV / 16][4];
  auto& s_flat = reinterpret_cast<float(&)[NB * 4]>(s);
  auto& o_flat = reinterpret_cast<float(&)[DV / 2]>(o);
  // Columns 128 h .. 128 h + 127 of O: accumulators 64 h .. 64 h + 63 (8-column blocks in
  // order, the layout of one wgmma over all DV columns).
  auto o_part = [&](int h) -> float(&)[kON / 2] {
    return *reinterpret_cast<float(*)[kON / 2]>(o_flat + h * (kON / 2));
  };
  auto& pf_flat = reinterpret_cast<uint32_t(&)[kTileKV / 4]>(pf);

  auto issue_qk = [&](int qb, int slot) {
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      Mma::ss(s_flat, q_desc + qb * kQStep + q_step(kk), k_desc + slot * kKStep + k_step(kk),
              kk > 0);
    }
    sm90::wgmma_commit();
  };
  auto issue_pv = [&](int slot) {
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTileKV / 16; ++kk) {
      // Keys 16 kk .. 16 kk + 15: 16 rows of 128 bytes into the slot's V tile; columns
      // 128 h ..: two column blocks further per h.
#pragma unroll
      for (int h = 0; h < kOSplits; ++h) {
        MmaO::rs_mn(o_part(h), pf[kk],
                    v_desc + slot * kVStep +
                        ((kk * 16 * 128 + h * (kON / 64) * KT::VTile::kBlockBytes) >> 4),
                    1);
      }
    }
    sm90::wgmma_commit();
  };
  auto pack_all = [&] {
#pragma unroll
    for (int kk = 0; kk < kTileKV / 16; ++kk) pack_p<T>(pf[kk], s, 0, kk);
  };

  auto zero_o = [&] {
#pragma unroll
    for (int n = 0; n < DV / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[0][n][e] = 0.f;
  };

  // A TMA-filled V tile that runs past the request's keys holds the next request's rows (or
  // whatever a larger buffer holds past the last request): their P is 0, but 0 x NaN is not,
  // so those rows become zeros before the P V that reads them. Both warpgroups write half of
  // them, then meet (hardware barrier 1). Rare: the last tile of an item that reaches past
  // the request's last key.
  auto zero_v_tail = [&](int slot, int base, const ItemRange& r) {
    const int from = r.kv_len - base;
    if (!tma_kv || from >= kTileKV) return;
    T* v = v_smem + slot * kTileKV * DV;
    constexpr int kChunks = DV / 8;
    for (int i = tid; i < (kTileKV - from) * kChunks; i += KT::kConsumerThreads) {
      *reinterpret_cast<uint4*>(v + KT::VTile::offset(from + i / kChunks, i % kChunks)) =
          make_uint4(0, 0, 0, 0);
    }
    sm90::fence_proxy_async();
    sm90::named_barrier(1, KT::kConsumerThreads);
  };

  // Every wgmma is issued and waited for within one item: ptxas serializes all of them if one
  // stays in flight across the loop's back edge (warnings C7514, C7518). Issuing the next item's
  // S_0 behind the last P V (writing the item out while it computes) was tried that way and
  // measured 13% slower on 16 x 1024 ragged prefill: it waits for the next item's first tile.
  // The logits' scale goes into the softmax's exp2 (sm90_softmax_step) where the logits are
  // plain: no soft cap and no ALiBi (both transform scaled logits), a positive scale.
  const bool fold =
      KT::kPos == PosEncoding::kNone && p.softcap_post == 0.f && p.sm_scale_log2 > 0.f;
  const float exp_scale = fold ? p.sm_scale_log2 : 1.f;
  auto logits = [&](const ItemRange& r, const RowFacts<1>& rows, int base) {
    logits_and_mask<KT::kMask, KT::kPos>(s, p, r, rows, base, kTileKV, t, !fold);
  };
  auto softmax = [&](float (&m)[1][2], float (&d)[1][2], float (&scale)[1][2]) {
    return sm90_softmax_step(s, m, d, scale, exp_scale);
  };

  uint32_t c = 0;  // tiles consumed by this CTA so far (the producer counts the same way)
  for (uint32_t k = 0;; ++k) {  // k: items so far
    const int qb = k % KT::kQBuffers;
    sm90_acquire(sync.q_full(qb), (k / KT::kQBuffers) & 1);
    const uint32_t kv_head = sync.slot(qb)->kv_head;
    if (kv_head == kNoUnit) break;
    const ItemRange r = sync.slot(qb)->r;
    const int first_row = r.row_begin + wg * 64 + (warp % 4) * 16;  // this warp's 16 rows
    // The sinks of this thread's two rows, loaded at the item's start (set_up) so that the
    // epilogue does not wait on them (a load there cost paged 8 x 2048 prefill 5%; -inf: none,
    // sink_log2).
    float sink[2];
    float m[1][2] = {{-INFINITY, -INFINITY}}, d[1][2] = {{0.f, 0.f}};
    Sm90RowEnd end;  // the rows' lse and output factor, once the last softmax is done
    auto set_up = [&] {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sink[h] = sink_log2(p, r, qo_head(first_row + g + 8 * h, kv_head, p.group_div).head);
      zero_o();
    };

    if (r.num_tiles > 0) {
      // Tile 0: S only, issued before the item's setup, which runs while the tensor cores
      // compute it. (Its issue and its wait stay in one branch: ptxas serializes every wgmma
      // of the kernel otherwise, C7518.)
      {
        const int slot = c % S;
        sm90_acquire(sync.full_k(slot), (c / S) & 1, !tma_kv);
        issue_qk(qb, slot);
      }
      set_up();
      RowFacts<1> rows;
      rows.template init<KT::kPos>(p, r, first_row, kv_head, g);
      {
        const int slot = c % S;
        sm90::wgmma_wait<0>();
        sm90::fence_operands(s_flat);
        sm90_release(sync.empty_k(slot));
        if (KT::kEarlyQ && r.num_tiles == 1) sm90_release(sync.q_empty(qb));
        logits(r, rows, r.kv_lo);
        float scale[1][2];
        softmax(m, d, scale);  // O is still zero: nothing to rescale
        pack_all();
      }
      // Tiles 1 ..: S_j overlaps the softmax with P_{j-1} V_{j-1}. With kRescaleEarly, O
      // takes the scale of softmax j - 1 while the tensor cores run S_j, just before
      // P_{j-1} V_{j-1} is issued; otherwise once P_{j-1} V_{j-1} has completed.
      float pending[1][2];     // the last softmax's scale, not yet applied to O
      bool rescale_o = false;  // warp-uniform: some row of the warp has a new maximum
      auto apply_rescale = [&] {
        if (rescale_o) {
#pragma unroll
          for (int n = 0; n < DV / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[0][n][e] *= pending[0][e / 2];
        }
      };
      for (int j = 1; j < r.num_tiles; ++j) {
        const uint32_t cj = c + j;
        const int slot = cj % S, prev = (cj - 1) % S;
        sm90_acquire(sync.full_k(slot), (cj / S) & 1, !tma_kv);
        sm90_acquire(sync.full_v(prev), ((cj - 1) / S) & 1, !tma_kv);
        // (No zero_v_tail: only an item's last tile reaches past its request's keys.)
        issue_qk(qb, slot);
        if constexpr (kRescaleEarly) apply_rescale();
        issue_pv(prev);
        sm90::wgmma_wait<1>();  // S_j
        sm90::fence_operands(s_flat);
        sm90_release(sync.empty_k(slot));
        if (KT::kEarlyQ && j == r.num_tiles - 1) sm90_release(sync.q_empty(qb));
        logits(r, rows, r.kv_lo + j * kTileKV);
        rescale_o = softmax(m, d, pending);
        sm90::wgmma_wait<0>();  // P_{j-1} V_{j-1}
        sm90::fence_operands(o_flat);
        sm90::fence_operands(pf_flat);
        sm90_release(sync.empty_v(prev));
        if constexpr (!kRescaleEarly) apply_rescale();
        pack_all();
      }
      // The last tile's P V.
      if constexpr (kRescaleEarly) apply_rescale();
      const uint32_t cl = c + r.num_tiles - 1;
      sm90_acquire(sync.full_v(cl % S), (cl / S) & 1, !tma_kv);
      zero_v_tail(cl % S, r.kv_lo + (r.num_tiles - 1) * kTileKV, r);
      issue_pv(cl % S);
      // The rows' end while the tensor cores run the last P V.
      quad_sum(d);
      end = sm90_row_end(m, d, sink);
      sm90::wgmma_wait<0>();
      sm90::fence_operands(o_flat);
      sm90::fence_operands(pf_flat);
      // kStageO: the second warpgroup stages its output in this V buffer (below) and hands
      // it back then; the first one's arrival tells it that its last P V is done.
      if (!KT::kStageO || wg == 0) sm90_release(sync.empty_v(cl % S));
      c += r.num_tiles;
    } else {
      set_up();
      end = sm90_row_end(m, d, sink);  // no key: lse -inf (or the sink's), output 0
    }

    // A row that saw no key writes 0 and lse -inf.
    const OutputWriter<TO, DV> out{p, r, kv_head, writes_partial(p, r)};
    const int tile_row = wg * 64 + (warp % 4) * 16;
    // Where the Q buffer is still held (two buffers, or an item without tiles) it is free for
    // the output now: every wgmma of the item has completed (its last P V needed all four
    // warps of the warpgroup past their last S wait), and each warp writes only the 16 rows it
    // owns; the producer refills the buffer after q_empty below. Under kEarlyQ the producer
    // may be filling it with the next item's Q already: kStageO or registers.
    const bool q_held = !KT::kEarlyQ || r.num_tiles == 0;
    // kStageO: hardware barrier 2 or 3 by item parity, so that the first warpgroup's arrival
    // for one item never counts toward the previous item's (it cannot run two items ahead:
    // the next item's Q needs the second warpgroup past this item's epilogue).
    if (p.split_kv) {
      out.rows(o, m, d, first_row, g, t);
    } else if (q_held) {
      sm90_store_o_smem<KT>(out, o, end, sync.template q_tile<TO>(qb), tile_row, first_row,
                            lane, o_map, tma_o);
    } else if constexpr (KT::kStageO) {
      // The first warpgroup in its own region; the second in the last tile's V buffer once
      // the first warpgroup's last P V (which read it) is done.
      TO* stage = reinterpret_cast<TO*>(sync.smem + KT::kOStageOffset);
      if (wg == 0) {
        if (k & 1) sm90::named_barrier_arrive(3, KT::kConsumerThreads);
        else sm90::named_barrier_arrive(2, KT::kConsumerThreads);
      } else {
        if (k & 1) sm90::named_barrier(3, KT::kConsumerThreads);
        else sm90::named_barrier(2, KT::kConsumerThreads);
        stage = reinterpret_cast<TO*>(v_smem + (c - 1) % S * kTileKV * DV);
      }
      sm90_store_o_smem<KT, typename KT::WgOTile>(out, o, end, stage, (warp % 4) * 16,
                                                  first_row, lane, o_map, tma_o);
    } else {
      sm90_store_o_regs<KT>(out, o, end, first_row, g, t);
    }
    // The epilogue's shared-memory accesses (generic proxy) come before the next TMA write of
    // the buffer it used (async proxy); the first warpgroup's own region takes none.
    if (q_held || (KT::kStageO && wg == 1)) sm90::fence_proxy_async();
    if (KT::kStageO && wg == 1 && r.num_tiles > 0) sm90_release(sync.empty_v((c - 1) % S));
    if (q_held) sm90_release(sync.q_empty(qb));
  }
  // The output's TMA stores complete before the kernel ends (and before a dependent launch).
  if (tma_o && lane == 0) sm90::tma_store_wait_all();
}

#endif  // FLASHINFER_SM90_ENABLED

template <class KT>
__global__ void __launch_bounds__(KT::kThreads, 1)
    attention_kernel_sm90(const __grid_constant__ AttentionParams p,
                          const __grid_constant__ Sm90Maps tm) {
#ifdef FLASHINFER_SM90_ENABLED
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  const Sm90Sync<KT> sync{smem};
  if (threadIdx.x == 0) {
    constexpr uint32_t kConsumerWarps = KT::kConsumerThreads / 32;
    for (int s = 0; s < KT::kStages; ++s) {
      // cp.async: each producer thread's copy arrival; TMA: one arrival that expects the bytes.
      sm90::mbar_init(sync.full_k(s), tm.tma_kv ? 1 : KT::kProducerThreads);
      sm90::mbar_init(sync.full_v(s), tm.tma_kv ? 1 : KT::kProducerThreads);
      sm90::mbar_init(sync.empty_k(s), kConsumerWarps);
      sm90::mbar_init(sync.empty_v(s), kConsumerWarps);
    }
    for (int b = 0; b < KT::kQBuffers; ++b) {
      // cp.async: the producer threads' copy arrivals and one that publishes the slot; TMA:
      // one arrival that expects the bytes.
      sm90::mbar_init(sync.q_full(b), tm.tma_q ? 1 : KT::kProducerThreads + 1);
      sm90::mbar_init(sync.q_empty(b), kConsumerWarps);
    }
  }
  __syncthreads();
  pdl_wait();
  if (threadIdx.x >= KT::kConsumerThreads) {
    sm90::set_max_regs_dec<KT::kProducerRegs>();
    sm90_produce<KT>(p, tm, sync);
  } else {
    sm90::set_max_regs_inc<KT::kConsumerRegs>();
    sm90_consume<KT>(p, tm.tma_kv != 0, &tm.o, tm.tma_o != 0, sync);
  }
  pdl_launch_dependents();
#endif
}

/*!
 * @brief Launch the Hopper attention kernel of traits KT over a persistent grid of `grid_x`
 *   CTAs (one per SM is resident: 384 threads, 192 KB of shared memory at head_dim 128); `tm`
 *   says whether Q and K/V come through tensor maps.
 */
template <class KT>
cudaError_t LaunchAttentionSm90(const AttentionParams& p, const Sm90Maps& tm, int grid_x,
                                bool enable_pdl, cudaStream_t stream) {
  auto kernel = attention_kernel_sm90<KT>;
  constexpr size_t smem = KT::kSmemBytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  if (grid_x <= 0) return cudaSuccess;
  return launch_kernel(kernel, dim3(grid_x), dim3(KT::kThreads), smem, stream, enable_pdl, p,
                       tm);
}

}  // namespace attn
}  // namespace flashinfer

// The numeric tuning parameters of the attention kernels, in one place. Each is a macro so that
// benchmarks/tuning/tune_attention.py can compile variants side by side (-DFLASHINFER_ATTENTION_<NAME>=...
// through the JIT's extra flags, part of the cache key); the defaults are what was measured
// fastest, with the measurement beside each. Which CTA shape runs which problem is launch policy,
// not tuning: launch.cuh. Switches between two finished designs are not kept here: the losing
// side is deleted and its measurement is in benchmarks/notes/attention-ab-switches.md.
#pragma once

// ---- The FA2 kernel (prefill.cuh) ----------------------------------------------------------

// Tiles in flight per key stream of the prefill shapes (cta 1, 2) at head_dim <= 128 (wider
// heads keep two for shared memory).
#ifndef FLASHINFER_ATTENTION_STAGES
#define FLASHINFER_ATTENTION_STAGES 3
#endif

// The decode shape (cta 0): four key streams of 16 keys per step, each with one tile ahead (68 KB
// of shared memory; its ~220 registers per thread hold it at two CTAs per SM either way).
// Against three stages, H100, pages in order: 64 x 4096 352.5 vs 356.1 us, 128 x 8192 1374 vs
// 1401 us, CUDA-graph 1 x 32768 56.6 vs 58.6 us: fewer bytes in flight per stream read faster.
#ifndef FLASHINFER_ATTENTION_CTA0_WARPS_KV
#define FLASHINFER_ATTENTION_CTA0_WARPS_KV 4
#endif
#ifndef FLASHINFER_ATTENTION_CTA0_MMA_KV
#define FLASHINFER_ATTENTION_CTA0_MMA_KV 1
#endif
#ifndef FLASHINFER_ATTENTION_CTA0_STAGES
#define FLASHINFER_ATTENTION_CTA0_STAGES 2
#endif
// fp8 K/V on the decode shapes at head_dim 128 (converted in registers: KernelTraits::kRegKV):
// 16-key MMA tiles per step. H200, bf16 q, fp8-e4m3 cache, 64 x 4096, 32/8 heads, page 16 (read
// ceiling 4491 GB/s): 2 (32 keys) 134.0 us (89.4% of the read ceiling) against 1 (16 keys)
// 159.3 us; 128 x 8192 565.4 vs 635.9 us, 1 x 32768 28.5 vs 32.3 us; three stages on top of
// 32 keys 134.8 us; 4 (64 keys) does not fit shape 5's shared memory (256 KB of staging)
// (benchmarks/notes/attention-fp8-kv.md).
#ifndef FLASHINFER_ATTENTION_CTA0_MMA_KV_FP8
#define FLASHINFER_ATTENTION_CTA0_MMA_KV_FP8 2
#endif
// fp8 K/V converted in registers (kRegKV), the loader: threads per 128-byte K/V row (8: one
// 16-byte copy each, 4 rows per warp instruction; 2: four copies each, 16 rows per instruction,
// a quarter of the page lookups and address arithmetic: main loop 1200 -> 1008 SASS
// instructions). H200, 64 x 4096 (read ceiling 4570 GB/s), 8 / 4 / 2: 130.7 / 132.0 / 163.2 us
// (4 and 2 with FP8_LEAN); 128 x 8192 536.1 / 507.9 / 613.8; the cache in HND 129.8 / 156.9 /
// 167.3. 2's load-only probe reads at 160.9 us: per instruction sixteen 32-byte pieces of rows
// (four times the L2 requests of four whole rows for the same bytes) cap the fetch.
#ifndef FLASHINFER_ATTENTION_FP8_LOAD_ROW_THREADS
#define FLASHINFER_ATTENTION_FP8_LOAD_ROW_THREADS 8
#endif
// Undecided kRegKV switches, off (fc3ed7b's kernel), each measured so far only on the 2-per-row
// loader, whose fetch bounded every variant (64 x 4096: 163.0-165.9 us against 163.2):
//   FP8_LEAN 1: a bfloat16 q's power-of-two unscale folds into the softmax's deferred scale
//     (no pass over S), and softmax_step skips rows 8-15 of a tile of at most 8 packed rows
//     (decode at group size <= 8);
//   FP8_Q_SMEM 1: Q's fp16 fragments in shared memory, read per step (8 more 16-byte shared
//     loads per 32 keys), instead of 32 registers per thread (ptxas: 222 -> 192 at 8 per row);
//   CTA4_WARPS_KV_FP8: key streams of shape 4 (two elsewhere); FP8_MIN_WARPS: warps per SM the
//     16-row shapes are compiled for (__launch_bounds__'s minimum CTAs = this / the shape's
//     warps; 0: CTA0_MIN_BLOCKS). With FP8_Q_SMEM, 3 and 12 (three streams, four CTAs per SM:
//     12 warps instead of 8) take 168 registers, 28 bytes of spills outside the main loop.
// (benchmarks/notes/attention-fp8-kv.md; the next sweep: each on the 8-per-row loader.)
#ifndef FLASHINFER_ATTENTION_FP8_LEAN
#define FLASHINFER_ATTENTION_FP8_LEAN 0
#endif
#ifndef FLASHINFER_ATTENTION_FP8_Q_SMEM
#define FLASHINFER_ATTENTION_FP8_Q_SMEM 0
#endif
#ifndef FLASHINFER_ATTENTION_CTA4_WARPS_KV_FP8
#define FLASHINFER_ATTENTION_CTA4_WARPS_KV_FP8 2
#endif
#ifndef FLASHINFER_ATTENTION_FP8_MIN_WARPS
#define FLASHINFER_ATTENTION_FP8_MIN_WARPS 0
#endif
// CTAs per SM the decode shapes (one warp of rows) are compiled for: their registers (~220 per
// thread at head_dim 128) allow two 128-thread CTAs per SM; asking for three caps them at 168
// and spills.
#ifndef FLASHINFER_ATTENTION_CTA0_MIN_BLOCKS
#define FLASHINFER_ATTENTION_CTA0_MIN_BLOCKS 1
#endif

// Key streams of the decode shape (cta 0) at head_dim 512: two (with column groups, 4 warps
// and 152 KB of shared memory: one CTA per SM; three would take 220 KB, past sm_80's 164 KB).
#ifndef FLASHINFER_ATTENTION_CTA0_WARPS_KV_WIDE
#define FLASHINFER_ATTENTION_CTA0_WARPS_KV_WIDE 2
#endif

// 64-row shape (cta 1): 16-key MMA tiles per step (default: 64 keys at head_dim <= 128 and at
// 192 / 128, whose registers are head_dim 128's less its Q fragments; 32 at 256, 16 at 512 for
// shared memory: launch.cuh).
#ifndef FLASHINFER_ATTENTION_CTA1_MMA_KV
#define FLASHINFER_ATTENTION_CTA1_MMA_KV \
  (kHeadDim <= 128 || (kHeadDim == 192 && kHeadDimVO == 128) ? 4 : kHeadDim <= 256 ? 2 : 1)
#endif
// head_dim 512 (two column groups per CTA, KernelTraits::kVoGroups): shape 1's 16-key MMA tiles
// per step where the device's shared memory allows them (launch.cuh, Cta1Wide; 2 = 32 keys,
// 224 KB: sm_90 and sm_100, not sm_80). H200, bf16, paged causal 4 x 2048, 32/8 heads: 32 keys
// 2735 us against 3440 at 16 (benchmarks/notes/attention-wide-heads.md).
#ifndef FLASHINFER_ATTENTION_CTA1_MMA_KV_WIDE
#define FLASHINFER_ATTENTION_CTA1_MMA_KV_WIDE 2
#endif
// 128-row shape (cta 2): warps x 16-row MMA tiles per warp = 128 rows, 64 keys per step. Each
// K/V tile in shared memory then serves 128 rows (half the L2 reads of shape 1 per key) and each
// ldmatrix of K or V feeds two MMA tiles (half the shared-memory reads per MMA). At head_dim 128
// its 2 x 16 x 4 accumulators leave few registers. Spill stores / loads (ptxas bytes), ragged and
// paged: sm_90a 116 / 160 and 96 / 136, sm_80 52 / 52 and 92 / 120 (before the ldmatrix offsets
// and the loader below were changed: 164 / 208, 252 / 624, 188 / 544, 260 / 664). H200, bf16,
// 32/8 heads, backend="fa2", against shape 1 (64 rows x 64 keys, 3 stages) in the same build:
// single causal 16384 6468 vs 6995 us, paged causal 8 x 2048 1093 vs 1221, ragged causal
// 16 x 1024 649 vs 634 (benchmarks/notes/fa2-tiles-and-registers.md).
#ifndef FLASHINFER_ATTENTION_CTA2_MMA_KV
#define FLASHINFER_ATTENTION_CTA2_MMA_KV (kHeadDim <= 128 ? 4 : kHeadDim <= 256 ? 2 : 1)
#endif
#ifndef FLASHINFER_ATTENTION_CTA2_WARPS_Q
#define FLASHINFER_ATTENTION_CTA2_WARPS_Q 4
#endif
#ifndef FLASHINFER_ATTENTION_CTA2_MMA_Q
#define FLASHINFER_ATTENTION_CTA2_MMA_Q (kHeadDim <= 128 ? 2 : 1)
#endif
// Shape 2's tiles in flight at head_dim 128: two (Q 32 KB + 64 KB of K/V: two CTAs per SM on
// Hopper's 228 KB; three stages, 128 KB, would hold one). On an sm_80 (164 KB) it runs one CTA
// per SM either way, as shape 1 does at three stages (112 KB).
#ifndef FLASHINFER_ATTENTION_CTA2_STAGES
#define FLASHINFER_ATTENTION_CTA2_STAGES (kHeadDim == 128 ? 2 : FLASHINFER_ATTENTION_STAGES)
#endif
// Threads per K/V row in the prefill shapes' loader: each copies 16 / 8 = 2 chunks of a head_dim
// 128 row (4 at 256) and looks up half (a quarter) as many rows and page ids, which are held in
// registers; decode keeps one chunk per thread. Shape 2 paged spill stores / loads: sm_90a
// 136 / 184 -> 96 / 136, sm_80 140 / 220 -> 92 / 120. Part of the build that measured the FA2
// rows above and head_dim 256 (single causal 8192, 16/8 heads: 2016 us against 2972 before
// these changes, FlashInfer 0.7.2's fa2 1903; not measured apart from the other changes).
#ifndef FLASHINFER_ATTENTION_LOAD_ROW_THREADS
#define FLASHINFER_ATTENTION_LOAD_ROW_THREADS 8
#endif

// ---- The Hopper kernel (prefill_sm90.cuh) --------------------------------------------------

// Registers per thread after setmaxnreg: the producer warpgroup gives up what the two consumer
// warpgroups take (Sm90Traits::kConsumerRegs: the rest of the CTA's 384 x 168 = 64512; a
// split asking for more hangs: 80 / 216, measured at 3b134a7). 88 / 208: the producer's spills
// drop from 116 to 60 bytes (D = 128 paged), paged prefill 8 x 2048 906 -> 864 us, ragged
// 16 x 1024 432 -> 421 (981a959, benchmarks/NOTES.md). With ragged K/V through the TMA (one
// producer thread), 88 / 208 against 40 / 232, 56 / 224 and 24 / 240 (H200): ragged 16 x 1024
// 349 vs 372-414 us, the long items within the run-to-run drift (benchmarks/notes/sm90-tma-kv.md).
// head_dim 256 (O alone is 128 registers per consumer thread): 72 / 216, measured with its
// 64-key tiles (H200, benchmarks/notes/sm90-head-dims.md). ptxas (sm_90a): no consumer spills
// at 72 / 216 with 64- or 80-key tiles, nor at 88 / 208 with 64 (80 spills 96 bytes there).
#ifndef FLASHINFER_ATTENTION_SM90_PRODUCER_REGS
#define FLASHINFER_ATTENTION_SM90_PRODUCER_REGS (HEAD_DIM_VO_ > 128 ? 72 : 88)
#endif
// One Q buffer (head_dim 192 / 128 and 256): 1 = the consumers hand it back after the item's last
// S = Q K^T (its output staged in the last V buffer, or stored from registers where that is
// too small), 0 = after the epilogue, which stages the output in the Q buffer. Measured:
// benchmarks/notes/sm90-head-dims.md (2026-11-26, second call).
#ifndef FLASHINFER_ATTENTION_SM90_EARLY_Q
#define FLASHINFER_ATTENTION_SM90_EARLY_Q 1
#endif
// With EARLY_Q: 1 = the output staged in shared memory where it fits (Sm90Traits::kStageO),
// 0 = stored from registers.
#ifndef FLASHINFER_ATTENTION_SM90_STAGE_O
#define FLASHINFER_ATTENTION_SM90_STAGE_O (HEAD_DIM_VO_ <= 128)
#endif
// 1 = O is rescaled by the new row maxima between issuing S_j = Q K_j^T and P_{j-1} V_{j-1}
// (while the tensor cores run S_j), 0 = after P_{j-1} V_{j-1} completes (the tensor cores idle
// while it runs). Late at head_dim 128 with K/V through the TMA (not paged), where it ran faster
// on the H100 (cold L2: single 4096 267.5 -> 260.6 us, ragged 16 x 1024 336.6 -> 328.0, ragged
// 64 x 256 185.8 -> 180.3; back to back ragged 16 x 1024 362.6 -> 355.0); early elsewhere (paged
// 8 x 2048 590.2 -> 598.4 late, 192 / 128 slower late): benchmarks/notes/sm90-dynamic-claims.md.
// Read in sm90_consume<KT>.
#ifndef FLASHINFER_ATTENTION_SM90_RESCALE_EARLY
#define FLASHINFER_ATTENTION_SM90_RESCALE_EARLY (KT::kHeadDim != 128 || KT::kPaged)
#endif
// K/V stages of the Hopper kernel: by default as many as shared memory holds (prefill_sm90.cuh,
// Sm90Traits::kStages); FLASHINFER_ATTENTION_SM90_STAGES overrides it for a tuning build.

// The Hopper kernel's output: 1 = each warp's 16 staged rows through TMA stores (one thread, two
// instructions at head_dim_vo 128) where they lie in the request and the layout allows, 0 = 16-byte
// stores from every lane (the row address work of which was 8% of the 192 / 128 kernel's
// instructions: benchmarks/notes/sm90-dynamic-claims.md).
#ifndef FLASHINFER_ATTENTION_SM90_TMA_STORE
#define FLASHINFER_ATTENTION_SM90_TMA_STORE 1
#endif
// Q through the TMA: 1 = where K/V come through the TMA (ragged) or the plan asks for it
// (AttentionPlan.sm90_tma_q, whose threshold benchmarks/tuning/tma_q_sweep.py measures), 0 =
// never, 2 = always; where q's layout allows. 0 and 2 exist for that sweep: they are the two
// sides the plan's threshold chooses between.
#ifndef FLASHINFER_ATTENTION_SM90_TMA_Q
#define FLASHINFER_ATTENTION_SM90_TMA_Q 1
#endif

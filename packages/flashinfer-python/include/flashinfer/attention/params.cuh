// The arguments every attention kernel takes: tensors as raw pointers and strides, the batch
// layout, the host scheduler's plan (device arrays, so a CUDA graph replays any later plan), and
// the logits transform. One struct, passed by value (__grid_constant__), filled by the binding.
#pragma once
#include <cstdint>

#include "../fastdiv.cuh"

namespace flashinfer {
namespace attn {

/// Which keys a query row may see, besides the sequence bounds and the sliding window.
enum class MaskMode : int {
  kNone = 0,
  kCausal = 1,  ///< bottom-right aligned: row i sees keys j <= kv_len - qo_len + i
  kCustom = 2,  ///< a packed bit mask per request, row-major [qo_len, kv_len], little-endian
};

/// How positions enter the logits.
enum class PosEncoding : int {
  kNone = 0,
  kRopeLlama = 1,  ///< rotate-half RoPE over the whole head, applied to q and k in the kernel
  kAlibi = 2,      ///< logit += slope_h * (kv_pos - q_pos)
};

struct AttentionParams {
  // q: [rows, Hq, D]; o: [rows, Hq, D]; lse: [rows, Hq] float32 (base 2) or null.
  const void* q;
  int64_t q_stride_n, q_stride_h;
  void* o;
  int64_t o_stride_n, o_stride_h;
  float* lse;

  // k, v: ragged [tokens, Hkv, D] (stride_page unused) or paged [pages, page, Hkv, D] with any
  // strides (NHD and HND differ only in stride_n / stride_h). K and V strides may differ.
  const void* k;
  const void* v;
  int64_t k_stride_page, k_stride_n, k_stride_h;
  int64_t v_stride_page, v_stride_n, v_stride_h;

  // Batch layout. qo_indptr [B+1]: request b owns q rows [qo_indptr[b], qo_indptr[b+1]).
  // Ragged: kv_indptr [B+1] over tokens. Paged: kv_indptr [B+1] over kv_indices (page ids),
  // kv_last_page_len [B]; kv_len = (pages - 1) * page_size + last_page_len (0 pages -> 0).
  // The kernels read each item's copy of its request's values in the plan (item_qo_begin ...).
  const int32_t* qo_indptr;
  const int32_t* kv_indptr;
  const int32_t* kv_indices;
  const int32_t* kv_last_page_len;
  FastDiv page_size;  // tokens per page (.d); divides token indices without a hardware division

  // The plan. Work item i (of *num_items) is request request_idx[i], packed-row tile
  // qo_tile_idx[i] (CTA_TILE_Q rows of the request's qo_len * group_size packed rows) and KV
  // chunk kv_chunk_idx[i] ([c * chunk, (c + 1) * chunk) of the request's keys; *kv_chunk_size
  // == 0 means the whole sequence). Each CTA takes (item, KV head) pairs (attention_kernel).
  const int32_t* request_idx;
  const int32_t* qo_tile_idx;
  const int32_t* kv_chunk_idx;
  // The item's request, copied by the plan from the indptr arrays (one dependent load less
  // before the first K/V bytes): first q row and q rows, first kv_indices entry (paged) or
  // token (ragged), and keys.
  const int32_t* item_qo_begin;
  const int32_t* item_qo_len;
  const int32_t* item_kv_begin;
  const int32_t* item_kv_len;
  const int32_t* num_items;
  const int32_t* kv_chunk_size;
  // The Hopper kernel's work counters (the plan header's two spare ints): units claimed past
  // the first round, and CTAs done claiming. 0 between launches: the last CTA resets them.
  int32_t* work_counters;

  // Split KV: when set, item outputs go to o_part [P, Hq, D] / lse_part [P, Hq] (float32) at
  // partial index merge_indptr[q_row] + chunk, and a merge kernel combines them into o / lse.
  // With merge_counters set the attention kernel merges them itself (merge_if_last): the
  // counter of (merge_slot[item], KV head) counts the item's finished chunks, and a request of
  // one chunk writes o / lse directly. Counters are 0 between launches.
  bool split_kv;
  float* o_part;
  float* lse_part;
  const int32_t* merge_indptr;
  const int32_t* merge_slot;
  int32_t* merge_counters;
  // Or, set by the launch: the gridDim.x CTAs of each KV head are one thread-block cluster, the
  // chunks of a single query tile, and merge in shared memory (cluster_merge).
  bool cluster_merge;

  // Custom mask: bits of request b start at byte mask_indptr[b] of custom_mask.
  const uint8_t* custom_mask;
  const int32_t* mask_indptr;

  const float* alibi_slopes;  // [Hq], kAlibi only
  // Attention sinks: [Hq] float32 logits (natural log, not scaled by sm_scale) or null. A row of
  // head h adds exp(sinks[h]) to its softmax sum, with no value row (fold_sink, common.cuh).
  const float* sinks;

  int32_t num_qo_heads, num_kv_heads, group_size;
  FastDiv group_div;  // group_size, for qo_head
  int32_t window_left;    // < 0: off
  float sm_scale_log2;    // sm_scale * log2(e)
  float softcap_pre;      // sm_scale / cap (cap > 0 only)
  float softcap_post;     // cap * log2(e); 0 = soft cap off
  float o_scale;          // v_scale: multiplies the output
  float rope_rcp_scale;   // 1 / rope_scale
  float rope_log2_theta;  // log2(rope_theta)
};

}  // namespace attn
}  // namespace flashinfer

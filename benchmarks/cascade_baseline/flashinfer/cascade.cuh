// Merging attention states: cascade attention and the split-KV reduction. Framework-free: raw
// pointers, sizes and int64 element strides in, cudaError_t out.
//
// The math. An attention state over a set of keys is (v, s): v the softmax-weighted sum of the
// values (head_dim elements), s = log2(sum_j 2^(logit_j * log2 e)) its base-2 log-sum-exp
// (float32; -inf for an empty set). Two states over disjoint sets merge into the state over
// their union:  s = log2(2^s_a + 2^s_b),  v = 2^(s_a - s) v_a + 2^(s_b - s) v_b, computed
// around m = max(s_a, s_b) so nothing overflows. A state with s = -inf has weight exactly 0 and
// its v is never read into the result (0 * garbage would be NaN); all-empty merges give v = 0
// and s = -inf.
//
// Two kernels:
//
// * MergeTwoKernel (merge_state, merge_state_in_place): a streaming kernel, laid out like a copy.
//   Work items are 16-byte vectors of a (row, head) state, numbered state by state; a block
//   owns a tile of whole states, thread t takes items t, t + kThreads, ... of the tile, issues
//   every load of its items (v_a, v_b, s_a, s_b) before it uses one, then stores. Whole-state
//   tiles let the in-place form update s safely: every s of the tile is read before the block
//   barrier and written after it.
//
// * MergeManyKernel (merge_states, MergeStatesVarlen): each output state is the merge of many
//   input states ("parts"). A group of threads, one per vector of the head row, walks the parts
//   with an online log-sum-exp (rescaling its running sum when the maximum grows), kUnroll parts'
//   loads in flight at a time. When there are few states (the split-KV case: one row x 32 heads
//   x 132 parts) one state gets up to kMaxGroups groups that split its parts and combine through
//   shared memory, so the parts are read by many warps at once; with many states (many rows of
//   1-2 parts) one group per state suffices and blocks hold several states. The number of parts
//   per row may live on the device only (indptr, CUDA-graph safe): the launch depends on the
//   shapes, never on indptr's values.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cascade_kernels.cuh"
#include "fastdiv.cuh"
#include "launch.cuh"
#include "vec.cuh"  // kVec16, is_aligned

namespace flashinfer {
namespace cascade {

/// Largest head row a launch accepts, in vectors: MergeManyKernel gives each vector a thread of
/// one block (16-byte vectors: head_dim up to 8192 half / 4096 float; one element otherwise).
inline constexpr int64_t kMaxVectorsPerHead = 1024;

/*!
 * @brief Inputs and outputs of merge_state / merge_state_in_place. Strides are in elements;
 *        the head_dim of every v is contiguous. In place: v_out == v_a and s_out == s_a (with
 *        their strides).
 * @tparam T __half, __nv_bfloat16 or float
 */
template <typename T>
struct MergeStateArgs {
  const T* v_a = nullptr;
  const float* s_a = nullptr;
  const T* v_b = nullptr;
  const float* s_b = nullptr;
  T* v_out = nullptr;
  float* s_out = nullptr;
  const bool* mask = nullptr;  ///< (seq_len,): in place only; rows with false are untouched
  int64_t seq_len = 0, num_heads = 0, head_dim = 0;
  int64_t va_stride_n = 0, va_stride_h = 0, vb_stride_n = 0, vb_stride_h = 0;
  int64_t vo_stride_n = 0, vo_stride_h = 0;
  int64_t sa_stride_n = 0, sa_stride_h = 0, sb_stride_n = 0, sb_stride_h = 0;
  int64_t so_stride_n = 0, so_stride_h = 0;
};

/*!
 * @brief Inputs and outputs of a many-way merge. Row r, head h merges the parts i < count_r:
 *        uniform (indptr == nullptr): count_r = num_parts, part i of row r at
 *        v + r * v_stride_row + i * v_stride_part + h * v_stride_h (s alike);
 *        varlen: count_r = indptr[r+1] - indptr[r], part i at
 *        v + (indptr[r] + i) * v_stride_part + h * v_stride_h (the row strides are unused).
 * @tparam TIn input v type (__half, __nv_bfloat16, float)
 * @tparam TOut output v type
 */
template <typename TIn, typename TOut>
struct MergeStatesArgs {
  const TIn* v = nullptr;
  const float* s = nullptr;
  const int32_t* indptr = nullptr;
  int64_t num_parts = 0;
  TOut* v_out = nullptr;
  float* s_out = nullptr;  ///< may be nullptr: no lse output
  int64_t num_rows = 0, num_heads = 0, head_dim = 0;
  int64_t v_stride_row = 0, v_stride_part = 0, v_stride_h = 0;
  int64_t s_stride_row = 0, s_stride_part = 0, s_stride_h = 0;
  int64_t vo_stride_n = 0, vo_stride_h = 0, so_stride_n = 0, so_stride_h = 0;
};


/*!
 * @brief v_out = merge of (v_a, s_a) and (v_b, s_b), s_out = log2(2^s_a + 2^s_b) (or, with
 *        kInPlace, the same written into v_a / s_a for the rows whose mask is true).
 */
template <typename T, bool kInPlace>
cudaError_t MergeTwo(const MergeStateArgs<T>& a, bool enable_pdl, cudaStream_t stream) {
  using namespace detail;
  const int64_t num_states = a.seq_len * a.num_heads;
  if (num_states == 0 || a.head_dim == 0) return cudaSuccess;
  constexpr int kVec = kVec16<T>;
  const bool vec_ok =
      divisible(a.head_dim, kVec) && is_aligned(a.v_a, 16) && is_aligned(a.v_b, 16) &&
      is_aligned(a.v_out, 16) && divisible(a.va_stride_n, kVec) &&
      divisible(a.va_stride_h, kVec) && divisible(a.vb_stride_n, kVec) &&
      divisible(a.vb_stride_h, kVec) && divisible(a.vo_stride_n, kVec) &&
      divisible(a.vo_stride_h, kVec);
  const int64_t vph = vec_ok ? a.head_dim / kVec : a.head_dim;
  if (vph > kMaxVectorsPerHead || a.num_heads >= (int64_t{1} << 30)) return cudaErrorInvalidValue;
  int num_sms = 0;
  cudaError_t status = num_sms_of_current_device(&num_sms);
  if (status != cudaSuccess) return status;
  const int64_t tile_states = plan_tile_states(num_states, vph, num_sms);
  const int64_t blocks = ceil_div(num_states, tile_states);
  if (blocks > (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;
  MergeTwoParams<T> p{a.v_a,        a.v_b,        a.v_out,       a.s_a,       a.s_b,
                      a.s_out,      a.mask,       a.va_stride_n, a.va_stride_h, a.vb_stride_n,
                      a.vb_stride_h, a.vo_stride_n, a.vo_stride_h, a.sa_stride_n, a.sa_stride_h,
                      a.sb_stride_n, a.sb_stride_h, a.so_stride_n, a.so_stride_h, num_states,
                      static_cast<uint32_t>(tile_states), FastDiv(static_cast<uint32_t>(vph)),
                      FastDiv(static_cast<uint32_t>(a.num_heads))};
  const dim3 grid(static_cast<unsigned>(blocks));
  if (vec_ok) {
    return launch_kernel(MergeTwoKernel<T, kVec, kInPlace>, grid, dim3(kThreads), 0, stream,
                         enable_pdl, p);
  }
  return launch_kernel(MergeTwoKernel<T, 1, kInPlace>, grid, dim3(kThreads), 0, stream,
                       enable_pdl, p);
}

/// merge_state: (v_out, s_out) = merge((v_a, s_a), (v_b, s_b)); a.mask is ignored.
template <typename T>
cudaError_t MergeState(const MergeStateArgs<T>& a, bool enable_pdl, cudaStream_t stream) {
  return MergeTwo<T, false>(a, enable_pdl, stream);
}

/// merge_state_in_place: (v_a, s_a) = merge((v_a, s_a), (v_b, s_b)) where mask (if any) is true.
/// a.v_out / a.s_out must equal a.v_a / a.s_a (with their strides).
template <typename T>
cudaError_t MergeStateInPlace(const MergeStateArgs<T>& a, bool enable_pdl, cudaStream_t stream) {
  if (a.v_out != a.v_a || a.s_out != a.s_a) return cudaErrorInvalidValue;
  return MergeTwo<T, true>(a, enable_pdl, stream);
}

/*!
 * @brief Many-way merge (uniform or varlen, see MergeStatesArgs): v_out[r, h] and, if s_out,
 *        s_out[r, h]. A row with no parts gives v = 0 and s = -inf.
 */
template <typename TIn, typename TOut>
cudaError_t MergeStates(const MergeStatesArgs<TIn, TOut>& a, bool enable_pdl,
                        cudaStream_t stream) {
  using namespace detail;
  const int64_t num_states = a.num_rows * a.num_heads;
  if (num_states == 0 || a.head_dim == 0) return cudaSuccess;
  constexpr int kVec = kVec16<TIn>;
  const bool uniform = a.indptr == nullptr;
  const bool vec_ok =
      divisible(a.head_dim, kVec) && is_aligned(a.v, 16) &&
      is_aligned(a.v_out, kVec * sizeof(TOut)) && divisible(a.v_stride_part, kVec) &&
      divisible(a.v_stride_h, kVec) && (!uniform || divisible(a.v_stride_row, kVec)) &&
      divisible(a.vo_stride_n, kVec) && divisible(a.vo_stride_h, kVec);
  const int64_t vph = vec_ok ? a.head_dim / kVec : a.head_dim;
  if (vph > kMaxVectorsPerHead) return cudaErrorInvalidValue;
  int num_sms = 0;
  cudaError_t status = num_sms_of_current_device(&num_sms);
  if (status != cudaSuccess) return status;
  const int n = vec_ok ? kVec : 1;
  const ManyPlan plan = plan_merge_many(num_states, vph, uniform ? a.num_parts : -1, n, num_sms);
  if (plan.blocks > (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;
  MergeManyParams<TIn, TOut> p{a.v,
                               a.s,
                               a.indptr,
                               a.v_out,
                               a.s_out,
                               a.num_parts,
                               num_states,
                               FastDiv(static_cast<uint32_t>(a.num_heads)),
                               a.v_stride_row,
                               a.v_stride_part,
                               a.v_stride_h,
                               a.s_stride_row,
                               a.s_stride_part,
                               a.s_stride_h,
                               a.vo_stride_n,
                               a.vo_stride_h,
                               a.so_stride_n,
                               a.so_stride_h,
                               static_cast<uint32_t>(vph),
                               static_cast<uint32_t>(plan.groups),
                               static_cast<uint32_t>(plan.block_states)};
  const dim3 grid(static_cast<unsigned>(plan.blocks)), block(static_cast<unsigned>(plan.threads));
  if (vec_ok) {
    return launch_kernel(MergeManyKernel<TIn, TOut, kVec>, grid, block, plan.smem_bytes, stream,
                         enable_pdl, p);
  }
  return launch_kernel(MergeManyKernel<TIn, TOut, 1>, grid, block, plan.smem_bytes, stream,
                       enable_pdl, p);
}

// [merge_states_varlen.begin]
/*!
 * @brief Merges, for each row r in [0, num_rows) and head h, the partial states
 *        v_part[indptr[r] .. indptr[r+1]) (float32, layout [P, H, D], contiguous) with
 *        lse_part [P, H] (float32, base 2) into v_out[r] (DTypeO, row stride o_stride_n, head
 *        stride o_stride_h, last dim contiguous) and, if lse_out != nullptr, lse_out[r*H + h]
 *        (float32). An empty range gives 0 output and -inf lse. indptr is read on the device
 *        (CUDA-graph safe: the launch depends on num_rows, num_heads, head_dim and alignment).
 * @tparam DTypeO __half, __nv_bfloat16 or float
 */
template <typename DTypeO>
cudaError_t MergeStatesVarlen(const float* v_part, const float* lse_part, const int32_t* indptr,
                              DTypeO* v_out, float* lse_out, int64_t num_rows, int64_t num_heads,
                              int64_t head_dim, int64_t o_stride_n, int64_t o_stride_h,
                              bool enable_pdl, cudaStream_t stream) {
  if (indptr == nullptr) return cudaErrorInvalidValue;
  MergeStatesArgs<float, DTypeO> a;
  a.v = v_part;
  a.s = lse_part;
  a.indptr = indptr;
  a.v_out = v_out;
  a.s_out = lse_out;
  a.num_rows = num_rows;
  a.num_heads = num_heads;
  a.head_dim = head_dim;
  a.v_stride_part = num_heads * head_dim;
  a.v_stride_h = head_dim;
  a.s_stride_part = num_heads;
  a.s_stride_h = 1;
  a.vo_stride_n = o_stride_n;
  a.vo_stride_h = o_stride_h;
  a.so_stride_n = num_heads;
  a.so_stride_h = 1;
  return MergeStates(a, enable_pdl, stream);
}
// [merge_states_varlen.end]

}  // namespace cascade
}  // namespace flashinfer

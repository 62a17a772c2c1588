// RoPE: rotary position embedding of q and k in one pass. Framework-free: raw pointers, sizes
// and strides in, cudaError_t out.
//
// Layout. q is (nnz, Hq, D) and k is (nnz, Hk, D), last dim contiguous, any row and head stride
// (packed-QKV views). Channels [0, rotary_dim) are rotated in pairs, channels [rotary_dim, D)
// pass through (copied when out of place). NeoX pairs channel i with i + rotary_dim/2; GPT-J
// ("interleave") pairs 2i with 2i+1. Pair i of token t rotates by the angle pos_t * freq_i.
//
// The op is a copy with a few FMAs per element, so the kernel is laid out like a copy kernel:
// consecutive threads touch consecutive memory, every thread has all its loads in flight
// before it waits on one, and the grid is many small one-shot blocks.
//
// Work items. A rotary unit is two N-wide vectors of one head row, `lo` at channel u*N and `hi`
// at channel rotary_dim/2 + u*N (for GPT-J each vector holds N/2 whole pairs; with N == 1 a
// GPT-J unit is the pair (2u, 2u+1)); out of place, a pass-through unit copies two vectors of
// [rotary_dim, D) split the same way. The items of a token are numbered q head 0 unit 0, unit
// 1, ..., then q head 1, ..., q head Hq-1, then the k heads alike. Thread t of a block takes
// items t, t + kThreads, ...: one warp instruction reads the lo vectors of whole head rows and
// the next their hi vectors (for D = 128: four rows, 4 x 128-byte runs each), and each pass
// of a block sweeps whole head rows in memory order, as a copy would, whatever the head count.
//
// Tiles. A block takes a tile of whole tokens (about kThreads * kItemsPerThread items), or a
// chunk of one token when a token alone has more items or there are too few tokens to fill the
// GPU (plan_tiles). Each thread issues the loads of all its items (kItemsPerThread, 2 x 16
// bytes each) first; while they are in flight the block computes the cos/sin of its tokens'
// pairs once into shared memory (one accurate sincos or one cache read per token and pair,
// shared by all heads), then each thread rotates and stores. With 16-byte vectors (N = 8)
// every access is a whole 16-byte word; other layouts (odd strides, rotary halves not a
// multiple of 8) take the same code with N = 1.
//
// Positions. pos_ids: one load per token, prefetched to L1 before the item loads. indptr/
// offsets: a binary search of indptr per token and pair (log2(batch) loads that hit L1,
// overlapped with the item loads); cheaper than a second kernel and its scratch buffer, and
// nothing to allocate under CUDA graphs.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "launch.cuh"
#include "vec.cuh"

namespace flashinfer {
namespace rope {

/// Largest rotary_dim: the frequency table (rotary_dim/2 floats) travels in the kernel
/// parameters (1 KB; the classic limit is 4 KB) so no device buffer or upload is needed.
inline constexpr int kMaxRotaryDim = 512;

/// Where the position of a token comes from, and where its angles come from.
enum class PosMode : int {
  kPosIds = 0,       ///< pos = pos_ids[token]; angle = pos * freq (frequency table)
  kIndptr = 1,       ///< pos = offsets[b] + token - indptr[b]; angle = pos * freq
  kCosSinCache = 2,  ///< pos = pos_ids[token]; cos/sin read from a float32 (max_pos, rd) cache
};

/// Frequency schedule of the pos-ids and indptr modes (ignored with a cos/sin cache).
struct FreqConfig {
  double rope_scale = 1.0;
  double rope_theta = 1e4;
  bool llama31 = false;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double old_context_len = 8192.0;
};

/*!
 * @brief Everything one RoPE launch needs. Strides are in elements; a stride of a size-1
 *        dimension is ignored. For in-place, q_out == q and k_out == k (with equal strides).
 * @tparam T __half or __nv_bfloat16
 * @tparam IdType int32_t or int64_t (pos_ids, indptr and offsets)
 */
template <typename T, typename IdType>
struct RopeArgs {
  const T* q = nullptr;
  const T* k = nullptr;
  T* q_out = nullptr;
  T* k_out = nullptr;
  int64_t nnz = 0;
  int64_t num_q_heads = 0;
  int64_t num_k_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  int64_t q_stride_n = 0, q_stride_h = 0, k_stride_n = 0, k_stride_h = 0;
  int64_t q_out_stride_n = 0, q_out_stride_h = 0, k_out_stride_n = 0, k_out_stride_h = 0;
  bool interleave = false;
  PosMode mode = PosMode::kPosIds;
  const IdType* pos_ids = nullptr;  // (nnz,): kPosIds, kCosSinCache
  const IdType* indptr = nullptr;   // (batch_size + 1,): kIndptr
  const IdType* offsets = nullptr;  // (batch_size,): kIndptr
  int64_t batch_size = 0;
  const float* cos_sin_cache = nullptr;  // (max_pos, rotary_dim): kCosSinCache
  int64_t cache_stride = 0;
  int64_t max_pos = 0;
  FreqConfig freq;
};

namespace detail {

// ---------------------------------------------------------------------------------------------
// Launch geometry. The numbers are for the H100 (132 SMs, ~3 TB/s of read+write, ~1 us of
// loaded DRAM latency); they only need to be generous elsewhere.
// ---------------------------------------------------------------------------------------------

// The FLASHINFER_ROPE_* macros exist for benchmarks/tuning/tune.py, which compiles variants
// side by side on the GPU; the defaults are the values its measurements chose.
#ifndef FLASHINFER_ROPE_THREADS
#define FLASHINFER_ROPE_THREADS 128
#endif
#ifndef FLASHINFER_ROPE_ITEMS_PER_THREAD
#define FLASHINFER_ROPE_ITEMS_PER_THREAD 4
#endif
#ifndef FLASHINFER_ROPE_MIN_BLOCKS_PER_SM
#define FLASHINFER_ROPE_MIN_BLOCKS_PER_SM 8
#endif
// Measured on the H100 (benchmarks/notes/rope-streaming.md): evict-first (.cs) loads and
// stores cost ~4% of bandwidth here, so plain accesses are the default.
#ifndef FLASHINFER_ROPE_STREAMING_LOADS
#define FLASHINFER_ROPE_STREAMING_LOADS 0
#endif
// 0: no hint; 128 or 256: ask L2 to fetch that many bytes around each load.
#ifndef FLASHINFER_ROPE_L2_PREFETCH
#define FLASHINFER_ROPE_L2_PREFETCH 256
#endif
#ifndef FLASHINFER_ROPE_STREAMING_STORES
#define FLASHINFER_ROPE_STREAMING_STORES 0
#endif
inline constexpr int kThreads = FLASHINFER_ROPE_THREADS;
// Items per thread, all loaded before any is used: up to 2 * 4 = 8 independent 16-byte loads
// in flight, 16 KB per block. With 64 registers (kMinBlocksPerSM) 8 blocks fit per SM, up to
// 128 KB in flight per SM, several times what Little's law asks (1.5 TB/s of reads x ~1 us /
// 132 SMs ~ 12 KB): one-shot blocks spend part of their life computing and storing, and the
// other blocks' loads must cover that. Measured (benchmarks/notes/rope-streaming.md):
// 128-thread blocks at 8 per SM beat 256 x 4 by ~1% and 64 x 16 by ~0.5%; 2 items per thread and
// fewer blocks per SM with more registers were slower.
inline constexpr int kItemsPerThread = FLASHINFER_ROPE_ITEMS_PER_THREAD;
inline constexpr int kBlockItems = kThreads * kItemsPerThread;
inline constexpr int kMinBlocksPerSM = FLASHINFER_ROPE_MIN_BLOCKS_PER_SM;
// Shared memory for one tile's cos/sin: at most this many (token, pair) entries, 8 bytes each
// (16 KB), so 8 blocks per SM leave ~100 KB of the SM's 228 KB to L1. Only tiles of many
// small tokens (a few heads) reach it; they then hold fewer tokens.
inline constexpr int kMaxTilePairs = 2048;
// A token's items are numbered in 32 bits (FastDiv below needs dividends < 2^31); heads past
// this many items per token go to further launches (only tokens of 4+ GB reach it).
inline constexpr int64_t kMaxItemsPerToken = int64_t{1} << 30;
inline constexpr int64_t kMaxGridBlocks = (int64_t{1} << 31) - 1;  // gridDim.x limit
inline constexpr int kWarpSize = 32;
static_assert(kBlockItems % kWarpSize == 0, "a block's items must be whole warps");

/*!
 * @brief Division by a runtime constant d >= 1 with a multiply and a shift, for dividends
 *        n < 2^31 (a 32-bit division is a ~20-instruction sequence; the kernel does two per
 *        item). Granlund & Montgomery, "Division by invariant integers using multiplication"
 *        (1994), Thm 4.2 with N = 31: for l = ceil(log2 d) and m = floor(2^(31+l) / d) + 1,
 *        floor(n / d) = floor(n * m / 2^(31+l)); m < 2^32 when d >= 2. d == 1 is special-cased.
 */
struct FastDiv {
  uint32_t d = 1;
  uint32_t mul = 0;    // 0 encodes d == 1
  uint32_t shift = 0;  // l - 1: __umulhi already shifts by 32

  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    if (divisor <= 1) return;
    uint32_t l = 0;
    while ((uint64_t{1} << l) < divisor) ++l;
    mul = static_cast<uint32_t>((uint64_t{1} << (31 + l)) / divisor + 1);
    shift = l - 1;
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return mul == 0 ? n : __umulhi(n, mul) >> shift;
  }
};

/// How a launch covers (tokens x items per token): tiles of `tile_tokens` whole tokens, each
/// split into `chunks` blocks of `chunk_items` items (chunks > 1 only when tile_tokens == 1).
struct TilePlan {
  int64_t tile_tokens;
  int64_t chunks;
  int64_t chunk_items;
};

/*!
 * @brief Tiling for `nnz` tokens of `items_per_token` items on `num_sms` SMs (pure host policy).
 *
 * Worked example (Llama-3-8B, 32 q + 8 k heads x 128, 16-byte vectors, 16384 tokens): 8 items
 * per head row, 320 per token; one token per 512-item block (2.5 items per thread), 16384
 * blocks, ~15.5 waves of 1056 resident blocks. 64 tokens (decode): chunks of 32 items, 640
 * blocks.
 */
inline TilePlan plan_tiles(int64_t nnz, int64_t items_per_token, int64_t half_rotary,
                           int num_sms) {
  const int64_t target_blocks = int64_t{num_sms} * kMinBlocksPerSM;  // one full wave
  int64_t tile_tokens = kBlockItems / items_per_token;                // whole tokens per block
  tile_tokens = std::min<int64_t>(tile_tokens, kMaxTilePairs / half_rotary);
  tile_tokens = std::min<int64_t>(tile_tokens, nnz / target_blocks);  // few tokens: spread out
  if (tile_tokens > 1) return {tile_tokens, 1, tile_tokens * items_per_token};
  // One token per tile, split when it does not fit one block, or into more, smaller blocks
  // when there are fewer tokens than a wave of blocks (decode: latency bound, use every SM).
  const int64_t chunks = std::max(ceil_div(items_per_token, kBlockItems),
                                  ceil_div(target_blocks, nnz));
  // Whole warps per chunk so warps stay aligned to the item order; <= kBlockItems still.
  const int64_t chunk_items = ceil_div(ceil_div(items_per_token, chunks), kWarpSize) * kWarpSize;
  return {1, ceil_div(items_per_token, chunk_items), chunk_items};
}

/// Kernel parameters, passed as a __grid_constant__ so the frequency table is indexed in the
/// constant bank instead of being copied to local memory.
template <typename T, typename IdType, PosMode kMode_>
struct Params {
  static constexpr PosMode kMode = kMode_;
  static constexpr int kTableSize = kMode == PosMode::kCosSinCache ? 1 : kMaxRotaryDim / 2;
  const T* q;  // first head of this launch (heads may be split over launches)
  const T* k;
  T* q_out;
  T* k_out;
  int64_t q_sn, q_sh, k_sn, k_sh, qo_sn, qo_sh, ko_sn, ko_sh;
  const IdType* pos_ids;
  const IdType* indptr;
  const IdType* offsets;
  int64_t batch_size;
  const float* cache;
  int64_t cache_stride;
  int64_t max_pos;
  int64_t nnz;
  int64_t token_begin;       // first token of this launch
  uint32_t tile_tokens;      // TilePlan
  uint32_t chunk_items;
  FastDiv chunks;            // blocks per tile
  FastDiv items_per_token;   // (q heads + k heads of this launch) * units_per_head
  uint32_t q_items;          // q heads of this launch * units_per_head: q items come first
  FastDiv units_per_head;    // num_rot_units + num_copy_units
  int half_rotary;           // rotary_dim / 2
  int num_rot_units;         // rotary units per head
  int num_copy_units;        // pass-through units per head (0 in place)
  int num_copy_vecs;         // (head_dim - rotary_dim) / N
  float freq[kTableSize];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* ptr) {
  if constexpr (sizeof(Vec<T, N>) == 16 && FLASHINFER_ROPE_L2_PREFETCH != 0) {
    int4 r;
#if FLASHINFER_ROPE_L2_PREFETCH == 256
    asm("ld.global.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(ptr));
#else
    asm("ld.global.L2::128B.v4.s32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(ptr));
#endif
    Vec<T, N> v;
    *reinterpret_cast<int4*>(v.data) = r;
    return v;
  }
  if constexpr (FLASHINFER_ROPE_STREAMING_LOADS) return Vec<T, N>::load_stream(ptr);
  return Vec<T, N>::load(ptr);
}

// Each output element is written once; .cs (evict-first) stores measured slower (see above).
template <typename T, int N>
__device__ __forceinline__ void store_vec(T* ptr, const Vec<T, N>& v) {
  if constexpr (sizeof(Vec<T, N>) == 16 && FLASHINFER_ROPE_STREAMING_STORES) {
    __stcs(reinterpret_cast<int4*>(ptr), *reinterpret_cast<const int4*>(&v));
  } else {
    v.store(ptr);
  }
}

__device__ __forceinline__ void prefetch_l1(const void* ptr) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(ptr));
}

/// Pair index of angle slot j of rotary unit u. NeoX (and GPT-J with N == 1): slot j rotates
/// (lo[j], hi[j]). GPT-J with N >= 2: slots j < N/2 rotate (lo[2j], lo[2j+1]) and slots
/// j >= N/2 rotate (hi[2j-N], hi[2j-N+1]).
template <int N, bool kInterleave>
__device__ __forceinline__ int pair_index(int u, int j, int half_rotary) {
  if constexpr (!kInterleave || N == 1) {
    return u * N + j;
  } else {
    return j < N / 2 ? u * (N / 2) + j : half_rotary / 2 + u * (N / 2) + (j - N / 2);
  }
}

/// The two vectors of unit u of a head row: channels `a` and `b` (b only when `has_b`).
struct UnitChannels {
  int a;
  int b;
  bool has_b;
  bool rotary;  // a rotary unit (a = lo, b = hi), else a pass-through copy
};

template <int N, bool kInterleave, typename P>
__device__ __forceinline__ UnitChannels unit_channels(const P& p, int u) {
  if (u < p.num_rot_units) {
    if constexpr (kInterleave && N == 1) return {2 * u, 2 * u + 1, true, true};
    return {u * N, p.half_rotary + u * N, true, true};
  }
  // Pass-through unit c copies vectors c and c + num_copy_units of [rotary_dim, head_dim),
  // mirroring the lo/hi split so a warp's accesses stay contiguous runs.
  const int c = u - p.num_rot_units;
  const int a = 2 * p.half_rotary + c * N;
  return {a, a + p.num_copy_units * N, c + p.num_copy_units < p.num_copy_vecs, false};
}

/// Where item `l` (< items of the block's tile) lives: token of the tile, q or k, head, unit.
struct Item {
  uint32_t token;  // within the tile
  uint32_t head;   // within q or k (of this launch)
  int unit;
  bool is_q;
};

template <typename P>
__device__ __forceinline__ Item locate(const P& p, uint32_t l) {
  Item it;
  it.token = p.items_per_token.div(l);
  uint32_t r = l - it.token * p.items_per_token.d;
  it.is_q = r < p.q_items;
  if (!it.is_q) r -= p.q_items;
  it.head = p.units_per_head.div(r);
  it.unit = static_cast<int>(r - it.head * p.units_per_head.d);
  return it;
}

/*!
 * @brief sin and cos of an fp32 angle to ~2e-7 absolute, for angles up to ~1e9 rad.
 *
 * The angle is fl(float(pos) * freq): the frequency is rounded to float once (on the host),
 * the product once; that is the fp32 math of the contract. Positions reach 1e5+, so the angle
 * does too, where the fast __sincosf has no usable accuracy. sincosf is accurate there but
 * inlines a Payne-Hanek slow path per call (local memory, ~10 extra registers each). Instead:
 * a/pi in double (relative error 1e-16), reduced exactly modulo 2, then sincospif, whose own
 * reduction is exact and needs no slow path.
 */
__device__ __forceinline__ void accurate_sincos(float angle, float* s, float* c) {
  double t = static_cast<double>(angle) * 0.31830988618379067154;  // 1/pi
  t -= 2.0 * rint(0.5 * t);                                          // exact; |t| <= 1
  sincospif(static_cast<float>(t), s, c);
}

/// Position of `token`, or false when the token belongs to no request (kIndptr only: rows
/// outside [indptr[0], indptr[batch_size]) are left unrotated).
template <typename P>
__device__ __forceinline__ bool token_position(const P& p, int64_t token, int64_t* pos) {
  if constexpr (P::kMode == PosMode::kIndptr) {
    const int64_t first = static_cast<int64_t>(__ldg(p.indptr));
    const int64_t last = static_cast<int64_t>(__ldg(p.indptr + p.batch_size));
    if (token < first || token >= last) return false;
    // Largest b with indptr[b] <= token; empty requests (equal indptr entries) are skipped
    // because the search keeps the last of equal entries.
    int64_t lo = 0, hi = p.batch_size;  // indptr[lo] <= token < indptr[hi]
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) >> 1;
      if (static_cast<int64_t>(__ldg(p.indptr + mid)) <= token) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    const int64_t start = static_cast<int64_t>(__ldg(p.indptr + lo));
    *pos = static_cast<int64_t>(__ldg(p.offsets + lo)) + (token - start);
    return true;
  } else {
    *pos = static_cast<int64_t>(__ldg(p.pos_ids + token));
    // A position outside the cache would read out of bounds; such rows are left unrotated.
    if constexpr (P::kMode == PosMode::kCosSinCache) return *pos >= 0 && *pos < p.max_pos;
    return true;
  }
}

/// cos and sin of pair i of `token`; the identity rotation (exact: x*1 - y*0 == x) for
/// tokens without a position.
template <typename P>
__device__ __forceinline__ float2 pair_cos_sin(const P& p, int64_t token, int i) {
  int64_t pos = 0;
  if (!token_position(p, token, &pos)) return make_float2(1.f, 0.f);
  float c, s;
  if constexpr (P::kMode == PosMode::kCosSinCache) {
    const float* row = p.cache + pos * p.cache_stride;
    c = __ldg(row + i);
    s = __ldg(row + p.half_rotary + i);
  } else {
    accurate_sincos(static_cast<float>(pos) * p.freq[i], &s, &c);
  }
  return make_float2(c, s);
}

/// Rotate unit (lo, hi) by the angles of its N slots (see pair_index).
template <typename T, int N, bool kInterleave>
__device__ __forceinline__ void rotate_unit(Vec<T, N>& lo, Vec<T, N>& hi, const float* c,
                                            const float* s) {
  if constexpr (!kInterleave || N == 1) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float x = to_float(lo[j]), y = to_float(hi[j]);
      lo[j] = from_float<T>(x * c[j] - y * s[j]);
      hi[j] = from_float<T>(y * c[j] + x * s[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      const float x0 = to_float(lo[2 * j]), y0 = to_float(lo[2 * j + 1]);
      lo[2 * j] = from_float<T>(x0 * c[j] - y0 * s[j]);
      lo[2 * j + 1] = from_float<T>(y0 * c[j] + x0 * s[j]);
      const float x1 = to_float(hi[2 * j]), y1 = to_float(hi[2 * j + 1]);
      const float c1 = c[N / 2 + j], s1 = s[N / 2 + j];
      hi[2 * j] = from_float<T>(x1 * c1 - y1 * s1);
      hi[2 * j + 1] = from_float<T>(y1 * c1 + x1 * s1);
    }
  }
}

/*!
 * @brief Rotate (and for out of place, copy the pass-through channels of) q and k, one tile
 *        (or one chunk of a token) per block.
 * @tparam N elements per vector access: 8 (16 bytes) when every pointer and stride allows it,
 *         else 1.
 */
template <typename T, typename IdType, int N, bool kInterleave, PosMode kMode>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM)
    RopeKernel(const __grid_constant__ Params<T, IdType, kMode> p) {
  static_assert(N == 1 || N % 4 == 0,
                "vector width must be 1 or a multiple of 4 (GPT-J pairs must not straddle "
                "vectors; angles are read from shared memory 4 at a time)");
  using V = Vec<T, N>;
  // cos then sin of each tile token's pairs: [token][2][half_rotary] floats. float4 so the
  // rotation can read 4 angles per access.
  extern __shared__ float4 smem[];
  float* cos_sin = reinterpret_cast<float*>(smem);
  const int half = p.half_rotary;

  pdl_wait();
  const uint32_t tile = p.chunks.div(blockIdx.x);
  const uint32_t chunk = blockIdx.x - tile * p.chunks.d;
  const int64_t token0 = p.token_begin + static_cast<int64_t>(tile) * p.tile_tokens;
  const uint32_t num_tokens =
      static_cast<uint32_t>(min(static_cast<int64_t>(p.tile_tokens), p.nnz - token0));
  const uint32_t begin = chunk * p.chunk_items;
  const uint32_t end = min(begin + p.chunk_items, num_tokens * p.items_per_token.d);

  auto src_row = [&](const Item& it) {
    const int64_t t = token0 + it.token;
    return it.is_q ? p.q + t * p.q_sn + it.head * p.q_sh : p.k + t * p.k_sn + it.head * p.k_sh;
  };
  auto dst_row = [&](const Item& it) {
    const int64_t t = token0 + it.token;
    return it.is_q ? p.q_out + t * p.qo_sn + it.head * p.qo_sh
                   : p.k_out + t * p.ko_sn + it.head * p.ko_sh;
  };

  // 0. The tile's positions, needed in step 2, start towards L1 now: their DRAM latency (and,
  //    with a cos/sin cache, that of the cache rows they select) then overlaps the item loads
  //    instead of following them.
  if constexpr (kMode != PosMode::kIndptr) {
    if (threadIdx.x < num_tokens) prefetch_l1(p.pos_ids + token0 + threadIdx.x);
  }

  // 1. Every load of this thread, before anything waits on one. Item i of the thread is
  //    begin + threadIdx.x + i * kThreads: each pass of the block is one contiguous stretch.
  V a[kItemsPerThread], b[kItemsPerThread];
#pragma unroll
  for (int i = 0; i < kItemsPerThread; ++i) {
    const uint32_t l = begin + threadIdx.x + i * kThreads;
    if (l < end) {
      const Item it = locate(p, l);
      const UnitChannels ch = unit_channels<N, kInterleave>(p, it.unit);
      const T* row = src_row(it);
      a[i] = load_vec<T, N>(row + ch.a);
      if (ch.has_b) b[i] = load_vec<T, N>(row + ch.b);
    }
  }

  // 2. While they are in flight: cos/sin of the tile's (token, pair)s, once each.
  const uint32_t num_pairs = num_tokens * half;
  for (uint32_t j = threadIdx.x; j < num_pairs; j += kThreads) {
    const uint32_t t = j / half;  // runs about once per thread: a plain division is fine
    const int i = static_cast<int>(j - t * half);
    const float2 cs = pair_cos_sin(p, token0 + t, i);
    float* row = cos_sin + t * 2 * half;
    row[i] = cs.x;
    row[half + i] = cs.y;
  }
  __syncthreads();

  // 3. Rotate and store.
#pragma unroll
  for (int i = 0; i < kItemsPerThread; ++i) {
    const uint32_t l = begin + threadIdx.x + i * kThreads;
    if (l < end) {
      const Item it = locate(p, l);
      const UnitChannels ch = unit_channels<N, kInterleave>(p, it.unit);
      if (ch.rotary) {
        const float* c_row = cos_sin + it.token * 2 * half;
        const float* s_row = c_row + half;
        float c[N], s[N];
        if constexpr (N % 4 == 0) {
          // Slots 4g..4g+3 are 4 consecutive pairs (see pair_index), 16-byte aligned because
          // half_rotary is a multiple of N.
#pragma unroll
          for (int g = 0; g < N / 4; ++g) {
            const int pi = pair_index<N, kInterleave>(it.unit, 4 * g, half);
            const float4 c4 = *reinterpret_cast<const float4*>(c_row + pi);
            const float4 s4 = *reinterpret_cast<const float4*>(s_row + pi);
            c[4 * g] = c4.x, c[4 * g + 1] = c4.y, c[4 * g + 2] = c4.z, c[4 * g + 3] = c4.w;
            s[4 * g] = s4.x, s[4 * g + 1] = s4.y, s[4 * g + 2] = s4.z, s[4 * g + 3] = s4.w;
          }
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const int pi = pair_index<N, kInterleave>(it.unit, j, half);
            c[j] = c_row[pi];
            s[j] = s_row[pi];
          }
        }
        rotate_unit<T, N, kInterleave>(a[i], b[i], c, s);
      }
      T* row = dst_row(it);
      store_vec<T, N>(row + ch.a, a[i]);
      if (ch.has_b) store_vec<T, N>(row + ch.b, b[i]);
    }
  }
  pdl_launch_dependents();
}

/// Frequency of pair i (before rounding to float): theta^(-2i/rotary_dim) / rope_scale, or
/// the Llama-3.1 blend of the scaled and unscaled frequency. Double precision on the host, so
/// the table holds the correctly rounded value of the formula.
inline double pair_frequency(const FreqConfig& f, int64_t i, int64_t rotary_dim) {
  const double freq = std::pow(f.rope_theta, -2.0 * static_cast<double>(i) / rotary_dim);
  if (!f.llama31) return freq / f.rope_scale;
  const double two_pi = 6.283185307179586476925286766559;
  const double span = f.high_freq_factor - f.low_freq_factor;
  double smooth = freq * f.old_context_len / (two_pi * span) - f.low_freq_factor / span;
  smooth = std::fmin(1.0, std::fmax(0.0, smooth));
  return (1.0 - smooth) * freq / f.rope_scale + smooth * freq;
}

/// The frequency table of `f` for `rotary_dim` (rotary_dim / 2 floats), kept for the calling
/// thread's last configuration: up to 256 std::pow calls were the largest host cost of a small
/// launch, and a model calls RoPE with one configuration.
inline const float* frequency_table(const FreqConfig& f, int64_t rotary_dim) {
  struct Table {
    FreqConfig f;
    int64_t rotary_dim = -1;
    float freq[kMaxRotaryDim / 2];
  };
  thread_local Table t;
  const bool same = t.rotary_dim == rotary_dim && t.f.rope_scale == f.rope_scale &&
                    t.f.rope_theta == f.rope_theta && t.f.llama31 == f.llama31 &&
                    t.f.low_freq_factor == f.low_freq_factor &&
                    t.f.high_freq_factor == f.high_freq_factor &&
                    t.f.old_context_len == f.old_context_len;
  if (!same) {
    t.rotary_dim = -1;  // not valid while it is rewritten
    for (int64_t i = 0; i < rotary_dim / 2; ++i) {
      t.freq[i] = static_cast<float>(pair_frequency(f, i, rotary_dim));
    }
    t.f = f;
    t.rotary_dim = rotary_dim;
  }
  return t.freq;
}

inline int64_t norm_stride(int64_t size, int64_t stride) { return size <= 1 ? 0 : stride; }

template <typename T, typename IdType, int N, bool kInterleave, PosMode kMode>
cudaError_t Launch(const RopeArgs<T, IdType>& a, bool enable_pdl, cudaStream_t stream) {
  Params<T, IdType, kMode> p{};
  p.q_sn = norm_stride(a.nnz, a.q_stride_n);
  p.q_sh = norm_stride(a.num_q_heads, a.q_stride_h);
  p.k_sn = norm_stride(a.nnz, a.k_stride_n);
  p.k_sh = norm_stride(a.num_k_heads, a.k_stride_h);
  p.qo_sn = norm_stride(a.nnz, a.q_out_stride_n);
  p.qo_sh = norm_stride(a.num_q_heads, a.q_out_stride_h);
  p.ko_sn = norm_stride(a.nnz, a.k_out_stride_n);
  p.ko_sh = norm_stride(a.num_k_heads, a.k_out_stride_h);
  p.pos_ids = a.pos_ids;
  p.indptr = a.indptr;
  p.offsets = a.offsets;
  p.batch_size = a.batch_size;
  p.cache = a.cos_sin_cache;
  p.cache_stride = a.cache_stride;
  p.max_pos = a.max_pos;
  p.nnz = a.nnz;
  p.half_rotary = static_cast<int>(a.rotary_dim / 2);
  if constexpr (kMode != PosMode::kCosSinCache) {
    const float* freq = frequency_table(a.freq, a.rotary_dim);
    std::copy(freq, freq + a.rotary_dim / 2, p.freq);
  }
  const bool in_place = a.q_out == a.q && a.k_out == a.k;
  p.num_rot_units = (kInterleave && N == 1) ? p.half_rotary : p.half_rotary / N;
  p.num_copy_vecs = static_cast<int>((a.head_dim - a.rotary_dim) / N);
  p.num_copy_units = in_place ? 0 : (p.num_copy_vecs + 1) / 2;
  const int64_t units_per_head = p.num_rot_units + p.num_copy_units;  // <= head_dim
  p.units_per_head = FastDiv(static_cast<uint32_t>(units_per_head));

  int device = 0, num_sms = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  status = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  if (status != cudaSuccess) return status;

  // Heads h0.. of the list "q heads, then k heads", as many per launch as keep a token's items
  // below kMaxItemsPerToken (one launch unless a token has over 2^30 units).
  const int64_t total_heads = a.num_q_heads + a.num_k_heads;
  const int64_t heads_per_launch = kMaxItemsPerToken / units_per_head;
  for (int64_t h0 = 0; h0 < total_heads; h0 += heads_per_launch) {
    const int64_t h1 = std::min(total_heads, h0 + heads_per_launch);
    const int64_t q0 = std::min(h0, a.num_q_heads), q1 = std::min(h1, a.num_q_heads);
    const int64_t k0 = std::max(h0, a.num_q_heads) - a.num_q_heads;
    const int64_t k1 = std::max(h1, a.num_q_heads) - a.num_q_heads;
    // (A slice without q or k heads never reads that pointer; keep it in bounds anyway.)
    p.q = q1 > q0 ? a.q + q0 * p.q_sh : a.q;
    p.q_out = q1 > q0 ? a.q_out + q0 * p.qo_sh : a.q_out;
    p.k = k1 > k0 ? a.k + k0 * p.k_sh : a.k;
    p.k_out = k1 > k0 ? a.k_out + k0 * p.ko_sh : a.k_out;
    const int64_t items_per_token = (h1 - h0) * units_per_head;
    p.items_per_token = FastDiv(static_cast<uint32_t>(items_per_token));
    p.q_items = static_cast<uint32_t>((q1 - q0) * units_per_head);

    const TilePlan plan = plan_tiles(a.nnz, items_per_token, p.half_rotary, num_sms);
    p.tile_tokens = static_cast<uint32_t>(plan.tile_tokens);
    p.chunk_items = static_cast<uint32_t>(plan.chunk_items);
    p.chunks = FastDiv(static_cast<uint32_t>(plan.chunks));
    const size_t smem = static_cast<size_t>(plan.tile_tokens) * 2 * p.half_rotary * sizeof(float);
    // Tiles per launch: gridDim.x is at most 2^31 - 1 blocks.
    const int64_t num_tiles = ceil_div(a.nnz, plan.tile_tokens);
    const int64_t max_tiles = kMaxGridBlocks / plan.chunks;
    for (int64_t t0 = 0; t0 < num_tiles; t0 += max_tiles) {
      p.token_begin = t0 * plan.tile_tokens;
      const int64_t blocks = std::min(max_tiles, num_tiles - t0) * plan.chunks;
      status = launch_kernel(RopeKernel<T, IdType, N, kInterleave, kMode>,
                             dim3(static_cast<unsigned>(blocks)), dim3(kThreads), smem, stream,
                             enable_pdl, p);
      if (status != cudaSuccess) return status;
    }
  }
  return cudaSuccess;
}

template <typename T, typename IdType, int N, bool kInterleave>
cudaError_t DispatchMode(const RopeArgs<T, IdType>& a, bool enable_pdl, cudaStream_t stream) {
  switch (a.mode) {
    case PosMode::kPosIds:
      return Launch<T, IdType, N, kInterleave, PosMode::kPosIds>(a, enable_pdl, stream);
    case PosMode::kIndptr:
      return Launch<T, IdType, N, kInterleave, PosMode::kIndptr>(a, enable_pdl, stream);
    case PosMode::kCosSinCache:
      return Launch<T, IdType, N, kInterleave, PosMode::kCosSinCache>(a, enable_pdl, stream);
  }
  return cudaErrorInvalidValue;
}

/// True when every access of q, k, q_out, k_out can be `n` elements wide.
template <typename T, typename IdType>
bool vector_width_ok(const RopeArgs<T, IdType>& a, int64_t n) {
  if (n == 1) return true;
  // Rotary halves and the head must split into whole vectors (and, for GPT-J, whole pairs).
  if ((a.rotary_dim / 2) % n != 0 || a.head_dim % n != 0) return false;
  const int bytes = static_cast<int>(n * sizeof(T));
  if (!is_aligned(a.q, bytes) || !is_aligned(a.k, bytes) || !is_aligned(a.q_out, bytes) ||
      !is_aligned(a.k_out, bytes)) {
    return false;
  }
  const int64_t strides[] = {
      norm_stride(a.nnz, a.q_stride_n),         norm_stride(a.num_q_heads, a.q_stride_h),
      norm_stride(a.nnz, a.k_stride_n),         norm_stride(a.num_k_heads, a.k_stride_h),
      norm_stride(a.nnz, a.q_out_stride_n),     norm_stride(a.num_q_heads, a.q_out_stride_h),
      norm_stride(a.nnz, a.k_out_stride_n),     norm_stride(a.num_k_heads, a.k_out_stride_h)};
  for (int64_t s : strides) {
    if (s % n != 0) return false;
  }
  return true;
}

}  // namespace detail

/*!
 * @brief Apply RoPE to q and k (in place when q_out == q and k_out == k).
 * @return cudaErrorInvalidValue for a rotary_dim that is odd, above head_dim or above
 *         kMaxRotaryDim; otherwise the launch's status.
 */
template <typename T, typename IdType>
cudaError_t ApplyRope(const RopeArgs<T, IdType>& a, bool enable_pdl, cudaStream_t stream) {
  if (a.rotary_dim <= 0 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_dim ||
      a.rotary_dim > kMaxRotaryDim) {
    return cudaErrorInvalidValue;
  }
  if (a.nnz == 0 || a.num_q_heads + a.num_k_heads == 0) return cudaSuccess;
  constexpr int kVec = kVec16<T>;
  const bool wide = detail::vector_width_ok(a, kVec);
  if (a.interleave) {
    return wide ? detail::DispatchMode<T, IdType, kVec, true>(a, enable_pdl, stream)
                : detail::DispatchMode<T, IdType, 1, true>(a, enable_pdl, stream);
  }
  return wide ? detail::DispatchMode<T, IdType, kVec, false>(a, enable_pdl, stream)
              : detail::DispatchMode<T, IdType, 1, false>(a, enable_pdl, stream);
}

}  // namespace rope
}  // namespace flashinfer

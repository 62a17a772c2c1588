// Gated activations ("act and mul"): out[r, :] = act(input[r, :d]) * input[r, d:].
// Framework-free: raw pointers, sizes and row strides in, cudaError_t out.
//
// The op is a pure stream (read 2d, write d per row, a few flops per element), so the whole
// design is about DRAM bandwidth: 16-byte loads and stores, every warp access contiguous,
// several independent loads in flight per thread, and enough blocks to cover every SM even
// when there are few rows.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "launch.cuh"
#include "vec.cuh"

namespace flashinfer {
namespace activation {

// ---------------------------------------------------------------------------------------------
// The activations, in fp32.
// ---------------------------------------------------------------------------------------------

/// silu(x) = x * sigmoid(x) = x / (1 + e^-x).
struct SiluOp {
  __device__ __forceinline__ static float apply(float x) {
    // __expf (ex2.approx) and __fdividef are a few ulp off in fp32, far below the half-precision
    // output rounding. For x < -88, e^-x is inf (or > 2^126, where __fdividef returns 0): the
    // result is -0, the correctly rounded limit.
    return __fdividef(x, 1.f + __expf(-x));
  }
};

/// gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), the exact (erf) form.
struct GeluOp {
  __device__ __forceinline__ static float apply(float x) {
    // erff is accurate to 2 ulp and branch-free; it is the formula torch uses, so results agree
    // with torch.nn.functional.gelu even where 1 + erf cancels (x < -4, |out| < 1e-4).
    constexpr float kInvSqrt2 = 0.70710678118654752f;
    return 0.5f * x * (1.f + erff(x * kInvSqrt2));
  }
};

/// gelu_tanh(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
struct GeluTanhOp {
  __device__ __forceinline__ static float apply(float x) {
    // 0.5 (1 + tanh(u)) == sigmoid(2u) exactly, so gelu_tanh(x) = x / (1 + e^-2u). This avoids
    // tanh.approx.f32, whose ~2^-11 absolute error becomes a large *relative* error where
    // 1 + tanh(u) -> 0 (x < -2); __expf keeps a few-ulp relative error everywhere.
    // Overflow is benign: e^-2u = inf gives -0, e^-2u = 0 gives x.
    constexpr float kTwoSqrt2OverPi = 1.5957691216057308f;  // 2 * sqrt(2 / pi)
    constexpr float kCoeff = 0.044715f;
    const float two_u = kTwoSqrt2OverPi * x * fmaf(kCoeff * x, x, 1.f);
    return __fdividef(x, 1.f + __expf(-two_u));
  }
};

// ---------------------------------------------------------------------------------------------
// Launch geometry (host policy, pure functions).
// ---------------------------------------------------------------------------------------------

/// Upper bound on threads per block. 256 keeps several blocks per SM resident (at ~64
/// registers each) so one block's memory latency hides behind another's.
inline constexpr int kMaxBlockThreads = 256;
/// Vectors per thread per tile, all loaded before any is used: 2 * kUnroll independent 16-byte
/// loads in flight per thread (input half and gate half). At 59-64 registers (ptxas, sm_90a)
/// four 224-thread blocks fit per SM: ~110 KB in flight per SM, several times what Little's law
/// asks for at ~3.3 TB/s (~20 KB per SM at ~800 ns DRAM latency).
inline constexpr int kUnroll = 4;
/// Aim for at least this many blocks per SM so small batches still spread over the whole GPU.
inline constexpr int kMinBlocksPerSm = 2;

/*!
 * @brief How one launch covers a (rows x vecs_per_row) grid of vectors.
 *
 * A tile is `rows_per_block` rows x `threads_x * kUnroll` vectors of the output; thread
 * (tx, ty) handles row `ty`, vectors `tx + k * threads_x`, k < kUnroll, so every warp-wide
 * access is contiguous. Tiles are numbered row-tile major: tile = row_tile * col_chunks + chunk.
 */
struct ActAndMulGeometry {
  int threads_x;
  int rows_per_block;
  int64_t col_chunks;
  int64_t num_tiles;
};

/// Round a thread count to a full warp multiple, or to a power of two below a warp (so that
/// several rows share a warp evenly).
inline int round_threads_x(int64_t t) {
  if (t >= 32) return static_cast<int>(ceil_div(t, 32) * 32);
  int p = 1;
  while (p < t) p *= 2;
  return p;
}

/*!
 * @brief Tile shape for `rows` rows of `vecs_per_row` vectors on a GPU with `sm_count` SMs.
 *
 * Worked example (the H100 bf16 target, d = 28672, 16-byte vectors): vecs_per_row = 3584;
 * one block can cover 256 * 4 = 1024 vectors, so 4 column chunks of 896 vectors each, i.e.
 * 224 threads x 4 vectors with no idle lanes; 16384 rows give 65536 blocks.
 */
inline ActAndMulGeometry plan_geometry(int64_t rows, int64_t vecs_per_row, int sm_count) {
  ActAndMulGeometry g{};
  // Split the row into the fewest chunks one block can cover, then shrink the block to the
  // chunk so the last chunk is not mostly idle threads.
  auto set_threads_x = [&](int64_t max_threads_x) {
    const int64_t chunks = ceil_div(vecs_per_row, max_threads_x * kUnroll);
    g.threads_x = round_threads_x(ceil_div(ceil_div(vecs_per_row, chunks), kUnroll));
    g.col_chunks = ceil_div(vecs_per_row, static_cast<int64_t>(g.threads_x) * kUnroll);
  };
  auto set_num_tiles = [&]() { g.num_tiles = ceil_div(rows, g.rows_per_block) * g.col_chunks; };
  set_threads_x(kMaxBlockThreads);
  // Short rows: stack several rows per block to keep blocks kMaxBlockThreads wide.
  const int64_t stack = kMaxBlockThreads / g.threads_x;
  g.rows_per_block = static_cast<int>(stack < rows ? stack : rows);
  set_num_tiles();
  // Few rows: trade block size for block count until every SM has kMinBlocksPerSm blocks,
  // first by stacking fewer rows, then by narrowing the chunks; never below one warp.
  const int64_t target = static_cast<int64_t>(sm_count) * kMinBlocksPerSm;
  while (g.num_tiles < target) {
    if (g.rows_per_block > 1 && g.threads_x * (g.rows_per_block / 2) >= 32) {
      g.rows_per_block /= 2;
    } else if (g.threads_x > 32 && g.rows_per_block == 1) {
      set_threads_x(g.threads_x / 2);
    } else {
      break;
    }
    set_num_tiles();
  }
  return g;
}

/// Widest vector (16, 8 bytes, else one element) that every row start, both halves and the
/// output rows are aligned to. Only the 16-byte rule on the last dim is checked by the Python
/// API, so d = 100 fp16 (200-byte halves) and sliced or oddly strided views land here too.
template <typename T>
int pick_vec_bytes(const T* input, const T* out, int64_t rows, int64_t d, int64_t in_stride,
                   int64_t out_stride) {
  for (int bytes : {16, 8}) {
    const int64_t elem = sizeof(T);
    const bool strides_ok =
        rows == 1 || ((in_stride * elem) % bytes == 0 && (out_stride * elem) % bytes == 0);
    if ((d * elem) % bytes == 0 && is_aligned(input, bytes) &&
        is_aligned(out, bytes) && strides_ok) {
      return bytes;
    }
  }
  return static_cast<int>(sizeof(T));
}

// ---------------------------------------------------------------------------------------------
// Kernel.
// ---------------------------------------------------------------------------------------------

/// The integer type of one `kBytes`-wide access.
template <int kBytes>
using word_t = std::conditional_t<
    kBytes == 16, int4,
    std::conditional_t<kBytes == 8, int2, std::conditional_t<kBytes == 4, int, short>>>;

// Data moves as integer words and converts two elements per 32-bit word. Going through Vec<T, N>
// (memberwise copies of __half / __nv_bfloat16) makes nvcc split every 16-byte store into 2-byte
// stores, which costs ~2x the store instructions and LSU traffic.

/// The two 16-bit elements of `w` (element 0 in the low half, as in memory) as floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t w);
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t w) {
  __half2 h;
  memcpy(&h, &w, sizeof(h));
  return __half22float2(h);
}
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t w) {
  // bf16 is the top half of an fp32: widening is a shift or a mask.
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

/// Round (lo, hi) to T (round to nearest even) and pack them, lo in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t w;
  memcpy(&w, &h, sizeof(w));
  return w;
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t w;
  memcpy(&w, &h, sizeof(w));
  return w;
}

/// Sizes and strides (in elements) of one launch.
struct ActAndMulParams {
  int64_t rows;
  int64_t d;             ///< output columns; input row = [x (d) | gate (d)]
  int64_t vecs_per_row;  ///< d / elements per access
  int64_t in_stride;     ///< elements between input rows
  int64_t out_stride;    ///< elements between output rows
  int64_t col_chunks;
  int64_t num_tiles;
};

// [act_and_mul_kernel.begin]
/*!
 * @brief out[r, c] = Act(input[r, c]) * input[r, d + c] for the tiles of ActAndMulGeometry.
 * @tparam T element type (__half or __nv_bfloat16)
 * @tparam kBytes bytes per access: 16 (the fast path), 8, or sizeof(T)
 * @tparam Act functor with `static float apply(float)`
 */
template <typename T, int kBytes, typename Act>
__global__ void __launch_bounds__(kMaxBlockThreads)
    ActAndMulKernel(const T* __restrict__ input, T* __restrict__ out, ActAndMulParams p) {
  static_assert(sizeof(T) == 2, "act_and_mul kernels take 16-bit element types");
  static_assert(kBytes == 16 || kBytes == 8 || kBytes == sizeof(T), "unsupported access width");
  using W = word_t<kBytes>;
  constexpr int kVec = kBytes / sizeof(T);
  const int64_t span = static_cast<int64_t>(blockDim.x) * kUnroll;  // vectors per tile row
  pdl_wait();
  // Normally one tile per block; the loop only matters past 2^31 - 1 tiles.
  for (int64_t tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
    const int64_t row = (tile / p.col_chunks) * blockDim.y + threadIdx.y;
    if (row >= p.rows) continue;
    const int64_t col0 = (tile % p.col_chunks) * span + threadIdx.x;
    const W* x_row = reinterpret_cast<const W*>(input + row * p.in_stride);
    const W* g_row = reinterpret_cast<const W*>(input + row * p.in_stride + p.d);
    W* out_row = reinterpret_cast<W*>(out + row * p.out_stride);
    W x[kUnroll], g[kUnroll];
    // All loads first, then the math: 2 * kUnroll independent requests per thread. Streaming
    // (evict-first) loads: the input is read exactly once.
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t col = col0 + k * static_cast<int64_t>(blockDim.x);
      if (col < p.vecs_per_row) {
        x[k] = __ldcs(x_row + col);
        g[k] = __ldcs(g_row + col);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t col = col0 + k * static_cast<int64_t>(blockDim.x);
      if (col < p.vecs_per_row) {
        W y;
        if constexpr (kVec == 1) {
          const float a = to_float(reinterpret_cast<const T&>(x[k]));
          const float b = to_float(reinterpret_cast<const T&>(g[k]));
          const T r = from_float<T>(Act::apply(a) * b);
          memcpy(&y, &r, sizeof(y));
        } else {
          const uint32_t* xw = reinterpret_cast<const uint32_t*>(&x[k]);
          const uint32_t* gw = reinterpret_cast<const uint32_t*>(&g[k]);
          uint32_t* yw = reinterpret_cast<uint32_t*>(&y);
#pragma unroll
          for (int i = 0; i < kBytes / 4; ++i) {
            const float2 a = unpack2<T>(xw[i]);
            const float2 b = unpack2<T>(gw[i]);
            yw[i] = pack2<T>(Act::apply(a.x) * b.x, Act::apply(a.y) * b.y);
          }
        }
        out_row[col] = y;
      }
    }
  }
  pdl_launch_dependents();
}
// [act_and_mul_kernel.end]

template <typename T, int kBytes, typename Act>
cudaError_t LaunchActAndMul(const T* input, T* out, ActAndMulParams p, int sm_count,
                            bool enable_pdl, cudaStream_t stream) {
  p.vecs_per_row = p.d / (kBytes / static_cast<int64_t>(sizeof(T)));
  const ActAndMulGeometry g = plan_geometry(p.rows, p.vecs_per_row, sm_count);
  p.col_chunks = g.col_chunks;
  p.num_tiles = g.num_tiles;
  constexpr int64_t kMaxGrid = (int64_t{1} << 31) - 1;  // gridDim.x limit
  const unsigned grid = static_cast<unsigned>(g.num_tiles < kMaxGrid ? g.num_tiles : kMaxGrid);
  return launch_kernel(ActAndMulKernel<T, kBytes, Act>, dim3(grid),
                       dim3(g.threads_x, g.rows_per_block), 0, stream, enable_pdl, input, out, p);
}

/*!
 * @brief out[r, :] = Act(input[r, :d]) * input[r, d:] for r < rows.
 * @param input rows x 2d, row r at input + r * in_stride (elements), last dim contiguous
 * @param out rows x d, row r at out + r * out_stride (elements), last dim contiguous
 * Any alignment works; 16-byte alignment of pointers, strides and d * sizeof(T) is the fast path.
 */
template <typename Act, typename T>
cudaError_t ActAndMul(const T* input, T* out, int64_t rows, int64_t d, int64_t in_stride,
                      int64_t out_stride, bool enable_pdl, cudaStream_t stream) {
  if (rows == 0 || d == 0) return cudaSuccess;
  int device = 0, sm_count = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  status = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (status != cudaSuccess) return status;
  const ActAndMulParams p{rows, d, 0, in_stride, out_stride, 0, 0};
  switch (pick_vec_bytes(input, out, rows, d, in_stride, out_stride)) {
    case 16:
      return LaunchActAndMul<T, 16, Act>(input, out, p, sm_count, enable_pdl, stream);
    case 8:
      return LaunchActAndMul<T, 8, Act>(input, out, p, sm_count, enable_pdl, stream);
    default:
      return LaunchActAndMul<T, sizeof(T), Act>(input, out, p, sm_count, enable_pdl, stream);
  }
}

}  // namespace activation
}  // namespace flashinfer

// Probe: a pipelined persistent softmax of 128 x 128256 float32 rows. Each cluster of C CTAs
// (one chunk of V / C columns a CTA) takes rows g, g + G, ... (G clusters, as many as are
// resident at once) and keeps S chunk slots in shared memory: thread 0 loads the next rows'
// chunks with bulk copies (cp.async.bulk, completion on an mbarrier per slot) while the block
// computes the current row (online max and sum over the chunk, one cluster exchange) and
// writes it out. So HBM keeps streaming loads while rows are computed and written, which the
// one-cluster-per-row kernel (2.84 waves of 45 clusters) does not. The "look" form computes the
// next row's max and sum inside the current row's cluster barrier (arrive, pass, wait). Measured
// on an H100 (wave 24 of benchmarks/notes/sampling-cluster-radix.md): slower than the
// persistent form without a pipeline (3 CTAs an SM), itself the library's structure. Standalone:
//   nvcc -O3 -arch=sm_90a -std=c++17 softmax_pipelined.cu -o softmax_pipelined && ./softmax_pipelined
// Prints the copy ceiling (a captured cudaMemcpyAsync of the same bytes, the same timer) and each
// variant's median time (CUDA-graph replay after a 256 MB memset, median of 60) and % of that
// ceiling, each checked against a float64 reference computed on the host.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "softmax_probe.h"

namespace cg = cooperative_groups;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

template <int kThreads>
__device__ __forceinline__ void load_row(float* slot, const float* src, int chunk_bytes,
                                         uint64_t* bar) {
  mbar_expect_tx(bar, chunk_bytes);
  constexpr int kPiece = 16384;
  for (int o = 0; o < chunk_bytes; o += kPiece)
    bulk_load(reinterpret_cast<char*>(slot) + o, reinterpret_cast<const char*>(src) + o,
              min(kPiece, chunk_bytes - o), bar);
}

/// Online (max, sum of exp(x - max)) of a chunk in shared memory, combined over the block:
/// on every thread. Two block barriers.
template <int kThreads>
__device__ __forceinline__ float2 chunk_max_sum(const float* x, int n4, float* red_m, float* red_s) {
  const int tid = threadIdx.x;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float m = -INFINITY, s = 0.f;
  for (int i = tid; i < n4; i += kThreads) {
    const float4 v = x4[i];
    const float mm = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
    if (mm > m) s *= __expf(m - mm), m = mm;
    s += (__expf(v.x - m) + __expf(v.y - m)) + (__expf(v.z - m) + __expf(v.w - m));
  }
  return block_max_sum<kThreads>(m, s, red_m, red_s);
}

/// The group's (max, sum) from every rank's xch slot (DSMEM), on every lane.
__device__ __forceinline__ float2 group_max_sum(cg::cluster_group& cluster, float* slot, int C) {
  const int lane = threadIdx.x & 31;
  float gm = -INFINITY, gs = 0.f;
  if (lane < C) {
    const float* p = cluster.map_shared_rank(slot, lane);
    gm = p[0], gs = p[1];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, gm, o);
    const float so = __shfl_xor_sync(0xffffffffu, gs, o);
    const float M = fmaxf(gm, mo);
    gs = (gm == -INFINITY ? 0.f : gs * __expf(gm - M)) + (mo == -INFINITY ? 0.f : so * __expf(mo - M));
    gm = M;
  }
  return make_float2(gm, gs);
}

/// out = exp(x - M) / S for the chunk x in shared memory, (M, S) = gms.
template <int kThreads>
__device__ __forceinline__ void write_softmax(const float* x, float* out, int n4, float2 gms) {
  const float gm = gms.x, inv = 1.f / gms.y;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4* o4 = reinterpret_cast<float4*>(out);
  for (int i = threadIdx.x; i < n4; i += kThreads) {
    const float4 v = x4[i];
    o4[i] = make_float4(__expf(v.x - gm) * inv, __expf(v.y - gm) * inv, __expf(v.z - gm) * inv,
                        __expf(v.w - gm) * inv);
  }
}

/// A persistent cluster's rows (g, g + G, ...: `mine` of them) and its CTA's columns.
struct ClusterRows {
  int C, rank, g, G, mine;
  long col0;
};

/// The ring's start (thread 0): the slots' mbarriers, an optional delay (a third of the
/// clusters each `stagger_ns` later), the first kS rows' bulk copies. Block-wide.
template <int kThreads, int kS>
__device__ __forceinline__ ClusterRows start_ring(cg::cluster_group& cluster, const float* in,
                                                  int rows, int vocab, int chunk, float* slots,
                                                  uint64_t* full, int stagger_ns) {
  ClusterRows cr;
  cr.C = static_cast<int>(cluster.num_blocks());
  cr.rank = static_cast<int>(cluster.block_rank());
  cr.g = blockIdx.x / cr.C, cr.G = gridDim.x / cr.C;
  cr.mine = cr.g < rows ? (rows - cr.g + cr.G - 1) / cr.G : 0;
  cr.col0 = static_cast<long>(cr.rank) * chunk;
  if (threadIdx.x == 0) {
    for (int k = 0; k < kS; ++k) mbar_init(&full[k], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int w = 0; w < (cr.g % 3) * stagger_ns; w += 1000) __nanosleep(1000);
    for (int k = 0; k < kS && k < cr.mine; ++k)
      load_row<kThreads>(slots + k * chunk, in + static_cast<long>(cr.g + k * cr.G) * vocab + cr.col0,
                         chunk * 4, &full[k]);
  }
  __syncthreads();
  return cr;
}

/// The lookahead form: row li + 1's max and sum are computed while the cluster barrier of row
/// li completes (arrive, compute, wait), so the barrier's latency hides behind a pass.
template <int kThreads, int kS>
__global__ void __launch_bounds__(kThreads, 1)
    softmax_look(const float* __restrict__ in, float* __restrict__ out, int rows, int vocab,
                 int chunk) {
  extern __shared__ __align__(128) float slots[];
  __shared__ __align__(8) uint64_t full[kS];
  __shared__ float xch[2][2];
  __shared__ float red_m[kThreads / 32], red_s[kThreads / 32];
  cg::cluster_group cluster = cg::this_cluster();
  const ClusterRows cr = start_ring<kThreads, kS>(cluster, in, rows, vocab, chunk, slots, full, 0);
  const int C = cr.C, g = cr.g, G = cr.G, mine = cr.mine, tid = threadIdx.x;
  const int chunk_bytes = chunk * 4, n4 = chunk / 4;
  const long col0 = cr.col0;
  float2 ms = make_float2(-INFINITY, 0.f);
  if (mine > 0) {
    mbar_wait(&full[0], 0);
    ms = chunk_max_sum<kThreads>(slots, n4, red_m, red_s);
  }
  for (int li = 0; li < mine; ++li) {
    const int slot = li % kS;
    const long row = g + static_cast<long>(li) * G;
    float* x = slots + slot * chunk;
    if (tid == 0) xch[li & 1][0] = ms.x, xch[li & 1][1] = ms.y;
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
    if (li + 1 < mine) {  // the next row's pass inside the barrier
      const int s1 = (li + 1) % kS;
      mbar_wait(&full[s1], ((li + 1) / kS) & 1);
      ms = chunk_max_sum<kThreads>(slots + s1 * chunk, n4, red_m, red_s);
    }
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
    write_softmax<kThreads>(x, out + row * vocab + col0, n4,
                            group_max_sum(cluster, &xch[li & 1][0], C));
    __syncthreads();
    if (tid == 0 && li + kS < mine) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      load_row<kThreads>(x, in + (row + static_cast<long>(kS) * G) * vocab + col0, chunk_bytes,
                         &full[slot]);
    }
  }
  cluster.sync();
}

template <int kThreads, int kS, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    softmax_pipe(const float* __restrict__ in, float* __restrict__ out, int rows, int vocab,
                 int chunk, int stagger_ns, int extra) {
  extern __shared__ __align__(128) float slots[];
  __shared__ __align__(8) uint64_t full[kS];
  __shared__ float xch[2][2];
  __shared__ float red_m[kThreads / 32], red_s[kThreads / 32];
  cg::cluster_group cluster = cg::this_cluster();
  // Staggered starts (stagger_ns): some clusters compute while others load and write.
  const ClusterRows cr =
      start_ring<kThreads, kS>(cluster, in, rows, vocab, chunk, slots, full, stagger_ns);
  const int C = cr.C, g = cr.g, G = cr.G, mine = cr.mine, tid = threadIdx.x;
  const int chunk_bytes = chunk * 4, n4 = chunk / 4;
  const long col0 = cr.col0;
  for (int li = 0; li < mine; ++li) {
    const int slot = li % kS;
    const long row = g + static_cast<long>(li) * G;
    float* x = slots + slot * chunk;
    mbar_wait(&full[slot], (li / kS) & 1);
    const float2 ms = chunk_max_sum<kThreads>(x, n4, red_m, red_s);
    if (tid == 0) xch[li & 1][0] = ms.x, xch[li & 1][1] = ms.y;
    // extra: passes and cluster barriers standing in for a threshold search (the renorms')
    for (int e = 0; e < extra; ++e) {
      const float2 z = chunk_max_sum<kThreads>(x, n4, red_m, red_s);
      if (z.x == 12345.f && tid == 0) xch[li & 1][1] += 0.f * z.y;  // (keeps the pass)
      cluster.sync();
    }
    cluster.sync();
    write_softmax<kThreads>(x, out + row * vocab + col0, n4,
                            group_max_sum(cluster, &xch[li & 1][0], C));
    __syncthreads();  // the slot read: free for the bulk copy of row li + kS
    if (tid == 0 && li + kS < mine) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      load_row<kThreads>(x, in + (row + static_cast<long>(kS) * G) * vocab + col0, chunk_bytes,
                         &full[slot]);
    }
  }
  cluster.sync();  // peers may still read xch
}

/// The copy ceiling's kernel: 16-byte loads and stores, 4 in flight a thread.
__global__ void __launch_bounds__(512) copy4(const float4* __restrict__ a, float4* __restrict__ b,
                                             long n4) {
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = a[i + u * stride];
#pragma unroll
    for (int u = 0; u < 4; ++u) b[i + u * stride] = v[u];
  }
  for (; i < n4; i += stride) b[i] = a[i];
}

struct Variant {
  const char* name;
  int C, S, threads;
  bool look;
  int stagger_ns;
  int extra = 0;
};

template <int T, int S, int B, bool kLook = false>
float run_variant(const Variant& v, const float* in, float* out, int rows, int vocab,
                  int& clusters_out, float (*timer)(cudaGraphExec_t)) {
  auto kern = [] {
    if constexpr (kLook) return softmax_look<T, S>;
    else return softmax_pipe<T, S, B>;
  }();
  const int chunk = vocab / v.C;
  const size_t smem = static_cast<size_t>(S) * chunk * 4;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (v.C > 8) CK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = v.C, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cfg.blockDim = dim3(T);
  cfg.dynamicSmemBytes = smem;
  cfg.gridDim = dim3(v.C);
  int clusters = 0;
  CK(cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg));
  clusters = std::min(clusters, rows);
  clusters_out = clusters;
  if (clusters == 0) return -1.f;
  cfg.gridDim = dim3(clusters * v.C);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cfg.stream = st;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  if constexpr (kLook) {
    CK(cudaLaunchKernelEx(&cfg, kern, in, out, rows, vocab, chunk));
  } else {
    CK(cudaLaunchKernelEx(&cfg, kern, in, out, rows, vocab, chunk, v.stagger_ns, v.extra));
  }
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const float t = timer(exec);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(st));
  return t;
}

static float* g_flush;
static const size_t kFlushBytes = 256ull << 20;

float time_graph(cudaGraphExec_t exec) {
  return median_us([exec] { CK(cudaGraphLaunch(exec, 0)); }, g_flush, kFlushBytes);
}

int main() {
  const int rows = 128, vocab = 128256;
  const size_t n = static_cast<size_t>(rows) * vocab, bytes = n * sizeof(float);
  const std::vector<float> h = probe_logits(rows, vocab);
  float *in, *out;
  CK(cudaMalloc(&in, bytes));
  CK(cudaMalloc(&out, bytes));
  CK(cudaMalloc(&g_flush, kFlushBytes));
  CK(cudaMemcpy(in, h.data(), bytes, cudaMemcpyHostToDevice));
  const std::vector<double> ref = softmax_reference(h, rows, vocab);
  // The copy ceiling: a captured cudaMemcpyAsync of the same bytes, the same timer.
  float t_copy;
  {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    CK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, st));
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    t_copy = time_graph(exec);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(st));
  }
  std::printf("copy %.1f MB r+w (captured cudaMemcpyAsync): %.2f us (%.0f GB/s)\n", 2.0 * bytes / 1e6,
              t_copy, 2.0 * bytes / t_copy / 1e3);
  for (int blocks : {132 * 2, 132 * 4}) {  // the copy kernel, the same timer: the ceiling if faster
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    copy4<<<blocks, 512, 0, st>>>(reinterpret_cast<const float4*>(in), reinterpret_cast<float4*>(out),
                                  static_cast<long>(n / 4));
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const float t = time_graph(exec);
    std::printf("copy kernel, %d blocks of 512: %.2f us (%.0f GB/s)\n", blocks, t, 2.0 * bytes / t / 1e3);
    t_copy = std::min(t_copy, t);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(st));
  }
  auto check = [&](const char* name, float t, int clusters) {
    bool bad;
    const double err = rel_error(out, ref, &bad);
    std::printf("%-34s clusters %3d  %.2f us  %.1f%% of copy  rel err %.2e%s\n", name, clusters, t,
                100.f * t_copy / t, err, bad ? "  NOT FINITE" : "");
  };
  const Variant vars[] = {{"C8 S3 256 thr", 8, 3, 256, false, 0},
                          {"C8 S1 256 thr (no pipeline)", 8, 1, 256, false, 0},
                          {"C8 S1 stagger 2 us", 8, 1, 256, false, 2000},
                          {"C8 S1 stagger 4 us", 8, 1, 256, false, 4000},
                          {"C8 S1 stagger 6 us", 8, 1, 256, false, 6000},
                          {"C8 S1 + 3 passes", 8, 1, 256, false, 0, 3},
                          {"C8 S1 + 3 passes, stagger 4 us", 8, 1, 256, false, 4000, 3},
                          {"C8 S1 + 3 passes, stagger 8 us", 8, 1, 256, false, 8000, 3},
                          {"C8 S3 + 3 passes", 8, 3, 256, false, 0, 3},
                          {"look C8 S3 256 thr", 8, 3, 256, true, 0},
                          {"look C8 S3 512 thr", 8, 3, 512, true, 0},
                          {"look C8 S3 1024 thr", 8, 3, 1024, true, 0}};
  for (const Variant& v : vars) {
    CK(cudaMemset(out, 0xff, bytes));  // poison (NaN)
    int clusters = 0;
    float t = -1.f;
    if (!v.look && v.S == 3) t = run_variant<256, 3, 1>(v, in, out, rows, vocab, clusters, time_graph);
    if (!v.look && v.S == 1) t = run_variant<256, 1, 1>(v, in, out, rows, vocab, clusters, time_graph);
    if (v.look && v.threads == 256) t = run_variant<256, 3, 1, true>(v, in, out, rows, vocab, clusters, time_graph);
    if (v.look && v.threads == 512) t = run_variant<512, 3, 1, true>(v, in, out, rows, vocab, clusters, time_graph);
    if (v.look && v.threads == 1024) t = run_variant<1024, 3, 1, true>(v, in, out, rows, vocab, clusters, time_graph);
    CK(cudaDeviceSynchronize());
    check(v.name, t, clusters);
  }
  return 0;
}

// Probe: can a transform (softmax here) of 128 x 128256 float32 rows reach 85% of the copy
// ceiling when every row's cluster is resident at once (one wave) and the row is read from HBM
// once: pass 1 streams the chunk from global memory (online max and sum), keeping its first
// part in shared memory; after one cluster exchange, pass 2 writes the output, reading the kept
// part from shared memory and the rest again from global memory, most recently read first, so
// that those re-reads hit the L2. Standalone (no flashinfer): nvcc -O3 -arch=sm_90a
// -std=c++17 softmax_resident.cu -o softmax_resident && ./softmax_resident
// Prints the copy ceiling (cudaMemcpyAsync and a float4 copy kernel over the same bytes) and
// each variant's median time and % of that ceiling, and checks every variant against a float64
// reference on the host.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "softmax_probe.h"

namespace cg = cooperative_groups;

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t policy_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t policy_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ float4 ld_hint(const float4* p, uint64_t pol) {
  float4 v;
  asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p), "l"(pol));
  return v;
}
__device__ __forceinline__ float4 ld_plain(const float4* p) {
  float4 v;
  asm volatile("ld.global.L1::no_allocate.v4.f32 {%0,%1,%2,%3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ float4 ld_policy(const float4* p, int policy) {
  return policy == 1 ? ld_hint(p, policy_last()) : ld_plain(p);
}
__device__ __forceinline__ float4 ld_first(const float4* p) {  // last use: evict first
  return ld_hint(p, policy_first());
}
__device__ __forceinline__ void st_out(float4* p, float4 v, int policy) {
  if (policy == 1) {
    asm volatile("st.global.L1::no_allocate.L2::cache_hint.v4.f32 [%0], {%1,%2,%3,%4}, %5;" ::"l"(p),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "l"(policy_first()));
  } else {
    *p = v;
  }
}

__device__ __forceinline__ void online(float4 x, float& m, float& s) {
  const float mm = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
  if (mm > m) s *= __expf(m - mm), m = mm;
  s += (__expf(x.x - m) + __expf(x.y - m)) + (__expf(x.z - m) + __expf(x.w - m));
}

// One cluster of C CTAs a row; CTA r holds float4s [r n4, (r + 1) n4) of the row (n4 = V / 4 / C,
// V a multiple of 4 C here: a probe). keep4 of them (the first) stay in shared memory.
// rev: pass 2 walks the global part from its end. policy: 1 = pass 1's loads of the re-read
// part L2::evict_last, pass 2's loads evict_first and the stores evict_first.
template <int kCtasPerSm>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    softmax_resident(const float* __restrict__ in, float* __restrict__ out, int vocab, int n4,
                     int keep4, int rev, int policy) {
  extern __shared__ __align__(16) float4 kept[];
  __shared__ float red_m[kThreads / 32], red_s[kThreads / 32];
  __shared__ float slot[2];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int C = static_cast<int>(cluster.num_blocks());
  const long row = blockIdx.x / C;
  const float4* src = reinterpret_cast<const float4*>(in + row * vocab) + rank * n4;
  float4* dst = reinterpret_cast<float4*>(out + row * vocab) + rank * n4;
  const int tid = threadIdx.x;
  float m = -INFINITY, s = 0.f;
  // Pass 1: the kept part first (so the re-read part is the most recently read), 4 loads in
  // flight a thread.
  int i = tid;
  for (; i + 3 * kThreads < n4; i += 4 * kThreads) {
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = i + u * kThreads;
      v[u] = ld_policy(src + j, (policy == 1 && j >= keep4) ? 1 : 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = i + u * kThreads;
      if (j < keep4) kept[j] = v[u];
      online(v[u], m, s);
    }
  }
  for (; i < n4; i += kThreads) {
    const float4 v = ld_policy(src + i, (policy == 1 && i >= keep4) ? 1 : 0);
    if (i < keep4) kept[i] = v;
    online(v, m, s);
  }
  const float2 bms = block_max_sum<kThreads>(m, s, red_m, red_s);
  if (tid == 0) slot[0] = bms.x, slot[1] = bms.y;
  cluster.sync();
  float gm = -INFINITY, gs = 0.f;
  for (int r = 0; r < C; ++r) {
    const float* p = cluster.map_shared_rank(slot, r);
    const float pm = p[0], ps = p[1];
    const float M = fmaxf(gm, pm);
    gs = (gm == -INFINITY ? 0.f : gs * __expf(gm - M)) + (pm == -INFINITY ? 0.f : ps * __expf(pm - M));
    gm = M;
  }
  const float inv = 1.f / gs;
  auto f = [&](float4 x) {
    return make_float4(__expf(x.x - gm) * inv, __expf(x.y - gm) * inv, __expf(x.z - gm) * inv,
                       __expf(x.w - gm) * inv);
  };
  // Pass 2: the global part (from its end when rev), then the kept part.
  const int g4 = n4 - keep4;
  int k = tid;
  for (; k + 3 * kThreads < g4; k += 4 * kThreads) {
    float4 v[4];
    int j[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      j[u] = rev ? n4 - 1 - (k + u * kThreads) : keep4 + k + u * kThreads;
      v[u] = policy == 1 ? ld_first(src + j[u]) : ld_policy(src + j[u], 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) st_out(dst + j[u], f(v[u]), policy);
  }
  for (; k < g4; k += kThreads) {
    const int j = rev ? n4 - 1 - k : keep4 + k;
    const float4 v = policy == 1 ? ld_first(src + j) : ld_policy(src + j, 0);
    st_out(dst + j, f(v), policy);
  }
  for (int j = tid; j < keep4; j += kThreads) st_out(dst + j, f(kept[j]), policy);
  cluster.sync();  // peers may still read slot
}

__global__ void copy_kernel(const float4* __restrict__ a, float4* __restrict__ b, long n4) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x)
    b[i] = a[i];
}

struct Variant {
  const char* name;
  int C, keep_bytes, rev, policy;
};

int main() {
  const int rows = 128, vocab = 128256;
  const size_t n = static_cast<size_t>(rows) * vocab, bytes = n * sizeof(float);
  const std::vector<float> h = probe_logits(rows, vocab);
  float *in, *out, *flush;
  const size_t flush_bytes = 256ull << 20;
  CK(cudaMalloc(&in, bytes));
  CK(cudaMalloc(&out, bytes));
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMemcpy(in, h.data(), bytes, cudaMemcpyHostToDevice));
  const std::vector<double> ref = softmax_reference(h, rows, vocab);
  auto time_it = [&](auto launch) { return median_us(launch, flush, flush_bytes); };
  const float t_memcpy = time_it([&] { CK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice)); });
  const float t_copyk = time_it([&] { copy_kernel<<<132 * 8, 256>>>((const float4*)in, (float4*)out, n / 4); });
  const float ceil_us = std::min(t_memcpy, t_copyk);
  std::printf("copy %.1f MB r+w: cudaMemcpy %.2f us (%.0f GB/s), copy kernel %.2f us (%.0f GB/s)\n",
              2.0 * bytes / 1e6, t_memcpy, 2.0 * bytes / t_memcpy / 1e3, t_copyk,
              2.0 * bytes / t_copyk / 1e3);
  const Variant vars[] = {
      {"C3 stream, fwd", 3, 0, 0, 0},          {"C3 stream, rev", 3, 0, 1, 0},
      {"C3 stream, rev, hints", 3, 0, 1, 1},   {"C3 keep48K, rev", 3, 48 << 10, 1, 0},
      {"C3 keep48K, rev, hints", 3, 48 << 10, 1, 1}, {"C4 keep48K, rev", 4, 48 << 10, 1, 0},
      {"C4 keep48K, rev, hints", 4, 48 << 10, 1, 1}, {"C8 keep24K, rev, hints", 8, 24 << 10, 1, 1},
      {"C3 keep48K, fwd, hints", 3, 48 << 10, 0, 1},
  };
  for (const Variant& v : vars) {
    const int n4 = vocab / 4 / v.C, keep4 = std::min(n4, v.keep_bytes / 16);
    const size_t smem = static_cast<size_t>(keep4) * 16;
    auto kern = v.C >= 8 ? softmax_resident<8> : softmax_resident<4>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(rows * v.C);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = v.C, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg));
    auto launch = [&] {
      CK(cudaLaunchKernelEx(&cfg, kern, (const float*)in, out, vocab, n4, keep4, v.rev, v.policy));
    };
    CK(cudaMemset(out, 0xff, bytes));  // poison (NaN)
    launch();
    CK(cudaDeviceSynchronize());
    bool bad;
    const double err = rel_error(out, ref, &bad);
    const float t = time_it(launch);
    std::printf("%-26s clusters %3d (rows %d)  %.2f us  %.1f%% of copy  rel err %.2e%s\n", v.name,
                clusters, rows, t, 100.f * ceil_us / t, err, bad ? " NOT FINITE" : "");
  }
  return 0;
}

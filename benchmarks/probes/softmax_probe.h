// Host-side pieces the standalone softmax probes share (softmax_resident.cu,
// softmax_pipelined.cu): error checks, the input rows and their float64 reference, and the check
// of a device result against it.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

/// rows x vocab logits ~ N(0, 2^2), a fixed seed.
inline std::vector<float> probe_logits(int rows, int vocab) {
  std::vector<float> h(static_cast<size_t>(rows) * vocab);
  std::mt19937 gen(1234);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (auto& x : h) x = nd(gen);
  return h;
}

/// softmax of each row in float64.
inline std::vector<double> softmax_reference(const std::vector<float>& h, int rows, int vocab) {
  std::vector<double> ref(h.size());
  for (int r = 0; r < rows; ++r) {
    const float* x = h.data() + static_cast<size_t>(r) * vocab;
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(x[j]));
    for (int j = 0; j < vocab; ++j) s += std::exp(x[j] - mx);
    for (int j = 0; j < vocab; ++j) ref[static_cast<size_t>(r) * vocab + j] = std::exp(x[j] - mx) / s;
  }
  return ref;
}

/// ||out - ref|| / ||ref|| of the device buffer `out` (ref.size() floats); *bad: some output is
/// not finite (the poison left unwritten, or a NaN).
inline double rel_error(const float* out, const std::vector<double>& ref, bool* bad) {
  std::vector<float> o(ref.size());
  CK(cudaMemcpy(o.data(), out, o.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  *bad = false;
  for (size_t j = 0; j < o.size(); ++j) {
    *bad |= !std::isfinite(o[j]);
    num += (o[j] - ref[j]) * (o[j] - ref[j]);
    den += ref[j] * ref[j];
  }
  return std::sqrt(num / den);
}

/// Median of 60 timings (us) of run() between two events, each after a memset of `flush`
/// (evicts the L2), after 5 warm-up runs; zero timings left out.
template <typename F>
float median_us(F run, void* flush, size_t flush_bytes) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 5; ++i) run();
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int it = 0; it < 60; ++it) {
    CK(cudaMemsetAsync(flush, it & 0xff, flush_bytes, 0));
    CK(cudaEventRecord(e0, 0));
    run();
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (ms > 0) t.push_back(ms * 1000.f);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Block-wide: the block's max M of the threads' (m, s) pairs (s a sum of exp(x - m)) and the
/// sum of the s rescaled to M, on every thread. Two block barriers.
template <int kThreads>
__device__ __forceinline__ float2 block_max_sum(float m, float s, float* red_m, float* red_s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float bm = m;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
  if (lane == 0) red_m[warp] = bm;
  __syncthreads();
  bm = red_m[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) bm = fmaxf(bm, red_m[w]);
  float ss = m == -INFINITY ? 0.f : s * __expf(m - bm);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) red_s[warp] = ss;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) t += red_s[w];
  return make_float2(bm, t);
}

"""Lower bounds for any exact top-p renorm on the resident structure (one CTA a row holding it in
registers, shared memory and an L2 remainder), at 128 x 128256 float32: is 85% of the copy
ceiling reachable by a threshold by mass?

Every exact design needs, after the row max is known (the fixed-point weights' scale), either a
per-value histogram built during the load (t's bin is unknown until the whole row is read) and
then a pass over the held row to list t's bin, or at least two passes over the held row after
the max; the row's L2 remainder enters one of them too. The probes are timing-only kernels on
softmax's resident layout (1 KB of static shared memory, the least any design holds beside the
row) that do strictly less than each such design, and the output is written (x times a factor
that depends on the probe's work, so nothing is optimized away):

0. load with the max, block max, store;
1. + one pass after the max over registers, the L2 remainder and shared memory (a compare and a
   count a value) and a block sum;
2. + that pass over registers and shared memory only;
3. one `red.shared.add.u32` a value into 1024 bins during the load (half the exact histogram's
   two), the bins' block sum, no pass;
4. = 3 + 2 (the cheapest histogram, then the cheapest listing pass over the on-chip part);
5. + two passes over registers and shared memory.

Two steps, the second with the tree the first writes on PYTHONPATH:

    python benchmarks/probes/top_p_renorm_floors.py build DEST
    PYTHONPATH=DEST/flashinfer-python python benchmarks/probes/top_p_renorm_floors.py time OUT.json

`build` copies packages/flashinfer-python to DEST and adds the probe kernels to its sampling
header; FLASHINFER_PROBE_RENORM=k makes `top_p_renorm_probs` launch probe k instead of
TopPResidentKernel (its outputs are then meaningless). `time` measures the harness's ceilings,
the copy, softmax, top_p_renorm_probs and the six probes with bench_sampling's timer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[2]
ENV = "FLASHINFER_PROBE_RENORM"
PROBES = {
    0: "load, max, store",
    1: "+ a pass over registers, L2 remainder, shared memory",
    2: "+ a pass over registers, shared memory",
    3: "one red.shared a value in the load",
    4: "one red.shared a value + a pass over registers, shared memory",
    5: "+ two passes over registers, shared memory",
}

KERNELS = r'''
// ---- benchmarks/probes/top_p_renorm_floors.py: timing-only lower bounds (not a product) ----
template <int kVecs, int kProbe>
__global__ void __launch_bounds__(kResThreads, 1)
    RenormFloorKernel(const float* __restrict__ in, int64_t stride, int64_t vocab, int smem_vecs,
                      TransformParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int T = kResThreads;
  constexpr bool kHist = kProbe == 3 || kProbe == 4;
  __shared__ uint32_t hist[kHist ? 1024 : 1];
  __shared__ unsigned long long red64[T / 32];
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;
  const ResidentChunk c =
      resident_chunk<kVecs>(in + row * stride, vocab, vocab / 4, smem_vecs, 0, smem);
  if constexpr (kHist) {
    for (int i = tid; i < 1024; i += T) hist[i] = 0;
    __syncthreads();
  }
  pdl_wait();
  const uint32_t hist_s = static_cast<uint32_t>(__cvta_generic_to_shared(hist));
  float mx = 0.f;
  auto one = [&](float x) {
    if constexpr (kHist) {
      const uint32_t u = __float_as_uint(fmaxf(x, 0.f));
      asm volatile("red.shared.add.u32 [%0], %1;" ::"r"(hist_s + ((u >> 19) & 1023u) * 4),
                   "r"(((u >> 12) & 0x7ffu) | 0x800u));
    }
  };
  auto add = [&](float4 x) {
    mx = fmaxf(mx, fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)));
    one(x.x), one(x.y), one(x.z), one(x.w);
  };
  float4 v[kVecs];
  resident_load(c, v, add, [&](float4(&r)[kVecs]) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j)
      if (j < c.slots) add(r[j]);
  });
  pdl_launch_dependents();
  const float M = __uint_as_float(
      static_cast<uint32_t>(block_all_u64(__float_as_uint(mx), red64, MaxU64{})));
  unsigned long long cnt = 0;
  float thr = M * (1.f / 2048.f);
  auto count4 = [&](float4 x) {
    cnt += static_cast<unsigned>(x.x >= thr) + static_cast<unsigned>(x.y >= thr) +
           static_cast<unsigned>(x.z >= thr) + static_cast<unsigned>(x.w >= thr);
  };
  auto on_chip = [&]() {
#pragma unroll
    for (int j = 0; j < kVecs; ++j)
      if (j < c.slots) count4(v[j]);
    for (int s = tid; s < c.kept4; s += T) count4(c.held[s]);
  };
  if constexpr (kProbe == 1) {
    resident_for_each(c, v, count4);
  } else if constexpr (kProbe == 2 || kProbe == 4) {
    on_chip();
  } else if constexpr (kProbe == 5) {
    on_chip();
    thr = thr * (1.f + static_cast<float>(block_all_u64(cnt, red64, SumU64{}) & 1));
    on_chip();
  }
  if constexpr (kHist) {
    __syncthreads();
    cnt += hist[tid] + hist[tid + 512];
  }
  if constexpr (kProbe != 0) cnt = block_all_u64(cnt, red64, SumU64{});
  const float inv = 1.f / (M * static_cast<float>(cnt + 1));
  float4* const dst = reinterpret_cast<float4*>(static_cast<float*>(p.out) + row * p.out_stride);
  auto m = [&](float4 x) { return make_float4(x.x * inv, x.y * inv, x.z * inv, x.w * inv); };
  resident_store(c, v, dst, m, m);
}

template <int kProbe>
bool renorm_floor(const float* in, int64_t stride, int64_t rows, int64_t vocab,
                  const TransformParams& params, bool enable_pdl, cudaStream_t stream,
                  cudaError_t* err) {
  auto* const kernel = &RenormFloorKernel<kResVecs, kProbe>;
  return run_resident<(1u << 20) + kProbe>(
      kernel, kProbe == 3 || kProbe == 4 ? 1024 + 4096 : 1024, 1, true, in, stride, rows, vocab,
      params, err, [&](const ResidentPlan& plan, size_t smem) {
        return launch_kernel(kernel, dim3(rows), dim3(kResThreads), smem, stream, enable_pdl, in,
                             stride, vocab, plan.smem_vecs, params);
      });
}

'''

DISPATCH = r'''
  if (const char* probe = std::getenv("FLASHINFER_PROBE_RENORM")) {
    switch (std::atoi(probe)) {
      case 0: return renorm_floor<0>(in, stride, rows, vocab, params, enable_pdl, stream, err);
      case 1: return renorm_floor<1>(in, stride, rows, vocab, params, enable_pdl, stream, err);
      case 2: return renorm_floor<2>(in, stride, rows, vocab, params, enable_pdl, stream, err);
      case 3: return renorm_floor<3>(in, stride, rows, vocab, params, enable_pdl, stream, err);
      case 4: return renorm_floor<4>(in, stride, rows, vocab, params, enable_pdl, stream, err);
      case 5: return renorm_floor<5>(in, stride, rows, vocab, params, enable_pdl, stream, err);
      default: break;
    }
  }
'''

LAUNCHER = "/// Top-p renorm with one CTA a row on chip (TopPResidentKernel"
LAUNCHER_BODY = "  auto* const kernel = &TopPResidentKernel<kResVecs>;\n"


def build(dest: Path) -> None:
    src = ROOT / "packages" / "flashinfer-python"
    out = dest / "flashinfer-python"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"))
    header = out / "include" / "flashinfer" / "sampling.cuh"
    text = header.read_text()
    for mark in (LAUNCHER, LAUNCHER_BODY, "#include <atomic>\n"):
        if text.count(mark) != 1:
            raise SystemExit(f"sampling.cuh changed: {mark.strip()!r} is not there once")
    text = text.replace("#include <atomic>\n", "#include <atomic>\n#include <cstdlib>\n")
    text = text.replace(LAUNCHER, KERNELS + LAUNCHER)
    text = text.replace(LAUNCHER_BODY, DISPATCH + LAUNCHER_BODY)
    header.write_text(text)
    print(f"probe tree: {out} (PYTHONPATH={out})")


def measure(out: str) -> None:
    import torch

    import bench_sampling
    import flashinfer
    import harness

    res = {"device": torch.cuda.get_device_name(), "ceilings": harness.measure_ceilings(),
           "cases": {}}
    logits, probs = bench_sampling._inputs()
    copy_out = torch.empty_like(logits)

    def timed(name, fn, runs=3):
        us = [round(bench_sampling.time_us(fn)[0], 2) for _ in range(runs)]
        res["cases"][name] = us
        print(f"{name:<64} {us}", flush=True)

    timed("copy (torch)", lambda: copy_out.copy_(logits))
    timed("softmax", lambda: flashinfer.softmax(logits))
    timed("top_p_renorm_probs p=0.9", lambda: flashinfer.top_p_renorm_probs(probs, 0.9))
    for k, what in PROBES.items():
        os.environ[ENV] = str(k)
        timed(f"probe {k}: {what}", lambda: flashinfer.top_p_renorm_probs(probs, 0.9))
    del os.environ[ENV]
    timed("copy (torch), again", lambda: copy_out.copy_(logits))
    Path(out).write_text(json.dumps(res, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=("build", "time"))
    ap.add_argument("path", help="build: the probe tree's folder; time: the JSON to write")
    a = ap.parse_args()
    if a.step == "build":
        build(Path(a.path))
    else:
        measure(a.path)


if __name__ == "__main__":
    main()

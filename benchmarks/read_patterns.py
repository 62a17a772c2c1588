"""How fast can this GPU read HBM, and which access pattern reads it fastest? The read-only
ceiling of the decode benchmarks (harness.measure_ceilings) is one kernel: 16-byte loads in a
grid-stride loop. This times other ways of reading the same bytes once, at the sizes of issue 3's
decode cases (2^27 bytes = decode 1 x 32768, 2^30 = 64 x 4096, 2^32 = 128 x 8192), each as a
one-call CUDA-graph replay after the read-pass L2 flush (the decode cases' method):

- ``grid U``: the harness kernel with U loads in flight per thread, full occupancy;
- ``blocks U``: each CTA reads one contiguous range (U loads in flight per thread);
- ``bulk C x S``: one thread per CTA streams its contiguous range into shared memory with
  ``cp.async.bulk`` (the TMA's 1-D copy) of C bytes, S copies in flight, one or two CTAs per SM;
- ``heads``: the decode kernel's pattern over an NHD paged cache: CTA (region, head) reads the
  256-byte rows of its KV head, 2 KB apart, 16 threads per row, eight CTAs side by side per
  region (item-major, as the decode kernel's grid).

GPU only (CuPy compiles the kernels):

    python benchmarks/read_patterns.py OUT.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import harness  # noqa: E402

SRC = r"""
template <int U>
__global__ void read_grid(const int4* __restrict__ x, long long n, unsigned* out) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (U - 1) * stride < n; i += U * stride) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = x[i + u * stride];
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) acc ^= x[i].x;
  if (acc == 0x9e3779b9u) out[0] = acc;
}

template <int U>
__global__ void read_blocks(const int4* __restrict__ x, long long n, unsigned* out) {
  const long long per = (n + gridDim.x - 1) / gridDim.x;
  const long long lo = blockIdx.x * per, hi = min(n, lo + per);
  const int stride = blockDim.x;
  long long i = lo + threadIdx.x;
  unsigned acc = 0;
  for (; i + (U - 1) * stride < hi; i += U * stride) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = x[i + u * stride];
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < hi; i += stride) acc ^= x[i].x;
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// One thread per CTA: contiguous range, C-byte bulk copies, S in flight.
template <int C, int S>
__global__ void read_bulk(const char* __restrict__ x, long long nbytes, unsigned* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  const long long chunks = nbytes / C;
  const long long per = (chunks + gridDim.x - 1) / gridDim.x;
  const long long lo = blockIdx.x * per, hi = min(chunks, lo + per);
  for (int s = 0; s < S; ++s) {
    unsigned b = (unsigned)__cvta_generic_to_shared(&bar[s]);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  auto issue = [&](long long c) {
    const int s = int((c - lo) % S);
    unsigned b = (unsigned)__cvta_generic_to_shared(&bar[s]);
    unsigned dst = (unsigned)__cvta_generic_to_shared(smem + s * C);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(C)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(dst), "l"(x + c * C), "r"(C), "r"(b) : "memory");
  };
  for (long long c = lo; c < hi && c < lo + S; ++c) issue(c);
  for (long long c = lo; c < hi; ++c) {
    const int s = int((c - lo) % S);
    const unsigned parity = unsigned(((c - lo) / S) & 1);
    unsigned b = (unsigned)__cvta_generic_to_shared(&bar[s]);
    asm volatile(
        "{\n .reg .pred P1;\n WAIT:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        " @!P1 bra WAIT;\n}\n" ::"r"(b), "r"(parity) : "memory");
    if (c + S < hi) issue(c + S);
  }
  if (smem[0] == 0x5a && smem[1] == 0xa5 && smem[2] == 0x11) out[0] = 1;
}

// The decode pattern: region r (a request's pages, contiguous here) holds rows of H heads x
// 256 bytes; CTA L reads head L % H of region L / H: rows 2 KB apart, 16 threads per row.
template <int U>
__global__ void read_heads(const int4* __restrict__ x, long long n, int heads, int regions,
                           unsigned* out) {
  const int linear = blockIdx.x;
  const int head = linear % heads;
  unsigned acc = 0;
  const long long row_words = 16LL * heads;  // int4 words per row of all heads
  const long long per_region = n / regions;
  const int rows_per_load = blockDim.x / 16;
  for (int region = linear / heads; region < regions; region += gridDim.x / heads) {
    const int4* base = x + region * per_region + head * 16 + threadIdx.x % 16;
    const long long rows = per_region / row_words;
    long long r = threadIdx.x / 16;
    for (; r + (U - 1) * rows_per_load < rows; r += U * rows_per_load) {
      int4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = base[(r + u * rows_per_load) * row_words];
#pragma unroll
      for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; r < rows; r += rows_per_load) acc ^= base[r * row_words].x;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}
"""

SIZES = {"2^25": 1 << 25, "2^26": 1 << 26, "2^27 (decode 1 x 32768)": 1 << 27, "2^30 (decode 64 x 4096)": 1 << 30,
         "2^32 (decode 128 x 8192)": 1 << 32}


def main() -> int:
    import cupy

    out_path = Path(sys.argv[1])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    names = ([f"read_grid<{u}>" for u in (4, 8)] + [f"read_blocks<{u}>" for u in (4, 8)]
             + [f"read_bulk<{c},{s}>" for c, s in ((16384, 8), (16384, 6), (32768, 4), (32768, 6))]
             + [f"read_heads<{u}>" for u in (4, 8)])
    module = cupy.RawModule(code=SRC, options=("-std=c++17",), name_expressions=names)
    flag = cupy.zeros(1, dtype=cupy.uint32)
    configs = [  # (label, kernel, grid, block, shared bytes, args(x, nbytes))
        ("grid 4 (harness)", "read_grid<4>", sms * 8, 256, 0, lambda x, nb: (x, nb // 16)),
        ("grid 8", "read_grid<8>", sms * 8, 256, 0, lambda x, nb: (x, nb // 16)),
        ("grid 4, 4 CTAs/SM", "read_grid<4>", sms * 4, 256, 0, lambda x, nb: (x, nb // 16)),
        ("blocks 4", "read_blocks<4>", sms * 8, 256, 0, lambda x, nb: (x, nb // 16)),
        ("blocks 8", "read_blocks<8>", sms * 8, 256, 0, lambda x, nb: (x, nb // 16)),
        ("blocks 8, 1 CTA/SM x 1024", "read_blocks<8>", sms, 1024, 0,
         lambda x, nb: (x, nb // 16)),
        ("bulk 16K x 8, 1 CTA/SM", "read_bulk<16384,8>", sms, 32, 8 * 16384,
         lambda x, nb: (x, nb)),
        ("bulk 32K x 4, 1 CTA/SM", "read_bulk<32768,4>", sms, 32, 4 * 32768,
         lambda x, nb: (x, nb)),
        ("bulk 32K x 6, 1 CTA/SM", "read_bulk<32768,6>", sms, 32, 6 * 32768,
         lambda x, nb: (x, nb)),
        ("bulk 16K x 6, 2 CTAs/SM", "read_bulk<16384,6>", 2 * sms, 32, 6 * 16384,
         lambda x, nb: (x, nb)),
        ("heads 4 (NHD decode pattern, 8 heads)", "read_heads<4>", None, 128, 0, None),
        ("heads 8 (NHD decode pattern, 8 heads)", "read_heads<8>", None, 128, 0, None),
    ]
    result = {"device": harness.device_info(), "ceilings": harness.measure_ceilings(),
              "method": "one-call CUDA-graph replays after the read-pass L2 flush, median",
              "sizes": {}}
    print("ceilings", result["ceilings"], flush=True)
    for size_name, nbytes in SIZES.items():
        src = torch.randint(-128, 127, (nbytes,), dtype=torch.int8, device="cuda")
        x = cupy.from_dlpack(src)
        rows = {}
        for label, kname, grid, block, shared, args in configs:
            kernel = module.get_function(kname)
            if shared > 48 * 1024:
                kernel.max_dynamic_shared_size_bytes = shared
            if kname.startswith("read_heads"):
                regions = nbytes // (2 << 20)  # 2 MB per (request), as decode 64 x 4096
                grid = min(regions, sms * 2) * 8
                kargs = (x, cupy.int64(nbytes // 16), cupy.int32(8), cupy.int32(regions), flag)
            else:
                a, b = args(x, nbytes)
                kargs = (a, cupy.int64(b), flag)

            def run(kernel=kernel, grid=grid, block=block, shared=shared, kargs=kargs):
                stream = torch.cuda.current_stream().cuda_stream
                with cupy.cuda.ExternalStream(stream):
                    kernel((grid,), (block,), kargs, shared_mem=shared)

            try:
                run()
                torch.cuda.synchronize()
                med, p10, p90 = harness._median_ms(run, use_cuda_graph=True)
            except Exception as err:  # recorded, never hidden
                rows[label] = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
                print(f"{size_name:28s} {label:40s} ERROR {err}", flush=True)
                continue
            gbps = nbytes / (med * 1e-3) / 1e9
            rows[label] = {"median_us": round(med * 1e3, 2), "p10_us": round(p10 * 1e3, 2),
                           "p90_us": round(p90 * 1e3, 2), "GBps": round(gbps, 1),
                           "grid": grid, "block": block, "shared_bytes": shared}
            print(f"{size_name:28s} {label:40s} {med * 1e3:9.2f} us {gbps:7.0f} GB/s",
                  flush=True)
        result["sizes"][size_name] = {"bytes": nbytes, "patterns": rows}
        del x, src
        torch.cuda.empty_cache()
        harness.write(out_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

    python benchmarks/probes/read_patterns.py OUT.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*

import torch  # noqa: E402

import harness  # noqa: E402

SRC = r"""
// mbarrier and bulk-copy helpers (one thread per CTA issues and waits).
__device__ __forceinline__ unsigned sh(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void bars_init(unsigned long long* bar, int n) {
  for (int s = 0; s < n; ++s)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sh(bar + s)));
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void bar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred P1;\n WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      " @!P1 bra WAIT;\n}\n" ::"r"(sh(bar)), "r"(parity) : "memory");
}

/// `bytes` from global `src` to shared `dst`, completing on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes,
                                          unsigned long long* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sh(bar)),
               "r"(bytes) : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(sh(dst)), "l"(src), "r"(bytes), "r"(sh(bar)) : "memory");
}

// Words i, i + stride, ... below end, U loads in flight per thread; their XOR.
template <int U>
__device__ unsigned read_strided(const int4* __restrict__ x, long long i, long long end,
                                 long long stride) {
  unsigned acc = 0;
  for (; i + (U - 1) * stride < end; i += U * stride) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = x[i + u * stride];
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < end; i += stride) acc ^= x[i].x;
  return acc;
}

template <int U>
__global__ void read_grid(const int4* __restrict__ x, long long n, unsigned* out) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const unsigned acc =
      read_strided<U>(x, (long long)blockIdx.x * blockDim.x + threadIdx.x, n, stride);
  if (acc == 0x9e3779b9u) out[0] = acc;
}

template <int U>
__global__ void read_blocks(const int4* __restrict__ x, long long n, unsigned* out) {
  const long long per = (n + gridDim.x - 1) / gridDim.x;
  const long long lo = blockIdx.x * per, hi = min(n, lo + per);
  const unsigned acc = read_strided<U>(x, lo + threadIdx.x, hi, blockDim.x);
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// One thread per CTA: contiguous range, C-byte bulk copies, S in flight.
template <int C, int S>
__global__ void read_bulk(const char* __restrict__ x, long long nbytes, unsigned* out) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  const long long chunks = nbytes / C;
  const long long per = (chunks + gridDim.x - 1) / gridDim.x;
  const long long lo = blockIdx.x * per, hi = min(chunks, lo + per);
  bars_init(bar, S);
  for (long long c = lo; c < hi && c < lo + S; ++c)
    bulk_copy(smem + (c - lo) % S * C, x + c * C, C, bar + (c - lo) % S);
  for (long long c = lo; c < hi; ++c) {
    bar_wait(bar + (c - lo) % S, unsigned(((c - lo) / S) & 1));
    if (c + S < hi) bulk_copy(smem + (c - lo) % S * C, x + (c + S) * C, C, bar + (c - lo) % S);
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
// The decode kernel's pattern through a page table (pages in random order, cache [P][2][16 tokens]
// [8 heads][128] of 2-byte elements): CTA L takes KV head L % 8 of chunk L / 8, which is
// `ppc` pages of the table. read_paged_loads: 16-byte loads, 16 threads per 256-byte row.
template <int U>
__global__ void read_paged_loads(const int4* __restrict__ x, const int* __restrict__ table,
                                 int ppc, unsigned* out) {
  const int head = blockIdx.x % 8, chunk = blockIdx.x / 8;
  unsigned acc = 0;
  const int rows = ppc * 32;  // K and V rows of 16 tokens per page
  for (int r0 = threadIdx.x / 16; r0 < rows; r0 += U * (blockDim.x / 16)) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int r = min(r0 + u * (blockDim.x / 16), rows - 1);
      const long long page = table[chunk * ppc + r / 32];
      v[u] = x[page * 4096 + (r % 32) * 128 + head * 16 + threadIdx.x % 16];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// The same through the TMA: per page, four 2 KB boxes [16 tokens][64] (K and V, two column
// halves) of the tensor map at `tmap` (dims 64, 2 halves, 8 heads, 16 tokens, 2 x P), one thread
// per CTA, S pages in flight.
template <int S>
__global__ void read_paged_tma(const void* tmap, const int* __restrict__ table, int ppc,
                               unsigned* out) {
  extern __shared__ __align__(1024) unsigned char smem[];  // S x 8 KB, then the barriers
  unsigned long long* bar = reinterpret_cast<unsigned long long*>(smem + S * 8192);
  if (threadIdx.x != 0) return;
  const int head = blockIdx.x % 8, chunk = blockIdx.x / 8;
  bars_init(bar, S);
  auto issue = [&](int i) {
    const int s = i % S;
    const int page = table[chunk * ppc + i];
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sh(bar + s)),
                 "r"(8192) : "memory");
#pragma unroll
    for (int kv = 0; kv < 2; ++kv)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        asm volatile(
            "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
            ::"r"(sh(smem + s * 8192 + kv * 4096 + half * 2048)), "l"(tmap), "r"(0), "r"(half),
              "r"(head), "r"(0), "r"(2 * page + kv), "r"(sh(bar + s)) : "memory");
      }
  };
  for (int i = 0; i < ppc && i < S; ++i) issue(i);
  for (int i = 0; i < ppc; ++i) {
    bar_wait(bar + i % S, unsigned((i / S) & 1));
    if (i + S < ppc) issue(i + S);
  }
  if (smem[0] == 0x5a && smem[1] == 0xa5 && smem[2] == 0x11) out[0] = 1;
}

// All heads of a page at once: one 64 KB bulk copy per page (K and V), one CTA per chunk.
template <int S>
__global__ void read_paged_bulk(const char* __restrict__ x, const int* __restrict__ table,
                                int ppc, unsigned* out) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  constexpr int C = 65536 / 2;  // two 32 KB copies per page
  auto issue = [&](int i) {  // copy i: half i % 2 of page i / 2
    const long long page = table[blockIdx.x * ppc + i / 2];
    bulk_copy(smem + i % S * C, x + page * 65536 + (i % 2) * C, C, bar + i % S);
  };
  bars_init(bar, S);
  const int n = 2 * ppc;
  for (int i = 0; i < n && i < S; ++i) issue(i);
  for (int i = 0; i < n; ++i) {
    bar_wait(bar + i % S, unsigned((i / S) & 1));
    if (i + S < n) issue(i + S);
  }
  if (smem[0] == 0x5a && smem[1] == 0xa5 && smem[2] == 0x11) out[0] = 1;
}
"""

SIZES = {"2^25": 1 << 25, "2^26": 1 << 26, "2^27 (decode 1 x 32768)": 1 << 27, "2^30 (decode 64 x 4096)": 1 << 30,
         "2^32 (decode 128 x 8192)": 1 << 32}


def _time(run) -> dict:
    run()
    torch.cuda.synchronize()
    med, p10, p90 = harness._median_ms(run, use_cuda_graph=True)
    return {"median_us": round(med * 1e3, 2), "p10_us": round(p10 * 1e3, 2),
            "p90_us": round(p90 * 1e3, 2)}


def _tensor_map(ptr: int, pages: int):
    """A TMA tensor map over a cache [pages][2][16][8][128] of 2-byte elements: dims (64
    columns, 2 column halves, 8 heads, 16 tokens, 2 x pages K/V blocks), box [16 tokens][64],
    128-byte swizzle; its 128 bytes on the device (the kernels take its global address)."""
    import ctypes

    import cupy
    import numpy as np

    lib = ctypes.CDLL("libcuda.so.1")
    tmap = (ctypes.c_uint64 * 16)()
    dims = (ctypes.c_uint64 * 5)(64, 2, 8, 16, 2 * pages)
    strides = (ctypes.c_uint64 * 4)(128, 256, 2048, 32768)
    box = (ctypes.c_uint32 * 5)(64, 1, 1, 16, 1)
    ones = (ctypes.c_uint32 * 5)(1, 1, 1, 1, 1)
    # UINT16, rank 5, no interleave, 128-byte swizzle, 256-byte L2 promotion, no OOB fill
    err = lib.cuTensorMapEncodeTiled(ctypes.byref(tmap), 1, 5, ctypes.c_void_p(ptr), dims,
                                     strides, box, ones, 0, 3, 3, 0)
    if err != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed: CUresult {err}")
    return cupy.asarray(np.frombuffer(bytes(tmap), dtype=np.uint64))


# Pages per chunk of the paged patterns, as the decode cases split them: 1 x 32768 is 16 chunks
# of 128 pages per KV head, 64 x 4096 is 64 requests of 256 pages, 128 x 8192 128 of 512.
PAGED = {"2^27 (decode 1 x 32768)": (1 << 27, 128), "2^30 (decode 64 x 4096)": (1 << 30, 256),
         "2^32 (decode 128 x 8192)": (1 << 32, 512)}


def paged(module, flag, sms: int, out_path: Path, result: dict) -> dict:
    """The decode kernel's access pattern over a paged cache (pages shuffled or in order),
    through 16-byte loads, the TMA (per KV head), and 64 KB bulk copies (all heads)."""
    import cupy

    rows = {}
    for size_name, (nbytes, ppc) in PAGED.items():
        src = torch.randint(-128, 127, (nbytes,), dtype=torch.int8, device="cuda")
        x = cupy.from_dlpack(src)
        pages = nbytes // 65536
        tmap = _tensor_map(src.data_ptr(), pages)
        rows[size_name] = {}
        for order in ("shuffled", "in order"):
            perm = torch.randperm(pages) if order == "shuffled" else torch.arange(pages)
            table = cupy.from_dlpack(perm.to(torch.int32).cuda())
            chunks = pages // ppc
            configs = [  # label, kernel, grid, block, shared, args
                ("loads U4, per head", "read_paged_loads<4>", chunks * 8, 128, 0,
                 (x, table, cupy.int32(ppc), flag)),
                ("tma 4 pages in flight, per head", "read_paged_tma<4>", chunks * 8, 32,
                 4 * 8192 + 64, (tmap, table, cupy.int32(ppc), flag)),
                ("tma 8 pages in flight, per head", "read_paged_tma<8>", chunks * 8, 32,
                 8 * 8192 + 64, (tmap, table, cupy.int32(ppc), flag)),
                ("bulk 32K x 4, all heads", "read_paged_bulk<4>", chunks * 8, 32, 4 * 32768,
                 (x, table, cupy.int32(ppc // 8), flag)),
                ("bulk 32K x 6, all heads", "read_paged_bulk<6>", chunks * 8, 32, 6 * 32768,
                 (x, table, cupy.int32(ppc // 8), flag)),
            ]
            for label, kname, grid, block, shared, kargs in configs:
                kernel = module.get_function(kname)
                if shared > 48 * 1024:
                    kernel.max_dynamic_shared_size_bytes = shared

                def run(kernel=kernel, grid=grid, block=block, shared=shared, kargs=kargs):
                    stream = torch.cuda.current_stream().cuda_stream
                    with cupy.cuda.ExternalStream(stream):
                        kernel((grid,), (block,), kargs, shared_mem=shared)

                key = f"{label}, pages {order}"
                try:
                    row = _time(run)
                except Exception as err:  # recorded, never hidden
                    rows[size_name][key] = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
                    print(f"{size_name:28s} {key:48s} ERROR {err}", flush=True)
                    continue
                row["GBps"] = round(nbytes / (row["median_us"] * 1e-6) / 1e9, 1)
                row.update(grid=grid, block=block, shared_bytes=shared)
                rows[size_name][key] = row
                print(f"{size_name:28s} {key:48s} {row['median_us']:9.2f} us "
                      f"{row['GBps']:7.0f} GB/s", flush=True)
        del x, src, tmap
        torch.cuda.empty_cache()
        result["paged"] = rows
        harness.write(out_path, harness.record("probe", "read-patterns", **result))
    return rows


def main() -> int:
    import cupy

    out_path = Path(sys.argv[1])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    names = ([f"read_grid<{u}>" for u in (4, 8)] + [f"read_blocks<{u}>" for u in (4, 8)]
             + [f"read_bulk<{c},{s}>" for c, s in ((16384, 8), (16384, 6), (32768, 4), (32768, 6))]
             + [f"read_heads<{u}>" for u in (4, 8)]
             + ["read_paged_loads<4>", "read_paged_tma<4>", "read_paged_tma<8>",
                "read_paged_bulk<4>", "read_paged_bulk<6>"])
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
    sections = sys.argv[2:] or ["contiguous", "paged"]
    result = {"ceilings": harness.measure_ceilings(),
              "method": "one-call CUDA-graph replays after the read-pass L2 flush, median",
              "sizes": {}}
    print("ceilings", result["ceilings"], flush=True)
    if "paged" in sections:
        result["paged"] = paged(module, flag, sms, out_path, result)
    for size_name, nbytes in SIZES.items():
        if "contiguous" not in sections:
            break
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
        harness.write(out_path, harness.record("probe", "read-patterns", **result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

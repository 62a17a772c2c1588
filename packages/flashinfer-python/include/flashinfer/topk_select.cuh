// Device building blocks of the radix top-k in topk.cuh: order-preserving keys, block scans,
// the row and stash walks, digit histograms and bin selection, the stash-only exact selection
// and the bitonic sort of the k winners. No launch code here.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace flashinfer {
namespace topk {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;          // the widest digit: 11 bits
constexpr int kMaxBufferK = 2048;    // k up to this is gathered (and sorted) in shared memory
constexpr int kCandidateCap = 8192;  // stash / candidates kept in shared memory (64 KB)
constexpr int kElemsPerThread = 8;   // row elements one thread loads per tile (2 x 16 B for float)

enum class Mode : int { kValues = 0, kPageTable = 1, kRagged = 2 };
enum class TieBreak : int { kNone = 0, kSmall = 1, kLarge = 2 };

/// Order-preserving 32-bit keys of float / half / bfloat16 bit patterns (`raw` zero-extended).
template <typename T>
struct KeyTraits;

template <>
struct KeyTraits<float> {
  static constexpr bool kWide = true;
  __device__ __forceinline__ static uint32_t key(uint32_t raw) {
    if ((raw & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;  // NaN: above +inf
    if (raw == 0x80000000u) raw = 0;                             // -0 == +0
    return (raw & 0x80000000u) ? ~raw : (raw | 0x80000000u);
  }
};

template <uint32_t kInf>
struct HalfKey {
  static constexpr bool kWide = false;
  __device__ __forceinline__ static uint32_t key(uint32_t raw) {
    if ((raw & 0x7fffu) > kInf) return 0xffff0000u;
    if (raw == 0x8000u) raw = 0;
    const uint32_t k16 = (raw & 0x8000u) ? (~raw & 0xffffu) : (raw | 0x8000u);
    return k16 << 16;
  }
};
template <>
struct KeyTraits<__half> : HalfKey<0x7c00u> {};
template <>
struct KeyTraits<__nv_bfloat16> : HalfKey<0x7f80u> {};

namespace detail {

__device__ __forceinline__ uint32_t warp_inclusive_scan(uint32_t x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  return x;
}

/// Exclusive prefix of c[u] in tile order (u major, thread minor); returns the tile total.
/// `tot` holds kWarps * U + 1 words; callers alternate two buffers so one sync pair suffices.
template <int U>
__device__ __forceinline__ uint32_t tile_scan(uint32_t (&c)[U], uint32_t* tot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t incl[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    incl[u] = warp_inclusive_scan(c[u]);
    if (lane == 31) tot[u * kWarps + warp] = incl[u];
  }
  __syncthreads();
  if (warp == 0) {
    uint32_t v[U], s = 0;
#pragma unroll
    for (int j = 0; j < U; ++j) s += (v[j] = tot[lane * U + j]);
    const uint32_t si = warp_inclusive_scan(s);
    uint32_t e = si - s;
#pragma unroll
    for (int j = 0; j < U; ++j) {
      tot[lane * U + j] = e;
      e += v[j];
    }
    if (lane == 31) tot[U * kWarps] = si;
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < U; ++u) c[u] = tot[u * kWarps + warp] + incl[u] - c[u];
  return tot[U * kWarps];
}

/// Block-wide exclusive scan of one 32-bit value per thread; returns the exclusive prefix.
__device__ __forceinline__ uint32_t block_scan(uint32_t x, uint32_t* tmp, uint32_t* total) {
  uint32_t c[1] = {x};
  *total = tile_scan<1>(c, tmp);
  return c[0];
}

/// U x V elements of one thread in one tile: element (u, v) has index idx0[u] + v; the V
/// elements of u are all valid or all invalid (ok[u]). Tile order is (u, thread, v), which is
/// index order.
template <int U, int V>
struct Tile {
  static constexpr int kU = U, kV = V;
  uint32_t raw[U][V];
  int idx0[U];
  bool ok[U];
};

template <typename T>
struct VecOf {
  static constexpr int kV = 16 / sizeof(T);
  __device__ __forceinline__ static void unpack(const uint4& x, uint32_t* out) {
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = w[i];
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        out[2 * i] = w[i] & 0xffffu;
        out[2 * i + 1] = w[i] >> 16;
      }
    }
  }
};

template <typename T>
__device__ __forceinline__ uint32_t load_raw(const T* p) {
  if constexpr (sizeof(T) == 4) {
    return __ldg(reinterpret_cast<const uint32_t*>(p));
  } else {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
  }
}

/// A row of the input: an unaligned head, 16-byte vectors (the first cache_vecs of them kept in
/// shared memory by the first walk), an unaligned tail.
template <typename T>
struct RowSource {
  static constexpr int kV = VecOf<T>::kV;
  static constexpr int kU = kElemsPerThread / kV;
  const T* ptr;
  int len, head, nvec, tail_start, cache_vecs;
  int cached = 0;  // vectors the cache holds: cache_vecs once a kFill walk has run
  uint4* cache;

  __device__ RowSource(const T* p, int len_, uint4* cache_, int cache_cap) : ptr(p), len(len_) {
    const int mis = static_cast<int>(reinterpret_cast<uintptr_t>(p) & 15) / sizeof(T);
    head = mis ? min(len, kV - mis) : 0;
    nvec = (len - head) / kV;
    tail_start = head + nvec * kV;
    cache = cache_;
    cache_vecs = min(nvec, cache_cap);
  }

  /// Call f(tile) for every tile in index order; kFill stores the first cache_vecs vectors.
  template <bool kFill, class F>
  __device__ __forceinline__ void for_each_tile(F&& f) {
    const int t = threadIdx.x;
    if (head > 0) {
      Tile<1, 1> h;
      h.idx0[0] = t;
      h.ok[0] = t < head;
      if (h.ok[0]) h.raw[0][0] = load_raw(ptr + t);
      f(h);
    }
    const uint4* gv = reinterpret_cast<const uint4*>(ptr + head);
    // The next tile's loads are issued before this tile is processed, so they are in flight
    // across the block-wide scans of the ordered walks.
    uint4 x[kU];
    auto load = [&](int base) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int vec = base + u * kThreads + t;
        if (vec < nvec) x[u] = vec < cached ? cache[vec] : __ldg(gv + vec);
      }
    };
    if (nvec > 0) load(0);
    for (int base = 0; base < nvec; base += kThreads * kU) {
      Tile<kU, kV> b;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int vec = base + u * kThreads + t;
        b.idx0[u] = head + vec * kV;
        b.ok[u] = vec < nvec;
        if (vec < nvec) {
          if (kFill && vec < cache_vecs) cache[vec] = x[u];
          VecOf<T>::unpack(x[u], b.raw[u]);
        }
      }
      if (base + kThreads * kU < nvec) load(base + kThreads * kU);
      f(b);
    }
    if (tail_start < len) {
      Tile<1, 1> e;
      e.idx0[0] = tail_start + t;
      e.ok[0] = tail_start + t < len;
      if (e.ok[0]) e.raw[0][0] = load_raw(ptr + tail_start + t);
      f(e);
    }
    if (kFill) cached = cache_vecs;
  }
};

/// The candidates stashed in shared memory, in index order.
struct CandidateSource {
  const uint32_t* raw;
  const int32_t* idx;
  int n;
  template <bool kFill, class F>
  __device__ __forceinline__ void for_each_tile(F&& f) {
    for (int base = 0; base < n; base += kThreads) {
      Tile<1, 1> c;
      const int i = base + threadIdx.x;
      c.ok[0] = i < n;
      c.idx0[0] = c.ok[0] ? idx[i] : 0;
      c.raw[0][0] = c.ok[0] ? raw[i] : 0;
      f(c);
    }
  }
};

struct Shared {
  uint32_t hist[kBins];
  uint32_t tot[2][kWarps * (kElemsPerThread / 4) + 1];
  uint32_t bin, above, count;
  uint32_t stash_n, stash_lo;  // the first walk's stash: size, lowest bin kept (kNoStash: none)
};

constexpr uint32_t kNoStash = 0xffffffffu;

/// Histogram of the digit (key >> shift) & (nbins - 1) over the keys with (key & mask) == prefix.
template <typename K, class Src>
__device__ void histogram(Src& src, Shared& sh, uint32_t prefix, uint32_t mask, int shift,
                          int nbins) {
  for (int i = threadIdx.x; i < nbins; i += kThreads) sh.hist[i] = 0;
  __syncthreads();
  src.template for_each_tile<false>([&](auto& tile) {
    using TileT = std::remove_reference_t<decltype(tile)>;
#pragma unroll
    for (int u = 0; u < TileT::kU; ++u)
      if (tile.ok[u]) {
#pragma unroll
        for (int v = 0; v < TileT::kV; ++v) {
          const uint32_t key = K::key(tile.raw[u][v]);
          if ((key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & (nbins - 1)], 1u);
        }
      }
  });
  __syncthreads();
}

__device__ void select_bin(Shared& sh, int nbins, uint32_t r);

/// The first walk over the row: the 11-bit histogram of every key, the row cache, and a stash of
/// every key whose bin is at least sh.stash_lo, a bin chosen after the first body tile (the
/// sample) so that about 1.5 k + 64 keys of the row are expected at or above it. When the stash
/// did not overflow and the k-th largest key's bin is at or above stash_lo, the selection needs
/// only the stash (stash_select); otherwise the row is walked again (the ordered passes).
template <typename K, typename T>
__device__ void first_walk(RowSource<T>& src, Shared& sh, uint32_t* stash_raw, int32_t* stash_idx,
                           int cap, int k) {
  for (int i = threadIdx.x; i < kBins; i += kThreads) sh.hist[i] = 0;
  if (threadIdx.x == 0) {
    sh.stash_n = 0;
    sh.stash_lo = kNoStash;
  }
  __syncthreads();
  uint32_t lo = 0;  // before the sample: the (few) head elements are stashed unconditionally
  bool decided = false;
  auto stash = [&](uint32_t key, uint32_t raw, int idx) {
    if ((key >> 21) >= lo) {
      const uint32_t pos = atomicAdd(&sh.stash_n, 1u);
      if (pos < static_cast<uint32_t>(cap)) {
        stash_raw[pos] = raw;
        stash_idx[pos] = idx;
      }
    }
  };
  src.template for_each_tile<true>([&](auto& tile) {
    using TileT = std::remove_reference_t<decltype(tile)>;
#pragma unroll
    for (int u = 0; u < TileT::kU; ++u)
      if (tile.ok[u]) {
#pragma unroll
        for (int v = 0; v < TileT::kV; ++v) atomicAdd(&sh.hist[K::key(tile.raw[u][v]) >> 21], 1u);
      }
    if (TileT::kV > 1 && !decided) {  // the first body tile: choose the stash's lowest bin
      __syncthreads();
      const int64_t seen = src.head + min(src.nvec, kThreads * TileT::kU) * TileT::kV;
      const int64_t want = static_cast<int64_t>(k) + k / 2 + 64;
      int64_t r = (want * seen + src.len - 1) / src.len;
      r = r < 1 ? 1 : (r > seen ? seen : r);
      select_bin(sh, kBins, static_cast<uint32_t>(r));
      lo = sh.bin;
      decided = true;
      if (threadIdx.x == 0) sh.stash_lo = lo;
    }
#pragma unroll
    for (int u = 0; u < TileT::kU; ++u)
      if (tile.ok[u]) {
#pragma unroll
        for (int v = 0; v < TileT::kV; ++v)
          stash(K::key(tile.raw[u][v]), tile.raw[u][v], tile.idx0[u] + v);
      }
  });
  __syncthreads();
}

/// The bin holding the r-th largest key (1-based): sh.bin, the count above it (sh.above) and
/// in it (sh.count). Bins are read from the top, two per thread.
__device__ void select_bin(Shared& sh, int nbins, uint32_t r) {
  const int q = 2 * threadIdx.x;
  const uint32_t h0 = q < nbins ? sh.hist[nbins - 1 - q] : 0;
  const uint32_t h1 = q + 1 < nbins ? sh.hist[nbins - 2 - q] : 0;
  uint32_t total;
  const uint32_t excl = block_scan(h0 + h1, sh.tot[0], &total);
  if (excl < r && r <= excl + h0 + h1) {
    const bool first = excl + h0 >= r;
    sh.bin = nbins - 1 - (first ? q : q + 1);
    sh.above = first ? excl : excl + h0;
    sh.count = first ? h0 : h1;
  }
  __syncthreads();
}

/// Walk `src` in index order; class 1 elements go to take(rank1, idx, raw), class 2 elements to
/// on2(rank2, idx, raw), where the ranks count that class from 0 in index order.
template <typename K, class Src, class Cls, class Take, class On2>
__device__ void ordered_pass(Src& src, Shared& sh, Cls cls, Take take, On2 on2) {
  uint32_t base1 = 0, base2 = 0;
  int parity = 0;
  src.template for_each_tile<false>([&](auto& tile) {
    using TileT = std::remove_reference_t<decltype(tile)>;
    constexpr int U = TileT::kU, V = TileT::kV;
    // Bit v of m1[u] / m2[u]: element (u, v) is of class 1 / 2.
    uint32_t c[U], m1[U], m2[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      m1[u] = m2[u] = 0;
      if (tile.ok[u]) {
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const int cl = cls(K::key(tile.raw[u][v]));
          m1[u] |= static_cast<uint32_t>(cl == 1) << v;
          m2[u] |= static_cast<uint32_t>(cl == 2) << v;
        }
      }
      c[u] = __popc(m1[u]) + (__popc(m2[u]) << 16);
    }
    const uint32_t total = tile_scan<U>(c, sh.tot[parity]);
    parity ^= 1;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      uint32_t p1 = base1 + (c[u] & 0xffffu), p2 = base2 + (c[u] >> 16);
      if (m1[u] | m2[u]) {  // most threads select nothing
#pragma unroll
        for (int v = 0; v < V; ++v) {
          if (m1[u] >> v & 1) take(p1++, tile.idx0[u] + v, tile.raw[u][v]);
          if (m2[u] >> v & 1) on2(p2++, tile.idx0[u] + v, tile.raw[u][v]);
        }
      }
    }
    base1 += total & 0xffffu;
    base2 += total >> 16;
  });
  __syncthreads();
}

struct Prefix {
  uint32_t value, mask, remaining, count;  // keys with (key & mask) == value: count; take remaining
};

/// Resolve the digits below the first one over `src` until the prefix is exact or all of its
/// keys are taken.
template <typename K, class Src>
__device__ Prefix refine(Src& src, Shared& sh, Prefix p) {
  constexpr int kRounds = K::kWide ? 2 : 1;
  const int shifts[2] = {10, 0}, widths[2] = {11, 10};
#pragma unroll 1
  for (int i = 0; i < kRounds && p.count != p.remaining; ++i) {
    const int nbins = 1 << widths[i];
    histogram<K>(src, sh, p.value, p.mask, shifts[i], nbins);
    select_bin(sh, nbins, p.remaining);
    p.value |= sh.bin << shifts[i];
    p.mask |= static_cast<uint32_t>(nbins - 1) << shifts[i];
    p.remaining -= sh.above;
    p.count = sh.count;
    __syncthreads();  // sh.bin/above/count are rewritten by the next round
  }
  return p;
}

/// Histogram of digit (f(i) >> shift) & (nbins - 1) over the stash entries i with
/// valid(i) and (f(i) & mask) == prefix, then the bin of the r-th largest (select_bin).
template <class Valid, class KeyOf>
__device__ void stash_round(Shared& sh, int n, Valid valid, KeyOf f, uint32_t prefix,
                            uint32_t mask, int shift, int nbins, uint32_t r) {
  for (int i = threadIdx.x; i < nbins; i += kThreads) sh.hist[i] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += kThreads) {
    if (!valid(i)) continue;
    const uint32_t key = f(i);
    if ((key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & (nbins - 1)], 1u);
  }
  __syncthreads();
  select_bin(sh, nbins, r);
}

/// Exact selection from the stash, which holds every key of the threshold bin and above: the
/// remaining key digits, then (for ties at the exact k-th key) the digits of the index, ranked as
/// the tie-break asks, so that `selected` below holds for exactly k entries. Their output
/// positions are their ranks in index order, from a bitmap of the row (`bits`, `prefix`: each
/// ceil(len / 32) words of shared memory).
template <typename K, class Emit>
__device__ void stash_select(Shared& sh, const uint32_t* stash_raw, const int32_t* stash_idx,
                             int n, Prefix p, bool prefer_large, uint32_t* bits,
                             uint32_t* prefix, int len, Emit emit) {
  auto all = [](int) { return true; };
  auto key_of = [&](int i) { return K::key(stash_raw[i]); };
  const int shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
  constexpr int kRounds = K::kWide ? 2 : 1;
#pragma unroll 1
  for (int i = 0; i < kRounds && p.count != p.remaining; ++i) {
    stash_round(sh, n, all, key_of, p.value, p.mask, shifts[i + 1], 1 << widths[i + 1],
                p.remaining);
    p.value |= sh.bin << shifts[i + 1];
    p.mask |= ((1u << widths[i + 1]) - 1) << shifts[i + 1];
    p.remaining -= sh.above;
    p.count = sh.count;
    __syncthreads();
  }
  // ties at the exact key: the preferred index has the larger tie key
  auto tie_key = [&](int i) {
    const uint32_t idx = static_cast<uint32_t>(stash_idx[i]);
    return prefer_large ? idx : ~idx;
  };
  auto at_key = [&](int i) { return (K::key(stash_raw[i]) & p.mask) == p.value; };
  uint32_t tvalue = 0, tmask = 0, count = p.count, remaining = p.remaining;
#pragma unroll 1
  for (int i = 0; i < 3 && count != remaining; ++i) {
    stash_round(sh, n, at_key, tie_key, tvalue, tmask, shifts[i], 1 << widths[i], remaining);
    tvalue |= sh.bin << shifts[i];
    tmask |= ((1u << widths[i]) - 1) << shifts[i];
    remaining -= sh.above;
    count = sh.count;
    __syncthreads();
  }
  auto selected = [&](int i) {
    const uint32_t key = K::key(stash_raw[i]) & p.mask;
    return key > p.value || (key == p.value && (tie_key(i) & tmask) >= tvalue);
  };
  const int words = (len + 31) / 32;
  for (int w = threadIdx.x; w < words; w += kThreads) bits[w] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += kThreads)
    if (selected(i)) atomicOr(&bits[stash_idx[i] >> 5], 1u << (stash_idx[i] & 31));
  __syncthreads();
  const int per = (words + kThreads - 1) / kThreads, w0 = threadIdx.x * per;
  uint32_t sum = 0;
  for (int w = w0; w < min(w0 + per, words); ++w) sum += __popc(bits[w]);
  uint32_t total;
  uint32_t run = block_scan(sum, sh.tot[0], &total);
  for (int w = w0; w < min(w0 + per, words); ++w) {
    prefix[w] = run;
    run += __popc(bits[w]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += kThreads) {
    if (!selected(i)) continue;
    const int idx = stash_idx[i];
    const uint32_t below = bits[idx >> 5] & ((1u << (idx & 31)) - 1);
    emit(static_cast<int>(prefix[idx >> 5] + __popc(below)), idx, stash_raw[i]);
  }
  __syncthreads();
}

constexpr int32_t kPadIdx = 0x7fffffff;

template <typename K>
__device__ void bitonic_sort(uint32_t* raw, int32_t* idx, int n, int entries) {
  for (int i = n + threadIdx.x; i < entries; i += kThreads) {
    raw[i] = 0;  // padding: index kPadIdx, which no element has, sorts last
    idx[i] = kPadIdx;
  }
  __syncthreads();
  auto before = [&](int a, int b) {  // a sorts before b
    const bool pa = idx[a] == kPadIdx, pb = idx[b] == kPadIdx;
    if (pa || pb) return !pa && pb;
    const uint32_t ka = K::key(raw[a]), kb = K::key(raw[b]);
    return ka > kb || (ka == kb && idx[a] < idx[b]);
  };
  for (int size = 2; size <= entries; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < entries / 2; i += kThreads) {
        const int a = 2 * i - (i & (stride - 1)), b = a + stride;
        const bool up = (a & size) == 0;
        if (before(b, a) == up) {
          const uint32_t r = raw[a];
          raw[a] = raw[b];
          raw[b] = r;
          const int32_t x = idx[a];
          idx[a] = idx[b];
          idx[b] = x;
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace detail
}  // namespace topk
}  // namespace flashinfer

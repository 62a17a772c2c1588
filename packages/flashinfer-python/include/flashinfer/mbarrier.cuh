// Shared-memory addresses, mbarriers (one 64-bit word in shared memory each) and the 1-D bulk
// copy that completes on one: the pieces the attention kernels (attention/mma.cuh, sm90.cuh)
// and the top-k stream (sampling.cuh) share. Plain inline PTX; the sm_90-only instructions
// compile to nothing below sm_90, so callers guard their use (attention:
// FLASHINFER_SM90_ENABLED; sampling: a run-time size of 0 below sm_90).
#pragma once
#include <cstdint>

namespace flashinfer {

/// The shared-state-space address of `p` (a generic pointer into this CTA's shared memory).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}

/// Makes this thread's mbar_init visible to the async proxy (bulk copies completing on it).
__device__ __forceinline__ void mbar_fence_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

/// Block until phase `parity` (0 or 1) of `bar` has completed. sm_90+.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

/// An arrival on `bar` that also expects `bytes` more from async copies (TMA) in this phase.
/// sm_90+.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}

/// A bulk copy (the TMA engine: one instruction, no load slots) of `bytes` (a multiple of 16)
/// from global `src` to shared `dst` under L2 policy `policy` (createpolicy), completing on
/// `bar`. sm_90+.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1], %2, [%3], %4;\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
#endif
}

}  // namespace flashinfer

// Force-included into every translation unit of every module (``-include manylinux_compat.h``,
// flashinfer/jit/core.py), so that a module built on a new Linux loads on any glibc >= 2.28 with
// the libstdc++ of GCC 8 (RHEL 8): what the jit-cache wheel's tag py3-none-manylinux_2_28
// promises. tools/wheels/check.py reads every module's ELF version needs and fails the build if
// one asks for more; docs/wheels.md lists what each line here removes.
//
// NOTE: this header only changes which *versioned* symbols the host code binds to; the code
// itself and the device code are unchanged (it is empty for the device passes).
#pragma once

#if !defined(__CUDA_ARCH__) && defined(__linux__) && defined(__GLIBC__) && defined(__cplusplus)

// 1. glibc 2.29 gave exp, exp2, log, log2 and pow new symbol versions (faster, no SVID error
//    handling; same results). Host code compiled against newer headers binds to those, e.g. the
//    RoPE frequency table's std::pow and attention's host-side log2. Bind to the baseline
//    versions instead, which every glibc still exports.
#if defined(__x86_64__)
#define FLASHINFER_GLIBC_BASELINE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define FLASHINFER_GLIBC_BASELINE "GLIBC_2.17"
#endif
#ifdef FLASHINFER_GLIBC_BASELINE
__asm__(".symver exp,exp@" FLASHINFER_GLIBC_BASELINE);
__asm__(".symver exp2,exp2@" FLASHINFER_GLIBC_BASELINE);
__asm__(".symver log,log@" FLASHINFER_GLIBC_BASELINE);
__asm__(".symver log2,log2@" FLASHINFER_GLIBC_BASELINE);
__asm__(".symver pow,pow@" FLASHINFER_GLIBC_BASELINE);
#undef FLASHINFER_GLIBC_BASELINE
#endif

// 2. From GCC 9 on, libstdc++ exports std::ostringstream's default constructor out of line
//    (GLIBCXX_3.4.26, newer than GCC 8's 3.4.25); TVM-FFI's error builder (TVM_FFI_THROW)
//    default-constructs one. An explicit instantiation gives every module its own (weak, merged
//    across translation units) copy of the class's members, so none is imported from libstdc++.
#include <sstream>
template class std::basic_ostringstream<char>;

#endif

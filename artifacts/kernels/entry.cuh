// Shared by the cubin entry sources: the macros every build must pass (tools/cubin_build.py).
#pragma once
#include <cstddef>  // offsetof, for the generated layout checks

#ifndef FI_T
#error "FI_T (the element type) must be defined by the cubin builder"
#endif
#ifndef FI_ACCESS
#error "FI_ACCESS (bytes per access, 0 = one element) must be defined by the cubin builder"
#endif
#ifndef FI_LAYOUT_CHECK
#error "FI_LAYOUT_CHECK (the generated parameter-layout checks) must be defined by the builder"
#endif

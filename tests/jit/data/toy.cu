// A tiny module for the JIT tests: cheap to compile, and its answer comes from a header so a
// header edit is visible in the loaded module.
#include <tvm/ffi/function.h>

#include "toy_value.h"

#ifndef TOY_OFFSET
#define TOY_OFFSET 0
#endif

int64_t toy_value() { return TOY_VALUE + TOY_OFFSET; }

TVM_FFI_DLL_EXPORT_TYPED_FUNC(toy_value, toy_value);

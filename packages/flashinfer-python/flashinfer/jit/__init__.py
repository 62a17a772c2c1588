"""The JIT compiler: module specs, the cache, and the build. See :mod:`flashinfer.jit.core`."""

from .core import JitSpec, get_module

__all__ = ["JitSpec", "get_module"]

"""Loading kernel binaries through the CUDA driver API (no nvcc, no compile step).

The driver is reached at run time with ctypes on ``libcuda.so.1`` (installed with the NVIDIA
driver; no link-time dependency, so this module imports on machines without a GPU). Cubins are
loaded into each device's *primary* context, the one torch uses, with ``cuModuleLoadData``; the
functions are cached per (device, sha256, symbol). Launches go through ``cuLaunchKernelEx`` on the
caller's stream, with the Programmatic Dependent Launch attribute when asked for.

The loader takes only a :class:`~flashinfer.artifacts.store.VerifiedBlob`: bytes that were hashed
against the pinned manifest when they were read. It hashes them once more right before
``cuModuleLoadData`` (tens of microseconds for a cubin, once per module and device), so "the bytes
handed to the driver match the manifest" is checked at the one place that loads anything, not
only where the bytes were read. Loading a cubin whose bytes do not match the manifest is
therefore impossible through this API, except by FLASHINFER_CUBIN_CHECKSUM_DISABLED=1, which
yields blobs marked ``checked=False`` (with a warning each; :func:`~.store.verify_local`). What was loaded stays loaded: the driver holds a copy,
so changing the file afterwards changes nothing in this process (:func:`clear_caches` makes the
next use read and verify it again).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Iterator, Optional, Sequence

from .errors import LoaderError
from .store import VerifiedBlob, verify

CUDA_SUCCESS = 0
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
#: Dynamic shared memory above this needs an explicit opt-in per function.
DEFAULT_SMEM_LIMIT = 48 * 1024


class CUlaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an enum id, padding to 8 bytes, then a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_int * 16)]


class CUlaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(CUlaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
# name in libcuda -> argtypes (every driver call returns CUresult, an int)
_SIGNATURES = {
    "cuInit": [ctypes.c_uint],
    "cuDriverGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [_PP, ctypes.c_int],
    "cuCtxGetCurrent": [_PP],
    "cuCtxPushCurrent_v2": [_P],
    "cuCtxPopCurrent_v2": [_PP],
    "cuModuleLoadData": [_PP, ctypes.c_char_p],
    "cuModuleGetFunction": [_PP, _P, ctypes.c_char_p],
    "cuFuncSetAttribute": [_P, ctypes.c_int, ctypes.c_int],
    "cuFuncGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, _P],
    "cuLaunchKernelEx": [ctypes.POINTER(CUlaunchConfig), _P, _PP, _PP],
    "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
}


class Driver:
    """The CUDA driver API functions we use, bound with ctypes."""

    def __init__(self, libname: str = "libcuda.so.1"):
        try:
            lib = ctypes.CDLL(libname)
        except OSError as e:
            raise LoaderError(
                f"dlopen {libname}", -1,
                f"{e}; the cubin backend needs the NVIDIA driver (use backend='auto' for the JIT)",
            ) from None
        for name, argtypes in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise LoaderError(
                    name, -1, f"{libname} has no {name}; the driver is too old (CUDA 12+ needed)"
                ) from None
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            setattr(self, name, fn)
        self.check("cuInit", self.cuInit(0))

    def error_text(self, code: int) -> str:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.cuGetErrorName(code, ctypes.byref(name))
        self.cuGetErrorString(code, ctypes.byref(text))
        return f"{(name.value or b'?').decode()}: {(text.value or b'unknown error').decode()}"

    def check(self, call: str, code: int, what: str = "") -> None:
        if code != CUDA_SUCCESS:
            detail = self.error_text(code) if call != "cuInit" or code != 100 else (
                "no CUDA device is visible"
            )
            raise LoaderError(call, code, f"{detail}{f' ({what})' if what else ''}")


_DRIVER: Optional[Driver] = None
_LOCK = threading.RLock()


def driver() -> Driver:
    global _DRIVER
    with _LOCK:
        if _DRIVER is None:
            _DRIVER = Driver()
        return _DRIVER


class Loader:
    """Loaded modules and functions, per device; one instance per process (:func:`loader`)."""

    def __init__(self, drv: Optional[Driver] = None):
        self._drv = drv
        self._contexts: dict[int, ctypes.c_void_p] = {}
        self._modules: dict[tuple[int, str], ctypes.c_void_p] = {}
        self._functions: dict[tuple[int, str, str], ctypes.c_void_p] = {}
        self._smem_set: dict[tuple[int, int], int] = {}

    @property
    def drv(self) -> Driver:
        if self._drv is None:
            self._drv = driver()
        return self._drv

    def _primary_context(self, device: int) -> ctypes.c_void_p:
        ctx = self._contexts.get(device)
        if ctx is None:
            dev = ctypes.c_int()
            self.drv.check("cuDeviceGet", self.drv.cuDeviceGet(ctypes.byref(dev), device))
            ctx = ctypes.c_void_p()
            self.drv.check(
                "cuDevicePrimaryCtxRetain",
                self.drv.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value),
            )
            self._contexts[device] = ctx  # retained for the process's life, like torch does
        return ctx

    def _enter(self, device: int) -> bool:
        """Make ``device``'s primary context current on this thread; True if it was pushed
        (then :meth:`_leave` pops it)."""
        ctx = self._primary_context(device)
        cur = ctypes.c_void_p()
        self.drv.check("cuCtxGetCurrent", self.drv.cuCtxGetCurrent(ctypes.byref(cur)))
        if cur.value == ctx.value:
            return False
        self.drv.check("cuCtxPushCurrent", self.drv.cuCtxPushCurrent_v2(ctx))
        return True

    def _leave(self, pushed: bool) -> None:
        if pushed:
            popped = ctypes.c_void_p()
            self.drv.cuCtxPopCurrent_v2(ctypes.byref(popped))

    @contextlib.contextmanager
    def current(self, device: int) -> Iterator[None]:
        """Make ``device``'s primary context current on this thread for the block."""
        pushed = self._enter(device)
        try:
            yield
        finally:
            self._leave(pushed)

    def function(self, blob: VerifiedBlob, device: int) -> ctypes.c_void_p:
        """The kernel of a verified cubin, loaded on ``device`` (cached)."""
        if not isinstance(blob, VerifiedBlob):
            raise TypeError(
                "the loader takes a VerifiedBlob (from flashinfer.artifacts.get_cubin), got "
                f"{type(blob).__name__}: unverified bytes are never loaded"
            )
        kernel = blob.entry.kernel
        if kernel is None:
            raise LoaderError("cuModuleGetFunction", -1, f"{blob.entry.path} is not a kernel")
        key = (device, blob.entry.sha256, kernel.symbol)
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        with _LOCK:
            fn = self._functions.get(key)
            if fn is not None:
                return fn
            with self.current(device):
                module = self._modules.get((device, blob.entry.sha256))
                if module is None:
                    if blob.checked:  # see the module docstring
                        verify(blob.entry, blob.data, blob.source)
                    module = ctypes.c_void_p()
                    self.drv.check(
                        "cuModuleLoadData",
                        self.drv.cuModuleLoadData(ctypes.byref(module), blob.data),
                        f"{blob.entry.path} on device {device}",
                    )
                    self._modules[(device, blob.entry.sha256)] = module
                fn = ctypes.c_void_p()
                self.drv.check(
                    "cuModuleGetFunction",
                    self.drv.cuModuleGetFunction(ctypes.byref(fn), module, kernel.symbol.encode()),
                    f"{kernel.symbol} in {blob.entry.path}",
                )
            self._functions[key] = fn
            return fn

    def launch(
        self,
        fn: ctypes.c_void_p,
        device: int,
        grid: Sequence[int],
        block: Sequence[int],
        stream: int,
        params: ctypes.Array,
        arg_offsets: Sequence[int],
        dynamic_smem: int = 0,
        pdl: bool = False,
        what: str = "",
    ) -> None:
        """Launch ``fn`` with its arguments packed in ``params`` (one buffer; argument ``i``
        starts at ``arg_offsets[i]``), checking the launch's error."""
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        base = ctypes.addressof(params)
        args = (ctypes.c_void_p * len(arg_offsets))(*(base + off for off in arg_offsets))
        attr = CUlaunchAttribute()
        attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value[0] = 1 if pdl else 0  # programmaticStreamSerializationAllowed
        config = CUlaunchConfig(
            *grid, *block, dynamic_smem, ctypes.c_void_p(stream or None), ctypes.pointer(attr), 1
        )
        pushed = self._enter(device)  # not `with self.current(...)`: a launch is per call
        try:
            if dynamic_smem > DEFAULT_SMEM_LIMIT and self._smem_set.get(
                (device, fn.value or 0), 0
            ) < dynamic_smem:
                self.drv.check(
                    "cuFuncSetAttribute",
                    self.drv.cuFuncSetAttribute(
                        fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem
                    ),
                    what,
                )
                self._smem_set[(device, fn.value or 0)] = dynamic_smem
            code = self.drv.cuLaunchKernelEx(ctypes.byref(config), fn, args, None)
            if code:  # the message is built only for a failure
                self.drv.check("cuLaunchKernelEx", code,
                               f"{what} grid={grid} block={block} smem={dynamic_smem}")
        finally:
            self._leave(pushed)


_LOADER: Optional[Loader] = None


def loader() -> Loader:
    global _LOADER
    with _LOCK:
        if _LOADER is None:
            _LOADER = Loader()
        return _LOADER


def clear_caches() -> None:
    """Forget every loaded module and function: the next use loads from verified bytes again.

    The modules are not unloaded from the driver (a captured CUDA graph may still launch their
    functions); a process that calls this a few times holds a few more small modules.
    """
    global _LOADER
    with _LOCK:
        _LOADER = None

"""The driver-API loader on a machine without a GPU: its ctypes structs against cuda.h, and its
logic (contexts, caching, launch configuration, errors) against a fake driver."""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from flashinfer.artifacts import LoaderError, VerifiedBlob
from flashinfer.artifacts.kernels import arch_candidates, pack_params
from flashinfer.artifacts.loader import (
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
    CUlaunchAttribute,
    CUlaunchConfig,
    Driver,
    Loader,
)
from flashinfer.artifacts.manifest import FileEntry, KernelInfo, ParamField, ParamLayout, sha256_hex
from flashinfer.artifacts.store import verify

LAYOUT = ParamLayout(72, 8, (
    ParamField("input", "ptr", 0), ParamField("out", "ptr", 8), ParamField("rows", "i64", 16),
    ParamField("d", "i32", 24), ParamField("scale", "f32", 28),
), ((0, 8), (8, 8), (16, 56)))


def blob(data: bytes = b"\x7fELF fake cubin", symbol: str = "_Z6kernelv") -> VerifiedBlob:
    kernel = KernelInfo("k", "fam", symbol, "rule", {"dtype": "bfloat16"}, LAYOUT)
    entry = FileEntry("sm_90a/fam/k.cubin", sha256_hex(data), len(data), "9.0a", kernel)
    return verify(entry, data, "test")


def test_verified_blobs_come_only_from_verify():
    with pytest.raises(TypeError, match="verify"):
        VerifiedBlob(blob().entry, b"x", "forged", object())


def test_the_loader_refuses_anything_but_a_verified_blob():
    with pytest.raises(TypeError, match="VerifiedBlob"):
        Loader(drv=None).function(b"\x7fELF raw bytes", 0)


def test_the_loader_hashes_the_bytes_it_hands_to_the_driver():
    """A VerifiedBlob cannot be changed, and if its bytes were changed anyway (here by going
    around the class), the loader refuses them: what reaches cuModuleLoadData is hashed there."""
    from flashinfer.artifacts import ChecksumError

    b = blob()
    with pytest.raises(AttributeError, match="immutable"):
        b.data = b"\x7fELF evil"
    object.__setattr__(b, "data", b"\x7fELF evil cubin")
    drv = FakeDriver()
    with pytest.raises(ChecksumError, match="sha256|size"):
        Loader(drv=drv).function(b, 0)
    assert "cuModuleLoadData" not in drv.calls


def test_an_unchecked_blob_reaches_the_driver_only_through_the_knob():
    """FLASHINFER_CUBIN_CHECKSUM_DISABLED=1 (verify_local) yields a blob marked unchecked, which
    the loader hands to the driver without hashing it again; without the knob, verify_local
    refuses the same bytes."""
    from flashinfer import knobs
    from flashinfer.artifacts import ChecksumError, UnverifiedCubinWarning
    from flashinfer.artifacts.store import verify_local

    entry = blob().entry
    with pytest.raises(ChecksumError):
        verify_local(entry, b"\x7fELF rebuilt", "test")
    with knobs.artifacts.scope():
        knobs.artifacts.checksum_disabled = True
        with pytest.warns(UnverifiedCubinWarning):
            b = verify_local(entry, b"\x7fELF rebuilt", "test")
    assert b.checked is False
    drv = FakeDriver()
    Loader(drv=drv).function(b, 0)
    assert "cuModuleLoadData" in drv.calls


def test_missing_driver_is_a_typed_error():
    with pytest.raises(LoaderError, match="NVIDIA driver") as info:
        Driver("libcuda-that-does-not-exist.so.1")
    assert info.value.code == -1


@pytest.mark.nvcc
def test_ctypes_structs_match_cuda_h(tmp_path):
    from flashinfer.jit import toolchain

    cc = shutil.which("gcc") or shutil.which("cc")
    home = toolchain.cuda_home()
    candidates = [Path(home) / "include"] if home else []
    candidates += [Path("/usr/local/cuda/include")]
    include = next((c for c in candidates if (c / "cuda.h").exists()), candidates[0])
    if cc is None or not (include / "cuda.h").exists():
        pytest.skip(f"needs a C compiler and cuda.h (cc={cc}, include={include})")
    src = tmp_path / "l.c"
    src.write_text(
        "#include <cuda.h>\n#include <stdio.h>\n#include <stddef.h>\n"
        "int main(){printf(\"%zu %zu %zu %zu %zu %zu %zu %d\", sizeof(CUlaunchAttribute),"
        " offsetof(CUlaunchAttribute, value), sizeof(CUlaunchConfig),"
        " offsetof(CUlaunchConfig, sharedMemBytes), offsetof(CUlaunchConfig, hStream),"
        " offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),"
        " (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);}\n"
    )
    subprocess.run([cc, f"-I{include}", str(src), "-o", str(tmp_path / "l")], check=True)
    got = subprocess.run([str(tmp_path / "l")], capture_output=True, text=True).stdout.split()
    ours = [ctypes.sizeof(CUlaunchAttribute), CUlaunchAttribute.value.offset,
            ctypes.sizeof(CUlaunchConfig), CUlaunchConfig.sharedMemBytes.offset,
            CUlaunchConfig.hStream.offset, CUlaunchConfig.attrs.offset,
            CUlaunchConfig.numAttrs.offset, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
    assert list(map(int, got)) == ours


def test_pack_params_by_name():
    buf = pack_params(LAYOUT, {"input": 0x1000, "out": 0x2000, "rows": -3, "d": 7, "scale": 0.5})
    raw = bytes(buf)
    assert len(raw) == 72
    assert struct.unpack_from("<QQqif", raw, 0) == (0x1000, 0x2000, -3, 7, 0.5)
    assert raw[32:] == bytes(40)  # everything not named is zero
    with pytest.raises(KeyError, match="nope"):
        pack_params(LAYOUT, {"nope": 1})


def test_arch_candidates():
    assert arch_candidates(9, 0) == ["9.0a", "9.0f", "9.0"]
    assert arch_candidates(8, 6)[:4] == ["8.6a", "8.6f", "8.6", "8.5f"]
    assert "8.0" in arch_candidates(8, 9) and "9.0" not in arch_candidates(8, 9)


class FakeDriver:
    """Records calls; hands out handles; fails the calls listed in ``fail``."""

    def __init__(self, fail=()):
        self.calls = []
        self.fail = dict(fail)
        self.current = None
        self.launches = []

    def _set(self, ref, value):
        ref._obj.value = value

    def _ret(self, name):
        self.calls.append(name)
        return self.fail.get(name, 0)

    def check(self, call, code, what=""):
        if code:
            raise LoaderError(call, code, f"fake error {what}")

    def cuDeviceGet(self, ref, ordinal):
        self._set(ref, ordinal)
        return self._ret("cuDeviceGet")

    def cuDevicePrimaryCtxRetain(self, ref, dev):
        self._set(ref, 0x100 + dev)
        return self._ret("cuDevicePrimaryCtxRetain")

    def cuCtxGetCurrent(self, ref):
        self._set(ref, self.current)
        return self._ret("cuCtxGetCurrent")

    def cuCtxPushCurrent_v2(self, ctx):
        self.saved, self.current = self.current, ctx.value
        return self._ret("cuCtxPushCurrent")

    def cuCtxPopCurrent_v2(self, ref):
        self.current = self.saved
        return self._ret("cuCtxPopCurrent")

    def cuModuleLoadData(self, ref, image):
        assert image.startswith(b"\x7fELF")
        self._set(ref, 0x200 + len(self.calls))
        return self._ret("cuModuleLoadData")

    def cuModuleGetFunction(self, ref, module, name):
        self._set(ref, 0x300 + len(self.calls))
        self.symbol = name
        return self._ret("cuModuleGetFunction")

    def cuFuncSetAttribute(self, fn, attr, value):
        return self._ret("cuFuncSetAttribute")

    def cuLaunchKernelEx(self, config_ref, fn, args, extra):
        config = config_ref._obj
        attr = config.attrs[0]
        pointers = [args[i] for i in range(3)]
        self.launches.append({
            "grid": (config.gridDimX, config.gridDimY, config.gridDimZ),
            "block": (config.blockDimX, config.blockDimY, config.blockDimZ),
            "stream": config.hStream, "pdl": (attr.id, attr.value[0]), "smem": config.sharedMemBytes,
            "args": pointers, "ctx": self.current,
        })
        return self._ret("cuLaunchKernelEx")


def test_load_once_per_device_and_launch(monkeypatch):
    drv = FakeDriver()
    loader = Loader(drv=drv)
    b = blob()
    fn0 = loader.function(b, 0)
    assert loader.function(b, 0).value == fn0.value  # cached
    assert drv.calls.count("cuModuleLoadData") == 1 and drv.symbol == b"_Z6kernelv"
    loader.function(b, 1)  # another device: loaded there too
    assert drv.calls.count("cuModuleLoadData") == 2
    params = pack_params(LAYOUT, {"rows": 5})
    loader.launch(fn0, 0, (10,), (128, 2), 0xABC, params, [0, 8, 16], pdl=True, what="k")
    launch = drv.launches[-1]
    assert launch["grid"] == (10, 1, 1) and launch["block"] == (128, 2, 1)
    assert launch["stream"] == 0xABC and launch["ctx"] == 0x100  # device 0's primary context
    assert launch["pdl"] == (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1)
    base = ctypes.addressof(params)
    assert launch["args"] == [base, base + 8, base + 16]
    assert drv.current is None  # the caller's context is restored
    loader.launch(fn0, 0, (1,), (32,), 0, params, [0, 8, 16], pdl=False)
    assert drv.launches[-1]["pdl"][1] == 0 and drv.launches[-1]["stream"] is None


def test_driver_errors_become_loader_errors():
    loader = Loader(drv=FakeDriver(fail={"cuModuleLoadData": 209}))
    with pytest.raises(LoaderError, match="cuModuleLoadData") as info:
        loader.function(blob(), 0)
    assert info.value.code == 209
    loader = Loader(drv=FakeDriver(fail={"cuLaunchKernelEx": 1}))
    fn = loader.function(blob(), 0)
    with pytest.raises(LoaderError, match="grid=.*block="):
        loader.launch(fn, 0, (1,), (1,), 0, pack_params(LAYOUT, {}), [0, 8, 16], what="k")


def test_big_dynamic_shared_memory_is_opted_in_once():
    drv = FakeDriver()
    loader = Loader(drv=drv)
    fn = loader.function(blob(), 0)
    for _ in range(3):
        loader.launch(fn, 0, (1,), (1,), 0, pack_params(LAYOUT, {}), [0, 8, 16],
                      dynamic_smem=100 * 1024)
    assert drv.calls.count("cuFuncSetAttribute") == 1
    assert drv.launches[-1]["smem"] == 100 * 1024

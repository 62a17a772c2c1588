"""The cubin path of the ops (``flashinfer.artifacts.kernels``) on a machine without a GPU: a
synthetic release of rmsnorm kernels, the loader on a fake driver, and torch.cuda's device
queries stubbed. What it checks is the bookkeeping above the driver: which file a call loads,
what is cached, and that nothing but verified bytes reaches ``cuModuleLoadData``."""

from __future__ import annotations

import os

import pytest
import torch
from artifacthelpers import make_release, pin
from test_loader import FakeDriver

from flashinfer.artifacts import OfflineError, clear_caches, kernels, loader
from flashinfer.artifacts.manifest import (
    FileEntry,
    KernelInfo,
    Manifest,
    ParamField,
    ParamLayout,
    manifest_path,
    sha256_hex,
)

_FIELDS = [("input", "ptr"), ("input_strides.outer", "i64"), ("input_strides.inner", "i64"),
           ("out", "ptr"), ("out_strides.outer", "i64"), ("out_strides.inner", "i64"),
           ("residual", "ptr"), ("residual_strides.outer", "i64"),
           ("residual_strides.inner", "i64"), ("weight", "ptr"), ("rows", "i64"),
           ("heads", "i64"), ("hidden", "i32"), ("group", "i32"), ("inv_hidden", "f32"),
           ("eps", "f32"), ("weight_offset", "f32")]


def _layout() -> ParamLayout:
    fields, offset = [], 0
    for name, kind in _FIELDS:
        width = 4 if kind in ("i32", "f32") else 8
        offset = (offset + width - 1) // width * width
        fields.append(ParamField(name, kind, offset))
        offset += width
    size = (offset + 7) // 8 * 8
    # The real kernel takes one struct; three spans here because FakeDriver records three
    # argument pointers.
    return ParamLayout(size, 8, tuple(fields), ((0, 8), (8, 8), (16, size - 16)))


VARIANTS = [{"dtype": "float16", "access": 16, "vecs": 4},
            {"dtype": "bfloat16", "access": 16, "vecs": 4}]


@pytest.fixture
def rmsnorm_release(tmp_path, monkeypatch):
    """A pinned release with two rmsnorm kernels for 9.0a (one file each), served from a
    directory repository; a fake driver; a "device 0" of compute capability 9.0."""
    repo = tmp_path / "repo"
    make_release(repo, "7.7.7", {})  # index and layout; the manifest is replaced below
    entries = []
    for v in VARIANTS:
        name = f"rmsnorm_{v['dtype']}_a{v['access']}_v{v['vecs']}"
        data = b"\x7fELF fake cubin of " + name.encode()
        kernel = KernelInfo(name, "rmsnorm", f"_Z{name}", "norm_rows", v, _layout())
        entry = FileEntry(f"sm_90a/rmsnorm/{name}.cubin", sha256_hex(data), len(data), "9.0a",
                          kernel)
        (repo / entry.object_path).parent.mkdir(parents=True, exist_ok=True)
        (repo / entry.object_path).write_bytes(data)
        entries.append(entry)
    manifest = Manifest.build("7.7.7", entries, "2026-01-01T00:00:00Z")
    (repo / manifest_path("7.7.7")).write_bytes(manifest.to_bytes())
    from flashinfer.artifacts import Release

    pin(monkeypatch, Release("7.7.7", sha256_hex(manifest.to_bytes())))
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(repo))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(kernels, "_stream", lambda device: 0)
    drv = FakeDriver()
    monkeypatch.setattr(loader, "driver", lambda: drv)  # what every Loader() binds to
    clear_caches()
    yield drv
    clear_caches()


def rmsnorm(dtype: torch.dtype, hidden: int) -> None:
    x = torch.randn(3, hidden, dtype=dtype)
    kernels.rmsnorm(torch.empty_like(x), x, torch.ones(hidden, dtype=dtype), 1e-6, 0.0, False)


def test_a_call_loads_the_file_of_its_own_variant(rmsnorm_release):
    rmsnorm(torch.float16, 128)
    rmsnorm(torch.bfloat16, 768)
    first, second = kernels.loaded()
    assert first.entry.kernel.variant["dtype"] == "float16"
    assert second.entry.kernel.variant["dtype"] == "bfloat16"
    assert len(rmsnorm_release.launches) == 2
    rmsnorm(torch.bfloat16, 768)
    assert rmsnorm_release.calls.count("cuModuleLoadData") == 2  # cached per variant


def test_a_tampered_stored_cubin_is_never_loaded_after_a_reset(rmsnorm_release, store_dir,
                                                              monkeypatch):
    """The CPU twin of test_cubin_backend's GPU test. That test, before, tampered with the file
    of the *first* rmsnorm kernel the process had loaded, which earlier tests had made a
    float16 one, and then expected the bfloat16 call to fail: it loaded its own, intact file.
    Here earlier calls load other variants too; :func:`kernels.loaded` after
    :func:`clear_caches` names the file the call really uses."""
    rmsnorm(torch.float16, 128)  # what an earlier test leaves behind
    rmsnorm(torch.bfloat16, 768)
    assert kernels.loaded()[0].entry.kernel.variant["dtype"] == "float16"  # not the one used

    clear_caches()
    rmsnorm(torch.bfloat16, 768)
    (used,) = kernels.loaded()
    obj = store_dir / used.entry.object_path
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    loads = rmsnorm_release.calls.count("cuModuleLoadData")
    rmsnorm(torch.bfloat16, 768)  # loaded already (from verified bytes): the driver's copy
    clear_caches()
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")
    # A directory repository is read even offline (no download): offer a network one only.
    local = os.environ["FLASHINFER_CUBINS_REPOSITORY"]
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", "http://127.0.0.1:9/never")
    with pytest.raises(OfflineError, match=used.entry.path):
        rmsnorm(torch.bfloat16, 768)
    assert not obj.exists()  # the copy that does not verify was deleted
    assert rmsnorm_release.calls.count("cuModuleLoadData") == loads
    monkeypatch.delenv("FLASHINFER_NO_DOWNLOAD")
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", local)
    rmsnorm(torch.bfloat16, 768)  # downloaded again, verified, loaded
    assert obj.exists() and rmsnorm_release.calls.count("cuModuleLoadData") == loads + 1


def test_clear_caches_forgets_manifests_kernels_and_modules(rmsnorm_release):
    from flashinfer.artifacts import resolve

    rmsnorm(torch.bfloat16, 768)
    before = loader.loader()
    assert kernels.loaded() and resolve._MANIFESTS
    clear_caches()
    assert not kernels.loaded() and not resolve._MANIFESTS and loader.loader() is not before

"""``backend="cubin"``: norm and activation kernels served from verified kernel binaries through
the CUDA driver, compared with their JIT twins (bit for bit: the same instantiation of the same
header, compiled with the same flags).

On a GPU the release comes from the environment when one is provided (an installed
flashinfer-cubin, or FLASHINFER_CUBIN_MANIFEST_SHA256 + FLASHINFER_CUBINS_REPOSITORY: what
tools/gpu_check_artifacts.sh sets up); otherwise the test builds one for the visible GPU with
tools/cubin_build.py (needs nvcc) and pins it for the session.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import flashinfer
from flashinfer.artifacts import resolve

ROOT = Path(__file__).resolve().parent.parent
HAS_GPU = torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------
# CPU: argument checks come before anything is loaded


@pytest.mark.parametrize("call", [
    lambda x, w: flashinfer.rmsnorm(x, w, backend="tensorrt"),
    lambda x, w: flashinfer.gemma_rmsnorm(x, w, backend=None),
    lambda x, w: flashinfer.fused_add_rmsnorm(x, x.clone(), w, backend="CUBIN"),
    lambda x, w: flashinfer.silu_and_mul(x, backend="jit"),
])
def test_unknown_backend_is_a_value_error(call):
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="backend must be 'auto'"):
        call(x, torch.ones(64, dtype=torch.bfloat16))


@pytest.mark.parametrize("call", [
    lambda x, w: flashinfer.rmsnorm(x, w, backend="cubin"),
    lambda x, w: flashinfer.fused_add_rmsnorm(x, x.clone(), w, backend="cubin"),
    lambda x, w: flashinfer.gelu_and_mul(x, backend="cubin"),
])
def test_cubin_backend_checks_arguments_like_the_jit(call):
    x = torch.randn(2, 64, dtype=torch.bfloat16)  # on the CPU
    with pytest.raises(ValueError, match="CUDA"):
        call(x, torch.ones(64, dtype=torch.bfloat16))


def test_backend_is_keyword_only():
    x = torch.randn(2, 64, dtype=torch.float16)
    with pytest.raises(TypeError):
        flashinfer.silu_and_mul(x, None, None, "cubin")


# ---------------------------------------------------------------------------------------------
# GPU


@pytest.fixture(scope="module")
def cubin_release(tmp_path_factory):
    """A pinned release with kernels for the visible GPU (see the module docstring)."""
    mp = pytest.MonkeyPatch()
    try:
        release = resolve.pinned_release()
        provided = resolve.installed_cubin_wheel() is not None or bool(
            os.environ.get("FLASHINFER_CUBINS_REPOSITORY"))
    except Exception:
        provided = False
    if not provided:
        sys.path.insert(0, str(ROOT / "tools"))
        import cubin_build

        from flashinfer.jit.archs import arch_for_capability

        arch = str(arch_for_capability(*torch.cuda.get_device_capability()))
        tmp = tmp_path_factory.mktemp("cubins")
        manifest, sha = cubin_build.build("0.0.0+test", [arch], tmp / "repo",
                                          jobs=os.cpu_count() or 2)
        release = resolve.Release(manifest.release, sha)
        fake = SimpleNamespace(RELEASE_VERSION=release.version, MANIFEST_SHA256=sha, REPOSITORIES=())
        mp.setattr(resolve, "_build_pin", lambda: fake)
        mp.setattr(resolve, "installed_cubin_wheel", lambda: None)
        mp.setenv("FLASHINFER_CUBINS_REPOSITORY", str(tmp / "repo"))
        mp.setenv("FLASHINFER_CUBIN_DIR", str(tmp / "store"))
        mp.delenv("FLASHINFER_CUBIN_MANIFEST_SHA256", raising=False)
        resolve.clear_manifest_cache()
    yield SimpleNamespace(release=release, built=not provided)
    mp.undo()
    resolve.clear_manifest_cache()


def both(fn, *tensors):
    """Run ``fn(backend, *clones)`` for the JIT and the cubin backends; return both clone sets."""
    jit = [t.clone() for t in tensors]
    cub = [t.clone() for t in tensors]
    out_jit = fn("auto", *jit)
    out_cub = fn("cubin", *cub)
    torch.cuda.synchronize()
    return (out_jit, jit), (out_cub, cub)


def assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a, b), f"max |diff| {(a.float() - b.float()).abs().max().item()}"
    elif isinstance(a, (list, tuple)):
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


NORM_SHAPES = [(1, 128), (7, 4096), (33, 8192), (3, 4095), (2, 40960), (2, 70000), (5, 8, 128),
               (4, 32, 100)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", NORM_SHAPES)
@pytest.mark.parametrize("op", ["rmsnorm", "gemma_rmsnorm"])
def test_rmsnorm_cubin_equals_jit(cubin_release, op, shape, dtype):
    x = torch.randn(shape, dtype=dtype, device="cuda")
    w = torch.randn(shape[-1], dtype=dtype, device="cuda")
    fn = getattr(flashinfer, op)
    (a, _), (b, _) = both(lambda backend, x, w: fn(x, w, 1e-5, backend=backend), x, w)
    assert_same(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("enable_pdl", [True, False])
def test_rmsnorm_strided_rows_out_and_pdl(cubin_release, enable_pdl):
    wide = torch.randn(9, 6000, dtype=torch.bfloat16, device="cuda")
    x = wide[:, :4096]
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")

    def run(backend, x, w):
        out = torch.full((9, 4096), float("nan"), dtype=x.dtype, device="cuda")
        r = flashinfer.rmsnorm(x, w, out=out, enable_pdl=enable_pdl, backend=backend)
        assert r is out
        return out

    (a, _), (b, _) = both(run, x, w)
    assert_same(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [128, 4096, 5000, 40000])
@pytest.mark.parametrize("op", ["fused_add_rmsnorm", "gemma_fused_add_rmsnorm"])
def test_fused_add_rmsnorm_cubin_equals_jit(cubin_release, op, hidden, dtype):
    x = torch.randn(6, hidden, dtype=dtype, device="cuda")
    r = torch.randn(6, hidden, dtype=dtype, device="cuda")
    w = torch.randn(hidden, dtype=dtype, device="cuda")
    fn = getattr(flashinfer, op)
    (_, jit), (_, cub) = both(lambda backend, x, r, w: fn(x, r, w, backend=backend), x, r, w)
    assert_same(jit, cub)  # both input and residual, in place


ACT_CASES = [((1, 256), 0), ((17, 2 * 11008), 0), ((3, 200), 0), ((5, 2 * 64), 1), ((2, 3, 512), 0)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape, shift", ACT_CASES)
@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"])
def test_act_and_mul_cubin_equals_jit(cubin_release, op, shape, shift, dtype):
    # shift > 0: a view whose start is not 16-byte aligned (the one-element path)
    base = torch.randn(*shape[:-1], shape[-1] + 8, dtype=dtype, device="cuda")
    x = base[..., shift:shift + shape[-1]]
    fn = getattr(flashinfer, op)
    (a, _), (b, _) = both(lambda backend, x: fn(x, backend=backend), x)
    assert_same(a, b)


@pytest.mark.gpu
def test_cubin_launch_on_a_side_stream_and_in_a_cuda_graph(cubin_release):
    x = torch.randn(64, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    expect = flashinfer.rmsnorm(x, w)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        got = flashinfer.rmsnorm(x, w, backend="cubin")
    s.synchronize()
    assert_same(expect, got)
    out = torch.empty_like(x)
    flashinfer.rmsnorm(x, w, out=out, backend="cubin")  # load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashinfer.rmsnorm(x, w, out=out, backend="cubin")
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert_same(expect, out)


@pytest.mark.gpu
def test_functions_are_loaded_once(cubin_release):
    from flashinfer.artifacts import kernels

    x = torch.randn(4, 1024, dtype=torch.float16, device="cuda")
    flashinfer.silu_and_mul(x, backend="cubin")
    n = len(kernels.loaded())
    for _ in range(3):
        flashinfer.silu_and_mul(x, backend="cubin")
    assert len(kernels.loaded()) == n


@pytest.mark.gpu
def test_a_stored_cubin_that_does_not_verify_is_never_loaded(cubin_release, monkeypatch):
    if not cubin_release.built:
        pytest.skip("needs the test's own release (the provided one may be a read-only wheel)")
    from flashinfer import knobs
    from flashinfer.artifacts import OfflineError, clear_caches, kernels

    x = torch.randn(3, 768, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(768, dtype=torch.bfloat16, device="cuda")
    # Start from nothing loaded, so the one rmsnorm kernel loaded below is the one this call
    # uses (earlier tests loaded other variants, whose files are other files).
    clear_caches()
    flashinfer.rmsnorm(x, w, backend="cubin")
    (used,) = [k for k in kernels.loaded() if k.entry.kernel.family == "rmsnorm"]
    assert used.entry.kernel.variant["dtype"] == "bfloat16"
    obj = Path(knobs.artifacts.cubin_dir) / used.entry.object_path
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    flashinfer.rmsnorm(x, w, backend="cubin")  # loaded already: the driver's copy is used
    clear_caches()  # as a new process: the file is read (and verified) again
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")
    # A directory repository is read even offline (no download): offer a network one only.
    local = knobs.artifacts.repository
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", "http://127.0.0.1:9/never")
    with pytest.raises(OfflineError):  # the tampered copy was refused and deleted
        flashinfer.rmsnorm(x, w, backend="cubin")
    assert not obj.exists()
    monkeypatch.delenv("FLASHINFER_NO_DOWNLOAD")
    if local is None:
        monkeypatch.delenv("FLASHINFER_CUBINS_REPOSITORY")
    else:
        monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", local)
    clear_caches()
    flashinfer.rmsnorm(x, w, backend="cubin")  # downloaded again from the repository
    assert obj.exists()

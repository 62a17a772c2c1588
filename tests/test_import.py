"""`import flashinfer` must be cheap: no torch, no TVM-FFI, no files touched."""

import subprocess
import sys

import flashinfer

_PROBE = """
import sys, time
t = time.perf_counter()
import flashinfer
dt = time.perf_counter() - t
heavy = sorted(m for m in ("torch", "tvm_ffi", "numpy") if m in sys.modules)
print(dt, ",".join(heavy))
"""


def test_import_is_fast_and_light(tmp_path):
    times = []
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True, text=True, check=True,
            env={"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"), "PATH": "/usr/bin:/bin",
                 "PYTHONPATH": ":".join(sys.path)},
        )
        seconds, heavy = out.stdout.split()[0], out.stdout.split()[1:]
        times.append(float(seconds))
        assert heavy == [], f"import flashinfer pulled in {heavy}"
    assert min(times) < 0.5, times
    assert not (tmp_path / "ws").exists()  # nothing touched the filesystem


def test_names_resolve_lazily_from_both_paths():
    assert flashinfer.rmsnorm is flashinfer.norm.rmsnorm
    assert flashinfer.packbits is flashinfer.quantization.packbits
    assert flashinfer.apply_rope_pos_ids is flashinfer.rope.apply_rope_pos_ids
    assert flashinfer.silu_and_mul is flashinfer.activation.silu_and_mul
    assert callable(flashinfer.scale)
    assert "rmsnorm" in dir(flashinfer)


def test_version():
    assert flashinfer.__version__ and flashinfer.__git_version__ == flashinfer.__git_commit__


def test_tvm_ffi_is_imported_with_flashinfer_once_torch_is(tmp_path):
    # The first op call must not pay TVM-FFI's import (20-60 ms) where torch is already loaded.
    probe = ("import sys, torch\nassert 'tvm_ffi' not in sys.modules\nimport flashinfer\n"
             "print('tvm_ffi' in sys.modules)")
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True,
        env={"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"), "PATH": "/usr/bin:/bin",
             "PYTHONPATH": ":".join(sys.path)},
    )
    assert out.stdout.split() == ["True"], out.stdout + out.stderr
    assert not (tmp_path / "ws").exists()

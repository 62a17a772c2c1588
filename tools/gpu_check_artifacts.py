"""GPU check of the cubin path (run by tools/gpu_check_artifacts.sh on the GPU machine).

With the flashinfer-cubin wheel installed and FLASHINFER_NO_DOWNLOAD=1 (no socket may open: they
are blocked here), every covered op runs through ``backend="cubin"`` and is compared with its JIT
twin (expected: bit-identical), under a CUDA graph too; the kernel times of both backends and the
host time per call are measured; a tampered stored cubin must be refused. One JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path


def _no_network(*args, **kwargs):
    raise AssertionError("a socket was opened in offline mode")


socket.socket.connect = _no_network  # FLASHINFER_NO_DOWNLOAD=1 must never get this far
socket.create_connection = _no_network

import torch  # noqa: E402

import flashinfer  # noqa: E402
from flashinfer.artifacts import kernels, resolve  # noqa: E402
from flashinfer.testing import bench_gpu_time_with_cuda_event  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def dev(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=dtype, device="cuda")


def compare(name, fn, *tensors):
    """fn(backend, *tensors) -> tensors to compare; run on clones for each backend."""
    jit_in = [t.clone() for t in tensors]
    cub_in = [t.clone() for t in tensors]
    a = fn("auto", *jit_in)
    b = fn("cubin", *cub_in)
    torch.cuda.synchronize()
    a = a if isinstance(a, (list, tuple)) else [a]
    b = b if isinstance(b, (list, tuple)) else [b]
    diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
    equal = all(torch.equal(x, y) for x, y in zip(a, b))
    return {"case": name, "equal": equal, "max_abs_diff": diff}


def correctness() -> list[dict]:
    out = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for shape in [(1, 128), (7, 4096), (33, 8192), (3, 4095), (2, 40960), (2, 70000),
                      (4, 32, 128), (5, 8, 100)]:
            for op in ("rmsnorm", "gemma_rmsnorm"):
                f = getattr(flashinfer, op)
                out.append(compare(f"{op} {str(dtype)[6:]} {shape}",
                                   lambda b, x, w, f=f: f(x, w, 1e-6, backend=b),
                                   dev(*shape, dtype=dtype), dev(shape[-1], dtype=dtype)))
    wide = dev(9, 6000)
    for pdl in (True, False):
        out.append(compare(f"rmsnorm strided rows, pdl={pdl}",
                           lambda b, x, w, pdl=pdl: flashinfer.rmsnorm(x, w, enable_pdl=pdl, backend=b),
                           wide[:, :4096], dev(4096)))
    for dtype in (torch.float16, torch.bfloat16):
        for hidden in (128, 4096, 5000, 40000):
            for op in ("fused_add_rmsnorm", "gemma_fused_add_rmsnorm"):
                f = getattr(flashinfer, op)

                def run(b, x, r, w, f=f):
                    f(x, r, w, backend=b)
                    return [x, r]

                out.append(compare(f"{op} {str(dtype)[6:]} hidden={hidden}", run,
                                   dev(6, hidden, dtype=dtype), dev(6, hidden, dtype=dtype),
                                   dev(hidden, dtype=dtype)))
        for shape, shift in [((1, 256), 0), ((17, 22016), 0), ((3, 200), 0), ((5, 128), 1),
                             ((2, 3, 512), 0)]:
            for op in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
                f = getattr(flashinfer, op)
                base = dev(*shape[:-1], shape[-1] + 8, dtype=dtype)
                out.append(compare(f"{op} {str(dtype)[6:]} {shape} shift={shift}",
                                   lambda b, x, f=f: f(x, backend=b),
                                   base[..., shift:shift + shape[-1]]))
    return out


def graph_and_stream() -> dict:
    x, w = dev(64, 4096), dev(4096)
    expect = flashinfer.rmsnorm(x, w)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        side = flashinfer.rmsnorm(x, w, backend="cubin")
    s.synchronize()
    out = torch.empty_like(x)
    flashinfer.rmsnorm(x, w, out=out, backend="cubin")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        flashinfer.rmsnorm(x, w, out=out, backend="cubin")
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    return {"side_stream_equal": torch.equal(expect, side), "graph_replay_equal": torch.equal(expect, out)}


def timing() -> list[dict]:
    rows = []
    cases = [
        ("rmsnorm bf16 16384x8192", lambda b, x=dev(16384, 8192), w=dev(8192): flashinfer.rmsnorm(x, w, backend=b)),
        ("fused_add_rmsnorm bf16 16384x8192",
         lambda b, x=dev(16384, 8192), r=dev(16384, 8192), w=dev(8192): flashinfer.fused_add_rmsnorm(x, r, w, backend=b)),
        ("silu_and_mul bf16 16384x(2*14336)", lambda b, x=dev(16384, 2 * 14336): flashinfer.silu_and_mul(x, backend=b)),
    ]
    for name, fn in cases:
        row = {"case": name}
        for b in ("auto", "cubin"):
            t = bench_gpu_time_with_cuda_event(lambda fn=fn, b=b: fn(b), repeat_iters=50)
            row[f"{b}_median_us"] = round(statistics.median(t) * 1000, 2)
        rows.append(row)
    # Host cost per call on a tiny input (launch path: TVM-FFI vs ctypes + cuLaunchKernelEx).
    x, w = dev(1, 128), dev(128)
    for b in ("auto", "cubin"):
        for _ in range(100):
            flashinfer.rmsnorm(x, w, backend=b)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(2000):
            flashinfer.rmsnorm(x, w, backend=b)
        torch.cuda.synchronize()
        rows.append({"case": f"host us per call rmsnorm 1x128 ({b})",
                     "us": round((time.perf_counter() - t) / 2000 * 1e6, 2)})
    return rows


def tamper_check(tmp: Path) -> dict:
    """A stored copy that does not verify is refused (and deleted), never loaded."""
    from flashinfer import knobs
    from flashinfer.artifacts import OfflineError, get_cubin, loader
    from flashinfer.artifacts.store import Store

    release = resolve.pinned_release()
    manifest = resolve.load_manifest(release)
    entry = next(f for f in manifest.files if f.kernel is not None)
    store = Store(tmp)
    obj = store.object_file(entry)
    obj.parent.mkdir(parents=True, exist_ok=True)
    good = get_cubin(entry.path).data
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    obj.write_bytes(bytes(bad))
    saved = resolve.installed_cubin_wheel
    resolve.installed_cubin_wheel = lambda: None  # as if the wheel were absent
    try:
        with knobs.artifacts.scope():
            knobs.artifacts.cubin_dir = tmp
            try:
                blob = get_cubin(entry.path)
                return {"refused": False, "loaded": repr(blob)}
            except OfflineError as e:
                refused = True
                message = str(e)[:200]
        try:
            loader.loader().function(bytes(bad), 0)
            raw_refused = False
        except TypeError:
            raw_refused = True
        return {"refused": refused, "deleted": not obj.exists(), "raw_bytes_refused": raw_refused,
                "message": message}
    finally:
        resolve.installed_cubin_wheel = saved


def _commit() -> str:
    """The commit the carried wheels were built from (tools/prepare_gpu_dist.sh writes it); the
    device's copy of the tree may carry a stale git HEAD."""
    stamp = ROOT / ".gpu" / "wheels_set" / "COMMIT"
    if stamp.is_file():
        return stamp.read_text().strip()
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tmp", type=Path, default=Path("/tmp/fi-art-tamper"))
    args = ap.parse_args()
    release = resolve.pinned_release()
    wheel = resolve.installed_cubin_wheel()
    doc: dict = {
        "device": torch.cuda.get_device_name(), "capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "torch": torch.__version__, "flashinfer": flashinfer.__version__,
        "commit": _commit(),
        "release": {"version": release.version, "manifest_sha256": release.manifest_sha256},
        "cubin_wheel": None if wheel is None else {"version": wheel.version, "root": str(wheel.root)},
    }
    ok = True
    for key, fn in (("correctness", correctness), ("graph_and_stream", graph_and_stream),
                    ("timing", timing), ("tamper", lambda: tamper_check(args.tmp))):
        t = time.perf_counter()
        try:
            doc[key] = fn()
        except Exception:
            doc[key] = {"error": traceback.format_exc()}
            ok = False
        doc[f"{key}_s"] = round(time.perf_counter() - t, 2)
    doc["kernels_loaded"] = sorted({k.entry.path for k in kernels.loaded()})
    corr = doc.get("correctness")
    if isinstance(corr, list):
        doc["all_equal"] = all(c["equal"] for c in corr)
        ok = ok and doc["all_equal"]
    g = doc.get("graph_and_stream")
    ok = ok and isinstance(g, dict) and all(g.values())
    tam = doc.get("tamper")
    ok = ok and isinstance(tam, dict) and tam.get("refused") and tam.get("raw_bytes_refused")
    doc["ok"] = bool(ok)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("device", "release", "all_equal", "ok") if k in doc}, indent=1))
    if isinstance(doc.get("timing"), list):
        for row in doc["timing"]:
            print(row)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

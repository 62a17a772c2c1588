"""GPU check of the split wheels: the jit-cache wheel built on a CPU machine, installed with the
core wheel, runs its kernels correctly with nvcc disabled, and the first call of a covered op
costs no compile. Run by tools/gpu_check_wheels.sh (which installs the wheels and disables
nvcc); writes one JSON file.

    python tools/gpu_check_wheels.py --commit SHA --out wheels.json [--junit junit.xml]

For each covered op: correctness against a float32 torch reference (in this process), and the
wall time of its first call in fresh processes (``import torch, flashinfer`` and CUDA
initialized first, as benchmarks/bench_jit.py measures the JIT's first call), median of 5, and
the same with flashinfer imported before torch (then TVM-FFI's import falls on the first call).
Also recorded: ``import flashinfer`` with torch loaded (where TVM-FFI's import lands),
``import tvm_ffi`` alone and its slowest modules (``-X importtime``), whether torch provides
the DLPack C exchange API natively, and whether the lookup matched modules by config key.
Then the op's GPU test file, with the JIT disabled, so every test runs on the wheel's modules.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 50.0

# module -> (public op, setup, call, the test file of the module)
OPS = {
    "scale": ("scale", "x = torch.randn(128, 4096, dtype=torch.bfloat16, device='cuda')",
              "flashinfer.scale(x, 2.0)", "tests/test_tutorial.py"),
    "norm": ("rmsnorm", "x = torch.randn(128, 4096, dtype=torch.bfloat16, device='cuda')\n"
             "w = torch.randn(4096, dtype=torch.bfloat16, device='cuda')",
             "flashinfer.rmsnorm(x, w)", "tests/test_norm.py"),
    "activation": ("silu_and_mul", "x = torch.randn(128, 8192, dtype=torch.bfloat16, "
                   "device='cuda')", "flashinfer.silu_and_mul(x)", "tests/test_activation.py"),
    "rope": ("apply_rope_pos_ids",
             "q = torch.randn(128, 32, 128, dtype=torch.bfloat16, device='cuda')\n"
             "k = torch.randn(128, 8, 128, dtype=torch.bfloat16, device='cuda')\n"
             "p = torch.arange(128, dtype=torch.int32, device='cuda')",
             "flashinfer.apply_rope_pos_ids(q, k, p)", "tests/test_rope.py"),
    "quantization": ("packbits", "x = torch.rand(4099, device='cuda') > 0.5",
                     "flashinfer.packbits(x)", "tests/test_quantization.py"),
}

_FIRST_CALL = """
import json, time
{imports}
{setup}
torch.cuda.synchronize()
t = time.perf_counter()
{call}
torch.cuda.synchronize()
dt = time.perf_counter() - t
from flashinfer.jit import core
print("RESULT " + json.dumps({{"s": dt, "stats": dict(core.stats)}}))
"""


def first_call(module: str, imports: str, runs: int = 5) -> dict:
    _, setup, call, _ = OPS[module]
    code = _FIRST_CALL.format(imports=imports, setup=setup, call=call)
    seconds, stats = [], None
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd="/tmp")
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            return {"error": (proc.stdout + proc.stderr)[-3000:]}
        result = json.loads(line[7:])
        seconds.append(result["s"] * 1e3)
        stats = result["stats"]
    return {"median_ms": round(statistics.median(seconds), 2),
            "runs_ms": [round(s, 2) for s in seconds], "jit_stats": stats}


_TVM_FFI_IMPORT = """
import json, time, torch
torch.zeros(1, device='cuda'); torch.cuda.synchronize()
t = time.perf_counter()
import tvm_ffi
print("RESULT " + json.dumps({"s": time.perf_counter() - t, "stats": {}}))
"""


def native_dlpack_exchange_api() -> object:
    """Whether this torch has ``Tensor.__dlpack_c_exchange_api__`` before TVM-FFI is imported
    (without it, ``import tvm_ffi`` loads its torch DLPack addon, building it first into
    ~/.cache/tvm-ffi when it is not there)."""
    code = "import torch; print(hasattr(torch.Tensor, '__dlpack_c_exchange_api__'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/tmp")
    out = proc.stdout.strip().splitlines()
    return out[-1] == "True" if proc.returncode == 0 and out else (proc.stdout + proc.stderr)[-500:]


_FLASHINFER_IMPORT = _TVM_FFI_IMPORT.replace("import tvm_ffi", "import flashinfer")


def timed_import(code: str, runs: int) -> dict:
    """One import in fresh processes (torch imported and CUDA up first)."""
    seconds = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                              text=True, cwd="/tmp")
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            return {"error": (proc.stdout + proc.stderr)[-3000:]}
        seconds.append(json.loads(line[7:])["s"] * 1e3)
    return {"median_ms": round(statistics.median(seconds), 2),
            "runs_ms": [round(s, 2) for s in seconds]}


def tvm_ffi_importtime(top: int = 8) -> object:
    """The slowest modules of ``import tvm_ffi`` by self time (``python -X importtime``, torch
    imported and CUDA up first), in ms, or the error text."""
    code = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); import tvm_ffi"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                          text=True, cwd="/tmp")
    if proc.returncode != 0:
        return proc.stderr[-1000:]
    rows, inside = [], False
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3 or "self" in parts[0]:
            continue
        name = parts[2].strip()
        inside = inside or name.startswith("tvm_ffi")
        if inside:
            rows.append((int(parts[0].split(":")[1]) / 1e3, int(parts[1]) / 1e3, name))
    total = next((cum for _, cum, name in rows if name == "tvm_ffi"), None)
    slowest = sorted(rows, reverse=True)[:top]
    return {"total_ms": total, "slowest_self_ms": {n: round(s, 2) for s, _, n in slowest}}


def correctness(module: str) -> str:
    """'ok', or what differs, for the module's op against a float32 reference."""
    import numpy as np
    import torch

    import flashinfer

    torch.manual_seed(0)
    if module == "scale":
        x = torch.randn(37, 1000, dtype=torch.bfloat16, device="cuda")
        torch.testing.assert_close(flashinfer.scale(x, 2.0), x * 2, rtol=0, atol=0)
    elif module == "norm":
        x = torch.randn(33, 4096, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
        xf = x.float()
        ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        torch.testing.assert_close(flashinfer.rmsnorm(x, w).float(), ref, rtol=2e-2, atol=2e-2)
    elif module == "activation":
        x = torch.randn(17, 2 * 1536, dtype=torch.bfloat16, device="cuda")
        a, b = x.float().chunk(2, dim=-1)
        ref = torch.nn.functional.silu(a) * b
        torch.testing.assert_close(flashinfer.silu_and_mul(x).float(), ref, rtol=2e-2, atol=2e-2)
    elif module == "rope":
        q = torch.randn(19, 4, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(19, 2, 128, dtype=torch.bfloat16, device="cuda")
        pos = torch.arange(100, 119, dtype=torch.int32, device="cuda")
        inv = 1e4 ** (-torch.arange(0, 128, 2, device="cuda").float() / 128)
        ang = pos.float()[:, None, None] * inv
        cos, sin = ang.cos(), ang.sin()

        def ref(t):
            t1, t2 = t.float()[..., :64], t.float()[..., 64:]
            return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)

        q_out, k_out = flashinfer.apply_rope_pos_ids(q, k, pos)
        torch.testing.assert_close(q_out.float(), ref(q), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(k_out.float(), ref(k), rtol=2e-2, atol=2e-2)
    elif module == "quantization":
        x = torch.rand(4099, device="cuda") > 0.5
        ref = np.packbits(x.cpu().numpy())
        got = flashinfer.packbits(x).cpu().numpy()
        if not np.array_equal(got, ref):
            return f"packbits differs from numpy at {np.flatnonzero(got != ref)[:10]}"
    torch.cuda.synchronize()
    return "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", required=True)
    parser.add_argument("--junit", default=None)
    parser.add_argument("--test-timeout", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per first call")
    parser.add_argument("--pre-runs", type=int, default=None,
                        help="fresh processes for the variant with flashinfer imported before "
                        "torch (default: --runs)")
    parser.add_argument("-m", dest="marker", default=None,
                        help='pytest marker expression for the test files, e.g. "not large"')
    args = parser.parse_args()

    import torch
    import tvm_ffi  # noqa: F401  - so the version below is the one loaded

    import flashinfer
    import flashinfer_jit_cache as jc
    from flashinfer.jit import core, jit_cache

    manifest = jc.manifest()
    covered = [m["name"] for m in manifest["modules"] if m["name"] in OPS]
    report = {
        "what": "flashinfer-jit-cache built on a CPU machine, installed with flashinfer-python, "
                "nvcc disabled (FLASHINFER_NVCC fails, no CUDA_HOME, none on PATH, "
                "FLASHINFER_DISABLE_JIT=1)",
        "commit": args.commit,
        "device": {"name": torch.cuda.get_device_name(0),
                   "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                   "torch": torch.__version__, "cuda": torch.version.cuda},
        "python": sys.version.split()[0],
        "flashinfer": {"version": flashinfer.__version__, "file": flashinfer.__file__},
        "jit_cache": {k: manifest[k] for k in ("version", "cuda_version", "nvcc_version",
                                               "tvm_ffi_version", "arch_list", "git_commit")},
        "jit_cache_modules": len(manifest["modules"]),
        "jit_cache_status": jit_cache.describe(),
        "jit_cache_verify": jc.verify() or "ok",
        "tvm_ffi_installed": metadata.version("apache-tvm-ffi"),
        "env": {k: os.environ.get(k) for k in ("FLASHINFER_NVCC", "CUDA_HOME",
                                               "FLASHINFER_DISABLE_JIT",
                                               "FLASHINFER_CUDA_ARCH_LIST")},
        "target_first_call_ms": TARGET_MS,
        # with it, TVM-FFI skips (and so does not build or load) its torch DLPack addon; asked
        # of a fresh process, since importing tvm_ffi here may already have set it
        "torch_dlpack_c_exchange_api": native_dlpack_exchange_api(),
        "tvm_ffi_import": timed_import(_TVM_FFI_IMPORT, args.runs),
        "tvm_ffi_importtime": tvm_ffi_importtime(),
        # with torch loaded, import flashinfer imports TVM-FFI (flashinfer/__init__.py)
        "flashinfer_import_torch_loaded": timed_import(_FLASHINFER_IMPORT, args.runs),
        "jit_cache_sources_match": jit_cache.sources_match(),
        "ops": {},
    }
    for module in covered:
        op = OPS[module][0]
        entry: dict = {"op": op}
        try:
            entry["correctness"] = correctness(module)
        except Exception as e:  # noqa: BLE001 - record and go on to the next op
            entry["correctness"] = f"{type(e).__name__}: {e}"
        entry["first_call"] = first_call(module, "import torch, flashinfer", runs=args.runs)
        entry["first_call_flashinfer_before_torch"] = first_call(
            module, "import flashinfer, torch", runs=args.pre_runs or args.runs)
        median = entry["first_call"].get("median_ms")
        entry["meets_target"] = median is not None and median <= TARGET_MS
        report["ops"][op] = entry
        print(f"{op}: {entry['correctness']}, first call {median} ms "
              f"({entry['first_call_flashinfer_before_torch'].get('median_ms')} ms with "
              "flashinfer imported before torch)", flush=True)
    report["jit_stats_this_process"] = dict(core.stats)

    files = sorted({OPS[m][3] for m in covered if (ROOT / OPS[m][3]).is_file()})
    if files:
        cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider"]
        if args.marker:
            cmd += ["-m", args.marker]
        if args.junit:
            cmd.append(f"--junitxml={args.junit}")
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=args.test_timeout)
            tail = proc.stdout.strip().splitlines()[-1:] or [proc.stderr[-500:]]
            report["tests"] = {"files": files, "marker": args.marker, "exit": proc.returncode,
                               "summary": tail[0],
                               "seconds": round(time.monotonic() - start, 1)}
            print(proc.stdout[-6000:], flush=True)
        except subprocess.TimeoutExpired:
            report["tests"] = {"files": files, "exit": "timeout", "seconds": args.test_timeout}
    mark = Path(os.environ.get("FLASHINFER_NVCC", "/nonexistent")).parent / "was-run"
    report["nvcc_was_run"] = mark.exists()
    report["ok"] = (
        not report["nvcc_was_run"]
        and all(e["correctness"] == "ok" and e["meets_target"] for e in report["ops"].values())
        and report.get("tests", {}).get("exit") == 0
    )
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("ok", "nvcc_was_run")}), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

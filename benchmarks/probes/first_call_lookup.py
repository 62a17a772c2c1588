"""CPU part of a covered op's first call with flashinfer-jit-cache installed, phase by phase, in
fresh processes: ``import tvm_ffi`` (TVM-FFI's own), importing the op's modules, and the
jit-cache lookup plus ``tvm_ffi.load_module``; and the whole, from ``import flashinfer`` to the
loaded module with TVM-FFI not yet imported. No GPU needed: it stops at the loaded module.

Each SITE is a directory the set was installed into (``pip install --no-deps --target SITE
flashinfer_python-*.whl flashinfer_jit_cache-*.whl``); several are measured interleaved, e.g.
before and after a change, so machine load hits them alike.

    FLASHINFER_CUDA_ARCH_LIST=9.0a python benchmarks/probes/first_call_lookup.py \\
        --site before=/tmp/a --site after=/tmp/b --module scale --runs 15 --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: module -> (the op's submodule of flashinfer, its cached getter)
GETTERS = {"scale": ("tutorial", "get_scale_module"), "norm": ("norm", "get_norm_module"),
           "activation": ("activation", "get_activation_module"),
           "rope": ("rope", "get_rope_module"),
           "quantization": ("quantization", "get_quantization_module")}

_PHASES = """
import json, time
import torch
t = time.perf_counter(); import tvm_ffi; tvm = time.perf_counter() - t
t0 = time.perf_counter()
import flashinfer, flashinfer.{sub}
from flashinfer.jit import core
t1 = time.perf_counter()
flashinfer.{sub}.{getter}()
t2 = time.perf_counter()
print("RESULT " + json.dumps({{"tvm_ffi_import_ms": tvm * 1e3, "op_imports_ms": (t1 - t0) * 1e3,
      "lookup_and_load_ms": (t2 - t1) * 1e3, "ours_ms": (t2 - t0) * 1e3,
      "stats": dict(core.stats)}}))
"""
_WHOLE = """
import json, time
import torch
t0 = time.perf_counter()
import flashinfer, flashinfer.{sub}
from flashinfer.jit import core
flashinfer.{sub}.{getter}()
t2 = time.perf_counter()
print("RESULT " + json.dumps({{"total_ms": (t2 - t0) * 1e3, "stats": dict(core.stats)}}))
"""


def _run(code: str, site: str, workspace: str) -> dict:
    env = dict(os.environ, PYTHONPATH=site, FLASHINFER_WORKSPACE_BASE=workspace,
               FLASHINFER_NVCC="/bin/false")  # a module that is not in the wheel fails loudly
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tempfile.gettempdir(), env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the child failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    result = json.loads(line[len("RESULT "):])
    if result.pop("stats") != {"loaded_aot": 1}:
        raise RuntimeError(f"the module did not come from the jit-cache wheel in {site}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", action="append", required=True, help="NAME=DIR")
    parser.add_argument("--module", default="scale", choices=sorted(GETTERS))
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sites = dict(s.split("=", 1) for s in args.site)
    sub, getter = GETTERS[args.module]
    rows: dict[str, list[dict]] = {name: [] for name in sites}
    with tempfile.TemporaryDirectory() as workspace:  # an empty JIT cache
        for _ in range(args.runs):
            for name, site in sites.items():
                row = _run(_PHASES.format(sub=sub, getter=getter), site, workspace)
                row.update(_run(_WHOLE.format(sub=sub, getter=getter), site, workspace))
                rows[name].append(row)
    summary = {
        name: {key: {"median": round(statistics.median(r[key] for r in rs), 2),
                     "min": round(min(r[key] for r in rs), 2)} for key in rs[0]}
        for name, rs in rows.items()
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import schema  # benchmarks/schema.py: no torch needed

        device = {"name": "cpu", "machine": platform.machine(), "cpus": os.cpu_count(),
                  "python": platform.python_version()}
        schema.write(args.out, schema.record(
            "probe", "first-call-lookup", device,
            note="first call of a covered op from an installed jit-cache, CPU part, fresh "
                 "processes, interleaved",
            module=args.module, runs=args.runs, sites=sorted(sites), summary=summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

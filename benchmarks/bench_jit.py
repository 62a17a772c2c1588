"""Cold-start costs: `import flashinfer`, and the first call of an op with an empty JIT cache
(compile + load) and with a warm disk cache (load only). Each in a fresh process."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile

_IMPORT = "import time; t=time.perf_counter(); import flashinfer; print(time.perf_counter()-t)"
_FIRST_CALL = """
import time, torch, flashinfer
x = torch.randn(128, 4096, dtype=torch.bfloat16, device="cuda")
w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
torch.cuda.synchronize()
t = time.perf_counter()
flashinfer.{op}(x, w) if "{op}" == "rmsnorm" else flashinfer.{op}(x)
torch.cuda.synchronize()
print(time.perf_counter() - t)
"""


_HOST = """
import time, torch, flashinfer
x = torch.randn(1, 128, dtype=torch.bfloat16, device="cuda")
w = torch.randn(128, dtype=torch.bfloat16, device="cuda")
def per_call_us(fn, n=3000):
    for _ in range(100): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
print(per_call_us(lambda: flashinfer.rmsnorm(x, w)), per_call_us(lambda: torch.mul(x, 2.0)))
"""


def _seconds(code: str, env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def measure() -> dict:
    env = dict(os.environ)
    imports = [_seconds(_IMPORT, env) for _ in range(5)]
    result = {"import_flashinfer_s": round(statistics.median(imports), 4)}
    for op, module in (("rmsnorm", "norm"), ("silu_and_mul", "activation")):
        env["FLASHINFER_WORKSPACE_BASE"] = tempfile.mkdtemp(prefix="fi-jit-bench-")
        cold = _seconds(_FIRST_CALL.format(op=op), env)
        warm = _seconds(_FIRST_CALL.format(op=op), env)
        result[f"first_call_{module}_cold_compile_s"] = round(cold, 2)
        result[f"first_call_{module}_warm_disk_cache_s"] = round(warm, 3)
    out = subprocess.run([sys.executable, "-c", _HOST], capture_output=True, text=True, env=env)
    if out.returncode == 0:
        ours, torch_mul = map(float, out.stdout.split()[-2:])
        result["host_us_per_call_rmsnorm_1x128"] = round(ours, 2)
        result["host_us_per_call_torch_mul_1x128"] = round(torch_mul, 2)
    result["cores"] = os.cpu_count()
    return result


if __name__ == "__main__":
    print(measure())

"""Cascade merges: compile kernel variants side by side, check each against a float64 reference
on random data, time each twice, and write one JSON. Checks and timings need a GPU; the build
runs anywhere nvcc does.

    python benchmarks/tuning/tune_cascade.py OUT_DIR       # GPU: -> OUT_DIR/tune-cascade.json, table last
    python benchmarks/tuning/tune_cascade.py --build-only  # compile every variant (CPU machine: sm_90a)

Variants are the FLASHINFER_CASCADE_* macros of include/flashinfer/cascade_kernels.cuh. (The
e1692f3 kernels were kept here once as a "baseline" variant and measured against today's in one
run: results/2026-11-24-h100-946eff8-tune-cascade.json; removed since.)

Method (the device README's METHOD.md). Inputs are random (never zeros), with empty states
(s = -inf) whose v holds inf/NaN. Checks: every output is poisoned with NaN first, then compared
with a float64 reference (relative-norm error and elementwise tolerance; empty rows must give
exactly v = 0, s = -inf). Timing: cases of >= 64 MB are a CUDA graph of one call, replayed
between two CUDA events with L2 flushed before each replay (no host time inside the timed
region); smaller ones are graphs of 10 back-to-back calls (what a decode step sees, PDL on),
per call. Median of many runs; each (variant, case) is timed in two passes over all variants,
so drift shows as a spread. For the headline, the script also times the Python call the way
benchmarks/harness.py does (CUDA events around flashinfer.merge_state, host work included) and
reads the kernel's own duration from the profiler (CUPTI), so a host gap in the harness's
number can be told from kernel time.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # harness
sys.path.insert(0, str(HERE.parents[1] / "tests"))  # cascade_ref: the float64 reference

import cascade_ref  # noqa: E402
import torch  # noqa: E402
from cascade_ref import poison_empty, ref_merge  # noqa: E402

import flashinfer  # noqa: E402
import flashinfer.cascade as cascade_api  # noqa: E402
from flashinfer import aot, knobs  # noqa: E402
from flashinfer.jit.cascade import gen_cascade_module  # noqa: E402
from flashinfer.jit.core import JitSpec, get_module  # noqa: E402

SMALL_BYTES = 64 << 20  # as benchmarks/harness.py: below this, graphs of 10 calls
REPEAT_MS = 200.0
HEADLINE = "ms bf16"
DEV = "cuda"  # the checks and cases allocate here (a CPU dry run of the script logic sets "cpu")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One build of the cascade module.

    ``family`` says which cases it is timed on: "two" (MergeTwoKernel: merge_state and the
    in-place merge), "many" (MergeManyKernel: merge_states and MergeStatesVarlen) or "all"."""

    name: str
    macros: tuple[str, ...] = ()
    family: str = "all"


VARIANTS = [
    Variant("default"),  # 128 thr x 4 items x 8 blk/SM, L2::256B, flat; unroll 6, slices >= 8 vec
    Variant("two: 512 thr x 1 item x 4 blk/SM", ("THREADS=512", "ITEMS_PER_THREAD=1",
                                                  "MIN_BLOCKS_PER_SM=4"), "two"),
    Variant("two: 256 thr x 1 item x 8 blk/SM", ("THREADS=256", "ITEMS_PER_THREAD=1"), "two"),
    Variant("two: 128 thr x 2 items x 8 blk/SM", ("ITEMS_PER_THREAD=2",), "two"),
    Variant("two: 256 thr x 2 items x 4 blk/SM", ("THREADS=256", "ITEMS_PER_THREAD=2",
                                                   "MIN_BLOCKS_PER_SM=4"), "two"),
    Variant("two: 128 thr x 8 items x 4 blk/SM", ("ITEMS_PER_THREAD=8", "MIN_BLOCKS_PER_SM=4"),
            "two"),
    Variant("two: no L2 prefetch hint", ("L2_PREFETCH=0",), "two"),
    Variant("two: (row, head) addressing", ("FLAT=0",), "two"),
    Variant("many: unroll 4", ("MANY_UNROLL=4",), "many"),
    Variant("many: no head-row slices", ("MIN_SLICE_VECS=1024",), "many"),
    Variant("many: slices down to 4 vectors", ("MIN_SLICE_VECS=4",), "many"),
    # Safe here (no kernel writes indptr) and in split-KV attention; measures the gain.
    Variant("many: indptr read before the PDL wait", ("INDPTR_BEFORE_PDL_WAIT=1",), "many"),
]


def spec(v: Variant) -> JitSpec:
    base = gen_cascade_module()
    macros = tuple(f"-DFLASHINFER_CASCADE_{m}" for m in v.macros)
    return dataclasses.replace(base, extra_cuda_cflags=base.extra_cuda_cflags + macros)


# ---------------------------------------------------------------------------------------------
# float64 reference and checks


_SEEDS = iter(range(1 << 30))


def rand_lse(shape, empty_frac=0.2, scale=4.0):
    """Random base-2 LSEs, a fraction of them empty (-inf); a fresh seed per call."""
    return cascade_ref.rand_lse(shape, empty_frac, scale, device=DEV, seed=next(_SEEDS))


# Relative-norm bound and elementwise tolerance per output dtype: one rounding of a float32 sum.
REL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
ELEM = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def compare(name: str, v, s, want_v, want_s) -> dict:
    """One check's record: ok, the relative-norm errors and what failed."""
    problems = []
    if v.isnan().any():
        problems.append("NaN in v (unwritten or 0*inf)")
    if s is not None and s.isnan().any():
        problems.append("NaN in s")
    err = float((v.double() - want_v).norm() / want_v.norm().clamp_min(1e-30))
    if not err <= REL[v.dtype]:
        problems.append(f"v rel err {err:.2e} > {REL[v.dtype]:.0e}")
    tol = ELEM[v.dtype]
    if not torch.allclose(v.double(), want_v, rtol=tol, atol=tol):
        problems.append("v elementwise")
    s_err = 0.0
    if s is not None:
        fin = torch.isfinite(want_s)
        if not torch.equal(torch.isneginf(s), torch.isneginf(want_s)):
            problems.append("s: -inf pattern differs")
        elif fin.any():
            s_err = float((s.double()[fin] - want_s[fin]).abs().max())
            if not torch.allclose(s.double()[fin], want_s[fin], rtol=1e-5, atol=1e-4):
                problems.append(f"s max abs err {s_err:.2e}")
    return {"check": name, "ok": not problems, "v_rel_err": err, "s_max_abs_err": s_err,
            "problems": problems}


def run_checks(mod, pdl: bool) -> list[dict]:
    out = []
    dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def nan_like(shape, dtype):
        return torch.full(shape, math.nan, dtype=dtype, device=DEV)

    def two(name, va, sa, vb, sb):
        v, s = nan_like(va.shape, va.dtype), nan_like(sa.shape, torch.float32)
        mod.merge_state(v, s, va, sa, vb, sb, pdl)
        want = ref_merge(torch.stack([va, vb], 1), torch.stack([sa, sb], 1), dim=1)
        out.append(compare(name, v, s, *want))

    for L, H, D in [(1, 1, 64), (1, 32, 128), (7, 3, 128), (5, 8, 256), (9, 5, 80), (4, 3, 33),
                    (3, 1, 128), (300, 32, 128), (2, 1, 1024), (1500, 7, 64)]:
        for dt in dtypes:
            va, vb = torch.randn(L, H, D, device=DEV).to(dt), torch.randn(L, H, D,
                                                                           device=DEV).to(dt)
            sa, sb = rand_lse((L, H)), rand_lse((L, H))
            if L > 1:
                sa[0], sb[0] = -math.inf, -math.inf
            poison_empty(va, sa)
            poison_empty(vb, sb)
            two(f"merge_state {L}x{H}x{D} {dt}", va, sa, vb, sb)
    # Strided: heads of a wider tensor, a column window, s as transposed / strided views.
    L, H, D = 33, 6, 128
    va = torch.randn(L, 2 * H, D + 64, device=DEV).bfloat16()[:, ::2, 64:]
    vb = torch.randn(L, H + 1, D, device=DEV).bfloat16()[:, 1:]
    sa, sb = rand_lse((H, L)).t(), rand_lse((L, 3 * H))[:, ::3]
    poison_empty(va, sa)
    poison_empty(vb, sb)
    two("merge_state strided (row, head) layout", va, sa, vb, sb)
    # Head-packed but not contiguous rows: flat addressing with a state stride of 2 * D.
    va = torch.randn(64, 8, 2, 128, device=DEV).half()[:, :, 0]
    vb = torch.randn(64, 8, 128, device=DEV).half()
    sa, sb = rand_lse((64, 8)), rand_lse((64, 8))
    poison_empty(va, sa)
    poison_empty(vb, sb)
    two("merge_state flat with state stride 2*D", va, sa, vb, sb)

    for L, H, D, masked in [(130, 32, 128, False), (130, 32, 128, True), (9, 5, 80, True),
                            (4, 3, 33, False)]:
        v0 = torch.randn(L, H, D, device=DEV).bfloat16()
        vo = torch.randn(L, H, D, device=DEV).bfloat16()
        s0, so = rand_lse((L, H)), rand_lse((L, H))
        poison_empty(v0, s0)
        poison_empty(vo, so)
        want_v, want_s = ref_merge(torch.stack([v0, vo], 1), torch.stack([s0, so], 1), dim=1)
        mask = None
        if masked:
            mask = torch.rand(L, device=DEV) < 0.6
            want_v = torch.where(mask[:, None, None], want_v,
                                 torch.nan_to_num(v0.double(), nan=0.0, posinf=0.0))
            want_s = torch.where(mask[:, None], want_s, s0.double())
        v, s = v0.clone(), s0.clone()
        mod.merge_state_in_place(v, s, vo, so, mask, pdl)
        if masked:  # untouched rows keep their poisoned v: compare them bit for bit
            keep = ~mask
            same = torch.equal(v[keep].view(torch.int16), v0[keep].view(torch.int16)) and \
                torch.equal(s[keep], s0[keep])
            v, s, want_v, want_s = v[mask], s[mask], want_v[mask], want_s[mask]
            rec = compare(f"merge_state_in_place {L}x{H}x{D} masked", v, s, want_v, want_s)
            if not same:
                rec["ok"] = False
                rec["problems"].append("masked rows changed")
            out.append(rec)
        else:
            out.append(compare(f"merge_state_in_place {L}x{H}x{D}", v, s, want_v, want_s))

    for L, S, H, D in [(1, 132, 32, 128), (3, 2, 5, 128), (2, 33, 3, 256), (17, 5, 2, 33),
                       (130, 7, 32, 128), (1, 1, 1, 64), (4, 0, 3, 64)]:
        for dt in (torch.bfloat16, torch.float32):
            v = torch.randn(L, S, H, D, device=DEV).to(dt)
            s = rand_lse((L, S, H), 0.25)
            if L > 1 and S > 0:
                s[0] = -math.inf
            poison_empty(v, s)
            vm, sm = nan_like((L, H, D), dt), nan_like((L, H), torch.float32)
            if vm.numel():
                mod.merge_states(vm, sm, v, s, pdl)
            out.append(compare(f"merge_states {L}x{S}x{H}x{D} {dt}", vm, sm,
                               *ref_merge(v, s, dim=1)))

    for counts in ([132], [32], [3], [0], [1, 2, 0, 1, 2, 2, 1, 0, 5], [2] * 300,
                   [40, 0, 7, 132, 1], [200]):
        for H, D in ((32, 128), (3, 64), (8, 256), (5, 33), (1, 128)):
            indptr = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(),
                                  dtype=torch.int32, device=DEV)
            P = int(indptr[-1])
            v, s = torch.randn(P, H, D, device=DEV), rand_lse((P, H), 0.1)
            poison_empty(v, s)
            for dt in (torch.bfloat16, torch.float32) if (H, D) == (32, 128) else (torch.bfloat16,):
                o, lse = nan_like((len(counts), H, D), dt), nan_like((len(counts), H),
                                                                    torch.float32)
                mod.merge_states_varlen(o, lse, v, s, indptr, pdl)
                ind = indptr.tolist()
                refs = [ref_merge(v[ind[r]:ind[r + 1]][None], s[ind[r]:ind[r + 1]][None], dim=1)
                        for r in range(len(counts))]
                want_v = torch.cat([r[0] for r in refs])
                want_s = torch.cat([r[1] for r in refs])
                name = f"varlen counts={counts if len(counts) < 10 else f'[2]*{len(counts)}'} " \
                       f"H={H} D={D} -> {dt}"
                out.append(compare(name, o, lse, want_v, want_s))
    if DEV == "cuda":
        torch.cuda.synchronize()
    return out


# ---------------------------------------------------------------------------------------------
# timed cases


@dataclasses.dataclass
class Case:
    key: str        # short column name
    name: str
    family: str     # "two" or "many"
    nbytes: int     # each input read once, each output written once
    call: Callable  # call(mod) runs the op once on inputs made when the case was built


def build_cases(pdl: bool) -> list[Case]:
    cases = []

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=DEV).to(dtype)

    def lse(*shape):
        return torch.randn(*shape, device=DEV) * 4

    def merge_state(key, L, H, D, dtype=torch.bfloat16):
        va, vb, sa, sb = rnd(L, H, D, dtype=dtype), rnd(L, H, D, dtype=dtype), lse(L, H), lse(L, H)
        v, s = torch.empty_like(va), torch.empty_like(sa)
        nbytes = 3 * va.numel() * va.element_size() + 3 * sa.numel() * 4
        cases.append(Case(key, f"merge_state {str(dtype)[6:]} {L}x{H}x{D}", "two", nbytes,
                          lambda mod: mod.merge_state(v, s, va, sa, vb, sb, pdl)))
        return va, sa, vb, sb

    def in_place(key, L, H, D, masked):
        v, vo, s, so = rnd(L, H, D), rnd(L, H, D), lse(L, H), lse(L, H)
        mask = (torch.arange(L, device=DEV) % 2 == 0) if masked else None
        rows = L // 2 if masked else L
        nbytes = 3 * rows * H * D * 2 + 3 * rows * H * 4 + (L if masked else 0)
        name = f"merge_state_in_place bf16 {L}x{H}x{D}" + (" (half the rows masked)"
                                                          if masked else "")
        cases.append(Case(key, name, "two", nbytes,
                          lambda mod: mod.merge_state_in_place(v, s, vo, so, mask, pdl)))

    def merge_states(key, L, S, H, D):
        v, s = rnd(L, S, H, D), lse(L, S, H)
        vm, sm = torch.empty(L, H, D, dtype=v.dtype, device=DEV), torch.empty(L, H,
                                                                                 device=DEV)
        nbytes = (L * S + L) * H * D * 2 + (L * S + L) * H * 4
        cases.append(Case(key, f"merge_states bf16 {L}x{S}x{H}x{D}", "many", nbytes,
                          lambda mod: mod.merge_states(vm, sm, v, s, pdl)))

    def varlen(key, counts, H, D, note):
        indptr = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32,
                              device=DEV)
        parts, rows = int(indptr[-1]), len(counts)
        v, s = rnd(parts, H, D, dtype=torch.float32), lse(parts, H)
        o = torch.empty(rows, H, D, dtype=torch.bfloat16, device=DEV)
        ls = torch.empty(rows, H, device=DEV)
        nbytes = parts * H * (D + 1) * 4 + rows * H * (D * 2 + 4) + indptr.numel() * 4
        cases.append(Case(key, f"merge_states_varlen f32->bf16 {note}: {rows} rows x {H} x {D}, "
                               f"{parts} parts", "many", nbytes,
                          lambda mod: mod.merge_states_varlen(o, ls, v, s, indptr, pdl)))

    headline = merge_state(HEADLINE, 8192, 32, 128)
    merge_state("ms fp16", 8192, 32, 128, torch.float16)
    merge_state("ms d256", 4096, 32, 256)
    in_place("inplace", 8192, 32, 128, False)
    in_place("masked", 8192, 32, 128, True)
    merge_state("ms 64r", 64, 32, 128)
    varlen("vl 1x132", [132], 32, 128, "split-KV decode")
    varlen("vl 1x32", [32], 32, 128, "split-KV decode, 32 chunks")
    varlen("vl 64x16", [16] * 64, 32, 128, "batch 64 x 16 chunks")
    merge_states("mss 1x132", 1, 132, 32, 128)
    varlen("vl 8k x2", [2] * 8192, 32, 128, "many rows of 2 parts")
    merge_states("mss 2k x8", 2048, 8, 32, 128)
    return cases, headline


def time_us(fn: Callable[[], None], nbytes: int) -> float:
    """Median microseconds per call (see the module docstring for the two methods)."""
    from flashinfer.testing import bench_gpu_time

    calls = 10 if nbytes < SMALL_BYTES else 1
    times = bench_gpu_time(fn, dry_run_time_ms=20, repeat_time_ms=REPEAT_MS, use_cuda_graph=True,
                           num_iters_within_graph=calls, cold_l2_cache=True)
    return statistics.median(times) * 1e3


def profiler_kernel_us(runs: list[tuple[str, Callable[[], None]]], n: int = 30) -> dict:
    """The kernel's own duration (CUPTI, through torch.profiler): median over n cold-L2 calls of
    each run, in order; kernels are told apart by name (MergeTwoKernel) and by order."""
    from torch.profiler import ProfilerActivity, profile

    size = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * size, dtype=torch.int8, device=DEV)
    for _, fn in runs:
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _, fn in runs:
            for _ in range(n):
                flush.zero_()
                fn()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and "MergeTwoKernel" in e.name), key=lambda e: e.time_range.start)
    if len(kernels) != n * len(runs):
        return {"error": f"expected {n * len(runs)} MergeTwoKernel events, got {len(kernels)}"}
    return {name: round(statistics.median(e.time_range.elapsed_us() for e in
                                          kernels[i * n:(i + 1) * n]), 2)
            for i, (name, _) in enumerate(runs)}


# ---------------------------------------------------------------------------------------------


def build(variants: list[Variant]) -> dict[str, JitSpec]:
    specs = {v.name: spec(v) for v in variants}
    t = time.monotonic()
    aot.build_all(list(specs.values()), jobs=min(len(specs), os.cpu_count() or 1))
    print(f"built {len(specs)} variants in {time.monotonic() - t:.0f} s", flush=True)
    return specs


def print_table(result: dict, cases: list[Case]) -> None:
    keys = [c.key for c in cases]
    print(f"\n{'variant (us; mean of the passes)':<36}" + "".join(f"{k:>10}" for k in keys) +
          f"{'hl spread':>10}{'hl %copy':>9}{'checks':>8}")
    for name, row in result["timings"].items():
        cells = []
        for k in keys:
            t = row.get(k)
            cells.append(f"{statistics.mean(t):>10.2f}" if t else f"{'-':>10}")
        hl = row.get(HEADLINE)
        spread = f"{abs(hl[0] - hl[1]):>10.2f}" if hl and len(hl) > 1 else f"{'-':>10}"
        pct = result["pct_of_copy"].get(name)
        chk = result["checks_ok"].get(name)
        print(f"{name[:35]:<36}" + "".join(cells) + spread +
              (f"{pct:>9.1f}" if pct else f"{'-':>9}") +
              f"{('ok' if chk else 'FAIL') if chk is not None else '-':>8}")
    if result.get("headline_kernel_us"):
        print("\nheadline kernel-only (profiler) / harness-style API call (us):")
        for name, us in result["headline_kernel_us"].items():
            api = result.get("headline_api_us", {}).get(name)
            print(f"  {name:<40} kernel {us}   api {api if api else '-'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", help="where tune-cascade.json goes (GPU runs)")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated substrings of variant names")
    parser.add_argument("--deadline-s", type=float, default=235.0,
                        help="dump stacks and exit past this (a hung GPU call too)")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.deadline_s, exit=True)
    variants = [v for v in VARIANTS
                if not args.only or any(s in v.name for s in args.only.split(","))]
    has_gpu = torch.cuda.is_available()
    if not has_gpu and not knobs.jit.cuda_arch_list:
        knobs.jit.cuda_arch_list = "9.0a"  # no GPU to detect: build for the H100
    if not args.build_only and not args.out_dir:
        parser.error("OUT_DIR is required unless --build-only")
    specs = build(variants)
    if args.build_only:
        return 0
    if not has_gpu:
        print("no CUDA GPU visible: built every variant; checks and timings need a GPU",
              file=sys.stderr)
        return 2

    import harness
    from flashinfer._checks import resolve_pdl

    out_path = Path(args.out_dir) / "tune-cascade.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"ceilings": harness.measure_ceilings(),
                    "variants": {v.name: {"macros": list(v.macros), "family": v.family}
                                 for v in variants},
                    "method": next(p for p in __doc__.split("\n\n") if p.startswith("Method")),
                    "checks": {}, "checks_ok": {}, "timings": {}, "pct_of_copy": {}}
    print("ceilings", result["ceilings"], flush=True)

    def save():  # a sweep record (benchmarks/schema.py): everything but the ceilings in `extra`
        harness.write(out_path, harness.record("sweep", "tune-cascade", **result))

    pdl = resolve_pdl(None, torch.device("cuda"))
    mods = {v.name: get_module(specs[v.name]) for v in variants}
    torch.manual_seed(0)
    for v in variants:
        t = time.monotonic()
        recs = run_checks(mods[v.name], pdl)
        result["checks"][v.name] = [r for r in recs if not r["ok"]] or f"{len(recs)} passed"
        result["checks_ok"][v.name] = all(r["ok"] for r in recs)
        worst = max(recs, key=lambda r: r["v_rel_err"] / REL[torch.bfloat16])
        print(f"checks {v.name}: {sum(r['ok'] for r in recs)}/{len(recs)} ok "
              f"({time.monotonic() - t:.1f} s; largest v rel err {worst['v_rel_err']:.1e})",
              flush=True)
    save()

    cases, headline = build_cases(pdl)
    copy = result["ceilings"]["copy_GBps"]
    for rep in range(2):
        for v in variants:
            row = result["timings"].setdefault(v.name, {})
            for c in cases:
                if v.family not in ("all", c.family):
                    continue
                mod = mods[v.name]
                us = time_us(lambda c=c, mod=mod: c.call(mod), c.nbytes)
                row.setdefault(c.key, []).append(round(us, 2))
                print(f"pass {rep + 1} {v.name[:35]:<36} {c.name:<70} {us:9.2f} us "
                      f"{100 * c.nbytes / (us * 1e-6) / 1e9 / copy:6.1f}%", flush=True)
            if HEADLINE in row:
                us = statistics.mean(row[HEADLINE])
                result["pct_of_copy"][v.name] = round(
                    100 * cases[0].nbytes / (us * 1e-6) / 1e9 / copy, 1)
        save()
        if rep == 0:  # a table now too, in case the deadline cuts the second pass
            print_table(result, cases)

    # The headline three ways: kernel-only (profiler), graph (above), Python call with events.
    two = [v for v in variants if v.family in ("all", "two")]
    try:
        result["headline_kernel_us"] = profiler_kernel_us(
            [(v.name, lambda mod=mods[v.name]: cases[0].call(mod)) for v in two])
    except Exception as e:  # the profiler is a diagnostic: keep the timings if it fails
        result["headline_kernel_us"] = {"error": repr(e)}
    va, sa, vb, sb = headline
    result["headline_api_us"] = {}
    for v in two[:1]:  # the default: what benchmarks/harness.py would report
        cascade_api.get_cascade_module = lambda mod=mods[v.name]: mod
        result["headline_api_us"][v.name] = [
            round(harness._median_ms(lambda: flashinfer.merge_state(va, sa, vb, sb))[0] * 1e3, 2)
            for _ in range(2)]
    save()
    print(f"\nwrote {out_path}")
    print(f"copy ceiling {copy:.0f} GB/s; headline bytes {cases[0].nbytes}; "
          f"{cases[0].nbytes / copy / 1e3:.1f} us at the ceiling")
    print_table(result, cases)
    failed = [n for n, ok in result["checks_ok"].items() if not ok]
    if failed:
        print(f"\nFAILED CHECKS: {failed} (details in the JSON)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

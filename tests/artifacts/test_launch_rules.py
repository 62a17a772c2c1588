"""The cubin path's launch rules (flashinfer/artifacts/rules.py) against the C++ host launchers
they mirror: the functions of norm.cuh and activation.cuh, compiled on the host with nvcc and run
over a grid of inputs. Same answers => the cubin path launches the kernel the JIT path launches,
with the same geometry."""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

import pytest

from flashinfer.artifacts import rules

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "packages" / "flashinfer-python" / "include"

NUM_VECS = [1, 2, 3, 4, 5, 7, 16, 31, 32, 100, 127, 128, 129, 255, 256, 512, 1000, 1024, 1025,
            2047, 4096, 4097, 6000, 8192, 8193, 65536]
ROWS = [1, 2, 3, 7, 64, 100, 1000, 16384]
VECS_PER_ROW = [1, 2, 3, 5, 8, 13, 64, 100, 256, 1000, 1024, 3584, 5000]
SMS = [1, 8, 78, 132]
PTR_OFFSETS = [0, 2, 4, 8, 16]
DS = [1, 3, 4, 8, 100, 128, 4096]
STRIDES = [1, 4, 8, 12, 100, 4096]

HOST = r"""
#include <flashinfer/norm.cuh>
#include <flashinfer/activation.cuh>
#include <cstdint>
#include <cstdio>
#include <initializer_list>

using namespace flashinfer;
int main() {
  for (long long nv : {NUM_VECS})
    for (int mv : {4, 8}) {
      auto p = norm::plan_launch(nv, mv);
      std::printf("P %lld %d %d %d %d %lld\n", nv, mv, p.vecs, p.group, p.block,
                  (long long)p.rows_per_block);
    }
  for (long long rows : {ROWS})
    for (long long vpr : {VECS_PER_ROW})
      for (int sm : {SMS}) {
        auto g = activation::plan_geometry(rows, vpr, sm);
        std::printf("G %lld %lld %d %d %d %lld %lld\n", rows, vpr, sm, g.threads_x,
                    g.rows_per_block, (long long)g.col_chunks, (long long)g.num_tiles);
      }
  for (int io : {PTR_OFFSETS})
    for (int oo : {PTR_OFFSETS})
      for (long long rows : {1, 5})
        for (long long d : {DS})
          for (long long is : {STRIDES})
            for (long long os : {STRIDES}) {
              const __half* in = reinterpret_cast<const __half*>(uintptr_t{4096} + io);
              const __half* out = reinterpret_cast<const __half*>(uintptr_t{8192} + oo);
              std::printf("V %d %d %lld %lld %lld %lld %d\n", io, oo, rows, d, is, os,
                          activation::pick_vec_bytes(in, out, rows, d, is, os));
            }
  for (long long heads : {1, 2, 8})
    for (long long inner : {64, 128})
      for (long long extra : {0, 8}) {
        int64_t h = heads;
        norm::RowStrides a{heads * inner + extra, inner}, b{heads * inner, inner};
        norm::detail::fold_heads(h, a, b);
        std::printf("F %lld %lld %lld %lld %lld %lld %lld %lld\n", heads, inner, extra, (long long)h,
                    (long long)a.outer, (long long)a.inner, (long long)b.outer, (long long)b.inner);
      }
  return 0;
}
"""


def _list(xs):
    return ", ".join(str(x) for x in xs)


@pytest.fixture(scope="module")
def cpp_answers(tmp_path_factory) -> list[list[int]]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    tmp = tmp_path_factory.mktemp("rules")
    src = tmp / "host.cu"
    text = HOST
    for name, xs in [("NUM_VECS", NUM_VECS), ("ROWS", ROWS), ("VECS_PER_ROW", VECS_PER_ROW),
                     ("SMS", SMS), ("PTR_OFFSETS", PTR_OFFSETS), ("DS", DS), ("STRIDES", STRIDES)]:
        text = text.replace("{" + name + "}", "{" + _list(xs) + "}")
    src.write_text(text)
    exe = tmp / "host"
    r = subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", f"-I{INCLUDE}", str(src),
                        "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


@pytest.mark.nvcc
def test_norm_plan_launch_matches_cpp(cpp_answers):
    lines = [x for x in cpp_answers if x[0] == "P"]
    assert len(lines) == len(NUM_VECS) * 2
    for _, nv, mv, vecs, group, block, rpb in lines:
        p = rules.plan_launch(int(nv), int(mv))
        assert (p.vecs, p.group, p.block, p.rows_per_block) == tuple(map(int, (vecs, group, block, rpb)))


@pytest.mark.nvcc
def test_act_plan_geometry_matches_cpp(cpp_answers):
    lines = [x for x in cpp_answers if x[0] == "G"]
    assert len(lines) == len(ROWS) * len(VECS_PER_ROW) * len(SMS)
    for _, rows, vpr, sm, tx, rpb, chunks, tiles in lines:
        g = rules.plan_geometry(int(rows), int(vpr), int(sm))
        assert (g.threads_x, g.rows_per_block, g.col_chunks, g.num_tiles) == (
            int(tx), int(rpb), int(chunks), int(tiles)), (rows, vpr, sm)


@pytest.mark.nvcc
def test_pick_vec_bytes_matches_cpp(cpp_answers):
    lines = [x for x in cpp_answers if x[0] == "V"]
    assert len(lines) == len(PTR_OFFSETS) ** 2 * 2 * len(DS) * len(STRIDES) ** 2
    for _, io, oo, rows, d, is_, os_, nbytes in lines:
        got = rules.pick_vec_bytes(4096 + int(io), 8192 + int(oo), int(rows), int(d), int(is_),
                                   int(os_), 2)
        assert got == int(nbytes)


@pytest.mark.nvcc
def test_fold_heads_matches_cpp(cpp_answers):
    for _, heads, inner, extra, h, ao, ai, bo, bi in (x for x in cpp_answers if x[0] == "F"):
        heads, inner, extra = int(heads), int(inner), int(extra)
        got_h, (a, b) = rules.fold_heads(heads, (heads * inner + extra, inner), (heads * inner, inner))
        assert (got_h, a, b) == (int(h), (int(ao), int(ai)), (int(bo), int(bi)))


def test_norm_rows_chooses_the_variant():
    # 16-byte path: bf16 H = 4096 -> 512 vectors -> 128 threads x 4 vectors, one row per block.
    assert rules.norm_rows(10, 4096, 2, True, False) == rules.NormLaunch(16, 4, 128, 10, 128)
    # Misaligned or odd hidden: one element per access.
    assert rules.norm_rows(10, 4095, 2, True, False).access == 0
    assert rules.norm_rows(10, 4096, 2, False, False).access == 0
    # Long rows: 8 vectors per thread for the plain norm, the loop kernel for the fused add.
    assert rules.norm_rows(1, 40960, 2, True, False).vecs == 8
    assert rules.norm_rows(1, 40960, 2, True, True).vecs == 0
    assert rules.norm_rows(0, 4096, 2, True, False) is None


def test_act_and_mul_rule():
    plan = rules.act_and_mul(4096, 8192, 16384, 28672, 57344, 28672, 2, 132)
    assert plan.access == 16 and plan.vecs_per_row == 3584
    assert (plan.geometry.threads_x, plan.geometry.col_chunks) == (224, 4)
    assert rules.act_and_mul(4098, 8192, 4, 8, 16, 8, 2, 132).access == 0  # 2-byte aligned input
    assert rules.act_and_mul(0, 0, 0, 8, 16, 8, 2, 132) is None


@pytest.mark.parametrize("shape, strides, expected", [
    ((4, 128), (128, 1), (128, 0)),
    ((1, 128), (999, 1), (128, 0)),
    ((4, 8, 64), (512, 64, 1), (512, 64)),
    ((1, 8, 64), (7, 64, 1), (512, 64)),
    ((4, 1, 64), (100, 3, 1), (100, 64)),
])
def test_row_strides(shape, strides, expected):
    assert rules.row_strides(shape, strides) == expected


def test_grid_of_inputs_is_not_trivial():
    # The C++ comparison above covers every branch of the policies.
    branches = {rules.plan_launch(nv, mv).vecs for nv, mv in itertools.product(NUM_VECS, (4, 8))}
    assert branches == {0, 4, 8}

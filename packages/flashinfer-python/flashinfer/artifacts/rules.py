"""Launch rules: the host-side launch policy of each cubin kernel family, in pure Python.

A manifest entry names its rule (``launch.rule``); the cubin path of an op applies it to compute
the variant, grid and block, exactly as the C++ host launcher does for the JIT module. These are
line-for-line mirrors of ``plan_launch`` / ``fold_heads`` / ``with_plan`` (norm.cuh) and
``plan_geometry`` / ``pick_vec_bytes`` (activation.cuh): the same choices give the same kernel
the same work, so the cubin path computes what the JIT path computes. A test compiles the C++
functions on the host and compares them with these over a grid of inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# norm.cuh
NORM_MAX_THREADS = 1024
NORM_WARP_PATH_THREADS = 256
# activation.cuh
ACT_MAX_BLOCK_THREADS = 256
ACT_UNROLL = 4
ACT_MIN_BLOCKS_PER_SM = 2
MAX_GRID_X = (1 << 31) - 1


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


# ---------------------------------------------------------------------------------------------
# norm_rows: RMSNorm, Gemma RMSNorm, fused add (norm.cuh)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormPlan:
    vecs: int  # 4 or 8 vectors per thread; 0 = loop kernel
    group: int  # threads per row
    block: int
    rows_per_block: int


def next_pow2(x: int) -> int:
    p = 1
    while p < x:
        p <<= 1
    return p


def plan_launch(num_vecs: int, max_vecs: int) -> NormPlan:
    """norm.cuh ``plan_launch``."""
    if num_vecs <= 32 * 4:
        group = next_pow2((num_vecs + 3) // 4)
        return NormPlan(4, group, NORM_WARP_PATH_THREADS, NORM_WARP_PATH_THREADS // group)
    if num_vecs <= NORM_MAX_THREADS * 4:
        group = (num_vecs + 4 * 32 - 1) // (4 * 32) * 32
        return NormPlan(4, group, group, 1)
    if max_vecs >= 8 and num_vecs <= NORM_MAX_THREADS * 8:
        group = (num_vecs + 8 * 32 - 1) // (8 * 32) * 32
        return NormPlan(8, group, group, 1)
    return NormPlan(0, NORM_MAX_THREADS, NORM_MAX_THREADS, 1)


def row_strides(shape, strides) -> tuple[int, int]:
    """csrc/norm.cu ``row_strides``: (outer, inner) element strides of a 2-D or 3-D tensor."""
    hidden = shape[-1]
    if len(shape) == 2:
        return (hidden if shape[0] == 1 else strides[0], 0)
    inner = hidden if shape[1] == 1 else strides[1]
    return (shape[1] * inner if shape[0] == 1 else strides[0], inner)


def fold_heads(heads: int, *strides: tuple[int, int]) -> tuple[int, list[tuple[int, int]]]:
    """norm.cuh ``detail::fold_heads``: (B, N, H) as (B*N, H) when every tensor's rows are evenly
    spaced."""
    if heads <= 1:
        return heads, list(strides)
    if all(outer == heads * inner for outer, inner in strides):
        return 1, [(inner, 0) for _, inner in strides]
    return heads, list(strides)


def strides_aligned(s: tuple[int, int], elem_bytes: int, bytes_: int) -> bool:
    return (s[0] * elem_bytes) % bytes_ == 0 and (s[1] * elem_bytes) % bytes_ == 0


@dataclass(frozen=True)
class NormLaunch:
    access: int  # 16 (N = 16 / elem) or 0 (N = 1)
    vecs: int
    group: int
    grid: int
    block: int


def norm_rows(
    rows: int, hidden: int, elem_bytes: int, aligned: bool, fused: bool
) -> Optional[NormLaunch]:
    """norm.cuh ``with_plan`` + ``launch_rmsnorm``: the kernel variant and geometry (None: no
    launch, an empty tensor). ``aligned``: every pointer and row stride is 16-byte aligned."""
    if rows == 0 or hidden == 0:
        return None
    vec16 = 16 // elem_bytes
    n = vec16 if aligned and hidden % vec16 == 0 else 1
    plan = plan_launch(hidden // n, 4 if fused else 8)
    blocks = ceil_div(rows, plan.rows_per_block)
    if blocks > 0x7FFFFFFF:
        raise ValueError(f"{rows} rows need {blocks} blocks, more than a grid holds")
    return NormLaunch(16 if n > 1 else 0, plan.vecs, plan.group, blocks, plan.block)


# ---------------------------------------------------------------------------------------------
# act_and_mul: silu/gelu/gelu_tanh and mul (activation.cuh)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActGeometry:
    threads_x: int
    rows_per_block: int
    col_chunks: int
    num_tiles: int


def round_threads_x(t: int) -> int:
    if t >= 32:
        return ceil_div(t, 32) * 32
    p = 1
    while p < t:
        p *= 2
    return p


def plan_geometry(rows: int, vecs_per_row: int, sm_count: int) -> ActGeometry:
    """activation.cuh ``plan_geometry``."""
    threads_x = col_chunks = 0

    def set_threads_x(max_threads_x: int) -> None:
        nonlocal threads_x, col_chunks
        chunks = ceil_div(vecs_per_row, max_threads_x * ACT_UNROLL)
        threads_x = round_threads_x(ceil_div(ceil_div(vecs_per_row, chunks), ACT_UNROLL))
        col_chunks = ceil_div(vecs_per_row, threads_x * ACT_UNROLL)

    set_threads_x(ACT_MAX_BLOCK_THREADS)
    stack = ACT_MAX_BLOCK_THREADS // threads_x
    rows_per_block = stack if stack < rows else rows
    num_tiles = ceil_div(rows, rows_per_block) * col_chunks
    target = sm_count * ACT_MIN_BLOCKS_PER_SM
    while num_tiles < target:
        if rows_per_block > 1 and threads_x * (rows_per_block // 2) >= 32:
            rows_per_block //= 2
        elif threads_x > 32 and rows_per_block == 1:
            set_threads_x(threads_x // 2)
        else:
            break
        num_tiles = ceil_div(rows, rows_per_block) * col_chunks
    return ActGeometry(threads_x, rows_per_block, col_chunks, num_tiles)


def pick_vec_bytes(
    in_ptr: int, out_ptr: int, rows: int, d: int, in_stride: int, out_stride: int, elem: int
) -> int:
    """activation.cuh ``pick_vec_bytes``."""
    for nbytes in (16, 8):
        strides_ok = rows == 1 or (
            (in_stride * elem) % nbytes == 0 and (out_stride * elem) % nbytes == 0
        )
        if (d * elem) % nbytes == 0 and in_ptr % nbytes == 0 and out_ptr % nbytes == 0 and (
            strides_ok
        ):
            return nbytes
    return elem


@dataclass(frozen=True)
class ActLaunch:
    access: int  # 16, 8, or 0 (one element)
    vecs_per_row: int
    geometry: ActGeometry
    grid: int


def act_and_mul(
    in_ptr: int, out_ptr: int, rows: int, d: int, in_stride: int, out_stride: int, elem: int,
    sm_count: int,
) -> Optional[ActLaunch]:
    """activation.cuh ``ActAndMul`` + ``LaunchActAndMul`` (None: nothing to launch)."""
    if rows == 0 or d == 0:
        return None
    nbytes = pick_vec_bytes(in_ptr, out_ptr, rows, d, in_stride, out_stride, elem)
    vecs_per_row = d // (nbytes // elem)
    g = plan_geometry(rows, vecs_per_row, sm_count)
    grid = g.num_tiles if g.num_tiles < MAX_GRID_X else MAX_GRID_X
    return ActLaunch(0 if nbytes == elem else nbytes, vecs_per_row, g, grid)

"""flashinfer.activation: gated activations, bandwidth-bound.

The headline case is the H100 target: silu_and_mul on bf16 16384 x 28672 (input 16384 x 57344,
2.8 GB moved), expected at the copy-bandwidth ceiling. The rest cover the other activations,
fp16, an 8-byte-access width (d = 100), strided rows and decode-sized batches.
"""

import torch

import flashinfer
from harness import Case


def _case(op: str, rows: int, d: int, dtype=torch.bfloat16, row_pad: int = 0, target: str = ""):
    base = torch.randn(rows, 2 * d + row_pad, dtype=dtype, device="cuda")
    x = base[:, : 2 * d]
    out = torch.empty(rows, d, dtype=dtype, device="cuda")
    fn = getattr(flashinfer, op)
    dt = str(dtype).replace("torch.", "")
    name = f"{op} {dt} {rows}x{d}" + (f" (row stride {2 * d + row_pad})" if row_pad else "")
    itemsize = x.element_size()
    return Case(
        name,
        lambda: fn(x, out=out),
        bytes_moved=(x.numel() + out.numel()) * itemsize,
        target=target,
    )


def cases() -> list[Case]:
    ceiling = "copy-bandwidth ceiling (~3 TB/s read+write on H100)"
    return [
        _case("silu_and_mul", 16384, 28672, target=ceiling),
        _case("gelu_and_mul", 16384, 28672),
        _case("gelu_tanh_and_mul", 16384, 28672),
        _case("silu_and_mul", 16384, 14336, dtype=torch.float16),
        _case("silu_and_mul", 8192, 11008),
        _case("silu_and_mul", 8192, 14336, row_pad=64),
        _case("silu_and_mul", 65536, 100, dtype=torch.float16),  # 8-byte accesses
        _case("silu_and_mul", 64, 14336),  # decode batch: launch-latency bound
        _case("silu_and_mul", 1, 14336),
    ]

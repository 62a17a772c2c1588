"""flashinfer.scale on a bandwidth-bound size."""

import torch

import flashinfer
from harness import Case


def cases() -> list[Case]:
    x = torch.randn(16384, 8192, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(x)
    return [Case("scale bf16 16384x8192", lambda: flashinfer.scale(x, 2.0, out=out),
                 bytes_moved=2 * x.numel() * x.element_size())]

"""flashinfer.norm on bandwidth-bound sizes.

Targets (H100, bf16): rmsnorm 16384 x 8192 at >= 95% of copy bandwidth (FlashInfer: ~87%), and
fused_add_rmsnorm 16384 x 28672 at the copy ceiling. bytes_moved = every input read once and
every output written once (the weight, gamma and beta once: they stay in L2).

The rest cover the other ops, fp16, the per-head QK-norm (3-D, contiguous and a packed-QKV view),
strided rows, hidden sizes on each kernel path (warp path, 4 and 8 vectors per thread, the loop
kernel for very long rows, one element per access) and decode batches, which are launch-bound.
"""

import torch

import flashinfer
from harness import Case

COPY = "copy-bandwidth ceiling (~3 TB/s read+write on H100)"


def _name(op, dtype, shape, note=""):
    dt = str(dtype).replace("torch.", "")
    dims = "x".join(str(s) for s in shape)
    return f"{op} {dt} {dims}" + (f" ({note})" if note else "")


def _rms(op, shape, dtype=torch.bfloat16, row_pad=0, target="", note=""):
    h = shape[-1]
    base = torch.randn(*shape[:-1], h + row_pad, dtype=dtype, device="cuda")
    x = base[..., :h]
    w = torch.randn(h, dtype=dtype, device="cuda")
    out = torch.empty(shape, dtype=dtype, device="cuda")
    fn = getattr(flashinfer, op)
    size = x.element_size()
    return Case(
        _name(op, dtype, shape, note or (f"row stride {h + row_pad}" if row_pad else "")),
        lambda: fn(x, w, out=out),
        bytes_moved=2 * x.numel() * size + h * size,
        target=target,
    )


def _qkv_view(batch, nq, nk, d, dtype=torch.bfloat16):
    """Per-head norm of q inside a packed (batch, nq + 2 nk, d) QKV tensor, written back in place."""
    qkv = torch.randn(batch, nq + 2 * nk, d, dtype=dtype, device="cuda")
    q = qkv[:, :nq]
    w = torch.randn(d, dtype=dtype, device="cuda")
    return Case(
        _name("rmsnorm", dtype, (batch, nq, d), f"q of packed qkv, {nq}+2x{nk} heads, in place"),
        lambda: flashinfer.rmsnorm(q, w, out=q),
        bytes_moved=2 * q.numel() * q.element_size() + d * q.element_size(),
    )


def _fused(op, shape, dtype=torch.bfloat16, target=""):
    x = torch.randn(shape, dtype=dtype, device="cuda")
    r = torch.randn(shape, dtype=dtype, device="cuda")
    w = torch.randn(shape[-1], dtype=dtype, device="cuda")
    fn = getattr(flashinfer, op)
    size = x.element_size()
    # In place: x and r are read and written every call; the values change, the traffic does not.
    return Case(
        _name(op, dtype, shape),
        lambda: fn(x, r, w),
        bytes_moved=4 * x.numel() * size + shape[-1] * size,
        target=target,
    )


def _layernorm(shape):
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    g = torch.randn(shape[-1], device="cuda")
    b = torch.randn(shape[-1], device="cuda")
    return Case(
        _name("layernorm", torch.bfloat16, shape),
        lambda: flashinfer.layernorm(x, g, b),
        bytes_moved=2 * x.numel() * x.element_size() + 2 * shape[-1] * 4,
    )


def cases() -> list[Case]:
    return [
        # The two targets.
        _rms("rmsnorm", (16384, 8192), target=">= 95% of copy bandwidth (FlashInfer ~87%)"),
        _fused("fused_add_rmsnorm", (16384, 28672), target=COPY),
        # The other ops at the headline size.
        _rms("gemma_rmsnorm", (16384, 8192)),
        _fused("fused_add_rmsnorm", (16384, 8192)),
        _fused("gemma_fused_add_rmsnorm", (16384, 8192)),
        _layernorm((16384, 8192)),
        _rms("rmsnorm", (16384, 8192), dtype=torch.float16),
        # Hidden sizes across the kernel paths (same 256 MiB input).
        _rms("rmsnorm", (32768, 4096)),
        _rms("rmsnorm", (26214, 5120)),
        _rms("rmsnorm", (8192, 16384)),
        _rms("rmsnorm", (2048, 65536), note="8 vectors per thread"),
        _rms("rmsnorm", (1024, 131072), note="loop kernel: row re-read from L2"),
        _fused("fused_add_rmsnorm", (4096, 65536)),  # loop kernel for the fused add
        _rms("rmsnorm", (16384, 8191), note="odd hidden: one element per access"),
        # Strided rows (x[:, :h] of a wider tensor).
        _rms("rmsnorm", (16384, 8192), row_pad=64),
        # Per-head QK-norm: many short rows, several per block.
        _rms("rmsnorm", (16384, 32, 128), note="QK-norm"),
        _qkv_view(16384, 32, 8, 128),
        _rms("rmsnorm", (131072, 8, 64), note="QK-norm, head_dim 64"),
        # Decode batches: launch-latency bound.
        _rms("rmsnorm", (1, 8192)),
        _rms("rmsnorm", (64, 8192)),
        _fused("fused_add_rmsnorm", (64, 8192)),
    ]

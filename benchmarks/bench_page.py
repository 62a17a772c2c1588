"""flashinfer.page: appending K/V rows into a paged cache (a scatter copy) and the ragged-to-COO
index conversion.

bytes_moved = the appended K and V rows read once and written once, plus the metadata read
(batch indices, positions, page table). Shapes: Llama-3-8B KV heads (8 x 128), bf16, page 16.
Prefill appends (16384 tokens) are bandwidth-bound; decode appends (one token per request) are
latency-bound.
"""

import torch

import flashinfer
from harness import Case


def _batch(num_reqs, append_len, ctx_len, page_size):
    """Requests of ctx_len tokens after appending append_len each; pages in random order."""
    pages_per = (ctx_len + page_size - 1) // page_size
    num_pages = num_reqs * pages_per
    kv_indptr = torch.arange(0, num_pages + 1, pages_per, dtype=torch.int32, device="cuda")
    kv_indices = torch.randperm(num_pages, device="cuda").to(torch.int32)
    last = torch.full((num_reqs,), (ctx_len - 1) % page_size + 1, dtype=torch.int32,
                      device="cuda")
    append_indptr = torch.arange(0, num_reqs * append_len + 1, append_len, dtype=torch.int32,
                                 device="cuda")
    seq = flashinfer.get_seq_lens(kv_indptr, last, page_size)
    nnz = num_reqs * append_len
    bi, pos = flashinfer.get_batch_indices_positions(append_indptr, seq, nnz)
    return num_pages, kv_indptr, kv_indices, last, bi, pos, nnz


def _zeros(shape, dtype):
    return torch.zeros(shape, dtype=torch.float16, device="cuda").to(dtype)


def _append(num_reqs, append_len, ctx_len, layout="NHD", heads=8, dim=128, page_size=16,
            form="tensor", dtype=torch.bfloat16, note=""):
    num_pages, kv_indptr, kv_indices, last, bi, pos, nnz = _batch(num_reqs, append_len, ctx_len,
                                                                   page_size)
    inner = (page_size, heads, dim) if layout == "NHD" else (heads, page_size, dim)
    if form == "tensor":
        cache = _zeros((num_pages, 2) + inner, dtype)
    else:  # K and V separate, V with a wider row (different strides)
        k = _zeros((num_pages,) + inner, dtype)
        v = _zeros((num_pages,) + inner[:-1] + (dim + 64,), dtype)[..., :dim]
        cache = (k, v)
    # Built in float32 and converted: torch has no randn for fp8.
    key = torch.randn(nnz, heads, dim, device="cuda").to(dtype)
    value = torch.randn(nnz, heads, dim, device="cuda").to(dtype)
    rows = 2 * nnz * heads * dim * key.element_size()
    meta = 4 * (2 * nnz + kv_indptr.numel() + num_reqs)  # + the pages touched, about nnz/page
    dt = str(dtype).replace("torch.", "")
    return Case(
        f"append_paged_kv_cache {dt} {layout} {form} {num_reqs}x{append_len} tokens "
        f"(ctx {ctx_len}), {heads}x{dim}, page {page_size}" + (f" ({note})" if note else ""),
        lambda: flashinfer.append_paged_kv_cache(key, value, bi, pos, cache, kv_indices,
                                                 kv_indptr, last, layout),
        bytes_moved=2 * rows + meta)


def _indices(num_reqs, append_len):
    append_indptr = torch.arange(0, num_reqs * append_len + 1, append_len, dtype=torch.int32,
                                 device="cuda")
    seq = torch.full((num_reqs,), 4096, dtype=torch.int32, device="cuda")
    nnz = num_reqs * append_len
    bi = torch.empty(nnz, dtype=torch.int32, device="cuda")
    pos = torch.empty(nnz, dtype=torch.int32, device="cuda")
    return Case(
        f"get_batch_indices_positions {num_reqs} requests x {append_len}",
        lambda: flashinfer.get_batch_indices_positions(append_indptr, seq, nnz, bi, pos),
        bytes_moved=8 * nnz + 4 * (2 * num_reqs + 1))


def cases() -> list[Case]:
    return [
        _append(16, 1024, 1024, "NHD"),  # prefill: 16384 tokens
        _append(16, 1024, 1024, "HND"),
        _append(16, 1024, 1024, "NHD", form="tuple", note="V rows strided"),
        _append(16, 1024, 1024, "NHD", dtype=torch.float8_e4m3fn),
        _append(256, 1, 4096, "NHD"),  # decode
        _append(256, 1, 4096, "HND"),
        _append(1, 16384, 16384, "NHD", page_size=1),
        _indices(16, 1024),
        _indices(256, 1),
    ]

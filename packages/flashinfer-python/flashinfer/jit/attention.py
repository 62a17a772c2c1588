"""Build specs of the attention modules: one module per :class:`AttentionVariant`.

A variant is everything that changes the compiled kernel (dtypes, head dims, mask mode, position
encoding, paged or ragged KV); its fields become ``-DFI_*`` flags of ``csrc/attention.cu``, and
its name (and so the module's URI) spells each of them. Runtime choices (sm_scale, soft cap,
sliding window, RoPE scale/theta) are kernel arguments and cost no extra module.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

from .core import SM80_AND_NEWER, JitSpec

DTYPE_CODES = {"float16": 0, "bfloat16": 1}
DTYPE_SHORT = {"float16": "f16", "bfloat16": "bf16"}
# K/V may also be fp8 (converted in the kernel: in registers on the decode shapes at head_dim
# 128, to q's dtype in shared memory elsewhere).
KV_DTYPE_CODES = {**DTYPE_CODES, "float8_e4m3fn": 2, "float8_e5m2": 3}
KV_DTYPE_SHORT = {**DTYPE_SHORT, "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
MASK_MODES = {"none": 0, "causal": 1, "custom": 2}
POS_ENCODINGS = {"NONE": 0, "ROPE_LLAMA": 1, "ALIBI": 2}
#: Head dims of q, k, v and the output alike.
HEAD_DIMS = (64, 128, 256, 512)
#: (head_dim_qk, head_dim_vo) pairs whose v and output are narrower than q and k: DeepSeek-style
#: MLA prefill (192 = 128 no-RoPE + 64 RoPE channels; v 128), which vLLM and SGLang run through
#: the ragged and paged prefill wrappers.
HEAD_DIM_PAIRS = ((192, 128),)


def check_head_dims(head_dim_qk: int, head_dim_vo: Optional[int] = None) -> int:
    """``head_dim_vo`` (None: ``head_dim_qk``) once the pair is one a kernel exists for, else
    ``ValueError`` naming the supported head dims."""
    vo = head_dim_qk if head_dim_vo is None else head_dim_vo
    if (head_dim_qk in HEAD_DIMS and vo == head_dim_qk) or (head_dim_qk, vo) in HEAD_DIM_PAIRS:
        return vo
    pairs = ", ".join(f"{qk}/{v}" for qk, v in HEAD_DIM_PAIRS)
    if head_dim_vo is None or (head_dim_qk not in HEAD_DIMS
                               and head_dim_qk not in dict(HEAD_DIM_PAIRS)):
        raise ValueError(f"head_dim must be one of {HEAD_DIMS} (or head_dim_qk/head_dim_vo "
                         f"{pairs}), got {head_dim_qk}")
    raise ValueError(f"head_dim_vo must equal head_dim_qk ({head_dim_qk}) or form one of the "
                     f"pairs head_dim_qk/head_dim_vo {pairs}, got {head_dim_vo}")


#: (head_dim_qk, head_dim_vo) pairs the Hopper kernel (``backend="fa3"``) takes.
SM90_HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (192, 128))


#: Head dims an fp8 K/V cache is supported at (with head_dim_vo = head_dim: the kernel converts
#: K and V tiles of one width; include/flashinfer/attention/prefill.cuh asserts it).
FP8_KV_HEAD_DIMS = (64, 128, 256)


def check_fp8_head_dims(dtype_kv: str, head_dim_qk: int, head_dim_vo: int) -> None:
    """``NotImplementedError`` for an fp8 K/V cache at head dims the kernel lacks (512, 192 /
    128): an fp8 cache takes ``FP8_KV_HEAD_DIMS`` with v's head dim equal to k's."""
    if dtype_kv.startswith("float8") and (head_dim_qk not in FP8_KV_HEAD_DIMS
                                          or head_dim_vo != head_dim_qk):
        raise NotImplementedError(
            f"an fp8 KV cache ({dtype_kv}) takes head_dim {FP8_KV_HEAD_DIMS} with head_dim_vo "
            f"equal to head_dim; got head_dim {head_dim_qk}, head_dim_vo {head_dim_vo}")


@dataclass(frozen=True)
class AttentionVariant:
    """One compiled specialization of the tensor-core attention kernel.

    Attributes
    ----------
    dtype_q : str
        ``"float16"`` or ``"bfloat16"``: q (and k, v unless ``dtype_kv`` says otherwise).
    dtype_o : str
        Output dtype, ``"float16"`` or ``"bfloat16"``.
    head_dim : int
        q and k head dim: one of ``HEAD_DIMS``, or the first of a ``HEAD_DIM_PAIRS`` pair.
    mask_mode : str
        ``"none"``, ``"causal"`` (bottom-right aligned) or ``"custom"`` (packed bit mask).
    pos_encoding : str
        ``"NONE"``, ``"ROPE_LLAMA"`` (in-kernel RoPE on q and k) or ``"ALIBI"``.
    paged : bool
        Paged KV cache (else ragged: one contiguous run of tokens per request).
    dtype_kv : str, optional
        k and v: ``dtype_q`` (None is normalized to it), ``"float8_e4m3fn"`` or
        ``"float8_e5m2"`` (fp8: at head_dim 64, 128 and 256 with ``head_dim_vo`` equal).
    head_dim_vo : int, optional
        v and output head dim (None: ``head_dim``); differs only in a ``HEAD_DIM_PAIRS`` pair.
    """

    dtype_q: str
    dtype_o: str
    head_dim: int
    mask_mode: str = "none"
    pos_encoding: str = "NONE"
    paged: bool = True
    dtype_kv: Optional[str] = None
    head_dim_vo: Optional[int] = None

    def __post_init__(self) -> None:
        if self.dtype_kv is None:
            object.__setattr__(self, "dtype_kv", self.dtype_q)
        if self.dtype_kv not in (self.dtype_q, "float8_e4m3fn", "float8_e5m2"):
            raise ValueError(f"dtype_kv must be dtype_q ({self.dtype_q!r}), 'float8_e4m3fn' or "
                             f"'float8_e5m2', got {self.dtype_kv!r}")
        for field, value, allowed in (
            ("dtype_q", self.dtype_q, DTYPE_CODES),
            ("dtype_o", self.dtype_o, DTYPE_CODES),
            ("mask_mode", self.mask_mode, MASK_MODES),
            ("pos_encoding", self.pos_encoding, POS_ENCODINGS),
        ):
            if value not in allowed:
                raise ValueError(f"{field} must be one of {sorted(allowed)}, got {value!r}")
        object.__setattr__(self, "head_dim_vo", check_head_dims(self.head_dim, self.head_dim_vo))
        check_fp8_head_dims(self.dtype_kv, self.head_dim, self.head_dim_vo)

    @property
    def name(self) -> str:
        kv = "" if self.dtype_kv == self.dtype_q else f"_kv{KV_DTYPE_SHORT[self.dtype_kv]}"
        return (
            f"attention_{'paged' if self.paged else 'ragged'}_{DTYPE_SHORT[self.dtype_q]}{kv}"
            f"_o{DTYPE_SHORT[self.dtype_o]}_d{self.head_dim}_{self.mask_mode}"
            f"_{self.pos_encoding.lower()}"
            + (f"_vo{self.head_dim_vo}" if self.head_dim_vo != self.head_dim else "")
        )

    @property
    def has_sm90(self) -> bool:
        """Whether the module holds the Hopper kernel (CTA shape 3): head_dim 64, 128 or 256 (v's
        the same) or 192 / 128, no in-kernel RoPE: ``kHasSm90`` of
        include/flashinfer/attention/launch.cuh, which a compiled module answers through
        ``cta_tile_q(3)`` (tests/test_package_layout.py holds the two together). Not for fp8
        K/V (launch.cuh says why) nor head_dim 512 (its O would be 256 registers per thread:
        prefill_sm90.cuh)."""
        heads = (self.head_dim, self.head_dim_vo)
        return (heads in SM90_HEAD_DIMS and self.pos_encoding != "ROPE_LLAMA"
                and self.dtype_kv == self.dtype_q)

    def spec(self) -> JitSpec:
        flags = (
            f"-DFI_DTYPE_Q={DTYPE_CODES[self.dtype_q]}",
            f"-DFI_DTYPE_KV={KV_DTYPE_CODES[self.dtype_kv]}",
            f"-DFI_DTYPE_O={DTYPE_CODES[self.dtype_o]}",
            f"-DFI_HEAD_DIM={self.head_dim}",
            f"-DFI_HEAD_DIM_VO={self.head_dim_vo}",
            f"-DFI_MASK_MODE={MASK_MODES[self.mask_mode]}",
            f"-DFI_POS_ENCODING={POS_ENCODINGS[self.pos_encoding]}",
            f"-DFI_PAGED={int(self.paged)}",
        )
        return JitSpec(name=self.name, sources=("attention.cu",), extra_cuda_cflags=flags,
                       supported_major_versions=SM80_AND_NEWER,
                       precompiled=self in _precompiled())


def extra_variants() -> list[AttentionVariant]:
    """Custom masks and in-kernel position encodings at head_dim 128 (fp16 and bf16)."""
    out = []
    for dtype in ("float16", "bfloat16"):
        for paged in (True, False):
            out.append(AttentionVariant(dtype, dtype, 128, "custom", "NONE", paged))
            for pos in ("ROPE_LLAMA", "ALIBI"):
                for mask in ("none", "causal"):
                    out.append(AttentionVariant(dtype, dtype, 128, mask, pos, paged))
    return out


def common_variants() -> list[AttentionVariant]:
    """The specializations worth precompiling: fp16/bf16, head_dim 64/128/256, paged decode and
    prefill (no mask and causal) and ragged prefill, no in-kernel position encoding."""
    out = []
    for dtype in ("float16", "bfloat16"):
        for head_dim in (64, 128, 256):
            for paged in (True, False):
                for mask in ("none", "causal"):
                    out.append(AttentionVariant(dtype, dtype, head_dim, mask, "NONE", paged))
    return out


def custom_mask_variants() -> list[AttentionVariant]:
    """Custom (packed bit) masks at head_dim 64 and 256, both dtypes, paged and ragged: tree
    masks of speculative decoding on models of those head dims (Gemma: 256; small Llamas: 64).
    head_dim 128 is among ``extra_variants``. In-kernel RoPE and ALiBi stay at head_dim 128
    (docs/wheels.md, "What the released set covers without nvcc")."""
    return [AttentionVariant(dtype, dtype, head_dim, "custom", "NONE", paged)
            for dtype in ("float16", "bfloat16") for head_dim in (64, 256)
            for paged in (True, False)]


def wide_head_variants() -> list[AttentionVariant]:
    """head_dim 512 (Gemma-style global layers: decode and prefill) and 192 / 128 (MLA prefill),
    fp16/bf16, paged and ragged, no mask and causal: what the engines run at these head dims."""
    return [AttentionVariant(dtype, dtype, qk, mask, "NONE", paged, head_dim_vo=vo)
            for qk, vo in ((512, 512), *HEAD_DIM_PAIRS) for dtype in ("float16", "bfloat16")
            for paged in (True, False) for mask in ("none", "causal")]


def fp8_kv_variants() -> list[AttentionVariant]:
    """fp8-e4m3 KV caches at head_dim 128 under fp16 and bf16 q: paged decode and prefill (no
    mask and causal) and ragged prefill, no in-kernel position encoding (vLLM's and SGLang's
    ``kv_cache_dtype=fp8``)."""
    return [AttentionVariant(dtype, dtype, 128, mask, "NONE", paged, "float8_e4m3fn")
            for dtype in ("float16", "bfloat16") for paged in (True, False)
            for mask in ("none", "causal")]


def precompiled_variants() -> list[AttentionVariant]:
    """Every variant the flashinfer-jit-cache wheel holds (docs/wheels.md, "What the released
    set covers without nvcc"), in a stable order."""
    return (common_variants() + extra_variants() + custom_mask_variants() + wide_head_variants()
            + fp8_kv_variants())


@functools.cache
def _precompiled() -> frozenset:
    return frozenset(precompiled_variants())

"""``flashinfer.sampling``: sampling from probabilities and logits with top-p / top-k / min-p
filters, the filters' renormalizations, softmax and chain speculative sampling.

Each row is handled by a thread-block cluster that reads it from HBM once into shared memory;
thresholds come from an exact radix select (top-p sampling first tries candidates drawn from the
whole row, kept when inside the top-p set) and the draw from 64-bit fixed-point masses, so every
op is deterministic (``deterministic`` / ``is_deterministic`` may be False; results are the same).
RNG is Philox: ``seed`` and ``offset`` given as ints or int64/uint64 device tensors of length 1
or batch, or read from ``generator`` (default: the device's default CUDA generator), whose
offset then advances by the op's increment rounded up to 4 (``B`` for sampling/min-p, ``32 B``
for top-p/top-k/top-k-top-p, ``B V`` for sampling from logits, ``b (n + 1)`` for chain
speculative sampling). Nothing synchronizes with the host unless ``check_nan=True``, so every op
can be captured in a CUDA graph; during capture (where torch refuses to read a generator's
offset) the kernel reads the generator's graph-safe state as torch's own kernels do, so each
replay samples anew. ``seed``/``offset`` tensors are read by the kernel, so they can change
between replays.
"""

from __future__ import annotations

import functools
import numbers
import warnings
from typing import Optional, Union

import torch

from . import knobs
from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check_cuda, check_dtype, check_tensor, resolve_pdl
from .api_logging import flashinfer_api
from .jit.sampling import gen_sampling_module
from .jit.torch_rng import gen_torch_rng_module

__all__ = [
    "softmax",
    "sampling_from_probs",
    "sampling_from_logits",
    "top_p_sampling_from_probs",
    "top_k_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_k_top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_p_renorm_probs",
    "top_k_renorm_probs",
    "top_k_mask_logits",
    "chain_speculative_sampling",
    "top_p_renorm_prob",
    "top_k_renorm_prob",
]

# The kernel's filters and transforms (include/flashinfer/sampling.cuh).
_NO_FILTER, _TOP_P, _TOP_K, _MIN_P, _JOINT, _TOP_K_FIRST = range(6)
_SOFTMAX, _TOP_P_RENORM, _TOP_K_RENORM, _TOP_K_MASK = range(4)
#: Largest vocabulary: 16 CTAs of 200 KB of float32 each.
MAX_VOCAB = 16 * 200 * 1024 // 4
_INT32_MAX = 2**31 - 1

Param = Union[float, int, torch.Tensor]


@functools.cache
def get_sampling_module():
    return gen_sampling_module().build_and_load()


@functools.cache
def _device_info(device_index: int) -> tuple[bool, int]:
    """(thread-block clusters available (SM90+), SM count)."""
    props = torch.cuda.get_device_properties(device_index)
    return props.major >= 9, props.multi_processor_count


def _scratch(device: torch.device, rows: int, vocab: int) -> Optional[torch.Tensor]:
    """None: one thread-block cluster per row (SM90+). Else (SM80/89, or
    FLASHINFER_SAMPLING_NO_CLUSTER) the float32 scratch of the one-CTA-per-row path: a row per
    CTA, rows padded to 4 floats; the kernel runs once per scratch-full of rows (at least 2 per
    SM, or 2^24 floats' worth)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    clusters, sms = _device_info(index)
    if clusters and not knobs.sampling.no_cluster:
        return None
    width = (vocab + 3) // 4 * 4
    n = max(1, min(rows, max(2 * sms, (1 << 24) // width)))
    return torch.empty(n, width, dtype=torch.float32, device=device)


# ---------------------------------------------------------------------------------------------
# Argument checks (all on the host, before any compile or launch)


def _check_rows(x: torch.Tensor, name: str) -> None:
    check_tensor(x, name)
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (batch_size, vocab_size), got shape {tuple(x.shape)}")
    check_dtype(x, name, FLOAT_DTYPES)
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides {x.stride()}")
    if not 1 <= x.shape[1] <= MAX_VOCAB:
        raise ValueError(f"{name}.shape[1] (vocab_size) must be in [1, {MAX_VOCAB}], got {x.shape[1]}")


def _param(x: Param, name: str, batch: int, device: torch.device, integer: bool):
    """(tensor or None, scalar) for the kernel; the contract's texts for bad tensors."""
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            raise ValueError(
                "Expected a 1D tensor of shape (batch_size,) or scalar for the sampling parameter, "
                "but got a 0-dimensional tensor."
            )
        if x.dim() > 1:
            raise ValueError(
                f"Expected a 1D tensor or scalar for the sampling parameter, but got a {x.dim()}D "
                "tensor."
            )
        if x.shape[0] != batch:
            raise ValueError(
                f"Sampling parameter tensor batch size mismatch: {name} has length {x.shape[0]}, "
                f"expected {batch} (the batch size)."
            )
        if x.device != device:
            raise ValueError(f"{name} must be on {device} like the input, got {x.device}")
        if integer:
            if x.dtype.is_floating_point or x.dtype == torch.bool:
                raise ValueError(f"{name} must be an integer tensor, got {x.dtype}")
            t = x.clamp(max=_INT32_MAX).to(torch.int32) if x.dtype == torch.int64 else x.to(torch.int32)
        else:
            t = x.to(torch.float32)  # integer top_p tensors are cast to float
        return t.contiguous(), 0
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name} must be a number or a 1-D tensor, got {type(x).__name__}")
    return None, x


def _check_top_p(top_p):
    if not isinstance(top_p, torch.Tensor) and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def _check_top_k(top_k):
    if not isinstance(top_k, torch.Tensor):
        if int(top_k) != top_k:
            raise ValueError(f"top_k must be an integer, got {top_k}")
        if top_k <= 0:
            raise ValueError(f"top_k must be positive, got {top_k}")


def _check_indices(indices: Optional[torch.Tensor], device: torch.device) -> None:
    if indices is None:
        return
    check_tensor(indices, "indices")
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    check_dtype(indices, "indices", INDEX_DTYPES)
    if indices.device != device:
        raise ValueError(f"indices must be on {device} like the input, got {indices.device}")


def _check_rng(seed, offset, device: torch.device, batch: int) -> bool:
    """True when seed and offset are both given (and valid); False: both come from a generator."""
    if seed is None or offset is None:
        return False
    if isinstance(seed, torch.Tensor) and isinstance(offset, torch.Tensor):
        for name, t in (("seed", seed), ("offset", offset)):
            if t.dim() != 1 or t.shape[0] not in (1, batch):
                raise ValueError(f"{name} must be a 1-D tensor of length 1 or {batch}, got shape "
                                 f"{tuple(t.shape)}")
            if t.dtype not in (torch.int64, torch.uint64):
                raise ValueError(f"{name} must be int64 or uint64, got {t.dtype}")
            if t.device != device:
                raise ValueError(f"{name} must be on {device} like the input, got {t.device}")
        return True
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (seed, offset)):
        raise ValueError(
            "seed and offset must be both ints or both int64/uint64 1-D tensors on the input's "
            f"device, got {type(seed).__name__} and {type(offset).__name__}"
        )
    return True


def _rng(generator, seed, offset, increment: int, device: torch.device):
    """(seed int, offset int, seed tensor or None, offset tensor or None) of this call; checked
    by _check_rng first. From a generator: its (seed, offset), then the offset advances by the
    increment rounded up to 4. Host-side state only: no device synchronization."""
    if seed is not None and offset is not None:
        if isinstance(seed, torch.Tensor):
            return 0, 0, seed.contiguous(), offset.contiguous()
        return _i64(seed), _i64(offset), None, None
    if generator is None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        generator = torch.cuda.default_generators[index]
    step = (increment + 3) // 4 * 4
    if torch.cuda.is_current_stream_capturing():
        return _captured_rng(generator, step, device)
    s, o = generator.initial_seed(), generator.get_offset()
    generator.set_offset(o + step)
    return _i64(s), _i64(o), None, None


def _captured_rng(generator, increment: int, device: torch.device):
    """_rng during CUDA-graph capture, where torch refuses to read a generator's offset: the
    generator's graph-safe state, as torch's own kernels take it (the graph's seed and offset
    tensors, which torch sets before each replay, and the offset within the graph), so every
    replay draws anew and the graph holds no extra node. The default generator is registered
    with every capture; torch requires a custom one to be registered with the graph."""
    op = _graph_philox()
    if isinstance(op, Exception):
        # No compiler or no JIT (jit-cache users): a node drawing (seed, offset) on the device
        # instead, ~8-10 us more per op in a graph (H100; record ...-sampling-seedless-capture).
        _warn_no_graph_philox(str(op))
        t = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, device=device,
                          generator=generator)
        return 0, 0, t[:1], t[1:]
    seed, offset, intragraph = op(generator, increment)
    return 0, _i64(intragraph), seed, offset


@functools.cache
def _graph_philox():
    """torch's graph-safe Philox state as an op (csrc/torch_rng.cc), or why it can't load."""
    try:
        gen_torch_rng_module().build_and_load().register_ops()
        return torch.ops.flashinfer_rng.graph_philox
    except (OSError, RuntimeError) as e:  # JitError is a RuntimeError
        return e


@functools.cache
def _warn_no_graph_philox(error: str) -> None:
    warnings.warn(f"flashinfer.sampling: torch's graph-safe RNG state is unavailable ({error}); "
                  "seedless sampling ops captured in a CUDA graph draw their seed and offset in "
                  "an extra graph node", RuntimeWarning, stacklevel=4)


def _i64(v: int) -> int:
    """A 64-bit pattern as the signed int the binding takes."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


# ---------------------------------------------------------------------------------------------
# The shared driver of every sampling op


def _sample(probs, indices, filter_, logits, increment_per_row, generator, check_nan, seed,
            offset, return_valid, *, top_p=0.0, top_k=0, min_p=0.0):
    name = "logits" if logits else "probs"
    _check_rows(probs, name)
    device = probs.device
    _check_indices(indices, device)
    batch = indices.shape[0] if indices is not None else probs.shape[0]
    top_p_t, top_p_v = _param(top_p, "top_p", batch, device, integer=False)
    top_k_t, top_k_v = _param(top_k, "top_k", batch, device, integer=True)
    min_p_t, min_p_v = _param(min_p, "min_p", batch, device, integer=False)
    top_k_v = min(int(top_k_v), _INT32_MAX)
    _check_rng(seed, offset, device, batch)
    check_cuda(probs, name)
    if check_nan and bool(torch.isnan(probs).any()):
        raise ValueError(f"Input {name} contains NaN.")
    s, o, s_t, o_t = _rng(generator, seed, offset, increment_per_row * batch, device)
    out = torch.empty(batch, dtype=indices.dtype if indices is not None else torch.int32,
                      device=device)
    valid = torch.empty(batch, dtype=torch.bool, device=device) if return_valid else None
    get_sampling_module().sample(
        out, valid, probs, indices, filter_, logits, top_p_t, float(top_p_v), top_k_t, top_k_v,
        min_p_t, float(min_p_v), s_t, o_t, s, o, _scratch(device, batch, probs.shape[1]),
        resolve_pdl(None, device),
    )
    return (out, valid) if return_valid else out


_FILTER_ORDER = {"top_k_first": _TOP_K_FIRST, "joint": _JOINT}


def _filter_order(filter_apply_order: str) -> int:
    if filter_apply_order not in _FILTER_ORDER:
        raise ValueError(
            f"filter_apply_order must be 'top_k_first' or 'joint', got {filter_apply_order!r}"
        )
    return _FILTER_ORDER[filter_apply_order]


# ---------------------------------------------------------------------------------------------
# Public ops


@flashinfer_api
def softmax(logits: torch.Tensor, temperature: Optional[Param] = None,
            enable_pdl: Optional[bool] = None) -> torch.Tensor:
    r"""Row softmax with an optional temperature: ``softmax(logits / temperature)``.

    Parameters
    ----------
    logits : torch.Tensor
        ``(batch_size, vocab_size)``, float32/float16/bfloat16; ``-inf`` allowed.
    temperature : float or torch.Tensor, optional
        A positive float, or a ``(batch_size,)`` tensor of per-row temperatures; None is 1.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+. Never changes results.

    Returns
    -------
    torch.Tensor
        float32 ``(batch_size, vocab_size)`` probabilities.
    """
    _check_rows(logits, "logits")
    temp = 1.0 if temperature is None else temperature
    temp_t, temp_v = _param(temp, "temperature", logits.shape[0], logits.device, integer=False)
    if temp_t is None and not temp_v > 0:
        raise ValueError(f"temperature must be positive, got {temp_v}")
    check_cuda(logits, "logits")
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    get_sampling_module().transform(out, logits, _SOFTMAX, None, 0.0, None, 0, temp_t,
                                    float(temp_v), _scratch(logits.device, *logits.shape),
                                    resolve_pdl(enable_pdl, logits.device))
    return out


@flashinfer_api
def sampling_from_probs(probs, indices=None, deterministic=True, generator=None, check_nan=False,
                        seed=None, offset=None, return_valid=False):
    r"""Draw one token per row from ``probs`` (``(batch_size, vocab_size)``; negative entries
    count as 0). ``indices[i] = j`` makes output ``i`` draw from row ``j``.

    Returns int32 ``(batch,)`` samples (``indices.dtype`` when given), and with
    ``return_valid=True`` also a bool ``(batch,)``: False for a row with a NaN (sample 0).
    """
    return _sample(probs, indices, _NO_FILTER, False, 1, generator, check_nan, seed, offset,
                   return_valid)


@flashinfer_api
def sampling_from_logits(logits, indices=None, deterministic=True, generator=None,
                         check_nan=False, seed=None, offset=None):
    r"""Draw one token per row from ``softmax(logits)`` (computed in the kernel, one read of the
    logits). The generator's offset advances by ``batch * vocab_size``."""
    return _sample(logits, indices, _NO_FILTER, True, logits.shape[-1] if logits.dim() == 2 else 1,
                   generator, check_nan, seed, offset, False)


@flashinfer_api
def top_p_sampling_from_probs(probs, top_p, indices=None, deterministic=True, generator=None,
                              check_nan=False, seed=None, offset=None, return_valid=False):
    r"""Draw from the smallest set of most probable tokens whose mass exceeds ``top_p`` of the
    row's (sort ascending, keep ``cdf >= 1 - top_p``; ties at the threshold are all kept).
    ``top_p``: float in (0, 1] or a ``(batch,)`` tensor."""
    _check_top_p(top_p)
    return _sample(probs, indices, _TOP_P, False, 32, generator, check_nan, seed, offset,
                   return_valid, top_p=top_p)


@flashinfer_api
def top_k_sampling_from_probs(probs, top_k, indices=None, deterministic=True, generator=None,
                              check_nan=False, seed=None, offset=None, return_valid=False):
    r"""Draw from the ``top_k`` most probable tokens (ties with the k-th are kept; ``top_k >=
    vocab_size`` keeps all). ``top_k``: positive int or a ``(batch,)`` integer tensor."""
    _check_top_k(top_k)
    return _sample(probs, indices, _TOP_K, False, 32, generator, check_nan, seed, offset,
                   return_valid, top_k=top_k)


@flashinfer_api
def min_p_sampling_from_probs(probs, min_p, indices=None, deterministic=True, generator=None,
                              check_nan=False, seed=None, offset=None, return_valid=False):
    r"""Draw from the tokens with ``p >= min_p * max(p)``. ``min_p``: float in [0, 1] or a
    ``(batch,)`` tensor."""
    if not isinstance(min_p, torch.Tensor) and not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    return _sample(probs, indices, _MIN_P, False, 1, generator, check_nan, seed, offset,
                   return_valid, min_p=min_p)


@flashinfer_api
def top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices=None,
                                    filter_apply_order="top_k_first", deterministic=True,
                                    generator=None, check_nan=False, seed=None, offset=None,
                                    return_valid=False):
    r"""Top-k and top-p together. ``"top_k_first"``: top-k, then top-p on the renormalized top-k
    set; ``"joint"``: the tokens both filters keep on the original distribution."""
    order = _filter_order(filter_apply_order)
    _check_top_k(top_k)
    _check_top_p(top_p)
    return _sample(probs, indices, order, False, 32, generator, check_nan, seed, offset,
                   return_valid, top_p=top_p, top_k=top_k)


@flashinfer_api
def top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None,
                                     filter_apply_order="top_k_first", deterministic=True,
                                     generator=None, check_nan=False, seed=None, offset=None):
    r"""``top_k_top_p_sampling_from_probs(torch.softmax(logits, -1), ...)``: the same draws and
    the same RNG consumption (``32 * batch``) as the probs path, bit for bit."""
    _filter_order(filter_apply_order)
    _check_rows(logits, "logits")
    _check_top_k(top_k)
    _check_top_p(top_p)
    _check_indices(indices, logits.device)
    batch = indices.shape[0] if indices is not None else logits.shape[0]
    _param(top_k, "top_k", batch, logits.device, integer=True)
    _param(top_p, "top_p", batch, logits.device, integer=False)
    _check_rng(seed, offset, logits.device, batch)
    check_cuda(logits, "logits")
    probs = torch.softmax(logits, dim=-1)
    return top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices, filter_apply_order,
                                           deterministic, generator, check_nan, seed, offset)


def _transform(x, kind, name, *, top_p=0.0, top_k=0, out_dtype=None):
    _check_rows(x, name)
    top_p_t, top_p_v = _param(top_p, "top_p", x.shape[0], x.device, integer=False)
    top_k_t, top_k_v = _param(top_k, "top_k", x.shape[0], x.device, integer=True)
    check_cuda(x, name)
    out = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    get_sampling_module().transform(out, x, kind, top_p_t, float(top_p_v), top_k_t,
                                    min(int(top_k_v), _INT32_MAX), None, 1.0,
                                    _scratch(x.device, *x.shape), resolve_pdl(None, x.device))
    return out


@flashinfer_api
def top_p_renorm_probs(probs: torch.Tensor, top_p: Param, is_deterministic: bool = False):
    r"""Keep the top-p set (as in :func:`top_p_sampling_from_probs`) renormalized to sum 1, zero
    the rest. Returns float32 ``(batch_size, vocab_size)``."""
    _check_top_p(top_p)
    return _transform(probs, _TOP_P_RENORM, "probs", top_p=top_p, out_dtype=torch.float32)


@flashinfer_api
def top_k_renorm_probs(probs: torch.Tensor, top_k: Param):
    r"""Keep the ``top_k`` largest probabilities (ties kept) renormalized to sum 1, zero the
    rest. Returns ``probs.dtype``."""
    _check_top_k(top_k)
    return _transform(probs, _TOP_K_RENORM, "probs", top_k=top_k)


@flashinfer_api
def top_k_mask_logits(logits: torch.Tensor, top_k: Param):
    r"""Keep the ``top_k`` largest logits (ties kept), set the rest to ``-inf``. Returns
    ``logits.dtype``."""
    _check_top_k(top_k)
    return _transform(logits, _TOP_K_MASK, "logits", top_k=top_k)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs


def _check_counter(t, name, batch, device):
    if t is None:
        return torch.zeros(batch, dtype=torch.int32, device=device)
    check_tensor(t, name)
    if tuple(t.shape) != (batch,) or t.dtype != torch.int32:
        raise ValueError(f"{name} must be an int32 tensor of shape ({batch},), got {t.dtype} "
                         f"{tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    return t


@flashinfer_api
def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs,
                               maybe_output_accepted_token_num=None,
                               maybe_output_emitted_draft_token_num=None, deterministic=True,
                               generator=None, seed=None, offset=None):
    r"""Speculative sampling over a chain of ``n`` draft tokens.

    Draft token ``i`` is accepted when ``u * q_i < p_i`` (``u`` uniform, ``q``/``p`` its draft and
    target probabilities); after the accepted prefix comes one token drawn from
    ``relu(target - draft)`` at the first rejection, or from ``target[n]`` (the bonus) when all
    are accepted, then ``-1``.

    Parameters
    ----------
    draft_probs : torch.Tensor
        float32 ``(b, n, vocab_size)``.
    draft_token_ids : torch.Tensor
        int32/int64 ``(b, n)``.
    target_probs : torch.Tensor
        float32 ``(b, n + 1, vocab_size)``.
    maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num : torch.Tensor, optional
        int32 ``(b,)`` counters, **added to** in place: drafts that would pass independently, and
        the accepted prefix's length.

    Returns
    -------
    (torch.Tensor, torch.Tensor, torch.Tensor)
        int32 ``(b, n + 1)`` output ids, and the two counters.
    """
    for name, t in (("draft_probs", draft_probs), ("draft_token_ids", draft_token_ids),
                    ("target_probs", target_probs)):
        check_tensor(t, name)
    if draft_probs.dim() != 3:
        raise ValueError(f"draft_probs must be 3-D (b, n, vocab_size), got shape "
                         f"{tuple(draft_probs.shape)}")
    b, n, vocab = draft_probs.shape
    if tuple(target_probs.shape) != (b, n + 1, vocab):
        raise ValueError(f"target_probs must have shape {(b, n + 1, vocab)}, got "
                         f"{tuple(target_probs.shape)}")
    if tuple(draft_token_ids.shape) != (b, n):
        raise ValueError(f"draft_token_ids must have shape {(b, n)}, got "
                         f"{tuple(draft_token_ids.shape)}")
    for name, t in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        check_dtype(t, name, (torch.float32,))
        if t.stride(-1) != 1 and vocab > 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    check_dtype(draft_token_ids, "draft_token_ids", INDEX_DTYPES)
    if not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(f"vocab_size must be in [1, {MAX_VOCAB}], got {vocab}")
    device = draft_probs.device
    for name, t in (("draft_token_ids", draft_token_ids), ("target_probs", target_probs)):
        if t.device != device:
            raise ValueError(f"{name} must be on {device} like draft_probs, got {t.device}")
    accepted = _check_counter(maybe_output_accepted_token_num, "maybe_output_accepted_token_num",
                              b, device)
    emitted = _check_counter(maybe_output_emitted_draft_token_num,
                             "maybe_output_emitted_draft_token_num", b, device)
    _check_rng(seed, offset, device, b)
    check_cuda(draft_probs, "draft_probs")
    s, o, s_t, o_t = _rng(generator, seed, offset, b * (n + 1), device)
    ids = draft_token_ids.to(torch.int32)
    out = torch.empty(b, n + 1, dtype=torch.int32, device=device)
    get_sampling_module().chain_speculative(out, accepted, emitted, draft_probs, ids, target_probs,
                                            s_t, o_t, s, o, _scratch(device, b, vocab),
                                            resolve_pdl(None, device))
    return out, accepted, emitted

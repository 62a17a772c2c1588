"""The benchmark CLI's routines (benchmarks/flashinfer_benchmark.py): one per public op or
wrapper, each building its inputs from the command line's flags and returning, per backend, a
zero-argument call, plus the float32 reference the refcheck compares against and the traffic /
arithmetic the ceilings are taken against.

Ours: ``fa2``, ``fa3``, ``auto`` (attention wrappers' ``backend=``), ``cubin`` (norm and
activation's kernel binaries), ``cuda`` (our default kernel, as upstream names it; = ``auto``).
Baselines: ``torch`` (a pure-PyTorch implementation: the op's trace-template reference, or
SDPA's math backend for attention), ``cudnn`` and ``flash`` (attention through
``torch.nn.functional.scaled_dot_product_attention`` under the matching ``sdpa_kernel``).

Importing this module needs neither a GPU nor flashinfer's kernels: the registry (names, flags,
covered ops, backends) is plain data; ``build`` is what touches the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

OURS = ("auto", "fa2", "fa3", "cubin", "cuda")
BASELINES = ("torch", "cudnn", "flash")
ATTN_BACKENDS = ("fa2", "fa3", "auto", "cudnn", "flash", "torch")
KERNEL_BACKENDS = ("cuda", "auto", "cubin", "torch")  # ops with backend="auto"|"cubin"
PLAIN_BACKENDS = ("cuda", "auto", "torch")


@dataclass
class Built:
    """A routine's inputs on the device: the calls to time and how to check them."""

    fns: Dict[str, Callable[[], Any]]  # backend -> one call
    reference: Callable[[], Any]  # float32 math, the refcheck's truth
    check: Callable[[Any, Any], Tuple[bool, float, str]]  # (out, ref) -> ok, max err, note
    bytes: int = 0
    flops: float = 0.0
    ceiling: str = "copy"
    shape: str = ""
    dtype: str = ""
    skipped: Dict[str, str] = field(default_factory=dict)  # backend -> why it cannot run
    no_graph: Tuple[str, ...] = ()  # backends timed without CUDA graphs (their calls sync)


@dataclass(frozen=True)
class Routine:
    name: str
    group: str  # attention, norm, activation, rope, cascade, page, sampling, topk, misc
    ops: Tuple[str, ...]  # the public names this routine measures
    backends: Tuple[str, ...]
    default_backends: Tuple[str, ...]
    build: Callable[[Any, Sequence[str]], Built]
    needs: Tuple[str, ...] = ()  # a module that must exist (flashinfer.sampling, ...)


ROUTINES: Dict[str, Routine] = {}


def _register(name, group, ops, backends, default, build, needs=()):
    ROUTINES[name] = Routine(name, group, tuple(ops), tuple(backends), tuple(default), build,
                             tuple(needs))


# --------------------------------------------------------------------------------------------
# helpers (torch imported lazily: listing routines needs no torch)
# --------------------------------------------------------------------------------------------


DEVICE = "cuda"  # tests build the routines' baselines and references on "cpu"


def _torch():
    import torch

    return torch


def dtype_of(name: str):
    torch = _torch()
    table = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
             "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
    if name not in table:
        raise ValueError(f"dtype must be one of {sorted(table)}, got {name!r}")
    return table[name]


def _tolerance(dtype) -> Tuple[float, float]:
    torch = _torch()
    if dtype in (torch.float16,):
        return 1e-2, 1e-2
    if dtype in (torch.bfloat16,):
        return 2e-2, 2e-2
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return 1e-1, 1e-1
    return 1e-4, 1e-4


def _flat(x: Any) -> List[Any]:
    if x is None:
        return []
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _flat(item)]
    return [x]


def close_check(rtol_atol: Optional[Tuple[float, float]] = None):
    """Every tensor of the output is allclose to the reference's (float32 comparison)."""

    def check(out: Any, ref: Any) -> Tuple[bool, float, str]:
        torch = _torch()
        outs, refs = _flat(out), _flat(ref)
        if len(outs) != len(refs):
            return False, math.inf, f"{len(outs)} outputs, reference has {len(refs)}"
        worst, ok = 0.0, True
        for o, r in zip(outs, refs):
            if not isinstance(o, torch.Tensor):
                continue
            if tuple(o.shape) != tuple(r.shape):
                return False, math.inf, f"shape {tuple(o.shape)} != {tuple(r.shape)}"
            rtol, atol = rtol_atol or _tolerance(o.dtype)
            of, rf = o.float(), r.float()
            finite = torch.isfinite(rf)
            if not torch.equal(torch.isfinite(of), finite):
                return False, math.inf, "non-finite values differ"
            err = (of[finite] - rf[finite]).abs()
            if err.numel():
                worst = max(worst, float(err.max()))
                ok = ok and bool((err <= atol + rtol * rf[finite].abs()).all())
        return ok, worst, ""

    return check


def sample_check(probs_fn: Callable[[], Any]):
    """Random samples: in range, int32, and each of nonzero probability under the filtered
    reference distribution ``probs_fn()`` (a boolean mask or probabilities)."""

    def check(out: Any, _ref: Any) -> Tuple[bool, float, str]:
        torch = _torch()
        samples = _flat(out)[0]
        support = probs_fn()
        if samples.dtype != torch.int32 or samples.shape != (support.shape[0],):
            return False, math.inf, f"samples {samples.dtype} {tuple(samples.shape)}"
        if bool(((samples < 0) | (samples >= support.shape[1])).any()):
            return False, math.inf, "sample out of range"
        hit = support.gather(1, samples.long()[:, None])[:, 0]
        bad = int((hit <= 0).sum())
        return bad == 0, float(bad), f"{bad} samples outside the filtered support"

    return check


def _nbytes(xs: Sequence[Any]) -> int:
    torch = _torch()
    return sum(t.numel() * t.element_size() for t in _flat(xs) if isinstance(t, torch.Tensor))


def _from_template(op: str, inputs: Dict[str, Any], call: Callable[[], Any],
                   extra_fns: Optional[Dict[str, Callable[[], Any]]] = None,
                   outputs_after: Optional[Callable[[Any], Any]] = None) -> Tuple[dict, Any]:
    """(backend -> call, reference call) of ``op`` from its trace template: ours is ``call``,
    ``torch`` is the template's pure-PyTorch reference on the same inputs (in-place ops: on
    copies), the refcheck's reference the same in float32 math (the templates compute in
    float32 and round once)."""
    from flashinfer.trace_templates import TEMPLATES

    ref = TEMPLATES[op].reference_fn()
    fresh = {k: (v.clone() if hasattr(v, "clone") else v) for k, v in inputs.items()}
    fns = {"cuda": call, "auto": call, "torch": lambda: ref(**inputs)}
    fns.update(extra_fns or {})
    return fns, (lambda: ref(**fresh))


# --------------------------------------------------------------------------------------------
# norm, activation, tutorial
# --------------------------------------------------------------------------------------------


def _norm(op: str):
    def build(a, backends) -> Built:
        torch = _torch()
        import flashinfer

        dt = dtype_of(a.input_dtype)
        shape = (a.batch_size, a.num_heads, a.hidden_size) if a.num_heads else \
            (a.batch_size, a.hidden_size)
        x = torch.randn(shape, device=DEVICE).to(dt)
        ref_fn = _template_ref(op)
        check_fns: Dict[str, Callable[[], Any]] = {}
        if op == "layernorm":
            g = torch.randn(a.hidden_size, device=DEVICE)
            b = torch.randn(a.hidden_size, device=DEVICE)
            call = lambda: flashinfer.layernorm(x, g, b, a.eps)  # noqa: E731
            fns = {"cuda": call, "auto": call, "torch": lambda: ref_fn(x, g, b, a.eps)}
            moved, reference = 2 * _nbytes([x]) + _nbytes([g, b]), (lambda: ref_fn(x, g, b, a.eps))
        elif "fused" in op:
            fn = getattr(flashinfer, op)
            r = torch.randn(shape, device=DEVICE).to(dt)
            w = torch.randn(a.hidden_size, device=DEVICE).to(dt)
            x0, r0 = x.clone(), r.clone()
            fns = {name: (lambda be: lambda: fn(x, r, w, a.eps, enable_pdl=a.enable_pdl,
                                                backend=be))(be)  # noqa: B023 (bound by the outer lambda)
                   for name, be in (("cuda", "auto"), ("auto", "auto"), ("cubin", "cubin"))}
            fns["torch"] = lambda: ref_fn(x, r, w, a.eps)

            def restored(be):
                def run():  # in place: start from the same inputs as the reference
                    x.copy_(x0)
                    r.copy_(r0)
                    fn(x, r, w, a.eps, enable_pdl=a.enable_pdl, backend=be)
                    return x, r
                return run

            check_fns = {"cuda": restored("auto"), "auto": restored("auto"),
                         "cubin": restored("cubin"), "torch": lambda: ref_fn(x0, r0, w, a.eps)}
            moved, reference = 4 * _nbytes([x]) + _nbytes([w]), (lambda: ref_fn(x0, r0, w, a.eps))
        else:
            fn = getattr(flashinfer, op)
            w = torch.randn(a.hidden_size, device=DEVICE).to(dt)
            out = torch.empty_like(x)
            fns = {name: (lambda be: lambda: fn(x, w, a.eps, out=out, enable_pdl=a.enable_pdl,
                                                backend=be))(be)  # noqa: B023 (bound by the outer lambda)
                   for name, be in (("cuda", "auto"), ("auto", "auto"), ("cubin", "cubin"))}
            fns["torch"] = lambda: ref_fn(x, w, a.eps)
            moved, reference = 2 * _nbytes([x]) + _nbytes([w]), (lambda: ref_fn(x, w, a.eps))
        built = Built(fns, reference, close_check(), bytes=moved, ceiling="copy",
                      shape="x".join(map(str, shape)), dtype=a.input_dtype)
        built.check_fns = check_fns  # type: ignore[attr-defined]
        return built

    return build


def _template_ref(op: str):
    from flashinfer.trace_templates import TEMPLATES

    return TEMPLATES[op].reference_fn()


for _op in ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm"):
    _register(_op, "norm", [_op], KERNEL_BACKENDS, ["cuda"], _norm(_op))
_register("layernorm", "norm", ["layernorm"], PLAIN_BACKENDS, ["cuda"], _norm("layernorm"))


def _activation(op: str):
    def build(a, backends) -> Built:
        torch = _torch()
        import flashinfer

        dt = dtype_of(a.input_dtype)
        x = torch.randn(a.batch_size, 2 * a.hidden_size, device=DEVICE).to(dt)
        out = torch.empty(a.batch_size, a.hidden_size, device=DEVICE, dtype=dt)
        fn = getattr(flashinfer, op)
        fns, ref = _from_template(
            op, {"input": x}, lambda: fn(x, out=out, enable_pdl=a.enable_pdl),
            {"cubin": lambda: fn(x, out=out, enable_pdl=a.enable_pdl, backend="cubin")})
        return Built(fns, ref, close_check(), bytes=_nbytes([x, out]), ceiling="copy",
                     shape=f"{a.batch_size}x{2 * a.hidden_size}", dtype=a.input_dtype)

    return build


for _op in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
    _register(_op, "activation", [_op], KERNEL_BACKENDS, ["cuda"], _activation(_op))


def _scale(a, backends) -> Built:
    torch = _torch()
    import flashinfer

    x = torch.randn(a.batch_size, a.hidden_size, device=DEVICE).to(dtype_of(a.input_dtype))
    out = torch.empty_like(x)
    fns, ref = _from_template("scale", {"input": x, "factor": 1.5},
                              lambda: flashinfer.scale(x, 1.5, out=out))
    return Built(fns, ref, close_check(), bytes=2 * _nbytes([x]), ceiling="copy",
                 shape=f"{a.batch_size}x{a.hidden_size}", dtype=a.input_dtype)


_register("scale", "misc", ["scale"], PLAIN_BACKENDS, ["cuda"], _scale)

# --------------------------------------------------------------------------------------------
# rope
# --------------------------------------------------------------------------------------------


def _rope(op: str):
    inplace = op.endswith("_inplace")
    base = op[: -len("_inplace")] if inplace else op

    def build(a, backends) -> Built:
        torch = _torch()
        import flashinfer

        dt = dtype_of(a.input_dtype)
        nnz = a.batch_size * a.seq_len
        q = torch.randn(nnz, a.num_qo_heads, a.head_dim, device=DEVICE).to(dt)
        k = torch.randn(nnz, a.num_kv_heads, a.head_dim, device=DEVICE).to(dt)
        fn = getattr(flashinfer, op)
        common = {"rotary_dim": a.rotary_dim, "interleave": a.interleave,
                  "rope_scale": a.rope_scale, "rope_theta": a.rope_theta}
        if "llama31" in base:
            common.update(low_freq_factor=a.low_freq_factor, high_freq_factor=a.high_freq_factor,
                          old_context_len=a.old_context_len)
        if base == "apply_rope_with_cos_sin_cache":
            rd = a.rotary_dim or a.head_dim
            pos = torch.randint(0, 4 * a.seq_len, (nnz,), device=DEVICE)
            cache = torch.randn(4 * a.seq_len, rd, device=DEVICE)
            qf, kf = q.reshape(nnz, -1), k.reshape(nnz, -1)
            inputs = {"positions": pos, "query": qf, "key": kf, "head_size": a.head_dim,
                      "cos_sin_cache": cache, "is_neox": not a.interleave}
            args = (pos, qf, kf, a.head_dim, cache, not a.interleave)
            call_args, call_kwargs = args, {}
            mutated = (qf, kf)
        elif "pos_ids" in base:
            pos = torch.randint(0, 4 * a.seq_len, (nnz,), device=DEVICE, dtype=torch.int32)
            inputs = {"q": q, "k": k, "pos_ids": pos, **common}
            call_args, call_kwargs = (q, k, pos), common
            mutated = (q, k)
        else:
            indptr = torch.arange(0, nnz + 1, a.seq_len, device=DEVICE, dtype=torch.int32)
            offsets = torch.randint(0, a.seq_len, (a.batch_size,), device=DEVICE,
                                    dtype=torch.int32)
            inputs = {"q": q, "k": k, "indptr": indptr, "offsets": offsets, **common}
            call_args, call_kwargs = (q, k, indptr, offsets), common
            mutated = (q, k)
        ref_fn = _template_ref(op)
        fresh = {key: (v.clone() if hasattr(v, "clone") else v) for key, v in inputs.items()}
        if inplace:
            saved = [m.clone() for m in mutated]

            def ours():
                for m, s in zip(mutated, saved):
                    m.copy_(s)
                fn(*call_args, **call_kwargs)
                return mutated

            timed = lambda: fn(*call_args, **call_kwargs)  # noqa: E731
            fns = {"cuda": timed, "auto": timed, "torch": lambda: ref_fn(**inputs)}
            pristine = {key: (v.clone() if hasattr(v, "clone") else v) for key, v in inputs.items()}
            check_fns = {"cuda": ours, "auto": ours, "torch": lambda: ref_fn(**pristine)}
        else:
            call = lambda: fn(*call_args, **call_kwargs)  # noqa: E731
            fns = {"cuda": call, "auto": call, "torch": lambda: ref_fn(**inputs)}
            check_fns = {}
        built = Built(fns, lambda: ref_fn(**fresh), close_check(), bytes=2 * _nbytes(mutated),
                      ceiling="copy", shape=f"nnz={nnz} h={a.num_qo_heads} kv={a.num_kv_heads} "
                      f"d={a.head_dim}", dtype=a.input_dtype,
                      # the reference's repeat_interleave over indptr syncs: no graph
                      no_graph=("torch",) if "indptr" in inputs else ())
        built.check_fns = check_fns  # type: ignore[attr-defined]
        return built

    return build


for _base in ("apply_rope", "apply_rope_pos_ids", "apply_llama31_rope",
              "apply_llama31_rope_pos_ids", "apply_rope_with_cos_sin_cache"):
    for _op in (_base, _base + "_inplace"):
        _register(_op, "rope", [_op], PLAIN_BACKENDS, ["cuda"], _rope(_op))

# --------------------------------------------------------------------------------------------
# cascade merges, paged-cache helpers, bit packing
# --------------------------------------------------------------------------------------------


def _merge(op: str):
    def build(a, backends) -> Built:
        torch = _torch()
        import flashinfer

        dt = dtype_of(a.input_dtype)
        L, H, D = a.seq_len, a.num_qo_heads, a.head_dim
        if op == "merge_states":
            v = torch.randn(L, a.num_states, H, D, device=DEVICE).to(dt)
            s = torch.randn(L, a.num_states, H, device=DEVICE)
            inputs, call = {"v": v, "s": s}, (lambda: flashinfer.merge_states(v, s))
            moved = _nbytes([v, s]) + L * H * (D * v.element_size() + 4)
        else:
            va, vb = (torch.randn(L, H, D, device=DEVICE).to(dt) for _ in range(2))
            sa, sb = (torch.randn(L, H, device=DEVICE) for _ in range(2))
            moved = _nbytes([va, sa, vb, sb]) + _nbytes([va, sa])
            if op == "merge_state":
                inputs = {"v_a": va, "s_a": sa, "v_b": vb, "s_b": sb}
                call = lambda: flashinfer.merge_state(va, sa, vb, sb)  # noqa: E731
            else:
                inputs = {"v": va, "s": sa, "v_other": vb, "s_other": sb}
                v0, s0 = va.clone(), sa.clone()

                def call():
                    flashinfer.merge_state_in_place(va, sa, vb, sb)
                    return va, sa

                def ours():
                    va.copy_(v0)
                    sa.copy_(s0)
                    return call()
        fns, ref = _from_template(op, inputs, call)
        built = Built(fns, ref, close_check(), bytes=moved, ceiling="copy",
                      shape=f"L={L} h={H} d={D}", dtype=a.input_dtype)
        if op == "merge_state_in_place":
            built.check_fns = {"cuda": ours, "auto": ours}  # type: ignore[attr-defined]
            inputs.update(v=v0.clone(), s=s0.clone())
        return built

    return build


for _op in ("merge_state", "merge_state_in_place", "merge_states"):
    _register(_op, "cascade", [_op], PLAIN_BACKENDS, ["cuda"], _merge(_op))


def _page_table(a, kv_lens, device=None):
    """indptr, shuffled page ids, last-page lengths of requests with ``kv_lens`` tokens."""
    torch = _torch()
    device = device or DEVICE
    pages = [max(1, math.ceil(n / a.page_size)) for n in kv_lens]
    indptr = torch.tensor([0] + list(_cumsum(pages)), dtype=torch.int32, device=device)
    total = int(indptr[-1])
    indices = torch.randperm(total, device=device).to(torch.int32)
    last = torch.tensor([n - (p - 1) * a.page_size for n, p in zip(kv_lens, pages)],
                        dtype=torch.int32, device=device)
    return indptr, indices, last, total


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def _append(a, backends) -> Built:
    torch = _torch()
    import flashinfer

    dt = dtype_of(a.kv_dtype)
    kv_lens = [a.s_kv] * a.batch_size
    indptr, indices, last, total = _page_table(a, kv_lens)
    append = min(a.s_qo, a.s_kv)
    cache = torch.randn(total, 2, a.page_size, a.num_kv_heads, a.head_dim_qk,
                        device=DEVICE).to(dt)
    nnz = append * a.batch_size
    k = torch.randn(nnz, a.num_kv_heads, a.head_dim_qk, device=DEVICE).to(dt)
    v = torch.randn_like(k)
    append_indptr = torch.arange(0, nnz + 1, append, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.full((a.batch_size,), a.s_kv, dtype=torch.int32, device=DEVICE)
    batch, pos = _template_ref("get_batch_indices_positions")(append_indptr, seq_lens, nnz)
    call = lambda: flashinfer.append_paged_kv_cache(  # noqa: E731
        k, v, batch, pos, cache, indices, indptr, last)
    ref_fn = _template_ref("append_paged_kv_cache")
    kc, vc = cache[:, 0].clone(), cache[:, 1].clone()

    def ours():
        call()
        return cache[:, 0], cache[:, 1]

    fns = {"cuda": call, "auto": call,
           "torch": lambda: ref_fn(k, v, batch, pos, cache[:, 0], cache[:, 1], indices, indptr,
                                   last)}
    built = Built(fns, lambda: ref_fn(k, v, batch, pos, kc, vc, indices, indptr, last),
                  close_check(), bytes=4 * _nbytes([k]), ceiling="copy",
                  shape=f"b={a.batch_size} append={append} ps={a.page_size} kv={a.num_kv_heads} "
                  f"d={a.head_dim_qk}", dtype=a.kv_dtype)
    built.check_fns = {"cuda": ours, "auto": ours}  # type: ignore[attr-defined]
    return built


_register("append_paged_kv_cache", "page", ["append_paged_kv_cache"], PLAIN_BACKENDS, ["cuda"],
          _append)


def _batch_positions(a, backends) -> Built:
    torch = _torch()
    import flashinfer

    append = max(1, a.s_qo)
    nnz = append * a.batch_size
    append_indptr = torch.arange(0, nnz + 1, append, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.full((a.batch_size,), a.s_kv, dtype=torch.int32, device=DEVICE)
    fns, ref = _from_template(
        "get_batch_indices_positions",
        {"append_indptr": append_indptr, "seq_lens": seq_lens, "nnz": nnz},
        lambda: flashinfer.get_batch_indices_positions(append_indptr, seq_lens, nnz))
    return Built(fns, ref, close_check((0, 0)), bytes=8 * nnz, ceiling="copy",
                 shape=f"b={a.batch_size} nnz={nnz}", dtype="int32", no_graph=("torch",))


_register("get_batch_indices_positions", "page", ["get_batch_indices_positions"], PLAIN_BACKENDS,
          ["cuda"], _batch_positions)


def _seq_lens(a, backends) -> Built:
    torch = _torch()
    import flashinfer

    indptr, _, last, _ = _page_table(a, [a.s_kv] * a.batch_size)

    def ref():
        pages = (indptr[1:] - indptr[:-1]).long()
        return ((pages - 1).clamp(min=0) * a.page_size + last.long()).to(torch.int32)

    call = lambda: flashinfer.get_seq_lens(indptr, last, a.page_size)  # noqa: E731
    return Built({"cuda": call, "auto": call, "torch": ref}, ref,
                 lambda o, r: (bool(torch.equal(o.long(), r.long())), 0.0, ""),
                 bytes=_nbytes([indptr, last]) * 2, shape=f"b={a.batch_size}", dtype="int32")


_register("get_seq_lens", "page", ["get_seq_lens"], PLAIN_BACKENDS, ["cuda"], _seq_lens)


def _packbits(op: str):
    def build(a, backends) -> Built:
        torch = _torch()
        import flashinfer

        n = a.batch_size * a.hidden_size
        x = torch.rand(n, device=DEVICE) < 0.5
        if op == "packbits":
            inputs = {"x": x}
            call = lambda: flashinfer.packbits(x)  # noqa: E731
        else:
            seg = torch.arange(0, n + 1, a.hidden_size, dtype=torch.int32, device=DEVICE)
            inputs = {"x": x, "indptr": seg}
            call = lambda: flashinfer.segment_packbits(x, seg)  # noqa: E731
        fns, ref = _from_template(op, inputs, call)
        return Built(fns, ref, close_check((0, 0)), bytes=n + n // 8, shape=f"n={n}",
                     dtype="bool", no_graph=("torch",) if op == "segment_packbits" else ())

    return build


for _op in ("packbits", "segment_packbits"):
    _register(_op, "misc", [_op], PLAIN_BACKENDS, ["cuda"], _packbits(_op))

# --------------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------------


def _attend_ref():
    from flashinfer.trace_templates import _ATTN_REF

    ns: Dict[str, Any] = {}
    exec(_ATTN_REF, ns)
    return ns["_attend"]


def _kv_lens(a) -> List[int]:
    torch = _torch()
    if not a.random_actual_seq_len:
        return [a.s_kv] * a.batch_size
    g = torch.Generator().manual_seed(a.random_seed)
    return torch.randint(max(1, a.s_qo), a.s_kv + 1, (a.batch_size,), generator=g).tolist()


def _sdpa_fns(a, q_dense, k_dense, v_dense, causal: bool, uniform: bool, backends):
    """Baselines through SDPA on dense (batch, heads, len, dim) copies (GQA expanded)."""
    torch = _torch()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kinds = {"torch": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "flash": SDPBackend.FLASH_ATTENTION}
    fns, skipped = {}, {}
    for name, kind in kinds.items():
        if name not in backends:
            continue
        if not uniform:
            skipped[name] = "SDPA baselines need equal lengths (drop --random_actual_seq_len)"
            continue
        if causal and q_dense.shape[2] != k_dense.shape[2]:
            skipped[name] = "SDPA's causal mask is top-left aligned; ours bottom-right (s_qo != s_kv)"
            continue

        def run(kind=kind):
            with sdpa_kernel([kind]):
                return torch.nn.functional.scaled_dot_product_attention(
                    q_dense, k_dense, v_dense, is_causal=causal)

        fns[name] = run
    return fns, skipped


def _paged_cache(a, kv_lens, dt):
    torch = _torch()
    indptr, indices, last, total = _page_table(a, kv_lens)
    cache = torch.randn(total, 2, a.page_size, a.num_kv_heads, a.head_dim_qk,
                        device=DEVICE).to(dt)
    return indptr, indices, last, cache


def _gather(cache, indptr, indices, last, b, page_size):
    ids = indices[int(indptr[b]):int(indptr[b + 1])].long()
    n = (len(ids) - 1) * page_size + int(last[b])
    k = cache[ids, 0].reshape(-1, *cache.shape[-2:])[:n]
    v = cache[ids, 1].reshape(-1, *cache.shape[-2:])[:n]
    return k, v


def _attention_flops(a, qo_lens, kv_lens, causal, dqk, dvo) -> float:
    total = 0.0
    for qo, kv in zip(qo_lens, kv_lens):
        pairs = qo * kv - (qo * (qo - 1) / 2 if causal else 0)
        total += 2 * pairs * a.num_qo_heads * (dqk + dvo)
    return total


def _ws():
    torch = _torch()
    return torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)


def _batch_attention(kind: str):
    def build(a, backends) -> Built:
        torch = _torch()
        import flashinfer

        qdt, kvdt = dtype_of(a.q_dtype), dtype_of(a.kv_dtype)
        kv_lens = _kv_lens(a)
        qo_lens = [1] * a.batch_size if kind == "decode" else \
            [min(a.s_qo, n) if a.random_actual_seq_len else a.s_qo for n in kv_lens]
        dqk, dvo = a.head_dim_qk, a.head_dim_vo or a.head_dim_qk
        if kind != "ragged" and dvo != dqk:
            raise ValueError(f"--head_dim_vo {dvo}: a paged cache holds one head dim "
                             f"(--head_dim_qk {dqk}); use the ragged routine for MLA shapes")
        causal = a.causal and kind != "decode"
        total_q = sum(qo_lens)
        q = torch.randn(total_q, a.num_qo_heads, dqk, device=DEVICE).to(qdt)
        qo_indptr = torch.tensor([0] + list(_cumsum(qo_lens)), dtype=torch.int32, device=DEVICE)
        fns: Dict[str, Callable[[], Any]] = {}
        attend = _attend_ref()
        if kind == "ragged":
            kv_indptr = torch.tensor([0] + list(_cumsum(kv_lens)), dtype=torch.int32,
                                     device=DEVICE)
            k = torch.randn(sum(kv_lens), a.num_kv_heads, dqk, device=DEVICE).to(kvdt)
            v = torch.randn(sum(kv_lens), a.num_kv_heads, dvo, device=DEVICE).to(kvdt)
            per_req = [(k[int(kv_indptr[b]):int(kv_indptr[b + 1])],
                        v[int(kv_indptr[b]):int(kv_indptr[b + 1])]) for b in range(a.batch_size)]
            for backend in ("fa2", "fa3", "auto", "cuda"):
                if backend not in backends:
                    continue
                w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
                    _ws(), "NHD", backend="auto" if backend == "cuda" else backend)
                w.plan(qo_indptr, kv_indptr, a.num_qo_heads, a.num_kv_heads, dqk,
                       head_dim_vo=dvo, causal=causal, q_data_type=qdt, kv_data_type=kvdt)
                fns[backend] = (lambda w: lambda: w.run(q, k, v))(w)  # noqa: B023 (bound by the outer lambda)
            moved = _nbytes([q, k, v]) + total_q * a.num_qo_heads * dvo * q.element_size()
        else:
            indptr, indices, last, cache = _paged_cache(a, kv_lens, kvdt)
            per_req = [_gather(cache, indptr, indices, last, b, a.page_size)
                       for b in range(a.batch_size)]
            for backend in ("fa2", "fa3", "auto", "cuda"):
                if backend not in backends:
                    continue
                real = "auto" if backend == "cuda" else backend
                if kind == "decode":
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", backend=real)
                    w.plan(indptr, indices, last, a.num_qo_heads, a.num_kv_heads, dqk,
                           a.page_size, q_data_type=qdt, kv_data_type=kvdt)
                else:
                    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), "NHD", backend=real)
                    w.plan(qo_indptr, indptr, indices, last, a.num_qo_heads, a.num_kv_heads,
                           dqk, a.page_size, causal=causal, q_data_type=qdt, kv_data_type=kvdt)
                fns[backend] = (lambda w: lambda: w.run(q, cache, enable_pdl=a.enable_pdl))(w)  # noqa: B023 (bound by the outer lambda)
            moved = _nbytes([q]) + sum(_nbytes([kk, vv]) for kk, vv in per_req) + \
                total_q * a.num_qo_heads * dvo * q.element_size()

        def reference():
            outs = []
            for b, (kk, vv) in enumerate(per_req):
                qb = q[int(qo_indptr[b]):int(qo_indptr[b + 1])]
                outs.append(attend(qb, kk, vv, None, causal))
            return torch.cat(outs)

        uniform = len(set(kv_lens)) == 1 and len(set(qo_lens)) == 1
        g = a.num_qo_heads // a.num_kv_heads
        sdpa, skipped = {}, {}
        if uniform and any(x in backends for x in BASELINES):
            qd = q.view(a.batch_size, qo_lens[0], a.num_qo_heads, dqk).transpose(1, 2)
            kd = torch.stack([kk for kk, _ in per_req]).transpose(1, 2).repeat_interleave(g, 1)
            vd = torch.stack([vv for _, vv in per_req]).transpose(1, 2).repeat_interleave(g, 1)
            kd, vd, qd = kd.to(qdt).contiguous(), vd.to(qdt).contiguous(), qd.contiguous()
            sdpa, skipped = _sdpa_fns(a, qd, kd, vd, causal, uniform, backends)
            for name, fn in list(sdpa.items()):  # back to (tokens, heads, dim) for the check
                sdpa[name] = (lambda fn: lambda: fn().transpose(1, 2).reshape(  # noqa: B023 (bound by the outer lambda)
                    total_q, a.num_qo_heads, dvo))(fn)
        else:
            skipped = {b: "SDPA baselines need equal lengths (drop --random_actual_seq_len)"
                       for b in BASELINES if b in backends}
        fns.update(sdpa)
        flops = _attention_flops(a, qo_lens, kv_lens, causal, dqk, dvo)
        return Built(fns, reference, close_check(), bytes=moved, flops=flops,
                     ceiling="read" if kind == "decode" else "matmul",
                     shape=f"b={a.batch_size} qo={a.s_qo if kind != 'decode' else 1} "
                     f"kv={a.s_kv} h={a.num_qo_heads} kv_h={a.num_kv_heads} d={dqk}/{dvo}"
                     + (f" ps={a.page_size}" if kind != "ragged" else ""),
                     dtype=f"{a.q_dtype}/{a.kv_dtype}", skipped=skipped)

    return build


_register("BatchDecodeWithPagedKVCacheWrapper", "attention",
          ["BatchDecodeWithPagedKVCacheWrapper", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
           "fast_decode_plan"],  # the wrapper's plan, as engines bind it
          ATTN_BACKENDS, ["auto"], _batch_attention("decode"))
_register("BatchPrefillWithPagedKVCacheWrapper", "attention",
          ["BatchPrefillWithPagedKVCacheWrapper", "MultiLevelCascadeAttentionWrapper"],
          ATTN_BACKENDS, ["auto"], _batch_attention("paged"))
_register("BatchPrefillWithRaggedKVCacheWrapper", "attention",
          ["BatchPrefillWithRaggedKVCacheWrapper"], ATTN_BACKENDS, ["auto"],
          _batch_attention("ragged"))


def _single(kind: str):
    def build(a, backends) -> Built:
        torch = _torch()
        import flashinfer

        qdt, kvdt = dtype_of(a.q_dtype), dtype_of(a.kv_dtype)
        dqk, dvo = a.head_dim_qk, a.head_dim_vo or a.head_dim_qk
        qo = 1 if kind == "decode" else a.s_qo
        causal = a.causal and kind != "decode"
        q = torch.randn(qo, a.num_qo_heads, dqk, device=DEVICE).to(qdt)
        k = torch.randn(a.s_kv, a.num_kv_heads, dqk, device=DEVICE).to(kvdt)
        v = torch.randn(a.s_kv, a.num_kv_heads, dvo, device=DEVICE).to(kvdt)
        fns: Dict[str, Callable[[], Any]] = {}
        for backend in ("fa2", "fa3", "auto", "cuda"):
            if backend not in backends:
                continue
            if kind == "decode":
                if backend not in ("auto", "cuda"):
                    continue
                fns[backend] = lambda: flashinfer.single_decode_with_kv_cache(q[0], k, v)[None]
            else:
                real = "auto" if backend == "cuda" else backend
                fns[backend] = (lambda real: lambda: flashinfer.single_prefill_with_kv_cache(
                    q, k, v, causal=causal, backend=real))(real)  # noqa: B023 (bound by the outer lambda)
        attend = _attend_ref()
        g = a.num_qo_heads // a.num_kv_heads
        qd = q.transpose(0, 1)[None].contiguous()
        kd = k.transpose(0, 1)[None].repeat_interleave(g, 1).to(qdt).contiguous()
        vd = v.transpose(0, 1)[None].repeat_interleave(g, 1).to(qdt).contiguous()
        sdpa, skipped = _sdpa_fns(a, qd, kd, vd, causal, True, backends)
        for name, fn in sdpa.items():
            fns[name] = (lambda fn: lambda: fn()[0].transpose(0, 1))(fn)  # noqa: B023 (bound by the outer lambda)
        for backend in backends:
            if kind == "decode" and backend in ("fa2", "fa3"):
                skipped[backend] = "single_decode_with_kv_cache has no backend= choice"
        flops = _attention_flops(a, [qo], [a.s_kv], causal, dqk, dvo)
        return Built(fns, lambda: attend(q, k, v, None, causal), close_check(),
                     bytes=_nbytes([q, k, v]) + qo * a.num_qo_heads * dvo * q.element_size(),
                     flops=flops, ceiling="read" if kind == "decode" else "matmul",
                     shape=f"qo={qo} kv={a.s_kv} h={a.num_qo_heads} kv_h={a.num_kv_heads} "
                     f"d={dqk}/{dvo}", dtype=f"{a.q_dtype}/{a.kv_dtype}", skipped=skipped)

    return build


_register("single_decode_with_kv_cache", "attention", ["single_decode_with_kv_cache"],
          ("auto", "cuda", "cudnn", "flash", "torch"), ["auto"], _single("decode"))
_register("single_prefill_with_kv_cache", "attention",
          ["single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse"],
          ATTN_BACKENDS, ["auto"], _single("prefill"))

# --------------------------------------------------------------------------------------------
# sampling and top-k (flashinfer.sampling / flashinfer.topk, when present)
# --------------------------------------------------------------------------------------------

SAMPLING_OPS = (
    "softmax", "sampling_from_probs", "sampling_from_logits", "top_p_sampling_from_probs",
    "top_k_sampling_from_probs", "min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits", "top_p_renorm_probs", "top_k_renorm_probs",
    "top_k_mask_logits", "chain_speculative_sampling",
)
TOPK_OPS = ("top_k", "top_k_page_table_transform", "top_k_ragged_transform")


def _sampling(op: str):
    def build(a, backends) -> Built:
        torch = _torch()
        import importlib

        ours = any(b != "torch" for b in backends)
        fn = getattr(importlib.import_module("flashinfer.sampling"), op) if ours else None
        ref_fn = _template_ref(op)
        B, V = a.batch_size, a.vocab_size
        logits = (torch.randn(B, V, device=DEVICE) * 3).to(dtype_of(a.input_dtype))
        probs = torch.softmax(logits.float(), -1)
        if op == "chain_speculative_sampling":
            n = a.num_speculate_tokens
            draft = torch.softmax(torch.randn(B, n, V, device=DEVICE), -1)
            target = torch.softmax(torch.randn(B, n + 1, V, device=DEVICE), -1)
            ids = torch.randint(0, V, (B, n), device=DEVICE, dtype=torch.int32)
            call = lambda: fn(draft, ids, target)  # noqa: E731

            def check(out, _ref):
                ids_out, acc, emitted = out
                ok = ids_out.shape == (B, n + 1) and bool(
                    ((emitted + 1) == (ids_out != -1).sum(-1)).all())
                return ok, 0.0, "" if ok else "emitted + 1 != tokens written"

            return Built({"cuda": call, "auto": call,
                          "torch": lambda: ref_fn(draft, ids, target)},
                         lambda: None, check, bytes=_nbytes([draft, target, ids]),
                         shape=f"b={B} n={n} v={V}", dtype="float32", no_graph=("torch",))
        params = {"top_p": a.top_p, "top_k": a.top_k, "min_p": a.min_p}
        from flashinfer.trace_templates import TEMPLATES

        names = [k for k in TEMPLATES[op].inputs if k in params]
        args = [params[k] for k in names]
        first = logits if op in ("softmax", "sampling_from_logits",
                                 "top_k_top_p_sampling_from_logits", "top_k_mask_logits") \
            else probs.to(logits.dtype) if op == "top_k_renorm_probs" else probs
        kwargs: Dict[str, Any] = {}
        if op == "softmax":
            kwargs = {"temperature": a.temperature}
        if op.startswith("top_k_top_p"):
            kwargs = {"filter_apply_order": a.filter_apply_order}
        call = lambda: fn(first, *args, **kwargs)  # noqa: E731
        ref_kwargs = dict(zip(names, args))
        if op == "softmax":
            ref_kwargs["temperature"] = a.temperature
        ref = lambda: ref_fn(first.float() if op != "top_k_mask_logits" else first,  # noqa: E731
                             **ref_kwargs)
        if TEMPLATES[op].deterministic:
            check = close_check((1e-3, 1e-3) if op != "top_k_renorm_probs" else None)
        else:
            ns: Dict[str, Any] = {}
            exec(TEMPLATES[op].reference.split("\ndef run(")[0], ns)
            p = torch.softmax(first.float(), -1) if "logits" in op else first.float()
            masks = {"top_p": lambda: ns["_top_p_mask"](p, a.top_p),
                     "top_k": lambda: ns["_top_k_mask"](p, a.top_k),
                     "min_p": lambda: ns["_min_p_mask"](p, a.min_p)}
            support = lambda: p * torch.stack(  # noqa: E731
                [masks[k]() for k in names] or [p > 0]).all(0)
            check = sample_check(support)
        return Built({"cuda": call, "auto": call, "torch": ref}, ref, check,
                     bytes=_nbytes([first]), shape=f"b={B} v={V}", dtype=a.input_dtype,
                     no_graph=("torch",))

    return build


for _op in SAMPLING_OPS:
    _register(_op, "sampling", [_op, *({"top_p_renorm_probs": ["top_p_renorm_prob"],
                                        "top_k_renorm_probs": ["top_k_renorm_prob"]}
                                       .get(_op, []))],
              PLAIN_BACKENDS, ["cuda"], _sampling(_op), needs=("flashinfer.sampling",))


def _topk(op: str):
    def build(a, backends) -> Built:
        torch = _torch()
        import importlib

        ours = any(b != "torch" for b in backends)
        fn = getattr(importlib.import_module("flashinfer.topk"), op) if ours else None
        rows = a.num_rows or a.batch_size
        width = a.vocab_size if op == "top_k" else a.max_len
        x = torch.randn(rows, width, device=DEVICE).to(dtype_of(a.input_dtype))
        ref_fn = _template_ref(op)
        if op == "top_k":
            args: tuple = (x, a.top_k)
            call = lambda: fn(x, a.top_k, sorted=True)  # noqa: E731

            def check(out, ref):
                values, indices = out
                ok = torch.allclose(values.float(), ref[0].float(), rtol=1e-3, atol=1e-3) and \
                    bool(torch.equal(x.gather(1, indices.long()).float(), values.float()))
                return ok, 0.0, "" if ok else "values or indices differ from torch.topk's"
        else:
            lengths = torch.full((rows,), width, dtype=torch.int32, device=DEVICE)
            if op == "top_k_page_table_transform":
                other = torch.randperm(rows * width, device=DEVICE).view(rows, width).to(
                    torch.int32)
            else:
                other = torch.arange(rows, dtype=torch.int32, device=DEVICE) * width
            args = (x, other, lengths, a.top_k)
            call = lambda: fn(*args)  # noqa: E731

            def check(out, ref):  # a set per row: compare sorted
                ok = out.shape == ref.shape and bool(torch.equal(
                    out.long().sort(-1).values, ref.long().sort(-1).values))
                return ok, 0.0, "" if ok else "selected sets differ"
        return Built({"cuda": call, "auto": call, "torch": lambda: ref_fn(*args)},
                     lambda: ref_fn(*args), check, bytes=_nbytes([x]),
                     shape=f"rows={rows} len={width} k={a.top_k}", dtype=a.input_dtype,
                     no_graph=("torch",) if op != "top_k" else ())

    return build


for _op in TOPK_OPS:
    _register(_op, "topk", [_op], PLAIN_BACKENDS, ["cuda"], _topk(_op), needs=("flashinfer.topk",))


def covered_ops() -> set:
    return {op for r in ROUTINES.values() for op in r.ops}

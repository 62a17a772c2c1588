"""The :class:`~flashinfer.fi_trace.TraceTemplate` of every public op, by qualified name.

The decorator looks an op's template up here by its ``__qualname__`` when it is applied (so op
modules need no edit to be traced); ``@flashinfer_api(trace=...)`` overrides it. Each template
names the axes (``Var``: batch, tokens; ``Const``: hidden sizes, heads, head dims), the inputs
and outputs (flashinfer-bench's Definition format), a pure-PyTorch reference (source text with a
``run`` function taking the inputs by name, in float32) and an example call (``example(device)
-> (args, kwargs)``) that tests/trace/example.py and the GPU reference test use.

Templates for ``flashinfer.sampling`` and ``flashinfer.topk`` follow the API contract's
signatures; they are used once those modules exist.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch

from .trace_template import Const, Tensor, TraceTemplate, Var

TEMPLATES: Dict[str, TraceTemplate] = {}

_BF16 = torch.bfloat16


def _add(qualname: str, template: TraceTemplate) -> None:
    TEMPLATES[qualname] = template


def _gen(seed: int = 0) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _randn(*shape, dtype=_BF16, device="cpu", seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(dtype=dtype, device=device)


def _ex(fn: Callable[[str], Tuple[tuple, dict]]) -> Callable[[str], Tuple[tuple, dict]]:
    return fn


# --------------------------------------------------------------------------------------------
# norm
# --------------------------------------------------------------------------------------------

_RMS_REF = '''import torch

def run(input, weight, eps=1e-6):
    x = input.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * {w}
    return y.to(input.dtype)
'''
_FUSED_REF = '''import torch

def run(input, residual, weight, eps=1e-6):
    t = input.float() + residual.float()
    y = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * {w}
    return y.to(input.dtype), t.to(residual.dtype)
'''
_NORM_AXES = {"batch_size": Var("rows"), "num_heads": Const("heads (per-head QK-norm)"),
              "hidden_size": Const("normalized size")}
_ROWS = {2: ["batch_size", "hidden_size"], 3: ["batch_size", "num_heads", "hidden_size"]}


def _norm_example(fused: bool):
    def example(device: str):
        x = _randn(8, 256, device=device)
        w = _randn(256, device=device, seed=1)
        if fused:
            return (x, _randn(8, 256, device=device, seed=2), w), {}
        return (x, w), {}
    return example


for _op, _w in (("rmsnorm", "weight.float()"), ("gemma_rmsnorm", "(1 + weight.float())")):
    _add(_op, TraceTemplate(
        op_type="rmsnorm", name_prefix=_op,
        description=f"{'Gemma ' if 'gemma' in _op else ''}RMSNorm: "
                    f"y = x * rsqrt(mean(x^2) + eps) * {_w.replace('.float()', '')}, fp32 math.",
        axes=dict(_NORM_AXES),
        inputs={"input": Tensor(_ROWS), "weight": Tensor(["hidden_size"]),
                "eps": Tensor(None, "float32")},
        outputs={"output": Tensor(_ROWS, "=input", param="input")},
        reference=_RMS_REF.format(w=_w), abbrev={"hidden_size": "h", "num_heads": "nh"},
        example=_norm_example(False)))

for _op, _w in (("fused_add_rmsnorm", "weight.float()"),
                ("gemma_fused_add_rmsnorm", "(1 + weight.float())")):
    _add(_op, TraceTemplate(
        op_type="fused_add_rmsnorm", name_prefix=_op,
        description="In place: residual <- input + residual (rounded); input <- RMSNorm of the "
                    "unrounded sum" + (" with weight (1 + w)." if "gemma" in _op else "."),
        axes={"batch_size": Var(), "hidden_size": Const()},
        inputs={"input": Tensor(["batch_size", "hidden_size"]),
                "residual": Tensor(["batch_size", "hidden_size"]),
                "weight": Tensor(["hidden_size"]), "eps": Tensor(None, "float32")},
        outputs={"output": Tensor(["batch_size", "hidden_size"], "=input", source="arg:input"),
                 "residual_out": Tensor(["batch_size", "hidden_size"], "=residual",
                                        source="arg:residual")},
        reference=_FUSED_REF.format(w=_w), abbrev={"hidden_size": "h"},
        example=_norm_example(True)))

_add("layernorm", TraceTemplate(
    op_type="layernorm", name_prefix="layernorm",
    description="LayerNorm of bf16 rows with float32 gamma (parameter `gemma`) and beta.",
    axes={"batch_size": Var(), "hidden_size": Const()},
    inputs={"input": Tensor(["batch_size", "hidden_size"]), "gemma": Tensor(["hidden_size"]),
            "beta": Tensor(["hidden_size"]), "eps": Tensor(None, "float32")},
    outputs={"output": Tensor(["batch_size", "hidden_size"], "=input")},
    reference='''import torch

def run(input, gemma, beta, eps=1e-6):
    y = torch.nn.functional.layer_norm(input.float(), (input.shape[-1],), gemma.float(),
                                       beta.float(), eps)
    return y.to(input.dtype)
''', abbrev={"hidden_size": "h"},
    example=lambda d: ((_randn(8, 256, device=d), _randn(256, dtype=torch.float32, device=d),
                        _randn(256, dtype=torch.float32, device=d, seed=3)), {})))

# --------------------------------------------------------------------------------------------
# activation
# --------------------------------------------------------------------------------------------

_ACT = {
    "silu_and_mul": "torch.nn.functional.silu(a)",
    "gelu_and_mul": "torch.nn.functional.gelu(a)",
    "gelu_tanh_and_mul": "torch.nn.functional.gelu(a, approximate='tanh')",
}
for _op, _f in _ACT.items():
    _add(_op, TraceTemplate(
        op_type="activation", name_prefix=_op,
        description=f"{_op}: act(x[..., :d]) * x[..., d:], x of width 2d.",
        axes={"num_tokens": Var(), "seq_len": Var(), "two_d": Const("input width (2 d)"),
              "d": Const("output width", derive=lambda s: s["two_d"] // 2)},
        inputs={"input": Tensor({2: ["num_tokens", "two_d"], 3: ["num_tokens", "seq_len", "two_d"]})},
        outputs={"output": Tensor({2: ["num_tokens", "d"], 3: ["num_tokens", "seq_len", "d"]},
                                  "=input", param="input")},
        constraints=["two_d == 2 * d"], abbrev={"two_d": "i", "d": "d"},
        reference=f'''import torch

def run(input):
    d = input.shape[-1] // 2
    a, b = input[..., :d].float(), input[..., d:].float()
    return ({_f} * b).to(input.dtype)
''', example=lambda d: ((_randn(8, 512, device=d),), {})))

# --------------------------------------------------------------------------------------------
# rope
# --------------------------------------------------------------------------------------------

_ROPE_HELPERS = '''import math
import torch

def _positions(indptr, offsets, nnz):
    counts = (indptr[1:] - indptr[:-1]).long()
    b = torch.repeat_interleave(torch.arange(counts.numel(), device=indptr.device), counts)
    j = torch.arange(nnz, device=indptr.device)
    return (offsets.long()[b] + j - indptr.long()[b])

def _freqs(rotary_dim, rope_scale, rope_theta, llama31, device):
    i = torch.arange(rotary_dim // 2, dtype=torch.float64, device=device)
    freq = rope_theta ** (-2.0 * i / rotary_dim)
    if llama31 is None:
        return (freq / rope_scale).float()
    low, high, old = llama31
    smooth = (freq * old / (2 * math.pi * (high - low)) - low / (high - low)).clamp(0, 1)
    return ((1 - smooth) * freq / rope_scale + smooth * freq).float()

def _rotate(x, pos, rotary_dim, interleave, freq=None, cos=None, sin=None):
    rd = rotary_dim or x.shape[-1]
    if cos is None:
        ang = pos.float()[:, None] * freq[None, :]
        cos, sin = ang.cos(), ang.sin()
    cos, sin = cos[:, None, :], sin[:, None, :]
    xf = x.float()
    out = xf.clone()
    if interleave:
        a, b = xf[..., 0:rd:2], xf[..., 1:rd:2]
        out[..., 0:rd:2] = a * cos - b * sin
        out[..., 1:rd:2] = b * cos + a * sin
    else:
        h = rd // 2
        a, b = xf[..., :h], xf[..., h:rd]
        out[..., :h] = a * cos - b * sin
        out[..., h:rd] = b * cos + a * sin
    return out.to(x.dtype)
'''

_QK_AXES = {"nnz": Var("tokens"), "num_qo_heads": Const(), "num_kv_heads": Const(),
            "head_dim": Const()}
_QK_IN = {"q": Tensor(["nnz", "num_qo_heads", "head_dim"]),
          "k": Tensor(["nnz", "num_kv_heads", "head_dim"])}
_ROPE_ABBREV = {"num_qo_heads": "h", "num_kv_heads": "kv", "head_dim": "d"}


def _rope_template(op: str, pos_ids: bool, llama31: bool, inplace: bool) -> TraceTemplate:
    scalars = {"rotary_dim": Tensor(None, "int32", optional=True),
               "interleave": Tensor(None, "bool"),
               "rope_scale": Tensor(None, "float32"), "rope_theta": Tensor(None, "float32")}
    defaults = "rotary_dim=None, interleave=False, rope_scale={s}, rope_theta={t}".format(
        s="8.0" if llama31 else "1.0", t="5e5" if llama31 else "1e4")
    if llama31:
        scalars.update({k: Tensor(None, "float32") for k in
                        ("low_freq_factor", "high_freq_factor", "old_context_len")})
        defaults += ", low_freq_factor=1.0, high_freq_factor=4.0, old_context_len=8192"
        l31 = "(low_freq_factor, high_freq_factor, old_context_len)"
    else:
        l31 = "None"
    axes = dict(_QK_AXES)
    if pos_ids:
        index = {"pos_ids": Tensor(["nnz"])}
        pos = "pos_ids.long()"
        head = "q, k, pos_ids"
    else:
        axes.update({"batch_size": Var(), "batch_size_plus_1": Var()})
        index = {"indptr": Tensor(["batch_size_plus_1"]), "offsets": Tensor(["batch_size"])}
        pos = "_positions(indptr, offsets, q.shape[0])"
        head = "q, k, indptr, offsets"
    if inplace:
        outputs = {"q_out": Tensor(["nnz", "num_qo_heads", "head_dim"], "=q", source="arg:q"),
                   "k_out": Tensor(["nnz", "num_kv_heads", "head_dim"], "=k", source="arg:k")}
    else:
        outputs = {"q_rope": Tensor(["nnz", "num_qo_heads", "head_dim"], "=q", source="return[0]"),
                   "k_rope": Tensor(["nnz", "num_kv_heads", "head_dim"], "=k", source="return[1]")}
    reference = _ROPE_HELPERS + f'''
def run({head}, {defaults}):
    rd = rotary_dim or q.shape[-1]
    pos = {pos}
    freq = _freqs(rd, rope_scale, rope_theta, {l31}, q.device)
    return _rotate(q, pos, rd, interleave, freq), _rotate(k, pos, rd, interleave, freq)
'''

    def example(device: str):
        q, k = _randn(12, 4, 64, device=device), _randn(12, 2, 64, device=device, seed=1)
        if pos_ids:
            return (q, k, torch.arange(12, dtype=torch.int32, device=device) + 3), {}
        indptr = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
        return (q, k, indptr, torch.tensor([7, 0], dtype=torch.int32, device=device)), {}

    return TraceTemplate(
        op_type="rope", name_prefix=op,
        description=("Llama-3.1 " if llama31 else "") + "rotary embedding of q and k"
                    + (" (positions from pos_ids)" if pos_ids else
                       " (row j of request b at offsets[b] + j - indptr[b])")
                    + (", in place." if inplace else "."),
        axes=axes, inputs={**_QK_IN, **index, **scalars}, outputs=outputs,
        reference=reference, abbrev=_ROPE_ABBREV, example=example)


for _llama in (False, True):
    for _pos in (False, True):
        for _inplace in (False, True):
            _name = ("apply_llama31_rope" if _llama else "apply_rope") + \
                ("_pos_ids" if _pos else "") + ("_inplace" if _inplace else "")
            _add(_name, _rope_template(_name, _pos, _llama, _inplace))


def _cos_sin_template(inplace: bool) -> TraceTemplate:
    op = "apply_rope_with_cos_sin_cache" + ("_inplace" if inplace else "")
    q_shape = {2: ["nnz", "q_hidden"], 3: ["nnz", "num_qo_heads", "head_size_axis"]}
    k_shape = {2: ["nnz", "k_hidden"], 3: ["nnz", "num_kv_heads", "head_size_axis"]}
    if inplace:
        outputs = {"query_out": Tensor(q_shape, "=query", param="query", source="arg:query"),
                   "key_out": Tensor(k_shape, "=key", param="key", source="arg:key")}
    else:
        outputs = {"query_rope": Tensor(q_shape, "=query", param="query", source="return[0]"),
                   "key_rope": Tensor(k_shape, "=key", param="key", source="return[1]")}

    def example(device: str):
        pos = torch.arange(6, dtype=torch.int64, device=device) * 3
        cache = _randn(32, 64, dtype=torch.float32, device=device, seed=4)
        return (pos, _randn(6, 4 * 64, device=device), _randn(6, 2 * 64, device=device, seed=1),
                64, cache), {}

    return TraceTemplate(
        op_type="rope", name_prefix=op,
        description="Rotary embedding from a float32 [cos | sin] cache indexed by positions"
                    + (", in place." if inplace else "."),
        axes={"nnz": Var(), "q_hidden": Const(), "k_hidden": Const(), "num_qo_heads": Const(),
              "num_kv_heads": Const(), "head_size_axis": Const(), "max_position": Const(),
              "rotary_dim": Const()},
        inputs={"positions": Tensor(["nnz"]), "query": Tensor(q_shape), "key": Tensor(k_shape),
                "head_size": Tensor(None, "int32"),
                "cos_sin_cache": Tensor(["max_position", "rotary_dim"]),
                "is_neox": Tensor(None, "bool")},
        outputs=outputs, abbrev={"q_hidden": "q", "k_hidden": "k", "max_position": "p",
                                 "rotary_dim": "rd", "head_size_axis": "d",
                                 "num_qo_heads": "h", "num_kv_heads": "kv"},
        reference=_ROPE_HELPERS + '''
def run(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    rd = cos_sin_cache.shape[1]
    c = cos_sin_cache[positions.long()].float()
    cos, sin = c[:, : rd // 2], c[:, rd // 2:]
    q = query.reshape(query.shape[0], -1, head_size)
    k = key.reshape(key.shape[0], -1, head_size)
    qo = _rotate(q, None, rd, not is_neox, cos=cos, sin=sin).reshape(query.shape)
    ko = _rotate(k, None, rd, not is_neox, cos=cos, sin=sin).reshape(key.shape)
    return qo, ko
''', example=example)


for _inplace in (False, True):
    _t = _cos_sin_template(_inplace)
    _add(_t.name_prefix, _t)

# --------------------------------------------------------------------------------------------
# cascade
# --------------------------------------------------------------------------------------------

_MERGE = '''import torch

def run(v_a, s_a, v_b, s_b):
    s_a, s_b = s_a.float(), s_b.float()
    s = torch.logaddexp(s_a * math.log(2), s_b * math.log(2)) / math.log(2)
    wa, wb = torch.exp2(s_a - s)[..., None], torch.exp2(s_b - s)[..., None]
    return (wa * v_a.float() + wb * v_b.float()).to(v_a.dtype), s
'''.replace("import torch", "import math\nimport torch")
_LHD = ["seq_len", "num_heads", "head_dim"]
_CASCADE_ABBREV = {"num_heads": "h", "head_dim": "d"}


def _merge_example(device: str):
    return (_randn(16, 4, 64, device=device), _randn(16, 4, dtype=torch.float32, device=device),
            _randn(16, 4, 64, device=device, seed=1),
            _randn(16, 4, dtype=torch.float32, device=device, seed=2)), {}


_add("merge_state", TraceTemplate(
    op_type="merge_state", name_prefix="merge_state",
    description="Merge two attention states (v, base-2 lse s): s = log2(2^s_a + 2^s_b).",
    axes={"seq_len": Var(), "num_heads": Const(), "head_dim": Const()},
    inputs={"v_a": Tensor(_LHD), "s_a": Tensor(_LHD[:2]), "v_b": Tensor(_LHD),
            "s_b": Tensor(_LHD[:2])},
    outputs={"v_merged": Tensor(_LHD, "=v_a", source="return[0]"),
             "s_merged": Tensor(_LHD[:2], "float32", source="return[1]")},
    reference=_MERGE, abbrev=_CASCADE_ABBREV, example=_merge_example))

_add("merge_state_in_place", TraceTemplate(
    op_type="merge_state", name_prefix="merge_state_in_place",
    description="Merge (v_other, s_other) into (v, s) in place; rows with mask False untouched.",
    axes={"seq_len": Var(), "num_heads": Const(), "head_dim": Const()},
    inputs={"v": Tensor(_LHD), "s": Tensor(_LHD[:2]), "v_other": Tensor(_LHD),
            "s_other": Tensor(_LHD[:2]), "mask": Tensor(["seq_len"], optional=True)},
    outputs={"v_out": Tensor(_LHD, "=v", source="arg:v"),
             "s_out": Tensor(_LHD[:2], "float32", source="arg:s")},
    reference=_MERGE.replace("def run(v_a, s_a, v_b, s_b):", "def _merge(v_a, s_a, v_b, s_b):")
    + '''
def run(v, s, v_other, s_other, mask=None):
    vm, sm = _merge(v, s, v_other, s_other)
    if mask is not None:
        keep = ~mask.bool()
        vm[keep], sm[keep] = v[keep], s.float()[keep]
    return vm, sm
''', abbrev=_CASCADE_ABBREV, example=_merge_example))

_add("merge_states", TraceTemplate(
    op_type="merge_state", name_prefix="merge_states",
    description="Merge num_states attention states per row: v (L, S, H, D), s (L, S, H).",
    axes={"seq_len": Var(), "num_states": Var(), "num_heads": Const(), "head_dim": Const()},
    inputs={"v": Tensor(["seq_len", "num_states", "num_heads", "head_dim"]),
            "s": Tensor(["seq_len", "num_states", "num_heads"])},
    outputs={"v_merged": Tensor(_LHD, "=v", source="return[0]"),
             "s_merged": Tensor(_LHD[:2], "float32", source="return[1]")},
    reference='''import torch

def run(v, s):
    s = s.float()
    m = torch.logsumexp(s * 0.6931471805599453, dim=1) / 0.6931471805599453
    w = torch.exp2(s - m[:, None])[..., None]
    return (w * v.float()).sum(1).to(v.dtype), m
''', abbrev=_CASCADE_ABBREV,
    example=lambda d: ((_randn(8, 3, 4, 64, device=d),
                        _randn(8, 3, 4, dtype=torch.float32, device=d, seed=1)), {})))

# --------------------------------------------------------------------------------------------
# page
# --------------------------------------------------------------------------------------------


def _nhd_cache(named: Dict[str, Any]) -> Dict[str, Any]:
    """k_cache, v_cache as [pages, page_size, heads, dim] views of the paged cache argument."""
    cache, layout = named.get("paged_kv_cache"), named.get("kv_layout", "NHD")
    if isinstance(cache, (tuple, list)):
        k, v = cache
    elif isinstance(cache, torch.Tensor):
        k, v = cache[:, 0], cache[:, 1]
    else:
        return {}
    if layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return {"k_cache": k, "v_cache": v}


def _append_example(device: str):
    pages, page, heads, dim = 6, 4, 2, 64
    cache = _randn(pages, 2, page, heads, dim, device=device, seed=5)
    kv_indptr = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    kv_indices = torch.tensor([4, 0, 1, 5, 2], dtype=torch.int32, device=device)
    last = torch.tensor([3, 2], dtype=torch.int32, device=device)
    # request 0 appends its last 3 tokens (positions 4..6), request 1 its last 2 (8..9)
    batch = torch.tensor([0, 0, 0, 1, 1], dtype=torch.int32, device=device)
    pos = torch.tensor([4, 5, 6, 8, 9], dtype=torch.int32, device=device)
    return (_randn(5, heads, dim, device=device), _randn(5, heads, dim, device=device, seed=1),
            batch, pos, cache, kv_indices, kv_indptr, last), {}


_add("append_paged_kv_cache", TraceTemplate(
    op_type="paged_kv_append", name_prefix="append_paged_kv_cache",
    description="Write appended K/V rows into the paged cache: entry t goes to request "
                "batch_indices[t], page kv_indices[kv_indptr[b] + positions[t] // page_size], "
                "slot positions[t] % page_size (in place).",
    axes={"nnz": Var(), "num_pages": Var(), "batch_size": Var(), "batch_size_plus_1": Var(),
          "num_used_pages": Var(), "page_size": Const(), "num_kv_heads": Const(),
          "head_dim": Const()},
    inputs={"append_key": Tensor(["nnz", "num_kv_heads", "head_dim"]),
            "append_value": Tensor(["nnz", "num_kv_heads", "head_dim"]),
            "batch_indices": Tensor(["nnz"]), "positions": Tensor(["nnz"]),
            "k_cache": Tensor(["num_pages", "page_size", "num_kv_heads", "head_dim"]),
            "v_cache": Tensor(["num_pages", "page_size", "num_kv_heads", "head_dim"]),
            "kv_indices": Tensor(["num_used_pages"]), "kv_indptr": Tensor(["batch_size_plus_1"]),
            "kv_last_page_len": Tensor(["batch_size"])},
    outputs={"k_cache_out": Tensor(["num_pages", "page_size", "num_kv_heads", "head_dim"],
                                   "=k_cache", source="extra:k_cache"),
             "v_cache_out": Tensor(["num_pages", "page_size", "num_kv_heads", "head_dim"],
                                   "=v_cache", source="extra:v_cache")},
    extra_inputs=_nhd_cache, mutates=("paged_kv_cache",),
    abbrev={"page_size": "ps", "num_kv_heads": "kv", "head_dim": "d"},
    reference='''import torch

def run(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices,
        kv_indptr, kv_last_page_len):
    page_size = k_cache.shape[1]
    k, v = k_cache.clone(), v_cache.clone()
    b, p = batch_indices.long(), positions.long()
    page = kv_indices.long()[kv_indptr.long()[b] + p // page_size]
    slot = p % page_size
    k[page, slot] = append_key.to(k.dtype)
    v[page, slot] = append_value.to(v.dtype)
    return k, v
''', example=_append_example))

_add("get_batch_indices_positions", TraceTemplate(
    op_type="paged_kv_append", name_prefix="get_batch_indices_positions",
    description="Per appended entry: its request and its position in that request's KV.",
    axes={"batch_size_plus_1": Var(), "batch_size": Var(), "nnz_out": Var("= nnz")},
    inputs={"append_indptr": Tensor(["batch_size_plus_1"]), "seq_lens": Tensor(["batch_size"]),
            "nnz": Tensor(None, "int32")},
    outputs={"batch_indices": Tensor(["nnz_out"], "int32", source="return[0]"),
             "positions_out": Tensor(["nnz_out"], "int32", source="return[1]")},
    reference='''import torch

def run(append_indptr, seq_lens, nnz):
    indptr = append_indptr.long()
    batch = torch.full((nnz,), -1, dtype=torch.int32, device=indptr.device)
    pos = torch.zeros(nnz, dtype=torch.int32, device=indptr.device)
    for b in range(indptr.numel() - 1):
        lo, hi = int(indptr[b]), int(indptr[b + 1])
        batch[lo:hi] = b
        pos[lo:hi] = torch.arange(hi - lo, device=indptr.device, dtype=torch.int32) + \\
            int(seq_lens[b]) - (hi - lo)
    return batch, pos
''', example=lambda d: ((torch.tensor([0, 3, 5], dtype=torch.int32, device=d),
                         torch.tensor([7, 2], dtype=torch.int32, device=d), 5), {})))

# --------------------------------------------------------------------------------------------
# attention (single request; the wrappers' run: shapes only, their plan lives in the wrapper)
# --------------------------------------------------------------------------------------------


def _nhd_kv(named: Dict[str, Any]) -> Dict[str, Any]:
    k, v = named.get("k"), named.get("v")
    if named.get("kv_layout", "NHD") == "HND" and isinstance(k, torch.Tensor):
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    return {"k_nhd": k, "v_nhd": v}


_ATTN_REF = '''import torch

def _attend(q, k, v, sm_scale, causal):
    # q (qo_len, Hq, D), k (kv_len, Hk, D), v (kv_len, Hk, Dv); bottom-right causal
    g = q.shape[1] // k.shape[1]
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    kf, vf = k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    logits = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    if causal:
        qo, kv = q.shape[0], k.shape[0]
        i = torch.arange(qo, device=q.device)[:, None]
        j = torch.arange(kv, device=q.device)[None, :]
        logits = logits.masked_fill(j > i + kv - qo, float("-inf"))
    p = torch.softmax(logits, -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, vf)
'''
_ATTN_ABBREV = {"num_qo_heads": "h", "num_kv_heads": "kv", "head_dim": "d",
                "head_dim_qk": "dqk", "head_dim_vo": "dvo", "page_size": "ps"}

_add("single_decode_with_kv_cache", TraceTemplate(
    op_type="gqa_decode", name_prefix="single_decode",
    description="Decode attention of one request: q (Hq, D) against its contiguous KV.",
    axes={"kv_len": Var(), "num_qo_heads": Const(), "num_kv_heads": Const(),
          "head_dim": Const()},
    inputs={"q": Tensor(["num_qo_heads", "head_dim"]),
            "k": Tensor(["kv_len", "num_kv_heads", "head_dim"], param="k_nhd"),
            "v": Tensor(["kv_len", "num_kv_heads", "head_dim"], param="v_nhd"),
            "sm_scale": Tensor(None, "float32", optional=True)},
    outputs={"output": Tensor(["num_qo_heads", "head_dim"], "=q")},
    extra_inputs=_nhd_kv, abbrev=_ATTN_ABBREV,
    reference=_ATTN_REF + '''
def run(q, k, v, sm_scale=None):
    return _attend(q[None], k, v, sm_scale, False)[0].to(q.dtype)
''', example=lambda d: ((_randn(8, 128, device=d), _randn(300, 2, 128, device=d, seed=1),
                         _randn(300, 2, 128, device=d, seed=2)), {})))

_add("single_prefill_with_kv_cache", TraceTemplate(
    op_type="gqa_prefill", name_prefix="single_prefill",
    description="Prefill attention of one request (bottom-right causal when causal=True).",
    axes={"qo_len": Var(), "kv_len": Var(), "num_qo_heads": Const(), "num_kv_heads": Const(),
          "head_dim_qk": Const(), "head_dim_vo": Const()},
    inputs={"q": Tensor(["qo_len", "num_qo_heads", "head_dim_qk"]),
            "k": Tensor(["kv_len", "num_kv_heads", "head_dim_qk"], param="k_nhd"),
            "v": Tensor(["kv_len", "num_kv_heads", "head_dim_vo"], param="v_nhd"),
            "causal": Tensor(None, "bool"), "sm_scale": Tensor(None, "float32", optional=True)},
    outputs={"output": Tensor(["qo_len", "num_qo_heads", "head_dim_vo"], "=q")},
    extra_inputs=_nhd_kv, abbrev=_ATTN_ABBREV,
    reference=_ATTN_REF + '''
def run(q, k, v, causal=False, sm_scale=None):
    return _attend(q, k, v, sm_scale, causal).to(q.dtype)
''', example=lambda d: ((_randn(64, 8, 128, device=d), _randn(200, 2, 128, device=d, seed=1),
                         _randn(200, 2, 128, device=d, seed=2)), {"causal": True})))


def _wrapper_inputs(named: Dict[str, Any]) -> Dict[str, Any]:
    """The planned page table, scale and mask of the wrapper (``self``), and the cache as NHD
    views (attribute names of our wrappers; a missing one leaves its optional input out)."""
    self = named.get("self")
    out = {name: getattr(self, f"_{name}", None)
           for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "sm_scale")}
    causal = getattr(self, "_causal", None)
    if causal is None and getattr(self, "_variant", None) is not None:
        causal = getattr(self._variant, "mask_mode", "none") == "causal"
    out["causal"] = causal
    layout = getattr(self, "_kv_layout", "NHD")
    out.update(_nhd_cache({"paged_kv_cache": named.get("paged_kv_cache"), "kv_layout": layout}))
    return out


_PAGED_REF = _ATTN_REF + '''
def _request_kv(k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, b):
    pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
    n = (pages.numel() - 1) * k_cache.shape[1] + int(kv_last_page_len[b]) if pages.numel() else 0
    k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n]
    v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n]
    return k, v
'''


_PAGED_IN = {"k_cache": Tensor(["num_pages", "page_size", "num_kv_heads", "head_dim"]),
             "v_cache": Tensor(["num_pages", "page_size", "num_kv_heads", "head_dim"]),
             "kv_indptr": Tensor(["batch_size_plus_1"], optional=True),
             "kv_indices": Tensor(["num_used_pages"], optional=True),
             "kv_last_page_len": Tensor(["batch_size"], optional=True)}
_PAGED_AXES = {"num_pages": Var(), "batch_size": Var(), "batch_size_plus_1": Var(),
               "num_used_pages": Var(), "page_size": Const(), "num_qo_heads": Const(),
               "num_kv_heads": Const(), "head_dim": Const()}

_add("BatchDecodeWithPagedKVCacheWrapper.run", TraceTemplate(
    op_type="gqa_paged_decode", name_prefix="gqa_paged_decode",
    description="Batch decode over a paged KV cache (the page table is the planned one).",
    axes=dict(_PAGED_AXES),
    inputs={"q": Tensor(["batch_size", "num_qo_heads", "head_dim"]), **_PAGED_IN,
            "sm_scale": Tensor(None, "float32", optional=True)},
    outputs={"output": Tensor(["batch_size", "num_qo_heads", "head_dim"], "=q")},
    extra_inputs=_wrapper_inputs, abbrev=_ATTN_ABBREV,
    reference=_PAGED_REF + '''
def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=None):
    outs = []
    for b in range(q.shape[0]):
        k, v = _request_kv(k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, b)
        outs.append(_attend(q[b:b + 1], k, v, sm_scale, False)[0])
    return torch.stack(outs).to(q.dtype)
'''))
_add("BatchPrefillWithPagedKVCacheWrapper.run", TraceTemplate(
    op_type="gqa_paged_prefill", name_prefix="gqa_paged_prefill",
    description="Batch prefill over a paged KV cache (the page table is the planned one).",
    axes={**_PAGED_AXES, "total_q": Var()},
    inputs={"q": Tensor(["total_q", "num_qo_heads", "head_dim"]),
            "qo_indptr": Tensor(["batch_size_plus_1"], optional=True), **_PAGED_IN,
            "causal": Tensor(None, "bool", optional=True),
            "sm_scale": Tensor(None, "float32", optional=True)},
    outputs={"output": Tensor(["total_q", "num_qo_heads", "head_dim"], "=q")},
    extra_inputs=_wrapper_inputs, abbrev=_ATTN_ABBREV,
    reference=_PAGED_REF + '''
def run(q, qo_indptr, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, causal=False,
        sm_scale=None):
    outs = []
    for b in range(qo_indptr.numel() - 1):
        k, v = _request_kv(k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, b)
        qb = q[int(qo_indptr[b]):int(qo_indptr[b + 1])]
        outs.append(_attend(qb, k, v, sm_scale, causal))
    return torch.cat(outs).to(q.dtype)
'''))
_add("BatchPrefillWithRaggedKVCacheWrapper.run", TraceTemplate(
    op_type="gqa_ragged_prefill", name_prefix="gqa_ragged_prefill",
    description="Batch prefill over ragged K/V (the indptrs are the planned ones).",
    axes={"total_q": Var(), "total_kv": Var(), "batch_size_plus_1": Var(),
          "num_qo_heads": Const(), "num_kv_heads": Const(), "head_dim_qk": Const(),
          "head_dim_vo": Const()},
    inputs={"q": Tensor(["total_q", "num_qo_heads", "head_dim_qk"]),
            "k": Tensor(["total_kv", "num_kv_heads", "head_dim_qk"]),
            "v": Tensor(["total_kv", "num_kv_heads", "head_dim_vo"]),
            "qo_indptr": Tensor(["batch_size_plus_1"], optional=True),
            "kv_indptr": Tensor(["batch_size_plus_1"], optional=True),
            "causal": Tensor(None, "bool", optional=True),
            "sm_scale": Tensor(None, "float32", optional=True)},
    outputs={"output": Tensor(["total_q", "num_qo_heads", "head_dim_vo"], "=q")},
    extra_inputs=lambda n: {k: v for k, v in _wrapper_inputs(n).items()
                            if k in ("qo_indptr", "kv_indptr", "causal", "sm_scale")},
    abbrev=_ATTN_ABBREV,
    reference=_ATTN_REF + '''
def run(q, k, v, qo_indptr, kv_indptr, causal=False, sm_scale=None):
    outs = []
    for b in range(qo_indptr.numel() - 1):
        qb = q[int(qo_indptr[b]):int(qo_indptr[b + 1])]
        kb, vb = (x[int(kv_indptr[b]):int(kv_indptr[b + 1])] for x in (k, v))
        outs.append(_attend(qb, kb, vb, sm_scale, causal))
    return torch.cat(outs).to(q.dtype)
'''))
_add("MultiLevelCascadeAttentionWrapper.run", TraceTemplate(
    op_type="gqa_cascade", name_prefix="gqa_cascade",
    description="Multi-level cascade attention over a paged cache (planned per level).",
    axes={**_PAGED_AXES, "total_q": Var()},
    inputs={"q": Tensor(["total_q", "num_qo_heads", "head_dim"]),
            "k_cache": _PAGED_IN["k_cache"], "v_cache": _PAGED_IN["v_cache"]},
    outputs={"output": Tensor(["total_q", "num_qo_heads", "head_dim"], "=q")},
    extra_inputs=lambda n: _nhd_cache({"paged_kv_cache": n.get("paged_kv_cache"),
                                       "kv_layout": getattr(n.get("self"), "_kv_layout", "NHD")}),
    abbrev=_ATTN_ABBREV))

# --------------------------------------------------------------------------------------------
# quantization, tutorial
# --------------------------------------------------------------------------------------------

_PACK = '''import torch

def _pack(x, bitorder):
    bits = (x != 0).to(torch.int64).flatten()
    pad = (-bits.numel()) % 8
    bits = torch.cat([bits, bits.new_zeros(pad)]).view(-1, 8)
    w = 2 ** torch.arange(8, device=x.device)
    if bitorder == "big":
        w = w.flip(0)
    return (bits * w).sum(-1).to(torch.uint8)
'''
_add("packbits", TraceTemplate(
    op_type="packbits", name_prefix="packbits",
    description="numpy.packbits of a 1-D tensor (nonzero = 1); bitorder big by default. "
                "The output is uint8 (not in flashinfer-bench's dtype list).",
    axes={"n": Var(), "n_bytes": Var("(n + 7) // 8")},
    inputs={"x": Tensor(["n"])},
    outputs={"y": Tensor(["n_bytes"], "uint8")},
    reference=_PACK + '''
def run(x, bitorder="big"):
    return _pack(x, bitorder)
''', example=lambda d: ((torch.rand(37, generator=_gen(6)).lt(0.5).to(d),), {})))
_add("segment_packbits", TraceTemplate(
    op_type="packbits", name_prefix="segment_packbits",
    description="packbits of each segment x[indptr[i]:indptr[i+1]], each byte-padded.",
    axes={"n": Var(), "batch_size_plus_1": Var(), "n_bytes": Var()},
    inputs={"x": Tensor(["n"]), "indptr": Tensor(["batch_size_plus_1"])},
    outputs={"y": Tensor(["n_bytes"], "uint8", source="return[0]"),
             "indptr_new": Tensor(["batch_size_plus_1"], "int32", source="return[1]")},
    reference=_PACK + '''
def run(x, indptr, bitorder="big"):
    parts, new = [], [0]
    for i in range(indptr.numel() - 1):
        seg = x[int(indptr[i]):int(indptr[i + 1])]
        parts.append(_pack(seg, bitorder))
        new.append(new[-1] + parts[-1].numel())
    y = torch.cat(parts) if parts else x.new_zeros(0, dtype=torch.uint8)
    return y, torch.tensor(new, dtype=torch.int32, device=x.device)
''', example=lambda d: ((torch.rand(37, generator=_gen(7)).lt(0.5).to(d),
                         torch.tensor([0, 10, 10, 37], dtype=torch.int32, device=d)), {})))
_add("scale", TraceTemplate(
    op_type="scale", name_prefix="scale",
    description="input * factor (the kernel tutorial's op).",
    axes={"rows": Var(), "cols": Const()},
    inputs={"input": Tensor({1: ["rows"], 2: ["rows", "cols"]}),
            "factor": Tensor(None, "float32")},
    outputs={"output": Tensor({1: ["rows"], 2: ["rows", "cols"]}, "=input", param="input")},
    reference='''import torch

def run(input, factor):
    return (input.float() * factor).to(input.dtype)
''', example=lambda d: ((_randn(8, 100, device=d), 1.5), {})))

# --------------------------------------------------------------------------------------------
# sampling (flashinfer.sampling) and top-k (flashinfer.topk), from the API contract
# --------------------------------------------------------------------------------------------

_BV = ["batch_size", "vocab_size"]
_SAMPLING_AXES = {"batch_size": Var(), "vocab_size": Const()}
_PARAM = {0: None, 1: ["batch_size"]}  # a float/int, or a (batch,) tensor
_FILTERS = '''import torch

def _top_k_mask(p, k):
    k = torch.as_tensor(k, device=p.device).long().expand(p.shape[0]).clamp(max=p.shape[-1])
    kth = torch.sort(p, -1, descending=True).values.gather(-1, (k - 1)[:, None])
    return p >= kth

def _top_p_mask(p, top_p):
    top_p = torch.as_tensor(top_p, device=p.device, dtype=torch.float32).expand(p.shape[0])
    sorted_p, idx = torch.sort(p, -1)
    cdf = sorted_p.cumsum(-1)
    keep_sorted = cdf > (1 - top_p[:, None]) * cdf[:, -1:] - 1e-7
    keep_sorted[:, -1] = True
    return torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)

def _min_p_mask(p, min_p):
    min_p = torch.as_tensor(min_p, device=p.device, dtype=torch.float32).expand(p.shape[0])
    return p >= min_p[:, None] * p.max(-1, keepdim=True).values

def _sample(p, mask):
    q = torch.where(mask, p, torch.zeros_like(p))
    return torch.multinomial(q / q.sum(-1, keepdim=True), 1)[:, 0].to(torch.int32)
'''


def _probs(device: str, batch: int = 4, vocab: int = 1000):
    return torch.softmax(torch.randn(batch, vocab, generator=_gen(8)) * 3, -1).to(device)


def _sampling(op: str, params: Dict[str, Tensor], body: str, example, logits: bool = False,
              deterministic: bool = False, output: Tensor = None, description: str = ""):
    first = "logits" if logits else "probs"
    sig = ", ".join([first] + [f"{k}=None" if v.optional else k for k, v in params.items()])
    _add(op, TraceTemplate(
        op_type="sampling", name_prefix=op, description=description or op,
        axes=dict(_SAMPLING_AXES), inputs={first: Tensor(_BV), **params},
        outputs={"samples" if output is None else "output":
                 output or Tensor(["batch_size"], "int32")},
        reference=_FILTERS + f"\ndef run({sig}):\n    {body}\n", abbrev={"vocab_size": "v"},
        deterministic=deterministic, example=example))


_sampling("softmax", {"temperature": Tensor(_PARAM, "float32", optional=True)},
          "t = 1.0 if temperature is None else torch.as_tensor(temperature, device=logits.device)"
          ".float().reshape(-1, 1)\n    return torch.softmax(logits.float() / t, -1)",
          lambda d: ((_randn(4, 1000, dtype=torch.float32, device=d),), {"temperature": 0.7}),
          logits=True, deterministic=True, output=Tensor(_BV, "float32"),
          description="Softmax of logits / temperature, float32.")
_sampling("sampling_from_probs", {},
          "return _sample(probs.float(), probs > 0)",
          lambda d: ((_probs(d),), {}), description="Sample one token per row of probs.")
_sampling("sampling_from_logits", {},
          "p = torch.softmax(logits.float(), -1)\n    return _sample(p, p > 0)",
          lambda d: ((_randn(4, 1000, dtype=torch.float32, device=d),), {}), logits=True,
          description="Sample one token per row of softmax(logits).")
_sampling("top_p_sampling_from_probs", {"top_p": Tensor(_PARAM, "float32")},
          "p = probs.float()\n    return _sample(p, _top_p_mask(p, top_p))",
          lambda d: ((_probs(d), 0.9), {}), description="Top-p (nucleus) sampling.")
_sampling("top_k_sampling_from_probs", {"top_k": Tensor(_PARAM, "int32")},
          "p = probs.float()\n    return _sample(p, _top_k_mask(p, top_k))",
          lambda d: ((_probs(d), 20), {}), description="Top-k sampling.")
_sampling("min_p_sampling_from_probs", {"min_p": Tensor(_PARAM, "float32")},
          "p = probs.float()\n    return _sample(p, _min_p_mask(p, min_p))",
          lambda d: ((_probs(d), 0.1), {}), description="Min-p sampling.")
for _src in ("probs", "logits"):
    _sampling(f"top_k_top_p_sampling_from_{_src}",
              {"top_k": Tensor(_PARAM, "int32"), "top_p": Tensor(_PARAM, "float32")},
              ("p = torch.softmax(logits.float(), -1)" if _src == "logits" else "p = probs.float()")
              + "\n    m = _top_k_mask(p, top_k)\n    q = torch.where(m, p, torch.zeros_like(p))"
              "\n    q = q / q.sum(-1, keepdim=True)\n    return _sample(q, m & _top_p_mask(q, top_p))",
              (lambda s: lambda d: ((_probs(d) if s == "probs" else
                                     _randn(4, 1000, dtype=torch.float32, device=d), 20, 0.9), {}))
              (_src), logits=_src == "logits",
              description=f"Top-k then top-p sampling from {_src} (filter_apply_order top_k_first).")
_sampling("top_p_renorm_probs", {"top_p": Tensor(_PARAM, "float32")},
          "p = probs.float()\n    q = torch.where(_top_p_mask(p, top_p), p, torch.zeros_like(p))"
          "\n    return q / q.sum(-1, keepdim=True)",
          lambda d: ((_probs(d), 0.9), {}), deterministic=True,
          output=Tensor(_BV, "float32"), description="Renormalize probs over the top-p set.")
_sampling("top_k_renorm_probs", {"top_k": Tensor(_PARAM, "int32")},
          "p = probs.float()\n    q = torch.where(_top_k_mask(p, top_k), p, torch.zeros_like(p))"
          "\n    return (q / q.sum(-1, keepdim=True)).to(probs.dtype)",
          lambda d: ((_probs(d), 20), {}), deterministic=True,
          output=Tensor(_BV, "=probs"), description="Renormalize probs over the top-k set.")
_sampling("top_k_mask_logits", {"top_k": Tensor(_PARAM, "int32")},
          "m = _top_k_mask(logits.float(), top_k)\n"
          "    return torch.where(m, logits, torch.full_like(logits, float('-inf')))",
          lambda d: ((_randn(4, 1000, dtype=torch.float32, device=d), 20), {}), logits=True,
          deterministic=True, output=Tensor(_BV, "=logits"),
          description="Logits outside the top k set to -inf.")
TEMPLATES["top_p_renorm_prob"] = TEMPLATES["top_p_renorm_probs"]
TEMPLATES["top_k_renorm_prob"] = TEMPLATES["top_k_renorm_probs"]


def _chain_example(device: str):
    b, n, v = 3, 4, 500
    draft = torch.softmax(torch.randn(b, n, v, generator=_gen(9)), -1).to(device)
    target = torch.softmax(torch.randn(b, n + 1, v, generator=_gen(10)), -1).to(device)
    ids = torch.randint(0, v, (b, n), generator=_gen(11), dtype=torch.int32).to(device)
    return (draft, ids, target), {}


_add("chain_speculative_sampling", TraceTemplate(
    op_type="sampling", name_prefix="chain_speculative_sampling",
    description="Chain speculative sampling: accepted draft prefix, one resampled or bonus "
                "token, then -1s; accepted and emitted counts.",
    axes={"batch_size": Var(), "num_speculate_tokens": Const(), "num_speculate_tokens_plus_1":
          Const(derive=lambda s: s["num_speculate_tokens"] + 1), "vocab_size": Const()},
    inputs={"draft_probs": Tensor(["batch_size", "num_speculate_tokens", "vocab_size"]),
            "draft_token_ids": Tensor(["batch_size", "num_speculate_tokens"]),
            "target_probs": Tensor(["batch_size", "num_speculate_tokens_plus_1", "vocab_size"])},
    outputs={"output_token_ids": Tensor(["batch_size", "num_speculate_tokens_plus_1"], "int32",
                                        source="return[0]"),
             "output_accepted_token_num": Tensor(["batch_size"], "int32", source="return[1]"),
             "output_emitted_draft_token_num": Tensor(["batch_size"], "int32",
                                                     source="return[2]")},
    reference='''import torch

def run(draft_probs, draft_token_ids, target_probs):
    b, n, v = draft_probs.shape
    out = torch.full((b, n + 1), -1, dtype=torch.int32, device=draft_probs.device)
    accepted = torch.zeros(b, dtype=torch.int32, device=draft_probs.device)
    emitted = torch.zeros(b, dtype=torch.int32, device=draft_probs.device)
    for i in range(b):
        j = 0
        while j < n:
            t = int(draft_token_ids[i, j])
            ratio = target_probs[i, j, t] / draft_probs[i, j, t].clamp_min(1e-20)
            if torch.rand((), device=draft_probs.device) < ratio:
                out[i, j] = t
                j += 1
            else:
                break
        emitted[i] = j
        for jj in range(n):
            t = int(draft_token_ids[i, jj])
            accepted[i] += int(target_probs[i, jj, t] >= draft_probs[i, jj, t])
        if j < n:
            r = (target_probs[i, j] - draft_probs[i, j]).clamp_min(0)
        else:
            r = target_probs[i, n]
        out[i, j] = torch.multinomial(r / r.sum(), 1)[0]
    return out, accepted, emitted
''', abbrev={"num_speculate_tokens": "n", "vocab_size": "v",
             "num_speculate_tokens_plus_1": "n1"},
    deterministic=False, example=_chain_example))

_TOPK_REF = '''import torch

def run(input, k):
    values, indices = torch.topk(input.float(), k, dim=-1, sorted=True)
    return values.to(input.dtype), indices
'''
_add("top_k", TraceTemplate(
    op_type="topk", name_prefix="top_k",
    description="The k largest values of each row and their int64 indices (unsorted unless "
                "sorted=True).",
    axes={"batch_size": Var(), "vocab_size": Const(), "k_axis": Const("k", derive=lambda s: s["k"])},
    inputs={"input": Tensor(_BV), "k": Tensor(None, "int32")},
    outputs={"values": Tensor(["batch_size", "k_axis"], "=input", source="return[0]"),
             "indices": Tensor(["batch_size", "k_axis"], "int64", source="return[1]")},
    reference=_TOPK_REF, abbrev={"vocab_size": "v", "k_axis": "k"},
    example=lambda d: ((_randn(4, 1000, dtype=torch.float32, device=d), 16), {"sorted": True})))

_TOPK_ROWS = '''import torch

def _rows_topk(input, lengths, k):
    """Per row: the indices of the k largest of input[i, :lengths[i]] (-1 past the length)."""
    out = torch.full((input.shape[0], k), -1, dtype=torch.int64, device=input.device)
    for i in range(input.shape[0]):
        n = min(int(lengths[i]), k)
        out[i, :n] = torch.topk(input[i, : int(lengths[i])].float(), n).indices
    return out
'''
_TOPK_AXES = {"num_rows": Var(), "max_len": Const(), "k_axis": Const("k", derive=lambda s: s["k"])}


def _topk_rows_example(page_table: bool):
    def example(device: str):
        rows, length = 6, 512
        x = _randn(rows, length, dtype=torch.float32, device=device)
        lengths = torch.full((rows,), length, dtype=torch.int32, device=device)
        if page_table:
            table = torch.randperm(rows * length, generator=_gen(12))[: rows * length].view(
                rows, length).to(torch.int32).to(device)
            return (x, table, lengths, 32), {}
        offsets = torch.arange(rows, dtype=torch.int32, device=device) * 1000
        return (x, offsets, lengths, 32), {}
    return example


_add("top_k_page_table_transform", TraceTemplate(
    op_type="topk", name_prefix="top_k_page_table_transform",
    description="Top-k of each row's first lengths[i] scores, mapped through the page table: "
                "out[i, j] = src_page_table[row_to_batch[i] or i, topk_j] (order unspecified).",
    axes={**_TOPK_AXES, "num_batches": Var()},
    inputs={"input": Tensor(["num_rows", "max_len"]),
            "src_page_table": Tensor(["num_batches", "max_len"]),
            "lengths": Tensor(["num_rows"]), "k": Tensor(None, "int32"),
            "row_to_batch": Tensor(["num_rows"], optional=True)},
    outputs={"output_page_table": Tensor(["num_rows", "k_axis"], "int32")},
    abbrev={"max_len": "l", "k_axis": "k"}, order_free=True,
    reference=_TOPK_ROWS + '''
def run(input, src_page_table, lengths, k, row_to_batch=None):
    idx = _rows_topk(input, lengths, k)
    rows = torch.arange(input.shape[0], device=input.device)
    batch = rows if row_to_batch is None else row_to_batch.long()
    out = src_page_table.long()[batch[:, None], idx.clamp(min=0)]
    return torch.where(idx >= 0, out, torch.full_like(out, -1)).to(torch.int32)
''', example=_topk_rows_example(True)))
_add("top_k_ragged_transform", TraceTemplate(
    op_type="topk", name_prefix="top_k_ragged_transform",
    description="Top-k of each row's first lengths[i] scores, shifted by the row's offset: "
                "out[i, j] = topk_j + offsets[i] (order unspecified).",
    axes=dict(_TOPK_AXES),
    inputs={"input": Tensor(["num_rows", "max_len"]), "offsets": Tensor(["num_rows"]),
            "lengths": Tensor(["num_rows"]), "k": Tensor(None, "int32")},
    outputs={"output_indices": Tensor(["num_rows", "k_axis"], "int32")},
    abbrev={"max_len": "l", "k_axis": "k"}, order_free=True,
    reference=_TOPK_ROWS + '''
def run(input, offsets, lengths, k):
    idx = _rows_topk(input, lengths, k)
    out = idx + offsets.long()[:, None]
    return torch.where(idx >= 0, out, torch.full_like(out, -1)).to(torch.int32)
''', example=_topk_rows_example(False)))

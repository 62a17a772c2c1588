"""fi_trace: every public op has a template, .fi_trace describes a call without running it, the
trace dump writes one JSON per (op, shapes), the committed fi_trace_out/ is current and loads in
flashinfer-bench, and (GPU) every template's reference agrees with its op."""

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import flashinfer
from flashinfer import api_logging, fi_trace
from flashinfer.fi_trace import Const, Tensor, TraceTemplate, Var
from flashinfer.trace_templates import TEMPLATES

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "trace"))
import example  # noqa: E402

CONTRACT_SAMPLING = [
    "softmax", "sampling_from_probs", "sampling_from_logits", "top_p_sampling_from_probs",
    "top_k_sampling_from_probs", "min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits", "top_p_renorm_probs", "top_k_renorm_probs",
    "top_k_mask_logits", "chain_speculative_sampling", "top_p_renorm_prob", "top_k_renorm_prob",
]
CONTRACT_TOPK = ["top_k", "top_k_page_table_transform", "top_k_ragged_transform"]


def _import_every_op_module():
    for module in list(flashinfer._OPS) + ["sampling", "topk"]:
        try:
            importlib.import_module(f"flashinfer.{module}")
        except ImportError:
            pass


def test_every_decorated_op_has_a_template():
    _import_every_op_module()
    public = {q for q, m in fi_trace.DECORATED.items() if m.startswith("flashinfer.")}
    assert len(public) >= 27
    missing = sorted(q for q in public if fi_trace.template_for(q) is None)
    assert missing == [], f"add a TraceTemplate to flashinfer/trace_templates.py for {missing}"


def test_contract_sampling_and_topk_have_templates():
    assert [n for n in CONTRACT_SAMPLING + CONTRACT_TOPK if n not in TEMPLATES] == []


def test_every_decorated_op_grows_fi_trace_and_runs_no_kernel():
    x, w = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    desc = flashinfer.rmsnorm.fi_trace(x, w)  # CPU tensors: the op itself would refuse them
    assert desc["name"] == "rmsnorm_h64_bf16"
    assert desc["tags"] == ["fi_api:flashinfer.norm.rmsnorm"]
    assert desc["axes"] == {"batch_size": {"type": "var", "description": "rows"},
                            "hidden_size": {"type": "const", "value": 64,
                                            "description": "normalized size"}}
    qk = flashinfer.rmsnorm.fi_trace(torch.randn(3, 8, 64, dtype=torch.bfloat16), w)
    assert qk["axes"]["num_heads"]["value"] == 8 and qk["name"] == "rmsnorm_nh8_h64_bf16"
    with pytest.raises(ValueError, match="axis 'hidden_size' is 64 and 32"):
        flashinfer.rmsnorm.fi_trace(x, torch.randn(32, dtype=torch.bfloat16))


def _template(prefix="fake_trace"):
    return TraceTemplate(
        op_type="fake", name_prefix=prefix, description="x * 2",
        axes={"rows": Var(), "cols": Const()}, inputs={"x": Tensor(["rows", "cols"])},
        outputs={"y": Tensor(["rows", "cols"], "=x")},
        reference="import torch\n\ndef run(x):\n    return x * 2\n")


def test_explicit_template_and_trace_dump_dedup(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_TRACE_DUMP", "1")
    monkeypatch.setenv("FLASHINFER_TRACE_DUMP_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", "0")
    fi_trace.reset()
    calls = []

    @api_logging.flashinfer_api(trace=_template())
    def fake_trace_op(x):
        calls.append(x.shape)
        return x * 2

    fake_trace_op(torch.ones(2, 8))
    fake_trace_op(torch.ones(5, 8))  # same const axes: deduplicated
    fake_trace_op(torch.ones(2, 16))
    assert len(calls) == 3
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["fake_trace_cols16_fp32.json", "fake_trace_cols8_fp32.json"]
    monkeypatch.setenv("FLASHINFER_TRACE_DUMP", "0")  # read at call time
    fake_trace_op(torch.ones(2, 32))
    assert len(list((tmp_path / "out").iterdir())) == 2
    fi_trace.reset()


def test_no_wrapper_at_level_zero_without_the_dump(monkeypatch):
    monkeypatch.delenv("FLASHINFER_TRACE_DUMP", raising=False)
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", "0")

    def plain(x):
        return x

    assert api_logging.flashinfer_api(plain) is plain
    assert plain.fi_trace.__doc__.startswith("The trace JSON")


def _validate(desc):
    """flashinfer-bench's Definition rules, checked without it."""
    for key in ("name", "op_type", "axes", "inputs", "outputs", "reference"):
        assert desc[key] not in (None, "", {}) or key == "outputs", key
    assert any(t.startswith("fi_api:flashinfer.") for t in desc["tags"])
    assert not set(desc["inputs"]) & set(desc["outputs"])
    for spec in list(desc["inputs"].values()) + list(desc["outputs"].values()):
        for axis in spec["shape"] or []:
            assert axis in desc["axes"], axis
    for axis in desc["axes"].values():
        assert axis["type"] in ("var", "const")
        assert axis["type"] == "var" or axis["value"] >= 0
    assert "def run(" in desc["reference"]
    compile(desc["reference"], desc["name"], "exec")


def test_committed_fi_trace_out_is_current_and_valid():
    current = example.describe_all()
    files = {p.stem: json.loads(p.read_text()) for p in example.OUT.glob("*.json")}
    assert files == current, "run python tests/trace/example.py"
    assert len(files) >= 40
    for desc in files.values():
        _validate(desc)


def test_files_load_in_flashinfer_bench():
    if importlib.util.find_spec("flashinfer_bench") is None:
        pytest.skip("flashinfer-bench not installed (pip install flashinfer-bench --no-deps)")
    from flashinfer_bench.data import Definition, load_json_file

    loaded, uint8 = 0, []
    for path in sorted(example.OUT.glob("*.json")):
        desc = json.loads(path.read_text())
        dtypes = {s["dtype"] for s in list(desc["inputs"].values()) + list(desc["outputs"].values())}
        if "uint8" in dtypes:  # flashinfer-bench's dtype list has no uint8 (packbits' output)
            with pytest.raises(Exception, match="uint8"):
                load_json_file(Definition, path)
            uint8.append(path.stem)
            continue
        definition = load_json_file(Definition, path)
        assert definition.name == desc["name"]
        loaded += 1
    assert loaded >= 38 and sorted(uint8) == ["packbits_bool", "segment_packbits_bool"]


def test_references_run_on_cpu_and_give_the_declared_outputs():
    from flashinfer.fi_trace import bind_arguments

    for qualname, template in TEMPLATES.items():
        if template.example is None or template.reference is None:
            continue
        args, kwargs = template.example("cpu")
        op = example.op_of(qualname)
        named = bind_arguments(op, args, kwargs) if op is not None else \
            dict(zip(template.inputs, args), **kwargs)
        if template.extra_inputs:
            named.update(template.extra_inputs(named))
        inputs = {k: named[s.param or k] for k, s in template.inputs.items()
                  if named.get(s.param or k) is not None}
        out = template.reference_fn()(**inputs)
        outs = out if isinstance(out, tuple) else (out,)
        assert len(outs) == len(template.outputs), qualname


# --------------------------------------------------------------------------------------------
# GPU: each template's reference agrees with its op
# --------------------------------------------------------------------------------------------


def _op_outputs(template, named, result):
    values = []
    extra = template.extra_inputs(named) if template.extra_inputs else {}
    for spec in template.outputs.values():
        src = spec.source
        if src == "return":
            values.append(result)
        elif src.startswith("return["):
            values.append(result[int(src[7:-1])])
        elif src.startswith("arg:"):
            values.append(named[src[4:]])
        else:
            values.append(extra[src[6:]])
    return values


GPU_CASES = sorted(q for q, t in TEMPLATES.items() if t.example is not None)


@pytest.mark.gpu
@pytest.mark.parametrize("qualname", GPU_CASES)
def test_reference_agrees_with_the_op(qualname):
    from flashinfer.fi_trace import bind_arguments

    template = TEMPLATES[qualname]
    op = example.op_of(qualname)
    if op is None:
        pytest.skip(f"flashinfer.{'topk' if template.op_type == 'topk' else 'sampling'} "
                    "not present")
    args, kwargs = template.example("cuda")
    named = bind_arguments(op, args, kwargs)
    if template.extra_inputs:
        named.update(template.extra_inputs(named))
    inputs = {k: named[s.param or k] for k, s in template.inputs.items()
              if named.get(s.param or k) is not None}
    inputs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    want = template.reference_fn()(**inputs)
    want = list(want) if isinstance(want, tuple) else [want]
    result = op(*args, **kwargs)
    got = _op_outputs(template, named, result)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if not template.deterministic:
            continue  # random samples: shape and dtype only (the CLI's refcheck checks support)
        if template.order_free:  # a set per row (top-k): any order
            g, w = g.sort(-1).values, w.sort(-1).values
        tol = {torch.bfloat16: 2e-2, torch.float16: 1e-2}.get(g.dtype, 1e-4)
        if not g.is_floating_point():
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=tol)


def test_a_bad_trace_dump_value_warns_once(monkeypatch):
    monkeypatch.setenv("FLASHINFER_TRACE_DUMP", "maybe")
    monkeypatch.setattr(fi_trace, "_bad_knob_warned", False)
    with pytest.warns(RuntimeWarning, match="FLASHINFER_TRACE_DUMP") as caught:
        for _ in range(3):
            assert fi_trace.requested_at_decoration() is False
    assert len(caught) == 1


def test_wrapper_references_agree_with_the_single_request_one():
    """The batch wrappers' references (paged decode, paged and ragged prefill) over a page
    table built from contiguous K/V equal the single-request reference per request."""
    torch.manual_seed(0)
    single = TEMPLATES["single_prefill_with_kv_cache"].reference_fn()
    decode = TEMPLATES["BatchDecodeWithPagedKVCacheWrapper.run"].reference_fn()
    paged = TEMPLATES["BatchPrefillWithPagedKVCacheWrapper.run"].reference_fn()
    ragged = TEMPLATES["BatchPrefillWithRaggedKVCacheWrapper.run"].reference_fn()
    ps, hq, hk, d, kv_lens, qo_lens = 4, 4, 2, 16, [5, 0, 9], [3, 0, 2]
    ks = [torch.randn(n, hk, d) for n in kv_lens]
    vs = [torch.randn(n, hk, d) for n in kv_lens]
    pages = [max(0, -(-n // ps)) for n in kv_lens]
    perm = torch.randperm(sum(pages))
    k_cache, v_cache = torch.zeros(sum(pages), ps, hk, d), torch.zeros(sum(pages), ps, hk, d)
    indptr, start = [0], 0
    for n, p, k, v in zip(kv_lens, pages, ks, vs):
        for i in range(p):
            rows = slice(i * ps, min(n, (i + 1) * ps))
            page = perm[start + i]
            k_cache[page, : rows.stop - rows.start] = k[rows]
            v_cache[page, : rows.stop - rows.start] = v[rows]
        start += p
        indptr.append(start)
    kv_indptr = torch.tensor(indptr)
    last = torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(kv_lens, pages)])
    q = torch.randn(sum(qo_lens), hq, d)
    qo_indptr = torch.tensor([0, 3, 3, 5])
    want = torch.cat([single(q[int(qo_indptr[b]):int(qo_indptr[b + 1])], ks[b], vs[b], True)
                      for b in range(3)])
    got = paged(q, qo_indptr, k_cache, v_cache, kv_indptr, perm, last, causal=True)
    torch.testing.assert_close(got, want)
    kv_flat = torch.tensor([0, 5, 5, 14])
    got = ragged(q, torch.cat(ks), torch.cat(vs), qo_indptr, kv_flat, causal=True)
    torch.testing.assert_close(got, want)
    qd = torch.randn(3, hq, d)
    want = torch.stack([single(qd[b:b + 1], ks[b], vs[b])[0] for b in range(3)])
    torch.testing.assert_close(decode(qd, k_cache, v_cache, kv_indptr, perm, last), want)
    assert torch.equal(want[1], torch.zeros(hq, d))  # an empty request: zeros

"""What serving engines (vLLM, SGLang) call on the attention wrappers (docs/serving-engines.md):
the deprecated ``forward``/``forward_return_lse``/``begin_forward`` with options that replace the
planned ones, ``fast_decode_plan``, the wrapper attributes engines read and write, and the
legacy plan arguments this implementation refuses by name. CPU tests check the plumbing (the
launch is a fake module that records the run-time parameter record); GPU tests replay each
engine's call sequence against the float64 reference of tests/attention_ref.py."""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch
from attention_ref import attention_ref, make_paged

import flashinfer
import flashinfer.attention.runtime as rt
import flashinfer.attention.wrapper as wrapper_mod
from flashinfer import fast_decode_plan  # top level, as SGLang imports it
from flashinfer.testing import cuda_graph_of

HQ, HKV, D, PAGE = 8, 2, 64, 16


# ----------------------------------------------------------------------------- CPU plumbing

class _FakeModule:
    """Stands for the compiled module: records each run's arguments."""

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


@pytest.fixture
def fake(monkeypatch):
    module = _FakeModule()
    monkeypatch.setattr(wrapper_mod, "check_cuda_device", lambda device, name: None)
    monkeypatch.setattr(wrapper_mod, "resolve_pdl", lambda enable_pdl, device: False)
    monkeypatch.setattr(wrapper_mod, "device_num_sms", lambda device: 132)
    monkeypatch.setattr(rt, "get_attention_module", lambda variant: module)
    return module


def _field(rec: torch.Tensor, name: str) -> float:
    value = int(rec[rt.RUN_PARAMS.index(name)])
    if name in rt._FLOATS:
        return torch.tensor([value], dtype=torch.int64).view(torch.float64).item()
    return value


def _ws():
    return torch.empty(1 << 20, dtype=torch.uint8)


def _i32(x):
    return torch.tensor(x, dtype=torch.int32)


def _decode(**kw):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws())
    w.plan(_i32([0, 2, 3]), _i32([4, 0, 2]), _i32([5, 16]), HQ, HKV, D, PAGE,
           q_data_type=torch.float16, **kw)
    return w


def _paged(**kw):
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws())
    w.plan(_i32([0, 3, 4]), _i32([0, 2, 3]), _i32([4, 0, 2]), _i32([5, 16]), HQ, HKV, D, PAGE,
           q_data_type=torch.float16, **kw)
    return w


def _ragged(**kw):
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws())
    w.plan(_i32([0, 3, 4]), _i32([0, 20, 40]), HQ, HKV, D, q_data_type=torch.float16, **kw)
    return w


ALL = {"decode": _decode, "paged prefill": _paged, "ragged prefill": _ragged}


def _inputs(kind):
    q = torch.randn(2 if kind == "decode" else 4, HQ, D).half()
    kv = (torch.randn(5, 2, PAGE, HKV, D).half(),) if kind != "ragged prefill" else \
        (torch.randn(40, HKV, D).half(),) * 2
    return q, kv


def _legacy(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return fn(*args, **kw)


OPTIONS = dict(sm_scale=0.3, logits_soft_cap=30.0, window_left=7, rope_scale=2.0,
               rope_theta=5e5)


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("lse", [False, True])
def test_forward_applies_its_options_to_the_launch(kind, lse, fake):
    """forward(..., sm_scale=, logits_soft_cap=, window_left=, rope_*) runs with those values
    (the launch record carries them) and they stay the wrapper's (upstream keeps them)."""
    w = ALL[kind]()
    q, kv = _inputs(kind)
    w.run(q, *kv)
    assert _field(fake.calls[-1][5], "sm_scale") == pytest.approx(D ** -0.5)
    res = _legacy(w.forward_return_lse if lse else w.forward, q, *kv, **OPTIONS)
    assert isinstance(res, tuple) == lse
    rec = fake.calls[-1][5]
    assert _field(rec, "sm_scale") == pytest.approx(0.3)
    assert _field(rec, "logits_soft_cap") == 30.0
    assert _field(rec, "window_left") == 7
    assert (_field(rec, "rope_scale"), _field(rec, "rope_theta")) == (2.0, 5e5)
    assert (w._sm_scale, w._logits_soft_cap, w._window_left) == (0.3, 30.0, 7)
    # A later run keeps them; forward without them restores the defaults (as upstream).
    w.run(q, *kv)
    assert _field(fake.calls[-1][5], "sm_scale") == pytest.approx(0.3)
    _legacy(w.forward, q, *kv)
    rec = fake.calls[-1][5]
    assert _field(rec, "sm_scale") == pytest.approx(D ** -0.5)
    assert (_field(rec, "logits_soft_cap"), _field(rec, "window_left")) == (0.0, -1)
    assert (w._sm_scale, w._logits_soft_cap, w._window_left) == (None, 0.0, -1)


@pytest.mark.parametrize("kind", ALL)
def test_forward_with_the_planned_values_keeps_the_launch(kind, fake):
    """Same values as planned (every layer of a step): no new launch record."""
    w = ALL[kind](sm_scale=0.3, logits_soft_cap=30.0)
    q, kv = _inputs(kind)
    w.run(q, *kv)
    launch = w._launcher
    _legacy(w.forward, q, *kv, sm_scale=0.3, logits_soft_cap=30.0)
    assert w._launcher is launch and fake.calls[-1][5] is launch.params


@pytest.mark.parametrize("kind", ALL)
def test_forward_scales(kind, fake):
    w = ALL[kind]()
    q, kv = _inputs(kind)
    scales = dict(k_scale=0.5, v_scale=2.0) if kind != "ragged prefill" else {}
    if kind == "decode":
        scales["q_scale"] = 0.5
    _legacy(w.forward, q, *kv, sm_scale=0.4, **scales)
    rec = fake.calls[-1][5]
    factor = scales.get("q_scale", 1.0) * scales.get("k_scale", 1.0)
    assert _field(rec, "sm_scale") == pytest.approx(0.4 * factor)
    assert _field(rec, "o_scale") == scales.get("v_scale", 1.0)


@pytest.mark.parametrize("kind", ["paged prefill", "ragged prefill"])
def test_forward_causal_replans(kind, fake):
    w = ALL[kind]()
    q, kv = _inputs(kind)
    assert w._variant.mask_mode == "none" and w._causal is False
    _legacy(w.forward, q, *kv, causal=True, sm_scale=0.3)
    assert w._variant.mask_mode == "causal" and w._causal is True
    assert _field(fake.calls[-1][5], "sm_scale") == pytest.approx(0.3)
    assert w._plan_args["causal"] is True and w._plan_args["sm_scale"] == 0.3
    _legacy(w.forward, q, *kv)  # causal=False again
    assert w._variant.mask_mode == "none"


def test_forward_causal_with_a_custom_mask_keeps_the_mask(fake):
    """A planned custom mask overrides causal (as upstream): no re-plan."""
    packed = torch.randint(0, 256, (8 + 2,), dtype=torch.uint8)  # 3 x 21 and 1 x 16 bits
    w = _paged(packed_custom_mask=packed)
    plan = w._plan
    q, kv = _inputs("paged prefill")
    _legacy(w.forward, q, *kv, causal=True)
    assert w._variant.mask_mode == "custom" and w._plan is plan and w._causal is True


def test_decode_forward_pos_encoding_replans(fake):
    w = _decode()
    q, kv = _inputs("decode")
    _legacy(w.forward, q, *kv, pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5)
    assert w._variant.pos_encoding == "ROPE_LLAMA"
    assert _field(fake.calls[-1][5], "rope_theta") == 5e5


@pytest.mark.parametrize("kind", ALL)
def test_forward_refuses(kind, fake):
    w = ALL[kind]()
    q, kv = _inputs(kind)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sm_scal'"):
        _legacy(w.forward, q, *kv, sm_scal=0.1)
    with pytest.raises(ValueError, match="sm_scale must be positive"):
        _legacy(w.forward, q, *kv, sm_scale=-1.0)
    with pytest.raises(KeyError, match="pos_encoding_mode"):
        _legacy(w.forward, q, *kv, pos_encoding_mode="ROPE")
    if kind != "decode":
        with pytest.raises(NotImplementedError, match="use_fp16_qk_reduction"):
            _legacy(w.forward, q, *kv, use_fp16_qk_reduction=True)
    assert not fake.calls
    fresh = type(w)(_ws())
    with pytest.raises(RuntimeError, match="plan"):
        _legacy(fresh.forward, q, *kv)


@pytest.mark.parametrize("name,value", [
    ("use_fp16_qk_reduction", True), ("prefix_len_ptr", _i32([0, 0])),
    ("token_pos_in_items_ptr", _i32([0])), ("token_pos_in_items_len", 4),
    ("max_item_len_ptr", _i32([1])), ("block_tables", _i32([[4, 0], [2, 0]]))])
def test_paged_plan_refuses_unsupported_arguments(name, value, fake):
    with pytest.raises(NotImplementedError, match=rf"plan\({name}=\.\.\.\)"):
        _paged(**{name: value})


@pytest.mark.parametrize("name,value", [
    ("use_fp16_qk_reduction", True), ("prefix_len_ptr", _i32([0, 0])),
    ("token_pos_in_items_len", 4), ("v_indptr", _i32([0, 20, 40])),
    ("o_indptr", _i32([0, 3, 4]))])
def test_ragged_plan_refuses_unsupported_arguments(name, value, fake):
    with pytest.raises(NotImplementedError, match=rf"plan\({name}=\.\.\.\)"):
        _ragged(**{name: value})


def test_decode_plan_refuses_block_tables_and_constructors_jit_args(fake):
    with pytest.raises(NotImplementedError, match=r"plan\(block_tables=\.\.\.\)"):
        _decode(block_tables=_i32([[4, 0], [2, 0]]))
    for cls in (flashinfer.BatchDecodeWithPagedKVCacheWrapper,
                flashinfer.BatchPrefillWithPagedKVCacheWrapper,
                flashinfer.BatchPrefillWithRaggedKVCacheWrapper):
        with pytest.raises(NotImplementedError, match="jit_args"):
            cls(_ws(), jit_args=["x"])
    with pytest.raises(NotImplementedError, match="jit_kwargs"):
        flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), jit_kwargs={"x": 1})
    with pytest.raises(NotImplementedError, match="use_fp16_qk_reduction"):
        flashinfer.MultiLevelCascadeAttentionWrapper(1, _ws()).plan(
            [_i32([0, 4])], [_i32([0, 1])], [_i32([0])], [_i32([5])], HQ, HKV, D, PAGE,
            use_fp16_qk_reduction=True)


def test_plan_checks_seq_lens_against_the_metadata(fake):
    """seq_lens / seq_lens_q / max_* (other backends' forms of the same lengths) must agree."""
    _decode(seq_lens=_i32([21, 16]))
    _paged(seq_lens=_i32([21, 16]), seq_lens_q=_i32([3, 1]), max_token_per_sequence=3,
           max_sequence_kv=21)
    with pytest.raises(ValueError, match=r"seq_lens must equal the KV lengths"):
        _decode(seq_lens=_i32([20, 16]))
    with pytest.raises(ValueError, match=r"seq_lens must equal the KV lengths"):
        _paged(seq_lens=_i32([21, 15]))
    with pytest.raises(ValueError, match=r"seq_lens_q must equal the query lengths"):
        _paged(seq_lens_q=_i32([2, 2]))
    with pytest.raises(ValueError, match=r"max_sequence_kv must be at least 21, got 20"):
        _paged(max_sequence_kv=20)
    with pytest.raises(ValueError, match=r"max_token_per_sequence must be at least 3, got 2"):
        _paged(max_token_per_sequence=2)


def test_multilevel_forward_applies_options_per_level(fake):
    w = flashinfer.MultiLevelCascadeAttentionWrapper(2, _ws())
    w.plan([_i32([0, 4]), _i32([0, 3, 4])], [_i32([0, 1]), _i32([0, 2, 3])],
           [_i32([1]), _i32([4, 0, 2])], [_i32([5]), _i32([5, 16])], HQ, HKV, D, PAGE,
           q_data_type=torch.float16)
    q = torch.randn(4, HQ, D).half()
    cache = torch.randn(5, 2, PAGE, HKV, D).half()
    monkey_merge = []
    import flashinfer.attention.multilevel as ml

    orig = ml.merge_state_in_place
    ml.merge_state_in_place = lambda *a: monkey_merge.append(a)
    try:
        _legacy(w.forward, q, cache, causal=True, sm_scale=0.3, logits_soft_cap=20.0)
    finally:
        ml.merge_state_in_place = orig
    assert [lv._variant.mask_mode for lv in w._wrappers] == ["none", "causal"]
    for rec in (c[5] for c in fake.calls[-2:]):
        assert _field(rec, "sm_scale") == pytest.approx(0.3)
        assert _field(rec, "logits_soft_cap") == 20.0
    assert len(monkey_merge) == 1
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        _legacy(w.forward, q, cache, bogus=1)


def test_engine_attributes(fake):
    """vLLM's asserts and SGLang's buffer accesses (docs/serving-engines.md)."""
    w = _decode(sm_scale=0.125, logits_soft_cap=None, window_left=15)
    assert (w._sm_scale, w._logits_soft_cap, w._window_left) == (0.125, 0.0, 15)
    p = _paged(causal=True, logits_soft_cap=50.0)
    assert p._causal is True and p._logits_soft_cap == 50.0 and p._window_left == -1
    assert p._custom_mask_buf is None and p._mask_indptr_buf is None
    # graph mode: the buffers the engine passed, at their addresses
    bufs = [torch.zeros(3, dtype=torch.int32), torch.zeros(64, dtype=torch.int32),
            torch.zeros(2, dtype=torch.int32)]
    g = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), use_cuda_graph=True,
                                                      paged_kv_indptr_buffer=bufs[0],
                                                      paged_kv_indices_buffer=bufs[1],
                                                      paged_kv_last_page_len_buffer=bufs[2])
    assert g._paged_kv_indptr_buf is bufs[0] and g._paged_kv_indices_buf is bufs[1]
    assert g._paged_kv_last_page_len_buf is bufs[2]
    mask_buf = torch.zeros(64, dtype=torch.uint8)
    pg = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        _ws(), use_cuda_graph=True, qo_indptr_buf=torch.zeros(3, dtype=torch.int32),
        paged_kv_indptr_buf=torch.zeros(3, dtype=torch.int32),
        paged_kv_indices_buf=torch.zeros(8, dtype=torch.int32),
        paged_kv_last_page_len_buf=torch.zeros(2, dtype=torch.int32), custom_mask_buf=mask_buf,
        mask_indptr_buf=torch.zeros(3, dtype=torch.int32))
    assert pg._custom_mask_buf is mask_buf


def test_setting_paged_kv_indices_buf_redirects_the_run(fake):
    """SGLang's sparse decode assigns ``_paged_kv_indices_buf`` between plan and run: the run
    reads the new page ids."""
    w = _decode()
    q, kv = _inputs("decode")
    new = _i32([1, 3, 2])
    w._paged_kv_indices_buf = new
    assert w._paged_kv_indices_buf is new
    w.run(q, *kv)
    assert _field(fake.calls[-1][5], "kv_indices") == new.data_ptr()
    with pytest.raises(ValueError, match="_paged_kv_indices_buf must be a contiguous 1-D "
                                         "torch.int32 tensor on cpu with at least 3 entries"):
        w._paged_kv_indices_buf = new.long()
    with pytest.raises(ValueError, match="at least 3 entries"):
        w._paged_kv_indices_buf = new[:2]
    with pytest.raises(NotImplementedError, match="assigning _paged_kv_indptr_buf after plan"):
        w._paged_kv_indptr_buf = _i32([0, 1, 2])
    with pytest.raises(AttributeError, match="has no _custom_mask_buf"):
        w._custom_mask_buf = torch.zeros(4, dtype=torch.uint8)


def test_setting_custom_mask_buf_redirects_the_run(fake):
    """Engines that swap the packed mask of a planned batch (same layout)."""
    packed = torch.randint(0, 256, (10,), dtype=torch.uint8)
    w = _paged(packed_custom_mask=packed)
    assert torch.equal(w._custom_mask_buf[:10], packed)
    q, kv = _inputs("paged prefill")
    other = torch.randint(0, 256, (10,), dtype=torch.uint8)
    w._custom_mask_buf = other
    w.run(q, *kv)
    assert _field(fake.calls[-1][5], "custom_mask") == other.data_ptr()
    with pytest.raises(ValueError, match="at least 10 entries"):
        w._custom_mask_buf = other[:9]


def _fast_args(batch_kv_pages, page_size=PAGE):
    indptr = [0]
    for n in batch_kv_pages:
        indptr.append(indptr[-1] + n)
    return (_i32(indptr), torch.arange(indptr[-1], dtype=torch.int32),
            _i32([page_size if n else 0 for n in batch_kv_pages]))


def test_fast_decode_plan_is_plan(fake):
    """Bound as begin_forward (SGLang's way), it makes the plan plan() makes."""
    indptr, indices, last = _fast_args([3, 1, 0, 2])
    a = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws())
    a.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.float16,
           logits_soft_cap=5.0)
    b = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws())
    b.begin_forward = functools.partial(fast_decode_plan, b)
    b.begin_forward(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.float16,
                    data_type=torch.float16, logits_soft_cap=5.0,
                    global_override_indptr_cpu=indptr.clone())
    assert a._plan == b._plan and torch.equal(a._plan_dev, b._plan_dev)
    assert b._logits_soft_cap == 5.0 and b._batch == 4
    q = torch.randn(4, HQ, D).half()
    cache = torch.randn(8, 2, PAGE, HKV, D).half()
    _legacy(b.forward, q, cache, sm_scale=0.2)  # forward re-plans nothing here
    assert _field(fake.calls[-1][5], "sm_scale") == pytest.approx(0.2)
    _legacy(b.forward, q, cache, pos_encoding_mode="ALIBI")  # re-plans with class plan()
    assert b._variant.pos_encoding == "ALIBI"


def test_fast_decode_plan_refuses(fake):
    indptr, indices, last = _fast_args([3, 1])
    with pytest.raises(TypeError, match="BatchDecodeWithPagedKVCacheWrapper"):
        fast_decode_plan(object(), indptr, indices, last, HQ, HKV, D, PAGE)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws())
    with pytest.raises(ValueError, match="global_override_indptr_cpu must have indptr's 3"):
        fast_decode_plan(w, indptr, indices, last, HQ, HKV, D, PAGE,
                         global_override_indptr_cpu=_i32([0, 4]))
    with pytest.raises(ValueError, match="q_len_per_req=2 needs tensor-core decode"):
        fast_decode_plan(w, indptr, indices, last, HQ, HKV, D, PAGE, q_len_per_req=2)
    with pytest.raises(ValueError, match="last_page_len entries must be in"):
        fast_decode_plan(w, indptr, indices, _i32([0, 3]), HQ, HKV, D, PAGE)


# ----------------------------------------------------------------------------- GPU, vs the reference

TOL = {torch.float16: dict(atol=4e-3, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _gws():
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


def _indptr(lens) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _check_rows(o, q, kvs, qo_lens, dtype, lse=None, **kw):
    """o (sum qo, Hq, D) against the reference per request (k, v NHD per request)."""
    row = 0
    for (k, v), n in zip(kvs, qo_lens):
        ro, rl = attention_ref(q[row:row + n], k, v, **kw)
        torch.testing.assert_close(o[row:row + n].double(), ro, **TOL[dtype])
        if lse is not None:
            finite = torch.isfinite(rl)
            torch.testing.assert_close(lse[row:row + n][finite].double(), rl[finite],
                                       atol=2e-3, rtol=1e-3)
        row += n


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ALL)
def test_forward_equals_plan_and_run(kind):
    """forward(sm_scale=s, logits_soft_cap=c[, causal]) after a plan without them == plan with
    them + run == the reference."""
    gen = torch.Generator().manual_seed(21)
    dtype, hq, hkv, d, page = torch.float16, 16, 4, 128, 16
    s, c = 0.07, 20.0
    kv_lens = [37, 300, 1, 129]
    qo_lens = [1] * 4 if kind == "decode" else [5, 17, 1, 40]
    q = (torch.randn(sum(qo_lens), hq, d, generator=gen) * 2).to(dtype).cuda()
    causal = kind != "decode"
    if kind == "ragged prefill":
        kvs = [(torch.randn(n, hkv, d, generator=gen).to(dtype).cuda(),
                torch.randn(n, hkv, d, generator=gen).to(dtype).cuda()) for n in kv_lens]
        k = torch.cat([x for x, _ in kvs])
        v = torch.cat([y for _, y in kvs])
        kv_indptr = _indptr(kv_lens)
        inputs = (q, k, v)

        def plan(w, **kw):
            w.plan(_indptr(qo_lens), kv_indptr, hq, hkv, d, q_data_type=dtype, **kw)
        cls = flashinfer.BatchPrefillWithRaggedKVCacheWrapper
    else:
        cache, indptr, indices, last, kvs = make_paged(kv_lens, page, hkv, d, dtype, "cuda",
                                                       gen=gen)
        inputs = (q, cache)
        if kind == "decode":
            cls = flashinfer.BatchDecodeWithPagedKVCacheWrapper

            def plan(w, causal=False, **kw):
                w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype, **kw)
        else:
            cls = flashinfer.BatchPrefillWithPagedKVCacheWrapper

            def plan(w, **kw):
                w.plan(_indptr(qo_lens), indptr, indices, last, hq, hkv, d, page,
                       q_data_type=dtype, **kw)
    a = cls(_gws())
    plan(a, causal=causal, sm_scale=s, logits_soft_cap=c)
    ref_o, ref_lse = a.run(*inputs, return_lse=True)
    b = cls(_gws())
    plan(b)  # non-causal, default scale, no cap
    legacy = {} if kind == "decode" else {"causal": True}
    o, lse = _legacy(b.forward_return_lse, *inputs, sm_scale=s, logits_soft_cap=c, **legacy)
    torch.testing.assert_close(o, ref_o, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)
    _check_rows(o, q, kvs, qo_lens, dtype, lse=lse, causal=causal, sm_scale=s, soft_cap=c)
    # Without sm_scale the wrapper's default applies again (upstream's forward semantics).
    o2 = _legacy(b.forward, *inputs, **legacy)
    _check_rows(o2, q, kvs, qo_lens, dtype, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
def test_fast_decode_plan_cuda_graph_replan_replay(page_size):
    """SGLang's CUDA-graph decode: begin_forward = partial(fast_decode_plan, wrapper), the page
    ids written in place into ``_paged_kv_indices_buf``, ``forward(sm_scale=, logits_soft_cap=)``
    captured, then re-planned for longer sequences and replayed."""
    gen = torch.Generator().manual_seed(4)
    dtype, hq, hkv, d, batch = torch.bfloat16, 32, 8, 128, 6
    s, c = 0.05, 30.0
    second = [3000, 1, 77, 900, 2048, 5]
    first = [10, 1, 30, 40, 50, 2]
    cache, indptr2, indices2, last2, seqs2 = make_paged(second, page_size, hkv, d, dtype,
                                                        "cuda", gen=gen)
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(indices2.numel() + 64, dtype=torch.int32, device="cuda")
    last_buf = torch.ones(batch, dtype=torch.int32, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        _gws(), "NHD", use_cuda_graph=True, use_tensor_cores=True,
        paged_kv_indptr_buffer=indptr_buf, paged_kv_indices_buffer=indices_buf,
        paged_kv_last_page_len_buffer=last_buf)
    w.begin_forward = functools.partial(fast_decode_plan, w)

    def step(kv_lens, indptr_full, indices_full):
        """The engine's per-step metadata: written into the wrapper's buffers in place."""
        pages = [-(-n // page_size) for n in kv_lens]
        ids = torch.cat([indices_full[indptr_full[b]:indptr_full[b] + pages[b]]
                         for b in range(batch)])
        host_indptr = _indptr(pages)
        w._paged_kv_indices_buf[:ids.numel()].copy_(ids)
        indptr_buf.copy_(host_indptr)
        last = [n - (p - 1) * page_size for n, p in zip(kv_lens, pages)]
        last_page_len = last_buf if page_size == 1 else torch.tensor(last, dtype=torch.int32)
        if page_size != 1:
            last_buf.copy_(last_page_len)
        w.begin_forward(indptr_buf, w._paged_kv_indices_buf, last_page_len, hq, hkv, d,
                        page_size, q_data_type=dtype, data_type=dtype, non_blocking=True,
                        global_override_indptr_cpu=host_indptr)

    q = torch.randn(batch, hq, d, generator=gen).to(dtype).cuda()
    out = torch.empty_like(q)
    step(first, indptr2, indices2)
    seqs1 = [(k[:n], v[:n]) for (k, v), n in zip(seqs2, first)]

    def forward():
        out.copy_(_legacy(w.forward, q, cache, sm_scale=s, logits_soft_cap=c))

    graph = cuda_graph_of(forward)  # warm-up outside the capture (compiles, resolves the launch)
    graph.replay()
    torch.cuda.synchronize()
    _check_rows(out, q, seqs1, [1] * batch, dtype, sm_scale=s, soft_cap=c)
    step(second, indptr2, indices2)
    graph.replay()
    torch.cuda.synchronize()
    _check_rows(out, q, seqs2, [1] * batch, dtype, sm_scale=s, soft_cap=c)
    # And the eager forward after the re-plan agrees.
    forward()
    _check_rows(out, q, seqs2, [1] * batch, dtype, sm_scale=s, soft_cap=c)


@pytest.mark.gpu
@pytest.mark.parametrize("prefix", [[100, 3, 37], [100, 0, 37]],
                         ids=["every request cached", "one request without a prefix"])
def test_sglang_extend_and_decode_sequence(prefix):
    """SGLang's FlashInfer backend, page size 1, caches as (k, v) of (tokens, Hkv, D):
    extend = ragged forward_return_lse over the new tokens (causal) + paged
    forward_return_lse over the cached prefix (not causal), merged with merge_state; decode =
    begin_forward(..., data_type=, q_data_type=) + forward(sm_scale=, logits_soft_cap=)."""
    gen = torch.Generator().manual_seed(7)
    dtype, hq, hkv, d = torch.float16, 16, 4, 128
    s, c = 1.0 / math.sqrt(d) * 0.9, 50.0
    new = [20, 64, 1]
    total_tokens = 400
    k_pool = torch.randn(total_tokens, hkv, d, generator=gen).to(dtype).cuda()
    v_pool = torch.randn(total_tokens, hkv, d, generator=gen).to(dtype).cuda()
    slots = torch.randperm(total_tokens, generator=gen)[:sum(prefix)].to(torch.int32).cuda()
    i32 = dict(dtype=torch.int32, device="cuda")
    qo_indptr = _indptr(new).cuda()
    kv_indptr = _indptr(prefix).cuda()
    q = torch.randn(sum(new), hq, d, generator=gen).to(dtype).cuda()
    k_new = torch.randn(sum(new), hkv, d, generator=gen).to(dtype).cuda()
    v_new = torch.randn(sum(new), hkv, d, generator=gen).to(dtype).cuda()
    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_gws(), "NHD")
    paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_gws(), "NHD")
    ragged.begin_forward(qo_indptr, qo_indptr, hq, hkv, d, q_data_type=dtype)
    paged.begin_forward(qo_indptr, kv_indptr, slots, torch.ones(3, **i32), hq, hkv, d, 1,
                        q_data_type=dtype, kv_data_type=dtype, custom_mask=None,
                        non_blocking=True)
    o1, s1 = _legacy(ragged.forward_return_lse, q, k_new, v_new, causal=True, sm_scale=s,
                     logits_soft_cap=c)
    o2, s2 = _legacy(paged.forward_return_lse, q, (k_pool, v_pool), causal=False, sm_scale=s,
                     logits_soft_cap=c)
    o, _ = flashinfer.merge_state(o1, s1, o2, s2)
    kvs, row, pre = [], 0, 0
    for b in range(3):
        ids = slots[pre:pre + prefix[b]].long()
        kvs.append((torch.cat([k_pool[ids], k_new[row:row + new[b]]]),
                    torch.cat([v_pool[ids], v_new[row:row + new[b]]])))
        row, pre = row + new[b], pre + prefix[b]
    _check_rows(o, q, kvs, new, dtype, causal=True, sm_scale=s, soft_cap=c)
    # decode over the same pool
    decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_gws(), "NHD",
                                                           use_tensor_cores=True)
    decode.begin_forward(kv_indptr, slots, torch.ones(3, **i32), hq, hkv, d, 1,
                         data_type=dtype, q_data_type=dtype, non_blocking=True)
    qd = torch.randn(3, hq, d, generator=gen).to(dtype).cuda()
    od = _legacy(decode.forward, qd, (k_pool, v_pool), sm_scale=s, logits_soft_cap=c,
                 k_scale=None, v_scale=None)
    pre_kvs, pre = [], 0
    for b in range(3):
        ids = slots[pre:pre + prefix[b]].long()
        pre_kvs.append((k_pool[ids], v_pool[ids]))
        pre += prefix[b]
    _check_rows(od, qd, pre_kvs, [1] * 3, dtype, sm_scale=s, soft_cap=c)
    decode.end_forward()


@pytest.mark.gpu
def test_vllm_prefill_and_decode_sequence():
    """vLLM's FlashInfer backend: plan(...) with the layer's scale, soft cap and window, the
    asserts it makes on the wrappers, then run(q, kv_cache, out=) on a 5-D NHD cache."""
    gen = torch.Generator().manual_seed(11)
    dtype, hq, hkv, d, page = torch.bfloat16, 32, 8, 128, 16
    scale, cap, window = d ** -0.5, 30.0, 63
    kv_lens = [200, 17, 64]
    qo_lens = [200, 5, 1]
    cache, indptr, indices, last, kvs = make_paged(kv_lens, page, hkv, d, dtype, "cuda",
                                                   gen=gen)
    q = torch.randn(sum(qo_lens), hq, d, generator=gen).to(dtype).cuda()
    prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_gws(), "NHD")
    prefill.plan(_indptr(qo_lens[:2]), indptr[:3], indices, last[:2], hq, hkv, d,
                 page, causal=True, sm_scale=scale, window_left=window,
                 logits_soft_cap=cap, q_data_type=dtype, kv_data_type=dtype)
    assert prefill._causal
    assert prefill._window_left == window
    assert prefill._logits_soft_cap == (cap or 0.0)
    assert prefill._sm_scale == scale
    n_prefill = sum(qo_lens[:2])
    out = torch.empty(sum(qo_lens), hq, d, dtype=dtype, device="cuda")
    prefill.run(q[:n_prefill], cache, out=out[:n_prefill])
    decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_gws(), "NHD",
                                                           use_tensor_cores=True)
    decode.plan(torch.tensor([0, int(indptr[3] - indptr[2])], dtype=torch.int32),
                indices[int(indptr[2]):int(indptr[3])], last[2:], hq, hkv, d, page,
                pos_encoding_mode="NONE", sm_scale=scale, window_left=window,
                logits_soft_cap=cap, q_data_type=dtype, kv_data_type=dtype)
    assert decode._window_left == window
    assert decode._logits_soft_cap == (cap or 0.0)
    assert decode._sm_scale == scale
    decode.run(q[n_prefill:], cache, out=out[n_prefill:])
    _check_rows(out, q, kvs, qo_lens, dtype, causal=True, sm_scale=scale, soft_cap=cap,
                window_left=window)


@pytest.mark.parametrize("kind", ALL)
def test_writing_planned_attributes_reaches_the_next_run(kind, fake):
    """Engines that plan through the module and then set ``_sm_scale`` & co. on the wrapper: the
    next run's record carries the written values; a bad value is refused."""
    w = ALL[kind]()
    q, kv = _inputs(kind)
    w.run(q, *kv)
    w._sm_scale, w._logits_soft_cap, w._window_left = 0.2, 10.0, 3
    w.run(q, *kv)
    rec = fake.calls[-1][5]
    assert _field(rec, "sm_scale") == pytest.approx(0.2)
    assert (_field(rec, "logits_soft_cap"), _field(rec, "window_left")) == (10.0, 3)
    w._logits_soft_cap = None
    assert w._logits_soft_cap == 0.0
    with pytest.raises(ValueError, match="sm_scale must be positive"):
        w._sm_scale = 0.0
    with pytest.raises(ValueError, match="window_left must be an int"):
        w._window_left = -2


def _vllm_fast_plan_decode(w, indptr_cpu, indices, last_page_len_cpu, seq_lens_cpu, hq, hkv, d,
                           page_size, dtype, sm_scale, logits_soft_cap=None, window_left=-1):
    """The call sequence of vLLM's ``fast_plan_decode`` (vllm/v1/attention/backends/
    flashinfer.py): the stock plan (positional, as vLLM passes it) on the first call, then in
    CUDA-graph mode copies into the wrapper's buffers, ``_cached_module.plan(...)`` and the
    planned attributes written back."""
    if not w.is_cuda_graph_enabled or getattr(w, "vllm_first_call", True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            w.plan(indptr_cpu, indices, last_page_len_cpu, hq, hkv, d, page_size, "NONE",
                   window_left, logits_soft_cap, dtype, dtype, None, None, sm_scale, None, None,
                   True, None, None, -1, False)
        w.vllm_first_call = False
        return
    batch = len(last_page_len_cpu)
    assert batch == w._fixed_batch_size and len(indices) <= len(w._paged_kv_indices_buf)
    w._paged_kv_indptr_buf.copy_(indptr_cpu, non_blocking=True)
    w._paged_kv_last_page_len_buf.copy_(last_page_len_cpu, non_blocking=True)
    args = [w._float_workspace_buffer, w._int_workspace_buffer,
            w._pin_memory_int_workspace_buffer, torch.arange(batch + 1, dtype=torch.int32),
            indptr_cpu, seq_lens_cpu, batch, batch, hq, hkv, page_size,
            w.is_cuda_graph_enabled, d, d, False, window_left]
    if w._backend == "fa2":
        args += [-1, False, 0]
    w._plan_info = w._cached_module.plan(*args)
    w._pos_encoding_mode = "NONE"
    w._window_left = window_left
    w._logits_soft_cap = logits_soft_cap or 0.0
    w._sm_scale = sm_scale
    w._rope_scale = None
    w._rope_theta = None


def _vllm_graph_wrapper(batch, max_pages, device, backend="auto"):
    bufs = [torch.zeros(batch + 1, dtype=torch.int32, device=device),
            torch.zeros(max_pages, dtype=torch.int32, device=device),
            torch.zeros(batch, dtype=torch.int32, device=device)]
    ws = torch.empty(128 << 20 if device == "cuda" else 1 << 20, dtype=torch.uint8,
                     device=device)
    return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_cuda_graph=True, use_tensor_cores=True, paged_kv_indptr_buffer=bufs[0],
        paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2],
        backend=backend), bufs


@pytest.mark.parametrize("backend", ["auto", "fa2"])
def test_vllm_fast_plan_decode_path(backend, fake):
    """vLLM's graph-mode re-plan through ``_cached_module.plan`` makes the plan plan() makes
    for the batch in the buffers, and the attributes it writes reach the run."""
    w, (ib, xb, lb) = _vllm_graph_wrapper(3, 64, "cpu", backend)
    indptr, indices, last = _fast_args([1, 1, 1])
    _vllm_fast_plan_decode(w, indptr, indices, last, _i32([16, 16, 16]), HQ, HKV, D, PAGE,
                           torch.float16, 0.125)
    assert w._sm_scale == 0.125 and w.vllm_first_call is False
    indptr2, indices2, last2 = _i32([0, 3, 4, 6]), _i32([5, 1, 7, 2, 0, 3]), _i32([4, 16, 9])
    xb[:6].copy_(indices2)
    _vllm_fast_plan_decode(w, indptr2, indices2, last2, _i32([36, 16, 25]), HQ, HKV, D, PAGE,
                           torch.float16, 0.1, logits_soft_cap=7.0)
    ref, _ = _vllm_graph_wrapper(3, 64, "cpu", backend)  # the same two plans through plan()
    ref.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.float16)
    ref.plan(indptr2, indices2, last2, HQ, HKV, D, PAGE, q_data_type=torch.float16)
    assert w._plan == ref._plan and torch.equal(w._plan_dev, ref._plan_dev)
    assert torch.equal(ib, indptr2) and torch.equal(lb, last2)
    q = torch.randn(3, HQ, D).half()
    w.run(q, torch.randn(8, 2, PAGE, HKV, D).half())
    rec = fake.calls[-1][5]
    assert _field(rec, "sm_scale") == pytest.approx(0.1)
    assert _field(rec, "logits_soft_cap") == 7.0
    assert _field(rec, "kv_indices") == xb.data_ptr()
    module = w._cached_module
    args = [w._float_workspace_buffer, w._int_workspace_buffer, None, torch.arange(4),
            indptr2, _i32([36, 16, 25]), 3, 3, HQ, HKV, PAGE, True, D, D, False, -1]
    with pytest.raises(ValueError, match="KV length 40 does not fit 1 pages of 16"):
        module.plan(*args[:5], _i32([36, 40, 25]), *args[6:])
    with pytest.raises(ValueError, match="causal must be False"):
        module.plan(*args[:14], True, -1)
    with pytest.raises(ValueError, match="workspace buffers"):
        module.plan(torch.empty(16, dtype=torch.uint8), *args[1:])
    with pytest.raises(NotImplementedError, match="num_colocated_ctas"):
        module.plan(*args, -1, False, 2)


@pytest.mark.gpu
def test_vllm_cuda_graph_decode_replan_replay():
    """vLLM's full-CUDA-graph decode: fast_plan_decode (stock plan first, then the
    ``_cached_module.plan`` path), the asserts on the wrapper, ``run(out=)`` captured, a new
    batch planned into the same buffers, replayed; against the reference."""
    gen = torch.Generator().manual_seed(12)
    dtype, hq, hkv, d, page, batch = torch.bfloat16, 32, 8, 128, 16, 5
    scale, cap = d ** -0.5, 30.0
    second = [2500, 17, 300, 1, 1024]
    first = [40, 1, 33, 1, 16]
    cache, indptr2, indices2, last2, seqs2 = make_paged(second, page, hkv, d, dtype, "cuda",
                                                        gen=gen)
    w, (_, indices_buf, _) = _vllm_graph_wrapper(batch, indices2.numel() + 16, "cuda")

    def step(kv_lens):
        pages = [-(-n // page) for n in kv_lens]
        ids = torch.cat([indices2[int(indptr2[b]):int(indptr2[b]) + pages[b]]
                         for b in range(batch)])
        indices_buf[:ids.numel()].copy_(ids)  # vLLM's _copy_page_indices_kernel
        last = torch.tensor([n - (p - 1) * page for n, p in zip(kv_lens, pages)],
                            dtype=torch.int32)
        _vllm_fast_plan_decode(w, _indptr(pages), indices_buf[:ids.numel()], last,
                               torch.tensor(kv_lens, dtype=torch.int32), hq, hkv, d, page,
                               dtype, scale, logits_soft_cap=cap)
        assert w._window_left == -1 and w._logits_soft_cap == cap and w._sm_scale == scale

    q = torch.randn(batch, hq, d, generator=gen).to(dtype).cuda()
    out = torch.empty_like(q)
    step(first)
    graph = cuda_graph_of(lambda: w.run(q, cache, out=out))
    step(first)  # the second call takes the _cached_module.plan path
    graph.replay()
    torch.cuda.synchronize()
    _check_rows(out, q, [(k[:n], v[:n]) for (k, v), n in zip(seqs2, first)], [1] * batch,
                dtype, sm_scale=scale, soft_cap=cap)
    step(second)
    graph.replay()
    torch.cuda.synchronize()
    _check_rows(out, q, seqs2, [1] * batch, dtype, sm_scale=scale, soft_cap=cap)


@pytest.mark.parametrize("backend", ["cutlass", "trtllm-gen", "cudnn", "cute-dsl"])
def test_upstream_only_backends_are_named(backend):
    for cls in (flashinfer.BatchDecodeWithPagedKVCacheWrapper,
                flashinfer.BatchPrefillWithPagedKVCacheWrapper,
                flashinfer.BatchPrefillWithRaggedKVCacheWrapper):
        with pytest.raises(NotImplementedError, match=rf"backend='{backend}' is not provided"):
            cls(_ws(), backend=backend)


@pytest.mark.parametrize("name,value", [("use_fp16_qk_reduction", True),
                                        ("scale_q", torch.ones(1)), ("kv_cache_sf", torch.ones(1))])
def test_single_prefill_refuses_unsupported_arguments(name, value):
    q = torch.randn(4, HQ, D).half()
    k = torch.randn(9, HKV, D).half()
    with pytest.raises(NotImplementedError, match=rf"single_prefill_with_kv_cache\({name}="):
        flashinfer.single_prefill_with_kv_cache(q, k, k, **{name: value})

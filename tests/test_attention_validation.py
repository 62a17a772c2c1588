"""Arguments the attention ops must refuse on the host, with the argument named, before anything
is compiled or launched (CPU tests: the module fetch is made to fail, so a check that came too
late would surface as that failure instead)."""

from __future__ import annotations

import math

import pytest
import torch

import flashinfer
import flashinfer.attention.runtime as rt

HQ, HKV, D, PAGE = 8, 2, 64, 16


@pytest.fixture(autouse=True)
def no_compile(monkeypatch):
    def refuse(variant):
        raise AssertionError("validation must fail before the module is fetched")

    monkeypatch.setattr(rt, "get_attention_module", refuse)
    monkeypatch.setattr("flashinfer.attention.wrapper.device_num_sms", lambda device: 132)


def _ws():
    return torch.empty(1 << 20, dtype=torch.uint8)


def _decode(**kw):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws())
    args = dict(indptr=torch.tensor([0, 2, 3], dtype=torch.int32),
                indices=torch.tensor([4, 0, 2], dtype=torch.int32),
                last_page_len=torch.tensor([5, 16], dtype=torch.int32),
                num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=PAGE,
                q_data_type=torch.float16)
    args.update(kw)
    w.plan(**args)
    return w


def _paged_prefill(**kw):
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws())
    args = dict(qo_indptr=torch.tensor([0, 3, 4], dtype=torch.int32),
                paged_kv_indptr=torch.tensor([0, 2, 3], dtype=torch.int32),
                paged_kv_indices=torch.tensor([4, 0, 2], dtype=torch.int32),
                paged_kv_last_page_len=torch.tensor([5, 16], dtype=torch.int32),
                num_qo_heads=HQ, num_kv_heads=HKV, head_dim_qk=D, page_size=PAGE,
                q_data_type=torch.float16)
    args.update(kw)
    w.plan(**args)
    return w


def _ragged_prefill(**kw):
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws())
    args = dict(qo_indptr=torch.tensor([0, 3, 4], dtype=torch.int32),
                kv_indptr=torch.tensor([0, 20, 40], dtype=torch.int32),
                num_qo_heads=HQ, num_kv_heads=HKV, head_dim_qk=D, q_data_type=torch.float16)
    args.update(kw)
    w.plan(**args)
    return w


PAGED = {"decode": (_decode, "indices", "indptr"),
         "paged prefill": (_paged_prefill, "paged_kv_indices", "paged_kv_indptr")}
ALL = {"decode": _decode, "paged prefill": _paged_prefill, "ragged prefill": _ragged_prefill}


def _cache(pages=5):
    return torch.randn(pages, 2, PAGE, HKV, D).half()


@pytest.mark.parametrize("kind", PAGED)
def test_plan_rejects_page_ids_shorter_than_indptr(kind):
    make, name, _ = PAGED[kind]
    with pytest.raises(ValueError, match=rf"{name} must hold indptr\[-1\] = 3 page ids, got 2"):
        make(**{name: torch.tensor([4, 0], dtype=torch.int32)})


@pytest.mark.parametrize("kind", PAGED)
def test_plan_rejects_negative_page_ids(kind):
    make, name, _ = PAGED[kind]
    with pytest.raises(ValueError, match=rf"{name} must hold page ids >= 0, got -1"):
        make(**{name: torch.tensor([4, -1, 2], dtype=torch.int32)})


@pytest.mark.parametrize("kind", PAGED)
def test_run_rejects_page_ids_past_the_cache(kind):
    """Host page ids are checked against the cache the run is given (5 pages: ids 0-4)."""
    make, name, _ = PAGED[kind]
    w = make(**{name: torch.tensor([4, 0, 5], dtype=torch.int32)})
    q = torch.randn(2 if kind == "decode" else 4, HQ, D).half()
    with pytest.raises(ValueError, match="has 5 pages, the planned page ids reach 5"):
        w.run(q, _cache(5))


@pytest.mark.parametrize("kind", ALL)
def test_run_on_cpu_tensors_names_q_before_compiling(kind):
    w = ALL[kind]()
    q = torch.randn(2 if kind == "decode" else 4, HQ, D).half()
    kv = (_cache(),) if kind != "ragged prefill" else (torch.randn(40, HKV, D).half(),) * 2
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        w.run(q, *kv)


@pytest.mark.parametrize("single", ["prefill", "decode"])
def test_single_calls_on_cpu_tensors_name_q(single):
    k = v = torch.randn(40, HKV, D).half()
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        if single == "prefill":
            flashinfer.single_prefill_with_kv_cache(torch.randn(3, HQ, D).half(), k, v)
        else:
            flashinfer.single_decode_with_kv_cache(torch.randn(HQ, D).half(), k, v)


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("option,value,match", [
    ("sm_scale", math.nan, "sm_scale must be positive and finite, got nan"),
    ("sm_scale", -1.0, "sm_scale must be positive"),
    ("logits_soft_cap", math.nan, "logits_soft_cap must be >= 0"),
    ("window_left", -2, r"window_left must be an int >= -1 \(-1: no window\), got -2"),
    ("rope_theta", 0.0, "rope_theta must be positive"),
])
def test_plan_rejects_bad_options(kind, option, value, match):
    with pytest.raises(ValueError, match=match):
        ALL[kind](**{option: value})


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("heads", [(-8, 2), (8, -2), (0, 2), (8, 3)])
def test_plan_rejects_bad_head_counts(kind, heads):
    with pytest.raises(ValueError, match="num_qo_heads"):
        ALL[kind](num_qo_heads=heads[0], num_kv_heads=heads[1])


@pytest.mark.parametrize("option,value,match", [
    ("sm_scale", math.nan, "sm_scale must be positive and finite"),
    ("window_left", -2, "window_left must be an int >= -1"),
    ("logits_soft_cap", -1.0, "logits_soft_cap must be >= 0"),
])
def test_single_calls_reject_bad_options_before_compiling(monkeypatch, option, value, match):
    """With a q that passes the device check, the options are still refused before the module
    is fetched (the test pretends q is a CUDA tensor)."""
    monkeypatch.setattr("flashinfer.attention.single.check_cuda", lambda x, name: None)
    q, k = torch.randn(3, HQ, D).half(), torch.randn(40, HKV, D).half()
    with pytest.raises(ValueError, match=match):
        flashinfer.single_prefill_with_kv_cache(q, k, k, **{option: value})


@pytest.mark.parametrize("kind", ALL)
def test_run_rejects_unknown_keywords(kind):
    w = ALL[kind]()
    q = torch.randn(2 if kind == "decode" else 4, HQ, D).half()
    kv = (_cache(),) if kind != "ragged prefill" else (torch.randn(40, HKV, D).half(),) * 2
    with pytest.raises(TypeError, match="unexpected keyword argument 'sm_scal'"):
        w.run(q, *kv, sm_scal=0.1)
    with pytest.raises(NotImplementedError, match="kv_cache_sf"):
        w.run(q, *kv, kv_cache_sf=torch.zeros(HQ))

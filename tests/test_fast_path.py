"""The per-call fast paths of the small ops (``flashinfer._checks.ModuleFunctions``).

Once an op's module is loaded, its public function calls the binding directly and lets the
binding's checks stand for the Python ones; anything the binding refuses re-runs the checked
path, so every error stays what it was. CPU tests drive the fast path with a stand-in binding;
GPU tests check that, with the real module loaded, bad arguments raise the checked path's
errors and that input the fast path does not take (int64 or strided metadata, views that need
a copy) still works.
"""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer import _checks, activation, norm, page, rope

FAMILIES = {"norm": norm, "activation": activation, "rope": rope, "page": page}


def cpu_calls():
    """(family, op name in the binding, call) with CPU arguments the Python checks accept up to
    the device check."""
    x, r, w = torch.randn(2, 64).half(), torch.randn(2, 64).half(), torch.randn(64).half()
    q, k = torch.randn(3, 4, 64).half(), torch.randn(3, 2, 64).half()
    pos = torch.arange(3, dtype=torch.int32)
    indptr, offsets = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    key = torch.randn(2, 2, 8).half()
    cache = torch.zeros(3, 2, 4, 2, 8).half()
    meta = (torch.zeros(2, dtype=torch.int32), torch.arange(2, dtype=torch.int32),
            torch.tensor([2, 0], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32),
            torch.tensor([2], dtype=torch.int32))
    return [
        ("norm", "rmsnorm", lambda: flashinfer.rmsnorm(x, w)),
        ("norm", "gemma_rmsnorm", lambda: flashinfer.gemma_rmsnorm(x, w)),
        ("norm", "fused_add_rmsnorm", lambda: flashinfer.fused_add_rmsnorm(x, r, w)),
        ("norm", "gemma_fused_add_rmsnorm", lambda: flashinfer.gemma_fused_add_rmsnorm(x, r, w)),
        ("activation", "silu_and_mul", lambda: flashinfer.silu_and_mul(x)),
        ("activation", "gelu_and_mul", lambda: flashinfer.gelu_and_mul(x)),
        ("rope", "apply_rope_pos_ids", lambda: flashinfer.apply_rope_pos_ids(q, k, pos)),
        ("rope", "apply_rope_pos_ids", lambda: flashinfer.apply_rope_pos_ids_inplace(q, k, pos)),
        ("rope", "apply_rope_indptr", lambda: flashinfer.apply_rope(q, k, indptr, offsets)),
        ("page", "append_paged_kv_cache",
         lambda: flashinfer.append_paged_kv_cache(key, key, meta[0], meta[1], cache, *meta[2:])),
    ]


@pytest.fixture
def fake_binding(monkeypatch):
    """Install ``fn`` as the loaded function ``name`` of a family (and a PDL default for CPU)."""

    def install(family, name, fn):
        mod = FAMILIES[family]
        monkeypatch.setattr(mod._fns, "loaded", {name: fn})
        monkeypatch.setattr(mod, "resolve_pdl", lambda enable_pdl, device: True)

    return install


@pytest.mark.parametrize("case", range(len(cpu_calls())))
def test_a_refusing_binding_falls_back_to_the_checked_error(case, fake_binding, monkeypatch):
    family, name, call = cpu_calls()[case]

    def refuse(*args):
        raise TypeError("binding: refused")

    fake_binding(family, name, refuse)

    def no_module():
        raise AssertionError("the checked path must fail before loading the module")

    monkeypatch.setattr(FAMILIES[family], f"get_{family}_module", no_module)
    with pytest.raises(ValueError, match="CUDA"):  # the checked path's device error
        call()


@pytest.mark.parametrize("case", range(len(cpu_calls())))
def test_an_accepting_binding_is_called_once_with_the_arguments(case, fake_binding):
    family, name, call = cpu_calls()[case]
    seen = []
    fake_binding(family, name, lambda *args: seen.append(args))
    call()
    assert len(seen) == 1
    assert seen[0][-1] is True  # the resolved PDL flag comes last


def test_resolve_pdl_caches_per_device_only_for_indexed_devices(monkeypatch):
    calls = []

    def support(device):
        calls.append(device)
        return True

    monkeypatch.setattr(_checks, "device_support_pdl", support)
    monkeypatch.setattr(_checks, "_PDL_DEFAULT", {})
    dev = torch.device("cuda", 0)
    assert _checks.resolve_pdl(None, dev) and _checks.resolve_pdl(None, dev)
    assert calls == [dev]
    assert _checks.resolve_pdl(None, torch.device("cuda")) and len(calls) == 2
    assert _checks.resolve_pdl(None, torch.device("cuda")) and len(calls) == 3
    assert _checks.resolve_pdl(False, dev) is False and len(calls) == 3


# ---------------------------------------------------------------------------------------------
# GPU: the real bindings loaded


def _load_all():
    x, w = torch.randn(2, 64, dtype=torch.float16, device="cuda"), torch.randn(
        64, dtype=torch.float16, device="cuda")
    flashinfer.rmsnorm(x, w)
    flashinfer.fused_add_rmsnorm(x.clone(), x.clone(), w)
    flashinfer.silu_and_mul(x)
    q = torch.randn(3, 4, 64, dtype=torch.float16, device="cuda")
    flashinfer.apply_rope_pos_ids(q, q[:, :2], torch.arange(3, device="cuda"))
    flashinfer.apply_rope(q, q[:, :2], torch.tensor([0, 3], device="cuda"),
                          torch.tensor([1], device="cuda"))
    assert norm._fns.loaded and activation._fns.loaded and rope._fns.loaded


@pytest.mark.gpu
def test_gpu_bad_arguments_raise_the_checked_errors():
    _load_all()
    dev = dict(device="cuda")
    x = torch.randn(2, 64, dtype=torch.bfloat16, **dev)
    w = torch.randn(64, dtype=torch.bfloat16, **dev)
    with pytest.raises(ValueError, match="weight must be bfloat16, got torch.float32"):
        flashinfer.rmsnorm(x, w.float())
    with pytest.raises(ValueError, match=r"weight must have shape \(64,\)"):
        flashinfer.rmsnorm(x, w[:32])
    with pytest.raises(ValueError, match="out must have dtype"):
        flashinfer.rmsnorm(x, w, out=torch.empty_like(x).half())
    with pytest.raises(ValueError, match="input must be float16 or bfloat16 or float32"):
        flashinfer.rmsnorm(x.double(), w.double())
    with pytest.raises(ValueError, match=r"residual must have shape \(2, 64\)"):
        flashinfer.fused_add_rmsnorm(x, x[:1].clone(), w)
    with pytest.raises(ValueError, match="The pointers must be multiple of 16 bytes"):
        flashinfer.silu_and_mul(x[:, :12])
    with pytest.raises(AssertionError, match="out.shape"):
        flashinfer.silu_and_mul(x, out=torch.empty(2, 64, dtype=torch.bfloat16, **dev))
    with pytest.raises(ValueError, match="input must be float16 or bfloat16"):
        flashinfer.silu_and_mul(x.float())
    q = torch.randn(3, 4, 64, dtype=torch.float16, **dev)
    pos = torch.arange(3, dtype=torch.int32, **dev)
    with pytest.raises(ValueError, match="k must have shape"):
        flashinfer.apply_rope_pos_ids(q, q[:2], pos)
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        flashinfer.apply_rope_pos_ids(q, q, pos, rotary_dim=63)
    with pytest.raises(ValueError, match="rotary_dim must be an int or None"):
        flashinfer.apply_rope_pos_ids(q, q, pos, rotary_dim=64.0)
    with pytest.raises(ValueError, match="rope_theta must be positive"):
        flashinfer.apply_rope_pos_ids(q, q, pos, rope_theta=float("nan"))
    with pytest.raises(ValueError, match="pos_ids must be int32 or int64"):
        flashinfer.apply_rope_pos_ids(q, q, pos.float())
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        flashinfer.apply_rope_pos_ids(q.cpu(), q.cpu(), pos.cpu())


@pytest.mark.gpu
def test_gpu_input_the_fast_path_does_not_take_still_works():
    _load_all()
    dev = dict(device="cuda")
    # rope: int64 and non-contiguous pos_ids, the same rotation as int32 contiguous ones
    q = torch.randn(4, 4, 64, dtype=torch.float16, **dev)
    pos = torch.tensor([3, 1, 7, 2], dtype=torch.int32, **dev)
    want = flashinfer.apply_rope_pos_ids(q, q, pos)
    for p in (pos.long(), torch.stack([pos, pos], 1)[:, 0]):
        got = flashinfer.apply_rope_pos_ids(q, q, p)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # activation: 3-D input and an out that cannot be viewed as rows
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16, **dev)
    want = flashinfer.silu_and_mul(x.reshape(6, 64)).reshape(2, 3, 32)
    assert torch.equal(flashinfer.silu_and_mul(x), want)
    out = torch.empty(3, 2, 32, dtype=torch.bfloat16, **dev).transpose(0, 1)
    assert flashinfer.silu_and_mul(x, out=out) is out and torch.equal(out, want)
    # norm: rows whose last dim is strided are refused by the binding and by the checks
    w = torch.randn(64, dtype=torch.bfloat16, **dev)
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        flashinfer.rmsnorm(torch.randn(2, 128, dtype=torch.bfloat16, **dev)[:, ::2], w)

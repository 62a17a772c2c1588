"""What the released set precompiles (flashinfer.aot's registry is the jit-cache wheel's list),
and what a module outside it says when JIT is disabled: each way to get it, one a line."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashinfer import __version__, _versions, aot, knobs
from flashinfer.exceptions import MissingJITCacheError
from flashinfer.jit import core, jit_cache, remedy
from flashinfer.jit.archs import parse_arch_list
from flashinfer.jit.attention import AttentionVariant

NAMES = {s.name for s in aot.registered_specs()}
VERSION = _versions.public_version(__version__)


def test_the_registry_is_the_documented_policy():
    """docs/wheels.md: no-mask and causal at head_dim 64/128/256/512 and 192/128; custom masks
    at 64/128/256; in-kernel RoPE and ALiBi at 128; fp16 and bf16; paged and ragged; an
    fp8-e4m3 KV cache (no mask and causal) at 128."""
    attention = {n for n in NAMES if n.startswith("attention_")}
    want = set()
    for short in ("f16_of16", "bf16_obf16"):
        for layout in ("paged", "ragged"):
            for d in (64, 128, 256):
                want |= {f"attention_{layout}_{short}_d{d}_{m}_none" for m in ("none", "causal",
                                                                                 "custom")}
            want |= {f"attention_{layout}_{short}_d128_{m}_{p}" for m in ("none", "causal")
                     for p in ("rope_llama", "alibi")}
            want |= {f"attention_{layout}_{short}_{d}_{m}_none{vo}" for m in ("none", "causal")
                     for d, vo in (("d512", ""), ("d192", "_vo128"))}
            q, o = short.split("_")
            want |= {f"attention_{layout}_{q}_kve4m3_{o}_d128_{m}_none" for m in ("none", "causal")}
    assert attention == want and len(want) == 76
    # besides attention: one module per small op family
    assert NAMES - attention == {"scale", "norm", "activation", "rope", "quantization", "page",
                                 "cascade", "topk", "sampling"} & (NAMES - attention)
    assert {"scale", "norm", "activation", "rope", "page", "cascade"} <= NAMES
    # the examples: the custom mask is now precompiled, in-kernel RoPE at 256 is not
    assert "attention_ragged_f16_of16_d64_custom_none" in NAMES
    assert "attention_paged_f16_of16_d256_none_rope_llama" not in NAMES


def _lines(message):
    head, *ways = message.split("\n")
    assert all(w.startswith("- ") for w in ways), message
    return head, ways


@pytest.fixture
def no_wheel(monkeypatch):
    monkeypatch.setattr(jit_cache, "installed", lambda: None)


def test_a_variant_no_wheel_holds_says_to_compile_it(no_wheel):
    spec = AttentionVariant("float16", "float16", 256, "none", "ROPE_LLAMA", True).spec()
    head, ways = _lines(remedy.missing_module_message(spec, "u_1", [parse_arch_list("9.0a")[0]]))
    assert head.startswith(f"JIT module {spec.name!r} (uri u_1, archs 9.0a) is not in any cache")
    assert "FLASHINFER_DISABLE_JIT is set" in head
    assert ways[0].startswith("- no flashinfer-jit-cache wheel precompiles this variant")
    assert "install the CUDA toolkit" in ways[1] and "unset FLASHINFER_DISABLE_JIT" in ways[1]
    assert ways[2].startswith('- or compile it where nvcc is (call the op once, with '
                              'FLASHINFER_CUDA_ARCH_LIST="9.0a"')


def test_a_precompiled_module_names_the_wheel_and_the_pip_command(no_wheel):
    spec = next(s for s in aot.registered_specs() if s.name == "norm")
    _, ways = _lines(remedy.missing_module_message(spec, "norm_1", [parse_arch_list("9.0a")[0]]))
    assert ways[0].startswith(f"- install flashinfer-jit-cache {VERSION}, which precompiles it "
                              "for 8.0 9.0a 10.0a 12.0a: pip install "
                              f"'flashinfer-jit-cache=={VERSION}' --extra-index-url "
                              "https://flashinfer.ai/whl/cu")
    assert "(python -m flashinfer.aot --only norm, with" in ways[2]


def test_an_installed_wheel_of_other_archs_says_so(monkeypatch):
    wheel = jit_cache.JitCacheWheel(Path("/w"), {"version": f"{VERSION}+cu130",
                                                 "arch_list": ["8.0"]}, "", ())
    monkeypatch.setattr(jit_cache, "installed", lambda: wheel)
    spec = next(s for s in aot.registered_specs() if s.name == "norm")
    _, ways = _lines(remedy.missing_module_message(spec, "norm_1", [parse_arch_list("12.0a")[0]]))
    assert ways[0] == (f"- the installed flashinfer-jit-cache {VERSION}+cu130 holds it for 8.0, "
                       "none of which serves 12.0a (docs/wheels.md, 'Which GPUs a wheel "
                       "serves'): it is compiled once, below")
    # sm_80 SASS serves 8.6: then the module is there, but of other sources or flags
    _, ways = _lines(remedy.missing_module_message(spec, "norm_1", parse_arch_list("8.6")))
    assert "has it for these archs, but built from other sources or flags" in ways[0]


def test_get_module_raises_it(no_wheel, monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    monkeypatch.setattr(core, "_aot_module", lambda spec, archs: None)
    spec = AttentionVariant("bfloat16", "bfloat16", 64, "none", "ALIBI", False).spec()
    with knobs.jit.scope():
        knobs.jit.disable_jit = True
        knobs.jit.cuda_arch_list = "9.0a"
        with pytest.raises(MissingJITCacheError) as caught:
            core.get_module(spec)
    assert caught.value.spec == spec
    _, ways = _lines(str(caught.value))
    assert len(ways) == 3 and "no flashinfer-jit-cache wheel precompiles" in ways[0]


def test_release_archs_are_the_noxfile_release_list():
    nox = pytest.importorskip("nox")  # noqa: F841 - noxfile imports it
    import sys

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    import noxfile

    assert tuple(noxfile.RELEASE_ARCHS.split()) == aot.RELEASE_ARCHS


def test_registry_and_spec_flag_agree():
    """`JitSpec.precompiled` (what a missing module's error reads, below the registry) is true
    exactly for the registered specs: a variant outside the policy says so."""
    assert all(s.precompiled for s in aot.registered_specs())
    off = AttentionVariant("float16", "float16", 256, "none", "ROPE_LLAMA", True).spec()
    assert off.name not in NAMES and not off.precompiled

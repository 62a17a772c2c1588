"""Every registered module compiles with the real nvcc for sm_90a (no GPU needed), and the CLI
sees the result. Catches a broken kernel header in CI, where no GPU test runs."""

import platform
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from flashinfer import aot
from flashinfer.__main__ import cli

EXPORTS = {
    "scale": ["scale"],
    "norm": ["rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm",
             "layernorm"],
    "activation": ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"],
    "rope": ["apply_rope_pos_ids", "apply_rope_indptr", "apply_rope_cos_sin_cache"],
    "quantization": ["packbits", "segment_packbits"],
    "page": ["append_paged_kv_cache", "get_batch_indices_positions"],
    "cascade": ["merge_state", "merge_state_in_place", "merge_states", "merge_states_varlen"],
    "topk": ["top_k", "top_k_page_table_transform", "top_k_ragged_transform"],
    "sampling": ["sample", "transform", "chain_speculative"],
}
ATTENTION_EXPORTS = ["run", "cta_tile_q", "cluster_capacity", "run_params_version"]
# Every attention variant is one instantiation of the same source (~20 s of nvcc each): CI
# compiles one paged and one ragged variant, the GPU run compiles all of them.
ATTENTION_SAMPLE = ("attention_paged_bf16_obf16_d128_causal_none",
                    "attention_ragged_f16_of16_d64_none_none")


def _exports(name):
    return ATTENTION_EXPORTS if name.startswith("attention_") else EXPORTS[name]


def test_registry_names_every_module_once():
    names = [s.name for s in aot.registered_specs()]
    assert len(set(names)) == len(names)
    assert sorted(n for n in names if not n.startswith("attention_")) == sorted(EXPORTS)
    assert set(ATTENTION_SAMPLE) <= set(names)


@pytest.mark.nvcc
def test_every_module_builds_and_exports_its_functions():
    from flashinfer.jit.core import get_module

    specs = [s for s in aot.registered_specs()
             if not s.name.startswith("attention_") or s.name in ATTENTION_SAMPLE]
    aot.build_all(specs, jobs=2)
    for spec in specs:
        module = get_module(spec)
        for fn in _exports(spec.name):
            assert callable(getattr(module, fn)), (spec.name, fn)
    _assert_manylinux_2_28(specs)
    status = CliRunner().invoke(cli, ["module-status", "--filter", "compiled"])
    assert status.exit_code == 0, status.output
    for name in EXPORTS:
        assert name in status.output


def _assert_manylinux_2_28(specs):
    """What the jit-cache wheel's tag promises, for every module this test loaded, built here
    or taken from an installed jit-cache wheel (tools/wheels/check.py holds the packed modules
    to the same policy): csrc/manylinux_compat.h at work."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from wheels import check

    from flashinfer.jit import core

    # glibc 2.38 headers redirect strtol & co. to __isoc23_* (GLIBC_2.38) in C++ builds, which
    # the compat header does not undo: modules built on such a machine are for that machine
    # only, and a jit-cache wheel built there is refused by tools/wheels/check.py.
    libc, version = platform.libc_ver()
    here_ok = libc == "glibc" and tuple(map(int, version.split(".")[:2])) <= (2, 37)
    problems, checked = [], 0
    for spec in specs:
        # built here, or (nox -s tests installs one) taken from the jit-cache wheel
        aot = core._aot_module(spec, core.target_archs(spec))
        if aot is None and not here_ok:
            continue
        so = aot.path if aot is not None else core.plan_build(spec).so_path
        problems += check.check_elf(spec.name, so.read_bytes(), platform.machine(),
                                    f"manylinux_2_28_{platform.machine()}", None)
        checked += 1
    # libcudart is provided by the runtime; the check is given no CUDA major here
    assert [p for p in problems if "libcudart" not in p] == []
    if checked == 0:
        pytest.skip(f"modules built on {libc} {version} (newer than 2.37) cannot meet "
                    "manylinux_2_28; exports checked, tag not")


def test_aot_cli_rejects_unknown_modules(capsys):
    with pytest.raises(SystemExit):
        aot.main(["--only", "nope"])
    assert "unknown modules" in capsys.readouterr().err


def test_build_all_refuses_specs_that_share_a_name():
    spec = aot.registered_specs()[0]
    with pytest.raises(ValueError, match=rf"distinct names .*\['{spec.name}'\]"):
        aot.build_all([spec, spec], jobs=1)

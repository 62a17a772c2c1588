"""Every registered module compiles with the real nvcc for sm_90a (no GPU needed), and the CLI
sees the result. Catches a broken kernel header in CI, where no GPU test runs."""

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
}


def test_registry_names_every_module_once():
    names = [s.name for s in aot.registered_specs()]
    assert sorted(names) == sorted(EXPORTS) and len(set(names)) == len(names)


@pytest.mark.nvcc
def test_every_module_builds_and_exports_its_functions():
    from flashinfer.jit.core import get_module

    aot.build_all(aot.registered_specs(), jobs=2)
    for spec in aot.registered_specs():
        module = get_module(spec)
        for fn in EXPORTS[spec.name]:
            assert callable(getattr(module, fn)), (spec.name, fn)
    status = CliRunner().invoke(cli, ["module-status", "--filter", "compiled"])
    assert status.exit_code == 0, status.output
    for name in EXPORTS:
        assert name in status.output


def test_aot_cli_rejects_unknown_modules(capsys):
    with pytest.raises(SystemExit):
        aot.main(["--only", "nope"])
    assert "unknown modules" in capsys.readouterr().err

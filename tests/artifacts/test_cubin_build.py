"""tools/cubin_build.py: the declared kernels, the computed layouts, one real cubin compiled for
sm_90a, and a layout that disagrees with the header being refused by the compiler."""

from __future__ import annotations

import json

import cubin_build
import pytest

from flashinfer.artifacts.manifest import Index, Manifest, sha256_hex


def test_the_declared_kernels():
    spec = cubin_build.load_spec()
    variants = cubin_build.expand(spec, ["9.0a"])
    names = {v.name for v in variants}
    assert len(names) == len(variants)  # one cubin per variant and arch
    assert {"rmsnorm_bfloat16_a16_v4", "rmsnorm_float16_a0_v0", "silu_and_mul_bfloat16_a16",
            "fused_add_rmsnorm_bfloat16_a16_v4", "gelu_tanh_and_mul_float16_a8"} <= names
    assert len(cubin_build.expand(spec, ["9.0a", "10.0a"])) == 2 * len(variants)
    v = next(v for v in variants if v.name == "rmsnorm_bfloat16_a16_v4")
    assert v.path == "sm_90a/rmsnorm/rmsnorm_bfloat16_a16_v4.cubin"
    assert dict(v.defines)["FI_T"] == "__nv_bfloat16" and dict(v.values)["vecs"] == 4


def test_layouts_follow_the_c_abi():
    spec = cubin_build.load_spec()
    act = cubin_build.compute_layout("act_and_mul", spec["layouts"]["act_and_mul"]).params
    assert act.args == ((0, 8), (8, 8), (16, 56)) and act.size == 72
    assert act.field("rows").offset == 16 and act.field("num_tiles").offset == 64
    norm = cubin_build.compute_layout("rmsnorm", spec["layouts"]["rmsnorm"]).params
    assert norm.size == 120 and norm.args == ((0, 120),)
    assert norm.field("hidden").offset == 96 and norm.field("weight_offset").offset == 112


def test_entry_symbols_rejects_non_elf():
    with pytest.raises(ValueError):
        cubin_build.entry_symbols(b"not an elf")


@pytest.mark.nvcc
def test_build_one_real_cubin_into_a_staging_repository(tmp_path):
    manifest, sha = cubin_build.build("0.0.1", ["9.0a"], tmp_path, jobs=1,
                                      patterns=["rmsnorm_bfloat16_a16_v4"])
    (entry,) = manifest.files
    assert entry.arch == "9.0a" and entry.kernel.family == "rmsnorm"
    assert entry.kernel.symbol.startswith("_ZN10flashinfer4norm13RMSNormKernelI13__nv_bfloat16Li8ELi4E")
    blob = (tmp_path / entry.object_path).read_bytes()
    assert blob[:4] == b"\x7fELF" and sha256_hex(blob) == entry.sha256
    assert cubin_build.entry_symbols(blob) == [entry.kernel.symbol]
    data = (tmp_path / "releases/0.0.1/manifest.json").read_bytes()
    assert sha256_hex(data) == sha and Manifest.from_bytes(data, sha) == manifest
    assert Index.from_bytes((tmp_path / "index.json").read_bytes()).releases["0.0.1"]


@pytest.mark.nvcc
def test_a_layout_that_disagrees_with_the_header_does_not_build(tmp_path):
    spec = cubin_build.load_spec()
    fields = spec["layouts"]["rmsnorm"][0]["fields"]
    fields[10], fields[11] = fields[11], fields[10]  # rows <-> heads: same size, wrong order
    fields.pop()  # and a missing trailing field
    bad = tmp_path / "kernels.json"
    bad.write_text(json.dumps(spec))
    with pytest.raises(RuntimeError, match="artifacts/kernels.json"):
        cubin_build.build("0.0.1", ["9.0a"], tmp_path / "out", jobs=1,
                          patterns=["rmsnorm_bfloat16_a16_v4"], spec_path=bad)


@pytest.mark.nvcc
def test_rebuilding_the_same_files_keeps_the_manifest(tmp_path):
    first, sha1 = cubin_build.build("0.0.2", ["9.0a"], tmp_path, jobs=1,
                                    patterns=["silu_and_mul_float16_a16"], created="2026-01-01T00:00:00Z")
    again, sha2 = cubin_build.build("0.0.2", ["9.0a"], tmp_path, jobs=1,
                                    patterns=["silu_and_mul_float16_a16"], created="2027-01-01T00:00:00Z")
    assert sha1 == sha2 and again.created == "2026-01-01T00:00:00Z"  # nvcc output is deterministic

"""The built set, installed: exact pins and tags, a covered module loading with nvcc broken and
no source hashed, a mismatched jit-cache ignored with one warning, show-config printing the
manifest."""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
import zipfile

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from wheelhelpers import VERSION, check, pip_target, reversion_wheel, run_child


def _metadata(wheel) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode().splitlines()


def _manifest(wheel) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        return json.loads(zf.read("flashinfer_jit_cache/manifest.json"))


def test_the_built_set_passes_the_wheel_check(built, wheelhouse):
    assert check.check_dist(wheelhouse, VERSION) == []


def test_pins_are_exact_and_the_extra_matches_the_labelled_wheel(built):
    core = _metadata(built["flashinfer-python"])
    requires = [Requirement(line.split(": ", 1)[1]) for line in core
                if line.startswith("Requires-Dist: ")]
    pins = {(r.name, str(r.specifier), str(r.marker)) for r in requires if r.marker}
    assert ("flashinfer-jit-cache", f"=={VERSION}", 'extra == "jit-cache"') in pins
    assert ("flashinfer-cubin", f"=={VERSION}", 'extra == "cubin"') in pins
    for sibling in ("flashinfer-jit-cache", "flashinfer-cubin"):
        assert f"Requires-Dist: flashinfer-python=={VERSION}" in _metadata(built[sibling])
    jit_version = check.parse_wheel_filename(built["flashinfer-jit-cache"].name)[1]
    assert re.fullmatch(r"cu\d{3}", jit_version.local)
    # PEP 440: a specifier without a local label matches every local build of that version,
    # which is why the CUDA build is chosen by the index (docs/wheels.md), not by the pin.
    assert SpecifierSet(f"=={VERSION}").contains(str(jit_version))
    tvm = _manifest(built["flashinfer-jit-cache"])["tvm_ffi_version"]
    assert f"Requires-Dist: apache-tvm-ffi=={tvm}" in _metadata(built["flashinfer-jit-cache"])


def test_tags(built):
    assert built["flashinfer-python"].name.endswith("-py3-none-any.whl")
    assert built["flashinfer-cubin"].name.endswith("-py3-none-any.whl")
    assert re.search(r"-py3-none-manylinux_2_28_(x86_64|aarch64)\.whl$",
                     built["flashinfer-jit-cache"].name)
    with zipfile.ZipFile(built["flashinfer-jit-cache"]) as zf:
        wheel = zf.read(next(n for n in zf.namelist() if n.endswith("/WHEEL"))).decode()
    assert "Root-Is-Purelib: false" in wheel


def test_manifest_records_archs_cuda_and_module_hashes(built):
    manifest = _manifest(built["flashinfer-jit-cache"])
    assert manifest["flashinfer_version"] == VERSION and manifest["arch_list"]
    assert re.fullmatch(r"\d+\.\d+", manifest["cuda_version"])
    with zipfile.ZipFile(built["flashinfer-jit-cache"]) as zf:
        for m in manifest["modules"]:
            assert m["path"] == f"modules/{m['uri']}/{m['name']}.so"
            data = zf.read(f"flashinfer_jit_cache/{m['path']}")
            assert hashlib.sha256(data).hexdigest() == m["sha256"] and len(data) == m["size"]


# The child processes below import flashinfer from a private install of the built wheels.
_LOAD = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        import flashinfer
        from flashinfer import aot
        from flashinfer.jit import core
        hashed = []  # sources read to compute a URI: none when the digests vouch for them
        real_hash = core._hash_sources
        core._hash_sources = lambda *a: hashed.append(a[0].name) or real_hash(*a)
        name = sys.argv[1] if len(sys.argv) > 1 else "{name}"
        spec = next(s for s in aot.registered_specs() if s.name == name)
        result = {{"file": flashinfer.__file__, "version": flashinfer.__version__}}
        for attempt in range(2):  # the second call must not warn again
            try:
                module = core.get_module(spec)
                result["loaded"] = type(module).__name__
            except Exception as e:
                result["error"] = type(e).__name__ + ": " + str(e)
    result["stats"] = dict(core.stats)
    result["hashed"] = hashed
    result["warnings"] = [
        (w.category.__name__, str(w.message)) for w in caught
        if "NumPy" not in str(w.message)
    ]
    print("RESULT " + json.dumps(result))
    """
)


def _result(proc) -> dict:
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(line[len("RESULT "):])


def _covered(built) -> dict:
    """A module of the built jit-cache (the CI build holds only ``scale``)."""
    return _manifest(built["flashinfer-jit-cache"])["modules"][0]


def _failing_nvcc(tmp_path):
    """An nvcc that fails, and leaves a mark if anything ever runs it."""
    mark = tmp_path / "nvcc-was-run"
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    nvcc.chmod(0o755)
    return nvcc, mark


def test_covered_module_loads_with_nvcc_failing(built, installed, tmp_path):
    module = _covered(built)
    nvcc, mark = _failing_nvcc(tmp_path)
    proc = run_child(_LOAD.format(name=module["name"]), installed, env={
        "FLASHINFER_NVCC": str(nvcc),
        "CUDA_HOME": str(tmp_path / "no-cuda"),
        "FLASHINFER_CUDA_ARCH_LIST": " ".join(module["archs"]),
    })
    result = _result(proc)
    assert result["file"].startswith(str(installed)), result
    assert result["version"] == VERSION
    assert "error" not in result and result["loaded"] == "Module", result
    assert result["stats"] == {"loaded_aot": 1}, result  # loaded once, from the wheel
    assert result["warnings"] == []
    assert result["hashed"] == [], "the lookup hashed sources: the source digests disagree"
    assert not mark.exists(), "nvcc was run for a module the jit-cache covers"
    workspace = installed.parent / (installed.name + "-ws")
    assert not list(workspace.rglob("*.so")), "something was compiled"


def test_installed_sources_are_the_ones_the_digests_name(built, installed):
    """What the lookup trusts: the installed core recorded the digest of the sources it
    bundles, and the jit-cache was compiled from sources of that digest."""
    code = textwrap.dedent("""
        import json
        from flashinfer import _build_meta
        from flashinfer.jit import jit_cache, source_digest, toolchain
        print("RESULT " + json.dumps({
            "bundled": toolchain.sources_bundled(),
            "recorded": _build_meta.__source_digest__,
            "actual": source_digest.tree_digest(toolchain.source_root()),
            "match": jit_cache.sources_match()}))
        """)
    module = _covered(built)
    result = _result(run_child(code, installed,
                               env={"FLASHINFER_CUDA_ARCH_LIST": " ".join(module["archs"])}))
    manifest = _manifest(built["flashinfer-jit-cache"])
    assert result["bundled"] and result["recorded"] == result["actual"], result
    assert manifest["source_digest"] == result["recorded"] and result["match"], result


def test_uncovered_arch_is_not_taken_from_the_wheel(built, installed, tmp_path):
    """The wheel's module is for its archs only: another target arch goes to the JIT (here
    disabled, so the error names the wheel that would provide it)."""
    module = _covered(built)
    other = next(a for a in ("8.0", "12.0a", "10.3a", "12.1a") if a not in module["archs"])
    proc = run_child(_LOAD.format(name=module["name"]), installed, env={
        "FLASHINFER_DISABLE_JIT": "1",
        "FLASHINFER_CUDA_ARCH_LIST": other,
    })
    result = _result(proc)
    assert result["error"].startswith("MissingJITCacheError"), result
    assert "flashinfer-jit-cache" in result["error"] and result["stats"] == {}


def test_mismatched_jit_cache_is_ignored_with_one_warning(built, tmp_path):
    other = f"{VERSION}.post7+{check.parse_wheel_filename(built['flashinfer-jit-cache'].name)[1].local}"
    mismatched = reversion_wheel(built["flashinfer-jit-cache"], tmp_path, other)
    target = pip_target([built["flashinfer-python"], mismatched], tmp_path / "site")
    module = _covered(built)
    archs = " ".join(module["archs"])
    proc = run_child(_LOAD.format(name=module["name"]), target, env={
        "FLASHINFER_DISABLE_JIT": "1", "FLASHINFER_CUDA_ARCH_LIST": archs})
    result = _result(proc)
    assert result["version"] == VERSION  # import flashinfer neither crashed nor warned
    assert result["error"].startswith("MissingJITCacheError"), result
    assert len(result["warnings"]) == 1, result["warnings"]
    category, message = result["warnings"][0]
    assert category == "VersionMismatchWarning"
    assert other in message and f"flashinfer-python {VERSION}" in message
    assert f"pip install --force-reinstall --no-deps 'flashinfer-jit-cache=={VERSION}'" in message

    # FLASHINFER_DISABLE_VERSION_CHECK=1: the user takes responsibility, the module is used
    proc = run_child(_LOAD.format(name=module["name"]), target, env={
        "FLASHINFER_DISABLE_JIT": "1", "FLASHINFER_CUDA_ARCH_LIST": archs,
        "FLASHINFER_DISABLE_VERSION_CHECK": "1"})
    result = _result(proc)
    assert result.get("loaded") == "Module" and result["stats"] == {"loaded_aot": 1}, result
    assert result["warnings"] == []


def test_show_config_prints_the_manifest(built, installed):
    manifest = _manifest(built["flashinfer-jit-cache"])
    proc = run_child("from flashinfer.__main__ import main; main(['show-config'])", installed,
                     env={"FLASHINFER_CUDA_ARCH_LIST": " ".join(manifest["arch_list"])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    section = proc.stdout.split("=== JIT Cache Wheel ===", 1)[1].split("===", 1)[0]
    assert f"flashinfer-jit-cache: {manifest['version']}" in section
    assert "status: used" in section
    assert f"arch list: {' '.join(manifest['arch_list'])}" in section
    assert f"CUDA version: {manifest['cuda_version']}" in section
    assert f"modules: {len(manifest['modules'])} (" in section
    for module in manifest["modules"]:
        assert f"{module['uri']} [{' '.join(module['archs'])}] sha256 {module['sha256']}" in section

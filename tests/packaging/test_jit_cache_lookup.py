"""How the JIT decides whether the installed flashinfer-jit-cache may be used, on a fake
installed wheel (a manifest and placeholder files): arch coverage, the version and CUDA checks
(one warning each time a process starts, then ignored), the override, a broken manifest, the
URI comparison, and the match by config key that reads no source where the wheel was compiled
from the sources this package bundles. Nothing here compiles or loads a module."""

from __future__ import annotations

import importlib
import json
import warnings

import pytest

import flashinfer
from flashinfer import _versions, knobs
from flashinfer.exceptions import MissingJITCacheError
from flashinfer.jit import core, jit_cache, toolchain
from flashinfer.jit.archs import parse_arch_list
from flashinfer.jit.norm import gen_norm_module
from flashinfer.jit.scale import gen_scale_module

#: The fake wheel's version: ours, with the CUDA label (a source tree that was never built is
#: 0.0.0+unknown, whose local label must go first).
WHEEL_VERSION = _versions.public_version(flashinfer.__version__) + "+cu130"


def arch(text):
    return parse_arch_list(text)[0]


@pytest.mark.parametrize(
    "built, target, ok",
    [
        ("8.0", "8.0", True),
        ("8.0", "8.6", True),  # sm_80 SASS runs on 8.6 and 8.9
        ("8.0", "8.9", True),
        ("8.6", "8.0", False),  # never downwards
        ("8.0", "9.0", False),  # never across majors
        ("9.0a", "9.0a", True),
        ("9.0", "9.0a", False),  # an "a" target (what the JIT asks for on sm90+) wants "a" SASS
        ("9.0a", "9.0", True),  # a plain 9.0 target is a 9.0 GPU, where sm_90a runs
        ("10.0a", "10.3a", False),  # "a" SASS is for that exact arch
        ("10.0f", "10.3", True),  # family SASS runs on its family
        ("8.0+PTX", "9.0", False),  # PTX would mean a driver compile at first use
    ],
)
def test_covers(built, target, ok):
    assert jit_cache.covers(arch(built), arch(target)) is ok


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """Install a fake flashinfer_jit_cache (manifest + placeholder .so) ahead of any real one;
    returns a function that writes its manifest."""
    pkg = tmp_path / "site" / "flashinfer_jit_cache"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setattr(jit_cache, "runtime_cuda", lambda: None)
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "ws"))  # nothing on disk
    monkeypatch.delenv("FLASHINFER_DISABLE_VERSION_CHECK", raising=False)
    jit_cache.reset()
    core._loaded.clear()
    core.stats.clear()

    def write(version=WHEEL_VERSION, cuda="13.0", modules=None, raw=None, source_digest=None):
        if modules is None:
            uri = core.module_uri(gen_scale_module(), [arch("9.0a")])
            modules = [{"name": "scale", "uri": uri, "archs": ["9.0a"],
                        "path": f"modules/{uri}/scale.so", "sha256": "0" * 64, "size": 0}]
        for m in modules:
            (pkg / m["path"]).parent.mkdir(parents=True, exist_ok=True)
            (pkg / m["path"]).write_bytes(b"")
        manifest = {"version": version, "cuda_version": cuda, "nvcc_version": f"{cuda}, V{cuda}",
                    "tvm_ffi_version": "0.1.15", "arch_list": ["9.0a"], "modules": modules}
        if source_digest is not None:
            manifest["source_digest"] = source_digest
        (pkg / "manifest.json").write_text(raw if raw is not None else json.dumps(manifest))
        jit_cache.reset()
        return pkg

    yield write
    jit_cache.reset()
    core._loaded.clear()


def _candidates(targets="9.0a"):
    return jit_cache.candidates("scale", parse_arch_list(targets))


def test_matching_wheel_offers_its_module(fake_wheel):
    pkg = fake_wheel()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = _candidates()
    assert [m.path for m in found] == [pkg / found[0].path.relative_to(pkg)]
    assert core._aot_module(gen_scale_module(), parse_arch_list("9.0a")) == found[0]
    assert _candidates("8.0") == [] and jit_cache.candidates("norm", parse_arch_list("9.0a")) == []


def test_a_wheel_built_for_more_archs_is_keyed_by_its_own_archs(fake_wheel):
    """A release wheel holds "8.0 9.0a ..." in one .so; an H100 asks for 9.0a alone, and the
    URI it compares with is the one for the wheel's archs."""
    spec = gen_scale_module()
    wide = parse_arch_list("8.0 9.0a 10.0a")
    uri = core.module_uri(spec, wide)
    assert uri != core.module_uri(spec, parse_arch_list("9.0a"))
    fake_wheel(modules=[{"name": "scale", "uri": uri, "archs": ["8.0", "9.0a", "10.0a"],
                         "path": f"modules/{uri}/scale.so"}])
    assert core._aot_module(spec, parse_arch_list("9.0a")).uri == uri
    assert core._aot_module(spec, parse_arch_list("8.9")).uri == uri
    assert core._aot_module(spec, parse_arch_list("12.0a")) is None


def test_other_sources_or_flags_are_another_uri(fake_wheel, monkeypatch):
    fake_wheel()
    assert core._aot_module(gen_scale_module(), parse_arch_list("9.0a")) is not None
    monkeypatch.setenv("FLASHINFER_EXTRA_CUDAFLAGS", "-DSOMETHING_ELSE=1")
    assert core._aot_module(gen_scale_module(), parse_arch_list("9.0a")) is None
    # and what does not change the binary does not change the URI
    monkeypatch.delenv("FLASHINFER_EXTRA_CUDAFLAGS")
    monkeypatch.setenv("CXX", "g++")
    monkeypatch.setenv("FLASHINFER_NVCC_THREADS", "8")
    assert core._aot_module(gen_scale_module(), parse_arch_list("9.0a")) is not None


def _counting(monkeypatch, name):
    """Count the calls of ``core.<name>`` (and still make them)."""
    calls = []
    real = getattr(core, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(core, name, counted)
    return calls


def test_same_sources_match_by_config_key_without_reading_a_source(fake_wheel, monkeypatch):
    """The first call's lookup: where the wheel was compiled from exactly the sources this
    package bundles (same digest), the module's config key decides, and no source or header is
    read or hashed. The manifest's URI here is one the sources would never give, so a match can
    only come from the key."""
    spec, archs = gen_scale_module(), parse_arch_list("9.0a")
    uri = "scale_" + "0" * 16
    fake_wheel(source_digest="d" * 64, modules=[
        {"name": "scale", "uri": uri, "config_key": core.config_key(spec, archs),
         "archs": ["9.0a"], "path": f"modules/{uri}/scale.so"}])
    monkeypatch.setattr(jit_cache, "bundled_source_digest", lambda: "d" * 64)
    hashed = _counting(monkeypatch, "_hash_sources")
    headers = _counting(monkeypatch, "local_headers")
    assert jit_cache.sources_match()
    assert core._aot_module(spec, archs).uri == uri
    assert hashed == [] and headers == []

    # flags that change the binary change the key: the URI decides (and differs)
    monkeypatch.setenv("FLASHINFER_EXTRA_CUDAFLAGS", "-DSOMETHING_ELSE=1")
    assert core._aot_module(spec, archs) is None and len(hashed) == 1
    monkeypatch.delenv("FLASHINFER_EXTRA_CUDAFLAGS")

    # other sources (another digest): the key is not trusted, the URI decides
    monkeypatch.setattr(jit_cache, "bundled_source_digest", lambda: "c" * 64)
    assert not jit_cache.sources_match()
    assert core._aot_module(spec, archs) is None and len(hashed) == 2


def test_a_source_checkout_never_vouches_for_its_sources(monkeypatch):
    """A checkout's _build_meta.py may predate edits to its headers: its URIs are always
    computed from the files."""
    monkeypatch.setattr(toolchain, "sources_bundled", lambda: False)
    assert jit_cache.bundled_source_digest() is None


def test_config_key_follows_what_the_uri_hashes_except_the_files(monkeypatch):
    spec, archs = gen_scale_module(), parse_arch_list("9.0a")
    key = core.config_key(spec, archs)
    assert key == core.config_key(gen_scale_module(), parse_arch_list("9.0a"))
    assert key != core.config_key(spec, parse_arch_list("8.0 9.0a"))
    assert key != core.config_key(gen_norm_module(), archs)
    monkeypatch.setenv("CXX", "g++")  # the toolchain is not part of it, as for the URI
    monkeypatch.setenv("FLASHINFER_NVCC_THREADS", "8")
    assert core.config_key(spec, archs) == key
    monkeypatch.setenv("FLASHINFER_JIT_DEBUG", "1")
    assert core.config_key(spec, archs) != key
    assert core.in_source_tree(spec)
    assert not core.in_source_tree(core.JitSpec("x", ("/abs/x.cu",)))
    assert not core.in_source_tree(core.JitSpec("x", ("x.cu",), extra_include_dirs=("/inc",)))


def test_version_mismatch_warns_once_and_ignores_the_wheel(fake_wheel):
    fake_wheel(version="0.0.1+cu130")
    with pytest.warns(_versions.VersionMismatchWarning) as caught:
        assert _candidates() == []
        assert _candidates() == []  # the check ran once: no second warning
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "0.0.1+cu130" in message and f"flashinfer-python {flashinfer.__version__}" in message
    assert "pip install" in message
    # the JIT takes over: with JIT disabled, the error names the module and the wheel
    with knobs.jit.scope():
        knobs.jit.disable_jit = True
        with pytest.raises(MissingJITCacheError, match="flashinfer-jit-cache"):
            core.get_module(gen_scale_module())
    assert not jit_cache.installed().usable and "0.0.1" in jit_cache.installed().problem


def test_disable_version_check_uses_it_anyway(fake_wheel, monkeypatch):
    fake_wheel(version="0.0.1+cu130", cuda="12.8")
    monkeypatch.setenv("FLASHINFER_DISABLE_VERSION_CHECK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(_candidates()) == 1


def test_cuda_major_mismatch_warns_and_ignores(fake_wheel, monkeypatch):
    fake_wheel(cuda="13.0")
    monkeypatch.setattr(jit_cache, "runtime_cuda", lambda: "12.8")
    with pytest.warns(_versions.VersionMismatchWarning, match="CUDA 13.0.*CUDA 12.8"):
        assert _candidates() == []
    jit_cache.reset()
    monkeypatch.setattr(jit_cache, "runtime_cuda", lambda: "13.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(_candidates()) == 1


def test_unreadable_manifest_is_ignored_with_a_warning(fake_wheel):
    fake_wheel(raw="{not json")
    with pytest.warns(_versions.VersionMismatchWarning, match="unreadable manifest.json"):
        assert _candidates() == []


def test_a_module_that_does_not_load_falls_back_to_the_jit(fake_wheel):
    """E.g. a libstdc++ older than the build machine's: warn, then the JIT's path (disabled
    here, so its error)."""
    fake_wheel()  # its scale.so is an empty placeholder: the loader rejects it
    with knobs.jit.scope():
        knobs.jit.disable_jit = True
        with pytest.warns(RuntimeWarning, match="failed to load, so it is compiled instead"):
            with pytest.raises(MissingJITCacheError):
                core.get_module(gen_scale_module())
    assert "loaded_aot" not in core.stats


def test_describe_for_show_config(fake_wheel):
    fake_wheel()
    lines = jit_cache.describe()
    assert lines[0].startswith(f"flashinfer-jit-cache: {WHEEL_VERSION} at ")
    assert "status: used" in lines and "arch list: 9.0a" in lines
    assert "CUDA version: 13.0 (nvcc 13.0, V13.0)" in lines and "modules: 1 (scale)" in lines
    module = jit_cache.installed().manifest["modules"][0]
    assert f"  {module['uri']} [9.0a] sha256 {module['sha256']}" in lines


def test_no_wheel(monkeypatch):
    monkeypatch.setattr(jit_cache, "package_dir", lambda: None)
    jit_cache.reset()
    try:
        assert jit_cache.installed() is None and _candidates() == []
        assert jit_cache.describe() == [
            "flashinfer-jit-cache: not installed (modules come from the JIT)"]
    finally:
        jit_cache.reset()

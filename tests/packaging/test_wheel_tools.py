"""tools/wheels: the checker catches each kind of broken wheel (on small synthetic wheels), the
ELF reader reads a real library, and the index writer writes a PEP 503 index pip can use."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from wheelhelpers import read_wheel, write_wheel
from wheels import check, elf, index

source_digest = check._source_digest_module()

V = "1.2.3"
TVM = "0.1.15"


def _meta(name, version, requires=(), extras=()):
    lines = ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}",
             "Summary: a test package", "License-Expression: Apache-2.0",
             "Requires-Python: >=3.10"]
    lines += [f"Provides-Extra: {e}" for e in extras]
    lines += [f"Requires-Dist: {r}" for r in requires]
    return ("\n".join(lines) + "\n").encode()


def _wheel_file(tag, purelib=True):
    return f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {str(purelib).lower()}\nTag: {tag}\n".encode()


#: The sources the synthetic core wheel bundles, and their digest.
SOURCES = {"csrc/scale.cu": b"// scale\n", "include/flashinfer/vec.cuh": b"// vec\n"}
DIGEST = source_digest.digest_files(SOURCES.items())


def make_set(dist: Path, so: bytes, *, core_requires=None, jit_version=f"{V}+cu130",
             jit_tag="py3-none-manylinux_2_28_x86_64", cuda="13.0", manifest_sha=None,
             recorded_digest=DIGEST, jit_digest=DIGEST, config_key="0123456789abcdef"):
    """A minimal but complete set of three wheels in ``dist``."""
    dist.mkdir(exist_ok=True)
    core_requires = core_requires if core_requires is not None else [
        f'flashinfer-jit-cache=={V}; extra == "jit-cache"', f'flashinfer-cubin=={V}; extra == "cubin"']
    info = f"flashinfer_python-{V}.dist-info"
    write_wheel(dist / f"flashinfer_python-{V}-py3-none-any.whl", {
        "flashinfer/__init__.py": b"",
        "flashinfer/_build_meta.py": f'__version__ = "{V}"\n__source_digest__ = '
                                     f'"{recorded_digest}"\n'.encode(),
        **{f"flashinfer/data/{rel}": data for rel, data in SOURCES.items()},
        f"{info}/METADATA": _meta("flashinfer-python", V, ["torch", *core_requires],
                                  ["jit-cache", "cubin"]),
        f"{info}/WHEEL": _wheel_file("py3-none-any"),
    }, info)
    info = f"flashinfer_cubin-{V}.dist-info"
    write_wheel(dist / f"flashinfer_cubin-{V}-py3-none-any.whl", {
        "flashinfer_cubin/__init__.py": b"",
        f"{info}/METADATA": _meta("flashinfer-cubin", V, [f"flashinfer-python=={V}"]),
        f"{info}/WHEEL": _wheel_file("py3-none-any"),
    }, info)
    uri = "scale_0123456789abcdef"
    manifest = {"version": jit_version, "flashinfer_version": V, "cuda_version": cuda,
                "tvm_ffi_version": TVM, "arch_list": ["9.0a"], "source_digest": jit_digest,
                "modules": [
                    {"name": "scale", "uri": uri, "config_key": config_key, "archs": ["9.0a"],
                     "path": f"modules/{uri}/scale.so",
                     "sha256": manifest_sha or hashlib.sha256(so).hexdigest(), "size": len(so)}]}
    info = f"flashinfer_jit_cache-{jit_version}.dist-info"
    write_wheel(dist / f"flashinfer_jit_cache-{jit_version}-{jit_tag}.whl", {
        "flashinfer_jit_cache/__init__.py": b"",
        "flashinfer_jit_cache/manifest.json": json.dumps(manifest).encode(),
        f"flashinfer_jit_cache/modules/{uri}/scale.so": so,
        f"{info}/METADATA": _meta("flashinfer-jit-cache", jit_version,
                                  [f"flashinfer-python=={V}", f"apache-tvm-ffi=={TVM}"]),
        f"{info}/WHEEL": _wheel_file(jit_tag, purelib=False),
    }, info)
    return dist


@pytest.fixture(scope="module")
def good_so() -> bytes:
    """A real x86_64/aarch64 shared library within the manylinux_2_28 policy: TVM-FFI's own
    (a dependency, built for manylinux). It links only system libraries."""
    import importlib.util

    root = Path(importlib.util.find_spec("tvm_ffi").origin).parent
    return (root / "lib" / "libtvm_ffi.so").read_bytes()


def test_elf_reader_on_a_real_library(good_so):
    info = elf.read_elf(good_so)
    assert info.machine in ("x86_64", "aarch64")
    assert "libc.so.6" in info.needed and "libstdc++.so.6" in info.needed
    assert (2, 2) <= info.max_version("GLIBC") <= (2, 28)
    assert info.max_version("GLIBCXX") >= (3, 4)
    with pytest.raises(elf.ElfError):
        elf.read_elf(b"not an elf at all")


def test_a_good_set_passes(tmp_path, good_so):
    assert check.check_dist(make_set(tmp_path / "d", good_so), V) == []


def _problems(tmp_path, good_so, **kw):
    return "\n".join(check.check_dist(make_set(tmp_path / "d", good_so, **kw), V))


def test_loose_extra_pin_is_caught(tmp_path, good_so):
    out = _problems(tmp_path, good_so, core_requires=[
        f'flashinfer-jit-cache>={V}; extra == "jit-cache"', f'flashinfer-cubin=={V}; extra == "cubin"'])
    assert f"extra 'jit-cache' must pin flashinfer-jit-cache=={V}" in out


def test_unconditional_sibling_is_not_an_extra(tmp_path, good_so):
    out = _problems(tmp_path, good_so, core_requires=[
        f"flashinfer-jit-cache=={V}", f'flashinfer-cubin=={V}; extra == "cubin"'])
    assert "extra 'jit-cache' must pin" in out


def test_wrong_tag_and_missing_label_are_caught(tmp_path, good_so):
    out = _problems(tmp_path, good_so, jit_version=V, jit_tag="cp311-cp311-manylinux_2_28_x86_64")
    assert "tag must be py3-none-manylinux_2_28_<machine>" in out
    assert "must carry the CUDA label" in out


def test_manifest_hash_mismatch_is_caught(tmp_path, good_so):
    out = _problems(tmp_path, good_so, manifest_sha="0" * 64)
    assert "does not match the manifest's sha256/size" in out


def test_cuda_label_must_match_the_manifest(tmp_path, good_so):
    assert "does not give the label 'cu130'" in _problems(tmp_path, good_so, cuda="12.8")


def test_source_digests_must_agree_across_the_set(tmp_path, good_so):
    """The JIT trusts the recorded digests to skip hashing sources: a core wheel whose record
    is not what it bundles, or a jit-cache compiled from other sources, fails the check."""
    out = _problems(tmp_path, good_so, recorded_digest="f" * 64)
    assert f"__source_digest__ {'f' * 64} is not the digest of the sources it bundles" in out
    out = _problems(tmp_path, good_so, jit_digest="e" * 64)
    assert f"manifest source_digest '{'e' * 64}' is not the digest of the sources" in out
    assert "must record its config_key" in _problems(tmp_path, good_so, config_key=None)


def test_record_tampering_is_caught(tmp_path, good_so):
    dist = make_set(tmp_path / "d", good_so)
    core = dist / f"flashinfer_python-{V}-py3-none-any.whl"
    files, _ = read_wheel(core)
    with zipfile.ZipFile(core) as zf:
        record = zf.read(f"flashinfer_python-{V}.dist-info/RECORD")
    with zipfile.ZipFile(core, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, b"changed" if name == "flashinfer/__init__.py" else data)
        zf.writestr(f"flashinfer_python-{V}.dist-info/RECORD", record)
        zf.writestr("flashinfer/extra.py", b"")
    out = "\n".join(check.check_dist(dist, V))
    assert "flashinfer/__init__.py does not match its RECORD hash/size" in out
    assert "flashinfer/extra.py is in the wheel but not in RECORD" in out


def test_binary_policy(tmp_path, good_so, monkeypatch):
    monkeypatch.setitem(check.POLICY, "manylinux_2_28", {"GLIBC": (2, 2)})
    out = _problems(tmp_path, good_so)
    assert re.search(r"scale\.so: requires GLIBC_2\.\d+, the tag manylinux_2_28_\w+ allows up "
                     r"to GLIBC_2\.2", out)
    monkeypatch.setattr(check, "SYSTEM_LIBS", {"libc.so.6"})
    assert "links libstdc++.so.6" in _problems(tmp_path, good_so)


def test_missing_package_and_sdist(tmp_path, good_so):
    dist = make_set(tmp_path / "d", good_so)
    (dist / f"flashinfer_cubin-{V}-py3-none-any.whl").unlink()
    out = "\n".join(check.check_dist(dist, V, sdists=True))
    assert f"no flashinfer-cubin wheel of {V}" in out and f"no flashinfer-python sdist of {V}" in out


def test_sdist_check(tmp_path):
    path = tmp_path / f"flashinfer_python-{V}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for name, data in ((f"flashinfer_python-{V}/PKG-INFO", _meta("flashinfer-python", V)),
                           (f"flashinfer_python-{V}/pyproject.toml", b"")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    assert check.check_sdist(path, V) == []
    assert "version must be 9.9.9" in check.check_sdist(path, "9.9.9")[0]


def test_cli_exit_status(tmp_path, good_so):
    dist = make_set(tmp_path / "d", good_so)
    tool = Path(check.__file__)
    ok = subprocess.run([sys.executable, str(tool), str(dist), "--version", V],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "3 wheels and 0 sdists" in ok.stdout and ": ok" in ok.stdout
    bad = subprocess.run([sys.executable, str(tool), str(dist), "--version", "1.2.4"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "FAIL" in bad.stdout


def test_index_is_pep503_with_hashes_and_pip_resolves_from_it(tmp_path, good_so):
    dist = make_set(tmp_path / "d", good_so)
    # a second CUDA build of the jit-cache goes to its own index
    cu129 = make_set(tmp_path / "other", good_so, jit_version=f"{V}+cu129", cuda="12.9")
    (cu129 / f"flashinfer_jit_cache-{V}+cu129-py3-none-manylinux_2_28_x86_64.whl").rename(
        dist / f"flashinfer_jit_cache-{V}+cu129-py3-none-manylinux_2_28_x86_64.whl")
    roots = index.write_index(dist, dist / "whl")
    assert set(roots) == {"cu129", "cu130"}
    root_page = (roots["cu130"] / "index.html").read_text()
    for project in ("flashinfer-python", "flashinfer-jit-cache", "flashinfer-cubin"):
        assert f'<a href="{project}/">{project}</a>' in root_page
    page = (roots["cu130"] / "flashinfer-jit-cache" / "index.html").read_text()
    links = re.findall(r'<a href="([^"]+)"', page)
    assert len(links) == 1 and "+cu130" in links[0] and "cu129" not in page
    href, digest = links[0].split("#sha256=")
    target = (roots["cu130"] / "flashinfer-jit-cache" / href).resolve()
    assert hashlib.sha256(target.read_bytes()).hexdigest() == digest
    assert 'data-requires-python="&gt;=3.10"' in page
    # pip itself resolves the extra from the index to the pinned, labelled sibling
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
         "--index-url", roots["cu130"].as_uri() + "/", "--report", str(report),
         f"flashinfer-jit-cache=={V}"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (item,) = json.loads(report.read_text())["install"]
    assert item["metadata"]["version"] == f"{V}+cu130"
    assert item["download_info"]["url"].startswith("file:")

"""The disk cache and the installed jit-cache wheel under attack: a module file truncated (the
next loading process died of SIGBUS), emptied or overwritten (a load error, never repaired), a
byte flipped in place. A damaged module is never handed to the loader: the disk cache's copy is
rebuilt with exactly one warning, the wheel's is skipped (never rewritten) for the JIT.

The toy module is compiled once per test module (nvcc, sm_90a) and each test starts from a copy
of that cache; every rebuild below is one more nvcc run of the toy (a few seconds)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flashinfer import knobs
from flashinfer.exceptions import MissingJITCacheError
from flashinfer.jit import core

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.nvcc


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A cache holding the toy module, built once: (workspace base, sources)."""
    root = tmp_path_factory.mktemp("integrity")
    src = root / "src"
    shutil.copytree(DATA, src)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLASHINFER_WORKSPACE_BASE", str(root / "ws"))
        mp.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
        core._loaded.clear()
        assert toy(src).build_and_load().toy_value() == 1
        core._loaded.clear()
    return root / "ws", src


@pytest.fixture
def cache(pristine, tmp_path, monkeypatch):
    """A private copy of the pristine cache (mtimes kept); returns the toy's BuildPlan."""
    ws, src = pristine
    shutil.copytree(ws, tmp_path / "ws")  # copy2: contents and mtimes
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "ws"))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.delenv("FLASHINFER_JIT_VERIFY", raising=False)
    monkeypatch.delenv("FLASHINFER_DISABLE_JIT", raising=False)
    core._loaded.clear()
    core.stats.clear()
    yield core.plan_build(toy(src))
    core._loaded.clear()


def toy(src: Path) -> core.JitSpec:
    return core.JitSpec(name="toy", sources=(str(src / "toy.cu"),))


_CHILD = textwrap.dedent(
    """
    import sys, warnings
    from flashinfer.jit import core
    spec = core.JitSpec(name="toy", sources=(sys.argv[1],))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = spec.build_and_load().toy_value()
    for w in caught:
        print("WARNING", w.category.__name__, str(w.message).replace(chr(10), " "), flush=True)
    print(f"value={value} built={core.stats['built']} aot={core.stats['loaded_aot']}", flush=True)
    """
)


def child(src: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Load the toy in a fresh process (a SIGBUS kills only it)."""
    return subprocess.run(
        [sys.executable, "-c", _CHILD, str(src / "toy.cu")], capture_output=True, text=True,
        timeout=300, env={**os.environ, **(env or {})},
    )


def warnings_of(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("WARNING")]


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "1000 bytes":
        path.write_bytes(data[:1000])
    elif how == "half":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(os.urandom(len(data) // 3))
    elif how == "zeros, same size and mtime":  # passes the cheap check; the load fails
        st = path.stat()
        path.write_bytes(bytes(len(data)))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["1000 bytes", "half", "empty", "garbage",
                                 "zeros, same size and mtime"])
def test_a_damaged_module_is_rebuilt_by_the_next_process(cache, pristine, how):
    """Truncated: the next process died of SIGBUS. Empty or garbage: a load error, forever.
    Now: rebuilt once, with one warning naming the file, and the next process just loads it.
    Zeros of the right size under the old mtime pass the stat; the failed load hashes them."""
    _, src = pristine
    damage(cache.so_path, how)
    first = child(src)
    assert first.returncode == 0, (first.returncode, first.stdout, first.stderr[-3000:])
    assert "value=1 built=1" in first.stdout, first.stdout
    warned = warnings_of(first.stdout)
    assert len(warned) == 1 and str(cache.so_path) in warned[0] and "rebuil" in warned[0], warned
    again = child(src)
    assert again.returncode == 0 and "value=1 built=0" in again.stdout, again.stdout
    assert warnings_of(again.stdout) == []


def test_a_cached_load_hashes_nothing_and_costs_a_stat(cache, pristine, monkeypatch):
    """The first call of a process reads the record and stats the file; the sha256 is only
    computed when the file differs from the record (or FLASHINFER_JIT_VERIFY=1)."""
    _, src = pristine
    record = json.loads((cache.build_dir / "module.json").read_text())
    data = cache.so_path.read_bytes()
    assert record["so"]["size"] == len(data)
    assert record["so"]["sha256"] == hashlib.sha256(data).hexdigest()
    hashed = []
    real = core._file_sha256
    monkeypatch.setattr(core, "_file_sha256", lambda p: hashed.append(p) or real(p))
    start = time.perf_counter()
    assert toy(src).build_and_load().toy_value() == 1
    took = time.perf_counter() - start
    assert hashed == [] and core.stats == {"loaded_disk": 1}
    print(f"first call from the disk cache (plan + check + load): {took * 1e3:.1f} ms")
    core._loaded.clear()
    monkeypatch.setenv("FLASHINFER_JIT_VERIFY", "1")
    assert toy(src).build_and_load().toy_value() == 1
    assert hashed == [cache.so_path]


def test_a_flipped_byte_is_caught_when_the_file_changed_or_on_request(cache, pristine, monkeypatch):
    """A same-size overwrite is found by its mtime (hashed, then rebuilt); with the mtime put
    back, only FLASHINFER_JIT_VERIFY=1 hashes it."""
    _, src = pristine
    so = cache.so_path
    st = so.stat()
    data = bytearray(so.read_bytes())
    # A byte of the .comment section (the compiler's name): the file still loads, and only its
    # hash tells it from the one that was built (a flipped byte of code would do the same).
    data[data.index(b"GCC: (") + 1] ^= 0x20
    so.write_bytes(bytes(data))
    os.utime(so, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert toy(src).build_and_load().toy_value() == 1  # undetectable without hashing
    assert core.stats == {"loaded_disk": 1}
    core._loaded.clear()
    monkeypatch.setenv("FLASHINFER_JIT_VERIFY", "1")
    with pytest.warns(RuntimeWarning, match="sha256") as caught:
        assert toy(src).build_and_load().toy_value() == 1
    assert len(caught) == 1 and core.stats["built"] == 1
    assert so.read_bytes() != bytes(data)


def test_a_copied_cache_is_hashed_once_and_the_record_follows(cache, pristine, monkeypatch):
    """A cache copied without its mtimes (cp -r) is hashed on first use, found intact, and its
    record updated, so the next process only stats it again."""
    _, src = pristine
    os.utime(cache.so_path)  # now
    hashed = []
    real = core._file_sha256
    monkeypatch.setattr(core, "_file_sha256", lambda p: hashed.append(p) or real(p))
    assert toy(src).build_and_load().toy_value() == 1
    assert hashed == [cache.so_path] and "built" not in core.stats
    core._loaded.clear()
    assert toy(src).build_and_load().toy_value() == 1
    assert hashed == [cache.so_path]


def test_with_jit_disabled_a_damaged_module_is_an_error_that_says_so(cache, pristine):
    _, src = pristine
    damage(cache.so_path, "empty")
    with knobs.jit.scope():
        knobs.jit.disable_jit = True
        with pytest.raises(MissingJITCacheError, match="damaged") as info:
            toy(src).build_and_load()
    assert str(cache.so_path) in str(info.value)


def test_the_module_is_synced_before_it_is_published(cache, pristine, monkeypatch):
    """fsync the .so and its record before the rename that publishes them, and the directory
    after: a power cut leaves the old state or the new one, never a named empty file."""
    _, src = pristine
    shutil.rmtree(cache.build_dir)
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(a, b):
        events.append(("replace", str(b)))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    assert toy(src).build_and_load().toy_value() == 1
    so, record, folder = str(cache.so_path), str(cache.build_dir / "module.json"), str(cache.build_dir)
    publish = events.index(("replace", so))
    synced = [path for kind, path in events[:publish] if kind == "fsync"]
    assert any(p.endswith("/toy.so") for p in synced), events  # the .so, before it is named
    assert ("replace", record) in events[:publish], events  # the record first
    assert ("fsync", folder) in events[publish:], events


# -- the installed jit-cache wheel: verified against its manifest, never rewritten ------------

def fake_wheel(root: Path, so: Path, src: Path, damaged: str) -> Path:
    """A flashinfer_jit_cache package holding the toy module (as built), then damaged."""
    from flashinfer.jit.archs import parse_arch_list

    pkg = root / "site" / "flashinfer_jit_cache"
    uri = core.module_uri(toy(src), parse_arch_list("9.0a"))
    dest = pkg / "modules" / uri / "toy.so"
    dest.parent.mkdir(parents=True)
    data = so.read_bytes()
    dest.write_bytes(data)
    (pkg / "__init__.py").write_text("")
    manifest = {"version": "0.0.0", "cuda_version": "13.0", "arch_list": ["9.0a"], "modules": [{
        "name": "toy", "uri": uri, "archs": ["9.0a"], "path": f"modules/{uri}/toy.so",
        "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}]}
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    if damaged:
        damage(dest, damaged)
    return dest


@pytest.mark.parametrize("damaged", ["", "half"])
def test_a_damaged_jit_cache_module_is_skipped_never_rewritten(cache, pristine, tmp_path, damaged):
    _, src = pristine
    dest = fake_wheel(tmp_path, cache.so_path, src, damaged)
    before = dest.read_bytes()
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
           "FLASHINFER_DISABLE_VERSION_CHECK": "1"}
    out = child(src, env)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-3000:])
    if not damaged:
        assert "value=1 built=0 aot=1" in out.stdout and warnings_of(out.stdout) == []
        return
    # the disk cache (intact) serves it; the wheel's file is left as it is, with one warning
    assert "value=1 built=0 aot=0" in out.stdout, out.stdout
    warned = warnings_of(out.stdout)
    assert len(warned) == 1 and str(dest) in warned[0] and "reinstall" in warned[0], warned
    assert dest.read_bytes() == before

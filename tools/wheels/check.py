"""Check the built set before anyone installs it: what ``twine check`` checks, plus our pins and
tags, the jit-cache manifest and what its binaries ask of the system.

    python tools/wheels/check.py DIST --version X.Y.Z [--sdists]

Every wheel: the file name parses and matches the ``.dist-info`` name and version; METADATA has
the core fields (Metadata-Version, Name, Version, Summary, Requires-Python, a license, a valid
Description-Content-Type when there is a description) and every Requires-Dist parses; WHEEL's
Tag lines are exactly the file name's tags; RECORD lists every file with the right sha256 and
size. The set: ``flashinfer-python`` and ``flashinfer-cubin`` are ``X.Y.Z`` and ``py3-none-any``;
``flashinfer-jit-cache`` is ``X.Y.Z+cuNNN``, ``py3-none-manylinux_2_28_<machine>``, not purelib;
the extras ``jit-cache``/``cubin`` pin their sibling ``==X.Y.Z``, each sibling pins
``flashinfer-python==X.Y.Z``, and the jit-cache pins the ``apache-tvm-ffi`` it was built with. The
jit-cache manifest agrees with the wheel (version, CUDA label, every module file with its
sha256), and every module's ELF needs stay within :data:`POLICY` for the tag. Across the set:
the core wheel's recorded source digest is the digest of the sources it bundles, and every
jit-cache manifest records the same one (what lets the JIT match modules without hashing
sources). Every sdist: the name parses, PKG-INFO has the same name and version, pyproject.toml
is there.

Exit status 1 and one line per problem when anything is off. Needs only ``packaging``.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.util
import io
import json
import re
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import parse_tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

if __package__ in (None, ""):  # run as a script: python tools/wheels/check.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from wheels.elf import ElfError, read_elf  # noqa: E402

CORE, JIT_CACHE, CUBIN = "flashinfer-python", "flashinfer-jit-cache", "flashinfer-cubin"
SET = (CORE, JIT_CACHE, CUBIN)
EXTRAS = {"jit-cache": JIT_CACHE, "cubin": CUBIN}
METADATA_VERSIONS = {"1.0", "1.1", "1.2", "2.1", "2.2", "2.3", "2.4", "2.5"}
CONTENT_TYPES = {"text/markdown", "text/x-rst", "text/plain"}

#: What a module of a wheel tagged manylinux_2_28 may require: auditwheel's manylinux_2_28
#: policy (RHEL 8: glibc 2.28, GCC 8's libstdc++). Built on a newer system, modules would also
#: ask for GLIBC_2.29 (exp/log/pow) and GLIBCXX_3.4.26 (std::ostringstream's constructor); the
#: JIT force-includes csrc/manylinux_compat.h into every translation unit to avoid both, and
#: this check keeps it honest for whatever a new module brings.
POLICY = {
    "manylinux_2_28": {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11),
                       "GCC": (7, 0, 0)},
}
#: Libraries a module may link: the system's (the manylinux set), plus the two the runtime
#: provides: apache-tvm-ffi's library (pinned by the wheel) and the CUDA runtime of the wheel's
#: CUDA major (loaded by torch; checked against torch.version.cuda at run time).
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0",
               "libgcc_s.so.1", "libstdc++.so.6", "ld-linux-x86-64.so.2",
               "ld-linux-aarch64.so.1"}


#: flashinfer's own source digest (stdlib only), loaded by path: the build hooks and the JIT
#: use this file, so the check computes the digest with the same code.
_SOURCE_DIGEST_PY = (Path(__file__).resolve().parents[2] / "packages" / "flashinfer-python"
                     / "flashinfer" / "jit" / "source_digest.py")
_DATA_PREFIX = "flashinfer/data/"


def _source_digest_module():
    spec = importlib.util.spec_from_file_location("_flashinfer_source_digest", _SOURCE_DIGEST_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _b64_sha256(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _version_str(t: tuple[int, ...]) -> str:
    return ".".join(map(str, t))


def _metadata(text: str):
    return Parser().parsestr(text)


def check_metadata(where: str, meta, name: str, version: str) -> list[str]:
    """The core-metadata checks ``twine check`` makes (and a few it leaves to PyPI)."""
    problems = []
    mv = meta.get("Metadata-Version")
    if mv not in METADATA_VERSIONS:
        problems.append(f"{where}: Metadata-Version must be one of {sorted(METADATA_VERSIONS)}, "
                        f"got {mv!r}")
    if canonicalize_name(meta.get("Name") or "") != canonicalize_name(name):
        problems.append(f"{where}: Name must be {name!r}, got {meta.get('Name')!r}")
    if meta.get("Version") != version:
        problems.append(f"{where}: Version must be {version!r} (the file name's), "
                        f"got {meta.get('Version')!r}")
    summary = meta.get("Summary") or ""
    if not summary.strip() or "\n" in summary:
        problems.append(f"{where}: Summary must be one non-empty line, got {summary!r}")
    try:
        SpecifierSet(meta.get("Requires-Python") or "")
    except Exception as e:  # packaging raises InvalidSpecifier
        problems.append(f"{where}: Requires-Python does not parse: {e}")
    if not meta.get("Requires-Python"):
        problems.append(f"{where}: Requires-Python must be set")
    if not (meta.get("License-Expression") or meta.get("License")):
        problems.append(f"{where}: a License-Expression (or License) must be set")
    body = meta.get_payload() or meta.get("Description") or ""
    ctype = (meta.get("Description-Content-Type") or "").split(";")[0].strip()
    if body.strip() and ctype not in CONTENT_TYPES:
        problems.append(f"{where}: Description-Content-Type must be one of "
                        f"{sorted(CONTENT_TYPES)} when there is a description, got {ctype!r}")
    for line in meta.get_all("Requires-Dist") or []:
        try:
            Requirement(line)
        except InvalidRequirement as e:
            problems.append(f"{where}: Requires-Dist {line!r} does not parse: {e}")
    return problems


def _requirements(meta) -> list[Requirement]:
    out = []
    for line in meta.get_all("Requires-Dist") or []:
        try:
            out.append(Requirement(line))
        except InvalidRequirement:
            pass  # reported by check_metadata
    return out


def _pinned(reqs: list[Requirement], dist: str, version: str, extra: Optional[str]) -> bool:
    """Whether ``reqs`` hold exactly ``dist==version`` (under ``extra`` when given)."""
    for r in reqs:
        if canonicalize_name(r.name) != canonicalize_name(dist) or str(r.specifier) != f"=={version}":
            continue
        if extra is None and r.marker is None:
            return True
        if extra is not None and r.marker is not None and r.marker.evaluate({"extra": extra}) \
                and not r.marker.evaluate({"extra": ""}):
            return True
    return False


def check_record(where: str, zf: zipfile.ZipFile, record_name: str) -> list[str]:
    problems = []
    rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
    listed = {}
    for row in rows:
        if not row:
            continue
        path, digest, size = (row + ["", ""])[:3]
        listed[path] = (digest, size)
        if path.startswith("/") or ".." in Path(path).parts:
            problems.append(f"{where}: RECORD entry {path!r} leaves the wheel")
    members = {i.filename for i in zf.infolist() if not i.is_dir()}
    for path in sorted(members - set(listed)):
        problems.append(f"{where}: {path} is in the wheel but not in RECORD")
    for path, (digest, size) in sorted(listed.items()):
        if path == record_name:
            continue
        if path not in members:
            problems.append(f"{where}: RECORD lists {path}, which is not in the wheel")
            continue
        data = zf.read(path)
        if digest != f"sha256={_b64_sha256(data)}" or size != str(len(data)):
            problems.append(f"{where}: {path} does not match its RECORD hash/size")
    return problems


def check_elf(where: str, data: bytes, machine: str, tag_platform: str,
              cuda_major: Optional[int]) -> list[str]:
    """A module's machine, linked libraries and symbol versions against the tag's policy."""
    try:
        info = read_elf(data)
    except (ElfError, IndexError, ValueError) as e:
        return [f"{where}: not a readable ELF shared library ({e})"]
    problems = []
    if info.machine != machine:
        problems.append(f"{where}: built for {info.machine}, the tag says {machine}")
    policy_name = re.sub(r"_(x86_64|aarch64)$", "", tag_platform)
    policy = POLICY.get(policy_name)
    if policy is None:
        return problems + [f"{where}: no policy for platform tag {tag_platform}"]
    for prefix, ceiling in policy.items():
        need = info.max_version(prefix)
        if need > ceiling:
            problems.append(f"{where}: requires {prefix}_{_version_str(need)}, the tag "
                            f"{tag_platform} allows up to {prefix}_{_version_str(ceiling)}")
    allowed = SYSTEM_LIBS | {"libtvm_ffi.so"}
    if cuda_major is not None:
        allowed.add(f"libcudart.so.{cuda_major}")
    for lib in info.needed:
        if lib not in allowed:
            problems.append(f"{where}: links {lib}, which neither the system (manylinux) nor "
                            f"the runtime (apache-tvm-ffi, CUDA {cuda_major} runtime) provides")
    return problems


def _check_jit_cache(where: str, zf: zipfile.ZipFile, version: Version, reqs, platform: str,
                     public: str) -> list[str]:
    problems = []
    if not re.fullmatch(r"cu\d{3,}", version.local or ""):
        problems.append(f"{where}: version must carry the CUDA label (+cuNNN), got {version}")
    try:
        manifest = json.loads(zf.read("flashinfer_jit_cache/manifest.json"))
    except KeyError:
        return problems + [f"{where}: flashinfer_jit_cache/manifest.json is missing"]
    if manifest.get("version") != str(version):
        problems.append(f"{where}: manifest version {manifest.get('version')!r} is not the "
                        f"wheel's {str(version)!r}")
    if manifest.get("flashinfer_version") != public:
        problems.append(f"{where}: manifest flashinfer_version {manifest.get('flashinfer_version')!r}"
                        f" is not {public!r}")
    m = re.fullmatch(r"(\d+)\.(\d+)", str(manifest.get("cuda_version")))
    cuda_major = int(m.group(1)) if m else None
    if m is None or f"cu{m.group(1)}{m.group(2)}" != version.local:
        problems.append(f"{where}: manifest cuda_version {manifest.get('cuda_version')!r} does "
                        f"not give the label {version.local!r}")
    if not manifest.get("arch_list"):
        problems.append(f"{where}: manifest arch_list is empty")
    tvm = manifest.get("tvm_ffi_version")
    if not tvm or not _pinned(reqs, "apache-tvm-ffi", tvm, None):
        problems.append(f"{where}: must pin apache-tvm-ffi=={tvm} (the version it was built with)")
    modules = manifest.get("modules") or []
    if not modules:
        problems.append(f"{where}: the manifest lists no module")
    m = re.search(r"(x86_64|aarch64)$", platform)
    machine = m.group(1) if m else platform
    members = set(zf.namelist())
    for mod in modules:
        path = f"flashinfer_jit_cache/{mod.get('path')}"
        if path not in members:
            problems.append(f"{where}: module {mod.get('uri')} lists {path}, not in the wheel")
            continue
        data = zf.read(path)
        if hashlib.sha256(data).hexdigest() != mod.get("sha256") or len(data) != mod.get("size"):
            problems.append(f"{where}: {path} does not match the manifest's sha256/size")
        if path != f"flashinfer_jit_cache/modules/{mod.get('uri')}/{mod.get('name')}.so":
            problems.append(f"{where}: {path} is not at modules/<uri>/<name>.so")
        problems += check_elf(f"{where}:{path}", data, machine, platform, cuda_major)
    listed = {f"flashinfer_jit_cache/{mod.get('path')}" for mod in modules}
    for extra in sorted(n for n in members if n.endswith(".so") and n not in listed):
        problems.append(f"{where}: {extra} is not in the manifest")
    return problems


def check_wheel(path: Path, version: str) -> list[str]:
    """Every check of one wheel of the set; ``version`` is the set's (``version.txt``)."""
    where = path.name
    try:
        name, wversion, _build, tags = parse_wheel_filename(path.name)
    except (InvalidWheelFilename, InvalidVersion) as e:
        return [f"{where}: not a valid wheel file name ({e})"]
    if name not in SET:
        return [f"{where}: {name} is not one of the set {SET}"]
    public = Version(version)
    problems = []
    with zipfile.ZipFile(path) as zf:
        info_dir = f"{name.replace('-', '_')}-{wversion}.dist-info"
        try:
            meta = _metadata(zf.read(f"{info_dir}/METADATA").decode())
            wheel = _metadata(zf.read(f"{info_dir}/WHEEL").decode())
        except KeyError as e:
            return [f"{where}: {info_dir} must hold METADATA and WHEEL ({e})"]
        problems += check_metadata(where, meta, name, str(wversion))
        problems += check_record(where, zf, f"{info_dir}/RECORD")
        if wheel.get("Wheel-Version") != "1.0":
            problems.append(f"{where}: WHEEL Wheel-Version must be 1.0, got {wheel.get('Wheel-Version')!r}")
        wheel_tags = {t for line in wheel.get_all("Tag") or [] for t in parse_tag(line)}
        if wheel_tags != set(tags):
            problems.append(f"{where}: WHEEL tags {sorted(map(str, wheel_tags))} are not the file "
                            f"name's {sorted(map(str, tags))}")
        purelib = (wheel.get("Root-Is-Purelib") or "").strip().lower()
        reqs = _requirements(meta)
        tag_names = sorted(map(str, tags))
        if name == JIT_CACHE:
            if wversion.public != public.public:
                problems.append(f"{where}: version must be {public}+cuNNN, got {wversion}")
            platform = next(iter(tags)).platform if len(tags) == 1 else ""
            if len(tags) != 1 or not re.fullmatch(r"py3-none-manylinux_2_28_(x86_64|aarch64)",
                                                  tag_names[0]):
                problems.append(f"{where}: tag must be py3-none-manylinux_2_28_<machine>, got "
                                f"{tag_names}")
            if purelib != "false":
                problems.append(f"{where}: Root-Is-Purelib must be false (it holds binaries)")
            if not _pinned(reqs, CORE, str(public), None):
                problems.append(f"{where}: must pin {CORE}=={public}")
            problems += _check_jit_cache(where, zf, wversion, reqs, platform, str(public))
        else:
            if wversion != public or wversion.local:
                problems.append(f"{where}: version must be exactly {public}, got {wversion}")
            if tag_names != ["py3-none-any"]:
                problems.append(f"{where}: tag must be py3-none-any, got {tag_names}")
            if purelib != "true":
                problems.append(f"{where}: Root-Is-Purelib must be true")
            if name == CORE:
                extras = set(meta.get_all("Provides-Extra") or [])
                for extra, dist in EXTRAS.items():
                    if extra not in extras:
                        problems.append(f"{where}: must provide the extra {extra!r}")
                    if not _pinned(reqs, dist, str(public), extra):
                        problems.append(f"{where}: extra {extra!r} must pin {dist}=={public}")
            elif not _pinned(reqs, CORE, str(public), None):
                problems.append(f"{where}: must pin {CORE}=={public}")
    return problems


def check_sdist(path: Path, version: str) -> list[str]:
    where = path.name
    try:
        name, sversion = parse_sdist_filename(path.name)
    except (InvalidSdistFilename, InvalidVersion) as e:
        return [f"{where}: not a valid sdist file name ({e})"]
    if Version(version).public != sversion.public:
        return [f"{where}: version must be {version}, got {sversion}"]
    stem = path.name[: -len(".tar.gz")]
    problems = []
    with tarfile.open(path) as tf:
        names = set(tf.getnames())
        if f"{stem}/pyproject.toml" not in names:
            problems.append(f"{where}: {stem}/pyproject.toml is missing")
        try:
            meta = _metadata(tf.extractfile(f"{stem}/PKG-INFO").read().decode())
        except (KeyError, AttributeError):
            return problems + [f"{where}: {stem}/PKG-INFO is missing"]
    problems += check_metadata(where, meta, name, str(sversion))
    return problems


def files_of(dist: Path, version: str) -> tuple[list[Path], list[Path]]:
    """(wheels, sdists) of the set in ``dist`` whose public version is ``version``."""
    want = Version(version).public
    wheels, sdists = [], []
    for p in sorted(dist.iterdir()):
        try:
            if p.name.endswith(".whl"):
                name, v, _, _ = parse_wheel_filename(p.name)
                if name in SET and v.public == want:
                    wheels.append(p)
            elif p.name.endswith(".tar.gz"):
                name, v = parse_sdist_filename(p.name)
                if name in SET and v.public == want:
                    sdists.append(p)
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
    return wheels, sdists


def check_sources(core: Path, jit_caches: list[Path]) -> list[str]:
    """The core wheel's ``__source_digest__`` (``flashinfer/_build_meta.py``) is the digest of
    the sources it bundles (``flashinfer/data/{include,csrc}``), and each jit-cache manifest's
    ``source_digest`` is the same: then the JIT may match the jit-cache's modules by config key
    without hashing sources (flashinfer/jit/source_digest.py)."""
    sd = _source_digest_module()
    problems = []
    with zipfile.ZipFile(core) as zf:
        names = zf.namelist()
        meta = zf.read("flashinfer/_build_meta.py").decode() if \
            "flashinfer/_build_meta.py" in names else ""
        m = re.search(r'^__source_digest__ = "([0-9a-f]{64})"$', meta, re.M)
        bundled = sd.digest_files(
            (n[len(_DATA_PREFIX):], zf.read(n)) for n in names
            if n.startswith(_DATA_PREFIX) and not n.endswith("/")
            and n[len(_DATA_PREFIX):].split("/", 1)[0] in sd.SOURCE_DIRS)
    recorded = m.group(1) if m else None
    if recorded is None:
        problems.append(f"{core.name}: flashinfer/_build_meta.py must record __source_digest__ "
                        "(64 hex digits)")
    elif recorded != bundled:
        problems.append(f"{core.name}: __source_digest__ {recorded} is not the digest of the "
                        f"sources it bundles ({bundled})")
    for wheel in jit_caches:
        with zipfile.ZipFile(wheel) as zf:
            try:
                manifest = json.loads(zf.read("flashinfer_jit_cache/manifest.json"))
            except (KeyError, ValueError):
                continue  # reported by check_wheel
        theirs = manifest.get("source_digest")
        if theirs != bundled:
            problems.append(f"{wheel.name}: manifest source_digest {theirs!r} is not the digest "
                            f"of the sources {core.name} bundles ({bundled}): its modules were "
                            "compiled from other sources")
        for mod in manifest.get("modules") or []:
            if not re.fullmatch(r"[0-9a-f]{16}", str(mod.get("config_key"))):
                problems.append(f"{wheel.name}: module {mod.get('uri')} must record its "
                                f"config_key (16 hex digits), got {mod.get('config_key')!r}")
    return problems


def check_dist(dist: Path, version: str, sdists: bool = False) -> list[str]:
    """Every check over the set of ``version`` in ``dist``: one wheel per package (the
    jit-cache: one per CUDA label), with ``sdists`` one sdist per package too."""
    wheels, tars = files_of(dist, version)
    problems = []
    for dist_name in SET:
        found = [p for p in wheels if parse_wheel_filename(p.name)[0] == dist_name]
        labels = [parse_wheel_filename(p.name)[1].local for p in found]
        if not found:
            problems.append(f"{dist}: no {dist_name} wheel of {version}")
        elif len(set(labels)) != len(labels):
            problems.append(f"{dist}: several {dist_name} wheels of {version}+{labels[0]}")
        if sdists and not [p for p in tars if parse_sdist_filename(p.name)[0] == dist_name]:
            problems.append(f"{dist}: no {dist_name} sdist of {version}")
    for p in wheels:
        problems += check_wheel(p, version)
    cores = [p for p in wheels if parse_wheel_filename(p.name)[0] == CORE]
    if len(cores) == 1:
        problems += check_sources(cores[0], [p for p in wheels
                                             if parse_wheel_filename(p.name)[0] == JIT_CACHE])
    for p in tars:
        problems += check_sdist(p, version)
    return problems


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dist", type=Path)
    parser.add_argument("--version", required=True, help="the set's version (version.txt)")
    parser.add_argument("--sdists", action="store_true", help="require one sdist per package")
    args = parser.parse_args(argv)
    problems = check_dist(args.dist, args.version, args.sdists)
    for line in problems:
        print(f"FAIL {line}")
    wheels, tars = files_of(args.dist, args.version)
    status = "FAILED" if problems else "ok"
    print(f"checked {len(wheels)} wheels and {len(tars)} sdists of {args.version} in "
          f"{args.dist}: {status}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

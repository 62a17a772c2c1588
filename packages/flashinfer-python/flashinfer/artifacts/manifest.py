"""The release manifest, the index of releases, and the repository layout (docs/artifacts.md).

A manifest is one JSON document per release: schema version, release version, creation time, and
one record per file (path, sha256, size, arch, and for a kernel binary its entry symbol and launch
metadata). It is the only table of what a release contains: nothing else lists paths or hashes.
Its own sha256, over the exact stored bytes, is pinned inside the flashinfer-python wheel.

Everything here is pure (no I/O): parsing validates the whole document, so a path that escapes the
store (``../x``, ``/etc/x``) or a malformed hash is refused before any file is touched.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from .errors import ManifestError

SCHEMA_VERSION = 1

INDEX_PATH = "index.json"
#: Files are stored once, by content, and shared by every release that lists them.
OBJECTS_DIR = "objects/sha256"

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# A path component starts with a letter, digit or underscore, so "..", "." and hidden names are
# impossible; no backslashes, colons (drive letters) or spaces either.
_COMPONENT = r"[A-Za-z0-9_][A-Za-z0-9._+-]*"
_PATH = re.compile(rf"^{_COMPONENT}(/{_COMPONENT})*$")
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")
_ARCH = re.compile(r"^\d+\.\d+[af]?$")
_SYMBOL = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")
_PARAM_TYPES = {"ptr": 8, "i64": 8, "u64": 8, "i32": 4, "u32": 4, "f32": 4}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_sha256(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _HEX64.match(value):
        raise ManifestError(f"{what} must be 64 lowercase hex digits (a sha256), got {value!r}")
    return value


def check_version(value: Any, what: str = "release version") -> str:
    if not isinstance(value, str) or not _VERSION.match(value):
        raise ManifestError(
            f"{what} must be 1-64 characters of letters, digits and . + _ - (starting with a "
            f"letter or digit), got {value!r}"
        )
    return value


def check_path(value: Any) -> str:
    """A relative POSIX path that cannot leave the directory it is joined to.

    >>> check_path("sm_90a/norm/rmsnorm.cubin")
    'sm_90a/norm/rmsnorm.cubin'
    """
    if not isinstance(value, str) or len(value) > 255 or not _PATH.match(value):
        raise ManifestError(
            "a file path must be relative, made of components that start with a letter, digit or "
            "'_' (no '..', no leading '/', no '\\\\' or ':'), at most 255 characters; "
            f"got {value!r}"
        )
    return value


_ARCH_SPELLINGS = re.compile(r"^(?:sm_?|compute_?)?(\d+)(?:\.(\d+)|(\d))([af]?)$")


def parse_arch(text: str) -> Optional[str]:
    """An arch as the manifest writes it (``9.0a``) from how people write it, or None.

    >>> [parse_arch(a) for a in ("9.0a", "sm_90a", "90a", "sm_100a", "compute_120f", "8.6")]
    ['9.0a', '9.0a', '9.0a', '10.0a', '12.0f', '8.6']
    >>> parse_arch("hopper") is None
    True
    """
    m = _ARCH_SPELLINGS.match(text.strip().lower())
    if m is None:
        return None
    if m.group(2) is not None:  # 9.0a
        major, minor = m.group(1), m.group(2)
    else:  # 90a, 100a: the last digit is the minor version
        major, minor = m.group(1), m.group(3)
    return f"{int(major)}.{int(minor)}{m.group(4)}"


def release_dir(version: str) -> str:
    return f"releases/{check_version(version)}"


def manifest_path(version: str) -> str:
    """Where a release's manifest lives in a repository (and in the local store)."""
    return f"{release_dir(version)}/manifest.json"


def object_path(sha256: str, suffix: str = "") -> str:
    """Where the file with this sha256 lives in a repository (and in the local store).

    The suffix of the file's name (``.cubin``) is kept so stores stay browsable.

    >>> object_path("ab" * 32, ".cubin")[:24]
    'objects/sha256/ab/ababab'
    """
    check_sha256(sha256, "object sha256")
    if suffix and not re.fullmatch(r"\.[A-Za-z0-9_+-]{1,16}", suffix):
        raise ManifestError(f"object suffix must look like '.cubin', got {suffix!r}")
    return f"{OBJECTS_DIR}/{sha256[:2]}/{sha256}{suffix}"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _is_int(value: Any) -> bool:
    """A JSON integer: ``type(x) is int``, so neither ``true`` nor ``1.0`` (both ``== 1``)."""
    return type(value) is int


def _require(obj: Mapping[str, Any], key: str, types: Any, where: str) -> Any:
    if key not in obj:
        raise ManifestError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not (_is_int(value) if types is int else isinstance(value, types)):
        raise ManifestError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _no_constant(name: str) -> Any:
    raise ManifestError(f"{name} is not a JSON number")


def parse_json(data: bytes, what: str) -> dict:
    """``data`` as a JSON object, or a ManifestError: not UTF-8, not JSON, ``NaN`` or
    ``Infinity`` (Python's extensions), nested deeper than the parser recurses, not an object."""
    try:
        obj = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise ManifestError(f"{what} nests arrays or objects too deeply to be one") from None
    if not isinstance(obj, dict):
        raise ManifestError(f"{what} must be a JSON object")
    return obj


def _check_schema(obj: Mapping[str, Any], what: str) -> None:
    schema = obj.get("schema_version")
    if not _is_int(schema) or schema != SCHEMA_VERSION:
        raise ManifestError(
            f"{what} schema_version must be the integer {SCHEMA_VERSION}, got {schema!r} (a "
            "newer flashinfer may be needed to read it)"
        )


@dataclass(frozen=True)
class ParamField:
    """One kernel parameter field: where it sits in the parameter block and its C type."""

    name: str
    type: str
    offset: int


@dataclass(frozen=True)
class ParamLayout:
    """The byte layout of a kernel's parameters, packed as one buffer.

    ``args`` gives each kernel argument's ``(offset, size)`` in the buffer (each at its natural
    alignment, as the CUDA ABI lays them out); ``fields`` names the scalars inside, so a launcher
    fills the buffer by name: ``input`` (a pointer), ``input_strides.outer`` (an int64 inside a
    struct argument), ...
    """

    size: int
    align: int
    fields: tuple[ParamField, ...]
    args: tuple[tuple[int, int], ...] = ()

    def field(self, name: str) -> ParamField:
        for f in self.fields:
            if f.name == name:
                return f
        raise ManifestError(f"parameter layout has no field {name!r}")

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "ParamLayout":
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: params must be an object")
        size = _require(obj, "size", int, where)
        align = _require(obj, "align", int, where)
        if size <= 0 or align not in (4, 8, 16) or size % align:
            raise ManifestError(f"{where}: params size {size} / align {align} are inconsistent")
        fields, taken = [], []
        for raw in _require(obj, "fields", list, where):
            if not isinstance(raw, dict):
                raise ManifestError(f"{where}: a params field must be an object")
            name = _require(raw, "name", str, where)
            ftype = _require(raw, "type", str, where)
            offset = _require(raw, "offset", int, where)
            width = _PARAM_TYPES.get(ftype)
            if width is None:
                raise ManifestError(f"{where}: field {name!r} has unknown type {ftype!r}")
            if offset < 0 or offset % width or offset + width > size:
                raise ManifestError(f"{where}: field {name!r} at offset {offset} is misplaced")
            if any(offset < b and a < offset + width for a, b in taken):
                raise ManifestError(f"{where}: field {name!r} overlaps another field")
            taken.append((offset, offset + width))
            fields.append(ParamField(name, ftype, offset))
        args, end = [], 0
        for raw in _require(obj, "args", list, where):
            if not isinstance(raw, list) or len(raw) != 2 or not all(map(_is_int, raw)):
                raise ManifestError(f"{where}: each of params.args must be [offset, size]")
            off, n = raw
            if off < end or n <= 0 or off + n > size:
                raise ManifestError(f"{where}: argument [{off}, {n}] is out of order or bounds")
            args.append((off, n))
            end = off + n
        if not args:
            raise ManifestError(f"{where}: params.args must list at least one argument")
        return cls(size, align, tuple(fields), tuple(args))

    def to_json(self) -> dict:
        return {
            "size": self.size,
            "align": self.align,
            "fields": [{"name": f.name, "type": f.type, "offset": f.offset} for f in self.fields],
            "args": [[off, n] for off, n in self.args],
        }


@dataclass(frozen=True)
class KernelInfo:
    """A kernel binary's entry point and how to launch it.

    ``variant`` holds the compile-time choices (dtype, vector width, ...) the op code selects by;
    ``rule`` names the grid/block policy the op code applies (it mirrors the C++ launcher).
    """

    name: str
    family: str
    symbol: str
    rule: str
    variant: Mapping[str, Any]
    params: ParamLayout
    dynamic_smem: int = 0

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "KernelInfo":
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: kernel must be an object")
        symbol = _require(obj, "symbol", str, where)
        if not _SYMBOL.match(symbol):
            raise ManifestError(f"{where}: kernel symbol {symbol!r} is not a C identifier")
        launch = _require(obj, "launch", dict, where)
        variant = _require(obj, "variant", dict, where)
        for k, v in variant.items():
            if not (isinstance(v, str) or _is_int(v)):
                raise ManifestError(f"{where}: variant {k!r} must be a string or an integer")
        smem = _require(launch, "dynamic_smem", int, where)
        if smem < 0:
            raise ManifestError(f"{where}: dynamic_smem must be >= 0, got {smem}")
        return cls(
            name=_require(obj, "name", str, where),
            family=_require(obj, "family", str, where),
            symbol=symbol,
            rule=_require(launch, "rule", str, where),
            variant=dict(variant),
            params=ParamLayout.from_json(_require(launch, "params", dict, where), where),
            dynamic_smem=smem,
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "family": self.family,
            "symbol": self.symbol,
            "variant": dict(self.variant),
            "launch": {
                "rule": self.rule,
                "dynamic_smem": self.dynamic_smem,
                "params": self.params.to_json(),
            },
        }


@dataclass(frozen=True)
class FileEntry:
    """One file of a release: its path in the release, content hash, size and what it is."""

    path: str
    sha256: str
    size: int
    arch: Optional[str] = None
    kernel: Optional[KernelInfo] = None

    @property
    def suffix(self) -> str:
        name = self.path.rsplit("/", 1)[-1]
        return "." + name.rsplit(".", 1)[1] if "." in name[1:] else ""

    @property
    def object_path(self) -> str:
        return object_path(self.sha256, self.suffix)

    @classmethod
    def from_json(cls, obj: Any) -> "FileEntry":
        if not isinstance(obj, dict):
            raise ManifestError("a file entry must be an object")
        path = check_path(obj.get("path"))
        where = f"file {path!r}"
        sha = check_sha256(obj.get("sha256"), f"{where}: sha256")
        size = _require(obj, "size", int, where)
        if size < 0:
            raise ManifestError(f"{where}: size must be >= 0, got {size}")
        arch = obj.get("arch")
        if arch is not None and (not isinstance(arch, str) or not _ARCH.match(arch)):
            raise ManifestError(f"{where}: arch must look like '9.0a' or be null, got {arch!r}")
        kernel = obj.get("kernel")
        entry = cls(
            path, sha, size, arch, None if kernel is None else KernelInfo.from_json(kernel, where)
        )
        entry.object_path  # noqa: B018 - validates the suffix the store names the object with
        return entry

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "size": self.size,
            "arch": self.arch,
            "kernel": None if self.kernel is None else self.kernel.to_json(),
        }


@dataclass(frozen=True)
class Manifest:
    """A release: its version, when it was made, and its files (sorted by path, unique)."""

    release: str
    created: str
    files: tuple[FileEntry, ...]
    schema_version: int = SCHEMA_VERSION
    _by_path: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_version(self.release)
        by_path = {}
        for f in self.files:
            if f.path in by_path:
                raise ManifestError(f"manifest of {self.release}: path {f.path!r} appears twice")
            by_path[f.path] = f
        self._by_path.update(by_path)

    def get(self, path: str) -> Optional[FileEntry]:
        return self._by_path.get(path)

    def __contains__(self, path: object) -> bool:
        return path in self._by_path

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def select(self, archs: Optional[Iterable[str]] = None) -> list[FileEntry]:
        """The files for these archs (plus arch-independent ones); all files when None."""
        if archs is None:
            return list(self.files)
        wanted = set(archs)
        return [f for f in self.files if f.arch is None or f.arch in wanted]

    def kernels(self, family: str, arch: str) -> list[FileEntry]:
        return [
            f for f in self.files if f.kernel is not None and f.kernel.family == family
            and f.arch == arch
        ]

    def same_content(self, other: "Manifest") -> bool:
        """Same release and same files (the creation time may differ)."""
        return self.release == other.release and self.files == other.files

    # -- serialization ------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "release": self.release,
            "created": self.created,
            "files": [f.to_json() for f in self.files],
        }

    def to_bytes(self) -> bytes:
        """The canonical bytes (sorted keys, one field per line): what is stored and hashed."""
        return (json.dumps(self.to_json(), sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def build(cls, release: str, files: Iterable[FileEntry], created: Optional[str] = None):
        return cls(release, created or utc_now(), tuple(sorted(files, key=lambda f: f.path)))

    @classmethod
    def from_bytes(cls, data: bytes, expected_sha256: Optional[str] = None) -> "Manifest":
        """Parse and validate a stored manifest; with ``expected_sha256``, check the hash first.

        Raises
        ------
        PinError
            The bytes do not hash to ``expected_sha256``.
        ManifestError
            The document is not a valid manifest.
        """
        if expected_sha256 is not None:
            got = sha256_hex(data)
            if got != expected_sha256:
                from .errors import PinError

                raise PinError(
                    f"release manifest sha256 is {got}, but {expected_sha256} is pinned: the "
                    "repository serves another manifest than the one this flashinfer build "
                    "trusts (swapped, rolled back or corrupt); point FLASHINFER_CUBINS_REPOSITORY "
                    "at a repository that serves the pinned release"
                )
        obj = parse_json(data, "manifest")
        _check_schema(obj, "manifest")
        files = _require(obj, "files", list, "manifest")
        entries = tuple(FileEntry.from_json(f) for f in files)
        if [f.path for f in entries] != sorted(f.path for f in entries):
            raise ManifestError("manifest files must be sorted by path")
        return cls(
            release=check_version(obj.get("release")),
            created=_require(obj, "created", str, "manifest"),
            files=entries,
        )


@dataclass
class Index:
    """The list of releases a repository holds (informational: never trusted for hashes)."""

    releases: dict[str, dict] = field(default_factory=dict)

    def add(self, manifest: Manifest, manifest_sha256: str) -> None:
        self.releases[manifest.release] = {
            "manifest_sha256": manifest_sha256,
            "created": manifest.created,
            "files": len(manifest.files),
            "bytes": manifest.total_size,
        }

    def to_bytes(self) -> bytes:
        doc = {"schema_version": SCHEMA_VERSION, "releases": self.releases}
        return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Index":
        obj = parse_json(data, "index")
        _check_schema(obj, "index")
        releases = obj.get("releases")
        if not isinstance(releases, dict):
            raise ManifestError("index: releases must be an object")
        for version, info in releases.items():
            check_version(version, "index release")
            if not isinstance(info, dict):
                raise ManifestError(f"index: release {version!r} must be an object")
            check_sha256(info.get("manifest_sha256"), f"index: release {version!r}")
        return cls(dict(releases))

"""Every environment variable FlashInfer reads, declared once, typed, read on access.

No other module reads ``os.environ``. A knob is a descriptor on a group class: reading it parses
the environment at that moment (so a variable set after ``import flashinfer`` still counts),
assigning to it overrides the environment in code, and ``del`` drops the override. A value that
does not parse raises :class:`~flashinfer.exceptions.KnobError` naming the variable.

>>> from flashinfer import knobs
>>> knobs.jit.nvcc_threads
1
>>> with knobs.jit.scope():
...     knobs.jit.nvcc_threads = 4   # restored when the block ends
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Optional, Sequence, TypeVar, Union

from .exceptions import KnobError

T = TypeVar("T")
_UNSET: Any = object()


class _Knob(Generic[T]):
    """One environment variable (or the first set of several aliases) with a parser."""

    def __init__(
        self,
        names: Union[str, Sequence[str]],
        default: Union[T, Callable[[], T]],
        parse: Callable[[str, str], T],
        doc: str = "",
        kind: str = "str",
    ):
        self.names = (names,) if isinstance(names, str) else tuple(names)
        self.default = default
        self.parse = parse
        self.__doc__ = doc
        self.kind = kind  # "str", "bool", "int", "float", "flags", "path"
        self.attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    def raw(self) -> Optional[tuple[str, str]]:
        """The (name, value) of the first alias that is set and non-empty, else None."""
        for name in self.names:
            value = os.environ.get(name)
            if value is not None and value.strip() != "":
                return name, value
        return None

    def get(self, overrides: dict[str, Any]) -> T:
        if self.attr in overrides:
            return overrides[self.attr]
        found = self.raw()
        if found is None:
            return self.default() if callable(self.default) else self.default
        return self.parse(*found)

    def __get__(self, group: Any, owner: type) -> Any:
        if group is None:
            return self
        return self.get(group._overrides)

    def __set__(self, group: Any, value: T) -> None:
        group._overrides[self.attr] = value

    def __delete__(self, group: Any) -> None:
        group._overrides.pop(self.attr, None)


def _parse_str(name: str, value: str) -> str:
    return value


def _parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise KnobError(name, value, "one of 1/0/true/false/yes/no/on/off")


#: The largest integer an integer knob takes: what a C ``int`` holds, since the values end up as
#: counts in subprocess arguments (``ninja -j``, ``nvcc --threads``) and loops.
MAX_INT = 2**31 - 1
#: The longest time a seconds knob takes (a week). Socket timeouts and sleeps overflow the
#: platform's ``time_t`` far below float's range (1e300 s does), and a wait beyond a week is a
#: typo, not a wish.
MAX_SECONDS = 7 * 24 * 3600.0


def _int_parser(low: int, high: int = MAX_INT) -> Callable[[str, str], int]:
    expected = f"an integer in [{low}, {high}]"

    def parse(name: str, value: str) -> int:
        try:
            n = int(value.strip())
        except ValueError:
            raise KnobError(name, value, expected) from None
        if not low <= n <= high:
            raise KnobError(name, value, expected)
        return n

    return parse


def _parse_seconds(name: str, value: str) -> float:
    """A finite, positive number of seconds, at most :data:`MAX_SECONDS` (inf, nan, 1e309 and
    1e300 are refused here rather than ending in an ``OverflowError`` in the socket layer)."""
    expected = f"a finite number of seconds in (0, {MAX_SECONDS:.0f}]"
    try:
        x = float(value.strip())
    except ValueError:
        raise KnobError(name, value, expected) from None
    if not 0 < x <= MAX_SECONDS:  # also false for nan
        raise KnobError(name, value, expected)
    return x


def _parse_size_gb(name: str, value: str) -> float:
    """A size in GB: finite, > 0, at most 1e6 (a petabyte); inf, nan and 1e309 refused."""
    expected = "a finite number of GB in (0, 1e6]"
    try:
        x = float(value.strip())
    except ValueError:
        raise KnobError(name, value, expected) from None
    if not 0 < x <= 1e6:  # also false for nan
        raise KnobError(name, value, expected)
    return x


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _parse_sha256(name: str, value: str) -> str:
    digest = value.strip().lower()
    if not _SHA256.match(digest):
        raise KnobError(name, value, "64 hex digits (the sha256 of a release manifest)")
    return digest


# -- the value of FLASHINFER_CUBINS_REPOSITORY (pure parsing; artifacts.repository opens them) --


def repository_problem(url: str) -> Optional[str]:
    """Why ``url`` names no repository this client can open (None when it does): an unknown
    scheme (``ftp://``, ``data:``), an http(s) URL without a host, ``s3://`` without a bucket,
    a ``file://`` URL with a remote host."""
    parsed = urllib.parse.urlparse(url.strip())
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return None if parsed.hostname else "no host"
    if scheme == "s3":
        return None if parsed.netloc else "no bucket (s3://bucket[/prefix])"
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            return f"host {parsed.netloc!r}: a file:// URL names a path on this machine"
        return None if parsed.path else "no path"
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        return None if url.strip() else "empty"
    return f"unknown scheme {scheme!r}"


def _split(text: str) -> list[str]:
    return [u for piece in text.split(",") for u in piece.split()]


def repository_list_problem(text: str) -> Optional[str]:
    """Why ``FLASHINFER_CUBINS_REPOSITORY``'s value ``text`` is not a list of repositories
    (None when it is): an empty entry (``a,,b``, a leading or trailing comma), or an entry
    :func:`repository_problem` refuses."""
    if any(not piece.strip() for piece in text.split(",")):
        return "an empty entry between commas"
    for url in _split(text):
        problem = repository_problem(url)
        if problem:
            return f"entry {url!r}: {problem}"
    return None


def parse_repository_list(text: Optional[str]) -> list[str]:
    """``FLASHINFER_CUBINS_REPOSITORY``: URLs separated by whitespace or commas, tried in order
    (the knob has checked them: :func:`repository_list_problem`)."""
    return _split(text) if text else []


def _parse_repositories(name: str, value: str) -> str:
    """The raw list, once every entry names a repository this client can open."""
    problem = repository_list_problem(value)
    if problem:
        raise KnobError(
            name, value, "an ordered list of https://host, http://host, s3://bucket, file:// "
            f"URLs or directory paths, separated by spaces or commas ({problem})"
        )
    return value


def _parse_flags(name: str, value: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(value))
    except ValueError as e:
        raise KnobError(name, value, f"shell-quoted flags ({e})") from None


def _parse_path(name: str, value: str) -> Path:
    return Path(value).expanduser()


def env_str(names, default: Optional[str] = None, doc: str = "",
            parse: Callable[[str, str], str] = _parse_str) -> _Knob[Optional[str]]:
    return _Knob(names, default, parse, doc)


def env_bool(names, default: bool = False, doc: str = "") -> _Knob[bool]:
    return _Knob(names, default, _parse_bool, doc, "bool")


def env_int(names, default: Optional[int] = None, doc: str = "", positive: bool = False):
    """An integer in [1, MAX_INT] (``positive``) or [0, MAX_INT]."""
    return _Knob(names, default, _int_parser(1 if positive else 0), doc, "int")


def env_seconds(names, default: Optional[float] = None, doc: str = "") -> _Knob[Optional[float]]:
    """A duration: finite, positive, at most :data:`MAX_SECONDS`."""
    return _Knob(names, default, _parse_seconds, doc, "float")


def env_size_gb(names, default: Optional[float] = None, doc: str = "") -> _Knob[Optional[float]]:
    """A size in GB: finite, positive, at most 1e6."""
    return _Knob(names, default, _parse_size_gb, doc, "float")


def env_flags(names, doc: str = "") -> _Knob[tuple[str, ...]]:
    return _Knob(names, (), _parse_flags, doc, "flags")


def env_path(names, default, doc: str = "") -> _Knob[Path]:
    return _Knob(names, default, _parse_path, doc, "path")


class KnobGroup:
    """A set of related knobs; one instance per group lives in this module."""

    def __init__(self) -> None:
        self._overrides: dict[str, Any] = {}

    @classmethod
    def knobs(cls) -> dict[str, _Knob]:
        return {k: v for k, v in vars(cls).items() if isinstance(v, _Knob)}

    def check(self) -> None:
        """Read every knob of the group, so a bad value fails now, naming its variable
        (:class:`~flashinfer.exceptions.KnobError`), and not halfway through the work."""
        for attr in self.knobs():
            getattr(self, attr)

    @contextlib.contextmanager
    def scope(self) -> Iterator["KnobGroup"]:
        """Restore every override of this group when the block ends (for tests)."""
        saved = dict(self._overrides)
        try:
            yield self
        finally:
            self._overrides.clear()
            self._overrides.update(saved)


class JitKnobs(KnobGroup):
    cuda_arch_list = env_str(
        "FLASHINFER_CUDA_ARCH_LIST", doc='Target archs, e.g. "8.0 9.0a"; default: visible GPUs.'
    )
    nvcc = env_str("FLASHINFER_NVCC", doc="The nvcc binary to use.")
    cuda_home = env_str(("CUDA_HOME", "CUDA_PATH"), doc="CUDA toolkit root.")
    cxx = env_str("CXX", doc="Host C++ compiler nvcc uses and links with.")
    nvcc_launcher = env_flags("FLASHINFER_NVCC_LAUNCHER", doc="Prefix for nvcc (e.g. ccache).")
    cxx_launcher = env_flags("FLASHINFER_CXX_LAUNCHER", doc="Prefix for the host compiler.")
    nvcc_threads = env_int("FLASHINFER_NVCC_THREADS", 1, "nvcc --threads.", positive=True)
    max_jobs = env_int("MAX_JOBS", None, "Parallel compile jobs (ninja -j).", positive=True)
    extra_cflags = env_flags("FLASHINFER_EXTRA_CFLAGS", doc="Extra host compiler flags.")
    extra_cudaflags = env_flags("FLASHINFER_EXTRA_CUDAFLAGS", doc="Extra nvcc flags.")
    extra_ldflags = env_flags("FLASHINFER_EXTRA_LDFLAGS", doc="Extra linker flags.")
    verbose = env_bool("FLASHINFER_JIT_VERBOSE", doc="Print the build commands and output.")
    debug = env_bool("FLASHINFER_JIT_DEBUG", doc="Build with -g -G -O0.")
    lineinfo = env_bool("FLASHINFER_JIT_LINEINFO", doc="Build with -lineinfo.")
    disable_jit = env_bool("FLASHINFER_DISABLE_JIT", doc="Never compile; missing module raises.")
    verify = env_bool(
        "FLASHINFER_JIT_VERIFY",
        doc="Hash every cached module against its record before loading it (default: only a "
        "module whose size or mtime differs from the record is hashed).",
    )
    aot_modules = env_str(
        "FLASHINFER_AOT_MODULES",
        doc="Comma-separated module names the jit-cache wheel build is limited to; default: all.",
    )


class CacheKnobs(KnobGroup):
    workspace_base = env_path(
        "FLASHINFER_WORKSPACE_BASE", Path.home, "Base dir; the cache is <base>/.cache/flashinfer."
    )


class LoggingKnobs(KnobGroup):
    level = env_int("FLASHINFER_LOGLEVEL", 0,
                    "API logging: 0 off, 1 names, 3 args, 5 stats, 10 also dump tensors.")
    dest = env_str("FLASHINFER_LOGDEST", "stdout", "stdout, stderr, or a path (%i = pid).")
    python_level = env_str("FLASHINFER_LOGGING_LEVEL", None, "Python logger level name.")


class ArtifactKnobs(KnobGroup):
    cubin_dir = env_path(
        "FLASHINFER_CUBIN_DIR",
        lambda: cache.workspace_base / ".cache" / "flashinfer" / "cubins",
        "Local store of downloaded kernel binaries.",
    )
    repository = env_str(
        "FLASHINFER_CUBINS_REPOSITORY", None, "Ordered artifact repositories.", _parse_repositories
    )
    public_repositories = env_str(
        "FLASHINFER_PUBLIC_REPOSITORIES",
        None,
        "Release builds (nox -s release): the https:// or s3:// repositories users download the "
        "release's kernel binaries from, recorded in its lock and core wheel; unset: local-only.",
    )
    no_download = env_bool("FLASHINFER_NO_DOWNLOAD", doc="Never download kernel binaries.")
    checksum_disabled = env_bool(
        "FLASHINFER_CUBIN_CHECKSUM_DISABLED",
        doc="Skip SHA256 verification of local kernel binaries (FlashInfer's meaning): one that "
        "does not match the pinned manifest is loaded with an UnverifiedCubinWarning and kept; "
        "downloads are still verified.",
    )
    disable_version_check = env_bool(
        "FLASHINFER_DISABLE_VERSION_CHECK",
        doc="Use an installed flashinfer-cubin of another version if its manifest is the pinned "
        "one, and a flashinfer-jit-cache of another version or CUDA major.",
    )
    manifest_sha256 = env_str(
        "FLASHINFER_CUBIN_MANIFEST_SHA256",
        None,
        "Trust this release-manifest sha256 when the installed wheel pins none (development builds).",
        _parse_sha256,
    )
    download_timeout = env_seconds(
        "FLASHINFER_DOWNLOAD_TIMEOUT", 30.0, "Seconds to connect, and without data while reading."
    )
    download_deadline = env_seconds(
        "FLASHINFER_DOWNLOAD_DEADLINE",
        None,
        "Seconds one file may take in all (every attempt and repository); default: "
        "300 + 1 per 256 KiB of the file (flashinfer.artifacts.fetch.default_deadline).",
    )
    download_retries = env_int(
        "FLASHINFER_DOWNLOAD_RETRIES", 5, "Attempts per file and repository.", positive=True
    )
    download_backoff = env_seconds(
        "FLASHINFER_DOWNLOAD_BACKOFF", 0.5, "Base of the jittered exponential backoff, seconds."
    )
    ca_bundle = env_path(
        ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"),
        None,
        "CA certificates for https repositories (proxies: HTTPS_PROXY, NO_PROXY, as usual).",
    )
    wheel_index_url = env_str(
        "FLASHINFER_WHEEL_INDEX_URL",
        "https://flashinfer.ai/whl/cu{major}0/",
        "Index the install-*-wheel commands pip-install from; {major} = the CUDA major.",
    )


class NormKnobs(KnobGroup):
    use_cuda_norm = env_bool(
        "FLASHINFER_USE_CUDA_NORM", doc="Accepted for compatibility; our norm kernels are CUDA."
    )


class SamplingKnobs(KnobGroup):
    no_cluster = env_bool(
        "FLASHINFER_SAMPLING_NO_CLUSTER",
        doc="Run flashinfer.sampling's one-CTA-per-row path (the SM80 path) on SM90+ too: same "
        "results as the cluster path, slower (for testing).",
    )


# -- debugging tools (flashinfer.api_dump: level-10 dumps; flashinfer.fi_trace: trace JSON) --
class DumpKnobs(KnobGroup):
    """``FLASHINFER_LOGLEVEL=10``: each decorated call's inputs and outputs, written to disk.
    Read at each call, so they may change while a process runs."""

    dir = env_path("FLASHINFER_DUMP_DIR", lambda: Path("flashinfer_dumps"),
                   "Where level-10 dumps go (one folder per call).")
    max_size_gb = env_size_gb("FLASHINFER_DUMP_MAX_SIZE_GB", 20.0,
                              "Stop dumping (one warning) once this many GB were written.")
    max_count = env_int("FLASHINFER_DUMP_MAX_COUNT", 1000,
                        "Stop dumping (one warning) after this many calls.", positive=True)
    include = env_str("FLASHINFER_DUMP_INCLUDE", None,
                      "Comma list of API names to dump (`*` globs); default: all.")
    exclude = env_str("FLASHINFER_DUMP_EXCLUDE", None,
                      "Comma list of API names never dumped (`*` globs).")
    safetensors = env_bool("FLASHINFER_DUMP_SAFETENSORS",
                           doc="Write .safetensors instead of .pt (tensors only).")


class TraceKnobs(KnobGroup):
    """fi_trace: one JSON description per unique (op, shapes) while a workload runs."""

    dump = env_bool("FLASHINFER_TRACE_DUMP", doc="Write a trace JSON for each new (op, shapes).")
    dump_dir = env_path("FLASHINFER_TRACE_DUMP_DIR", lambda: Path("fi_trace_out"),
                        "Where trace JSON files go.")


jit = JitKnobs()
cache = CacheKnobs()
logging = LoggingKnobs()
artifacts = ArtifactKnobs()
norm = NormKnobs()
sampling = SamplingKnobs()
dump = DumpKnobs()
trace = TraceKnobs()

GROUPS: dict[str, KnobGroup] = {
    "jit": jit,
    "cache": cache,
    "logging": logging,
    "artifacts": artifacts,
    "norm": norm,
    "sampling": sampling,
    "dump": dump,
    "trace": trace,
}


def all_env_vars() -> list[str]:
    """Every environment variable name FlashInfer reads."""
    return [name for g in GROUPS.values() for k in g.knobs().values() for name in k.names]


def env_snapshot() -> dict[str, Optional[str]]:
    """The raw value of every variable we read (None where unset), for show-config."""
    return {name: os.environ.get(name) for name in all_env_vars()}


# scheme://user:password@ or scheme://token@ (URLs in repository lists, proxies, messages)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it hidden: ``https://bob:pw@host`` becomes
    ``https://bob:***@host``, and ``https://token@host`` becomes ``https://***@host``.

    >>> redact("https://bob:s3cret@mirror.example/fi /srv/mirror")
    'https://bob:***@mirror.example/fi /srv/mirror'
    """

    def hide(m: re.Match) -> str:
        user, sep, _ = m.group("userinfo").partition(":")
        return f"{m.group('scheme')}{user + ':***' if sep else '***'}@"

    return _USERINFO.sub(hide, text)


def shown_value(name: str, value: Optional[str]) -> str:
    """How show-config prints variable ``name``: ``(unset)``, ``***`` for a name that looks
    like a secret, else the value with URL credentials hidden (:func:`redact`)."""
    if value is None:
        return "(unset)"
    if _SECRET_NAME.search(name.upper()):
        return "***"
    return redact(value)


# Variables that change the compiled binary. They are not hashed by name: their *effect*
# (arch list, flags, the compiler's identity) is part of the JIT cache key.
CACHE_INVALIDATING = (
    "FLASHINFER_CUDA_ARCH_LIST",
    "FLASHINFER_NVCC",
    "CUDA_HOME",
    "CUDA_PATH",
    "CXX",
    "FLASHINFER_EXTRA_CFLAGS",
    "FLASHINFER_EXTRA_CUDAFLAGS",
    "FLASHINFER_EXTRA_LDFLAGS",
    "FLASHINFER_JIT_DEBUG",
    "FLASHINFER_JIT_LINEINFO",
)

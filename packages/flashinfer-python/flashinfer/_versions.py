"""Version and CUDA checks between ``flashinfer-python`` and its sibling wheels.

Every function here is pure: strings in, a parsed value or a message out; nothing is imported,
read or warned. The callers (:mod:`flashinfer.jit.jit_cache`, :mod:`flashinfer.artifacts.resolve`)
decide when to check and turn a message into one warning. Modelled on JAX's
``check_jaxlib_version``: versions are parsed and their release tuples compared, never string
prefixes (``"0.6.18+cu130".startswith("0.6.1")`` is true, and FlashInfer's prefix check accepted
exactly that pair).

The set is released in lock step, so a sibling matches only when its public version (epoch,
release, pre, post and dev parts) equals ours. The local label (``+cu130``) names the CUDA build
of the jit-cache wheel and is not part of the match; the CUDA major is checked on its own.
flashinfer-cubin is matched by the sha256 of the artifact manifest it holds, which the
flashinfer-python build pins (:func:`check_cubin_release`).

>>> check_sibling_version("flashinfer-jit-cache", "0.6.18+cu130", "0.6.1") is None
False
>>> check_sibling_version("flashinfer-jit-cache", "0.6.1+cu130", "0.6.1") is None
True
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple, Optional

#: Where the project publishes one PEP 503 index per CUDA build (``<base>/cu130/``);
#: ``nox -s release`` writes the same layout under ``dist/whl/``.
WHEEL_INDEX_BASE = "https://flashinfer.ai/whl"


class VersionMismatchWarning(UserWarning):
    """An installed sibling wheel does not match flashinfer-python and is ignored."""


class Version(NamedTuple):
    """A parsed PEP 440 version (the subset the project uses, which is all of the scheme
    except the legacy spellings)."""

    epoch: int
    release: tuple[int, ...]
    pre: Optional[tuple[str, int]]  # ("a" | "b" | "rc", n)
    post: Optional[int]
    dev: Optional[int]
    local: str  # "" when absent, lower case, "." separated

    @property
    def public(self) -> tuple:
        """Everything but the local label, with trailing zeros of the release dropped so that
        ``1.0`` and ``1.0.0`` compare equal (PEP 440 says they are the same version)."""
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        return (self.epoch, tuple(release), self.pre, self.post, self.dev)

    def __str__(self) -> str:
        text = (f"{self.epoch}!" if self.epoch else "") + ".".join(map(str, self.release))
        if self.pre:
            text += f"{self.pre[0]}{self.pre[1]}"
        if self.post is not None:
            text += f".post{self.post}"
        if self.dev is not None:
            text += f".dev{self.dev}"
        return text + (f"+{self.local}" if self.local else "")


@functools.cache
def _version_re() -> re.Pattern:
    # Compiled on first use (~1 ms): the usual check (same plain release) never needs it.
    return re.compile(_VERSION_PATTERN, re.VERBOSE | re.IGNORECASE)


_VERSION_PATTERN = (
    r"""^\s*v?
    (?:(?P<epoch>\d+)!)?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>alpha|beta|preview|pre|rc|a|b|c)[-_.]?(?P<pre_n>\d+)?)?
    (?:-(?P<post_implicit>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n>\d+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$"""
)
_PRE_NAMES = {"alpha": "a", "a": "a", "beta": "b", "b": "b", "c": "rc", "rc": "rc",
              "pre": "rc", "preview": "rc"}


def parse_version(text: str) -> Version:
    """Parse a PEP 440 version.

    Raises
    ------
    ValueError
        ``text`` is not a PEP 440 version; the message quotes it.

    >>> parse_version("0.6.18+cu130").release, parse_version("0.6.18+cu130").local
    ((0, 6, 18), 'cu130')
    """
    m = _version_re().match(text or "")
    if m is None:
        raise ValueError(f"version must be a PEP 440 version like '1.2.3', got {text!r}")
    pre = None
    if m.group("pre_l"):
        pre = (_PRE_NAMES[m.group("pre_l").lower()], int(m.group("pre_n") or 0))
    post = None
    if m.group("post_implicit"):
        post = int(m.group("post_implicit"))
    elif m.group("post_l"):
        post = int(m.group("post_n") or 0)
    dev = int(m.group("dev_n") or 0) if m.group("dev_l") else None
    local = re.sub(r"[-_]", ".", (m.group("local") or "").lower())
    return Version(
        epoch=int(m.group("epoch") or 0),
        release=tuple(int(p) for p in m.group("release").split(".")),
        pre=pre,
        post=post,
        dev=dev,
        local=local,
    )


def same_public_version(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` are the same version apart from their local labels.

    >>> same_public_version("1.2.0+cu130", "1.2")
    True
    """
    return parse_version(a).public == parse_version(b).public


def public_version(text: str) -> str:
    """``text`` without its local label (``"1.2.3+cu130"`` -> ``"1.2.3"``)."""
    return str(parse_version(text)._replace(local=""))


def check_sibling_version(sibling: str, sibling_version: str, ours: str) -> Optional[str]:
    """None when the sibling wheel matches us, else the message of the one warning to show.

    Parameters
    ----------
    sibling : str
        Distribution name of the sibling, e.g. ``"flashinfer-jit-cache"``.
    sibling_version : str
        Its version as recorded in it, e.g. ``"1.2.3+cu130"``.
    ours : str
        ``flashinfer.__version__``.

    The message names both versions, says the sibling is ignored, and gives the pip command
    that installs the matching one (and the variable that overrides the check).
    """
    if _plain_release(sibling_version) is not None and (
        _plain_release(sibling_version) == _plain_release(ours)
    ):
        return None
    try:
        theirs_v, ours_v = parse_version(sibling_version), parse_version(ours)
    except ValueError as e:
        return (
            f"{sibling} {sibling_version!r} cannot be compared with flashinfer-python {ours!r} "
            f"({e}); it is ignored. {_fix(sibling, ours, _label(sibling_version))}"
        )
    if theirs_v.public == ours_v.public:
        return None
    return (
        f"{sibling} {sibling_version} does not match flashinfer-python {ours}; it is ignored "
        f"(the set is released in lock step, so only {public_version(ours)} fits). "
        f"{_fix(sibling, ours, theirs_v.local)}"
    )


def check_cubin_release(
    ours: str,
    pinned_release: str,
    pinned_sha256: str,
    cubin_version: str,
    cubin_release: Optional[str],
    cubin_sha256: Optional[str],
) -> Optional[str]:
    """None when an installed flashinfer-cubin serves the artifact release this flashinfer-python
    pins, else the message of the one warning to show.

    The manifest hash decides, not the version strings: the wheel serves exactly when it holds
    the pinned manifest (a post-release of flashinfer-python that pins the same cubins is served
    by the same flashinfer-cubin). A wheel built without a release (a development build) serves
    nothing; it is not a mismatch either, so that is None too (callers check ``cubin_release``).

    >>> check_cubin_release("0.2.0", "0.2.0", "a" * 64, "0.2.0", "0.2.0", "a" * 64) is None
    True
    >>> check_cubin_release("0.2.0", "0.2.0", "a" * 64, "0.1.9", "0.1.9", "b" * 64)[:50]
    'flashinfer-cubin 0.1.9 (artifact release 0.1.9) do'
    """
    if cubin_release is None or cubin_sha256 is None or cubin_sha256 == pinned_sha256:
        return None
    fix = _fix("flashinfer-cubin", pinned_release, None, override=(
        "FLASHINFER_DISABLE_VERSION_CHECK=1 only silences this warning: a flashinfer-cubin of "
        "another manifest is never used, its files are not the pinned ones"))
    if cubin_release != pinned_release:
        return (
            f"flashinfer-cubin {cubin_version} (artifact release {cubin_release}) does not match "
            f"flashinfer-python {ours}, which pins artifact release {pinned_release}; it is "
            f"ignored (kernel binaries come from the local store or a download instead). {fix}"
        )
    return (
        f"flashinfer-cubin {cubin_version} holds an artifact release {cubin_release} whose "
        f"manifest sha256 is {cubin_sha256}, not the {pinned_sha256} that flashinfer-python "
        f"{ours} pins; it is ignored (a rebuilt or tampered wheel: reinstall it from the "
        f"official index). {fix}"
    )


def cuda_major(version: Optional[str]) -> Optional[int]:
    """The major of a CUDA version string (``"13.0"``, ``"12.8.1"``, ``"13"``), else None.

    >>> cuda_major("12.8"), cuda_major(None), cuda_major("unknown")
    (12, None, None)
    """
    m = re.match(r"^\s*(\d+)(?:\.\d+)*\s*$", version or "")
    return int(m.group(1)) if m else None


def cuda_label(version: str) -> str:
    """The index and local-version label of a CUDA build: ``"13.0"`` -> ``"cu130"``.

    Raises
    ------
    ValueError
        ``version`` is not ``MAJOR.MINOR[.PATCH]``.
    """
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.\d+)?\s*$", version or "")
    if m is None:
        raise ValueError(f"CUDA version must look like '13.0', got {version!r}")
    return f"cu{m.group(1)}{m.group(2)}"


def check_cuda_major(
    sibling: str, sibling_version: str, built_with: Optional[str], runtime: Optional[str]
) -> Optional[str]:
    """None when a wheel built with CUDA ``built_with`` fits a runtime of CUDA ``runtime``,
    else the warning's message.

    Modules link ``libcudart.so.<major>``: any runtime of the same major works (CUDA's minor
    version compatibility), another major cannot load them. ``runtime`` None (a CPU build of
    torch) can't run them either way, so it is not a mismatch: nothing to warn about.

    >>> check_cuda_major("flashinfer-jit-cache", "1.2.3+cu130", "13.0", "13.2") is None
    True
    """
    if runtime is None:
        return None
    have, want = cuda_major(built_with), cuda_major(runtime)
    if have is not None and have == want:
        return None
    label = None
    try:
        label = cuda_label(runtime)
    except ValueError:
        pass
    return (
        f"{sibling} {sibling_version} was built with CUDA {built_with}, but torch runs CUDA "
        f"{runtime} (another major); its modules are ignored. "
        f"{_fix(sibling, sibling_version, label)}"
    )


def _plain_release(text: str) -> Optional[str]:
    """The public part of ``text`` if it is a plain release (``"1.2.3"``, any local label), else
    None. Such a string parses to exactly its release numbers, so two equal ones are the same
    version: the common case is decided without the full parser. Anything else (pre/post/dev
    parts, different spellings of one version) goes through :func:`parse_version`."""
    public = text.split("+", 1)[0]
    parts = public.split(".")
    return public if all(p.isascii() and p.isdigit() for p in parts) else None


def _parses(text: str) -> bool:
    try:
        parse_version(text)
    except ValueError:
        return False
    return True


def _label(version: str) -> Optional[str]:
    try:
        return parse_version(version).local or None
    except ValueError:
        return None


def _fix(sibling: str, ours: str, label: Optional[str], override: Optional[str] = None) -> str:
    """The pip command that installs the sibling of version ``ours`` (its public part) for
    the CUDA build ``label``, and what ``FLASHINFER_DISABLE_VERSION_CHECK=1`` does
    (``override``; default: the sibling is used anyway)."""
    want = public_version(ours) if _parses(ours) else ours
    if sibling == "flashinfer-jit-cache":
        index = f"{WHEEL_INDEX_BASE}/{label or '<your CUDA, e.g. cu130>'}/"
        cmd = f"pip install --force-reinstall --no-deps '{sibling}=={want}' --index-url {index}"
    else:
        cmd = f"pip install --force-reinstall --no-deps '{sibling}=={want}'"
    override = override or "FLASHINFER_DISABLE_VERSION_CHECK=1 uses it anyway"
    return f"Fix: {cmd} (or pip uninstall {sibling}; {override})."

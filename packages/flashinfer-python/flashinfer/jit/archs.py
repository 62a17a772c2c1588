"""Target GPU architectures: parsing ``FLASHINFER_CUDA_ARCH_LIST``, detecting visible GPUs,
filtering by what a module supports, and the nvcc flags for the result."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from .. import knobs
from ..exceptions import KnobError, NoSupportedArchError

_ARCH_RE = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


@dataclass(frozen=True, order=True)
class Arch:
    """One target: compute capability major.minor, an optional arch-specific suffix
    ("a": sm_90a-style, needed for wgmma/setmaxnreg; "f": family), and whether PTX is embedded."""

    major: int
    minor: int
    suffix: str = ""
    ptx: bool = False

    @property
    def sm(self) -> str:
        return f"{self.major}{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}{'+PTX' if self.ptx else ''}"

    def gencode_flags(self) -> list[str]:
        flags = [f"-gencode=arch=compute_{self.sm},code=sm_{self.sm}"]
        if self.ptx:
            flags.append(f"-gencode=arch=compute_{self.sm},code=compute_{self.sm}")
        return flags


def parse_arch_list(text: str, source: str = "FLASHINFER_CUDA_ARCH_LIST") -> list[Arch]:
    """Parse ``"8.0 9.0a"`` (separated by spaces, commas or semicolons) into sorted, unique archs.

    >>> [str(a) for a in parse_arch_list("9.0a; 8.0")]
    ['8.0', '9.0a']
    """
    archs = set()
    for token in re.split(r"[\s,;]+", text.strip()):
        if not token:
            continue
        m = _ARCH_RE.match(token)
        if m is None:
            raise KnobError(source, text, 'a list of archs like "8.0 9.0a" (bad entry %r)' % token)
        archs.add(Arch(int(m.group(1)), int(m.group(2)), m.group(3), bool(m.group(4))))
    if not archs:
        raise KnobError(source, text, 'a non-empty list of archs like "8.0 9.0a"')
    return sorted(archs)


def arch_for_capability(major: int, minor: int) -> Arch:
    """The target for a visible GPU: sm90 and newer get the arch-specific "a" suffix, so
    Hopper-only instructions (wgmma, setmaxnreg) are available."""
    return Arch(major, minor, "a" if major >= 9 else "")


def detect_archs() -> list[Arch]:
    """Archs of the visible GPUs (imports torch)."""
    import torch

    if not torch.cuda.is_available():
        return []
    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return sorted(arch_for_capability(*cap) for cap in caps)


def requested_archs() -> list[Arch]:
    """``FLASHINFER_CUDA_ARCH_LIST`` if set, else the visible GPUs; error if neither gives any."""
    text = knobs.jit.cuda_arch_list
    if text:
        return parse_arch_list(text)
    archs = detect_archs()
    if not archs:
        raise NoSupportedArchError(
            "no target GPU architecture: no CUDA GPU is visible and FLASHINFER_CUDA_ARCH_LIST is "
            'unset; set it, e.g. FLASHINFER_CUDA_ARCH_LIST="9.0a"'
        )
    return archs


def select_archs(
    requested: Sequence[Arch], supported_majors: Optional[Iterable[int]], module: str
) -> list[Arch]:
    """Keep the requested archs whose major version the module supports."""
    if supported_majors is None:
        return list(requested)
    majors = set(supported_majors)
    kept = [a for a in requested if a.major in majors]
    if not kept:
        raise NoSupportedArchError(
            f"module {module!r} supports compute capability majors {sorted(majors)}, but the "
            f"target archs are {[str(a) for a in requested]}; set FLASHINFER_CUDA_ARCH_LIST to "
            "include a supported arch"
        )
    return kept


def arch_tag(archs: Sequence[Arch]) -> str:
    """Directory-safe name of an arch list, e.g. ``80_90a``."""
    return "_".join(a.sm + ("p" if a.ptx else "") for a in archs)

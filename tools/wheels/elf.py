"""What a shared library asks of the system: its NEEDED libraries, RUNPATH, and the symbol
versions it requires from each (``.gnu.version_r``). Pure Python, 64-bit little-endian ELF
(x86_64, aarch64), so the wheel check needs neither binutils nor auditwheel."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

_SHT_DYNAMIC = 6
_SHT_GNU_VERNEED = 0x6FFFFFFE
_DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 1, 15, 29
MACHINES = {62: "x86_64", 183: "aarch64"}


class ElfError(ValueError):
    """The bytes are not a 64-bit little-endian ELF file we can read."""


@dataclass
class ElfInfo:
    machine: str
    needed: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)
    #: library soname -> symbol versions required from it, e.g. {"libc.so.6": ["GLIBC_2.14"]}
    version_needs: dict[str, list[str]] = field(default_factory=dict)

    def max_version(self, prefix: str) -> tuple[int, ...]:
        """Highest required version named ``<prefix>_x.y.z`` (e.g. ``GLIBC``), () if none."""
        best: tuple[int, ...] = ()
        for names in self.version_needs.values():
            for name in names:
                m = re.fullmatch(rf"{prefix}_(\d+(?:\.\d+)*)", name)
                if m:
                    best = max(best, tuple(int(p) for p in m.group(1).split(".")))
        return best


def _cstr(data: bytes, offset: int) -> str:
    end = data.index(b"\0", offset)
    return data[offset:end].decode("utf-8", "replace")


def read_elf(data: bytes) -> ElfInfo:
    """Parse the dynamic section and the version needs of an ELF shared object.

    Raises
    ------
    ElfError
        Not an ELF file, or not 64-bit little-endian.
    """
    if data[:4] != b"\x7fELF":
        raise ElfError("not an ELF file (bad magic)")
    if data[4] != 2 or data[5] != 1:
        raise ElfError(f"only 64-bit little-endian ELF is read, got class {data[4]} data {data[5]}")
    (machine,) = struct.unpack_from("<H", data, 0x12)
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    info = ElfInfo(machine=MACHINES.get(machine, f"e_machine={machine}"))
    for _name, sh_type, _flags, _addr, offset, size, link, sh_info, _align, _entsize in sections:
        strtab_offset = sections[link][4] if link < len(sections) else 0
        if sh_type == _SHT_DYNAMIC:
            for pos in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == _DT_NEEDED:
                    info.needed.append(_cstr(data, strtab_offset + value))
                elif tag in (_DT_RPATH, _DT_RUNPATH):
                    info.runpath += _cstr(data, strtab_offset + value).split(":")
        elif sh_type == _SHT_GNU_VERNEED:
            pos = offset
            for _ in range(sh_info):
                _ver, count, file_off, aux, nxt = struct.unpack_from("<HHIII", data, pos)
                library = _cstr(data, strtab_offset + file_off)
                names = info.version_needs.setdefault(library, [])
                apos = pos + aux
                for _ in range(count):
                    _hash, _flags2, _other, name_off, anext = struct.unpack_from("<IHHII", data, apos)
                    names.append(_cstr(data, strtab_offset + name_off))
                    apos += anext
                pos += nxt
    return info

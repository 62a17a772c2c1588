"""The ninja file of one module: a pure function of the build's inputs, so it is unit-testable
and written to disk only when it changes."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class NinjaBuild:
    """Everything a module's build.ninja says.

    Attributes
    ----------
    name : str
        Output is ``<name>.so``.
    sources : sequence of Path
        ``.cu`` files go through nvcc, ``.cc``/``.cpp`` through the host compiler.
    """

    name: str
    sources: Sequence[Path]
    nvcc: Sequence[str]  # launcher + nvcc
    cxx: Sequence[str]  # launcher + host compiler
    cuda_cflags: Sequence[str]
    cflags: Sequence[str]
    ldflags: Sequence[str]


def _escape_path(path: str) -> str:
    # ninja syntax: "$", " " and ":" are special in build lines
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _join(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in args).replace("$", "$$")


def object_name(source: Path, index: int) -> str:
    return f"{index:02d}_{source.stem}{'.cuda' if source.suffix == '.cu' else ''}.o"


def render_ninja(b: NinjaBuild) -> str:
    lines = [
        "ninja_required_version = 1.3",
        f"nvcc = {_join(b.nvcc)}",
        f"cxx = {_join(b.cxx)}",
        f"cuda_cflags = {_join(b.cuda_cflags)}",
        f"cflags = {_join(b.cflags)}",
        f"ldflags = {_join(b.ldflags)}",
        "",
        "rule compile_cuda",
        "  command = $nvcc --generate-dependencies-with-compile --dependency-output $out.d "
        "$cuda_cflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = nvcc $in",
        "",
        "rule compile_cxx",
        "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = c++ $in",
        "",
        "rule link",
        "  command = $cxx $in $ldflags -o $out",
        "  description = link $out",
        "",
    ]
    objects = []
    for i, src in enumerate(b.sources):
        obj = object_name(src, i)
        rule = "compile_cuda" if src.suffix == ".cu" else "compile_cxx"
        lines.append(f"build {_escape_path(obj)}: {rule} {_escape_path(str(src))}")
        objects.append(_escape_path(obj))
    lines += ["", f"build {b.name}.so: link {' '.join(objects)}", f"default {b.name}.so", ""]
    return "\n".join(lines)


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` unless the file already holds it (keeps ninja's mtimes meaningful)."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


# What the compilers and the linker call an error: ``file(5): error: ...`` (nvcc),
# ``file:3:10: fatal error: ...`` (gcc), ``nvcc fatal   : ...``, ``ptxas error   : ...``,
# ``error C2065: ...`` (MSVC), the linker's ``cannot find -lx``, ``undefined reference to``, and
# the shell's ``/bin/sh: 1: c++: not found`` (a CXX or launcher that does not exist).
_DIAGNOSTIC = re.compile(
    r"\b(?:error|fatal)\b\s*(?:[A-Z]+\d+\s*)?:|undefined reference to|cannot find -l"
    r"|multiple definition of|: (?:command )?not found\s*$",
    re.IGNORECASE,
)


def compiler_errors(output: str) -> list[str]:
    """The compilers' and the linker's error lines in ninja's ``output``, in order, once each.

    ninja prints each failed command on the line after its ``FAILED:`` line; that line is
    skipped, since a flag or a path in it may contain "error" without being one."""
    keep: list[str] = []
    command_next = False
    for line in output.splitlines():
        if command_next:
            command_next = False
            continue
        if line.startswith("FAILED:"):
            command_next = True
        elif not line.startswith("ninja:") and _DIAGNOSTIC.search(line):
            text = line.strip()
            if text not in keep:
                keep.append(text)
    return keep


def failed_targets(output: str) -> list[str]:
    """ninja's ``FAILED: ...`` lines: what to show when no compiler line says why."""
    return [line.strip() for line in output.splitlines() if line.startswith("FAILED:")]

"""The exceptions FlashInfer raises.

Every error of ours derives from :class:`FlashInferError`; those that are also a bad argument
derive from :class:`ValueError` too, so callers can catch either. Subclasses carry the context a
caller needs to act (the module spec, the log path, the variable name).
"""

from __future__ import annotations

from typing import Any, Sequence


class FlashInferError(Exception):
    """Base class of every FlashInfer error."""


class KnobError(FlashInferError, ValueError):
    """An environment variable (or a knob set in code) holds a value that does not parse."""

    def __init__(self, name: str, value: Any, expected: str):
        self.name = name
        self.value = value
        super().__init__(f"{name} must be {expected}, got {value!r}")


class JitError(FlashInferError, RuntimeError):
    """A module could not be provided by the JIT (base class)."""


class NoSupportedArchError(JitError):
    """No target GPU architecture is left for a module."""


class CompilerNotFoundError(JitError):
    """nvcc (or ninja) could not be found, and a module has to be compiled."""


class MissingJITCacheError(JitError):
    """JIT is disabled and no cache provides the module.

    Attributes
    ----------
    spec : JitSpec
        The module that was asked for.
    """

    def __init__(self, message: str, spec: Any):
        self.spec = spec
        super().__init__(message)


class JitCompileError(JitError):
    """nvcc or the linker failed.

    Attributes
    ----------
    spec : JitSpec
        The module being built.
    log_path : str
        The full build log (ninja's and the compiler's output).
    error_lines : list of str
        The compiler's ``error`` and ``fatal`` lines, in order; the message shows the first
        :attr:`SHOWN_LINES`, each cut at :attr:`LINE_CHARS` characters.
    """

    SHOWN_LINES = 10
    LINE_CHARS = 300

    def __init__(self, spec: Any, log_path: str, error_lines: Sequence[str]):
        self.spec = spec
        self.log_path = log_path
        self.error_lines = list(error_lines)
        shown = [
            line if len(line) <= self.LINE_CHARS else line[: self.LINE_CHARS - 3] + "..."
            for line in self.error_lines[: self.SHOWN_LINES]
        ]
        if len(self.error_lines) > self.SHOWN_LINES:
            shown.append(f"({len(self.error_lines) - self.SHOWN_LINES} more in the log)")
        text = "\n  ".join(shown) or "(no error line found; see the log)"
        super().__init__(
            f"failed to build JIT module {spec.name!r}:\n  {text}\nfull build log: {log_path}"
        )

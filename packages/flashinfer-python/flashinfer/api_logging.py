"""``@flashinfer_api``: opt-in logging of every public API call.

``FLASHINFER_LOGLEVEL`` (``knobs.logging.level``) selects what is logged:

== ==========================================================================================
0  nothing (default). The decorator returns the function itself: zero overhead.
1  the API name, on each call (and the exception's type and message if it raises).
3  also the arguments, *before* the call (so a crash still shows them), and the result after:
   tensors as shape, dtype, device and strides; other values by ``repr``.
5  also tensor statistics (NaN and Inf counts; min, max, mean of the finite values). They
   synchronize the device, so they are skipped while the current CUDA stream is being
   captured into a CUDA graph (``"stats skipped: graph capture"``).
10 also writes each call's input and output tensors to ``FLASHINFER_DUMP_DIR``
   (:mod:`flashinfer.api_dump`; ``flashinfer replay --dir D`` re-runs them).
== ==========================================================================================

Levels in between act as the level below them.

The level is read **once, when the op is decorated**, i.e. when its submodule is first imported
(``flashinfer`` imports its submodules lazily, on first use of a name). Set the variable before
the first use of an op; changing it afterwards affects only submodules imported later.

``FLASHINFER_LOGDEST`` (``knobs.logging.dest``) is ``stdout`` (default), ``stderr`` or a file path
in which ``%i`` becomes the process id. It is read at the first logged call, when a file is
opened (append, line-buffered; missing parent directories are created). A process forked after
that re-reads it and opens its own file. The first logged call of each process first writes
``FlashInfer <version> (commit <sha8>)``.

Logging never raises: a value whose formatting fails is shown as ``<unprintable ...>``, a file that
cannot be opened sends the log to stderr, and the API's own exceptions pass through unchanged.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import os
import sys
import threading
import warnings
from typing import Any, Callable, List, Optional, TextIO, TypeVar

import torch

from . import knobs

F = TypeVar("F", bound=Callable)

_MAX_ITEMS = 8  # list/tuple/dict entries shown before "..."
_MAX_REPR = 200  # characters of a non-tensor repr shown


def flashinfer_api(func: Optional[F] = None, *, trace: Any = None) -> F:
    """Log calls of a public API at ``FLASHINFER_LOGLEVEL`` >= 1; identity at level 0.

    Works on functions and methods (the logged name is the ``__qualname__``, e.g.
    ``BatchDecodeWithPagedKVCacheWrapper.run``). ``@flashinfer_api(trace=template)`` gives the op
    its :class:`~flashinfer.fi_trace.TraceTemplate` (default: the one named after the op in
    :mod:`flashinfer.trace_templates`).
    """
    if func is None:  # @flashinfer_api(trace=...)
        return functools.partial(flashinfer_api, trace=trace)  # type: ignore[return-value]
    # -- tooling hooks (fi_trace, level-10 dumps): flashinfer/fi_trace.py, api_dump.py --
    from . import fi_trace

    fi_trace.attach(func, trace)
    tracing = fi_trace.requested_at_decoration()
    # -- end of tooling hooks --
    level = _decoration_level()
    if level == 0 and not tracing:
        return func
    name = func.__qualname__
    try:
        sig: Optional[inspect.Signature] = inspect.signature(func)
    except (TypeError, ValueError):
        sig = None

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if tracing:
            fi_trace.dump_call(func, args, kwargs)
        if level == 0:
            return func(*args, **kwargs)
        _log(_format_call, name, level, sig, args, kwargs)
        dump = _dump_begin(func, sig, args, kwargs) if level >= 10 else None
        try:
            result = func(*args, **kwargs)
        except Exception as e:
            _log(_format_error, name, e)
            if dump is not None:
                dump[0].end(dump[1], None, dump[2], e)
            raise
        if level >= 3:
            _log(_format_result, name, level, result)
        if dump is not None:
            dump[0].end(dump[1], result, dump[2])
        return result

    return wrapper  # type: ignore[return-value]


#: The bad FLASHINFER_LOGLEVEL values this process has warned about (each ops module decorates
#: its functions on import: one warning per value, not one per decorated function).
_WARNED_LEVELS: set = set()
_WARNED_LOCK = threading.Lock()


def _decoration_level() -> int:
    """The effective level (0, 1, 3 or 5); a bad value warns (once per process) and disables
    logging."""
    try:
        level = knobs.logging.level
    except ValueError as e:  # KnobError: the variable does not parse
        with _WARNED_LOCK:
            first = str(e) not in _WARNED_LEVELS
            _WARNED_LEVELS.add(str(e))
        if first:
            warnings.warn(f"API logging disabled: {e}", RuntimeWarning, stacklevel=3)
        return 0
    for step in (10, 5, 3, 1):
        if level >= step:
            return step
    return 0


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def _format_call(name: str, level: int, sig, args: tuple, kwargs: dict) -> List[str]:
    if level < 3:
        return [name]
    try:
        named = list(sig.bind(*args, **kwargs).arguments.items())
    except (AttributeError, TypeError):  # no signature, or a call the API will reject itself
        named = [(f"arg[{i}]", a) for i, a in enumerate(args)] + list(kwargs.items())
    lines = [f"{name} inputs:" if named else f"{name} (no inputs)"]
    lines += [f"  {key}: {_format_value(value, level)}" for key, value in named]
    return lines


def _format_result(name: str, level: int, result: Any) -> List[str]:
    if isinstance(result, (tuple, list)) and 0 < len(result) <= _MAX_ITEMS:
        return [f"{name} outputs:"] + [
            f"  [{i}]: {_format_value(r, level)}" for i, r in enumerate(result)
        ]
    return [f"{name} output: {_format_value(result, level)}"]


def _format_error(name: str, error: Exception) -> List[str]:
    return [f"{name} raised {type(error).__name__}: {error}"]


def _format_value(value: Any, level: int, depth: int = 0) -> str:
    try:
        if isinstance(value, torch.Tensor):
            return _format_tensor(value, level)
        if isinstance(value, (list, tuple)) and depth < 2:
            items = [_format_value(v, level, depth + 1) for v in value[:_MAX_ITEMS]]
            if len(value) > _MAX_ITEMS:
                items.append(f"... ({len(value)} items)")
            text = ", ".join(items)
            if isinstance(value, list):
                return f"[{text}]"
            return f"({text},)" if len(value) == 1 else f"({text})"
        if isinstance(value, dict) and depth < 2:
            items = [
                f"{k!r}: {_format_value(v, level, depth + 1)}"
                for k, v in list(value.items())[:_MAX_ITEMS]
            ]
            if len(value) > _MAX_ITEMS:
                items.append(f"... ({len(value)} items)")
            return "{" + ", ".join(items) + "}"
        if type(value).__repr__ is object.__repr__:  # "<x.Y object at 0x...>" says only the type
            return f"<{type(value).__name__}>"
        text = repr(value)
        return text if len(text) <= _MAX_REPR else text[:_MAX_REPR] + "..."
    except Exception as e:
        return f"<unprintable {type(value).__name__}: {type(e).__name__}>"


def _format_tensor(t: torch.Tensor, level: int) -> str:
    dtype = str(t.dtype).replace("torch.", "")
    text = f"Tensor(shape={tuple(t.shape)}, dtype={dtype}, device={t.device}, stride={t.stride()})"
    if level >= 5:
        text += f" {_tensor_stats(t)}"
    return text


def _tensor_stats(t: torch.Tensor) -> str:
    if _capturing():  # .item() would synchronize the capturing stream, which is illegal
        return "[stats skipped: graph capture]"
    if t.numel() == 0:
        return "[stats: empty]"
    try:
        x = t.detach()
        if x.dtype == torch.bool:
            x = x.to(torch.uint8)
        nan = inf = 0
        if x.is_floating_point():
            nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
            if nan or inf:  # min/max/mean of the finite values say more than "nan"
                x = x[torch.isfinite(x)]
        counts = f"nan={nan} inf={inf}"
        if x.numel() == 0:
            return f"[no finite values, {counts}]"
        try:
            lo, hi = torch.aminmax(x)
        except (RuntimeError, NotImplementedError):  # e.g. fp8 without native min/max
            x = x.float()
            lo, hi = torch.aminmax(x)
        mean = x.mean(dtype=torch.float64)
        return f"[min={lo.item():.6g} max={hi.item():.6g} mean={mean.item():.6g} {counts}]"
    except Exception as e:
        return f"[stats unavailable: {type(e).__name__}: {e}]"


def _capturing() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:  # CPU-only builds raise from the capture query
        return False


def _dump_begin(func: Callable, sig: Optional[inspect.Signature], args: tuple, kwargs: dict):
    """Level 10: (api_dump, pending dump, named arguments), or None; never raises."""
    try:
        from . import api_dump

        bound = sig.bind(*args, **kwargs)  # type: ignore[union-attr]
        bound.apply_defaults()
        named = dict(bound.arguments)
        return api_dump, api_dump.begin(func.__qualname__, func.__module__, named), named
    except Exception:
        return None


# --------------------------------------------------------------------------------------------
# Destination
# --------------------------------------------------------------------------------------------


def _log(make_lines: Callable[..., List[str]], *args: Any) -> None:
    """Format and write one record; never raises."""
    try:
        _sink.write(make_lines(*args))
    except Exception:
        pass


class _Sink:
    """Where records go: resolved from ``knobs.logging.dest`` on the first write of a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dest = "stdout"
        self._file: Optional[TextIO] = None
        self._pid: Optional[int] = None  # process that resolved the destination

    def write(self, lines: List[str]) -> None:
        now = datetime.datetime.now().isoformat(sep=" ", timespec="milliseconds")
        with self._lock:
            if self._pid != os.getpid():
                self._open()
                lines = [_banner()] + lines
            prefix = f"[FlashInfer {now} pid={self._pid}] "
            text = "".join(prefix + line + "\n" for line in lines)
            stream = self._stream()
            stream.write(text)
            stream.flush()

    def _stream(self) -> TextIO:
        # stdout/stderr are looked up on each write so redirection (and pytest's capture) works.
        if self._file is not None:
            return self._file
        return sys.stderr if self._dest == "stderr" else sys.stdout

    def _open(self) -> None:
        self.close()
        self._pid = os.getpid()
        try:
            dest = knobs.logging.dest or "stdout"
        except Exception:
            dest = "stdout"
        dest = dest.strip()
        self._dest = dest.lower() if dest.lower() in ("stdout", "stderr") else dest
        if self._dest not in ("stdout", "stderr"):
            path = self._dest.replace("%i", str(self._pid))
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                self._file = open(path, "a", buffering=1, encoding="utf-8")
            except OSError as e:
                self._dest = "stderr"
                sys.stderr.write(
                    f"[FlashInfer] cannot open log file {path!r} ({e}); logging to stderr\n"
                )

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
        self._file = None
        self._pid = None


def _banner() -> str:
    """``FlashInfer <version> (commit <sha8>)`` from the package, else from its metadata."""
    version = commit = None
    try:
        package = sys.modules.get(__package__ or "flashinfer")
        version = getattr(package, "__version__", None)
        commit = getattr(package, "__git_commit__", None)
    except Exception:
        pass
    if not version:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("flashinfer-python")
        except Exception:
            version = "0.0.0+unknown"
    return f"FlashInfer {version} (commit {str(commit)[:8] if commit else 'unknown'})"


_sink = _Sink()


def _reset_sink() -> None:
    """Close the log file and forget the destination and banner (tests use this)."""
    with _sink._lock:
        _sink.close()

"""Level-10 API dumps and their replay.

At ``FLASHINFER_LOGLEVEL=10`` every ``@flashinfer_api`` call also writes, to
``FLASHINFER_DUMP_DIR`` (default ``./flashinfer_dumps``), one folder per call::

    <dir>/20261126T023912123456_pid1234_rmsnorm_call0001/
        metadata.json      what was called: module, qualname, each argument (tensors by
                           shape/dtype/stride/device, other values as JSON), status
        inputs.pt          the tensor arguments before the call (cloned: in-place ops
                           change them), by parameter name (``name.0`` for list items)
        outputs.pt         after the call: the result, and the arguments the op writes
                           in place (its trace template says which)
    <dir>/session.jsonl    one line per dumped call (folder, API, status, bytes)

``FLASHINFER_DUMP_SAFETENSORS=1`` writes ``.safetensors`` instead of ``.pt`` (safetensors
stores contiguous tensors only: strides are kept in metadata.json, the replay restores them).
``FLASHINFER_DUMP_INCLUDE`` / ``_EXCLUDE`` are comma lists of names with ``*`` globs, matched
against the qualified name (``rmsnorm``, ``BatchDecodeWithPagedKVCacheWrapper.run``) and the
full name (``flashinfer.norm.rmsnorm``). ``_MAX_COUNT`` calls and ``_MAX_SIZE_GB`` gigabytes
bound a process's dumps: the call that would pass either bound is not dumped, one warning says
so, and dumping stops; a dump that would leave less than 1 GiB free on the disk is refused the
same way. Every knob is read at each call.

Under CUDA-graph capture nothing is copied or written (either would sync or add work to the
graph): the call's tensors are kept by reference and written at the next call outside capture,
or by :func:`flush`, with their values at that time (after the graph ran, for example).

:func:`replay_dir` (``flashinfer replay --dir D``) re-runs each dumped call and compares its
outputs with the dumped ones: bit for bit for deterministic ops, with a tolerance otherwise.
"""

from __future__ import annotations

import datetime
import fnmatch
import importlib
import json
import os
import shutil
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from . import knobs

_FREE_MARGIN = 1 << 30  # bytes a dump must leave free on the disk


def _capturing() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


def _names(text: Optional[str]) -> List[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def selected(qualname: str, module: str) -> bool:
    """Whether ``FLASHINFER_DUMP_INCLUDE`` / ``_EXCLUDE`` let this API be dumped."""
    full = f"{module}.{qualname}"
    match = lambda pats: any(  # noqa: E731
        fnmatch.fnmatchcase(qualname, p) or fnmatch.fnmatchcase(full, p) for p in pats
    )
    include = _names(knobs.dump.include)
    if include and not match(include):
        return False
    return not match(_names(knobs.dump.exclude))


# --------------------------------------------------------------------------------------------
# Arguments <-> files
# --------------------------------------------------------------------------------------------


def _encode(name: str, value: Any, tensors: Dict[str, torch.Tensor]) -> Any:
    """A JSON description of one argument; its tensors go into ``tensors`` under ``name``."""
    if isinstance(value, torch.Tensor):
        tensors[name] = value
        return {"__tensor__": name, "shape": list(value.shape), "stride": list(value.stride()),
                "dtype": str(value.dtype).replace("torch.", ""), "device": str(value.device)}
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        items = [_encode(f"{name}.{i}", v, tensors) for i, v in enumerate(value)]
        return {"__list__": items, "tuple": isinstance(value, tuple)}
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).replace("torch.", "")}
    if isinstance(value, torch.device):
        return {"__device__": str(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and all(
        v is None or isinstance(v, (bool, int, float, str)) for v in value
    ):
        return list(value)
    return {"__unreplayable__": type(value).__qualname__}


def _decode(desc: Any, tensors: Dict[str, torch.Tensor], device: Optional[str]) -> Any:
    if isinstance(desc, dict):
        if "__tensor__" in desc:
            t = tensors[desc["__tensor__"]]
            target = device or desc["device"]
            if target.startswith("cuda") and not torch.cuda.is_available():
                target = "cpu"
            t = t.to(target)
            if list(t.stride()) != desc["stride"] and t.dim() > 0:  # safetensors: contiguous
                strided = torch.empty_strided(desc["shape"], desc["stride"], dtype=t.dtype,
                                              device=t.device)
                strided.copy_(t)
                t = strided
            return t
        if "__list__" in desc:
            items = [_decode(d, tensors, device) for d in desc["__list__"]]
            return tuple(items) if desc.get("tuple") else items
        if "__dtype__" in desc:
            return getattr(torch, desc["__dtype__"])
        if "__device__" in desc:
            return torch.device(desc["__device__"])
        if "__unreplayable__" in desc:
            raise _Unreplayable(f"argument of type {desc['__unreplayable__']} was not dumped")
    return desc


class _Unreplayable(Exception):
    pass


def _save(tensors: Dict[str, torch.Tensor], path: Path, use_safetensors: bool) -> None:
    if use_safetensors:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                  str(path.with_suffix(".safetensors")))
    else:
        torch.save({k: v.detach().cpu() for k, v in tensors.items()}, path.with_suffix(".pt"))


def _load(folder: Path, stem: str) -> Dict[str, torch.Tensor]:
    if (folder / f"{stem}.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(str(folder / f"{stem}.safetensors"))
    if (folder / f"{stem}.pt").exists():
        return torch.load(folder / f"{stem}.pt", map_location="cpu", weights_only=True)
    return {}


def _nbytes(tensors: Dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


# --------------------------------------------------------------------------------------------
# Dumping
# --------------------------------------------------------------------------------------------


@dataclass
class _Pending:
    """One call's dump, written now or, under capture, at the next flush."""

    qualname: str
    module: str
    arguments: Dict[str, Any]
    inputs: Dict[str, torch.Tensor]
    outputs: Optional[Dict[str, torch.Tensor]] = None
    result: Any = None
    status: str = "running"
    deferred: bool = False


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.bytes = 0
        self.stopped: Optional[str] = None
        self.pending: List[_Pending] = []


_state = _State()


def _stop(reason: str) -> None:
    if _state.stopped is None:
        _state.stopped = reason
        warnings.warn(f"FlashInfer level-10 dumps stopped: {reason}", RuntimeWarning,
                      stacklevel=4)


def begin(qualname: str, module: str, named: Dict[str, Any]) -> Optional[_Pending]:
    """Before a call: record its inputs (None when this call is not dumped). Never raises."""
    try:
        flush()
        if _state.stopped or not selected(qualname, module):
            return None
        tensors: Dict[str, torch.Tensor] = {}
        arguments = {k: _encode(k, v, tensors) for k, v in named.items()}
        if not _room_for(_nbytes(tensors)):  # before cloning anything
            return None
        deferred = _capturing()
        if not deferred:  # an in-place op changes its inputs: keep them as they were
            tensors = {k: v.detach().clone() for k, v in tensors.items()}
        return _Pending(qualname, module, arguments, tensors, deferred=deferred)
    except Exception as e:
        _warn_error(e)
        return None


def end(pending: Optional[_Pending], result: Any, named: Dict[str, Any],
        error: Optional[BaseException] = None) -> None:
    """After the call: add its outputs and write the dump (or queue it under capture)."""
    if pending is None:
        return
    try:
        outputs: Dict[str, torch.Tensor] = {}
        pending.result = _encode("result", result, outputs)
        for param in _inplace_params(pending.qualname):
            if param in named:
                _encode(f"arg:{param}", named[param], outputs)
        pending.status = "ok" if error is None else f"raised {type(error).__name__}: {error}"
        if pending.deferred:
            pending.outputs = outputs
            with _state.lock:
                _state.pending.append(pending)
            return
        pending.outputs = {k: v.detach().clone() for k, v in outputs.items()}
        _write(pending)
    except Exception as e:
        _warn_error(e)


def flush() -> int:
    """Write the dumps deferred during CUDA-graph capture; returns how many were written.
    Does nothing (returns 0) while the current stream is capturing."""
    if not _state.pending or _capturing():
        return 0
    with _state.lock:
        queue, _state.pending = _state.pending, []
    for p in queue:
        _write(p)
    return len(queue)


def _inplace_params(qualname: str) -> List[str]:
    from .fi_trace import template_for

    template = template_for(qualname)
    return template.mutated_params() if template is not None else []


def _argument(named: Dict[str, Any], key: str) -> Any:
    """``arg:<param>`` or ``arg:<param>.<i>`` (an item of a tuple argument) after a call."""
    param, _, index = key[4:].partition(".")
    value = named.get(param)
    return value[int(index)] if index and isinstance(value, (list, tuple)) else value


def _room_for(size: int) -> bool:
    """Whether one more dump of ``size`` bytes stays within MAX_COUNT and MAX_SIZE_GB; the
    first refusal stops dumping, with one warning."""
    if _state.stopped:
        return False
    if _state.count + 1 > knobs.dump.max_count:
        _stop(f"FLASHINFER_DUMP_MAX_COUNT={knobs.dump.max_count} calls reached")
        return False
    if _state.bytes + size > float(knobs.dump.max_size_gb) * 1e9:
        _stop(f"FLASHINFER_DUMP_MAX_SIZE_GB={knobs.dump.max_size_gb} would be passed "
              f"({_state.bytes + size} bytes)")
        return False
    return True


def _write(p: _Pending) -> None:
    size = _nbytes(p.inputs) + _nbytes(p.outputs or {})
    with _state.lock:
        if not _room_for(size):
            return
        root = Path(knobs.dump.dir)
        root.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(root).free < size + _FREE_MARGIN:
            _stop(f"less than {size + _FREE_MARGIN} bytes free under {root}")
            return
        _state.count += 1
        _state.bytes += size
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
        folder = root / f"{stamp}_pid{os.getpid()}_{p.qualname}_call{_state.count:04d}"
    folder.mkdir(parents=True, exist_ok=True)
    use_st = bool(knobs.dump.safetensors)
    _save(p.inputs, folder / "inputs", use_st)
    _save(p.outputs or {}, folder / "outputs", use_st)
    meta = {"module": p.module, "qualname": p.qualname, "arguments": p.arguments,
            "result": p.result, "status": p.status, "deferred": p.deferred,
            "format": "safetensors" if use_st else "pt", "bytes": size}
    (folder / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
    with open(root / "session.jsonl", "a") as f:  # one line per call: a quick overview
        f.write(json.dumps({"folder": folder.name, "api": f"{p.module}.{p.qualname}",
                            "status": p.status, "bytes": size}) + "\n")


_warned: set = set()


def _warn_error(e: Exception) -> None:
    """One warning per kind of failure (a bad knob would otherwise warn at every call)."""
    key = (type(e).__name__, str(e)[:100])
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"FlashInfer level-10 dump failed: {type(e).__name__}: {e}",
                      RuntimeWarning, stacklevel=4)


def reset() -> None:
    """Forget counts, the stop and deferred dumps (tests use this)."""
    with _state.lock:
        _state.count = 0
        _state.bytes = 0
        _state.stopped = None
        _state.pending = []
    _warned.clear()


# --------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    folder: str
    api: str
    status: str  # "match", "mismatch", "error", "skipped"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("match", "skipped")


def _resolve(module: str, qualname: str) -> Callable:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _compare(name: str, got: Any, want: torch.Tensor, exact: bool, rtol: float, atol: float
             ) -> Optional[str]:
    if not isinstance(got, torch.Tensor):
        return f"{name}: got {type(got).__name__}, dumped a tensor"
    got = got.detach().cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{name}: got {tuple(got.shape)} {got.dtype}, dumped {tuple(want.shape)} {want.dtype}"
    if exact or not want.is_floating_point():
        if torch.equal(got, want) or (want.is_floating_point() and torch.equal(
                torch.nan_to_num(got), torch.nan_to_num(want))
                and torch.equal(got.isnan(), want.isnan())):
            return None
        differ = int((got != want).sum())
        return f"{name}: {differ} of {want.numel()} elements differ (bit-exact comparison)"
    if torch.allclose(got.float(), want.float(), rtol=rtol, atol=atol, equal_nan=True):
        return None
    err = (got.float() - want.float()).abs().nan_to_num(float("inf")).max().item()
    return f"{name}: max abs error {err:.3g} over rtol={rtol}, atol={atol}"


def replay_call(folder: Path, device: Optional[str] = None, rtol: float = 1e-2,
                atol: float = 1e-2) -> ReplayResult:
    """Re-run one dumped call and compare its outputs with the dumped ones."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / "metadata.json").read_text())
    except (OSError, ValueError) as e:
        return ReplayResult(str(folder), "?", "error", f"metadata.json: {e}")
    api = f"{meta['module']}.{meta['qualname']}"
    if meta.get("status") != "ok":
        return ReplayResult(str(folder), api, "skipped", f"the dumped call {meta.get('status')}")
    try:
        func = _resolve(meta["module"], meta["qualname"])
        inputs = _load(folder, "inputs")
        named = {k: _decode(v, inputs, device) for k, v in meta["arguments"].items()}
    except _Unreplayable as e:
        return ReplayResult(str(folder), api, "skipped", str(e))
    except Exception as e:
        return ReplayResult(str(folder), api, "error", f"{type(e).__name__}: {e}")
    from .fi_trace import template_for

    template = template_for(meta["qualname"])
    exact = template.deterministic if template is not None else True
    if template is not None and not template.deterministic:
        if not _seeded(named):
            return ReplayResult(str(folder), api, "skipped",
                                "random op without an explicit seed and offset")
    try:
        result = _call(func, meta["qualname"], named)
    except _Unreplayable as e:
        return ReplayResult(str(folder), api, "skipped", str(e))
    except Exception as e:
        return ReplayResult(str(folder), api, "error", f"{type(e).__name__}: {e}")
    want = _load(folder, "outputs")
    problems: List[str] = []
    got_result: Dict[str, torch.Tensor] = {}
    _encode("result", result, got_result)
    for key, expected in want.items():
        if key.startswith("arg:"):
            got = _argument(named, key)
        else:
            got = got_result.get(key)
        problem = _compare(key, got, expected, exact, rtol, atol)
        if problem:
            problems.append(problem)
    if problems:
        return ReplayResult(str(folder), api, "mismatch", "; ".join(problems))
    how = "bit-exact" if exact else f"rtol={rtol}, atol={atol}"
    return ReplayResult(str(folder), api, "match", f"{len(want)} output(s), {how}")


def _seeded(named: Dict[str, Any]) -> bool:
    return named.get("seed") is not None and named.get("offset") is not None


def _call(func: Callable, qualname: str, named: Dict[str, Any]) -> Any:
    import inspect

    sig = inspect.signature(inspect.unwrap(func))
    args: List[Any] = []
    kwargs: Dict[str, Any] = {}
    for name, p in sig.parameters.items():
        if name not in named:
            continue
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            args.extend(named[name])
        elif p.kind is inspect.Parameter.POSITIONAL_ONLY:
            args.append(named[name])
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update(named[name])
        else:
            kwargs[name] = named[name]
    if "." in qualname and "self" in kwargs:
        raise _Unreplayable("a method call (its instance was not dumped)")
    return func(*args, **kwargs)


def replay_dir(directory: Path, device: Optional[str] = None, rtol: float = 1e-2,
               atol: float = 1e-2) -> List[ReplayResult]:
    """Replay every dumped call under ``directory`` in the order they were made."""
    folders = sorted(p.parent for p in Path(directory).glob("*/metadata.json"))
    results = []
    for folder in folders:
        try:
            results.append(replay_call(folder, device, rtol, atol))
        except _Unreplayable as e:
            results.append(ReplayResult(str(folder), "?", "skipped", str(e)))
    return results


def summary(results: List[ReplayResult]) -> Tuple[int, int, int, int]:
    """(match, mismatch, error, skipped) counts."""
    count = lambda s: sum(r.status == s for r in results)  # noqa: E731
    return count("match"), count("mismatch"), count("error"), count("skipped")

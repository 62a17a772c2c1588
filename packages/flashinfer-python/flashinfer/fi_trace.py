"""fi_trace: the JSON description of an API call, without running its kernel.

Every ``@flashinfer_api`` op grows ``.fi_trace(*args, **kwargs)``: it binds the call's
arguments to the op's :class:`TraceTemplate` (looked up by the op's qualified name in
:mod:`flashinfer.trace_templates`, or given as ``@flashinfer_api(trace=...)``) and returns a
dict in flashinfer-bench's *Definition* format::

    {"name": "rmsnorm_h4096_bf16", "description": ..., "op_type": "rmsnorm",
     "tags": ["fi_api:flashinfer.norm.rmsnorm"],
     "axes": {"batch_size": {"type": "var"}, "hidden_size": {"type": "const", "value": 4096}},
     "inputs": {"input": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}, ...},
     "outputs": {...}, "reference": "import torch\\n\\ndef run(input, weight, eps): ..."}

Var axes (batch sizes, token counts) are left symbolic; const axes (hidden sizes, heads,
head dims) carry the call's value, and name the file. Methods take the instance first:
``BatchDecodeWithPagedKVCacheWrapper.run.fi_trace(wrapper, q, kv_cache)``.

``FLASHINFER_TRACE_DUMP=1`` (with ``FLASHINFER_TRACE_DUMP_DIR``, default ``./fi_trace_out``)
writes one ``<name>.json`` per unique (op, shapes) while a workload runs; later calls with the
same shapes write nothing. Both are read at each call of an op whose submodule was imported with
the dump enabled (set them before the first use of an op: ``flashinfer`` imports its submodules
on first use, and at level 0 without the dump the decorator returns the op itself).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

from . import knobs
from .trace_template import Const, Shape, Tensor, TraceTemplate, Var  # noqa: F401  (public here)


class TraceError(ValueError):
    """A call that does not fit its template (wrong rank, an axis with two sizes)."""


def _dtype_name(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).replace("torch.", "")
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int32"
    return "float32"


def _pick_shape(spec: Tensor, value: Any, key: str) -> Shape:
    if not isinstance(spec.shape, dict):
        return spec.shape
    rank = value.dim() if isinstance(value, torch.Tensor) else 0
    if rank not in spec.shape:
        raise TraceError(f"{key}: rank {rank} not described (ranks {sorted(spec.shape)})")
    return spec.shape[rank]


def bind_arguments(func: Callable, args: tuple, kwargs: dict) -> Dict[str, Any]:
    """The call's arguments by parameter name, defaults filled in."""
    bound = inspect.signature(inspect.unwrap(func)).bind(*args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    for name, p in inspect.signature(inspect.unwrap(func)).parameters.items():
        if p.kind is inspect.Parameter.VAR_KEYWORD and name in named:
            named.update(named.pop(name))
    return named


def describe(template: TraceTemplate, qualname: str, module: str, named: Dict[str, Any]) -> dict:
    """The Definition JSON of one call whose arguments are ``named`` (parameter -> value)."""
    if template.extra_inputs is not None:
        named = {**named, **template.extra_inputs(named)}
    sizes: Dict[str, int] = {}
    scalars: Dict[str, Any] = {}
    used: set = set()
    inputs: Dict[str, dict] = {}
    dtypes: Dict[str, str] = {}
    for key, spec in template.inputs.items():
        value = named.get(spec.param or key)
        if value is None:
            if spec.optional:
                continue
            raise TraceError(f"{qualname}: input {key!r} is missing")
        shape = _pick_shape(spec, value, key)
        if shape is None:
            scalars[key] = value
        else:
            used.update(shape)
            dims = tuple(value.shape) if isinstance(value, torch.Tensor) else ()
            if len(dims) != len(shape):
                raise TraceError(f"{qualname}: {key} has shape {dims}, described as {list(shape)}")
            for axis, n in zip(shape, dims):
                if axis not in template.axes:
                    raise TraceError(f"{qualname}: {key} uses undeclared axis {axis!r}")
                if sizes.setdefault(axis, int(n)) != int(n):
                    raise TraceError(f"{qualname}: axis {axis!r} is {sizes[axis]} and {n}")
        dtype = spec.dtype or _dtype_name(value)
        dtypes[key] = dtype
        inputs[key] = _tensor_json(shape, dtype, spec.description)
    outputs: Dict[str, dict] = {}
    for key, spec in template.outputs.items():
        shape = spec.shape
        if isinstance(shape, dict):  # an output's rank follows the input it is named after
            ref = named.get(spec.param) if spec.param else None
            shape = _pick_shape(spec, ref, key)
        dtype = spec.dtype or "float32"
        if dtype.startswith("="):
            dtype = dtypes[dtype[1:]]
        used.update(shape or ())
        outputs[key] = _tensor_json(shape, dtype, spec.description)
    for axis, kind in template.axes.items():
        if isinstance(kind, Const) and kind.derive is not None and axis not in sizes \
                and axis in used:
            sizes[axis] = int(kind.derive({**scalars, **sizes}))
    axes: Dict[str, dict] = {}
    for axis, kind in template.axes.items():
        if axis not in used:  # an axis of another rank of the op (3-D QK-norm, say)
            continue
        entry: Dict[str, Any] = {"type": "var" if isinstance(kind, Var) else "const"}
        if isinstance(kind, Const):
            if axis not in sizes:
                raise TraceError(f"{qualname}: no input gives axis {axis!r}")
            entry["value"] = sizes[axis]
        if kind.description:
            entry["description"] = kind.description
        axes[axis] = entry
    floats = [d for d in dtypes.values() if "float" in d]
    first = floats[0] if floats else next(iter(dtypes.values()), "")
    suffix = "".join(
        f"_{template.abbrev.get(a, a)}{sizes[a]}" for a, k in template.axes.items()
        if isinstance(k, Const) and a in used
    )
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(first, first)
    return {
        "name": f"{template.name_prefix}{suffix}" + (f"_{short}" if short else ""),
        "description": template.description,
        "op_type": template.op_type,
        "tags": [f"fi_api:{module}.{qualname}"],
        "axes": axes,
        "inputs": inputs,
        "outputs": outputs,
        "reference": template.reference or _NO_REFERENCE,
        **({"constraints": list(template.constraints)} if template.constraints else {}),
    }


_NO_REFERENCE = (
    "def run(*args, **kwargs):\n"
    "    raise NotImplementedError('no pure-PyTorch reference for this op')\n"
)


def _tensor_json(shape: Shape, dtype: str, description: str) -> dict:
    out: Dict[str, Any] = {"shape": list(shape) if shape is not None else None, "dtype": dtype}
    if description:
        out["description"] = description
    return out


# --------------------------------------------------------------------------------------------
# Wiring: the decorator calls attach(); a call under FLASHINFER_TRACE_DUMP calls dump_call()
# --------------------------------------------------------------------------------------------

_explicit: Dict[str, TraceTemplate] = {}  # qualname -> template given to @flashinfer_api(trace=)
DECORATED: Dict[str, str] = {}  # qualname -> module of every decorated op (the coverage test)


def template_for(qualname: str) -> Optional[TraceTemplate]:
    """The template of the op named ``qualname`` (``rmsnorm``, ``Wrapper.run``), or None."""
    if qualname in _explicit:
        return _explicit[qualname]
    from .trace_templates import TEMPLATES

    return TEMPLATES.get(qualname)


def public_module(qualname: str, module: str) -> str:
    """The submodule users import the op from (``flashinfer.prefill``), which stays the same
    when its code moves (``flashinfer.attention...``): the tag ``fi_api:<module>.<name>``."""
    package = sys.modules.get(module.split(".")[0])
    lazy = getattr(package, "_LAZY_NAMES", {})
    head = qualname.split(".")[0]
    return f"flashinfer.{lazy[head]}" if head in lazy else module


def attach(func: Callable, trace: Optional[TraceTemplate] = None) -> Callable:
    """Record ``func`` as a public op and give it ``.fi_trace``; returns ``func`` itself."""
    qualname, module = func.__qualname__, func.__module__
    DECORATED[qualname] = module
    if trace is not None:
        _explicit[qualname] = trace

    def fi_trace(*args: Any, **kwargs: Any) -> dict:
        template = template_for(qualname)
        if template is None:
            raise NotImplementedError(f"{module}.{qualname} has no trace template")
        return describe(template, qualname, public_module(qualname, module),
                        bind_arguments(func, args, kwargs))

    fi_trace.__doc__ = f"The trace JSON of a call of {qualname} (the kernel does not run)."
    func.fi_trace = fi_trace  # type: ignore[attr-defined]
    return func


_bad_knob_warned = False


def requested_at_decoration() -> bool:
    """Whether decorated ops must be wrapped so their calls can be traced (a value of
    FLASHINFER_TRACE_DUMP that does not parse warns once and disables the dump)."""
    global _bad_knob_warned
    try:
        return bool(knobs.trace.dump)
    except ValueError as e:
        if not _bad_knob_warned:
            _bad_knob_warned = True
            warnings.warn(f"trace dump disabled: {e}", RuntimeWarning, stacklevel=3)
        return False


class _Dumper:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set = set()
        self.warned: set = set()

    def dump(self, func: Callable, args: tuple, kwargs: dict) -> Optional[Path]:
        """Write the call's JSON if its (op, shapes) is new; never raises."""
        try:
            if not knobs.trace.dump:
                return None
            desc = func.fi_trace(*args, **kwargs)
            directory = Path(knobs.trace.dump_dir)
        except Exception as e:  # a missing template or an odd call must not break the op
            self._warn_once(func.__qualname__, e)
            return None
        key = json.dumps(desc, sort_keys=True)
        with self.lock:
            if key in self.seen:
                return None
            self.seen.add(key)
            path = directory / f"{desc['name']}.json"
            n = 1
            while path.exists() and json.loads(path.read_text()) != desc:
                n += 1
                path = directory / f"{desc['name']}_{n}.json"
            if path.exists():
                return None
            try:
                directory.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(desc, indent=2) + "\n")
                os.replace(tmp, path)
            except OSError as e:
                self._warn_once("write", e)
                return None
            return path

    def _warn_once(self, what: str, e: Exception) -> None:
        if what not in self.warned:
            self.warned.add(what)
            warnings.warn(f"fi_trace: {what}: {type(e).__name__}: {e}", RuntimeWarning,
                          stacklevel=4)


_dumper = _Dumper()


def dump_call(func: Callable, args: tuple, kwargs: dict) -> Optional[Path]:
    """Called by the decorator before each call while the trace dump is on."""
    return _dumper.dump(func, args, kwargs)


def reset() -> None:
    """Forget which (op, shapes) were written (tests use this)."""
    with _dumper.lock:
        _dumper.seen.clear()
        _dumper.warned.clear()

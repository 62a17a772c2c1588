"""The parts of a trace template (:mod:`flashinfer.fi_trace` describes calls with them;
:mod:`flashinfer.trace_templates` holds one per public op)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union


@dataclass(frozen=True)
class Var:
    """An axis whose size varies between calls (batch, tokens): left symbolic."""

    description: str = ""


@dataclass(frozen=True)
class Const:
    """An axis fixed for a model (hidden size, heads, head dim): the call's value is recorded.
    ``derive`` computes it from the other axes where no input has it (``d = two_d // 2``)."""

    description: str = ""
    derive: Optional[Callable[[Dict[str, int]], int]] = None


Shape = Optional[Sequence[str]]


@dataclass(frozen=True)
class Tensor:
    """One input or output of a template.

    ``shape``: axis names, ``None`` for a scalar, or ``{rank: names}`` where the op takes
    several ranks (``0`` = a Python scalar). ``param``: the op's parameter it binds to (default:
    the template's key). ``dtype``: fixed (``"float32"``), ``"=<input>"`` (as that input), or
    None (the argument's own). ``optional``: may be None / absent (then left out of the JSON).
    For outputs, ``source`` says where the value comes from: ``"return"``, ``"return[i]"``, or
    ``"arg:<param>"`` (an argument the op writes in place).
    """

    shape: Union[Shape, Dict[int, Shape]] = None
    dtype: Optional[str] = None
    param: Optional[str] = None
    optional: bool = False
    description: str = ""
    source: str = "return"


@dataclass
class TraceTemplate:
    """How one public op's calls are described (flashinfer-bench's Definition, per call)."""

    op_type: str
    name_prefix: str
    description: str
    axes: Dict[str, Union[Var, Const]]
    inputs: Dict[str, Tensor]
    outputs: Dict[str, Tensor]
    reference: Optional[str] = None  # Python source defining run(**inputs) -> output(s)
    constraints: List[str] = field(default_factory=list)
    abbrev: Dict[str, str] = field(default_factory=dict)  # axis -> short name in file names
    deterministic: bool = True  # outputs are reproducible bit for bit (replay compares exactly)
    example: Optional[Callable[[str], Tuple[tuple, dict]]] = None  # (args, kwargs) on a device
    extra_inputs: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None  # bound -> values
    mutates: Tuple[str, ...] = ()  # parameters written in place beyond the "arg:" outputs
    order_free: bool = False  # outputs' last dim is a set (top-k): compare rows sorted

    def mutated_params(self) -> List[str]:
        """The op's parameters it writes in place (level-10 dumps save them after the call)."""
        params = [o.source[4:] for o in self.outputs.values() if o.source.startswith("arg:")]
        return params + [p for p in self.mutates if p not in params]

    def reference_fn(self) -> Optional[Callable[..., Any]]:
        """The reference's ``run``, compiled from its source (None without a reference)."""
        if not self.reference:
            return None
        namespace: Dict[str, Any] = {}
        exec(compile(self.reference, f"<reference {self.name_prefix}>", "exec"), namespace)
        return namespace["run"]

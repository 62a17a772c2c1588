"""Device queries and small helpers used by the ops and by tests.

Also the two decorators that declare where an op can run:

* :func:`supported_compute_capability` marks a requirement check with the compute capabilities
  (``major * 10 + minor``) it supports;
* :func:`backend_requirement` wraps an op with one such check per backend (plus an optional check
  common to all), validates each call against them and answers capability questions about the op
  without calling it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch

from .exceptions import BackendSupportedError

__all__ = [
    "BackendSupportedError",
    "backend_requirement",
    "ceil_div",
    "device_support_pdl",
    "get_alibi_slopes",
    "get_compute_capability",
    "round_up",
    "supported_compute_capability",
]


def _device_index(device: Union[torch.device, str, int, None]) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, torch.device) and device.type == "cuda" and device.index is not None:
        return device.index  # a tensor's device (every op's call): no new torch.device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {device}")
    return torch.cuda.current_device() if device.index is None else device.index


@functools.cache
def _capability(index: int) -> Tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def get_compute_capability(device: Union[torch.device, str, int, None] = None) -> Tuple[int, int]:
    """(major, minor) compute capability of a CUDA device, cached per device."""
    return _capability(_device_index(device))


def device_support_pdl(device: Union[torch.device, str, int, None] = None) -> bool:
    """Programmatic Dependent Launch needs SM90 or newer."""
    return get_compute_capability(device)[0] >= 9


# --------------------------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------------------------


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, without going through floats."""
    return -(-a // b)


def round_up(x: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is ``>= x``."""
    return ceil_div(x, multiple) * multiple


def get_alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi slopes of Press et al., one per attention head.

    With ``n`` the largest power of two ``<= n_heads``, head ``i < n`` gets ``2^(-8(i+1)/n)``;
    the remaining ``n_heads - n`` heads get the odd powers ``1, 3, 5, ...`` of ``2^(-4/n)``
    (the slopes of ``2n`` heads that the first ``n`` skipped).

    Parameters
    ----------
    n_heads : int
        Number of query heads, ``>= 1``.

    Returns
    -------
    torch.Tensor
        float32 ``(n_heads,)`` on the CPU.

    Examples
    --------
    >>> get_alibi_slopes(4)
    tensor([0.2500, 0.0625, 0.0156, 0.0039])
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}")
    n = 1 << (n_heads.bit_length() - 1)
    # float64 math, one rounding to float32 at the end.
    slopes = torch.pow(2.0 ** (-8.0 / n), torch.arange(1, n + 1, dtype=torch.float64))
    if n < n_heads:
        odd = torch.arange(1, 2 * (n_heads - n), 2, dtype=torch.float64)
        slopes = torch.cat([slopes, torch.pow(2.0 ** (-4.0 / n), odd)])
    return slopes.to(torch.float32)


# --------------------------------------------------------------------------------------------
# Capability and backend requirements
# --------------------------------------------------------------------------------------------


def supported_compute_capability(supported_ccs: Iterable[int]) -> Callable[[Callable], Callable]:
    """Mark a requirement check with the compute capabilities it supports.

    Parameters
    ----------
    supported_ccs : iterable of int
        Capabilities as ``major * 10 + minor`` (SM 9.0 is ``90``, SM 12.0 is ``120``).

    Returns
    -------
    A decorator that sets, on the function itself (no wrapper), ``_supported_ccs`` (a set of int)
    and ``is_compute_capability_supported(cc) -> bool``.

    Raises
    ------
    TypeError
        If ``supported_ccs`` is not iterable or holds anything but ``int`` (``bool`` included).

    Examples
    --------
    >>> @supported_compute_capability([80, 90])
    ... def _fa3_check(q, k, v, backend):
    ...     return q.shape[-1] <= 256
    >>> [_fa3_check.is_compute_capability_supported(cc) for cc in (90, 75)]
    [True, False]
    """
    try:
        ccs = list(supported_ccs)
    except TypeError:
        raise TypeError(
            f"supported_ccs must be an iterable of int, got {type(supported_ccs).__name__}"
        ) from None
    for i, cc in enumerate(ccs):
        # bool is a subclass of int; [True] is a mistake, not capability 1.
        if isinstance(cc, bool):
            raise TypeError(f"supported_ccs[{i}] must be an integer, got bool: {cc!r}")
        if not isinstance(cc, int):
            raise TypeError(
                f"supported_ccs[{i}] must be an integer, got {type(cc).__name__}: {cc!r}"
            )
    ccs_set = set(ccs)

    def decorator(check: Callable) -> Callable:
        check._supported_ccs = ccs_set
        check.is_compute_capability_supported = lambda cc: cc in check._supported_ccs
        return check

    return decorator


def _supports_cc(check: Optional[Callable], cc: int) -> bool:
    """A check without ``@supported_compute_capability`` supports no capability."""
    probe = getattr(check, "is_compute_capability_supported", None)
    return probe is not None and bool(probe(cc))


def _device_cc(args: Iterable[Any]) -> Optional[int]:
    """``major * 10 + minor`` of the first CUDA tensor among ``args``; None if there is none."""
    for value in args:
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            major, minor = get_compute_capability(value.device)
            return major * 10 + minor
    return None


def backend_requirement(
    backend_checks: Dict[str, Callable[..., bool]],
    common_check: Optional[Callable[..., bool]] = None,
    heuristic_func: Optional[Callable[..., List[str]]] = None,
) -> Callable[[Callable], Callable]:
    """Validate an op's ``backend`` argument, device capability and problem size on every call.

    Parameters
    ----------
    backend_checks : dict of str to callable
        One check per backend. A check takes the op's arguments (by name, defaults applied) and
        returns whether it can handle the problem; decorate it with
        :func:`supported_compute_capability` to declare its capabilities (a check without it
        supports none). Empty for an op with one implicit backend.
    common_check : callable, optional
        A check every call must pass. For an op without backend choices it is required and its
        ``@supported_compute_capability`` declares the op's capabilities.
    heuristic_func : callable, optional
        ``heuristic_func(suitable_backends, *args, **kwargs) -> list`` orders the backends that
        passed their checks, most preferred first, when the op is called with
        ``backend="auto"``. Without it the declaration order of ``backend_checks`` is kept.

    Returns
    -------
    A decorator. The wrapped op (``functools.wraps`` keeps name, doc and signature) accepts an
    extra keyword ``skip_check=False`` (not passed to the op) and has:

    ``is_backend_supported(backend, cc=None)``
        Whether ``backend`` exists and, if ``cc`` is given, supports that capability.
        ``ValueError`` for an op without backend choices.
    ``is_compute_capability_supported(cc)``
        Whether any backend (or, without backends, the common check) supports ``cc``.
    ``has_backend(name)``, ``has_backend_choices()``
    ``suitable_auto_backends``
        Set during a ``backend="auto"`` call (before the op body runs): the backends whose checks
        passed, ordered by ``heuristic_func``. The op reads it to pick its backend. It is one
        attribute per op, so concurrent "auto" calls from several threads race on it.

    Raises (on call)
    ----------------
    BackendSupportedError
        Unknown backend; a backend or op that does not support the device's compute capability;
        ``backend="auto"`` with no suitable backend.
    ValueError
        A check returned False ("Problem size is not supported ..."), or the decorator has
        neither backends nor a common check.

    Notes
    -----
    The capability is that of the first CUDA tensor argument. With no CUDA tensor (CPU
    arguments) the capability checks are skipped and the problem-size checks still run, so the
    op's own validation reports the wrong device. Apply ``@flashinfer_api`` *below* this
    decorator, so that the name the op's module exports is the object that carries
    ``suitable_auto_backends``.

    Examples
    --------
    >>> @supported_compute_capability([80, 86, 89, 90])
    ... def _fa2_check(q, k, v, backend):
    ...     return q.shape[-1] in (64, 128, 256)
    >>> @backend_requirement({"fa2": _fa2_check})
    ... def attention(q, k, v, backend="fa2"):
    ...     ...
    >>> attention.is_backend_supported("fa2", 90), attention.has_backend("fa3")
    (True, False)
    """

    def decorator(func: Callable) -> Callable:
        name = func.__name__
        sig = inspect.signature(func)

        def has_backend_choices() -> bool:
            return bool(backend_checks)

        def has_backend(backend: str) -> bool:
            return backend in backend_checks

        def is_backend_supported(backend: str, cc: Optional[int] = None) -> bool:
            if not backend_checks:
                raise ValueError(
                    f"Invalid is_backend_supported call: no backend choices for {name}"
                )
            if backend not in backend_checks:
                return False
            return cc is None or _supports_cc(backend_checks[backend], cc)

        def is_compute_capability_supported(cc: int) -> bool:
            if backend_checks:
                return any(_supports_cc(check, cc) for check in backend_checks.values())
            if not hasattr(common_check, "is_compute_capability_supported"):
                check_name = getattr(common_check, "__name__", repr(common_check))
                raise ValueError(
                    f"Invalid is_compute_capability_supported call: {check_name} does not have "
                    "is_compute_capability_supported decorator"
                )
            return _supports_cc(common_check, cc)

        def rank_auto_backends(cc: Optional[int], args: tuple, kwargs: dict) -> List[str]:
            if common_check is not None and not common_check(*args, **kwargs):
                return []
            suitable = []
            for backend, check in backend_checks.items():
                if cc is not None and not _supports_cc(check, cc):
                    continue
                try:
                    if check(*args, **kwargs):
                        suitable.append(backend)
                except ValueError:  # a check may reject a problem by raising, too
                    continue
            if heuristic_func is not None:
                suitable = list(heuristic_func(suitable, *args, **kwargs))
            return suitable

        def validate(args: tuple, kwargs: dict) -> None:
            if not backend_checks and common_check is None:
                raise ValueError(
                    "Invalid @backend_requirement decorator usage: no backend choices and no "
                    f"common_check for {name}"
                )
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            cargs, ckwargs = _split_bound(bound)
            cc = _device_cc(cargs + tuple(ckwargs.values()))
            backend = bound.arguments.get("backend")

            if not backend_checks:
                if cc is not None and not is_compute_capability_supported(cc):
                    supported = sorted(getattr(common_check, "_supported_ccs", ()))
                    raise BackendSupportedError(
                        f"{name} does not support compute capability {cc} (supported: {supported})"
                    )
                checks = [common_check]
            elif backend == "auto":
                suitable = rank_auto_backends(cc, cargs, ckwargs)
                if not suitable:
                    raise BackendSupportedError(
                        f"No suitable auto backends found for {name}"
                        + (f" on compute capability {cc}" if cc is not None else "")
                    )
                wrapper.suitable_auto_backends = suitable
                return
            elif backend not in backend_checks:
                raise BackendSupportedError(
                    f"{name} does not support backend '{backend}' "
                    f"(choices: {', '.join(map(repr, backend_checks))}, 'auto')"
                )
            elif cc is not None and not _supports_cc(backend_checks[backend], cc):
                supported = sorted(getattr(backend_checks[backend], "_supported_ccs", ()))
                raise BackendSupportedError(
                    f"{name} does not support backend '{backend}' on this device: the backend does "
                    f"not support compute capability {cc} (supported: {supported})"
                )
            else:
                checks = [c for c in (common_check, backend_checks[backend]) if c is not None]

            for check in checks:
                if not check(*cargs, **ckwargs):
                    where = f" with backend '{backend}'" if backend_checks else ""
                    raise ValueError(
                        f"Problem size is not supported for {name}{where} "
                        f"(rejected by {getattr(check, '__name__', repr(check))})"
                    )

        def rank_unchecked(args: tuple, kwargs: dict) -> None:
            # skip_check=True with backend="auto": nothing is raised, but the op still needs a
            # ranked list to pick from, so the checks run as rankers.
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            if bound.arguments.get("backend") == "auto":
                cargs, ckwargs = _split_bound(bound)
                cc = _device_cc(cargs + tuple(ckwargs.values()))
                wrapper.suitable_auto_backends = rank_auto_backends(cc, cargs, ckwargs)

        has_backend_param = "backend" in sig.parameters

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if not kwargs.pop("skip_check", False):
                validate(args, kwargs)
            elif backend_checks and has_backend_param:
                rank_unchecked(args, kwargs)
            return func(*args, **kwargs)

        wrapper.is_backend_supported = is_backend_supported
        wrapper.is_compute_capability_supported = is_compute_capability_supported
        wrapper.has_backend = has_backend
        wrapper.has_backend_choices = has_backend_choices
        wrapper.suitable_auto_backends = None
        return wrapper

    return decorator


def _split_bound(bound: inspect.BoundArguments) -> Tuple[tuple, dict]:
    """The bound arguments as checks receive them: by name, except what cannot be named.

    Positional-only parameters and ``*args`` (and, when there is a ``*args``, the parameters
    before it) are passed positionally, everything else by keyword, so a check may name its
    parameters in any order, as FlashInfer's checks do.
    """
    params = bound.signature.parameters.values()
    # Parameters before a *args can only be filled positionally when *args is non-empty.
    has_var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    positional = (inspect.Parameter.POSITIONAL_ONLY,) + (
        (inspect.Parameter.POSITIONAL_OR_KEYWORD,) if has_var_pos else ()
    )
    args: list = []
    kwargs: dict = {}
    for param in params:
        if param.name not in bound.arguments:
            continue
        value = bound.arguments[param.name]
        if param.kind in positional:
            args.append(value)
        elif param.kind is param.VAR_POSITIONAL:
            args.extend(value)
        elif param.kind is param.VAR_KEYWORD:
            kwargs.update(value)
        else:
            kwargs[param.name] = value
    return tuple(args), kwargs

"""flashinfer.utils: capability/backend decorators, ALiBi slopes, integer helpers."""

from __future__ import annotations

import math

import pytest
import torch

from flashinfer import exceptions, utils
from flashinfer.utils import (
    BackendSupportedError,
    backend_requirement,
    ceil_div,
    get_alibi_slopes,
    round_up,
    supported_compute_capability,
)


@pytest.fixture
def device_cc(monkeypatch):
    """Pretend the first CUDA tensor argument is on a device of a given capability (CPU runs)."""

    def set_cc(cc):
        monkeypatch.setattr(utils, "_device_cc", lambda args: cc)

    return set_cc


# ---------------------------------------------------------------------------------------------
# supported_compute_capability


def test_supported_compute_capability_marks_the_function_itself():
    def check(x, y):
        return x + y

    marked = supported_compute_capability([80, 86, 89, 90, 90])(check)
    assert marked is check
    assert check._supported_ccs == {80, 86, 89, 90}
    assert check.is_compute_capability_supported(80) is True
    assert check.is_compute_capability_supported(75) is False
    assert check(5, 10) == 15


def test_supported_compute_capability_accepts_any_iterable():
    @supported_compute_capability(cc for cc in (100, 120))
    def check():
        pass

    assert check._supported_ccs == {100, 120}


@pytest.mark.parametrize(
    "ccs, match",
    [
        (80, "must be an iterable"),
        (None, "must be an iterable"),
        (["80", "86"], r"supported_ccs\[0\] must be an integer, got str"),
        ([80.0, 86], "must be an integer, got float"),
        ([80, True], r"supported_ccs\[1\] must be an integer, got bool"),
    ],
)
def test_supported_compute_capability_rejects_bad_input(ccs, match):
    with pytest.raises(TypeError, match=match):
        supported_compute_capability(ccs)


# ---------------------------------------------------------------------------------------------
# backend_requirement: queries


@supported_compute_capability([80, 86, 89, 90])
def _cudnn_check(x, backend):
    return True


@supported_compute_capability([75, 80, 86, 89, 90])
def _cutlass_check(x, backend):
    return True


def _two_backend_kernel(common_check=None, heuristic_func=None, default="cudnn"):
    @backend_requirement(
        {"cudnn": _cudnn_check, "cutlass": _cutlass_check},
        common_check=common_check,
        heuristic_func=heuristic_func,
    )
    def my_kernel(x, backend=default):
        """Doubles x."""
        return x * 2

    return my_kernel


def test_queries_with_backends():
    k = _two_backend_kernel()
    assert k.__name__ == "my_kernel" and k.__doc__ == "Doubles x."
    assert k.is_backend_supported("cutlass") is True
    assert k.is_backend_supported("trtllm") is False
    assert k.is_backend_supported("cutlass", 75) is True
    assert k.is_backend_supported("cudnn", 75) is False
    assert k.is_backend_supported("cudnn", 80) is True
    assert k.is_compute_capability_supported(75) is True  # union over backends
    assert k.is_compute_capability_supported(70) is False
    assert k.has_backend("cudnn") is True and k.has_backend("trtllm") is False
    assert k.has_backend_choices() is True


def test_a_check_without_capabilities_supports_none():
    @backend_requirement({"plain": lambda x, backend: True})
    def k(x, backend="plain"):
        return x

    assert k.is_backend_supported("plain") is True
    assert k.is_backend_supported("plain", 90) is False
    assert k.is_compute_capability_supported(90) is False


def test_queries_without_backends():
    @supported_compute_capability([42])
    def _common_check(x):
        return True

    @backend_requirement({}, common_check=_common_check)
    def unsupported_kernel(x):
        return x * 2

    assert unsupported_kernel.is_compute_capability_supported(42) is True
    assert unsupported_kernel.is_compute_capability_supported(75) is False
    assert unsupported_kernel.has_backend_choices() is False
    assert unsupported_kernel.has_backend("random_backend") is False
    for backend, cc in [("random_backend", 42), (None, 75)]:
        with pytest.raises(
            ValueError,
            match="Invalid is_backend_supported call: no backend choices for unsupported_kernel",
        ):
            unsupported_kernel.is_backend_supported(backend, cc)


def test_common_check_without_capabilities_is_a_usage_error():
    def _bad_common_check(x):
        return True

    @backend_requirement({}, common_check=_bad_common_check)
    def bad_kernel(x):
        return x

    with pytest.raises(
        ValueError,
        match="Invalid is_compute_capability_supported call: _bad_common_check does not have "
        "is_compute_capability_supported decorator",
    ):
        bad_kernel.is_compute_capability_supported(42)


def test_no_backends_and_no_common_check_fails_on_call():
    @backend_requirement({})
    def kernel_no_common_check(x):
        return x

    with pytest.raises(
        ValueError,
        match="Invalid @backend_requirement decorator usage: no backend choices and no "
        "common_check for kernel_no_common_check",
    ):
        kernel_no_common_check(torch.ones(1))


def test_backend_supported_error_is_reexported_and_a_value_error():
    assert BackendSupportedError is exceptions.BackendSupportedError
    assert issubclass(BackendSupportedError, ValueError)
    assert issubclass(BackendSupportedError, exceptions.FlashInferError)


# ---------------------------------------------------------------------------------------------
# backend_requirement: calls (capability faked; see the gpu tests for the real one)


def test_unknown_backend(device_cc):
    device_cc(90)
    k = _two_backend_kernel()
    with pytest.raises(BackendSupportedError, match="my_kernel does not support backend 'trtllm'"):
        k(torch.ones(2), backend="trtllm")


def test_backend_that_does_not_support_the_device(device_cc):
    device_cc(75)
    k = _two_backend_kernel()
    with pytest.raises(BackendSupportedError, match="does not support compute capability 75") as e:
        k(torch.ones(2), backend="cudnn")
    assert "does not support backend 'cudnn'" in str(e.value)
    assert torch.equal(k(torch.ones(2), backend="cutlass"), torch.full((2,), 2.0))


def test_op_without_backends_on_an_unsupported_device(device_cc):
    @supported_compute_capability([42])
    def _common_check(x):
        return True

    @backend_requirement({}, common_check=_common_check)
    def k(x):
        return x

    device_cc(90)
    with pytest.raises(BackendSupportedError, match="k does not support compute capability 90"):
        k(torch.ones(1))
    device_cc(42)
    assert k(torch.ones(1)) is not None


def test_problem_size_rejected_by_common_or_backend_check(device_cc):
    device_cc(90)
    k = _two_backend_kernel(common_check=lambda x, backend: x.dim() == 2)
    assert k(torch.ones(2, 2)).shape == (2, 2)
    with pytest.raises(ValueError, match="Problem size is not supported for my_kernel"):
        k(torch.ones(2, 2, 2))
    # skip_check bypasses the checks and is not passed to the op
    assert k(torch.ones(2, 2, 2), backend="cudnn", skip_check=True).shape == (2, 2, 2)


def test_default_backend_is_applied(device_cc):
    device_cc(75)  # the default "cudnn" does not support 75
    with pytest.raises(BackendSupportedError, match="backend 'cudnn'"):
        _two_backend_kernel()(torch.ones(1))


def test_checks_receive_arguments_by_name(device_cc):
    device_cc(90)
    seen = {}

    @supported_compute_capability([90])
    def check(backend, scale, x):  # another order than the op's
        seen.update(backend=backend, scale=scale, x=x)
        return True

    @backend_requirement({"a": check})
    def k(x, scale=3.0, backend="a"):
        return x

    k("input")
    assert seen == {"backend": "a", "scale": 3.0, "x": "input"}


def test_checks_of_an_op_with_var_args(device_cc):
    device_cc(None)

    def common(first, *rest, **kw):
        return len(rest) == 2 and kw == {"z": 1}

    @backend_requirement({}, common_check=common)
    def k(first, *rest, **kw):
        return first

    assert k(0, 1, 2, z=1) == 0
    with pytest.raises(ValueError, match="Problem size is not supported"):
        k(0, 1, z=1)


def test_auto_orders_suitable_backends_by_heuristic(device_cc):
    device_cc(90)

    @supported_compute_capability([90])
    def big_only(x, backend):
        return x.shape[0] > 10

    @supported_compute_capability([90])
    def any_size(x, backend):
        return True

    @supported_compute_capability([80])
    def wrong_arch(x, backend):
        return True

    @supported_compute_capability([90])
    def rejects_by_raising(x, backend):
        raise ValueError("head_dim 96 is not supported")

    calls = []

    def prefer_last(suitable, x, backend):
        calls.append(list(suitable))
        return list(reversed(suitable))

    @backend_requirement(
        {"big": big_only, "any": any_size, "old": wrong_arch, "raises": rejects_by_raising},
        heuristic_func=prefer_last,
    )
    def k(x, backend="auto"):
        return list(k.suitable_auto_backends)

    assert k(torch.ones(20)) == ["any", "big"]
    assert k(torch.ones(2)) == ["any"]
    assert calls == [["big", "any"], ["any"]]


def test_auto_without_heuristic_keeps_declaration_order(device_cc):
    device_cc(90)
    k = _two_backend_kernel(default="auto")
    k(torch.ones(1))
    assert k.suitable_auto_backends == ["cudnn", "cutlass"]
    device_cc(75)
    k(torch.ones(1))
    assert k.suitable_auto_backends == ["cutlass"]


NO_AUTO = "No suitable auto backends found for my_kernel"


def test_auto_with_no_suitable_backend(device_cc):
    device_cc(70)
    k = _two_backend_kernel(default="auto")
    with pytest.raises(BackendSupportedError, match=NO_AUTO):
        k(torch.ones(1))
    device_cc(90)
    k = _two_backend_kernel(common_check=lambda x, backend: False, default="auto")
    with pytest.raises(BackendSupportedError, match=NO_AUTO):
        k(torch.ones(1))
    # a heuristic that drops every backend leaves none either
    k = _two_backend_kernel(heuristic_func=lambda suitable, x, backend: [], default="auto")
    with pytest.raises(BackendSupportedError, match="No suitable auto backends"):
        k(torch.ones(1))


def test_skip_check_with_auto_still_ranks(device_cc):
    device_cc(75)
    k = _two_backend_kernel(default="auto")
    k(torch.ones(1), skip_check=True)
    assert k.suitable_auto_backends == ["cutlass"]
    device_cc(70)
    k(torch.ones(1), skip_check=True)  # nothing raised; the op sees the empty list
    assert k.suitable_auto_backends == []


def test_cpu_arguments_skip_the_capability_checks():
    # No CUDA tensor: no capability; problem-size checks still run, so the op's own validation
    # can report the wrong device.
    assert utils._device_cc([torch.ones(1), 3, None]) is None
    k = _two_backend_kernel(common_check=lambda x, backend: x.dim() == 1)
    assert torch.equal(k(torch.ones(1), backend="cudnn"), torch.full((1,), 2.0))
    with pytest.raises(ValueError, match="Problem size is not supported"):
        k(torch.ones(1, 1))
    with pytest.raises(BackendSupportedError, match="does not support backend 'nope'"):
        k(torch.ones(1), backend="nope")


# ---------------------------------------------------------------------------------------------
# backend_requirement on a real device


def _real_cc() -> int:
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


@pytest.mark.gpu
def test_capability_comes_from_the_first_cuda_tensor():
    cc = _real_cc()
    assert utils._device_cc([torch.ones(1), torch.ones(1, device="cuda")]) == cc

    @supported_compute_capability([cc])
    def ok(x, y, backend):
        return True

    @supported_compute_capability([cc + 1])
    def other(x, y, backend):
        return True

    @backend_requirement({"ok": ok, "other": other})
    def k(x, y, backend="auto"):
        return k.suitable_auto_backends

    assert k(torch.ones(1), torch.ones(1, device="cuda")) == ["ok"]
    with pytest.raises(BackendSupportedError, match=f"does not support compute capability {cc}"):
        k(torch.ones(1), torch.ones(1, device="cuda"), backend="other")


@pytest.mark.gpu
def test_op_without_backends_on_the_real_device():
    @supported_compute_capability([_real_cc()])
    def _common_check(x):
        return x.shape[0] <= 1024

    @backend_requirement({}, common_check=_common_check)
    def k(x):
        return x * 2

    x = torch.ones(10, 10, device="cuda")
    assert torch.equal(k(x), x * 2)
    with pytest.raises(ValueError, match="Problem size is not supported"):
        k(torch.ones(2048, device="cuda"))


# ---------------------------------------------------------------------------------------------
# ALiBi slopes and integer helpers


def _alibi_reference(n_heads: int) -> list:
    n = 2 ** math.floor(math.log2(n_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (n_heads - n), 2)]
    return slopes


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 8, 12, 28, 32, 40, 64, 96])
def test_alibi_slopes(n_heads):
    slopes = get_alibi_slopes(n_heads)
    assert slopes.dtype == torch.float32 and slopes.shape == (n_heads,)
    expected = torch.tensor(_alibi_reference(n_heads), dtype=torch.float64).to(torch.float32)
    torch.testing.assert_close(slopes, expected, rtol=0, atol=0)


def test_alibi_slopes_known_values():
    torch.testing.assert_close(
        get_alibi_slopes(4), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])
    )
    # 12 heads: 8 powers of 1/2, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    tail = get_alibi_slopes(12)[8:]
    torch.testing.assert_close(tail, torch.tensor([2.0 ** -(k / 2) for k in (1, 3, 5, 7)]))


@pytest.mark.parametrize("bad", [0, -4, True, 2.0])
def test_alibi_slopes_rejects_bad_head_counts(bad):
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        get_alibi_slopes(bad)


@pytest.mark.parametrize(
    "a, b, q", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (2**40 + 1, 2, 2**39 + 1)]
)
def test_ceil_div(a, b, q):
    assert ceil_div(a, b) == q


@pytest.mark.parametrize(
    "x, m, r", [(0, 16, 0), (1, 16, 16), (16, 16, 16), (17, 16, 32), (100, 3, 102)]
)
def test_round_up(x, m, r):
    assert round_up(x, m) == r


# ---------------------------------------------------------------------------------------------
# Device queries


def test_get_compute_capability_rejects_a_cpu_device():
    with pytest.raises(ValueError, match="must be a CUDA device"):
        utils.get_compute_capability("cpu")


@pytest.mark.gpu
def test_device_queries_on_the_real_device():
    major, minor = torch.cuda.get_device_capability(0)
    assert utils.get_compute_capability(torch.device("cuda:0")) == (major, minor)
    assert utils.get_compute_capability(0) == (major, minor)
    assert utils.device_support_pdl("cuda") == (major >= 9)

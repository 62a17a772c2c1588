import pytest

from flashinfer.exceptions import KnobError, NoSupportedArchError
from flashinfer.jit import archs
from flashinfer.jit.archs import Arch, arch_tag, parse_arch_list, select_archs


@pytest.mark.parametrize(
    "text, expected",
    [
        ("9.0a", ["9.0a"]),
        ("8.0 9.0a", ["8.0", "9.0a"]),
        ("9.0a;8.0,8.9", ["8.0", "8.9", "9.0a"]),
        ("  10.0a  12.0 ", ["10.0a", "12.0"]),
        ("8.0+PTX", ["8.0+PTX"]),
        ("9.0a 9.0a", ["9.0a"]),
    ],
)
def test_parse(text, expected):
    assert [str(a) for a in parse_arch_list(text)] == expected


@pytest.mark.parametrize("text", ["", "  ", "sm_90", "9", "9.0b", "90a"])
def test_parse_rejects(text):
    with pytest.raises(KnobError, match="FLASHINFER_CUDA_ARCH_LIST"):
        parse_arch_list(text)


def test_gencode_and_tag():
    a = Arch(9, 0, "a")
    assert a.gencode_flags() == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert Arch(8, 0, ptx=True).gencode_flags()[-1] == "-gencode=arch=compute_80,code=compute_80"
    assert arch_tag(parse_arch_list("8.0 9.0a")) == "80_90a"


def test_visible_gpus_get_a_suffix_from_sm90():
    assert str(archs.arch_for_capability(9, 0)) == "9.0a"
    assert str(archs.arch_for_capability(10, 0)) == "10.0a"
    assert str(archs.arch_for_capability(8, 9)) == "8.9"


def test_select_by_supported_majors():
    req = parse_arch_list("8.0 9.0a 10.0a")
    assert [str(a) for a in select_archs(req, (9, 10), "m")] == ["9.0a", "10.0a"]
    assert select_archs(req, None, "m") == req
    with pytest.raises(NoSupportedArchError, match=r"module 'm' supports .*\[12\]"):
        select_archs(req, (12,), "m")


def test_no_gpu_and_no_list_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(archs, "detect_archs", lambda: [])
    with pytest.raises(NoSupportedArchError, match="FLASHINFER_CUDA_ARCH_LIST"):
        archs.requested_archs()


def test_env_list_wins_over_detection(monkeypatch):
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "8.0")
    monkeypatch.setattr(archs, "detect_archs", lambda: [Arch(9, 0, "a")])
    assert [str(a) for a in archs.requested_archs()] == ["8.0"]


def test_registered_modules_declare_their_archs(monkeypatch):
    from flashinfer import aot
    from flashinfer.jit.core import plan_build

    for spec in aot.registered_specs():
        assert spec.supported_major_versions, spec.name
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "7.5 9.0a")
    plan = plan_build(aot.registered_specs()[0])
    assert [str(a) for a in plan.archs] == ["9.0a"]  # sm_75 filtered out
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "7.0 7.5")
    with pytest.raises(NoSupportedArchError, match="7.5"):
        plan_build(aot.registered_specs()[0])

"""The sibling version check, with literal strings (JAX's check_jaxlib_version tests are the
model): parsed release tuples, never prefixes; the local label is not part of the match."""

import pytest

from flashinfer import _versions as v


@pytest.mark.parametrize(
    "text, release, pre, post, dev, local",
    [
        ("0.1.0", (0, 1, 0), None, None, None, ""),
        ("0.6.18+cu130", (0, 6, 18), None, None, None, "cu130"),
        ("1.2rc3", (1, 2), ("rc", 3), None, None, ""),
        ("1.2.0.post1", (1, 2, 0), None, 1, None, ""),
        ("1.2.0-1", (1, 2, 0), None, 1, None, ""),
        ("1.2.0.dev4", (1, 2, 0), None, None, 4, ""),
        ("v2.0a1.post2.dev3+Local_Build-7", (2, 0), ("a", 1), 2, 3, "local.build.7"),
        ("1.0.0-alpha", (1, 0, 0), ("a", 0), None, None, ""),
    ],
)
def test_parse_version(text, release, pre, post, dev, local):
    parsed = v.parse_version(text)
    assert (parsed.release, parsed.pre, parsed.post, parsed.dev, parsed.local) == (
        release, pre, post, dev, local)


@pytest.mark.parametrize("text", ["", "abc", "1.2.x", "1..2", "+cu130", None])
def test_parse_version_rejects_non_pep440(text):
    with pytest.raises(ValueError, match="PEP 440"):
        v.parse_version(text)


def test_prefix_is_not_a_match():
    """FlashInfer's string-prefix check accepted jit-cache 0.6.18+cu130 for core 0.6.1."""
    assert "0.6.18+cu130".startswith("0.6.1")
    assert not v.same_public_version("0.6.18+cu130", "0.6.1")
    msg = v.check_sibling_version("flashinfer-jit-cache", "0.6.18+cu130", "0.6.1")
    assert "0.6.18+cu130" in msg and "flashinfer-python 0.6.1" in msg
    assert "pip install" in msg and "'flashinfer-jit-cache==0.6.1'" in msg
    assert "/cu130/" in msg and "FLASHINFER_DISABLE_VERSION_CHECK=1" in msg


@pytest.mark.parametrize(
    "theirs, ours",
    [("0.6.1+cu130", "0.6.1"), ("0.6.1", "0.6.1"), ("0.6.1+cu129", "0.6.1.0"), ("1.0", "1.0.0")],
)
def test_same_public_version_matches(theirs, ours):
    assert v.check_sibling_version("flashinfer-jit-cache", theirs, ours) is None


@pytest.mark.parametrize(
    "theirs, ours",
    [
        ("0.6.2+cu130", "0.6.1"),  # newer sibling
        ("0.6.0", "0.6.1"),  # older sibling
        ("0.6.1rc1", "0.6.1"),  # a pre-release is another version
        ("0.6.1.post1", "0.6.1"),
        ("0.6.1.dev0", "0.6.1"),
        ("1!0.6.1", "0.6.1"),  # epoch
    ],
)
def test_other_versions_mismatch(theirs, ours):
    msg = v.check_sibling_version("flashinfer-cubin", theirs, ours)
    assert msg is not None and theirs in msg and ours in msg
    assert "pip install --force-reinstall --no-deps 'flashinfer-cubin==0.6.1'" in msg


_PAIRS = ["0.6.1", "0.6.1+cu130", "0.6.10", "0.6", "0.6.0", "00.6.1", "0.6.1rc1", "0.6.1.post1",
          "1!0.6.1", "0.6.1-1", "garbage", "0.6.1+cu129"]


@pytest.mark.parametrize("theirs", _PAIRS)
@pytest.mark.parametrize("ours", ["0.6.1", "0.6", "0.6.1rc1"])
def test_the_plain_release_shortcut_agrees_with_the_parser(theirs, ours):
    """Equal plain releases are decided without the parser; every verdict is the parser's."""
    try:
        same = v.parse_version(theirs).public == v.parse_version(ours).public
    except ValueError:
        same = False
    assert (v.check_sibling_version("flashinfer-jit-cache", theirs, ours) is None) == same


def test_unparsable_sibling_version_is_a_message_not_a_crash():
    msg = v.check_sibling_version("flashinfer-jit-cache", "garbage", "0.1.0")
    assert "garbage" in msg and "ignored" in msg and "'flashinfer-jit-cache==0.1.0'" in msg


def test_public_version_and_labels():
    assert v.public_version("0.1.0+cu130") == "0.1.0"
    assert v.public_version("2.0rc1.post3+x") == "2.0rc1.post3"
    assert v.cuda_label("13.0") == "cu130" and v.cuda_label("12.8.1") == "cu128"
    with pytest.raises(ValueError, match="'13'"):
        v.cuda_label("13")


@pytest.mark.parametrize(
    "built, runtime, ok",
    [
        ("13.0", "13.0", True),
        ("13.0", "13.2", True),  # minor version compatibility
        ("13.0", None, True),  # CPU torch: nothing to compare, nothing runs
        ("13.0", "12.8", False),
        ("12.9", "13.0", False),
        (None, "13.0", False),  # a manifest without a CUDA version can't be trusted
    ],
)
def test_cuda_major(built, runtime, ok):
    msg = v.check_cuda_major("flashinfer-jit-cache", "0.1.0+cu130", built, runtime)
    assert (msg is None) == ok
    if not ok:
        assert f"CUDA {built}" in msg and f"CUDA {runtime}" in msg and "ignored" in msg
        assert "'flashinfer-jit-cache==0.1.0'" in msg


def test_cuda_mismatch_points_at_the_runtime_index():
    msg = v.check_cuda_major("flashinfer-jit-cache", "0.1.0+cu130", "13.0", "12.8")
    assert f"{v.WHEEL_INDEX_BASE}/cu128/" in msg


A, B = "a" * 64, "b" * 64


def test_cubin_release_matches_by_the_pinned_manifest_hash():
    """flashinfer-cubin serves exactly when it holds the pinned manifest, whatever the version
    strings say (a post-release of flashinfer-python pins the same cubins)."""
    assert v.check_cubin_release("0.2.0", "0.2.0", A, "0.2.0", "0.2.0", A) is None
    assert v.check_cubin_release("0.2.0.post1", "0.2.0", A, "0.2.0", "0.2.0", A) is None
    # A wheel built without a release serves nothing and is no mismatch.
    assert v.check_cubin_release("0.2.0", "0.2.0", A, "0.2.0", None, None) is None


def test_cubin_of_another_release_names_both_versions_and_the_fix():
    msg = v.check_cubin_release("0.2.0", "0.2.0", A, "0.1.9", "0.1.9", B)
    assert "flashinfer-cubin 0.1.9" in msg and "flashinfer-python 0.2.0" in msg
    assert "release 0.2.0" in msg and "it is ignored" in msg
    assert "pip install --force-reinstall --no-deps 'flashinfer-cubin==0.2.0'" in msg
    assert "FLASHINFER_DISABLE_VERSION_CHECK=1 only silences this warning" in msg
    # A prefix is not a match here either.
    assert v.check_cubin_release("0.6.1", "0.6.1", A, "0.6.18", "0.6.18", B) is not None


def test_cubin_of_the_same_release_with_another_manifest_says_reinstall():
    msg = v.check_cubin_release("0.2.0", "0.2.0", A, "0.2.0", "0.2.0", B)
    assert B in msg and A in msg and "reinstall" in msg
    assert "'flashinfer-cubin==0.2.0'" in msg

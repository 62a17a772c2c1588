"""The manifest schema: round trips, and every way a manifest can be refused."""

from __future__ import annotations

import json

import pytest
from artifacthelpers import make_release, pin

from flashinfer.artifacts import ManifestError, PinError, load_manifest
from flashinfer.artifacts.manifest import (
    FileEntry,
    Index,
    Manifest,
    ParamLayout,
    check_path,
    object_path,
    sha256_hex,
)
from flashinfer.artifacts.resolve import Release

SHA = "ab" * 32
KERNEL = {
    "name": "k", "family": "rmsnorm", "symbol": "_Z1kv", "variant": {"dtype": "bfloat16", "vecs": 4},
    "launch": {"rule": "norm_rows", "dynamic_smem": 0, "params": {
        "size": 16, "align": 8, "args": [[0, 16]],
        "fields": [{"name": "p", "type": "ptr", "offset": 0}, {"name": "n", "type": "i32", "offset": 8}],
    }},
}


def doc(files, release="1.0.0", schema=1):
    return json.dumps({"schema_version": schema, "release": release, "created": "t",
                       "files": files}).encode()


def entry(path="sm_90a/x.cubin", **kw):
    return {"path": path, "sha256": SHA, "size": 3, "arch": "9.0a", "kernel": None, **kw}


def test_round_trip_is_byte_exact():
    m = Manifest.build("1.2.3", [
        FileEntry("b/y.cubin", SHA, 5, "9.0a"),
        FileEntry("a/x.cubin", "cd" * 32, 7, None),
    ], "2026-01-01T00:00:00Z")
    data = m.to_bytes()
    again = Manifest.from_bytes(data, sha256_hex(data))
    assert again == m and again.to_bytes() == data
    assert [f.path for f in again.files] == ["a/x.cubin", "b/y.cubin"]
    assert again.total_size == 12 and "a/x.cubin" in again and again.get("nope") is None


def test_kernel_metadata_round_trip():
    m = Manifest.from_bytes(doc([entry(kernel=KERNEL)]))
    k = m.files[0].kernel
    assert (k.family, k.symbol, k.rule, k.variant) == ("rmsnorm", "_Z1kv", "norm_rows",
                                                      {"dtype": "bfloat16", "vecs": 4})
    assert k.params.field("n").offset == 8 and k.params.args == ((0, 16),)
    assert Manifest.from_bytes(m.to_bytes()) == m


@pytest.mark.parametrize("path", [
    "../x.cubin", "a/../../x.cubin", "/etc/passwd", "a//b", "a/./b", ".hidden", "a\\b", "C:x",
    "", "a/", " a", "a b", "x" * 256, "a/..", "..",
])
def test_unsafe_paths_are_refused(path):
    with pytest.raises(ManifestError, match="relative"):
        check_path(path)
    with pytest.raises(ManifestError):
        Manifest.from_bytes(doc([entry(path)]))


@pytest.mark.parametrize("bad, match", [
    ({"sha256": "AB" * 32}, "sha256"),
    ({"sha256": "ab" * 31}, "sha256"),
    ({"size": -1}, "size"),
    ({"size": "3"}, "size"),
    ({"size": True}, "size"),
    ({"arch": "sm90"}, "arch"),
    ({"kernel": {**KERNEL, "symbol": "a b"}}, "symbol"),
    ({"kernel": {**KERNEL, "launch": {**KERNEL["launch"], "dynamic_smem": -1}}}, "dynamic_smem"),
])
def test_bad_entries_are_refused(bad, match):
    with pytest.raises(ManifestError, match=match):
        Manifest.from_bytes(doc([entry(**bad)]))


@pytest.mark.parametrize("fields, args, match", [
    ([{"name": "p", "type": "ptr", "offset": 4}], [[0, 16]], "misplaced"),
    ([{"name": "p", "type": "ptr", "offset": 0}, {"name": "q", "type": "i32", "offset": 4}],
     [[0, 16]], "misplaced|overlaps"),
    ([{"name": "p", "type": "ptr", "offset": 16}], [[0, 16]], "misplaced"),
    ([{"name": "p", "type": "f64", "offset": 0}], [[0, 16]], "unknown type"),
    ([{"name": "p", "type": "ptr", "offset": 0}], [[8, 16]], "bounds"),
    ([{"name": "p", "type": "ptr", "offset": 0}], [], "at least one"),
])
def test_bad_param_layouts_are_refused(fields, args, match):
    params = {"size": 16, "align": 8, "fields": fields, "args": args}
    with pytest.raises(ManifestError, match=match):
        ParamLayout.from_json(params, "t")


def test_document_level_checks():
    with pytest.raises(ManifestError, match="schema_version"):
        Manifest.from_bytes(doc([], schema=2))
    with pytest.raises(ManifestError, match="twice"):
        Manifest.from_bytes(doc([entry(), entry()]))
    with pytest.raises(ManifestError, match="sorted"):
        Manifest.from_bytes(doc([entry("b.cubin"), entry("a.cubin")]))
    with pytest.raises(ManifestError, match="release version"):
        Manifest.from_bytes(doc([], release="../1"))
    with pytest.raises(ManifestError, match="JSON"):
        Manifest.from_bytes(b"{not json")


def test_pinned_hash_is_checked_before_parsing():
    data = doc([entry()])
    with pytest.raises(PinError, match="pinned"):
        Manifest.from_bytes(data, "0" * 64)
    assert Manifest.from_bytes(data, sha256_hex(data)).release == "1.0.0"


def test_object_paths_keep_the_suffix():
    assert object_path(SHA, ".cubin") == f"objects/sha256/ab/{SHA}.cubin"
    assert FileEntry("a/k.cubin", SHA, 1).object_path.endswith(".cubin")
    assert FileEntry("a/noext", SHA, 1).object_path.endswith(SHA)
    with pytest.raises(ManifestError):
        object_path(SHA, "/../x")


def test_index_round_trip_and_checks():
    m = Manifest.build("2.0.0", [FileEntry("a.cubin", SHA, 9)], "t")
    index = Index()
    index.add(m, SHA)
    again = Index.from_bytes(index.to_bytes())
    assert again.releases["2.0.0"]["manifest_sha256"] == SHA
    with pytest.raises(ManifestError):
        Index.from_bytes(b'{"schema_version": 1, "releases": {"../x": {"manifest_sha256": "x"}}}')


def test_a_pinned_manifest_with_a_traversal_path_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    """Even a manifest whose hash *is* the pinned one cannot name a path outside the store."""
    evil = doc([entry("../escape.cubin")], release="6.6.6")
    rel = make_release(tmp_path / "repo", "6.6.6", {}, raw_manifest=evil)
    pin(monkeypatch, Release("6.6.6", sha256_hex(evil)))
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(rel.root))
    with pytest.raises(ManifestError, match="escape"):
        load_manifest(Release("6.6.6", sha256_hex(evil)))
    store = tmp_path / "store"
    assert not (store / "releases" / "6.6.6" / "manifest.json").exists()
    assert not list(tmp_path.rglob("escape*"))


def test_a_pinned_manifest_with_an_absolute_path_is_refused(tmp_path, monkeypatch):
    evil = doc([entry("/tmp/abs.cubin")], release="6.6.7")
    rel = make_release(tmp_path / "repo", "6.6.7", {}, raw_manifest=evil)
    release = Release("6.6.7", sha256_hex(evil))
    pin(monkeypatch, release)
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(rel.root))
    with pytest.raises(ManifestError, match="relative"):
        load_manifest(release)
    assert not (tmp_path / "store" / "releases" / "6.6.7").exists()


# -- hardening: hostile documents end in a ManifestError naming the field, never a traceback --

NESTED = b'{"schema_version": 1, "release": "1.0.0", "created": "t", "files": [], "x": ' + (
    b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_a_deeply_nested_manifest_is_a_manifest_error():
    with pytest.raises(ManifestError, match="nest"):
        Manifest.from_bytes(NESTED)
    with pytest.raises(ManifestError, match="nest"):
        Index.from_bytes(b'{"schema_version": 1, "releases": ' + b"[" * 100_000 + b"]" * 100_000
                         + b"}")


@pytest.mark.parametrize("schema", [1.0, True, "1", None])
def test_schema_version_must_be_the_integer_1(schema):
    """``1.0 == True == 1`` in Python: only the JSON integer 1 is schema version 1."""
    with pytest.raises(ManifestError, match="schema_version"):
        Manifest.from_bytes(doc([], schema=schema))
    with pytest.raises(ManifestError, match="schema_version"):
        Index.from_bytes(json.dumps({"schema_version": schema, "releases": {}}).encode())


@pytest.mark.parametrize("bad, match", [
    ({"size": 3.0}, "'size'"),
    ({"size": 1e400}, "Infinity"),  # json.dumps writes inf as Infinity
    ({"kernel": {**KERNEL, "launch": {**KERNEL["launch"], "dynamic_smem": 0.0}}}, "'dynamic_smem'"),
    ({"kernel": {**KERNEL, "launch": {**KERNEL["launch"], "dynamic_smem": False}}}, "'dynamic_smem'"),
    ({"kernel": {**KERNEL, "variant": {"vecs": 4.0}}}, "'vecs'"),
])
def test_numbers_must_be_json_integers(bad, match):
    with pytest.raises(ManifestError, match=match):
        Manifest.from_bytes(doc([entry(**bad)]))


def test_nan_and_infinity_are_not_json():
    data = doc([entry()]).replace(b'"size": 3', b'"size": NaN')
    with pytest.raises(ManifestError, match="NaN"):
        Manifest.from_bytes(data)


def _hostile_release(tmp_path, data: bytes, version: str = "6.6.8") -> Release:
    make_release(tmp_path / "repo", version, {}, raw_manifest=data)
    return Release(version, sha256_hex(data))


HOSTILE = [
    pytest.param(NESTED.replace(b'"1.0.0"', b'"6.6.8"'), "nest", id="nested"),
    pytest.param(doc([], release="6.6.8", schema=1.0), "schema_version", id="schema-1.0"),
    pytest.param(doc([], release="6.6.8", schema=True), "schema_version", id="schema-true"),
]


@pytest.mark.parametrize("data, match", HOSTILE)
def test_a_hostile_pinned_manifest_through_the_api(tmp_path, monkeypatch, data, match):
    """Even with its hash pinned, the manifest is refused with a ManifestError."""
    release = _hostile_release(tmp_path, data)
    pin(monkeypatch, release)
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(tmp_path / "repo"))
    with pytest.raises(ManifestError, match=match):
        load_manifest(release)
    assert not (tmp_path / "store" / "releases" / "6.6.8").exists()


@pytest.mark.parametrize("data, match", HOSTILE)
def test_a_hostile_manifest_through_the_cli(tmp_path, data, match):
    """``flashinfer artifacts download`` of it: exit 1, one line naming the field, no traceback."""
    from artifacthelpers import run_cli

    release = _hostile_release(tmp_path, data)
    proc = run_cli("artifacts", "download", "--version", release.version, "--manifest-sha256",
                   release.manifest_sha256, "--repository", str(tmp_path / "repo"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and match in proc.stderr, proc.stderr[-2000:]

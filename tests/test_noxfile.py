"""The release guards of noxfile.py, on throwaway git repositories: ``release`` refuses a dirty
tree and a version already in dist/, ``pin`` refuses a version spelled outside version.txt
(leaving the tree as it was), and the version argument must be a public X.Y.Z."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nox")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402


class Refused(Exception):
    pass


class FakeSession:
    """What the guards use of a nox session: ``error`` stops them."""

    name = "release"

    def __init__(self, posargs=()):
        self.posargs = list(posargs)
        self.logged: list[str] = []

    def error(self, message):
        raise Refused(message)

    def log(self, message):
        self.logged.append(message)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                   cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A committed tree with version.txt and one package that reads it."""
    (tmp_path / "version.txt").write_text("1.0.0\n")
    pyproject = tmp_path / "packages" / "p" / "pyproject.toml"
    pyproject.parent.mkdir(parents=True)
    pyproject.write_text('[project]\nname = "p"\ndynamic = ["version"]\n')
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "init")
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)
    monkeypatch.setattr(noxfile, "DIST", tmp_path / "dist")
    return tmp_path


def test_release_refuses_a_dirty_tree(repo):
    noxfile._refuse_dirty(FakeSession())  # clean: no error
    (repo / "notes.txt").write_text("uncommitted")
    with pytest.raises(Refused, match=r"the tree is dirty \(notes.txt\)"):
        noxfile._refuse_dirty(FakeSession())


def test_release_refuses_a_version_already_in_dist(repo):
    noxfile._refuse_existing(FakeSession(), "1.2.3")  # no dist/ yet
    (repo / "dist").mkdir()
    (repo / "dist" / "flashinfer_python-1.2.2-py3-none-any.whl").write_bytes(b"")
    noxfile._refuse_existing(FakeSession(), "1.2.3")  # another version is fine
    (repo / "dist" / "flashinfer_jit_cache-1.2.3+cu130-py3-none-manylinux_2_28_x86_64.whl"
     ).write_bytes(b"")
    with pytest.raises(Refused, match=r"dist/ already holds 1\.2\.3 .*never overwritten"):
        noxfile._refuse_existing(FakeSession(), "1.2.3")


def test_pin_writes_version_txt_only_when_nothing_else_spells_it(repo):
    session = FakeSession()
    noxfile._pin(session, "1.2.3")
    assert (repo / "version.txt").read_text() == "1.2.3\n"
    (repo / "packages" / "p" / "setup.cfg").write_text("version = 1.2.4\n")
    (repo / "packages" / "p" / "other.txt").write_text("needs 11.2.4 and 1.2.40\n")  # not 1.2.4
    _git(repo, "add", ".")
    with pytest.raises(Refused, match=r"1\.2\.4 must live in version.txt only; also in: "
                                      r"packages/p/setup.cfg:1$"):
        noxfile._pin(session, "1.2.4")
    assert (repo / "version.txt").read_text() == "1.2.3\n"  # a refused pin changes nothing


@pytest.mark.parametrize("arg", ["1.2", "1.2.3+cu130", "v1.2.3", "1.2.3.4", "latest"])
def test_version_argument_must_be_a_public_x_y_z(arg):
    with pytest.raises(Refused, match="version must be"):
        noxfile._version_arg(FakeSession([arg]))


def test_version_argument_accepts_releases_and_pre_releases():
    assert noxfile._version_arg(FakeSession(["1.2.3"])) == "1.2.3"
    assert noxfile._version_arg(FakeSession(["1.2.3rc1"])) == "1.2.3rc1"
    with pytest.raises(Refused, match="usage: nox -s release -- X.Y.Z"):
        noxfile._version_arg(FakeSession([]))

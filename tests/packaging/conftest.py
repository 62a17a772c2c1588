"""Fixtures of the packaging tests: the built set, once per session, and an install of it.

The built set comes from ``FLASHINFER_TEST_WHEELHOUSE`` when set (``nox -s tests`` and
``nox -s release`` build it once and point here), else it is built here, once, with the
jit-cache holding ``scale`` for sm_90a (about 20 s).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from wheelhelpers import VERSION, build_here, check, pip_target


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    given = os.environ.get("FLASHINFER_TEST_WHEELHOUSE")
    if given:
        return Path(given)
    if shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("building the jit-cache wheel needs nvcc (not found), or "
                    "FLASHINFER_TEST_WHEELHOUSE pointing at built wheels")
    return build_here(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="session")
def built(wheelhouse) -> dict[str, Path]:
    """The set's wheels of VERSION: distribution name -> wheel."""
    wheels, _ = check.files_of(wheelhouse, VERSION)
    by_name = {check.parse_wheel_filename(w.name)[0]: w for w in wheels}
    assert set(by_name) == set(check.SET), f"{wheelhouse} lacks wheels of {VERSION}: {by_name}"
    return by_name


@pytest.fixture(scope="session")
def installed(built, tmp_path_factory) -> Path:
    """flashinfer-python + flashinfer-jit-cache, installed from the built wheels."""
    return pip_target([built["flashinfer-python"], built["flashinfer-jit-cache"]],
                      tmp_path_factory.mktemp("installed"))

"""Write a PEP 503 "simple" index of the set, one per CUDA build.

    python tools/wheels/index.py DIST [--out DIST/whl]

For every CUDA label found among the ``flashinfer-jit-cache`` files in DIST (``+cu130`` ->
``cu130``) it writes ``OUT/<label>/index.html`` (the project list) and
``OUT/<label>/<project>/index.html`` (the files), holding that label's jit-cache files and every
file of the CUDA-independent packages (``flashinfer-python``, ``flashinfer-cubin``). Links are
relative to the page and end in ``#sha256=<hex>``, so pip verifies every download; wheels carry
``data-requires-python``. With no jit-cache file at all, one index is written at OUT.

Install from it with ``pip install --index-url file://$PWD/dist/whl/cu130/ ...`` (or serve
``dist/`` over https and use that URL).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import os
import re
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Optional

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion

CUDA_SPECIFIC = "flashinfer-jit-cache"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _requires_python(path: Path) -> Optional[str]:
    """Requires-Python of a wheel or sdist (for ``data-requires-python``), else None."""
    try:
        if path.name.endswith(".whl"):
            with zipfile.ZipFile(path) as zf:
                name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
                text = zf.read(name).decode()
        else:
            with tarfile.open(path) as tf:
                member = next(m for m in tf.getmembers() if m.name.count("/") == 1
                              and m.name.endswith("/PKG-INFO"))
                text = tf.extractfile(member).read().decode()
    except (StopIteration, OSError, zipfile.BadZipFile, tarfile.TarError, AttributeError):
        return None
    return Parser().parsestr(text).get("Requires-Python")


def distributions(dist: Path) -> list[tuple[str, str, Path]]:
    """(project, CUDA label or "", path) of every wheel and sdist in ``dist``."""
    found = []
    for path in sorted(dist.iterdir()):
        try:
            if path.name.endswith(".whl"):
                name, version, _, _ = parse_wheel_filename(path.name)
            elif path.name.endswith(".tar.gz"):
                name, version = parse_sdist_filename(path.name)
            else:
                continue
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        cuda_specific = canonicalize_name(name) == CUDA_SPECIFIC
        label = (version.local or "") if cuda_specific else ""
        if cuda_specific and not re.fullmatch(r"cu\d+", label):
            print(f"skipping {path.name}: a jit-cache without a +cuNNN label", file=sys.stderr)
            continue
        found.append((canonicalize_name(name), label, path))
    return found


def _page(title: str, links: list[str]) -> str:
    body = "\n".join(links)
    return (
        "<!DOCTYPE html>\n<html>\n<head><meta name=\"pypi:repository-version\" content=\"1.0\">"
        f"<title>{html.escape(title)}</title></head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def write_index(dist: Path, out: Path) -> dict[str, Path]:
    """Write the indexes; returns CUDA label (or "" for the single index) -> index root."""
    entries = distributions(dist)
    labels = sorted({label for _, label, _ in entries if label}) or [""]
    roots = {}
    digests = {path: _sha256(path) for _, _, path in entries}
    for label in labels:
        root = out / label if label else out
        projects: dict[str, list[Path]] = {}
        for project, file_label, path in entries:
            if file_label in ("", label):
                projects.setdefault(project, []).append(path)
        root.mkdir(parents=True, exist_ok=True)
        links = [f'<a href="{html.escape(p)}/">{html.escape(p)}</a>' for p in sorted(projects)]
        (root / "index.html").write_text(_page(f"Simple index ({label or 'all'})", links))
        for project, paths in sorted(projects.items()):
            page_dir = root / project
            page_dir.mkdir(exist_ok=True)
            links = []
            for path in sorted(paths, key=lambda p: p.name):
                href = os.path.relpath(path, page_dir) + f"#sha256={digests[path]}"
                rp = _requires_python(path)
                attr = f' data-requires-python="{html.escape(rp)}"' if rp else ""
                links.append(f'<a href="{html.escape(href)}"{attr}>{html.escape(path.name)}</a>')
            (page_dir / "index.html").write_text(_page(f"Links for {project}", links))
        roots[label] = root
    return roots


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dist", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: DIST/whl")
    args = parser.parse_args(argv)
    roots = write_index(args.dist, args.out or args.dist / "whl")
    for label, root in roots.items():
        print(f"{label or 'index'}: {root.resolve().as_uri()}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

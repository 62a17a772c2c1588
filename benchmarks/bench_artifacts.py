"""Artifact client throughput on this (CPU) machine, over loopback: download and verify a release
of >= 200 MB, and the ceilings to judge them by, measured in the same run.

    python benchmarks/bench_artifacts.py --mb 256 --out benchmarks/results/<date>-cpu-artifacts.json

- download: ``download_release`` (what ``flashinfer artifacts download`` runs) from
  tools/artifact_server.py in its own process (sendfile from the page cache), through requests,
  hashing as it streams, into the store (temp file + rename), with 1 and 4 files at a time;
- verify: ``Store.check`` over every file (what ``flashinfer artifacts verify`` runs);
- ceilings: sha256 over bytes in memory (the hash alone), reading the files (cat), and copying
  them on the same disk (read + write: what "disk-bound" means for a download).

The repository and the store are on the same filesystem (the worst case: the disk does both
sides). Files are in the page cache on the server side (written just before), as they would be
on a busy mirror.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages" / "flashinfer-python"))
sys.path.insert(0, str(ROOT / "tools"))

from flashinfer.artifacts import resolve  # noqa: E402
from flashinfer.artifacts.manifest import FileEntry, Index, Manifest, manifest_path, sha256_hex  # noqa: E402
from flashinfer.artifacts.resolve import Release, download_release  # noqa: E402
from flashinfer.artifacts.store import Store  # noqa: E402


def make_release(root: Path, total_mb: int, files: int) -> Release:
    size = total_mb * (1 << 20) // files
    entries = []
    for i in range(files):
        blob = os.urandom(size)
        e = FileEntry(f"sm_90a/bench/k{i:02d}.cubin", sha256_hex(blob), size, "9.0a")
        p = root / e.object_path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(blob)
        entries.append(e)
    m = Manifest.build("9.9.9", entries)
    data = m.to_bytes()
    (root / manifest_path("9.9.9")).parent.mkdir(parents=True, exist_ok=True)
    (root / manifest_path("9.9.9")).write_bytes(data)
    index = Index()
    index.add(m, sha256_hex(data))
    (root / "index.json").write_bytes(index.to_bytes())
    return Release("9.9.9", sha256_hex(data))


def _files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "objects").rglob("*") if p.is_file())


def mbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e6, 1)


def ceilings(repo: Path, scratch: Path, total: int) -> dict:
    out = {}
    buf = os.urandom(64 << 20)
    t = time.perf_counter()
    for _ in range(4):
        hashlib.sha256(buf).digest()
    out["sha256_memory_MBps"] = mbps(4 * len(buf), time.perf_counter() - t)
    t = time.perf_counter()
    for p in _files(repo):
        with open(p, "rb") as f:
            while f.read(4 << 20):
                pass
    out["read_files_MBps"] = mbps(total, time.perf_counter() - t)
    dest = scratch / "copy"
    dest.mkdir()
    t = time.perf_counter()
    for p in _files(repo):
        shutil.copyfile(p, dest / p.name)
    out["copy_files_same_disk_MBps"] = mbps(total, time.perf_counter() - t)
    shutil.rmtree(dest)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256, help="release size (>= 200 for the issue)")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where the repo and store go")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    load_before = os.getloadavg()  # the machine is shared: say how busy it was
    base = Path(tempfile.mkdtemp(prefix="fi-bench-", dir=args.dir))
    repo = base / "repo"
    release = make_release(repo, args.mb, args.files)
    total = sum(p.stat().st_size for p in _files(repo))
    server = subprocess.Popen([sys.executable, str(ROOT / "tools" / "artifact_server.py"), str(repo)],
                              stdout=subprocess.PIPE, text=True)
    url = server.stdout.readline().strip()
    results: dict = {"release_bytes": total, "files": args.files, "repeat": args.repeat}
    try:
        for jobs in (1, 4):
            times = []
            for r in range(args.repeat):
                store = Store(base / f"store-{jobs}-{r}")
                resolve.clear_manifest_cache()
                t = time.perf_counter()
                counts = download_release(release, None, store, [url], jobs=jobs)
                times.append(time.perf_counter() - t)
                assert counts["downloaded"] == args.files, counts
                if r < args.repeat - 1:
                    shutil.rmtree(store.root)
            results[f"download_jobs{jobs}_s"] = [round(x, 3) for x in times]
            results[f"download_jobs{jobs}_MBps_median"] = mbps(total, statistics.median(times))
        store = Store(base / f"store-4-{args.repeat - 1}")
        manifest = resolve.load_manifest(release, store, False)
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            states = [store.check(e) for e in manifest.files]
            times.append(time.perf_counter() - t)
            assert set(states) == {"present"}, states
        results["verify_s"] = [round(x, 3) for x in times]
        results["verify_MBps_median"] = mbps(total, statistics.median(times))
        results["ceilings"] = ceilings(repo, base, total)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(base, ignore_errors=True)
    import requests
    import schema  # benchmarks/schema.py
    import urllib3

    doc = schema.record(
        "check", "artifacts",
        {
            "name": "cpu", "cpu": _cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "requests": requests.__version__, "urllib3": urllib3.__version__,
            "filesystem": _fs(base.parent),
            "loadavg_1_5_15_before": [round(x, 2) for x in load_before],
            "loadavg_1_5_15_after": [round(x, 2) for x in os.getloadavg()],
        },
        commit=subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip(),
        date=datetime.date.today().isoformat(),
        note="artifact client: loopback download and verify throughput (CPU machine)",
        targets={"download_MBps": ">= 500 (disk-bound)", "verify_MBps": ">= 1000"},
        results=results,
    )
    print(json.dumps(doc, indent=1))
    if args.out:
        schema.write(args.out, doc)
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _fs(path: Path) -> str:
    out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True).stdout.splitlines()
    return out[-1].split()[1] if len(out) > 1 else "unknown"


if __name__ == "__main__":
    sys.exit(main())

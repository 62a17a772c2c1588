"""Four processes download one release at once: one consistent store, each file fetched once."""

from __future__ import annotations

import collections
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from artifact_server import Fault, RepoServer
from artifacthelpers import leftovers, make_release


def test_four_processes_download_the_same_release(tmp_path):
    files = {f"sm_90a/k/{i:02d}.cubin": 200_000 + i for i in range(24)}
    files["sm_90a/k/big.cubin"] = 6 << 20
    rel = make_release(tmp_path / "repo", "5.5.5", files)
    store = tmp_path / "store"
    import flashinfer

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(flashinfer.__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p
    )
    env["FLASHINFER_DOWNLOAD_BACKOFF"] = "0.01"
    # A little latency per file so the four processes really overlap.
    with RepoServer(rel.root, [Fault("slow", match="objects/*", delay=0.02, times=-1)]) as server:
        cmd = [sys.executable, "-m", "flashinfer", "artifacts", "download", "--version", "5.5.5",
               "--manifest-sha256", rel.sha256, "--repository", server.url, "--dest", str(store)]
        procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(4)]
        outputs = [p.communicate(timeout=300) for p in procs]
        results = [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]
        log = list(server.log)
    for rc, _, err in results:
        assert rc == 0, err
    downloaded = sum(int(out.split(": ", 1)[1].split(" downloaded")[0]) for _, out, _ in results)
    assert downloaded == len(files)  # between them, every file was downloaded exactly once
    gets = collections.Counter(path for path, _ in log)
    assert all(n == 1 for path, n in gets.items() if path.startswith("objects/")), gets
    assert gets["releases/5.5.5/manifest.json"] == 1
    for entry in rel.manifest.files:
        data = (store / entry.object_path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry.sha256
    assert leftovers(store) == []


def test_a_download_killed_mid_file_leaves_nothing_the_next_one_keeps(tmp_path):
    """A process killed while downloading leaves its temp file; the next download of that file
    (holding the file's lock, so the owner is known dead) deletes it and starts clean."""
    import signal
    import time

    rel = make_release(tmp_path / "repo", "5.5.6", {"sm_90a/k/big.cubin": 8 << 20})
    store = tmp_path / "store"
    import flashinfer

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(flashinfer.__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p
    )
    cmd = [sys.executable, "-m", "flashinfer", "artifacts", "download", "--version", "5.5.6",
           "--manifest-sha256", rel.sha256, "--dest", str(store)]
    # The server stalls after half the file, long enough to kill the client there.
    with RepoServer(rel.root, [Fault("stall", match="objects/*", at=4 << 20, delay=30)]) as server:
        proc = subprocess.Popen([*cmd, "--repository", server.url], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        partials: list = []
        while time.time() < deadline and not any(p.stat().st_size for p in partials):
            partials = list((store / ".tmp").glob("*.part")) if (store / ".tmp").exists() else []
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert partials and all(p.exists() for p in partials)  # what a killed process leaves
    with RepoServer(rel.root) as server:
        r = subprocess.run([*cmd, "--repository", server.url], env=env, capture_output=True,
                           text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert leftovers(store) == []
    (entry,) = rel.manifest.files
    assert hashlib.sha256((store / entry.object_path).read_bytes()).hexdigest() == entry.sha256

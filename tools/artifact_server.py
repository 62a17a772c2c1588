"""A loopback HTTP server for a repository directory, with Range support and fault injection.

Used by tests/artifacts (faults: a connection dropped mid-file, a short body, a flipped byte, an
error status, a server slower than the client's timeout, one that trickles a byte at a time, a
server that ignores Range) and by
benchmarks/bench_artifacts.py (plain serving, ``sendfile`` from the page cache). It also serves
https (``tls=``) and answers proxy requests (absolute URLs), for the CA-bundle and proxy tests.

    with RepoServer(root, [Fault("drop", match="*.cubin", at=1000)]) as server:
        ...  # server.url, server.log

As a program: ``python tools/artifact_server.py DIR [--port N]`` serves DIR until interrupted.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional, Sequence


@dataclass
class Fault:
    """One injected fault, applied to the first ``times`` requests whose path matches.

    kind: ``drop`` (announce the full length, send ``at`` bytes, cut the connection), ``stall``
    (send ``at`` bytes, wait ``delay`` s, send the rest), ``short``
    (a consistent response with only ``at`` bytes), ``flip`` (invert the byte at ``at``),
    ``trickle`` (one byte every ``delay`` s, at most ``at`` bytes, then cut the connection: a
    server that never stalls long enough for a read timeout but never finishes either),
    ``status`` (answer ``status`` with no body), ``slow`` (wait ``delay`` s before the body),
    ``ignore_range`` (answer 200 with the whole file even to a Range request).
    """

    kind: str
    match: str = "*"
    times: int = 1  # -1: every request
    at: int = 0
    status: int = 404
    delay: float = 0.0


_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real server
    server: "_Server"

    def log_message(self, fmt, *args):  # quiet
        pass

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        # A proxy request carries the absolute URL (GET http://host/path): serve its path, so
        # this server can stand in as an HTTP proxy too (``targets`` keeps what was asked).
        path = urllib.parse.unquote(urllib.parse.urlparse(self.path).path).lstrip("/")
        rng = self.headers.get("Range")
        self.server.record(path, rng, self.path)
        fault = self.server.take_fault(path)
        file = (self.server.root / path).resolve()
        if fault is not None and fault.kind == "status":
            return self._empty(fault.status)
        if self.server.root not in file.parents or not file.is_file():
            return self._empty(404)
        size = file.stat().st_size
        start, end = 0, size
        if rng and not (fault is not None and fault.kind == "ignore_range"):
            m = _RANGE.match(rng.strip())
            if not m:
                return self._empty(416)
            start = int(m.group(1))
            end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            if start >= size:
                return self._empty(416, {"Content-Range": f"bytes */{size}"})
        length = end - start
        announced = length
        if fault is not None and fault.kind == "short":
            announced = length = min(length, fault.at)
        self.send_response(206 if start or end != size else 200)
        if start or end != size:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.send_header("Content-Length", str(announced))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if head:
            return
        if fault is not None and fault.kind == "slow":
            self.wfile.flush()
            time.sleep(fault.delay)
        with open(file, "rb") as f:
            if fault is not None and fault.kind == "drop":
                f.seek(start)
                self.wfile.write(f.read(min(fault.at, length)))
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if fault is not None and fault.kind == "stall":
                f.seek(start)
                self.wfile.write(f.read(min(fault.at, length)))
                self.wfile.flush()
                time.sleep(fault.delay)
                self.wfile.write(f.read(max(length - fault.at, 0)))
                return
            if fault is not None and fault.kind == "trickle":
                f.seek(start)
                for byte in f.read(min(fault.at, length)):
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(fault.delay)
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if fault is not None and fault.kind == "flip":
                f.seek(start)
                data = bytearray(f.read(length))
                if 0 <= fault.at < len(data):
                    data[fault.at] ^= 0xFF
                self.wfile.write(bytes(data))
                return
            self.wfile.flush()
            sent = 0
            while sent < length:  # sendfile: page cache -> socket, no copies through Python
                n = self.connection.sendfile(f, start + sent, length - sent)
                if not n:
                    break
                sent += n

    def _empty(self, code: int, headers: Optional[dict] = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, root: Path, faults: Sequence[Fault], port: int = 0,
                 tls: Optional[tuple[Path, Path]] = None):
        self.root = Path(root).resolve()
        self.faults = list(faults)
        self.log: list[tuple[str, Optional[str]]] = []
        self.targets: list[str] = []
        self._lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)
        if tls is not None:  # https: (certificate chain, key) files in PEM
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*map(str, tls))
            self.socket = ctx.wrap_socket(self.socket, server_side=True)

    def handle_error(self, request, client_address) -> None:
        pass  # injected faults break connections on purpose; the client's view is what's tested

    def record(self, path: str, rng: Optional[str], target: str = "") -> None:
        with self._lock:
            self.log.append((path, rng))
            self.targets.append(target)

    def take_fault(self, path: str) -> Optional[Fault]:
        with self._lock:
            for fault in self.faults:
                if fault.times != 0 and fnmatch.fnmatch(path, fault.match):
                    if fault.times > 0:
                        fault.times -= 1
                    return fault
        return None


class RepoServer:
    """Serve ``root`` on 127.0.0.1 from a background thread (a context manager)."""

    def __init__(self, root: Path, faults: Sequence[Fault] = (), port: int = 0,
                 tls: Optional[tuple[Path, Path]] = None):
        self._server = _Server(root, faults, port, tls)
        self._scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{self._scheme}://{host}:{port}"

    @property
    def log(self) -> list[tuple[str, Optional[str]]]:
        return self._server.log

    @property
    def targets(self) -> list[str]:
        """The request targets as sent: ``/path``, or ``http://host/path`` through a proxy."""
        return self._server.targets

    @property
    def faults(self) -> list[Fault]:
        return self._server.faults

    def start(self) -> "RepoServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "RepoServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve an artifact repository directory over HTTP.")
    ap.add_argument("root", type=Path)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    server = RepoServer(args.root, port=args.port).start()
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

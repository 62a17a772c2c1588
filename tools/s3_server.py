"""moto's standalone S3 server on loopback, for tests and local trials of ``s3://`` repositories.

    with MotoS3() as s3:
        s3.create_bucket("flashinfer-artifacts")
        os.environ.update(s3.env)   # boto3 then talks to it: AWS_ENDPOINT_URL, fake credentials

The server is a separate process (``python -m moto.server``), driven only over HTTP by boto3,
as a real S3-compatible service would be.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from typing import Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    def __init__(self, port: Optional[int] = None, startup_timeout: float = 30.0):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.startup_timeout = startup_timeout
        self._proc: Optional[subprocess.Popen] = None

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto3 at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self) -> "MotoS3":
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + self.startup_timeout
        while time.time() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto.server exited with {self._proc.returncode}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto.server did not start within {self.startup_timeout}s")

    def client(self):
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
            aws_secret_access_key="testing", region_name="us-east-1",
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> "MotoS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""Artifact repository backends: a directory (or ``file://``), http(s) through requests, and S3
(``s3://bucket/prefix``) through boto3. requests and boto3 are imported on first use.

A backend only moves bytes; it never decides what is valid. Reads are streams of chunks from an
offset (a resumed download asks for the rest of a file); errors come back classified, so the
download loop (``fetch.py``) can tell "retry here" (:class:`TransientError`) from "try the next
repository" (:class:`NotFoundError`, :class:`RepositoryError`). Writes (publishing, mirroring) are
conditional: an existing object is never overwritten.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

from .. import knobs
from .._filelock import file_lock
from ..knobs import parse_repository_list, repository_problem  # noqa: F401  (re-exported)
from .errors import NotFoundError, PublishConflictError, RepositoryError, TransientError

CHUNK = 1 << 20
#: Files above this size go to S3 as multipart uploads (S3 allows single PUTs up to 5 GB, but a
#: dropped 5 GB PUT restarts from zero; 64 MB parts retry on their own).
MULTIPART_THRESHOLD = 64 << 20
MULTIPART_CHUNK = 64 << 20


class DeadlineExceeded(Exception):
    """A read went past the deadline it was given (``fetch.py`` turns it into a
    :class:`~flashinfer.artifacts.errors.DownloadError` naming FLASHINFER_DOWNLOAD_DEADLINE)."""


def remaining(deadline: Optional[float], where: str) -> Optional[float]:
    """Seconds left until ``deadline`` (a ``time.monotonic()`` value; None: no deadline)."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded(where)
    return left


def until(chunks: Iterator[bytes], deadline: Optional[float], where: str) -> Iterator[bytes]:
    """``chunks``, cut with :class:`DeadlineExceeded` once ``deadline`` has passed (checked as
    each chunk arrives: a server that trickles a byte at a time never trips a read timeout)."""
    for chunk in chunks:
        remaining(deadline, where)
        yield chunk


class Stream:
    """An open read: ``start`` is where the bytes begin (0 if the server ignored a range
    request), ``length`` the number of bytes that will follow if known, ``chunks`` the data."""

    def __init__(self, start: int, length: Optional[int], chunks: Iterator[bytes], close=None):
        self.start = start
        self.length = length
        self.chunks = chunks
        self._close = close

    def close(self) -> None:
        if self._close is not None:
            self._close()


class Repository:
    """The interface every backend implements."""

    url: str

    def open(self, path: str, offset: int = 0, deadline: Optional[float] = None) -> Stream:
        """Open ``path`` for reading from byte ``offset``; a backend that waits on the network
        waits no longer than ``deadline`` (a ``time.monotonic()`` value) for an answer."""
        raise NotImplementedError

    def read(self, path: str, limit: int = 64 << 20, deadline: Optional[float] = None) -> bytes:
        """A small file (manifest, index), whole, in one attempt, by ``deadline`` (raises
        :class:`DeadlineExceeded` after it)."""
        stream = self.open(path, 0, deadline)
        try:
            out = bytearray()
            for chunk in until(stream.chunks, deadline, f"{self.shown}/{path}"):
                out += chunk
                if len(out) > limit:
                    raise RepositoryError(f"{self.shown}/{path} is larger than {limit} bytes")
            return bytes(out)
        finally:
            stream.close()

    def exists(self, path: str) -> Optional[int]:
        """The size of ``path`` if it exists, else None."""
        raise NotImplementedError

    def put_if_absent(self, path: str, src: Path) -> bool:
        """Store the file ``src`` at ``path`` unless something is there; True if written."""
        raise RepositoryError(f"{self.shown} is read-only (publish to a directory or s3:// URL)")

    def put_bytes_if_absent(self, path: str, data: bytes) -> bool:
        with tempfile.NamedTemporaryFile(delete=False) as f:
            f.write(data)
        try:
            return self.put_if_absent(path, Path(f.name))
        finally:
            os.unlink(f.name)

    def update(self, path: str, mutate) -> bytes:
        """Read-modify-write of a small shared file (the index), safe against concurrent writers:
        ``mutate(old_bytes_or_None) -> new_bytes``."""
        raise RepositoryError(f"{self.shown} is read-only")

    @property
    def shown(self) -> str:
        """``url`` as messages show it: without credentials (:func:`flashinfer.knobs.redact`)."""
        return knobs.redact(self.url)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.shown!r})"


# ---------------------------------------------------------------------------------------------
# Directory
# ---------------------------------------------------------------------------------------------


def _regular(file: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a file")
        raise RepositoryError(
            f"{file} is not a regular file ({kind}); a directory repository serves regular "
            "files only"
        )


class DirectoryRepository(Repository):
    """A repository in a local directory (an offline mirror, or the staging area)."""

    def __init__(self, root: Path, url: Optional[str] = None):
        self.root = Path(root)
        self.url = url or str(root)

    def file(self, path: str) -> Path:
        return self.root / path

    def open(self, path: str, offset: int = 0, deadline: Optional[float] = None) -> Stream:
        """Only a regular file is read (after following symlinks): opening a FIFO blocks until
        a writer comes, a device may never end, so both are refused before being opened. The
        open itself is non-blocking and checked again, in case the name changed in between."""
        file = self.file(path)
        try:
            _regular(file, os.stat(file).st_mode)
            fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise NotFoundError(f"{file} does not exist") from None
        except OSError as e:
            raise RepositoryError(f"cannot read {file}: {e}") from None
        try:
            st = os.fstat(fd)
            _regular(file, st.st_mode)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        f = os.fdopen(fd, "rb")
        size = st.st_size
        f.seek(offset)

        def chunks() -> Iterator[bytes]:
            while True:
                data = f.read(CHUNK)
                if not data:
                    return
                yield data

        return Stream(offset, max(size - offset, 0), chunks(), f.close)

    def exists(self, path: str) -> Optional[int]:
        p = self.file(path)
        return p.stat().st_size if p.is_file() else None

    def put_if_absent(self, path: str, src: Path) -> bool:
        dest = self.file(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            shutil.copyfile(src, tmp)
            # A hard link publishes atomically and fails if the name exists (no overwrite, no
            # window where a reader sees half a file).
            os.link(tmp, dest)
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno in (errno.EPERM, errno.ENOTSUP, errno.EXDEV):  # no hard links here
                with contextlib.suppress(FileExistsError):
                    fd = os.open(dest, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                    os.close(fd)
                    os.replace(tmp, dest)
                    return True
                return False
            raise RepositoryError(f"cannot write {dest}: {e}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def update(self, path: str, mutate) -> bytes:
        dest = self.file(path)
        with file_lock(dest.parent / f".{dest.name}.lock"):
            old = dest.read_bytes() if dest.is_file() else None
            new = mutate(old)
            tmp = dest.parent / f".{dest.name}.{os.getpid()}.tmp"
            tmp.write_bytes(new)
            os.replace(tmp, dest)
            return new


# ---------------------------------------------------------------------------------------------
# HTTP(S)
# ---------------------------------------------------------------------------------------------

_SESSIONS = threading.local()


def _http_session():
    """One requests.Session per thread (connection reuse; Session is not thread-safe)."""
    session = getattr(_SESSIONS, "session", None)
    if session is None:
        try:
            import requests
        except ImportError:
            raise RepositoryError(
                "http(s) repositories need the 'requests' package: pip install requests"
            ) from None
        session = requests.Session()
        # trust_env (the default) honours HTTP(S)_PROXY, NO_PROXY and ALL_PROXY.
        session.headers["User-Agent"] = "flashinfer-artifacts"
        _SESSIONS.session = session
    return session


class HttpRepository(Repository):
    """A repository served over http(s). Downloads stream; resumes use ``Range``."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def _url(self, path: str) -> str:
        return f"{self.url}/{urllib.parse.quote(path)}"

    def _shown(self, path: str, error: Optional[BaseException] = None) -> str:
        """Where ``path`` is, for messages (no credentials), with ``error`` when given."""
        where = f"{self.shown}/{urllib.parse.quote(path)}"
        return f"{where}: {type(error).__name__}: {knobs.redact(str(error))}" if error else where

    def _request(self, path: str, offset: int, method: str = "GET",
                 deadline: Optional[float] = None):
        import requests

        headers = {"Accept-Encoding": "identity"}  # sizes and ranges are of the stored bytes
        if offset:
            headers["Range"] = f"bytes={offset}-"
        timeout = knobs.artifacts.download_timeout
        left = remaining(deadline, self._shown(path))
        if left is not None:  # a silent server is cut at the deadline, not a timeout later
            timeout = min(timeout, left)
        ca = knobs.artifacts.ca_bundle
        try:
            resp = _http_session().request(
                method, self._url(path), headers=headers, stream=True, timeout=(timeout, timeout),
                verify=str(ca) if ca else True, allow_redirects=True,
            )
        except requests.exceptions.SSLError as e:
            # A certificate that does not verify will not verify on a retry either.
            raise RepositoryError(
                f"{self._shown(path, e)}; remedy: if the repository (or a proxy in between) uses "
                "a private CA, set REQUESTS_CA_BUNDLE (or SSL_CERT_FILE) to its certificate bundle"
            ) from None
        except (requests.ConnectionError, requests.Timeout) as e:
            raise TransientError(self._shown(path, e)) from None
        except requests.RequestException as e:
            raise RepositoryError(self._shown(path, e)) from None
        code = resp.status_code
        if code in (200, 206):
            return resp
        resp.close()
        where = f"{self._shown(path)}: HTTP {code}"
        if code in (404, 410):
            raise NotFoundError(where)
        if code == 429 or code >= 500:
            raise TransientError(where)
        if code == 416:  # resuming past the end: the repository's copy is shorter than ours
            raise RepositoryError(f"{where} (its copy is shorter than the bytes already received)")
        raise RepositoryError(where)

    def open(self, path: str, offset: int = 0, deadline: Optional[float] = None) -> Stream:
        import requests
        from urllib3.exceptions import HTTPError as Urllib3Error

        resp = self._request(path, offset, deadline=deadline)
        start = 0
        if resp.status_code == 206:
            content_range = resp.headers.get("Content-Range", "")
            try:
                start = int(content_range.split()[1].split("-")[0])
            except (IndexError, ValueError):
                resp.close()
                raise TransientError(
                    f"{self._shown(path)}: bad Content-Range {content_range!r}"
                ) from None
        length = resp.headers.get("Content-Length")
        where = self._shown(path)

        raw = resp.raw
        # read1 returns what has arrived; read(n) (urllib3 2.x) keeps reading until it has n
        # bytes and, if the connection drops first, raises and loses them, and with them the
        # point to resume from. urllib3 1.x has no read1, and its read(n) returns early.
        read = raw.read1 if hasattr(raw, "read1") else raw.read

        def chunks() -> Iterator[bytes]:
            try:
                while True:
                    data = read(CHUNK, decode_content=False)
                    if not data:
                        return
                    yield data
            except (requests.RequestException, Urllib3Error, OSError) as e:
                raise TransientError(f"{where}: {type(e).__name__}: {knobs.redact(str(e))}") from None

        return Stream(start, int(length) if length else None, chunks(), resp.close)

    def exists(self, path: str) -> Optional[int]:
        try:
            resp = self._request(path, 0, "HEAD")
        except NotFoundError:
            return None
        resp.close()
        length = resp.headers.get("Content-Length")
        return int(length) if length else 0


# ---------------------------------------------------------------------------------------------
# S3
# ---------------------------------------------------------------------------------------------


class S3Repository(Repository):
    """``s3://bucket/prefix`` through boto3; the endpoint and credentials come from the standard
    AWS variables and files (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``...)."""

    def __init__(self, url: str):
        parsed = urllib.parse.urlparse(url)
        if not parsed.netloc:
            raise RepositoryError(f"{url!r}: an S3 repository is s3://bucket[/prefix]")
        self.url = url.rstrip("/")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self._client = None

    def key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    @property
    def client(self):
        if self._client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise RepositoryError(
                    f"{self.shown}: s3 repositories need boto3: pip install 'flashinfer-python[s3]'"
                ) from None
            timeout = knobs.artifacts.download_timeout
            # Our own loop retries (and resumes); botocore's retries would restart from zero.
            config = Config(
                connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1}
            )
            self._client = boto3.client("s3", config=config)
        return self._client

    def _classify(self, e: Exception, path: str) -> Exception:
        from botocore.exceptions import BotoCoreError, ClientError

        where = f"{self.shown}/{path}"
        if isinstance(e, ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                return NotFoundError(f"{where}: {code or status}")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return PublishConflictError(f"{where}: exists (conditional write refused)")
            if status >= 500 or code in ("SlowDown", "RequestTimeout", "InternalError"):
                return TransientError(f"{where}: {code} ({status})")
            return RepositoryError(f"{where}: {code} ({status}): {err.get('Message', '')}")
        if isinstance(e, BotoCoreError):
            return TransientError(f"{where}: {type(e).__name__}: {e}")
        return e

    def open(self, path: str, offset: int = 0, deadline: Optional[float] = None) -> Stream:
        """``deadline`` is checked as chunks arrive (:func:`until`, by the caller); botocore's
        timeouts are per client."""
        from botocore.exceptions import BotoCoreError, ClientError

        kwargs = {"Bucket": self.bucket, "Key": self.key(path)}
        if offset:
            kwargs["Range"] = f"bytes={offset}-"
        try:
            resp = self.client.get_object(**kwargs)
        except (BotoCoreError, ClientError) as e:
            raise self._classify(e, path) from None
        from urllib3.exceptions import HTTPError as Urllib3Error

        body = resp["Body"]
        start = offset if resp.get("ContentRange") else 0
        # What has arrived, as for http: botocore's read(n) waits for all n bytes, so a server
        # trickling a byte a second would hold one read (and the deadline check between chunks)
        # for days. The size and hash are checked by the caller, as for every backend.
        read1 = getattr(getattr(body, "_raw_stream", None), "read1", None)

        def chunks() -> Iterator[bytes]:
            try:
                if read1 is None:
                    yield from body.iter_chunks(CHUNK)
                    return
                while True:
                    data = read1(CHUNK, decode_content=False)
                    if not data:
                        return
                    yield data
            except (BotoCoreError, ClientError, Urllib3Error, OSError) as e:
                raise TransientError(f"{self.shown}/{path}: {type(e).__name__}: {e}") from None

        return Stream(start, resp.get("ContentLength"), chunks(), body.close)

    def exists(self, path: str) -> Optional[int]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key(path))
        except (BotoCoreError, ClientError) as e:
            err = self._classify(e, path)
            if isinstance(err, NotFoundError):
                return None
            raise err from None
        return int(head["ContentLength"])

    def put_if_absent(self, path: str, src: Path) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.key(path)
        size = src.stat().st_size
        try:
            if size <= MULTIPART_THRESHOLD:
                with open(src, "rb") as f:
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=f, IfNoneMatch="*")
            else:
                self._multipart(key, src)
            return True
        except (BotoCoreError, ClientError) as e:
            err = self._classify(e, path)
            if isinstance(err, PublishConflictError):
                return False
            raise err from None

    def _multipart(self, key: str, src: Path) -> None:
        """Upload in parts; the completion is conditional, so an existing object survives."""
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)
        upload_id = upload["UploadId"]
        try:
            parts = []
            with open(src, "rb") as f:
                number = 1
                while True:
                    data = f.read(MULTIPART_CHUNK)
                    if not data:
                        break
                    part = self.client.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number,
                        Body=data,
                    )
                    parts.append({"ETag": part["ETag"], "PartNumber": number})
                    number += 1
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": parts}, IfNoneMatch="*",
            )
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise

    def update(self, path: str, mutate) -> bytes:
        """Optimistic concurrency: write with If-Match on the ETag we read (If-None-Match when
        there was none) and start over when another writer got in first."""
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.key(path)
        for _ in range(20):
            try:
                got = self.client.get_object(Bucket=self.bucket, Key=key)
                old, etag = got["Body"].read(), got["ETag"]
            except (BotoCoreError, ClientError) as e:
                err = self._classify(e, path)
                if not isinstance(err, NotFoundError):
                    raise err from None
                old, etag = None, None
            new = mutate(old)
            cond = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=new, **cond)
                return new
            except (BotoCoreError, ClientError) as e:
                err = self._classify(e, path)
                if not isinstance(err, PublishConflictError):
                    raise err from None
        raise PublishConflictError(f"{self.shown}/{path}: too many concurrent updates; try again")


# ---------------------------------------------------------------------------------------------


_SCHEMES = "use https://host, http://host, s3://bucket[/prefix], file:///path or a directory path"


def open_repository(url: str) -> Repository:
    """The backend for a repository URL: ``s3://``, ``http(s)://``, ``file://`` or a path.

    Raises
    ------
    RepositoryError
        ``url`` names no repository (:func:`repository_problem` says why).
    """
    url = url.strip()
    problem = repository_problem(url)
    if problem:
        raise RepositoryError(f"repository {url!r}: {problem}; {_SCHEMES}")
    parsed = urllib.parse.urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return HttpRepository(url)
    if scheme == "s3":
        return S3Repository(url)
    if scheme == "file":
        return DirectoryRepository(Path(urllib.request.url2pathname(parsed.path)), url)
    return DirectoryRepository(Path(url).expanduser(), url)

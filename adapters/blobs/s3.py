"""``S3BlobStore``: large values as objects in S3-compatible object storage (AWS S3, MinIO, Ceph, R2, ...).

A :class:`~pipelines.engine.blobs.BlobStore` on boto3, AWS's own SDK
(``pip install phaserunner[s3]``; litellm already depends on it), imported
at a store's first request, so nothing else pays for it::

    from adapters.blobs.s3 import S3BlobStore
    from adapters.offload import OffloadingStorage

    blobs = S3BlobStore("my-bucket", prefix="agents/blobs", region="eu-west-1")
    # or: S3BlobStore.from_url("s3://my-bucket/agents/blobs?endpoint=http://127.0.0.1:9000")
    storage = OffloadingStorage(RedisStorage.from_url(url), blobs)

Layout: ``<prefix>/job-<job id>/<name>``, one object per blob, the name the
SHA-256 of its content (:func:`~pipelines.engine.blobs.blob_name`), so a job's
blobs are one key prefix: ``delete_job`` lists it and deletes what it lists
(bulk deletes), and the orphan sweep lists ``<prefix>/job-`` once.

Credentials come from the constructor or boto3's standard chain
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_PROFILE``, instance and container
credentials). They are kept only inside the closure that builds the client:
``repr`` shows the bucket, prefix and endpoint, and an endpoint or URL
carrying a user name or password is refused.

Why boto3 and not obstore: obstore's Rust runtime does not survive
``fork()``. Once a process has made one request through it, every request
in a child forked from it (an RQ work-horse, after the worker's retention
sweep deleted a job's blobs in the parent) hangs for good, whatever its
timeouts. This store builds one boto3 client per process (a new one after a
fork, never the parent's connection pool), which forks cleanly. fsspec's
s3fs was the other candidate; its aiobotocore pins a botocore older than the
one litellm requires.

Errors: the endpoint unreachable, timing out or answering 5xx after
``max_retries`` is :class:`~pipelines.engine.errors.StorageUnavailableError` (a turn
that meets it is retried later, like a Redis outage); a bucket that does not
exist, a malformed bucket name, prefix or URL is
:class:`~pipelines.engine.errors.ConfigurationError`; anything else the
server refuses (credentials, permissions) is
:class:`~pipelines.engine.errors.StorageError`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlsplit

from pipelines.engine.blobs import check_blob_name
from pipelines.engine.errors import ConfigurationError, InvalidInputError, StorageError, StorageUnavailableError
from pipelines.engine.models import validate_job_id

__all__ = ["S3BlobStore"]

_DIR_PREFIX = "job-"  # the same per-job folder name as DirectoryBlobStore's
# S3's rules for new bucket names: 3-63 of lower-case letters, digits, '.' and '-', a letter or digit at each end.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,200}")
_URL_OPTIONS = ("endpoint", "region")
_MESSAGE_CHARS = 300
_DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes
_NO_BUCKET = "NoSuchBucket"
_NOT_FOUND = ("NoSuchKey", "404")
_REFUSED_CREDENTIALS = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                        "InvalidToken", "403")


def _check_prefix(prefix: str) -> str:
    """``prefix`` without its outer slashes, if every segment is plain (no '.', '..', spaces or '%')."""
    if not isinstance(prefix, str):
        raise ConfigurationError(f"the S3 prefix must be a string, got {type(prefix).__name__}")
    stripped = prefix.strip("/")
    for segment in stripped.split("/") if stripped else ():
        if not _SEGMENT.fullmatch(segment) or segment in (".", ".."):
            raise ConfigurationError(f"bad S3 prefix {prefix!r}: segments are 1-200 of [A-Za-z0-9._-], "
                                     "not '.' or '..', joined by '/'")
    return stripped


def _check_endpoint(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"bad S3 endpoint {endpoint[:100]!r}: expected http(s)://host[:port]")
    if parts.username is not None or parts.password is not None:
        # Never echo it back: it holds a secret.
        raise ConfigurationError("the S3 endpoint carries credentials; pass access_key_id / secret_access_key "
                                 "(or set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) instead")
    try:
        parts.port  # noqa: B018 - a non-numeric port raises here, at configuration time
    except ValueError as exc:
        raise ConfigurationError(f"bad S3 endpoint {endpoint[:100]!r}: {exc}") from exc
    return endpoint.rstrip("/")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= _MESSAGE_CHARS else line[:_MESSAGE_CHARS] + "..."


class S3BlobStore:
    """Blobs as objects ``<prefix>/job-<job id>/<name>`` in an S3-compatible bucket (see the module docstring).

    ``bucket``: an existing bucket. ``prefix``: where under it (default
    ``"pipelines"``; ``""`` for the bucket's root). ``endpoint``: the server
    for anything but AWS itself (``http://`` allowed: the choice is yours;
    path-style requests). ``region``, ``access_key_id``,
    ``secret_access_key``, ``session_token``: given here or found by boto3's
    standard chain. ``timeout`` and ``connect_timeout`` (seconds) bound one
    request's reads and its connect, ``max_retries`` the retries of a failed
    one, so a dead endpoint is reported in bounded time.
    """

    def __init__(self, bucket: str, *, prefix: str = "pipelines", endpoint: str | None = None,
                 region: str | None = None, access_key_id: str | None = None, secret_access_key: str | None = None,
                 session_token: str | None = None, timeout: float = 60.0, connect_timeout: float = 5.0,
                 max_retries: int = 3) -> None:
        if not isinstance(bucket, str) or not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ConfigurationError(f"bad S3 bucket name {str(bucket)[:100]!r}: 3-63 of [a-z0-9.-], "
                                     "a letter or digit at each end")
        for name, seconds in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
                raise ConfigurationError(f"{name} must be a number of seconds > 0, got {seconds!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigurationError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if (access_key_id is None) != (secret_access_key is None):
            raise ConfigurationError("give both access_key_id and secret_access_key, or neither (boto3's chain)")
        self.bucket = bucket
        self.prefix = _check_prefix(prefix)
        self.endpoint = None if endpoint is None else _check_endpoint(endpoint)
        self._base = f"{self.prefix}/" if self.prefix else ""
        self._make_client = _client_factory(self.endpoint, region, access_key_id, secret_access_key, session_token,
                                            timeout=timeout, connect_timeout=connect_timeout, max_retries=max_retries)
        self._client: Any = None
        self._client_pid = 0
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3BlobStore:
        """A store from ``s3://bucket[/prefix][?endpoint=http://host:port&region=name]``.

        ``options`` are the constructor's keywords (credentials among them);
        a URL with a user name, password or other query key is refused.
        """
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.hostname:
            raise ConfigurationError(f"bad S3 URL {url[:100]!r}: expected s3://bucket[/prefix][?endpoint=...]")
        if parts.username is not None or parts.password is not None:
            raise ConfigurationError("the S3 URL carries credentials; pass access_key_id / secret_access_key "
                                     "(or set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) instead")
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
        unknown = sorted(set(query) - set(_URL_OPTIONS))
        if unknown or any(len(v) != 1 for v in query.values()):
            raise ConfigurationError(f"bad S3 URL query: the keys it takes are {', '.join(_URL_OPTIONS)}, "
                                     f"each once (got {', '.join(unknown) or 'a repeated key'})")
        settings: dict[str, Any] = {k: v[0] for k, v in query.items()}
        if parts.path.strip("/"):
            settings["prefix"] = parts.path
        # netloc, not hostname (which lower-cases): a bucket spelled with upper case is refused, not folded.
        return cls(parts.netloc, **(settings | options))

    def __repr__(self) -> str:
        where = f", endpoint={self.endpoint!r}" if self.endpoint else ""
        return f"S3BlobStore(bucket={self.bucket!r}, prefix={self.prefix!r}{where})"

    # --- the client: one per process -------------------------------------------------------
    def _s3(self) -> Any:
        """This process's client, built at its first request (boto3 imported then, credentials resolved then).

        A forked child builds its own: sharing the parent's connection pool
        would interleave two processes' requests on one socket.
        """
        pid = os.getpid()
        if self._client is None or self._client_pid != pid:
            with self._lock:
                if self._client is None or self._client_pid != pid:
                    self._client = self._make_client()
                    self._client_pid = pid
        return self._client

    # --- keys ------------------------------------------------------------------------------
    def _job_dir(self, job_id: str) -> str:
        return f"{self._base}{_DIR_PREFIX}{validate_job_id(job_id)}/"

    def _parse(self, path: str) -> tuple[str, str] | None:
        """(job id, blob name) of a key this store wrote, else ``None`` (foreign objects under the prefix)."""
        rest = path[len(self._base):] if path.startswith(self._base) else None
        if rest is None or not rest.startswith(_DIR_PREFIX) or rest.count("/") != 1:
            return None
        folder, name = rest.split("/")
        try:
            return validate_job_id(folder[len(_DIR_PREFIX):]), check_blob_name(name)
        except InvalidInputError:
            return None

    def _fail(self, exc: Exception, what: str) -> NoReturn:
        """Raise the project's error for a boto3 failure (its first line: no secrets are in botocore's messages)."""
        if isinstance(exc, ConfigurationError | StorageError):
            raise exc
        message = _first_line(exc)
        where = f"S3 bucket {self.bucket!r}" + (f" at {self.endpoint}" if self.endpoint else "")
        code, status = _code_and_status(exc)
        if code == _NO_BUCKET:
            raise ConfigurationError(f"{what}: {where} does not exist") from exc
        if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            raise ConfigurationError(f"{what}: no S3 credentials: pass access_key_id / secret_access_key or set "
                                     "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY") from exc
        if code in _REFUSED_CREDENTIALS:
            raise StorageError(f"{what}: {where} refused the credentials: {message}") from exc
        if status is None or status >= 500:
            # No answer (refused, reset, timed out) or a server error, after the retries.
            raise StorageUnavailableError(f"{what}: {where} unreachable: {message}") from exc
        raise StorageError(f"{what}: {where} refused: {message}") from exc

    # --- the port ----------------------------------------------------------------------------
    def put(self, job_id: str, name: str, data: bytes) -> None:
        """Write the object (one PUT: a reader sees all of it or none).

        It is written again if it is there: the same bytes (it is named by
        them), and a fresh modification time, so the orphan sweep (by age)
        never takes a blob that a create retried after a crash is about to
        reference again.
        """
        key = self._job_dir(job_id) + check_blob_name(name)
        try:
            self._s3().put_object(Bucket=self.bucket, Key=key, Body=bytes(data))
        except Exception as exc:  # noqa: BLE001 - mapped to the project's errors, never swallowed
            self._fail(exc, f"writing blob {name} of job {job_id!r}")

    def get(self, job_id: str, name: str) -> bytes | None:
        """The stored bytes, or ``None``."""
        key = self._job_dir(job_id) + check_blob_name(name)
        try:
            return bytes(self._s3().get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except Exception as exc:  # noqa: BLE001 - mapped to the project's errors, never swallowed
            if _code_and_status(exc)[0] in _NOT_FOUND:
                return None
            self._fail(exc, f"reading blob {name} of job {job_id!r}")

    def _keys(self, prefix: str) -> Iterator[tuple[str, float]]:
        """(key, modified at) of every object whose key starts with ``prefix``, a page (1,000) at a time."""
        pages = self._s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", ()):
                yield str(item["Key"]), float(item["LastModified"].timestamp())

    def delete_job(self, job_id: str) -> int:
        """List the job's key prefix and delete every object in it (bulk deletes); how many blobs went."""
        folder = self._job_dir(job_id)
        try:
            keys = [key for key, _ in self._keys(folder)]
            for i in range(0, len(keys), _DELETE_BATCH):
                batch = [{"Key": k} for k in keys[i:i + _DELETE_BATCH]]
                answer = self._s3().delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
                if answer.get("Errors"):
                    first = answer["Errors"][0]
                    raise StorageError(f"deleting the blobs of job {job_id!r}: {len(answer['Errors'])} not "
                                       f"deleted, the first {first.get('Key')!r}: {first.get('Code')}")
        except Exception as exc:  # noqa: BLE001 - mapped to the project's errors, never swallowed
            self._fail(exc, f"deleting the blobs of job {job_id!r}")
        return sum(1 for k in keys if self._parse(k) is not None)

    def job_ids(self, older_than: float = 0.0) -> Iterator[str]:
        """Jobs with blobs, none modified in the last ``older_than`` seconds (one listing of ``<prefix>/job-``).

        Ages come from the server's modification times, so a clock far off
        the server's shifts them; the sweep's default of an hour leaves room.
        """
        newest: dict[str, float] = {}
        try:
            for key, stamp in self._keys(self._base + _DIR_PREFIX):
                parsed = self._parse(key)
                if parsed is not None:
                    newest[parsed[0]] = max(stamp, newest.get(parsed[0], stamp))
        except Exception as exc:  # noqa: BLE001 - mapped to the project's errors, never swallowed
            self._fail(exc, "listing the blob store")
        cut = time.time() - older_than
        return iter(sorted(job for job, stamp in newest.items() if stamp <= cut))


class _NoSigningDumps(logging.Filter):
    """Drops botocore's DEBUG dumps of the requests it signs and sends.

    They carry the ``X-Amz-Security-Token`` header (a secret) and a put's
    whole body (up to ``max_blob_bytes`` of someone's data) into any handler
    a DEBUG-level application has. Only these two loggers, only DEBUG.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.DEBUG


_SIGNING_FILTER = _NoSigningDumps()


def _code_and_status(exc: BaseException) -> tuple[str | None, int | None]:
    """The S3 error code and HTTP status of a botocore ``ClientError`` (``None``s for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None, None
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return (None if code is None else str(code)), (status if isinstance(status, int) else None)


def _client_factory(endpoint: str | None, region: str | None, access_key_id: str | None,
                    secret_access_key: str | None, session_token: str | None, *, timeout: float,
                    connect_timeout: float, max_retries: int) -> Callable[[], Any]:
    """What builds a client, holding the credentials in its closure (not on the store: no repr, no vars)."""

    def make() -> Any:
        try:
            import boto3.session
            from botocore.config import Config
        except ImportError as exc:
            raise ConfigurationError("S3BlobStore needs boto3: pip install 'phaserunner[s3]'") from exc
        options: dict[str, Any] = {
            "connect_timeout": connect_timeout, "read_timeout": timeout,
            "retries": {"mode": "standard", "total_max_attempts": max_retries + 1},
        }
        if endpoint is not None:
            # S3-compatible servers: path-style URLs (no bucket DNS names), and checksums only where S3 requires
            # them (several servers refuse the CRC headers botocore sends by default; reads check the SHA-256).
            options |= {"s3": {"addressing_style": "path"}, "request_checksum_calculation": "when_required",
                        "response_checksum_validation": "when_required"}
        # Once per process however many stores: a logger keeps one filter object only once.
        for name in ("botocore.auth", "botocore.endpoint"):
            logging.getLogger(name).addFilter(_SIGNING_FILTER)
        try:
            session = boto3.session.Session(aws_access_key_id=access_key_id,
                                            aws_secret_access_key=secret_access_key,
                                            aws_session_token=session_token, region_name=region)
            return session.client("s3", endpoint_url=endpoint, config=Config(**options))
        except Exception as exc:  # boto3's setup errors have no common base of their own
            raise ConfigurationError(f"cannot configure the S3 client: {_first_line(exc)}") from exc

    return make

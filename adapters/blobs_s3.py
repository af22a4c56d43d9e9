"""``S3BlobStore``: large values as objects in S3-compatible object storage (AWS S3, MinIO, Ceph, R2, ...).

A :class:`~pipelines.engine.blobs.BlobStore` on `obstore <https://developmentseed.org/obstore/>`_
(``pip install phaserunner[s3]``), imported only when a store is built, so
nothing else pays for it::

    from adapters.blobs_s3 import S3BlobStore
    from adapters.offload import OffloadingStorage

    blobs = S3BlobStore("my-bucket", prefix="agents/blobs", region="eu-west-1")
    # or: S3BlobStore.from_url("s3://my-bucket/agents/blobs?endpoint=http://127.0.0.1:9000")
    storage = OffloadingStorage(RedisStorage.from_url(url), blobs)

Layout: ``<prefix>/job-<job id>/<name>``, one object per blob, the name the
SHA-256 of its content (:func:`~pipelines.engine.blobs.blob_name`), so a job's
blobs are one key prefix: ``delete_job`` lists it and deletes what it lists
(bulk deletes), and the orphan sweep lists ``<prefix>/`` once.

Credentials come from the constructor or the standard AWS sources that
obstore reads (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``, instance and
container credentials). They are handed to the client and not kept on the
store: ``repr`` shows the bucket, prefix and endpoint only, and an endpoint
or URL carrying a user name or password is refused.

Errors: the endpoint unreachable, timing out or answering 5xx after the
retries is :class:`~pipelines.engine.errors.StorageUnavailableError` (a turn
that meets it is retried later, like a Redis outage); a bucket that does not
exist, a malformed bucket name, prefix or URL is
:class:`~pipelines.engine.errors.ConfigurationError`; anything else the
server refuses (credentials, permissions) is
:class:`~pipelines.engine.errors.StorageError`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta
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
_MESSAGE_CHARS = 300  # obstore's messages carry the server's whole XML answer and a debug dump


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
    for anything but AWS itself (``http://`` allowed: the choice is yours);
    ``region``, ``access_key_id``, ``secret_access_key``, ``session_token``:
    given here or read from the environment by obstore. ``timeout`` and
    ``connect_timeout`` (seconds) bound one request, ``max_retries`` and
    ``retry_timeout`` (seconds) the retries of a failed one, so a dead
    endpoint is reported in bounded time rather than after obstore's default
    of three minutes.
    """

    def __init__(self, bucket: str, *, prefix: str = "pipelines", endpoint: str | None = None,
                 region: str | None = None, access_key_id: str | None = None, secret_access_key: str | None = None,
                 session_token: str | None = None, timeout: float = 60.0, connect_timeout: float = 5.0,
                 max_retries: int = 3, retry_timeout: float = 30.0) -> None:
        if not isinstance(bucket, str) or not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ConfigurationError(f"bad S3 bucket name {str(bucket)[:100]!r}: 3-63 of [a-z0-9.-], "
                                     "a letter or digit at each end")
        for name, seconds in (("timeout", timeout), ("connect_timeout", connect_timeout),
                              ("retry_timeout", retry_timeout)):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
                raise ConfigurationError(f"{name} must be a number of seconds > 0, got {seconds!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigurationError(f"max_retries must be an int >= 0, got {max_retries!r}")
        self.bucket = bucket
        self.prefix = _check_prefix(prefix)
        self.endpoint = None if endpoint is None else _check_endpoint(endpoint)
        self._base = f"{self.prefix}/" if self.prefix else ""
        self._obstore, self._errors, store_cls = self._import()
        config: dict[str, str] = {}
        for key, value in (("endpoint", self.endpoint), ("region", region), ("access_key_id", access_key_id),
                           ("secret_access_key", secret_access_key), ("session_token", session_token)):
            if value is not None:
                config[key] = value
        client: dict[str, Any] = {"timeout": timedelta(seconds=timeout),
                                  "connect_timeout": timedelta(seconds=connect_timeout)}
        if self.endpoint is not None and self.endpoint.startswith("http://"):
            client["allow_http"] = True  # an explicit http:// endpoint (a local MinIO, moto) says so already
        try:
            # Only the client keeps the credentials; nothing on self holds them.
            self._store = store_cls(bucket, config=config, client_options=client,
                                    retry_config={"max_retries": max_retries,
                                                  "retry_timeout": timedelta(seconds=retry_timeout)})
        except Exception as exc:  # obstore's builder errors have no common base but Exception
            raise ConfigurationError(f"cannot configure S3 bucket {bucket!r}: {_first_line(exc)}") from exc

    @staticmethod
    def _import() -> tuple[Any, Any, Any]:
        try:
            import obstore
            import obstore.exceptions
            from obstore.store import S3Store
        except ImportError as exc:
            raise ConfigurationError("S3BlobStore needs obstore: pip install 'phaserunner[s3]'") from exc
        return obstore, obstore.exceptions, S3Store

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
        """Raise the project's error for an obstore failure (its first line only: no XML dump, no debug)."""
        message = _first_line(exc)
        where = f"S3 bucket {self.bucket!r}" + (f" at {self.endpoint}" if self.endpoint else "")
        if "NoSuchBucket" in str(exc):
            raise ConfigurationError(f"{what}: {where} does not exist") from exc
        if isinstance(exc, self._errors.PermissionDeniedError | self._errors.UnauthenticatedError):
            raise StorageError(f"{what}: {where} refused the credentials: {message}") from exc
        status = re.search(r"non-2xx status code: (\d{3})", str(exc))
        if status is None or status.group(1).startswith("5"):
            # No answer (refused, reset, timed out) or a server error, after obstore's retries.
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
            self._obstore.put(self._store, key, bytes(data))
        except Exception as exc:  # noqa: BLE001 - mapped to the project's errors, never swallowed
            self._fail(exc, f"writing blob {name} of job {job_id!r}")

    def get(self, job_id: str, name: str) -> bytes | None:
        """The stored bytes, or ``None``."""
        key = self._job_dir(job_id) + check_blob_name(name)
        try:
            return bytes(self._obstore.get(self._store, key).bytes())
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                self._fail(exc, f"reading blob {name} of job {job_id!r}")
            return None
        except Exception as exc:  # noqa: BLE001 - mapped to the project's errors, never swallowed
            self._fail(exc, f"reading blob {name} of job {job_id!r}")

    def delete_job(self, job_id: str) -> int:
        """List the job's key prefix and delete every object in it (bulk deletes); how many blobs went."""
        folder = self._job_dir(job_id)
        try:
            paths = [meta["path"] for batch in self._obstore.list(self._store, prefix=folder) for meta in batch]
            if paths:
                self._obstore.delete(self._store, paths)
        except Exception as exc:  # noqa: BLE001 - mapped to the project's errors, never swallowed
            self._fail(exc, f"deleting the blobs of job {job_id!r}")
        return sum(1 for p in paths if self._parse(p) is not None)

    def job_ids(self, older_than: float = 0.0) -> Iterator[str]:
        """Jobs with blobs, none modified in the last ``older_than`` seconds (one listing of ``<prefix>/``).

        Ages come from the server's modification times, so a clock far off
        the server's shifts them; the sweep's default of an hour leaves room.
        """
        newest: dict[str, float] = {}
        try:
            # obstore lists whole path segments (``<prefix>/``), not a key's leading characters: list the
            # prefix and keep what parses as ``job-<id>/<name>``.
            for batch in self._obstore.list(self._store, prefix=self.prefix or None):
                for meta in batch:
                    parsed = self._parse(meta["path"])
                    if parsed is not None:
                        stamp = meta["last_modified"].timestamp()
                        newest[parsed[0]] = max(stamp, newest.get(parsed[0], stamp))
        except Exception as exc:  # noqa: BLE001 - mapped to the project's errors, never swallowed
            self._fail(exc, "listing the blob store")
        cut = time.time() - older_than
        return iter(sorted(job for job, stamp in newest.items() if stamp <= cut))

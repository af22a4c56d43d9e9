"""Large values out of the transcript: the blob store port and the reference format.

A transcript message, an inbox message or a journaled step result whose JSON
text passes a threshold (default 64 KiB) is written once to a
:class:`BlobStore`, named by the SHA-256 of its text, and storage keeps a
small reference in its place::

    {"role": "tool", "tool_call_id": "c1", "$blob": {"name": "sha256-<hex>", "bytes": 123456}}

(a step result keeps only the ``"$blob"`` key). Readers get the value back
exactly as it was written (:meth:`Offloader.unpack`). Crash safety comes from
the order and the name: the blob is written *before* the commit that
references it, and a re-run of the same turn writes the same name, so a
crash leaves at worst a blob nothing references yet, under its job, removed
with the job (see :mod:`adapters.offload` for the sweep of blobs whose job
is gone).

Nothing here imports an adapter: stores live in :mod:`adapters.blobs` and :mod:`adapters.blobs.s3`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import pipelines.engine.models as _models  # the MAX_VALUE_BYTES setting, read where it is checked
from pipelines.engine.errors import CorruptRecordError, InvalidInputError, StateNotSerializableError, ValueTooLargeError
from pipelines.engine.models import JSONValue, check_messages, to_json_value, validate_job_id

__all__ = [
    "BLOB_KEY",
    "DEFAULT_MAX_BLOB_BYTES",
    "DEFAULT_THRESHOLD",
    "BlobStore",
    "Offloader",
    "blob_name",
    "check_blob_name",
    "is_reference",
]

BLOB_KEY: Final = "$blob"
"""The key of a reference in a stored message or step result (reserved: a value of its own may not use it)."""

DEFAULT_THRESHOLD: Final = 64 * 1024
"""Values whose JSON text is longer than this many bytes go to the blob store."""

DEFAULT_MAX_BLOB_BYTES: Final = 64 * 1024 * 1024
"""The largest one blob may be (JSON text, bytes); above it a value is refused before anything is written."""

_NAME_PREFIX: Final = "sha256-"


def blob_name(data: bytes) -> str:
    """The content-derived name of ``data``: the same bytes always get the same name."""
    return _NAME_PREFIX + hashlib.sha256(data).hexdigest()


def check_blob_name(name: object) -> str:
    """``name`` if :func:`blob_name` could have made it, else :class:`InvalidInputError` (names reach paths, keys)."""
    ok = (isinstance(name, str) and name.startswith(_NAME_PREFIX) and len(name) == len(_NAME_PREFIX) + 64
          and all(c in "0123456789abcdef" for c in name[len(_NAME_PREFIX):]))
    if not ok:
        raise InvalidInputError(f"not a blob name: {name!r:.80} (expected 'sha256-' and 64 hex digits)")
    assert isinstance(name, str)
    return name


@runtime_checkable
class BlobStore(Protocol):
    """Where large values live, per job. Every method is idempotent; names come from :func:`blob_name`."""

    def put(self, job_id: str, name: str, data: bytes) -> None:
        """Store ``data`` under ``name`` for ``job_id`` (a no-op if it is there: same name, same bytes)."""
        ...

    def get(self, job_id: str, name: str) -> bytes | None:
        """The bytes stored under ``name`` for ``job_id``, or ``None``."""
        ...

    def delete_job(self, job_id: str) -> int:
        """Remove every blob of ``job_id``; how many were removed."""
        ...

    def job_ids(self, older_than: float = 0.0) -> Iterator[str]:
        """Ids of jobs that have blobs, none written in the last ``older_than`` seconds (the orphan sweep)."""
        ...


def is_reference(value: Any) -> bool:
    """Whether ``value`` is a stored reference (a dict carrying :data:`BLOB_KEY`)."""
    return type(value) is dict and BLOB_KEY in value


@dataclass(frozen=True)
class Offloader:
    """Turns large values into references on the way in and back on the way out.

    ``threshold``: bytes of JSON above which a value goes to ``store``;
    ``max_blob_bytes``: the per-blob limit (the 8 MiB limit of inline values
    does not apply to a blob; this one does).
    """

    store: BlobStore
    threshold: int = DEFAULT_THRESHOLD
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES

    def __post_init__(self) -> None:
        if not isinstance(self.store, BlobStore):
            raise InvalidInputError(f"blobs must implement pipelines.engine.blobs.BlobStore, "
                                    f"got {type(self.store).__name__}")
        for name in ("threshold", "max_blob_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be an int >= 1 (bytes), got {value!r}")
        limit = _models.MAX_VALUE_BYTES
        if self.threshold > limit:  # a value between the two would stay inline and be refused there
            raise InvalidInputError(f"threshold must be at most the inline limit, {limit} bytes "
                                    f"(pipelines.engine.models.MAX_VALUE_BYTES), got {self.threshold}")

    # --- writing ---------------------------------------------------------------------------
    def encode(self, job_id: str, value: Any, what: str) -> tuple[JSONValue, bytes | None]:
        """``value`` as storage keeps it, and the blob to write first (``None``: kept inline).

        Refused (nothing written): a value that is not JSON, that uses the
        reserved key :data:`BLOB_KEY`, or whose text passes ``max_blob_bytes``.
        """
        validate_job_id(job_id)
        plain = to_json_value(value, what=what)
        if is_reference(plain):
            raise InvalidInputError(f"{what} uses the key {BLOB_KEY!r}, reserved for references to large values")
        try:
            text = json.dumps(plain, allow_nan=False, separators=(",", ":"))
        except ValueError as exc:
            raise StateNotSerializableError(f"{what} is not JSON-serialisable: {exc}") from exc
        if len(text) <= self.threshold // 4:  # cannot pass the threshold even as 4-byte UTF-8
            return plain, None
        data = text.encode()
        if len(data) <= self.threshold:
            return plain, None
        if len(data) > self.max_blob_bytes:
            raise ValueTooLargeError(f"{what} is {len(data) / 1048576:.1f} MiB of JSON, above the per-blob limit of "
                                     f"{self.max_blob_bytes / 1048576:.1f} MiB (max_blob_bytes)")
        return self._reference(plain, blob_name(data), len(data)), data

    @staticmethod
    def _reference(plain: JSONValue, name: str, size: int) -> dict[str, JSONValue]:
        ref: dict[str, JSONValue] = {BLOB_KEY: {"name": name, "bytes": size}}
        if type(plain) is dict:  # a message keeps what a listing shows: its role and call id
            ref = {k: plain[k] for k in ("role", "tool_call_id", "name") if k in plain} | ref
        return ref

    def pack(self, job_id: str, value: Any, what: str) -> JSONValue:
        """``value`` as storage keeps it, its blob (if any) written to the store first."""
        stored, data = self.encode(job_id, value, what)
        if data is not None:
            self.store.put(job_id, stored[BLOB_KEY]["name"], data)
        return stored

    def pack_messages(self, job_id: str, messages: Any, what: str) -> list[JSONValue]:
        """Transcript messages as storage keeps them (each checked as a message), blobs written first.

        Every message is checked before any blob is written, so bad input writes nothing.
        """
        return self.put_blobs(job_id, self.encode_messages(job_id, messages, what))

    def encode_messages(self, job_id: str, messages: Any, what: str) -> list[tuple[JSONValue, bytes | None]]:
        """:meth:`encode` of each message (each checked as a message first); nothing written."""
        checked = check_messages(list(messages), what)
        return [self.encode(job_id, m, what) for m in checked]

    def put_blobs(self, job_id: str, encoded: list[tuple[JSONValue, bytes | None]]) -> list[JSONValue]:
        """Write the blobs of :meth:`encode_messages`'s values; the values as storage keeps them."""
        for stored, data in encoded:
            if data is not None:
                self.store.put(job_id, stored[BLOB_KEY]["name"], data)
        return [stored for stored, _ in encoded]

    # --- reading ---------------------------------------------------------------------------
    def unpack(self, job_id: str, value: JSONValue) -> JSONValue:
        """The value a reference stands for (anything else as it is); :class:`CorruptRecordError` if it is gone."""
        if not is_reference(value):
            return value
        ref = value[BLOB_KEY]
        name = check_blob_name(ref.get("name") if type(ref) is dict else None)
        data = self.store.get(job_id, name)
        if data is None:
            raise CorruptRecordError(f"job {job_id!r} references blob {name} which its blob store does not hold")
        if blob_name(data) != name:
            raise CorruptRecordError(f"blob {name} of job {job_id!r} does not match its content hash")
        return json.loads(data)

    def unpack_all(self, job_id: str, values: list[Any]) -> list[Any]:
        """:meth:`unpack` over a list (a transcript slice)."""
        return [self.unpack(job_id, v) if is_reference(v) else v for v in values]

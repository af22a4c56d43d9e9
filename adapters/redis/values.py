"""How the Redis adapter encodes values: scores, TTLs, listing arguments, stream entries, key types.

Private to :mod:`adapters.redis` (the client, its errors and URLs are in
:mod:`adapters.redis.client`); nothing here is public API.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

from adapters.redis import scripts as redis_scripts
from adapters.redis.compact import widen
from pipelines.engine.errors import (
    InvalidInputError,
    StateNotSerializableError,
)
from pipelines.engine.models import (
    Event,
    JobRecord,
    JobStatus,
    check_event_size,
    encode_plain,
    plain_event,
    to_json_value,
)

# A job in these statuses may still stream: its live stream is kept until it finishes.
_LIVE_KEPT = (JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PAUSED)
# A job in these statuses is in the finished index, which retention reads.
_FINISHED = (JobStatus.COMPLETE, JobStatus.ERROR, JobStatus.CANCELLED)
# The Redis type each key role must have (roles as the scripts name them).
_KEY_TYPES = {"record": "hash", "messages": "list", "logs": "list", "journal": "hash", "lease": "string",
              "events": "stream", "due": "zset", "jobs": "set", "live": "stream",
              "finished": "zset", "inbox": "list", **dict.fromkeys(redis_scripts.INDEX_ROLES, "zset")}


def _listed(record: JobRecord) -> list[str]:
    """The scripts' ARGV placing ``record`` in the listing indexes: its status index, its updated_at."""
    return [redis_scripts.index_position(record.status), _score(record.updated_at)]


def _finished_at(record: JobRecord) -> str:
    """The finished index's score for ``record``: its last update while finished, else '' (not indexed)."""
    return _score(record.updated_at) if record.status in _FINISHED else ""


def _text(value: Any) -> str:
    # Works with clients made with or without decode_responses (RQ needs bytes).
    return value.decode() if isinstance(value, bytes) else str(value)


def _status(reply: Any) -> str:
    """A script's status text; ``""`` for a reply that has none (a commit handing back the archive's read
    answers a list led by its status)."""
    first = reply[0] if isinstance(reply, list) and reply else reply
    return _text(first) if isinstance(first, bytes | str) else ""


def _score(due_at: float | None) -> str:
    if due_at is None:
        return ""
    if math.isnan(due_at):
        raise StateNotSerializableError("checkpoint due_at is NaN")
    return repr(float(due_at))


def _ttl_ms(ttl: float) -> str:
    if not math.isfinite(ttl):
        raise InvalidInputError(f"a lease ttl must be a finite number of seconds, got {ttl!r}")
    # PX needs a positive integer; a ttl under 1 ms is a lease that is over at once.
    return str(max(1, math.ceil(ttl * 1000)))


def _bounded(n: int) -> int:
    """A count or list index as Redis takes one (a 64-bit int): past any stream's or list's length, one of any
    size means the same, so ``limit=10**20`` reads "all" as it does in memory."""
    return max(-(1 << 62), min(n, 1 << 62))


def _batched(items: Iterator[str], size: int) -> Iterator[list[str]]:
    while batch := list(itertools.islice(items, size)):
        yield batch


def _stale_message(job_id: str, reply: str, what: str) -> str:
    why = reply.removeprefix("stale:")
    if why == "missing":
        return f"job {job_id!r} no longer exists; {what}"
    if why == "expired":
        return f"job {job_id!r}: no worker holds its lease (this worker's lease expired); {what}"
    if why == "leased":
        return f"job {job_id!r} is leased by another worker; {what}"
    return f"job {job_id!r} moved on ({why.replace(':', ' ')}); {what}"


# --- the stream entries' encoding ------------------------------------------------------------------
# An event or live part is stored as one stream entry, field 'e'. Versions before the compact
# encoding wrote the event's JSON object ({"timestamp":..,"type":..}); now it is a JSON array
# [timestamp, type, turn, phase, data], trailing defaults left out, with a known type written as
# its number in _EVENT_TYPES: the field names and type strings were ~40% of a turn's events, and
# every event is kept twice (the durable log and the live stream). Readers tell the two apart by
# the first character. _EVENT_TYPES is append-only: a number, once written, names its type forever.
_EVENT_TYPES = ("turn_started", "model_response", "tool_call", "tool_result", "turn_committed", "attempt_started",
                "text_delta", "job_started", "job_finished", "job_failed", "job_cancelled", "job_paused",
                "job_resumed", "job_retried", "job_continued", "job_waiting", "approval_requested",
                "retry_scheduled", "job_forked", "children_finished", "tool_result_recorded")
_EVENT_CODES = {t: i for i, t in enumerate(_EVENT_TYPES)}


def _dump_parts(events: Sequence[Event]) -> list[str]:
    """Events as the stream entries store them (compact arrays), checked like every stored value.

    Raises StateNotSerializableError / ValueTooLargeError naming the event, before anything is written.
    """
    out = []
    for e in events:
        code = _EVENT_CODES.get(e.type, e.type)
        if plain_event(e):
            # The usual event, checked in one pass: its fields go as they are.
            row: list[Any] = [e.timestamp, code, e.turn, e.phase, e.data or None]
        else:
            # The general path converts what it can and names what it cannot. The data gets the whole depth
            # it has inside an event's JSON object, as before.
            what = f"event {e.type!r}"
            data = to_json_value(e.data, what=f"{what}: data") if e.data else None
            row = [*to_json_value([e.timestamp, code, e.turn, e.phase], what=what), data]
        while len(row) > 2 and row[-1] is None:
            row.pop()
        try:
            # Plain data by now: pydantic-core's encoder, ~4x faster than json.dumps with options (several a turn).
            text = encode_plain(row)
        except ValueError as exc:  # to_json_value refused what JSON cannot carry; a safety net
            raise StateNotSerializableError(f"event {e.type!r} is not JSON-serialisable: {exc}") from exc
        out.append(check_event_size(text, e.type))
    return out


def _load_part(raw: bytes | str) -> Event:
    """One stream entry's event, in either encoding, compact or not; ValueError (or pydantic's) if it does not parse."""
    text = widen(raw.decode() if isinstance(raw, bytes) else raw)  # record format 3: adapters.redis.compact
    if not text.startswith("["):
        return Event.model_validate_json(text)  # written before the compact encoding
    row = json.loads(text)
    if not isinstance(row, list) or not 2 <= len(row) <= 5:
        raise ValueError(f"a stored event is a list of {len(row) if isinstance(row, list) else '?'} items")
    kind = row[1]
    if isinstance(kind, int) and not isinstance(kind, bool):
        if not 0 <= kind < len(_EVENT_TYPES):
            raise ValueError(f"a stored event has the unknown type number {kind} (written by a newer version?)")
        kind = _EVENT_TYPES[kind]
    fields = dict(zip(("timestamp", "type", "turn", "phase", "data"), [row[0], kind, *row[2:]], strict=False))
    if fields.get("data") is None:
        fields.pop("data", None)
    return Event.model_validate(fields)

"""Loading a job's record on Redis, and what a worker remembers of it between turns.

:class:`RecordReads` is the part of :class:`~adapters.redis.RedisStorage`
that loads a record (with its journal, taking the lease when asked: one
script), reads its transcript, logs, inbox and lease, and deletes what a job
whose record is gone left behind. It remembers, per job a worker runs, the
turn history the record hash holds (so the next commit sends only the marks it
adds) and the journal's values (so a commit sends a journaled message as a
reference, :mod:`adapters.redis.refs`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from pydantic import ValidationError
from pydantic_core import from_json

from adapters.base import LeaseState
from adapters.redis.client import _mapped
from adapters.redis.compact import widen
from adapters.redis.connection import RedisConnection
from adapters.redis.events import json_line
from adapters.redis.record_format import changed_fields, delta_json, merged
from adapters.redis.refs import JournalValues
from adapters.redis.scripts import naming
from adapters.redis.values import _bounded, _text
from pipelines.engine.errors import CorruptRecordError, PipelineError, StorageUnavailableError
from pipelines.engine.models import (
    JobRecord,
    JSONValue,
    LogEntry,
    Message,
    TurnMark,
    Usage,
    dump_marks,
    dump_record_apart,
)

__all__ = ["RecordReads", "lines_of", "mark_line", "parse_record", "parse_stored"]

_log = logging.getLogger("pipelines")
# How many jobs' stored histories a storage remembers, and how many bytes of their lines at most
# (one per job a worker is running, usually: a history holds up to HISTORY_BYTES of state).
_BASES_KEPT = 1024
_BASES_BYTES = 32 << 20


class _Base(NamedTuple):
    """What a job's record hash holds, as the commit (or create) with ``token`` wrote it.

    Its turn history: a commit that keeps a prefix of it sends only the marks it adds and how many it
    drops (the history changes by one mark a turn but holds up to HISTORY_LIMIT of them). And, for a
    record in format 2 (:mod:`adapters.redis.record_format`), the record it holds and which fields its
    ``dx`` holds beside its ``base``: a commit sends those and the ones it changed.
    """

    token: str
    marks: list[TurnMark]
    lines: list[str]
    size: int  # bytes of lines and of the base's text, and twice the record's JSON (its two objects), for the bound
    record: JobRecord | None = None
    dx: frozenset[str] | None = None  # None: the hash holds no base (format 1), or which is not known
    base: str = ""  # the base's text, which a load then need not read again ('': not known)
    btok: str = ""  # the token of the write that wrote that base
    stored: JobRecord | None = None  # the record as the hash's JSON reads (nothing LOAD reads beside it)
    record_bytes: int = 0  # about how long the record's JSON is


class RecordReads:
    """A job's record and its lists, read; the history and journal a worker remembers (a part of ``RedisStorage``)."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn
        self.bases: dict[str, _Base] = {}
        self.bases_bytes = 0
        # What each job's journal holds, so a commit sends a journaled message as a reference.
        self.steps = JournalValues(jobs=_BASES_KEPT, max_bytes=_BASES_BYTES)
        self.warm_loads = 0  # loads that found the record hash as this storage last saw it (not sent again)

    def load(self, job_id: str, owner: str = "", ttl_ms: str = "") -> JobRecord | None:
        keys = self.conn.script_keys(job_id, naming.LOAD_KEYS)  # the id checked before anything is written
        if owner:
            self.conn.check_layout(job_id)  # before a worker's first turn, not before every read
        # A worker that saw the record hash as it is (its last write or load) is not sent the record again;
        # one that holds its base (record format 2) is not sent that.
        held = self.bases.get(job_id) if owner else None
        known = held.token if held is not None and held.stored is not None else ""
        btok = held.btok if held is not None and held.base else ""
        # A read unless it takes the lease (the leftovers of a job whose record is gone go in a write of their own).
        args = [owner, ttl_ms, self.conn.job_arg(job_id, keys), btok, known]
        try:
            reply = self.conn.run(self.conn.scripts.load, keys, args, f"loading job {job_id!r}", write=bool(owner))
        except StorageUnavailableError:
            if owner and self.conn.replicas:
                # Taken and not acknowledged (WAIT: a replica missing, after a failover): let go, not left to run
                # out, or each next take counts an interrupted turn and the job fails as a poison turn.
                with contextlib.suppress(PipelineError):
                    self.release_lease(job_id, owner)
            raise
        self.conn.check_types(job_id, reply, f"loading job {job_id!r}")
        if reply is None:
            return None
        if isinstance(reply, bytes | str):  # 'gone': no record, but an index still names the job
            self.delete_leftovers(job_id)
            return None
        try:
            stored, lines, hist = self._stored(job_id, reply, held)
            _same_version(job_id, stored, reply[10])
            record = _with_journal(job_id, stored, reply[1], reply[2], reply[3])
        except CorruptRecordError:
            if owner:  # the lease just taken goes back, with its mark: the corrupt record stays as it was
                with contextlib.suppress(PipelineError):
                    self.release_lease(job_id, owner)
            raise
        record = _beside(record, reply)
        if owner and hist is not None:
            self.remember_loaded(job_id, record, stored, lines, reply, held)
        if owner:
            self.remember_journal(job_id, record, reply[1], reply[2])
        return record

    def _stored(self, job_id: str, reply: Sequence[Any], held: _Base | None) -> tuple[JobRecord, list[str], Any]:
        """The record as the hash's JSON reads, its history's lines, and ``hist`` (None: history inside the JSON)."""
        if held is not None and held.stored is not None and _text(reply[0]) == "=":
            self.warm_loads += 1  # '=' only answers the token this storage sent: it holds that record
            return held.stored, held.lines, "="
        hist = reply[11] if len(reply) > 11 else None
        lines = lines_of(hist) if hist is not None else []
        data = reply[0] or merged(_base_text(reply, held), _text(reply[8]))
        return parse_stored(job_id, data, hist, self.known_marks(job_id, lines)), lines, hist

    def remember_loaded(self, job_id: str, record: JobRecord, stored: JobRecord, lines: list[str],
                        reply: Sequence[Any], held: _Base | None) -> None:
        """A worker commits next: remember what the record hash holds, so that commit sends deltas."""
        if _text(reply[0]) == "=" and held is not None:  # as it was: what was remembered of it stands
            base, btok, fields, size = held.base, held.btok, held.dx, held.record_bytes
        else:
            base = _base_text(reply, held)
            fmt2 = bool(base) and not reply[0]  # 'base' and no 'data': record format 2
            dx = widen(_text(reply[8]))
            fields = (frozenset(from_json(dx)) if dx else frozenset()) if fmt2 else None
            size = len(base) + len(dx) if fmt2 else len(reply[0])
            base, btok = (base, _text(reply[9])) if fmt2 else ("", "")
        self.remember(job_id, _text(reply[6]), record.history, lines, record, fields, base, btok, stored, size)

    def remember(self, job_id: str, token: str, marks: list[TurnMark], lines: list[str],
                 record: JobRecord | None = None, dx: frozenset[str] | None = None, base: str = "",
                 btok: str = "", stored: JobRecord | None = None, record_bytes: int = 0) -> None:
        """Remember what the record hash holds after ``token``'s write: its history; its record as loaded or
        committed (``record``) and as its JSON reads (``stored``), that JSON about ``record_bytes`` long; in
        record format 2 the fields ``dx`` holds, and the text of ``base`` with ``btok``, the token that wrote it."""
        self.forget_base(job_id)
        if not token:
            return  # a hand-made record without a token: its next commit sends the history whole
        base = base if btok else ""
        size = sum(map(len, lines)) + len(base) + (2 * record_bytes if record is not None else 0)
        while self.bases and (len(self.bases) >= _BASES_KEPT or self.bases_bytes + size > _BASES_BYTES):
            # Another thread may change the dict meanwhile: this is a bound, not an exact LRU.
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                self.forget_base(next(iter(self.bases)))  # the job remembered longest ago
        self.bases[job_id] = _Base(token, list(marks), lines, size, record, dx, base, btok, stored, record_bytes)
        self.bases_bytes += size

    def remember_journal(self, job_id: str, record: JobRecord, jver: Any, pairs: Sequence[Any]) -> None:
        if pairs and _text(jver) == str(record.version):
            # Bytes as Redis holds them (a client made with decode_responses hands back str).
            values = {_text(k): v if isinstance(v, bytes) else str(v).encode()
                      for k, v in zip(pairs[::2], pairs[1::2], strict=True)}
            self.steps.reset(job_id, record.version, values)
        else:
            self.steps.forget(job_id)

    def known_marks(self, job_id: str, lines: list[str]) -> list[TurnMark] | None:
        """The marks of ``lines`` where this storage parsed them before: the remembered history's tail, then the rest.

        A history moves by a mark or two a turn but holds up to HISTORY_LIMIT of them, so a worker
        that loaded or committed the job before parses only the marks added since (a late turn reads
        like an early one). ``None``: nothing remembered matches; the record is parsed whole.
        """
        base = self.bases.get(job_id)
        if base is None or not base.lines or not lines:
            return None
        try:
            drop = base.lines.index(lines[0])
        except ValueError:
            return None
        kept = len(base.lines) - drop
        if kept > len(lines) or lines[:kept] != base.lines[drop:]:
            return None
        try:
            return [*base.marks[drop:], *(TurnMark.model_validate_json(line) for line in lines[kept:])]
        except ValidationError:
            return None  # parsed whole, the record says what is wrong with it

    def forget_base(self, job_id: str) -> None:
        old = self.bases.pop(job_id, None)
        if old is not None:
            self.bases_bytes -= old.size

    def history_args(self, job_id: str, marks: list[TurnMark]) -> tuple[list[str], str, int, int]:
        """The history's lines, and the commit's history arguments: base token, marks dropped, first added.

        The engine builds each history from the last one (drop from the front, append), so the
        marks kept are the very objects remembered; anything else is sent whole (base '').
        """
        base = self.bases.get(job_id)
        if base is not None and marks and base.marks:
            first = marks[0]
            drop = next((i for i, m in enumerate(base.marks) if m is first), -1)
            kept = len(base.marks) - drop
            if drop >= 0 and kept <= len(marks) and all(a is b for a, b in zip(marks, base.marks[drop:],
                                                                                   strict=False)):
                lines = base.lines[drop:] + [mark_line(m) for m in marks[kept:]]
                return lines, base.token, drop, kept
        return [mark_line(m) for m in marks], "", 0, 0

    def record_args(self, job_id: str, record: JobRecord, fmt: int) -> tuple[str, str, frozenset[str] | None]:
        """How a commit writes ``record`` in format ``fmt``: (mode, text, the fields its ``dx`` will hold).

        Mode ``1``: ``text`` is the whole record, for ``data``; ``2``: the whole record, for ``base``;
        ``d:<token>``: ``text`` is the fields that differ from ``base``, for ``dx``, valid only while the
        record hash holds what the write with that token left (the script checks it). Formats 2 and 3
        write the record alike; format 3 stores ``dx`` narrowed, which the caller does (the text
        returned is the JSON).
        """
        what = f"the record of job {record.job_id!r}"
        base = self.bases.get(job_id) if fmt >= 2 else None
        if base is not None and base.record is not None and base.dx is not None:
            fields = changed_fields(record, base.record, base.dx)
            return f"d:{base.token}", delta_json(record, fields, what), frozenset(fields)
        return ("1" if fmt == 1 else "2"), dump_record_apart(record, what), frozenset() if fmt >= 2 else None

    def lease_owner(self, job_id: str) -> str | None:
        with _mapped(f"reading the lease of job {job_id!r}"):
            value = self.conn.client.get(self.conn.keys(job_id).lease)
        return None if value is None else _text(value)

    def release_lease(self, job_id: str, owner: str) -> None:
        """Let ``owner``'s lease go, and its ``held`` mark (the lease :meth:`load` takes, given back)."""
        k = self.conn.keys(job_id)
        reply = self.conn.run(self.conn.scripts.release, [k.lease, k.record], [owner],
                              f"releasing the lease of job {job_id!r}")
        self.conn.check_types(job_id, reply, f"releasing the lease of job {job_id!r}")

    def lease_state(self, job_id: str) -> LeaseState:
        """The live owner and the record's ``held`` in one script: ``held`` without a live lease is a lapsed one."""
        k = self.conn.keys(job_id)
        reply = self.conn.run(self.conn.scripts.lease_state, [k.lease, k.record], [],
                              f"reading the lease of job {job_id!r}", write=False)
        self.conn.check_types(job_id, reply, f"reading the lease of job {job_id!r}")
        owner, held = (_text(v) for v in reply)
        return LeaseState(owner or None, not owner and bool(held))

    def fenced_answers(self, job_id: str) -> list[JSONValue]:
        """The record hash's ``fenced`` lines (see ``scripts.record.DROPPED``), oldest first."""
        with _mapped(f"reading the fenced-off answers of job {job_id!r}"):
            raw = self.conn.client.hget(self.conn.keys(job_id).record, "fenced")
        return [json_line(job_id, line, "fenced-off answer") for line in _text(raw).split("\n") if line] if raw else []

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        """Messages ``[start:stop]`` (Python slice semantics) read with one LRANGE."""
        if stop == 0:
            return []  # LRANGE's end is inclusive: stop-1 == -1 would mean "to the end"
        start, stop = _bounded(start), None if stop is None else _bounded(stop)
        with _mapped(f"reading the transcript of job {job_id!r}"):
            lines = self.conn.client.lrange(self.conn.keys(job_id).messages, start, -1 if stop is None else stop - 1)
        return [json_line(job_id, line, "transcript message") for line in lines]

    def logs(self, job_id: str) -> list[LogEntry]:
        with _mapped(f"reading the logs of job {job_id!r}"):
            lines = self.conn.client.lrange(self.conn.keys(job_id).logs, 0, -1)
        try:
            return [LogEntry.model_validate_json(line) for line in lines]
        except ValidationError as exc:
            raise CorruptRecordError(f"a stored log entry of job {job_id!r} does not parse: {exc}") from exc

    def inbox(self, job_id: str, count: int) -> list[Message]:
        """The first ``count`` messages waiting in the job's inbox, in the order they were sent."""
        if count <= 0:
            return []
        with _mapped(f"reading the inbox of job {job_id!r}"):
            lines = self.conn.client.lrange(self.conn.keys(job_id).inbox, 0, _bounded(count) - 1)
        return [json_line(job_id, line, "inbox message") for line in lines]

    def delete_leftovers(self, job_id: str) -> None:
        """Delete what a job whose record is gone left (keys, index entries); a job created again is left alone."""
        what = f"deleting the leftovers of job {job_id!r}, whose record is gone"
        sent = self.conn.script_keys(job_id, naming.COMMIT_KEYS)
        reply = self.conn.run(self.conn.scripts.delete, sent, [self.conn.job_arg(job_id, sent), "", "gone"], what)
        self.conn.check_types(job_id, reply, what)
        if isinstance(reply, bytes | str):
            return  # 'present': created again since the load saw no record
        due, keys, listed = (int(n) for n in reply)
        if due or keys or listed:  # a second loader racing the first finds nothing left: said once
            _log.warning("job %s: its record is gone (deleted outside the app, or evicted); removed %s%d leftover "
                         "key(s) (events, live stream, logs, transcript, journal, inbox) and its index entries",
                         job_id, "its due entry, " if due else "", keys)


def _base_text(reply: Sequence[Any], held: _Base | None) -> str:
    """The base LOAD answered with: its text, or the one this storage holds when it answered '='."""
    base = _text(reply[7])
    return held.base if base == "=" and held is not None else base


def _same_version(job_id: str, stored: JobRecord, version: Any) -> None:
    """CorruptRecordError if the hash's ``version`` (what every write is fenced on) is not the record JSON's.

    Only a change made outside this library parts them; left alone, every commit of the job would be
    refused as stale and the job retried for ever without a word.
    """
    text = _text(version)
    if text and text != str(stored.version):
        raise CorruptRecordError(
            f"the record of job {job_id!r} is at version {stored.version} but its hash's 'version' field says "
            f"{text!r}: one of them was changed outside this library; set both to the same value to run the job")


def _beside(record: JobRecord, reply: Sequence[Any]) -> JobRecord:
    """``record`` with what LOAD read beside it: how many messages wait in its inbox, the usage fenced off, the
    turn's interruptions (leases taken over after they ran out)."""
    waiting = int(_text(reply[4]) or 0)
    update: dict[str, Any] = {"inbox": waiting} if waiting else {}
    if reply[5]:
        update["dropped"] = Usage.model_validate_json(reply[5])
    lapses = int(reply[12]) if len(reply) > 12 else 0
    if lapses or record.interrupted:
        update["interrupted"] = lapses
    return record.model_copy(update=update) if update else record


def parse_record(job_id: str, data: Any, jver: Any, journal: Sequence[Any], control: Any = None,
           hist: Any = None, marks: list[TurnMark] | None = None) -> JobRecord:
    """The stored record; ``marks``: its history (``hist``) already parsed, so only ``data`` is."""
    return _with_journal(job_id, parse_stored(job_id, data, hist, marks), jver, journal, control)


def parse_stored(job_id: str, data: Any, hist: Any = None, marks: list[TurnMark] | None = None) -> JobRecord:
    """The record as its JSON reads (with its history), before what is kept beside it (:func:`parse_record`)."""
    if hist and marks is None:
        # The turn history lives in its own field, one mark per line; 'data' has none of its own.
        data = _text(data).rstrip()
        data = f'{data[:-1]},"history":[{",".join(_text(hist).split(chr(10)))}]}}' if data else data
    try:
        rec = JobRecord.model_validate_json(data)
    except ValidationError as exc:
        raise CorruptRecordError(f"stored record of job {job_id!r} does not parse: {exc}") from exc
    if hist and marks is not None:
        rec = rec.model_copy(update={"history": marks})
    if rec.job_id != job_id:
        raise CorruptRecordError(f"stored record of job {job_id!r} names job {rec.job_id!r}")
    return rec


def _with_journal(job_id: str, rec: JobRecord, jver: Any, journal: Sequence[Any], control: Any) -> JobRecord:
    """``rec`` with the journal its version holds and a pending pause/cancel request (both beside the record)."""
    if rec.checkpoint is not None and journal and _text(jver) == str(rec.version):
        try:
            # widen: a model answer journaled in record format 3 (adapters.redis.compact.narrow_answer).
            steps = {_text(k): json.loads(widen(_text(v))) for k, v in zip(journal[::2], journal[1::2], strict=True)}
        except ValueError as exc:
            raise CorruptRecordError(f"stored journal of job {job_id!r} does not parse: {exc}") from exc
        rec = rec.model_copy(update={"checkpoint": rec.checkpoint.model_copy(update={"journal": steps})})
    if control:
        rec = rec.model_copy(update={"control": _text(control)})
    return rec


def mark_line(mark: TurnMark) -> str:
    # JSON escapes every newline inside strings, so a mark is always one line. Checked as the memory and
    # SQLite adapters check theirs (dump_marks): its state gets a value's whole nesting allowance, which
    # the record's JSON with the history spliced in reads back (record, history, mark: three levels).
    return dump_marks([mark], "a turn mark of the record's history")[0]


def lines_of(hist: Any) -> list[str]:
    text = _text(hist)
    return text.split("\n") if text else []

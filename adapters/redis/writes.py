"""Every write of :class:`~adapters.redis.RedisStorage` on Redis: one Lua script each (:mod:`adapters.redis.scripts`).

:class:`RecordWrites` is the part that creates, commits, journals, sends,
publishes, leases and deletes. A commit sends the turn history as a delta of
what the record hash holds and a journaled message as a reference, both
remembered by :class:`~adapters.redis.records.RecordReads`. Values are JSON
text; nothing is pickled. redis-py retries commands after connection errors,
writes included, so every write is idempotent: a commit or create re-sent
after its reply was lost finds its own token and reports success without
writing again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from adapters.base import FENCED_KEPT
from adapters.redis import scripts as redis_scripts
from adapters.redis.compact import EVENT_RUNS, RECORD_RUNS, narrow, narrow_answer
from adapters.redis.connection import RedisConnection
from adapters.redis.events import EventReads
from adapters.redis.records import RecordReads, mark_line
from adapters.redis.refs import slice_parts
from adapters.redis.scripts import naming
from adapters.redis.values import (
    _FINISHED,
    _LIVE_KEPT,
    _dump_parts,
    _finished_at,
    _listed,
    _score,
    _stale_message,
    _text,
    _ttl_ms,
)
from pipelines.engine.errors import (
    InboxNotEmptyError,
    InvalidInputError,
    JobConflictError,
    StaleVersionError,
    StorageError,
)
from pipelines.engine.models import (
    Commit,
    CommitReply,
    Event,
    JobRecord,
    JobStatus,
    JSONValue,
    LogEntry,
    Message,
    Usage,
    as_stored,
    check_messages,
    dump_json,
    dump_logs,
    dump_record,
    first_run_start,
)

__all__ = ["RecordWrites"]


class RecordWrites:
    """A job's writes, each one script (a part of ``RedisStorage``).

    ``live_ttl``: how long a finished job's live stream is kept; ``archive_finished``: whether a
    commit that finishes a job archives its events.
    """

    def __init__(self, conn: RedisConnection, records: RecordReads, history: EventReads, *, live_ttl: float,
                 archive_finished: bool) -> None:
        self.conn = conn
        self.records = records
        self.history = history
        self.live_ttl = live_ttl
        self.archive_finished = archive_finished

    def create_job(self, record: JobRecord, *, messages: Sequence[Message] = (), logs: Sequence[LogEntry] = (),
                   events: Sequence[Event] = ()) -> None:
        """Insert a new job atomically; ``JobConflictError`` if the id is taken."""
        job_id = record.job_id
        keys = self.conn.script_keys(job_id, naming.COMMIT_KEYS)
        data = _dump_data(record)
        marks = [mark_line(m) for m in record.history]
        msgs = [dump_json(m, "a transcript message") for m in messages]
        lines = dump_logs(logs)
        cp = record.checkpoint
        due = _score(cp.due_at if record.status is JobStatus.RUNNING and cp is not None else None)
        token = uuid.uuid4().hex  # lets a re-sent create recognise itself
        self.conn.check_layout(job_id)
        event_lines = self._parts(events)  # in the prefix's format, known from here
        args = [self.conn.job_arg(job_id, keys), token, data, str(record.version), due, len(msgs), len(lines),
                _finished_at(record), *_listed(record), "\n".join(marks), *msgs, *lines, *event_lines]
        reply = self.conn.run(self.conn.scripts.create, keys, args, f"creating job {job_id!r}")
        self.conn.check_types(job_id, reply, f"creating job {job_id!r}")
        if _text(reply) == "exists":
            raise JobConflictError(f"job {job_id!r} already exists")

    def commit(self, commit: Commit) -> CommitReply:
        """Apply ``commit`` in one Lua script: fenced on version and lease, idempotent by token.

        On :class:`StorageUnavailableError` the commit may or may not have
        landed; sending the same ``Commit`` again is safe (its token).
        """
        job_id = commit.job_id
        keys = every_key = self.conn.script_keys(job_id, naming.COMMIT_KEYS)
        # Serialise everything first: what JSON cannot carry fails here, with nothing written (I1).
        mode, data, dx = self.records.record_args(job_id, commit.record, self.conn.record_format)
        held = self.records.bases.get(job_id)  # a delta keeps the base it was computed from
        base_text, btok = (held.base, held.btok) if held is not None and mode.startswith("d") else (data, commit.token)
        marks, base, drop, kept = self.records.history_args(job_id, commit.record.history)
        if mode == f"d:{base}":
            mode = "d"  # the same token as the history's delta: sent once
        place = ""
        if self.conn.layout.buckets and base and held is not None and held.record is not None:
            # The record hash holds what this worker last saw, so the job is in that status's index: the
            # commit names only it and the new one of the listing indexes (the script checks 'st'). Without
            # buckets no index's name is sent but the due one's (naming).
            was = held.record.status
            place, keys = redis_scripts.index_position(was), _pruned(every_key, was, commit.record.status)
        msgs = [dump_json(m, "a transcript message") for m in commit.append_messages]
        # A message the journal already holds (the model's answer) is sent as a slice of it.
        sent = self.records.steps.refer(job_id, msgs) if msgs else None
        lines = dump_logs(commit.logs)
        event_lines = self._parts(commit.events)
        owner = commit.owner
        # A commit that finishes the job reads what archiving its events needs (one call fewer).
        archive = self.archive_finished and commit.record.status in _FINISHED
        args: list[str | int] = [
            self.conn.job_arg(job_id, keys), commit.token,
            narrow([data], RECORD_RUNS)[0] if mode[0] == "d" and self.compact else data,
            str(commit.expected_version), str(commit.record.version),
            "0" if owner is None else "1", owner or "",
            "" if commit.truncate_messages_to is None else str(int(commit.truncate_messages_to)),
            "1" if commit.keep_journal else "0", "1" if commit.release_lease else "0",
            _score(commit.due_at), len(msgs), len(lines), "1" if commit.clear_control else "0",
            "" if commit.record.status in _LIVE_KEPT else _ttl_ms(self.live_ttl),
            _finished_at(commit.record), str(int(commit.take_inbox)), *_listed(commit.record),
            base, str(drop), "\n".join(marks[kept:]), "1" if commit.ends_run else "0", mode, place,
            "1" if archive else "0", _place(first_run_start(commit.events)), *(sent or msgs), *lines, *event_lines,
        ]
        layout = redis_scripts.COMMIT_ARGS
        at, first = layout.history, layout.fixed
        self.records.forget_base(job_id)  # the stored history is unknown until this commit's reply
        self.records.steps.forget(job_id)  # the commit ends the journal (the next load remembers a kept one)
        reply, read = _commit_reply(self.conn.run(self.conn.scripts.commit, keys, args, f"committing job {job_id!r}"))
        if reply == "rebase":
            # The record hash is not the one the delta was computed from (recreated meanwhile?), or the
            # journal does not hold a message sent by reference: send both whole.
            args[at:at + 3] = ["", "0", "\n".join(marks)]
            args[first:first + len(msgs)] = msgs
            keys, args[layout.record_mode + 1] = every_key, ""  # the status it is in: as 'st' says
            if mode.startswith("d"):  # the record whole, in its base
                mode, args[layout.record_mode], dx = "2", "2", frozenset()
                base_text = data = args[layout.data] = _dump_data(commit.record)
                btok = commit.token
            reply, read = _commit_reply(self.conn.run(self.conn.scripts.commit, keys, args,
                                                      f"committing job {job_id!r}"))
        self.conn.check_types(job_id, reply, f"committing job {job_id!r}")
        if reply.startswith(("stale:", "inbox:")):
            raise _refused(job_id, reply, commit)
        if commit.record.status is JobStatus.RUNNING:
            # The same worker commits the job's next turn without loading it (continue_for): a delta.
            # Its next load (the next queued turn) parses only the marks added since (_known_marks).
            # A commit sent again ('applied': its first reply was lost) wrote nothing now: the record hash
            # holds what the first send wrote, in whichever mode that was, so no base of it is remembered
            # (the next commit writes the record whole), only the history, which both sends computed alike.
            if reply.startswith("applied"):
                dx = None
            self.records.remember(job_id, commit.token, commit.record.history, marks, commit.record, dx,
                                  base_text if dx is not None else "", btok if dx is not None else "",
                                  as_stored(commit.record),
                                  len(data) + (len(base_text) if mode.startswith("d") else 0))
        if archive:
            # A re-sent commit ('applied': its first reply was lost) brings no read: the archive reads its own.
            self.history.archive_quietly(job_id, read)
        _, pending, waiting = reply.split(":", 2)
        return CommitReply(pending or None, int(waiting or 0))

    def send(self, job_id: str, messages: Sequence[Message]) -> int | None:
        """Append messages to the job's inbox (outside the version fence); its new length, ``None`` if unknown."""
        k = self.conn.keys(job_id)
        lines = [dump_json(m, "a message sent to the job") for m in check_messages(messages, "messages sent")]
        if not lines:
            raise InvalidInputError("send needs at least one message")
        reply = self.conn.run(self.conn.scripts.send, [k.record, k.inbox], [uuid.uuid4().hex, *lines],
                          f"sending messages to job {job_id!r}")
        self.conn.check_types(job_id, reply, f"sending messages to job {job_id!r}")
        if isinstance(reply, bytes | str):  # 'closed:<status>': checked in the script that appends
            raise JobConflictError(f"job {job_id!r} is {_text(reply).removeprefix('closed:')}: "
                                   "its inbox takes no messages (nothing appended)")
        return None if int(reply) < 0 else int(reply)

    def publish(self, job_id: str, parts: Sequence[Event]) -> None:
        """Append ephemeral parts to the job's live stream (one round trip; nothing for an unknown job)."""
        if not parts:
            return
        k = self.conn.keys(job_id)
        lines = self._parts(parts)
        reply = self.conn.run(self.conn.scripts.publish, [k.record, k.live], [uuid.uuid4().hex, *lines],
                          f"publishing to the live stream of job {job_id!r}")
        self.conn.check_types(job_id, reply, f"publishing to the live stream of job {job_id!r}")

    def add_dropped_usage(self, job_id: str, usage: Usage, *, token: str) -> None:
        """Count usage of a fenced-off attempt (outside the version fence; a re-sent call counts once)."""
        add = usage.model_dump(exclude_defaults=True)
        if not add:
            return
        reply = self.conn.run(self.conn.scripts.dropped, [self.conn.keys(job_id).record], [token, json.dumps(add)],
                          f"counting dropped usage of job {job_id!r}")
        self.conn.check_types(job_id, reply, f"counting dropped usage of job {job_id!r}")

    def add_fenced_answer(self, job_id: str, usage: Usage, entry: JSONValue, *, token: str) -> None:
        """The usage and the answer of a fenced-off attempt, in the script that counts dropped usage."""
        line = dump_json(entry, f"the answer of a fenced-off attempt of job {job_id!r}")  # one line: no raw newline
        add = json.dumps(usage.model_dump(exclude_defaults=True))
        reply = self.conn.run(self.conn.scripts.dropped, [self.conn.keys(job_id).record],
                              [token, add, line, str(FENCED_KEPT)], f"keeping a fenced-off answer of job {job_id!r}")
        self.conn.check_types(job_id, reply, f"keeping a fenced-off answer of job {job_id!r}")

    def request_control(self, job_id: str, request: str | None) -> bool:
        """Store (or clear) a pause/cancel request in the record hash, outside the version fence."""
        k = self.conn.keys(job_id)
        reply = self.conn.run(self.conn.scripts.control, [k.record], [request or ""],
                          f"requesting {request or 'no'} control of job {job_id!r}")
        self.conn.check_types(job_id, reply, f"requesting control of job {job_id!r}")
        return bool(reply)

    def postpone(self, job_id: str, *, version: int, due_at: float) -> bool:
        """Move a running job later in its due index if it is still at ``version`` (one script)."""
        keys = self.conn.ordered_keys(job_id, ("record", "due"))
        reply = self.conn.run(self.conn.scripts.postpone, keys, [str(version), repr(float(due_at)), job_id],
                              f"postponing job {job_id!r}")
        self.conn.check_types(job_id, reply, f"postponing job {job_id!r}")
        return bool(reply)

    def record_step(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue) -> None:
        """Journal one step result under ``version``; fenced like ``commit``."""
        self.record_step_and_publish(job_id, version=version, owner=owner, key=key, value=value, parts=())

    def record_step_and_publish(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue,
                                parts: Sequence[Event]) -> None:
        """Journal one step result and append ``parts`` to the live stream, in one script (one round trip).

        The parts are published only if the step is journaled (same fence); a
        call redis-py re-sends after a lost reply publishes them once.
        """
        self._run_step(job_id, version, key, *self._step_call(job_id, version, owner, key, value, parts))

    def record_step_before_commit(self, job_id: str, *, version: int, owner: str | None, key: str,
                                  value: JSONValue, parts: Sequence[Event] = (),
                                  on_refused: Callable[[], None] | None = None) -> None:
        """``record_step_and_publish``, its reply read with this thread's next script, the commit (StepBeforeCommit).

        A refused write (fenced off) is forgotten when its reply is read, and ``on_refused()`` called; the
        commit is refused by the same fence. Its value is remembered at once, so the commit may send its
        message as a slice of it: a slice the journal does not hold has the commit sent whole ('rebase').
        """
        keys, args, text, what = self._step_call(job_id, version, owner, key, value, parts)

        def settle(reply: Any) -> None:
            if self._step_refused(job_id, reply, what) and on_refused is not None:
                on_refused()

        self.records.steps.remember(job_id, version, key, text)
        if not self.conn.send_deferred(self.conn.scripts.step, keys, args, what, settle):
            self._run_step(job_id, version, key, keys, args, text, what)

    def _step_call(self, job_id: str, version: int, owner: str | None, key: str, value: JSONValue,
                   parts: Sequence[Event]) -> tuple[list[str], list[str], str, str]:
        """The step script's keys and arguments for journaling ``value`` with ``parts``; the value's text; what."""
        keys = self.conn.script_keys(job_id, naming.STEP_KEYS)
        text = dump_json(value, f"result of step {key!r}")
        if self.compact:
            text = narrow_answer(value, text)  # a model answer's fields after its message, as format 3 stores them
        lines = _dump_parts(parts)
        # The text streamed with a model's answer is inside the answer: sent once (redis_refs), found in the
        # parts as JSON; then what the step stores goes compact in format 3 (a cut part's prefix and suffix).
        sliced = slice_parts(text, lines, compact=self.compact) if lines else None
        if self.compact:
            sent = sliced or lines
            at = [i for i, line in enumerate(sent) if not line.startswith("=")]
            for i, line in zip(at, narrow([sent[i] for i in at], EVENT_RUNS), strict=True):
                sent[i] = line
        args = [str(version), "0" if owner is None else "1", owner or "", key, text, *(sliced or lines)]
        return keys, args, text, f"journaling step {key!r} of job {job_id!r}"

    def _run_step(self, job_id: str, version: int, key: str, keys: list[str], args: list[str], text: str,
                  what: str) -> None:
        """Run the step script and wait for its reply: a refused write raises :class:`StaleVersionError`."""
        reply = self.conn.run(self.conn.scripts.step, keys, args, what)
        if self._step_refused(job_id, reply, what):
            raise StaleVersionError(_stale_message(job_id, _text(reply),
                                                   f"step {key!r} at version {version} not recorded"))
        self.records.steps.remember(job_id, version, key, text)

    def _step_refused(self, job_id: str, reply: Any, what: str) -> bool:
        """Whether the step script refused the write (fenced off: what the journal holds is then not known)."""
        reply = _text(reply)
        self.conn.check_types(job_id, reply, what)
        if reply == "badpart":  # the adapter's own encoding: a bug here, never the caller's input
            raise StorageError(f"{what}: the script refused a live-stream part sent as a slice of the value; "
                               "nothing was written")
        if reply.startswith("stale:"):
            self.records.steps.forget(job_id)
            return True
        return False

    @property
    def compact(self) -> bool:
        """Whether this storage writes ``dx`` and stream entries compact (record format 3: the prefix's)."""
        return self.conn.record_format >= 3

    def _parts(self, events: Sequence[Event]) -> list[str]:
        """Events as this storage writes its stream entries: checked, then compact in format 3."""
        lines = _dump_parts(events)
        return narrow(lines, EVENT_RUNS) if self.compact else lines

    def renew_lease(self, job_id: str, owner: str, ttl: float) -> bool:
        reply = self.conn.run(self.conn.scripts.renew, [self.conn.keys(job_id).lease], [owner, _ttl_ms(ttl)],
                          f"renewing the lease of job {job_id!r}")
        self.conn.check_types(job_id, reply, f"renewing the lease of job {job_id!r}")
        return bool(reply)

    def release_lease(self, job_id: str, owner: str) -> None:
        self.records.release_lease(job_id, owner)

    def delete_job(self, job_id: str, *, if_version: int | None = None) -> bool:
        """Remove the job's keys and index entries in one script; ``False`` if it did not exist.

        The job's own keys go whatever their type (so a corrupt job can be
        deleted); an index key of the wrong type is CorruptRecordError.
        ``if_version``: delete only if the job is still at that version, else
        :class:`StaleVersionError` with nothing deleted (the caller judged the
        job deletable at that version).
        """
        keys = self.conn.script_keys(job_id, naming.COMMIT_KEYS)
        args = [self.conn.job_arg(job_id, keys), "" if if_version is None else str(int(if_version))]
        reply = self.conn.run(self.conn.scripts.delete, keys, args, f"deleting job {job_id!r}")
        self.conn.check_types(job_id, reply, f"deleting job {job_id!r}")
        if isinstance(reply, bytes | str) and _text(reply).startswith("stale:"):
            raise StaleVersionError(_stale_message(job_id, _text(reply), f"delete expected version {if_version}"))
        return bool(reply)


def _refused(job_id: str, reply: str, commit: Commit) -> StaleVersionError:
    """The error for a commit the script refused with nothing written: fenced off, or a run's end past its inbox."""
    if reply.startswith("inbox:"):
        waiting = int(reply.removeprefix("inbox:"))
        return InboxNotEmptyError(f"job {job_id!r}: {waiting - commit.take_inbox} message(s) sent to it wait in its "
                                  "inbox; the run does not end past them", waiting=waiting)
    return StaleVersionError(_stale_message(job_id, reply, f"commit expected {commit.expected_version}"))


def _pruned(keys: list[str], was: JobStatus, status: JobStatus) -> list[str]:
    """``keys`` (every key of a job's COMMIT) with the listing indexes cut to all jobs', ``was``'s and ``status``'s."""
    statuses = keys[-len(redis_scripts.INDEX_ROLES) + 1:]
    order = list(JobStatus)
    kept = [statuses[order.index(was)]]
    if status is not was:
        kept.append(statuses[order.index(status)])
    return [*keys[:-len(redis_scripts.INDEX_ROLES) + 1], *kept]


def _dump_data(record: JobRecord) -> str:
    """The record's ``data`` field: its JSON without the turn history (kept in ``hist``, one mark a line)."""
    what = f"the record of job {record.job_id!r}"
    return dump_record(record.model_copy(update={"history": []}) if record.history else record, what)


def _commit_reply(raw: Any) -> tuple[str, tuple[Any, Any] | None]:
    """COMMIT's status text, and the archive's read when the reply carries one (the archive flag)."""
    if isinstance(raw, list):
        if len(raw) != 3:
            raise StorageError(f"the commit script answered a list of {len(raw)} items, not 3 (the status, "
                               "the archive and the event stream's entries)")
        return _text(raw[0]), (raw[1], raw[2])
    return _text(raw), None


def _place(index: int | None) -> str:
    """ARGV for a 0-based place in a list: the Lua side's 1-based one ('' = none)."""
    return "" if index is None else str(index + 1)

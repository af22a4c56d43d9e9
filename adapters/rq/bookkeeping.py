"""An RQ worker's own bookkeeping (its heartbeat and its state) sent only when it changes something.

RQ's worker sends its heartbeat (``HSET last_heartbeat`` and two ``EXPIRE``
of the worker's keys, one round trip each) three times for every job it
takes: at the top of its loop, before its dequeue and after it, each pushing
the keys' expiry to ``worker_ttl + 60`` seconds (8 minutes by default) from
now. A busy worker sent nine round trips a turn to move an 8-minute expiry
by a millisecond.

:class:`SparseHeartbeat` sends a heartbeat the worker asks for outside a
pipeline in one pipeline of its own, and not at all when the expiry it asks
for is no more than :attr:`~SparseHeartbeat.heartbeat_slack` seconds later than the one
the worker's keys already have: they so live at most that second less than
RQ's would, against a lifetime of minutes. A heartbeat RQ adds to a pipeline
of its own (its suspension check, the start of a job) is always added, as RQ
does (it costs no round trip); since it may set a shorter expiry (a job's
start sets the job's heartbeat TTL, 90 seconds by default), the next
heartbeat is compared with the shorter one. A forking worker's job starts
in its work-horse, out of this process's sight, so after every job the
expiry is taken as unknown: the heartbeat RQ's suspension check sends in its
pipeline at the top of the next loop restores it, and the one RQ sends just
before that check is left to it (if the check fails, the heartbeat before the
dequeue goes out). A busy worker so sends no heartbeat of its own a take,
where RQ sent nine round trips of them; the suspension check's, which RQ
sends too, keeps its keys as RQ would.

:class:`SameStateOnce`: RQ sets a worker's state to "idle" when a job ends
and again at the top of its next dequeue, each a round trip of its own; the
second writes what the first wrote and is not sent.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["HEARTBEAT_SLACK", "SameStateOnce", "SparseHeartbeat"]

HEARTBEAT_SLACK = 1.0
"""Seconds by which a heartbeat must move the worker key's expiry to be sent."""


class SparseHeartbeat:
    """Mixin over an RQ worker: its own heartbeats in one round trip, at most about one a ``heartbeat_slack``."""

    heartbeat_slack: float = HEARTBEAT_SLACK
    worker_ttl: int
    connection: Any
    # Monotonic time until which the last heartbeat this process sent itself keeps the worker's keys.
    # Measured from before the send, so it is never later than the server's own expiry.
    _beat_until: float = 0.0
    _piped_at: float = float("-inf")  # when RQ last added a heartbeat to a pipeline of its own
    _after_job: bool = False  # a job just ended and no suspension check has run since

    def execute_job(self, job: Any, queue: Any) -> None:
        try:
            super().execute_job(job, queue)  # type: ignore[misc]
        finally:
            self._beat_until = 0.0  # the job's start set a shorter expiry, maybe in the work-horse
            self._after_job = True

    def check_for_suspension(self, burst: bool) -> None:
        self._after_job = False
        asked = time.monotonic()
        super().check_for_suspension(burst)  # type: ignore[misc]
        if self._piped_at >= asked:
            # Its pipeline held RQ's heartbeat (with the default expiry), and it went out: it returned.
            self._beat_until = max(self._beat_until, asked + self.worker_ttl + 60)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        ttl = timeout or self.worker_ttl + 60  # RQ's default, so the comparison below is with what RQ would set
        sent_at = time.monotonic()
        if pipeline is not None:
            # RQ sends this one with its own commands; it may set a shorter expiry (the start of a job
            # sets the job's heartbeat TTL) or never go out. Either way the keys live at least until
            # the earlier of the two, and a later heartbeat is compared with that.
            super().heartbeat(timeout, pipeline)  # type: ignore[misc]
            self._beat_until = min(self._beat_until, sent_at + ttl)
            self._piped_at = sent_at
            return
        if self._after_job:
            # RQ's loop sends one right after a job, then checks for suspension, whose pipeline holds
            # another: the first is left to the second. If that check fails, the heartbeat before the
            # dequeue goes out (the job reset what this process knows of the expiry).
            self._after_job = False
            return
        if sent_at + ttl <= self._beat_until + self.heartbeat_slack:
            return
        with self.connection.pipeline(transaction=False) as pipe:
            super().heartbeat(ttl, pipe)  # type: ignore[misc]
            pipe.execute()
        self._beat_until = sent_at + ttl


class SameStateOnce:
    """Mixin over an RQ worker: a state it sets on its own is not sent again while Redis holds it already."""

    # The state this process last wrote itself and saw land; None after one went into a pipeline (RQ's
    # job start), which may or may not have been sent.
    _state_sent: str | None = None
    _state: str

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().set_state(state, pipeline)  # type: ignore[misc]
            self._state_sent = None
            return
        if state == self._state_sent:
            self._state = state  # what RQ's set_state keeps beside the write
            return
        super().set_state(state)  # type: ignore[misc]
        self._state_sent = state

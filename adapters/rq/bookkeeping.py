"""An RQ worker's own bookkeeping (its heartbeat and its state) sent only when it changes something.

RQ's worker sends its heartbeat (``HSET last_heartbeat`` and two ``EXPIRE``
of the worker's keys, one round trip each) three times for every job it
takes: at the top of its loop, before its dequeue and after it, each pushing
the keys' expiry to ``worker_ttl + 60`` seconds (8 minutes by default) from
now; and it writes its state "idle" as a job ends and again before its next
dequeue. A busy worker sent eleven round trips a turn for them, to move an
8-minute expiry by a millisecond and write "idle" over "idle".

:class:`LeanBookkeeping`:

* A heartbeat the worker asks for outside a pipeline goes in one pipeline of
  its own, and not at all when the expiry it asks for is no more than
  :data:`HEARTBEAT_SLACK` seconds later than the one the worker's keys already
  have (they so live at most that second less than RQ's would, against a
  lifetime of minutes).
* A heartbeat RQ adds to a pipeline of its own (its suspension check at the
  top of every loop, the start of a job) is always added, as RQ does: it
  costs no round trip. It may set a shorter expiry (a job's start sets the
  job's heartbeat TTL, 90 seconds by default) or never go out, so the next
  heartbeat is compared with the shorter one, and only a suspension check
  that returned counts as sent.
* A job's start may happen in a work-horse, out of this process's sight, so
  after every job the expiry is taken as unknown. The heartbeat RQ's loop
  sends right after a job, and the "idle" it writes as the job ends, are left
  to the suspension check that comes next: its pipeline carries both. If that
  check fails, the heartbeat and the "idle" RQ sends before its dequeue go
  out instead.
* A state already written is not written again.
* A job with no success or failure callback has the heartbeat RQ writes as its work ends (a round trip
  of its own, there to show the job alive while a callback runs) written with the job's end instead:
  RQ saves the job, that heartbeat in it, in the pipeline that follows.

A busy worker so sends none of these round trips of its own a take, where RQ
sent eleven (twelve with the job's heartbeat); RQ's suspension check, which it
sends anyway, keeps the keys and the state as RQ would.
"""

from __future__ import annotations

import time
from typing import Any

from rq.utils import now as rq_now

__all__ = ["HEARTBEAT_SLACK", "LeanBookkeeping"]

HEARTBEAT_SLACK = 1.0
"""Seconds by which a heartbeat must move the worker key's expiry to be sent."""


class LeanBookkeeping:
    """Mixin over an RQ worker: its heartbeat and its "idle" state sent only when they change something.

    One class, because the two ride together: the state a job's end sets and the heartbeat RQ's loop sends
    right after it both wait for the suspension check that follows, whose pipeline carries them.
    """

    heartbeat_slack: float = HEARTBEAT_SLACK
    worker_ttl: int
    connection: Any
    key: str
    _state: str
    # Monotonic time until which the worker's keys live by what this process knows went out. Measured
    # from before the send, so it is never later than the server's own expiry; 0 = unknown.
    _beat_until: float = 0.0
    _piped_at: float = float("-inf")  # when RQ last added a heartbeat to a pipeline of its own
    _after_job: bool = False  # a job ended and no suspension check has run since
    _in_check: bool = False  # inside RQ's suspension check
    # The state this process knows Redis holds (None: unknown, e.g. one written in a pipeline of RQ's);
    # the state a job's end set, left to the next suspension check's pipeline; the one that pipeline carries.
    _state_sent: str | None = None
    _state_due: str | None = None
    _state_carried: str | None = None
    _job_ran: bool = False  # the job's work ended; RQ's execute_job marks the worker idle next

    # --- where a job ends ------------------------------------------------------------------
    def perform_job(self, *args: Any, **kwargs: Any) -> Any:  # a SimpleWorker's (a work-horse's: harmless)
        try:
            return super().perform_job(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._job_ran = True

    def monitor_work_horse(self, *args: Any, **kwargs: Any) -> Any:  # a forking worker's parent
        try:
            return super().monitor_work_horse(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._job_ran = True

    def handle_execution_ended(self, job: Any, queue: Any, heartbeat_ttl: int) -> None:
        """RQ's, but a job with no callback has the heartbeat of its end written with its end, not before it.

        RQ writes the job's ``last_heartbeat`` (one round trip) as its work ends, so that the job shows
        alive while a success or failure callback runs, then writes the job's end (its status, result and
        that same heartbeat, the job saved whole) in one pipeline. A job with neither callback goes straight
        to that pipeline, which writes the heartbeat a moment later: the round trip before it moved nothing.

        Told by the callbacks' stored names, which import nothing: RQ's ``success_callback`` property
        imports the callback, and one that cannot be imported must fail where RQ handles it, not here
        (an error here escapes RQ's handling and stops a worker that runs jobs in its own process).
        An RQ whose jobs keep the names elsewhere takes RQ's own way.
        """
        if not (getattr(job, "_success_callback_name", "?") or getattr(job, "_failure_callback_name", "?")):
            job.ended_at = job.last_heartbeat = rq_now()
            return
        super().handle_execution_ended(job, queue, heartbeat_ttl)  # type: ignore[misc]

    def execute_job(self, job: Any, queue: Any) -> None:
        try:
            super().execute_job(job, queue)  # type: ignore[misc]
        finally:
            self._job_ran = False
            self._beat_until = 0.0  # the job's start set a shorter expiry, maybe in the work-horse
            self._after_job = True

    # --- the suspension check: its pipeline carries what waited ------------------------------
    def check_for_suspension(self, burst: bool) -> None:
        self._after_job = False
        asked = time.monotonic()
        self._in_check = True
        try:
            super().check_for_suspension(burst)  # type: ignore[misc]
            went_out = self._piped_at >= asked  # its pipeline held RQ's heartbeat, and it returned
        finally:
            carried, self._state_carried, self._in_check = self._state_carried, None, False
        if went_out:
            self._beat_until = max(self._beat_until, asked + self.worker_ttl + 60)  # RQ's default expiry
            if carried is not None and carried == self._state_due:
                self._state_sent, self._state_due = carried, None

    # --- the heartbeat ------------------------------------------------------------------------
    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        ttl = timeout or self.worker_ttl + 60  # RQ's default, so the comparison below is with what RQ would set
        sent_at = time.monotonic()
        if pipeline is not None:
            if self._in_check and self._state_due is not None:
                pipeline.hset(self.key, "state", self._state_due)  # the state a job's end set
                self._state_carried = self._state_due
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

    # --- the state ----------------------------------------------------------------------------
    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().set_state(state, pipeline)  # type: ignore[misc]
            self._state_sent = self._state_due = None  # RQ's pipeline may or may not go out
            return
        if self._job_ran:
            # RQ marks the worker idle as a job ends and checks for suspension next: written with that check.
            # If it fails, the dequeue's own "idle" (RQ sets it before it waits) goes out instead.
            self._job_ran = False
            self._state = self._state_due = state
            return
        if state == self._state_sent and self._state_due is None:
            self._state = state  # what RQ's set_state keeps beside the write
            return
        super().set_state(state)  # type: ignore[misc]
        self._state_sent, self._state_due = state, None

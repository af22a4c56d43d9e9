"""What keeps an RQ worker going through a Redis outage (mixins of the workers in :mod:`adapters.rq.priority`).

RQ's worker survives an outage only while it waits for a job: its dequeue
retries a refused connection. Anywhere else, a Redis error ends it, and the
scheduler process it forked ends with the first one:

* :class:`RidesOutOutages`: a refused or dropped connection while RQ records a
  job's start or end, checks for suspension, sends its heartbeat or sets its
  state is logged and outlived. What that loses is RQ's bookkeeping of one
  message, never a turn: storage says what is due, and the sweep sends the
  advance again if its message is gone.
* :class:`SchedulerKeeper`: RQ's scheduler is started again within seconds of
  ending, not at RQ's 10-minute maintenance.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

import redis
from rq.exceptions import StopRequested

__all__ = ["RidesOutOutages", "SchedulerKeeper"]

logger = logging.getLogger(__name__)


def _outage(exc: redis.ConnectionError) -> bool:
    """A connection refused, dropped or still loading; redis-py files refused credentials there too."""
    return not isinstance(exc, redis.AuthenticationError | redis.exceptions.AuthorizationError)


class RidesOutOutages:
    """Mixin over an RQ worker: a ``redis.ConnectionError`` outside the dequeue no longer ends the worker.

    Timeouts still do (RQ's choice: a command that hangs is a broken
    connection, and a fresh worker is the cure), and so do refused
    credentials, which redis-py raises as a ``ConnectionError`` too. ``outage_pause`` is the wait
    before the dequeue is tried again after it failed before its own retries.
    """

    outage_pause: float = 1.0
    _stop_requested: bool
    _horse_pid: int

    def execute_job(self, job: Any, queue: Any) -> None:
        try:
            super().execute_job(job, queue)  # type: ignore[misc]
        except redis.ConnectionError as exc:
            if not _outage(exc):
                raise
            logger.warning("Redis unreachable while RQ recorded job %s (%s); if the advance is lost, the sweep "
                           "sends it again", job.id, exc)
            self._reap_horse()

    def _reap_horse(self) -> None:
        """Wait for a forking worker's horse that RQ stopped watching when the error came: one turn at a time."""
        pid, self._horse_pid = getattr(self, "_horse_pid", 0), 0
        if pid:
            with contextlib.suppress(ChildProcessError):  # RQ had reaped it already
                os.waitpid(pid, 0)

    def check_for_suspension(self, burst: bool) -> None:
        try:
            super().check_for_suspension(burst)  # type: ignore[misc]
        except redis.ConnectionError as exc:
            if not _outage(exc):
                raise
            logger.warning("Redis unreachable while checking for suspension (%s); going on", exc)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        try:
            super().heartbeat(timeout, pipeline)  # type: ignore[misc]
        except redis.ConnectionError as exc:
            if not _outage(exc):
                raise
            logger.warning("Redis unreachable for the worker's heartbeat (%s); going on", exc)

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        # RQ's dequeue retries a refused connection inside its loop, but it sets the worker's state
        # before that loop: a refusal there would end the worker.
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)  # type: ignore[misc]
            except redis.ConnectionError as exc:
                if not _outage(exc):
                    raise
                if self._stop_requested:
                    raise StopRequested() from exc
                logger.warning("Redis unreachable (%s); trying again in %.1fs", exc, self.outage_pause)
                time.sleep(self.outage_pause)


class SchedulerKeeper:
    """Mixin over an RQ worker: RQ's scheduler is started again within seconds of ending, not minutes.

    RQ runs one scheduler per queue, a process forked by the worker that took
    its lock, and it moves delayed messages (retries, timers, deferred turns) to
    the queue every second. Any exception ends it, a Redis restart for one, and
    RQ's workers only try to start another at their maintenance, every 10
    minutes. So before each take (at most every ``scheduler_check_every``
    seconds) a worker whose scheduler is not running tries to start one. The
    lock of a scheduler that ended stays for a minute, but under its name,
    which is its worker's too (a forked scheduler keeps its parent's): that
    worker takes it back at once, any other once it expires. A worker that is
    idle is waiting in the dequeue; meanwhile the sweep's recovery
    (:data:`adapters.rq.SCHEDULER_LATE`) delivers what waits.
    """

    scheduler_check_every: float = 5.0
    scheduler: Any
    _keep_scheduler: bool = False
    _scheduler_checked: float | None = None

    def _start_scheduler(self, burst: bool = False, *args: Any, **kwargs: Any) -> None:
        self._keep_scheduler = not burst  # a burst worker moves due messages once and starts no process
        super()._start_scheduler(burst, *args, **kwargs)  # type: ignore[misc]

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        self.keep_scheduler()
        return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)  # type: ignore[misc]

    def keep_scheduler(self) -> bool:
        """Start RQ's scheduler if it is due a check and not running; whether this call started one."""
        scheduler = getattr(self, "scheduler", None)
        if not self._keep_scheduler or scheduler is None:
            return False
        now = time.monotonic()
        if self._scheduler_checked is not None and now - self._scheduler_checked < self.scheduler_check_every:
            return False
        self._scheduler_checked = now
        process = scheduler._process  # RQ keeps its scheduler process only here (private)
        if process is not None and process.is_alive():
            return False
        if process is not None:
            logger.warning("RQ's scheduler (pid %s) ended with exit code %s; starting another", process.pid,
                           process.exitcode)
        try:
            scheduler.acquire_locks(auto_start=True)
        except redis.RedisError as exc:
            logger.warning("could not start RQ's scheduler: %s", exc)
            return False
        started = scheduler._process
        return started is not None and started is not process and started.is_alive()

"""``LocalScheduler``: runs turns on worker threads of the process that owns it, from the work its storage holds.

::

    app = App(storage=SQLiteStorage("app.db"), scheduler=LocalScheduler(workers=4))
    with app.scheduler:            # start() ... stop()
        app.run_agent("support", job_id="chat-1", messages=["hi"]).wait()

Two ways work reaches a worker thread:

* ``schedule_advance`` (the runner after each commit, ``run_agent``): a
  request kept in this process, run by a free worker at once or, delayed,
  when it is due; an idle worker sleeps until the next due request (it is
  woken early when one arrives), it never polls for these.
* The storage (I7: the source of truth). Every ``poll`` seconds, and at
  start, the scheduler claims running jobs that are due for ``grace``
  seconds and that no worker leases: on SQLite one ``UPDATE ... RETURNING``
  that also keeps every other process off the claimed jobs. So a restart
  picks up where the last process stopped, several processes on one file
  share the work, and a job started by a process without workers (a web
  process, the CLI) runs. Every ``sweep_interval`` seconds it also runs the
  App's sweep (lost wake-ups of parent jobs, retention).

The second way needs a storage that claims due work (``Feature.CLAIMS``:
SQLite). On any other (memory, Redis) only the work this process schedules
runs at once; a job another process started or left behind runs when the
App's sweep finds it overdue (``sweep_interval``, then a 10 s grace): fine
for one process, and what RQ or Celery workers are for beyond it.

Requests live only in this process: a crash loses them, and the storage
path above finds their jobs again. Delivery may be duplicated (a request
and a claim for one job); the runner's lease and version fence make that
harmless (I6).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, ClassVar

from adapters._local_requests import Requests as _Requests
from adapters._local_requests import rank as _rank
from adapters.base import ClaimingStore, Feature, SchedulerHost
from pipelines.engine.capabilities import as_feature
from pipelines.engine.errors import ConfigurationError, InvalidInputError

__all__ = ["LocalScheduler"]

logger = logging.getLogger("pipelines")

_POLLER = "pipelines-local-poll"


class LocalScheduler:
    """The :class:`~adapters.base.Scheduler` port on worker threads of this process (see the module docstring).

    ``workers``: threads that run turns. ``poll``: seconds between looks at
    the storage for due work no request brought. ``grace``: how long a job
    must have been due before a look takes it (a request of this process
    normally runs it within milliseconds). ``hold``: how long a claim keeps
    other processes off a job before its turn starts. ``sweep_interval``:
    seconds between runs of the App's sweep (0: never). ``storage``: where
    due work is read; by default the storage of the App it is attached to.
    """

    #: A delayed request runs when the wall clock reaches its due time, never before.
    precision: float = 0.0
    features: ClassVar[frozenset[Feature]] = frozenset({Feature.BACKLOG, Feature.IN_PROCESS, Feature.HOSTED})

    def __init__(self, *, workers: int = 4, poll: float = 0.5, grace: float = 1.0, hold: float = 30.0,
                 sweep_interval: float = 5.0, storage: Any = None) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or not 0 <= workers <= 256:
            raise InvalidInputError(f"workers must be an int in [0, 256], got {workers!r}")
        for name, value in (("poll", poll), ("grace", grace), ("hold", hold), ("sweep_interval", sweep_interval)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 86400:
                raise InvalidInputError(f"{name} must be seconds in [0, 86400), got {value!r}")
        if poll == 0 or hold == 0:
            raise InvalidInputError("poll and hold must be > 0 seconds")
        self.workers, self.poll, self.grace, self.hold = workers, float(poll), float(grace), float(hold)
        self.sweep_interval = float(sweep_interval)
        self.storage = storage
        self._requests = _Requests()
        self._advance: Callable[[str], object] | None = None
        self._sweep: Callable[[], object] | None = None
        self._names: Callable[[], list[str]] | None = None  # the pipelines the bound App runs (None: any)
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        # The worker threads running an advance now: thread name -> (job id, since). Changed under the requests'
        # lock; its size is how many are busy, and the workers page lists it.
        self._running: dict[str, tuple[str, float]] = {}
        self.scheduled = 0  # schedule_advance calls, for tests
        self._failing_since: float | None = None  # when claiming due work began to fail (None: it works)
        self._failure_said = 0.0
        self._halted = False  # the storage refused this library for good (ConfigurationError): no more looks

    # --- the port ------------------------------------------------------------------------
    def attach(self, advance: Callable[[str], object]) -> None:
        """Run ``advance(job_id)`` for every advance (the App attaches itself once)."""
        self._advance = advance

    def bind(self, host: SchedulerHost) -> None:
        """Read due work from ``host``'s storage (unless given one) and run its sweep (the App binds itself)."""
        if self.storage is None:
            self.storage = host.storage
        sweep = host.requeue_overdue
        self._sweep = lambda: sweep(grace=max(self.grace, 10.0))
        self._names = lambda: host.names  # read at each look: an App may register agents after it is built

    def schedule_advance(self, job_id: str, delay: float = 0.0, *, pipeline: str = "default",
                         version: int | None = None, priority: str | None = None) -> None:
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay < float("inf"):
            raise InvalidInputError(f"delay must be a finite number of seconds >= 0, got {delay!r}")
        rank = _rank(priority)
        self._requests.add(job_id, self.now() + delay, rank)
        self.scheduled += 1

    def requeue(self, job_id: str, *, pipeline: str = "default", version: int | None = None,
                priority: str | None = None) -> None:
        self.schedule_advance(job_id, 0.0, pipeline=pipeline, version=version, priority=priority)

    def now(self) -> float:
        return time.time()

    def work_waiting(self, priority: str | None = None) -> bool:
        """Whether a request of ``priority`` or a higher one is due now (the runner's ``continue_for`` asks)."""
        return self._requests.waiting(self.now(), _rank(priority))

    # --- running in the caller's thread (tests, scripts) -------------------------------------
    def _run(self, job_id: str) -> None:
        if self._advance is None:
            raise ConfigurationError(f"nothing can advance job {job_id!r}: this LocalScheduler is not attached "
                                     "to an App (App(storage=..., scheduler=...) attaches it)")
        self._advance(job_id)

    def run_due(self) -> int:
        """Run, in this thread, every request due now; how many ran."""
        ran = 0
        while True:
            with self._requests.cond:
                job_id = self._requests.take(self.now())
            if job_id is None:
                return ran
            self._run(job_id)
            ran += 1

    def drain(self, *, max_advances: int = 1_000_000) -> int:
        """Run requests in this thread until none is left, sleeping until delayed ones are due; how many ran.

        Started, the worker threads run them: 0 (no job's turn in the caller's thread; ``run.wait()`` polls storage),
        unless none does (``workers=0``, or stopped: a thread left finishing a long turn runs no more requests)."""
        if not self._stop.is_set() and self.threads():
            return 0
        ran = 0
        while True:
            with self._requests.cond:
                job_id = self._requests.take(self.now())
                due = self._requests.next_due() if job_id is None else None
                if job_id is None and due is None:
                    return ran
                if job_id is None and due is not None:
                    self._requests.cond.wait(_bounded(due - self.now()))
                    continue
            assert job_id is not None
            self._run(job_id)
            ran += 1
            if ran >= max_advances:
                raise RuntimeError(f"drain stopped after {max_advances} advances; a pipeline loops forever?")

    def advances(self) -> list[tuple[float, str, str]]:
        """The requests of this process, earliest first, as ``(due, priority, job id)`` (for people: the web page)."""
        return self._requests.listed()

    def threads(self) -> list[tuple[str, str | None, float | None]]:
        """This process's worker threads as ``(name, job id, since)``; job and since ``None`` while a thread waits."""
        running = dict(self._running)  # a copy: the threads change it while this reads
        return [(t.name, *running.get(t.name, (None, None))) for t in self._threads
                if t.is_alive() and t.name != _POLLER]

    def pending(self) -> int:
        """How many requests wait (due or not)."""
        with self._requests.cond:
            return len(self._requests)

    def drop_all(self) -> int:
        """Forget every request (what a crash does); how many there were."""
        return self._requests.clear()

    # --- worker threads -------------------------------------------------------------------------
    def start(self) -> LocalScheduler:
        """Start the worker threads and the storage poller (idempotent); returns the scheduler."""
        if self._threads:
            return self
        if self._advance is None:
            raise ConfigurationError("start() needs an attached App: build App(storage=..., scheduler=this) first")
        claims = as_feature(self.storage, Feature.CLAIMS, ClaimingStore)  # type: ignore[type-abstract]
        if claims is not None:
            # The storage is read before any thread starts: a file this library cannot use (a schema that
            # needs `pipelines migrate`, another program's file) fails start() with its one-line error, so
            # `with app.scheduler:` ends the process instead of leaving threads that fail every look.
            try:
                claims.reap_dead_processes()
            except ConfigurationError:
                raise
            except Exception:  # the storage is down for a moment: the poller's looks and sweeps try again
                logger.exception("local scheduler: releasing what dead processes held failed")
        self._stop.clear()
        self._halted = False
        for n in range(self.workers):
            self._threads.append(threading.Thread(target=self._work, name=f"pipelines-local-{n}", daemon=True))
        self._threads.append(threading.Thread(target=self._watch, name=_POLLER, daemon=True))
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking work; wait up to ``timeout`` seconds for the turns in flight to end."""
        self._stop.set()
        with self._requests.cond:
            self._requests.cond.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def __enter__(self) -> LocalScheduler:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _next(self) -> str | None:
        """Wait for a due request (or the stop); its job id."""
        with self._requests.cond:
            while not self._stop.is_set():
                taken = self._requests.take_ranked(self.now())
                job_id, rank = (None, 0) if taken is None else taken
                if job_id is not None and any(job_id == j for j, _ in self._running.values()):
                    # Another thread here runs this job's turn now. After the whole process stood still (Ctrl-Z,
                    # sleep) or the clock stepped, its lease looks run out until the lease keeper renews it, and
                    # this request (the sweep's, a send's) would take it over and run the turn's tools beside
                    # the first run. Looked at again once the turn may be over (the first run's commit also
                    # schedules what comes next).
                    self._requests.add(job_id, self.now() + self.poll, rank)  # at its own priority
                    continue
                if job_id is not None:
                    self._running[threading.current_thread().name] = (job_id, time.time())
                    return job_id
                due = self._requests.next_due()
                self._requests.cond.wait(None if due is None else _bounded(due - self.now()))
        return None

    def _work(self) -> None:
        me = threading.current_thread().name  # unique: start() makes no new threads while old ones live
        while (job_id := self._next()) is not None:
            try:
                self._run(job_id)
            except Exception:  # one job's failure never stops a worker (the runner records phase errors)
                logger.exception("local worker: advancing job %s failed", job_id)
            finally:
                with self._requests.cond:
                    del self._running[me]

    def _watch(self) -> None:
        """Claim due work from the storage every ``poll`` seconds (at once at start); sweep now and then."""
        last_sweep = time.monotonic()  # start() released what dead processes held
        self._look(grace=0.0)  # at start: what a stopped or killed process left is due already
        while not self._halted and not self._stop.wait(self.poll):
            self._look(grace=self.grace)
            if not self._halted and self.sweep_interval and time.monotonic() - last_sweep >= self.sweep_interval:
                last_sweep = time.monotonic()
                self._sweep_once()

    def _look(self, *, grace: float) -> None:
        store = self.storage
        with self._requests.cond:
            room = self.workers - len(self._running) - self._requests.due(self.now())
        claims = as_feature(store, Feature.CLAIMS, ClaimingStore)  # type: ignore[type-abstract]
        if room <= 0 or claims is None:
            return
        try:
            names = None if self._names is None else self._names()
            claimed = claims.claim_due(self.now() - grace, limit=room, hold=self.hold, pipelines=names)
        except ConfigurationError as exc:
            self._halt(exc)
            return
        except Exception as exc:  # the storage is down for a moment: the next look tries again
            # Said once an outage, with its traceback; then a line every minute, not one a look (~2 a second).
            now = time.monotonic()
            if self._failing_since is None:
                logger.exception("local scheduler: claiming due work failed; trying again every %gs", self.poll)
                self._failing_since = self._failure_said = now
            elif now - self._failure_said >= 60.0:
                self._failure_said = now
                logger.error("local scheduler: claiming due work still fails, for %.0fs now: %s",
                             now - self._failing_since, exc)
            return
        if self._failing_since is not None:
            logger.warning("local scheduler: claiming due work again, after %.0fs",
                           time.monotonic() - self._failing_since)
            self._failing_since = None
        for job_id in claimed:
            self.requeue(job_id)

    def _sweep_once(self, *, app: bool = True) -> None:
        """Release what dead processes held (SQLite), then run the App's sweep (``app``)."""
        claims = as_feature(self.storage, Feature.CLAIMS, ClaimingStore)  # type: ignore[type-abstract]
        try:
            if claims is not None:
                claims.reap_dead_processes()
            if app and self._sweep is not None:
                self._sweep()
        except ConfigurationError as exc:
            self._halt(exc)
        except Exception:
            logger.exception("local scheduler: sweep failed")

    def _halt(self, exc: ConfigurationError) -> None:
        """Stop looking at the storage for good: a file migrated under this process (or otherwise not one this
        library can use) fails every look the same way until the process is restarted, so retrying it every
        ``poll`` seconds for ever (the response to an outage) would only fill the log."""
        self._halted = True
        logger.error("local scheduler: stopped claiming due work and sweeping; restart this process once the "
                     "storage is fixed: %s", exc)


def _bounded(seconds: float) -> float:
    """A wait a thread can take: ``Condition.wait`` refuses more than ~292 years (OverflowError), which killed
    the worker thread; one an hour long wakes to look again."""
    return min(max(0.0, seconds), 3600.0)

"""The turn's environment: everything a phase or tool uses besides its job, handed to it explicitly.

The App builds one :class:`RunEnv` when it is made and hands it to every
phase it advances (``PhaseContext.env``) and, through the phase, to every tool
(``ToolContext.env``). Nothing here is found through a context variable or a
registry keyed by job id: a phase or tool sees the same environment on any
thread (a tool's timeout thread, the async bridge's loop thread, a tool pool
thread), in an RQ work-horse or a Celery worker, because the object travels
with the context it is handed.

What it carries:

- ``children``: what starts child jobs (agents and pipelines used as tools or
  phases): the App advancing the job. ``None`` when the job is advanced
  without an App (the bare low-level functions): starting a child then raises
  :class:`~pipelines.engine.errors.ConfigurationError` saying so.
- ``flow``: the App's shared rate limits and concurrency keys, or ``None``.
- ``callbacks``: the per-run lifecycle callbacks given to ``run_agent`` in
  this process (Python callables cannot travel to another worker).
- ``clock``: the scheduler's clock.

OpenTelemetry keeps its own context propagation (:mod:`pipelines.engine.telemetry`):
that is the one implicit context left, and it is the library's, not ours.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pipelines.engine.errors import ConfigurationError

if TYPE_CHECKING:
    from adapters.base import Scheduler, Storage
    from pipelines.engine.flow import FlowControl
    from pipelines.engine.phase.pipeline import Pipeline

__all__ = ["EMPTY_ENV", "ChildRuns", "RunCallbacks", "RunEnv"]


class ChildRuns(Protocol):
    """What starting a child job needs of the App that advances its parent."""

    @property
    def storage(self) -> Storage: ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def agents(self) -> Mapping[str, Any]: ...

    def pipeline(self, name: str) -> Pipeline: ...

    def add_agent(self, agent: Any, *, replace: bool = False) -> None: ...


class RunCallbacks:
    """The lifecycle callbacks each run was given in this process (``run_agent(..., on_end=fn)``).

    Owned by one App, never global: two Apps in one process keep their runs'
    callbacks apart. Thread-safe: runs start on callers' threads while a
    worker's turns read them.
    """

    def __init__(self) -> None:
        self._by_run: dict[str, dict[str, Callable[..., Any]]] = {}
        self._lock = threading.Lock()

    def set(self, job_id: str, callbacks: Mapping[str, Callable[..., Any]]) -> None:
        """Keep ``job_id``'s callbacks (an empty mapping forgets them)."""
        with self._lock:
            if callbacks:
                self._by_run[job_id] = dict(callbacks)
            else:
                self._by_run.pop(job_id, None)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._by_run.pop(job_id, None)

    def get(self, job_id: str, kind: str) -> Callable[..., Any] | None:
        """The run's ``kind`` callback, if it gave one."""
        if not self._by_run:  # the common case (no run gave any): no lock taken
            return None
        with self._lock:
            return self._by_run.get(job_id, {}).get(kind)

    def __len__(self) -> int:
        return len(self._by_run)


@dataclass(frozen=True)
class RunEnv:
    """What the App hands every phase and tool it runs (see the module doc)."""

    children: ChildRuns | None = None
    flow: FlowControl | None = None
    callbacks: RunCallbacks = field(default_factory=RunCallbacks)
    clock: Callable[[], float] = time.time

    def child_runs(self) -> ChildRuns:
        """The App that starts child jobs, or :class:`ConfigurationError` when the job runs without one."""
        if self.children is None:
            raise ConfigurationError("an agent or pipeline used as a tool or phase runs child jobs, which needs the "
                                     "job to be advanced by an App (App.advance, a worker, or app.drain())")
        return self.children

    def active_flow(self) -> FlowControl | None:
        """The flow control when it limits anything, else ``None`` (nothing to pay for)."""
        return self.flow if self.flow is not None and self.flow.enabled else None


EMPTY_ENV = RunEnv()
"""The environment of a job advanced without an App: no child runs, no flow control, no callbacks."""

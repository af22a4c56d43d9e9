"""``App``: the one handle users hold — storage, scheduler, and the agents and pipelines they run.

The web side starts runs with it, workers and cron advance them with it
(``pipelines worker --app myapp.agents:app`` loads it by import path), and
operators steer runs with it. A job names its pipeline; the app maps that
name to phases, so one worker serves many pipelines and agents::

    app = App(storage=..., scheduler=..., agents=[support], pipelines={"etl": Pipeline(phases=[...], state=S)})
    run = app.run_agent("support", job_id="chat-1", messages=["hi"])
    run.wait(); app.get("chat-1").result
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from adapters.base import HostedScheduler, InProcessScheduler, Scheduler, Storage, WorkerEntry
from pipelines.app.controls import Controls, check_retention, flow_control
from pipelines.app.entry import WORKER_ENTRY
from pipelines.app.read_model import ReadModel
from pipelines.app.registry import PipelineSource, Registry, named_pipelines
from pipelines.app.runs import Runs
from pipelines.engine import flow
from pipelines.engine.capabilities import Feature, as_feature
from pipelines.engine.env import RunEnv
from pipelines.engine.errors import ConfigurationError, InvalidInputError
from pipelines.engine.leases import check_lease_seconds
from pipelines.engine.models import Event, JobRecord, JobStatus, LogEntry, Message
from pipelines.engine.phase import Phase, Pipeline
from pipelines.engine.runner import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_INTERRUPTED_TURNS,
    AdvanceResult,
    check_continue_for,
)
from pipelines.engine.runner.interrupted import check_max_interrupted
from pipelines.engine.start import RetryMode
from pipelines.handle import JobView, RunHandle
from pipelines.provenance import current_commit

__all__ = ["App"]

logger = logging.getLogger("pipelines")

# The App a scheduler belongs to, so the low-level functions (run_pipeline(storage=, scheduler=)) reuse it
# instead of re-binding per call. Weak on both sides: an App holds its scheduler, so a strong value would keep
# its key, and with it the App, its storage and every job a memory storage holds, alive for good. An
# in-process scheduler keeps its App alive itself (attach holds app.advance); a queue scheduler's App lives as
# long as its caller holds it.
_attached: weakref.WeakKeyDictionary[Any, weakref.ref[App]] = weakref.WeakKeyDictionary()


class App:
    """Pipelines and agents by name, bound to one storage and one scheduler (see the module docstring).

    A thin face over its parts: :attr:`registry` (:class:`~pipelines.app.registry.Registry`),
    :attr:`runs` (starting runs, :class:`~pipelines.app.runs.Runs`), :attr:`controls` (operating on
    them, :class:`~pipelines.app.controls.Controls`) and :attr:`read` (the read model,
    :class:`~pipelines.app.read_model.ReadModel`); each method here is one call to one of them.

    ``schemas``: pydantic models a run may name as its ``output_schema``
    (``app.run_agent(..., output_schema=Invoice)``); workers find them by name.
    ``lease_seconds``: the lease a worker holds while a phase runs (renewed).
    ``continue_for``: how long a worker may keep running a job's next due
    phases itself before handing the job back to the queue.
    ``version``: the app's version string, recorded on every run as a
    ``version:`` tag (with a ``commit:`` tag from the environment or the git
    checkout) unless ``provenance=False`` or the run gives such a tag itself.
    ``retention``: seconds a finished job (complete, error, cancelled) is
    kept; older ones, with everything they stored, are deleted by the sweeps
    (``advance_due``, the worker's ``requeue_overdue``) and by :meth:`gc`.
    ``None`` (the default) keeps jobs until deleted.
    ``rate_limits``: :class:`~pipelines.engine.flow.RateLimit` budgets per
    model, shared by every worker; ``concurrency``: ``{key prefix or "*":
    n}``, at most ``n`` turns at once of runs whose ``concurrency_key``
    matches (the longest prefix wins). Both live in ``flow_store`` (default:
    the storage's own, ``storage.flow_store()``); see :mod:`pipelines.engine.flow`.
    ``max_interrupted_turns``: a job whose turn lost its lease without committing this many times in a row
    (default 5: each worker that ran it died, or stalled past its lease) is failed, saying so, instead of
    handed to the next worker (a poison turn: a segfault, an OOM kill); ``retry`` runs it again from a count
    of 0. ``None``: never failed for it. See :mod:`pipelines.engine.runner.interrupted`.
    """

    def __init__(
        self,
        *,
        storage: Storage,
        scheduler: Scheduler,
        pipelines: Mapping[str, Sequence[Phase] | Pipeline] | None = None,
        agents: Iterable[PipelineSource] = (),
        schemas: Iterable[type[BaseModel]] = (),
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        continue_for: float = 0.0,
        version: str | None = None,
        provenance: bool = True,
        retention: float | None = None,
        rate_limits: Sequence[flow.RateLimit] = (),
        concurrency: Mapping[str, int] | None = None,
        flow_store: Any = None,
        max_interrupted_turns: int | None = DEFAULT_MAX_INTERRUPTED_TURNS,
    ) -> None:
        if not isinstance(storage, Storage):
            raise ConfigurationError(f"storage must implement adapters.base.Storage, got {type(storage).__name__}")
        if not isinstance(scheduler, Scheduler):
            raise ConfigurationError(f"scheduler must implement adapters.base.Scheduler, "
                                     f"got {type(scheduler).__name__}")
        self.storage = storage
        self.scheduler = scheduler
        self.lease_seconds = check_lease_seconds(lease_seconds)
        self.continue_for = check_continue_for(continue_for)
        self.max_interrupted_turns = check_max_interrupted(max_interrupted_turns)
        if version is not None and not isinstance(version, str):
            raise InvalidInputError(f"version must be a string, got {type(version).__name__}")
        self.version = version
        self.provenance = bool(provenance)
        self.retention = check_retention(retention)
        #: The code's commit, recorded as a ``commit:`` tag on every run (``None`` without provenance).
        self.provenance_commit: str | None = current_commit() if self.provenance else None
        self.flow = flow_control(storage, scheduler, rate_limits, concurrency, flow_store, self.lease_seconds)
        #: What every phase and tool this App runs is handed (child runs, flow limits, callbacks, clock).
        self.env = RunEnv(children=self, flow=self.flow, clock=scheduler.now)
        #: Its pipelines, agents and output schemas, by name.
        self.registry = Registry(version)
        #: What the web page, the CLI and services read; the registries are shared.
        self.read = ReadModel(storage, scheduler, agents=self.registry.agents, pipelines=self.registry.pipelines,
                              typed=self)
        #: Starting runs; operating on them.
        self.runs = Runs(self)
        self.controls = Controls(self)
        for schema in schemas:
            self.add_schema(schema)
        for name, phases in named_pipelines(pipelines):
            self.add_pipeline(name, phases)
        for agent in agents:
            self.add_agent(agent)
        in_process = as_feature(scheduler, Feature.IN_PROCESS, InProcessScheduler)  # type: ignore[type-abstract]
        if in_process is not None:
            in_process.attach(self.advance)  # once, here: nothing re-binds it per call
        hosted = as_feature(scheduler, Feature.HOSTED, HostedScheduler)  # type: ignore[type-abstract]
        if hosted is not None:  # a queue scheduler learns what its workers run; the local one, the sweep
            hosted.bind(self)
        _attached[scheduler] = weakref.ref(self)

    #: What a queue message makes a worker run, by path (told to a queue scheduler when the App is built).
    worker_entry: WorkerEntry = WORKER_ENTRY

    @classmethod
    def for_adapters(cls, storage: Storage, scheduler: Scheduler) -> App:
        """The App already attached to ``scheduler`` with this ``storage``, else a new one (the low-level layer)."""
        ref = _attached.get(scheduler)
        app = None if ref is None else ref()
        if app is not None and app.storage is storage:
            return app
        return cls(storage=storage, scheduler=scheduler)

    # --- registry (pipelines.app.registry) -------------------------------------------------
    def add_schema(self, schema: type[BaseModel]) -> None:
        """Register an output schema runs may name (by its class name)."""
        self.registry.add_schema(schema)

    def add_pipeline(self, name: str, phases: Sequence[Phase] | Pipeline, *, replace: bool = False) -> None:
        """Register ``phases`` (or a :class:`Pipeline`) under ``name``, validated now, not at the first job."""
        self.registry.add_pipeline(name, phases, replace=replace)

    def add_agent(self, agent: PipelineSource, *, replace: bool = False) -> None:
        """Register an agent; its pipeline is named after it."""
        self.registry.add_agent(agent, replace=replace)

    @property
    def names(self) -> list[str]:
        """Registered pipeline names (agents included), sorted."""
        return self.registry.names

    @property
    def agents(self) -> dict[str, PipelineSource]:
        return dict(self.registry.agents)

    @property
    def schemas(self) -> dict[str, type[BaseModel]]:
        """The output schemas runs may name, by class name (shared with the registry)."""
        return self.registry.schemas

    def pipeline(self, name: str) -> Pipeline:
        """The pipeline registered as ``name``; :class:`InvalidPipelineError` naming what exists otherwise."""
        return self.registry.pipeline(name)

    # --- starting runs (pipelines.app.runs) ------------------------------------------------
    def run_agent(self, agent: str | PipelineSource, *, job_id: str, messages: Sequence[Message | str] = (),
                  retry_mode: RetryMode | None = None, user: str | None = None, tags: Sequence[str] | None = None,
                  **options: Any) -> RunHandle:
        """Write an agent run (its messages and per-run options) and enqueue its first turn; returns at once.

        On a ``complete`` job id the conversation goes on with the new
        messages (not on a child run its parent still waits for, nor is one
        retried: :class:`JobConflictError`, as :meth:`delete`). Per-run ``options`` (``max_turns``, ``max_tokens``,
        ``max_cost_usd``, ``output_schema``, ``model``, ``tool_timeout``,
        ``max_retries``, ``system_prompt_conflict``, ``context``,
        ``tools_context``, ...: :class:`~phases.agent_config.RunOptions`) are
        stored with the job, so every worker honours them; anything else is
        refused. ``user="..."`` adds one user message after ``messages``.
        ``tags`` label the run (``pipelines jobs --tag``); provenance tags are
        added (see :class:`App`). Lifecycle callbacks given here (``on_end=fn``)
        run only in this process, so they need an in-process scheduler.
        """
        return self.runs.run_agent(agent, job_id=job_id, messages=messages, retry_mode=retry_mode, user=user,
                                   tags=tags, **options)

    def run_pipeline(self, name: str, *, job_id: str, initial_state: Any = None,
                     retry_mode: RetryMode | None = None, initial_phase: str | None = None) -> RunHandle:
        """Start (or retry) a job of the registered pipeline ``name``; returns at once."""
        return self.runs.run_pipeline(name, job_id=job_id, initial_state=initial_state, retry_mode=retry_mode,
                                      initial_phase=initial_phase)

    def handle(self, job_id: str) -> RunHandle:
        """A handle on an existing run (``app.handle(id).wait()``)."""
        return self.runs.handle(job_id)

    def send(self, job_id: str, messages: Sequence[Message | str]) -> JobView:
        """Send messages to a conversation: they join its transcript at the next turn boundary, in order, once.

        A running, waiting or paused job keeps them in its inbox until its next
        turn (also after a crash: the turn that takes them commits their
        removal); messages that arrive while its last turn runs start the next
        run in the commit that ends it. A complete job is continued as with ``run_agent``
        (the last run's options kept), also one whose run ends while this call runs. Only what a
        person writes is sent (strings, ``user`` and plain ``assistant``
        messages): anything else is :class:`InvalidInputError`, nothing sent.
        An agent with ``on_new_message="reject"`` refuses them while it runs.
        See :mod:`pipelines.engine.inbox` for why no message is lost.
        """
        return self.runs.send(job_id, messages)

    def fork(self, job_id: str, *, at_turn: int, new_job_id: str, run: bool = False,
             **options: Any) -> RunHandle:
        """A new job ``new_job_id`` that goes on from ``job_id`` as it was after turn ``at_turn``.

        Its transcript is the original's first messages up to that turn, its
        state the state committed then, its record names the lineage
        (``forked_from``, ``at_turn``); the original is untouched. Turns count
        the phases a job completed over its life (``pipelines status``: phases
        done; 0 is the start); the record keeps the last
        :data:`~pipelines.engine.transitions.HISTORY_LIMIT` of them. The fork
        is paused (``app.resume`` runs it) unless ``run``; a turn that ended
        the job gives a complete fork, to continue with new messages.
        ``options`` override the original's per-run options (agents only).
        Repeating a fork that landed (a retry after a crash) returns it; a
        fork to a taken id that asks anything else (another source or turn,
        ``run``, ``options``) is refused with :class:`JobConflictError`.
        """
        return self.runs.fork(job_id, at_turn=at_turn, new_job_id=new_job_id, run=run, **options)

    def rerun(self, job_id: str, *, from_turn: int, new_job_id: str, **options: Any) -> RunHandle:
        """Fork ``job_id`` after turn ``from_turn`` and run the fork at once, with ``options`` overriding
        the original's (``model=``, ``max_turns=``, ...): "what if" and regression runs."""
        return self.runs.rerun(job_id, from_turn=from_turn, new_job_id=new_job_id, **options)

    # --- reading (pipelines.app.read_model) -------------------------------------------------
    def get(self, job_id: str) -> JobView | None:
        """The job as a :class:`JobView` (typed result and state), or ``None`` for an unknown id."""
        return self.read.get(job_id)

    def view(self, record: JobRecord) -> JobView:
        """``record`` as a :class:`JobView`."""
        return self.read.view(record)

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        """The committed transcript ``[start:stop]``."""
        return self.read.messages(job_id, start, stop)

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        """Committed events after the cursor ``after`` (an event id)."""
        return self.read.events(job_id, after=after, limit=limit)

    def logs(self, job_id: str) -> list[LogEntry]:
        """The job's human-readable log."""
        return self.read.logs(job_id)

    def stream(self, job_id: str, *, after: str | None = None, follow: bool = True,
               timeout: float | None = None) -> Iterator[Event]:
        """The job's parts from the cursor ``after``: events and text as it arrives (see :mod:`pipelines.streams`)."""
        return self.read.stream(job_id, after=after, follow=follow, timeout=timeout)

    def astream(self, job_id: str, *, after: str | None = None, follow: bool = True,
                timeout: float | None = None) -> AsyncIterator[Event]:
        """:meth:`stream` for ``async`` code."""
        return self.read.astream(job_id, after=after, follow=follow, timeout=timeout)

    def jobs(self, *, status: JobStatus | None = None, tags: Sequence[str] = (), limit: int = 1000) -> list[JobView]:
        """Jobs (oldest first), optionally only those in ``status`` carrying every tag in ``tags``."""
        return self.read.jobs(status=status, tags=tags, limit=limit)

    def queue_of(self, priority: str | None = None) -> str | None:
        """The queue a run of ``priority`` waits on, as its scheduler names it; ``None`` for an in-process one."""
        return self.read.queue_of(priority)

    @property
    def storage_path(self) -> str | None:
        """Where a file storage (SQLite) keeps its data; ``None`` for a server or memory."""
        return self.read.storage_path

    @property
    def has_listing_index(self) -> bool:
        """Whether the storage keeps listing indexes: counts without reading records, pages by cursor."""
        return self.read.has_listing_index

    def count_jobs(self, status: JobStatus | None = None) -> int | None:
        """How many jobs there are (in ``status``), from the listing index; ``None`` when the storage has none."""
        return self.read.count_jobs(status)

    # --- operating on runs (pipelines.app.controls) ------------------------------------------
    def cancel(self, job_id: str, *, wait: float = 30.0, force: bool = False) -> JobView:
        """Cancel at the turn boundary, keeping the checkpoint (see :func:`pipelines.engine.control.cancel_job`)."""
        return self.controls.cancel(job_id, wait=wait, force=force)

    def pause(self, job_id: str, *, wait: float = 30.0) -> JobView:
        """Pause at the turn boundary (see :func:`pipelines.engine.control.pause_job`)."""
        return self.controls.pause(job_id, wait=wait)

    def resume(self, job_id: str) -> JobView:
        """Resume a paused job from its checkpoint."""
        return self.controls.resume(job_id)

    def retry(self, job_id: str, *, mode: RetryMode = "resume") -> JobView:
        """Run a failed or cancelled job again: ``"resume"`` from its checkpoint, ``"full"`` from the start."""
        return self.controls.retry(job_id, mode=mode)

    def approve(self, job_id: str, call_id: str, *, digest: str | None = None) -> JobView:
        """Approve a waiting tool call with the arguments it was shown with (``digest``: see :meth:`reject`)."""
        return self.controls.approve(job_id, call_id, digest=digest)

    def reject(self, job_id: str, call_id: str, *, reason: str, digest: str | None = None) -> JobView:
        """Reject a waiting call (the model reads ``reason``); ``digest``: a pending call's, refused if it changed."""
        return self.controls.reject(job_id, call_id, reason=reason, digest=digest)

    def record_tool_result(self, job_id: str, call_id: str, result: Any) -> JobView:
        """Record what an interrupted call did, as a person found it (see :mod:`phases.approvals`)."""
        return self.controls.record_tool_result(job_id, call_id, result)

    def supply_input(self, job_id: str, key: str, value: Any) -> JobView:
        """Give a phase waiting in ``wait_for_input(ctx, key, ...)`` its input: the job runs on (JSON ``value``)."""
        return self.controls.supply_input(job_id, key, value)

    def advance(self, job_id: str) -> AdvanceResult:
        """Advance ``job_id`` with the pipeline its record names (what a worker or cron does); idempotent."""
        return self.controls.advance(job_id)

    try_advance = advance

    def advance_due(self, *, grace: float = 0.0, limit: int = 1000) -> list[tuple[str, AdvanceResult]]:
        """Advance every running job due for ``grace`` seconds and not leased: the sweep (I7). One bad job (an
        unknown pipeline, a corrupt record, a bug) is logged and reported ``unreached``: it never stops it."""
        return self.controls.advance_due(grace=grace, limit=limit)

    def requeue_overdue(self, *, grace: float, limit: int = 1000) -> list[str]:
        """Enqueue (not run) every job overdue by ``grace`` seconds: the worker's sweep (and retention's)."""
        return self.controls.requeue_overdue(grace=grace, limit=limit)

    def drain(self, *, max_advances: int = 1_000_000) -> int:
        """Run every scheduled advance now (an in-process scheduler only); returns how many ran."""
        return self.controls.drain(max_advances=max_advances)

    def run_in_process(self) -> bool:
        """Drain an in-process scheduler (nothing else runs its jobs; ``True``); a no-op for queue schedulers."""
        return self.controls.run_in_process()

    def delete(self, job_id: str) -> None:
        """Delete ``job_id``, its child runs and everything they stored (transcript, logs, events, live stream...).

        Atomic per job (judged at a version, deleted only if still at it). The child runs it listed go first,
        theirs before them, the job last: a delete that dies midway is finished by the next. A running or waiting
        job, or one with such a child run, is refused with :class:`JobConflictError` (cancel it first), and so is a
        finished child its parent still waits for; an unknown job raises :class:`~pipelines.errors.JobNotFoundError`.
        """
        self.controls.delete(job_id)

    def gc(self, older_than: float | None = None, *, scan: bool = False, limit: int = 1000,
           all_pipelines: bool = False) -> list[str]:
        """Delete finished jobs (complete, error, cancelled) that finished over ``older_than`` seconds ago.

        ``older_than`` defaults to the app's ``retention``. Candidates: at most ``limit`` entries of the finished
        index, on from where the last call stopped, round to the oldest (:mod:`pipelines.app.retention`);
        ``scan=True`` also reads every record (jobs finished before that index existed, or no index). A job
        restarted meanwhile is left alone, and so is a child run its parent still waits for. Only this app's jobs
        (its pipelines', their child runs') go, not another app's on the storage, unless ``all_pipelines=True``.
        """
        return self.controls.gc(older_than, scan=scan, limit=limit, all_pipelines=all_pipelines)

    def migrate_storage(self) -> tuple[int, int]:
        """Upgrade the storage's schema to this version (``pipelines migrate``): ``(before, after)``."""
        return self.controls.migrate_storage()

    def reindex(self) -> int:
        """Put jobs stored before the listing indexes existed into them (safe while workers run); how many."""
        return self.controls.reindex()


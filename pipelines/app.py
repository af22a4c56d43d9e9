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

import dataclasses
import hashlib
import json
import logging
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from adapters.base import (
    CountingIndex,
    FlowCapable,
    InProcessScheduler,
    RetentionStore,
    Scheduler,
    Storage,
    VersionedSchema,
)
from phases import approvals
from phases.callbacks import CALLBACKS, check_callbacks
from pipelines.engine import children, control, flow, inbox, transitions, versions, writer
from pipelines.engine.capabilities import Feature, as_feature, has
from pipelines.engine.env import RunEnv
from pipelines.engine.errors import (
    ConfigurationError,
    CorruptRecordError,
    InvalidInputError,
    InvalidPipelineError,
    JobConflictError,
    PipelineError,
    StaleVersionError,
)
from pipelines.engine.leases import check_lease_seconds
from pipelines.engine.models import Event, JobRecord, JobStatus, LogEntry, Message, to_json_value, validate_job_id
from pipelines.engine.phase import Phase, Pipeline
from pipelines.engine.runner import DEFAULT_LEASE_SECONDS, AdvanceResult, advance_job, as_pipeline
from pipelines.engine.start import RetryMode, check_retry_mode, start_job
from pipelines.handle import JobView, RunHandle
from pipelines.provenance import current_commit, with_provenance
from pipelines.read_model import ReadModel, tags_of

__all__ = ["App", "PipelineSource", "RetentionStore", "tags_of"]

logger = logging.getLogger("pipelines")


@runtime_checkable
class PipelineSource(Protocol):
    """Something that names a pipeline and builds it (an :class:`~pipelines.agent.Agent` does)."""

    @property
    def name(self) -> str: ...

    @property
    def uses_litellm(self) -> bool:
        """Whether its model calls litellm (workers then import and warm it before forking)."""
        ...

    def pipeline(self) -> Pipeline: ...

    @property
    def takes_messages_while_running(self) -> bool:
        """Whether ``app.send`` may queue messages for a run in progress (else it is refused)."""
        ...

    def start_run(self, job_id: str, messages: Any, options: Mapping[str, Any], app: App) -> dict[str, Any]:
        """Keyword arguments for :func:`~pipelines.engine.start.start_job` of one run (messages, state, options)."""
        ...

    def typed_result(self, record: JobRecord, app: App) -> Any:
        """The job's result as its users expect it (an output schema instance, say)."""
        ...

    def accept_schemas(self, schemas: Mapping[str, type[BaseModel]]) -> None:
        """Learn the output schemas registered on the App (per-run ``output_schema`` names them)."""
        ...


# The App a scheduler belongs to, so the low-level functions (run_pipeline(storage=, scheduler=)) reuse it
# instead of re-binding per call. Weak on both sides: an App holds its scheduler, so a strong value would keep
# its key, and with it the App, its storage and every job a memory storage holds, alive for good. An
# in-process scheduler keeps its App alive itself (attach holds app.advance); a queue scheduler's App lives as
# long as its caller holds it.
_attached: weakref.WeakKeyDictionary[Any, weakref.ref[App]] = weakref.WeakKeyDictionary()


class App:
    """Pipelines and agents by name, bound to one storage and one scheduler (see the module docstring).

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
    ) -> None:
        if not isinstance(storage, Storage):
            raise ConfigurationError(f"storage must implement adapters.base.Storage, got {type(storage).__name__}")
        if not isinstance(scheduler, Scheduler):
            raise ConfigurationError(f"scheduler must implement adapters.base.Scheduler, "
                                     f"got {type(scheduler).__name__}")
        self.storage = storage
        self.scheduler = scheduler
        self.lease_seconds = check_lease_seconds(lease_seconds)
        self.continue_for = continue_for
        if version is not None and not isinstance(version, str):
            raise InvalidInputError(f"version must be a string, got {type(version).__name__}")
        self.version = version
        self.provenance = bool(provenance)
        self.retention = _check_retention(retention)
        self._commit: str | None = current_commit() if self.provenance else None
        self.flow = _flow_control(storage, scheduler, rate_limits, concurrency, flow_store, self.lease_seconds)
        #: What every phase and tool this App runs is handed (child runs, flow limits, callbacks, clock).
        self.env = RunEnv(children=self, flow=self.flow, clock=scheduler.now)
        self._pipelines: dict[str, Pipeline] = {}
        self._agents: dict[str, PipelineSource] = {}
        self.schemas: dict[str, type[BaseModel]] = {}
        #: What the web page, the CLI and services read (pipelines.read_model); the registries are shared.
        self.read = ReadModel(storage, scheduler, agents=self._agents, pipelines=self._pipelines, typed=self)
        for schema in schemas:
            self.add_schema(schema)
        for name, phases in (pipelines or {}).items():
            self.add_pipeline(name, phases)
        for agent in agents:
            self.add_agent(agent)
        in_process = as_feature(scheduler, Feature.IN_PROCESS, InProcessScheduler)  # type: ignore[type-abstract]
        if in_process is not None:
            # Attached once, here: nothing re-binds it per call.
            in_process.attach(self.advance)
        _attached[scheduler] = weakref.ref(self)

    @classmethod
    def for_adapters(cls, storage: Storage, scheduler: Scheduler) -> App:
        """The App already attached to ``scheduler`` with this ``storage``, else a new one (the low-level layer)."""
        ref = _attached.get(scheduler)
        app = None if ref is None else ref()
        if app is not None and app.storage is storage:
            return app
        return cls(storage=storage, scheduler=scheduler)

    # --- registry --------------------------------------------------------------------
    def add_schema(self, schema: type[BaseModel]) -> None:
        """Register an output schema runs may name (by its class name)."""
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise InvalidInputError(f"schemas must be pydantic model classes, got {schema!r}")
        if self.schemas.get(schema.__name__, schema) is not schema:
            raise InvalidInputError(f"two schemas named {schema.__name__!r}")
        self.schemas[schema.__name__] = schema
        for agent in self._agents.values():
            agent.accept_schemas(self.schemas)

    def add_pipeline(self, name: str, phases: Sequence[Phase] | Pipeline, *, replace: bool = False) -> None:
        """Register ``phases`` (or a :class:`Pipeline`) under ``name``, validated now, not at the first job."""
        if not isinstance(name, str) or not name:
            raise InvalidPipelineError(f"a pipeline needs a non-empty name, got {name!r}")
        if name in self._pipelines and not replace:
            raise InvalidPipelineError(f"pipeline {name!r} is registered twice")
        pipeline = as_pipeline(phases)
        if pipeline.version is None and versions.is_version(self.version):
            # Versioned by default with the app's version (a non-numeric app version leaves jobs unversioned).
            pipeline = dataclasses.replace(pipeline, version=self.version)
        self._pipelines[name] = pipeline
        self._agents.pop(name, None)
        self._add_children(phase.run for phase in pipeline.phases)

    def add_agent(self, agent: PipelineSource, *, replace: bool = False) -> None:
        """Register an agent; its pipeline is named after it."""
        if not isinstance(agent, PipelineSource):
            raise InvalidInputError(f"agents must be Agent objects, got {type(agent).__name__}")
        if self._agents.get(agent.name) is agent:
            return
        self.add_pipeline(agent.name, agent.pipeline(), replace=replace)
        self._agents[agent.name] = agent
        agent.accept_schemas(self.schemas)
        self._add_children(_tools_of(agent))

    def _add_children(self, holders: Iterable[Any]) -> None:
        """Register the agents that tools and phases run as child jobs, so workers know their pipelines."""
        for holder in holders:
            child = getattr(holder, "child_agent", None)
            if child is not None and self._agents.get(child.name) is not child:
                self.add_agent(child)

    @property
    def names(self) -> list[str]:
        """Registered pipeline names (agents included), sorted."""
        return sorted(self._pipelines)

    @property
    def agents(self) -> dict[str, PipelineSource]:
        return dict(self._agents)

    def pipeline(self, name: str) -> Pipeline:
        """The pipeline registered as ``name``; :class:`InvalidPipelineError` naming what exists otherwise."""
        try:
            return self._pipelines[name]
        except KeyError:
            known = ", ".join(self.names) or "none"
            raise InvalidPipelineError(f"unknown pipeline {name!r}; this app has: {known}") from None

    def _agent(self, agent: str | PipelineSource) -> PipelineSource:
        if isinstance(agent, str):
            found = self._agents.get(agent)
            if found is None:
                known = ", ".join(sorted(self._agents)) or "none"
                raise InvalidPipelineError(f"unknown agent {agent!r}; this app has: {known}")
            return found
        self.add_agent(agent)  # an Agent object not registered yet is registered now
        if self._agents.get(agent.name) is not agent:
            raise ConfigurationError(f"another agent named {agent.name!r} is registered on this app")
        return agent

    # --- starting runs -------------------------------------------------------------------
    def run_agent(self, agent: str | PipelineSource, *, job_id: str, messages: Sequence[Message | str] = (),
                  retry_mode: RetryMode | None = None, user: str | None = None, tags: Sequence[str] | None = None,
                  **options: Any) -> RunHandle:
        """Write an agent run (its messages and per-run options) and enqueue its first turn; returns at once.

        On a ``complete`` job id the conversation goes on with the new
        messages. Per-run ``options`` (``max_turns``, ``max_tokens``,
        ``max_cost_usd``, ``output_schema``, ``model``, ``tool_timeout``,
        ``max_retries``, ``system_prompt_conflict``, ``context``,
        ``tools_context``, ...: :class:`~phases.agent_config.RunOptions`) are
        stored with the job, so every worker honours them; anything else is
        refused. ``user="..."`` adds one user message after ``messages``.
        ``tags`` label the run (``pipelines jobs --tag``); provenance tags are
        added (see :class:`App`). Lifecycle callbacks given here (``on_end=fn``)
        run only in this process, so they need an in-process scheduler.
        """
        source = self._agent(agent)
        if user is not None:
            if not isinstance(user, str):
                raise InvalidInputError(f"user must be a string, got {type(user).__name__}")
            messages = [*as_message_list(messages), user]
        all_tags = with_provenance(tags, version=self.version, commit=self._commit, enabled=self.provenance)
        if all_tags:  # no tags, no key: an untagged run's options stay as the caller gave them
            options["tags"] = all_tags
        run_callbacks = check_callbacks({k: options.pop(k) for k in CALLBACKS if k in options})
        if run_callbacks and not has(self.scheduler, Feature.IN_PROCESS):
            raise ConfigurationError(
                f"per-run callbacks ({', '.join(run_callbacks)}) are Python callables that cannot reach the workers "
                f"of {type(self.scheduler).__name__}; set them on the Agent instead (it is rebuilt on every worker)")
        _evaluate_concurrency_key(job_id, options)
        kwargs = source.start_run(job_id, messages, options, self)
        self.env.callbacks.set(job_id, run_callbacks)
        # The first turn goes to the queue of the run's priority, like every later one.
        scheduler = flow.with_priority(self.scheduler, flow.check_priority(options.get("priority") or "interactive"))
        try:
            start_job(job_id=job_id, pipeline=self.pipeline(source.name), name=source.name, storage=self.storage,
                      scheduler=scheduler, retry_mode=check_retry_mode(retry_mode), continue_completed=True,
                      **kwargs)
        except BaseException:
            self.env.callbacks.forget(job_id)
            raise
        return RunHandle(self, job_id)

    def run_pipeline(self, name: str, *, job_id: str, initial_state: Any = None,
                     retry_mode: RetryMode | None = None, initial_phase: str | None = None) -> RunHandle:
        """Start (or retry) a job of the registered pipeline ``name``; returns at once."""
        start_job(job_id=job_id, pipeline=self.pipeline(name), name=name, storage=self.storage,
                  scheduler=self.scheduler, initial_state=initial_state, retry_mode=check_retry_mode(retry_mode),
                  initial_phase=initial_phase)
        return RunHandle(self, job_id)

    def handle(self, job_id: str) -> RunHandle:
        """A handle on an existing run (``app.handle(id).wait()``)."""
        return RunHandle(self, validate_job_id(job_id))

    # --- reading: a thin face over the read model (pipelines.read_model) ----------------------
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

    # --- operating on the storage ---------------------------------------------------------------
    def migrate_storage(self) -> tuple[int, int]:
        """Upgrade the storage's schema to this version (``pipelines migrate``): ``(before, after)``."""
        schema = as_feature(self.storage, Feature.SCHEMA, VersionedSchema)  # type: ignore[type-abstract]
        if schema is None:
            raise ConfigurationError(f"{type(self.storage).__name__} keeps no schema version: nothing to migrate "
                                     "(pipelines migrate upgrades an SQLite file)")
        return schema.migrate()

    def reindex(self) -> int:
        """Put jobs stored before the listing indexes existed into them (safe while workers run); how many."""
        counter = as_feature(self.storage, Feature.COUNTS, CountingIndex)  # type: ignore[type-abstract]
        if counter is None:
            raise ConfigurationError(f"{type(self.storage).__name__} has no listing index to rebuild")
        return counter.reindex()

    # --- forks ---------------------------------------------------------------------------------
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
        validate_job_id(new_job_id)
        src = control.load_job(self.storage, job_id)
        mark = transitions.turn_mark(src, at_turn)
        if run and mark.next_phase is None:
            raise InvalidInputError(f"turn {at_turn} ended job {job_id!r}: nothing runs after it; re-run from "
                                    "an earlier turn, or fork it and continue with new messages")
        overrides = self._fork_options(src, options)
        request = _fork_request(src.job_id, mark.phases_done, run, overrides)
        existing = self.storage.get_job(new_job_id)
        if existing is not None:
            return RunHandle(self, _landed_fork(existing, new_job_id, request))
        messages = self.storage.messages(job_id, 0, mark.transcript_len)
        if len(messages) != mark.transcript_len:
            raise CorruptRecordError(f"job {job_id!r} holds {len(messages)} messages, fewer than the "
                                     f"{mark.transcript_len} its turn {at_turn} committed")
        commit = transitions.fork(src, mark, new_job_id=new_job_id, messages=messages, request=request,
                                  options={**src.options, **overrides}, run=run, now=self.scheduler.now())
        try:
            writer.apply(self.storage, self.scheduler, commit)
        except JobConflictError:
            # Taken since the look above (the create refuses a taken id atomically): the request the
            # other create wrote, never changed after, says whether it is this very fork.
            return RunHandle(self, _landed_fork(self.storage.get_job(new_job_id), new_job_id, request))
        return RunHandle(self, new_job_id)

    def rerun(self, job_id: str, *, from_turn: int, new_job_id: str, **options: Any) -> RunHandle:
        """Fork ``job_id`` after turn ``from_turn`` and run the fork at once, with ``options`` overriding
        the original's (``model=``, ``max_turns=``, ...): "what if" and regression runs."""
        return self.fork(job_id, at_turn=from_turn, new_job_id=new_job_id, run=True, **options)

    def _fork_options(self, src: JobRecord, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` checked as a new run's would be: what a fork puts over the original's per-run options."""
        if not options:
            return {}
        source = self._agents.get(src.pipeline)
        if source is None:
            raise InvalidInputError(f"per-run options ({', '.join(sorted(options))}) apply to agent runs; "
                                    f"job {src.job_id!r} runs the pipeline {src.pipeline!r}")
        checked: dict[str, Any] = source.start_run(src.job_id, [], options, self)["options"]
        return checked

    # --- deleting -------------------------------------------------------------------------------
    def delete(self, job_id: str) -> None:
        """Delete ``job_id`` and everything it stored (transcript, logs, events, live stream, index entries).

        Atomic per job: the status is judged at a version and the delete
        lands only if the job is still at it. A running or waiting job is
        refused with :class:`JobConflictError` (cancel it first), and so is a
        finished child run its parent still waits for (its outcome is not in
        the parent yet); an unknown one raises
        :class:`~pipelines.engine.errors.JobNotFoundError`.
        """
        for _ in range(3):
            rec = control.load_job(self.storage, job_id)
            if rec.status in (JobStatus.RUNNING, JobStatus.WAITING):
                raise JobConflictError(f"job {job_id!r} is {rec.status.value}; cancel it before deleting it")
            if (parent := children.awaited_by(rec, self.storage)) is not None:
                raise JobConflictError(f"job {job_id!r} is a child run its parent {parent!r} still waits for; "
                                       "delete it once the parent has woken, or cancel the parent first")
            if self._delete_at(rec) is not None:
                self.env.callbacks.forget(job_id)
                return
        raise JobConflictError(f"job {job_id!r} kept changing while it was being deleted; try again")

    def gc(self, older_than: float | None = None, *, scan: bool = False, limit: int = 1000) -> list[str]:
        """Delete finished jobs (complete, error, cancelled) that finished over ``older_than`` seconds ago.

        ``older_than`` defaults to the app's ``retention``. Candidates come
        from the finished index the commits keep; ``scan=True`` also reads
        every record (jobs that finished before that index existed, or a
        storage without one). A job restarted meanwhile is left alone, and so
        is a child run its parent still waits for. Returns the deleted ids.
        """
        age = self.retention if older_than is None else _check_retention(older_than, "older_than")
        if age is None:
            raise ConfigurationError("gc needs older_than= (seconds) or an App(retention=...)")
        before = self.scheduler.now() - age
        ids = self._finished_before(before, scan=scan, limit=limit)
        removed = []
        for job_id in ids:
            rec = self.storage.get_job(job_id)
            # Judged again on the record: the index entry may be older than a restart.
            expired = rec is not None and rec.status in transitions.FINISHED and rec.updated_at <= before
            if expired and rec is not None and children.awaited_by(rec, self.storage) is not None:
                continue  # its parent has not read its outcome yet: a later sweep deletes it
            if expired and rec is not None and self._delete_at(rec):
                self.env.callbacks.forget(job_id)
                removed.append(job_id)
        return removed

    def _finished_before(self, before: float, *, scan: bool, limit: int) -> list[str]:
        indexed = as_feature(self.storage, Feature.RETENTION, RetentionStore)  # type: ignore[type-abstract]
        ids = indexed.finished_jobs(before, limit=limit) if indexed is not None else []
        if scan or indexed is None:
            found = [r.job_id for r in self.storage.list_jobs(limit=1_000_000)
                     if r.status in transitions.FINISHED and r.updated_at <= before]
            ids = list(dict.fromkeys([*ids, *found]))
        return ids[: max(0, limit)]

    def _delete_at(self, rec: JobRecord) -> bool | None:
        """Delete ``rec``'s job if it is still at ``rec.version``; ``None`` when it moved on meanwhile."""
        try:
            return writer.delete(self.storage, rec)
        except StaleVersionError:
            return None

    def _sweep_retention(self) -> None:
        """The sweeps' share of retention: delete what has expired (logged, never raised)."""
        if self.retention is None:
            return
        try:
            removed = self.gc()
        except PipelineError as exc:
            logger.error("retention sweep failed: %s", exc)
            return
        if removed:
            logger.info("retention: deleted %d finished job(s)", len(removed))

    def send(self, job_id: str, messages: Sequence[Message | str]) -> JobView:
        """Send messages to a conversation: they join its transcript at the next turn boundary, in order, once.

        A running, waiting or paused job keeps them in its inbox until its next
        turn (also after a crash: the turn that takes them commits their
        removal); messages that arrive while its last turn runs start the next
        run in the commit that ends it. A complete job is continued as with
        ``run_agent``, also one whose run ends while this call runs. Only what a
        person writes is sent (strings, ``user`` and plain ``assistant``
        messages): anything else is :class:`InvalidInputError`, nothing sent.
        An agent with ``on_new_message="reject"`` refuses them while it runs.
        See :mod:`pipelines.engine.inbox` for why no message is lost.
        """
        record = control.load_job(self.storage, job_id)
        source = self._agents.get(record.pipeline)
        if source is None:
            raise InvalidInputError(f"job {job_id!r} runs pipeline {record.pipeline!r}, not an agent: "
                                    "only conversations take messages")
        msgs = inbox.person_messages(as_message_list(messages))
        inbox.send(self.storage, record, msgs, agent=source.name,
                   takes_while_running=source.takes_messages_while_running,
                   continue_run=lambda: self.run_agent(source, job_id=job_id, messages=msgs))
        return self.view(control.load_job(self.storage, job_id))

    # --- steering ------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, wait: float = 30.0, force: bool = False) -> JobView:
        """Cancel at the turn boundary, keeping the checkpoint (see :func:`pipelines.engine.control.cancel_job`)."""
        return self.view(control.cancel_job(job_id, storage=self.storage, scheduler=self.scheduler, wait=wait,
                                            force=force))

    def pause(self, job_id: str, *, wait: float = 30.0) -> JobView:
        """Pause at the turn boundary (see :func:`pipelines.engine.control.pause_job`)."""
        return self.view(control.pause_job(job_id, storage=self.storage, scheduler=self.scheduler, wait=wait))

    def resume(self, job_id: str) -> JobView:
        """Resume a paused job from its checkpoint."""
        return self.view(control.resume_job(job_id, storage=self.storage, scheduler=self.scheduler))

    def retry(self, job_id: str, *, mode: RetryMode = "resume") -> JobView:
        """Run a failed or cancelled job again: ``"resume"`` from its checkpoint, ``"full"`` from the start."""
        record = control.load_job(self.storage, job_id)
        retry_mode = check_retry_mode(mode, optional=False, name="mode")
        start_job(job_id=job_id, pipeline=self.pipeline(record.pipeline), name=record.pipeline,
                  storage=self.storage, scheduler=self.scheduler, retry_mode=retry_mode)
        return self.view(control.load_job(self.storage, job_id))

    def approve(self, job_id: str, call_id: str) -> JobView:
        """Approve a waiting tool call with the arguments it was shown with."""
        return self.view(approvals.approve(job_id, call_id, storage=self.storage, scheduler=self.scheduler))

    def reject(self, job_id: str, call_id: str, *, reason: str) -> JobView:
        """Reject a waiting tool call; the model reads ``reason`` as its result."""
        return self.view(approvals.reject(job_id, call_id, reason=reason, storage=self.storage,
                                          scheduler=self.scheduler))

    def record_tool_result(self, job_id: str, call_id: str, result: Any) -> JobView:
        """Record what an interrupted call did, as a person found it (see :mod:`phases.approvals`)."""
        return self.view(approvals.record_tool_result(job_id, call_id, result, storage=self.storage,
                                                      scheduler=self.scheduler))

    # --- advancing ---------------------------------------------------------------------------
    def advance(self, job_id: str) -> AdvanceResult:
        """Advance ``job_id`` with the pipeline its record names (what a worker or cron does); idempotent."""
        # The App's environment goes with the job: tools and phases that start child jobs start them on
        # this App, on whatever thread they run (see pipelines.engine.env).
        return advance_job(job_id, lambda record: self.pipeline(record.pipeline), storage=self.storage,
                           scheduler=self.scheduler, lease_seconds=self.lease_seconds,
                           continue_for=self.continue_for, env=self.env)

    try_advance = advance

    def advance_due(self, *, grace: float = 0.0, limit: int = 1000) -> list[tuple[str, AdvanceResult]]:
        """Advance every running job due for at least ``grace`` seconds and not leased: the sweep (I7).

        One bad job (an unknown pipeline, a corrupt record) is logged and
        reported ``unknown``; it never stops the sweep.
        """
        done: list[tuple[str, AdvanceResult]] = []
        for job_id in self.storage.due_jobs(self.scheduler.now() - grace, limit=limit):
            try:
                done.append((job_id, self.advance(job_id)))
            except PipelineError as exc:
                done.append((job_id, AdvanceResult.UNKNOWN))
                logger.error("sweep: job %s: %s", job_id, exc)
        for parent in children.ready_parents(self.storage, limit=limit):
            # A parent whose children finished but whose wake-up was lost (pipelines.engine.children).
            try:
                done.append((parent.job_id, self.advance(parent.job_id)))
            except PipelineError as exc:
                done.append((parent.job_id, AdvanceResult.UNKNOWN))
                logger.error("sweep: parent %s: %s", parent.job_id, exc)
        self._sweep_retention()
        return done

    def requeue_overdue(self, *, grace: float, limit: int = 1000) -> list[str]:
        """Enqueue (not run) every job overdue by ``grace`` seconds: the worker's sweep (and retention's)."""
        requeued = control.requeue_overdue(self.storage, self.scheduler, grace=grace, limit=limit)
        self._sweep_retention()
        return requeued

    def drain(self, *, max_advances: int = 1_000_000) -> int:
        """Run every scheduled advance now (an in-process scheduler only); returns how many ran."""
        in_process = as_feature(self.scheduler, Feature.IN_PROCESS, InProcessScheduler)  # type: ignore[type-abstract]
        if in_process is None:
            raise ConfigurationError(f"drain() needs an in-process scheduler such as MemoryScheduler; this app's "
                                     f"is {type(self.scheduler).__name__}: its workers advance the jobs")
        return in_process.drain(max_advances=max_advances)

    def run_in_process(self) -> None:
        """Drain an in-process scheduler (nothing else would run its jobs); a no-op for queue schedulers."""
        in_process = as_feature(self.scheduler, Feature.IN_PROCESS, InProcessScheduler)  # type: ignore[type-abstract]
        if in_process is not None:
            in_process.drain()


def _flow_control(storage: Storage, scheduler: Scheduler, rate_limits: Sequence[flow.RateLimit],
                  concurrency: Mapping[str, int] | None, store: Any, lease_seconds: float) -> flow.FlowControl:
    """The App's flow control; its state in ``store``, else the storage's own (``storage.flow_store()``)."""
    if isinstance(rate_limits, flow.RateLimit) or not isinstance(rate_limits, Sequence):
        raise InvalidInputError(f"rate_limits must be a list of RateLimit, got {type(rate_limits).__name__}")
    if store is None and (rate_limits or concurrency):
        capable = as_feature(storage, Feature.FLOW, FlowCapable)  # type: ignore[type-abstract]
        store = capable.flow_store() if capable is not None else None
    # A slot outlives a lease by a little, so a worker that holds its lease keeps its slot too.
    return flow.FlowControl(store, rate_limits=rate_limits, concurrency=concurrency,
                            slot_seconds=lease_seconds * 1.5, clock=scheduler.now)


def _evaluate_concurrency_key(job_id: str, options: dict[str, Any]) -> None:
    """A ``concurrency_key`` given as a function of the run (``fn(job_id, options)``) becomes its value, now."""
    key = options.get("concurrency_key")
    if callable(key):
        value = key(job_id, dict(options))
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidInputError(f"the concurrency_key function returned {value!r}; expected a string or None")
        options["concurrency_key"] = value


def _fork_request(source: str, at_turn: int, run: bool, overrides: Mapping[str, Any]) -> str:
    """What a fork asks, as a digest kept on its record: a repeat lands only if it asks the same."""
    asked = {"source": source, "at_turn": at_turn, "run": run,
             "options": to_json_value(dict(overrides), what="the fork's options")}
    return hashlib.sha256(json.dumps(asked, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _landed_fork(existing: JobRecord | None, new_job_id: str, request: str) -> str:
    """``new_job_id`` if ``existing`` is the fork ``request`` asks for (a retried call); else JobConflictError."""
    if existing is None:
        raise JobConflictError(f"job {new_job_id!r} was created and deleted while it was being forked; try again")
    if existing.fork_request == request:
        return new_job_id
    if existing.forked_from is None:
        what = "it is not a fork"
    elif existing.fork_request is None:
        what = "a fork from before requests were recorded, which cannot be told from this one"
    else:
        what = "a fork asked with another source, turn, run or options"
    raise JobConflictError(f"job {new_job_id!r} already exists ({what}); fork to a new id")


def _check_retention(value: object, name: str = "retention") -> float | None:
    if value is None and name == "retention":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise InvalidInputError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def as_message_list(messages: Any) -> list[Any]:
    """``messages`` as a list (a single string or dict is refused, as :func:`~pipelines.agent.as_messages` does)."""
    if isinstance(messages, str | dict) or not isinstance(messages, Sequence):
        raise InvalidInputError(f"messages must be a list of messages (or strings), got {type(messages).__name__}")
    return list(messages)


def _tools_of(agent: Any) -> list[Any]:
    """The tools an agent declares up front (a tools provider's are known only per run)."""
    config = getattr(agent, "config", None)
    tmap = getattr(config, "tmap", None) if getattr(config, "tools_provider", None) is None else None
    return list(tmap.values()) if isinstance(tmap, Mapping) else []

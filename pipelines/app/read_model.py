"""The App's read model: what the web page, the CLI and a service read about runs, without writing anything.

A :class:`ReadModel` answers from storage and from the App's registry of
agents and pipelines (to type a result or a state): job views, transcripts,
logs, events and the live stream by cursor, listings and counts, and the
names of where a run waits. The App exposes it as ``app.read`` and keeps its
own methods of the same names (``app.get``, ``app.jobs``, ...) as a thin face
over it. Nothing here starts, changes or deletes a run; those are the App's
runs and operations.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters.base import (
    Backlog,
    CountingIndex,
    FencedAnswers,
    LeaseHistory,
    LeaseState,
    NamedQueues,
    RecentHistory,
    Scheduler,
    Storage,
    VersionedSchema,
    page_cursor,
    parse_cursor,
)
from phases import approvals, titles
from phases.run_input import check_tags
from pipelines import streams
from pipelines.app.registry import TitledSource
from pipelines.engine import control
from pipelines.engine.capabilities import Feature, as_feature, has
from pipelines.engine.models import Event, JobRecord, JobStatus, LogEntry, Message, validate_job_id
from pipelines.handle import JobView

if TYPE_CHECKING:
    from pipelines.engine.phase import Pipeline

__all__ = ["LeaseState", "ReadModel", "page_cursor", "parse_cursor", "tags_of"]

logger = logging.getLogger("pipelines")

# The listing's cursors (``updated_at/job_id`` of a page's last record), as the storage port defines them:
# ``page_cursor(record)`` names where the next page starts, ``parse_cursor(text)`` checks one from outside.
# Re-exported here because readers page through the listing with them (the web page, ``pipelines jobs``).


def tags_of(record: JobRecord) -> list[str]:
    """The tags a run was started with (provenance included)."""
    tags = record.options.get("tags")
    return [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []


class ReadModel:
    """Reads about runs (see the module doc). ``agents`` / ``pipelines``: the App's registries, by name,
    shared (not copied), so an agent added later is known here too; ``typed``: the App the agents type their
    results with (its ``schemas``)."""

    def __init__(self, storage: Storage, scheduler: Scheduler, *, agents: Mapping[str, Any],
                 pipelines: Mapping[str, Pipeline], typed: Any) -> None:
        self.storage = storage
        self.scheduler = scheduler
        self._agents = agents
        self._pipelines = pipelines
        self._typed = typed

    # --- one run -----------------------------------------------------------------------------
    def get(self, job_id: str) -> JobView | None:
        """The job as a :class:`JobView` (typed result and state), or ``None`` for an unknown id."""
        record = self.storage.get_job(validate_job_id(job_id))
        return None if record is None else self.view(record)

    def view(self, record: JobRecord) -> JobView:
        """``record`` as a :class:`JobView`."""
        source = self._agents.get(record.pipeline)
        result = source.typed_result(record, self._typed) if source is not None else record.result
        pipeline = self._pipelines.get(record.pipeline)
        state = None if record.checkpoint is None else record.checkpoint.state
        if pipeline is not None and pipeline.state is not None and state is not None:
            state = pipeline.state.model_validate(state)
        return JobView(record=record, result=result, state=state,
                       pending_calls=tuple(approvals.pending_calls_of(record)), title=self._title(record, source))

    def _title(self, record: JobRecord, source: Any) -> str | None:
        """A conversation's title (from its title job, when its agent has a ``title_agent``)."""
        if record.title or not isinstance(source, TitledSource) or not source.titles_conversations:
            return record.title
        return titles.title_of(record, self.storage.get_job(titles.title_job_id(record.job_id)))

    def record(self, job_id: str) -> JobRecord:
        """The job's raw record; :class:`~pipelines.engine.errors.JobNotFoundError` for an unknown id."""
        return control.load_job(self.storage, job_id)

    def lease_owner(self, job_id: str) -> str | None:
        """The worker holding the job's lease now, if any."""
        return self.storage.lease_owner(job_id)

    def fenced_answers(self, job_id: str, turn: int | None = None) -> list[dict[str, Any]]:
        """What attempts fenced off after their model call were answered (of turn ``turn``, or all), oldest first.

        Each: ``turn``, ``attempt``, ``attempt_id``, ``at`` and ``answer`` (the journaled model answer; a long
        one cut to a ``preview``). ``[]`` where the storage keeps none (no ``Feature.FENCED_ANSWERS``).
        """
        kept = as_feature(self.storage, Feature.FENCED_ANSWERS, FencedAnswers)  # type: ignore[type-abstract]
        if kept is None:
            return []
        entries = [e for e in kept.fenced_answers(job_id) if isinstance(e, dict)]
        return [e for e in entries if turn is None or e.get("turn") == turn]

    def lease_state(self, job_id: str) -> LeaseState:
        """The job's live lease owner, and whether the last lease taken lapsed (its worker was lost).

        Where the storage cannot tell a lease that ran out from one let go
        (no ``Feature.LEASE_HISTORY``), ``lapsed`` is always ``False``.
        """
        history = as_feature(self.storage, Feature.LEASE_HISTORY, LeaseHistory)  # type: ignore[type-abstract]
        if history is not None:
            return history.lease_state(job_id)
        return LeaseState(self.storage.lease_owner(job_id), False)

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        """The committed transcript ``[start:stop]``."""
        control.load_job(self.storage, job_id)
        return self.storage.messages(job_id, start, stop)

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        """Committed events after the cursor ``after`` (an event id)."""
        control.load_job(self.storage, job_id)
        return self.storage.events(job_id, after=after, limit=limit)

    def logs(self, job_id: str) -> list[LogEntry]:
        """The job's human-readable log."""
        control.load_job(self.storage, job_id)
        return self.storage.logs(job_id)

    def recent_events(self, job_id: str, *, before: str | None = None, limit: int = 100) -> list[Event]:
        """Committed events newest first, only those before the cursor ``before`` (an event id).

        Read from the end where the storage can (``Feature.RECENT``: a page costs a page); elsewhere the
        events are read from the start and the page cut from them.
        """
        control.load_job(self.storage, job_id)
        recent = as_feature(self.storage, Feature.RECENT, RecentHistory)  # type: ignore[type-abstract]
        if recent is not None:
            return recent.recent_events(job_id, before=before, limit=limit)
        events = self._all_events(job_id)
        stop = next((i for i, e in enumerate(events) if e.id == before), len(events)) if before else len(events)
        return events[max(0, stop - max(0, limit)):stop][::-1]

    def _all_events(self, job_id: str) -> list[Event]:
        out: list[Event] = []
        while True:
            page = self.storage.events(job_id, after=out[-1].id if out else None, limit=1000)
            out.extend(page)
            if len(page) < 1000:
                return out

    def recent_logs(self, job_id: str, *, skip: int = 0, limit: int = 100) -> tuple[list[LogEntry], int]:
        """Up to ``limit`` log entries before the job's last ``skip`` (oldest first), and how many it has."""
        control.load_job(self.storage, job_id)
        recent = as_feature(self.storage, Feature.RECENT, RecentHistory)  # type: ignore[type-abstract]
        if recent is not None:
            return recent.recent_logs(job_id, skip=skip, limit=limit)
        logs = self.storage.logs(job_id)
        stop = max(0, len(logs) - max(0, skip))
        return logs[max(0, stop - max(0, limit)):stop], len(logs)

    def stream(self, job_id: str, *, after: str | None = None, follow: bool = True,
               timeout: float | None = None) -> Iterator[Event]:
        """The job's parts from the cursor ``after``: events and text as it arrives (see :mod:`pipelines.streams`)."""
        return streams.follow(self.storage, job_id, after=after, follow=follow, timeout=timeout,
                              idle=self._undrained(job_id))

    def _undrained(self, job_id: str) -> Callable[[], None] | None:
        """For a scheduler that runs turns only when drained (the memory one): a warning, once, when a stream
        waits while advances wait too: nothing runs the job unless someone drains (a newcomer's stream hung)."""
        backlog = as_feature(self.scheduler, Feature.BACKLOG, Backlog)  # type: ignore[type-abstract]
        if backlog is None or not has(self.scheduler, Feature.IN_PROCESS) or has(self.scheduler, Feature.HOSTED):
            return None
        warned: list[bool] = []

        def idle() -> None:
            if not warned and backlog.work_waiting():
                warned.append(True)
                logger.warning("app.stream(%r) waits while advances wait on %s, which runs them only when drained: "
                               "call app.drain() (in a thread, to watch the stream live) or run.wait()", job_id,
                               type(self.scheduler).__name__)

        return idle

    def astream(self, job_id: str, *, after: str | None = None, follow: bool = True,
                timeout: float | None = None) -> AsyncIterator[Event]:
        """:meth:`stream` for ``async`` code."""
        return streams.afollow(self.storage, job_id, after=after, follow=follow, timeout=timeout)

    # --- many runs ---------------------------------------------------------------------------
    def jobs(self, *, status: JobStatus | None = None, tags: Sequence[str] = (), limit: int = 1000) -> list[JobView]:
        """Jobs (oldest first), optionally only those in ``status`` carrying every tag in ``tags``.

        Tags are read from each listed record: the filter applies to the
        ``limit`` records storage lists (no tag index yet).
        """
        wanted = check_tags(list(tags))
        records = self.storage.list_jobs(status=status, limit=limit)
        picked = [r for r in records if set(wanted) <= set(tags_of(r))]
        return [self.view(r) for r in sorted(picked, key=lambda r: (r.created_at, r.job_id))]

    def list_page(self, *, status: JobStatus | None = None, limit: int = 1000,
                  before: str | None = None) -> list[JobRecord]:
        """One page of the listing, newest ``updated_at`` first, from the cursor ``before`` (checked first)."""
        parse_cursor(before)
        return self.storage.list_jobs(status=status, limit=limit, before=before)

    @property
    def has_listing_index(self) -> bool:
        """Whether the storage keeps listing indexes: counts without reading records, pages by cursor."""
        return has(self.storage, Feature.COUNTS)

    def count_jobs(self, status: JobStatus | None = None) -> int | None:
        """How many jobs there are (in ``status``), from the listing index; ``None`` when the storage has none."""
        counter = as_feature(self.storage, Feature.COUNTS, CountingIndex)  # type: ignore[type-abstract]
        return None if counter is None else counter.count_jobs(status=status)

    # --- where things are --------------------------------------------------------------------
    def queue_of(self, priority: str | None = None) -> str | None:
        """The queue a run of ``priority`` waits on, as its scheduler names it; ``None`` for an in-process one."""
        queues = as_feature(self.scheduler, Feature.NAMED_QUEUES, NamedQueues)  # type: ignore[type-abstract]
        return None if queues is None else queues.queue_for(priority)

    @property
    def storage_path(self) -> str | None:
        """Where a file storage (SQLite) keeps its data; ``None`` for a server or memory."""
        schema = as_feature(self.storage, Feature.SCHEMA, VersionedSchema)  # type: ignore[type-abstract]
        return None if schema is None else schema.path

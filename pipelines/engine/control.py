"""Operator controls on storage and scheduler: pause, resume, cancel, and the sweep of overdue jobs.

:class:`~pipelines.app.App` is the handle users hold (``app.pause(id)``...);
these functions are what it calls. Each goes through a transition of
:mod:`pipelines.engine.transitions`, so it is fenced exactly like a worker's turn (I2).

Pause and cancel land at the turn boundary, never a turn late: the request is
stored on the job at once, and whoever next holds the job's lease applies it
before anything else (this call, or the worker whose turn just committed,
``continue_for`` included). A turn in flight commits; the next one never
starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from adapters.base import Scheduler, Storage
from pipelines.engine import children, flow, transitions, writer
from pipelines.engine.errors import JobConflictError, JobNotFoundError, PipelineError, StaleVersionError
from pipelines.engine.events import make_event
from pipelines.engine.models import Commit, JobRecord, JobStatus, detached, to_json_value, validate_job_id
from pipelines.engine.phase.inputs import INPUT, check_input_key, input_key
from pipelines.engine.tokens import new_token

__all__ = ["cancel_job", "load_job", "note_foreign", "pause_job", "requeue_overdue", "resume_job", "supply_input"]

logger = logging.getLogger("pipelines")

_POLL = 0.02  # seconds between looks while a turn in flight finishes

SWEEP_REPEAT_EVERY = 600.0
"""Seconds before the sweep logs again that it skips one job for one reason: it meets an unreadable
record at every pass (every 2 s in each worker), and a log that repeats it drowns everything else."""
_skipped: dict[tuple[str, str], float] = {}  # (job id, reason) -> when this process last logged it
_skipped_lock = threading.Lock()


def load_job(storage: Storage, job_id: str) -> JobRecord:
    """The record of ``job_id``; :class:`JobNotFoundError` for an unknown one."""
    record = storage.get_job(validate_job_id(job_id))
    if record is None:
        raise JobNotFoundError(f"job {job_id!r} not found")
    return record


def _write(storage: Storage, scheduler: Scheduler, commit: Commit, what: str) -> JobRecord:
    try:
        writer.apply(storage, scheduler, commit)
    except StaleVersionError as exc:
        raise JobConflictError(f"job {commit.job_id!r} changed during the {what}; try again") from exc
    return detached(commit.record)  # the caller's own: storage may keep the committed object


def pause_job(job_id: str, *, storage: Storage, scheduler: Scheduler, wait: float = 30.0) -> JobRecord:
    """Pause a running job at its turn boundary; returns the record (``control == "pause"`` while pending).

    A turn in flight finishes and commits first, and the next does not start.
    This call waits up to ``wait`` seconds for that (for the job and its family
    together); after it, the request stays stored and is applied when the turn commits. Raises
    :class:`JobConflictError` if the job is not running (or stopped running first).
    A job waiting for child jobs stays waiting and its family pauses: every
    running job below it, down through the children that wait in turn.
    """

    def build(record: JobRecord, owner: str | None) -> Commit:
        assert owner is not None
        return transitions.pause(record, owner=owner, now=scheduler.now())

    deadline = time.monotonic() + max(0.0, wait)  # for the whole family: each job waits what is left of it

    def one(job: str) -> JobRecord:
        record = load_job(storage, job)
        if children.waits_for_children(record):
            return record  # no turn of its own to stop: the children it waits for pause
        return _at_boundary(job, storage, scheduler, "pause", build, deadline - time.monotonic())

    done = one(job_id)
    if children.waits_for_children(done):
        _each_descendant(done, storage, (JobStatus.RUNNING, JobStatus.WAITING), one)
    return done


def cancel_job(job_id: str, *, storage: Storage, scheduler: Scheduler, wait: float = 30.0,
               force: bool = False) -> JobRecord:
    """Cancel a job, keeping its checkpoint; returns the record.

    A running job stops at its turn boundary, like :func:`pause_job`.
    ``force=True`` does not wait: the turn in flight is fenced off (its
    journal writes and commit expect the old version, so they are rejected
    and its work is discarded, I2). A waiting, paused or failed job is
    cancelled at once. A cancelled job is never advanced again except by an
    explicit retry, which resumes from the kept checkpoint. A cancelled job is
    refused (:class:`JobConflictError`) unless a job of its family is still
    active (a cancel that died midway): then this call finishes that cancel.
    """
    deadline = time.monotonic() + max(0.0, wait)  # for the whole family: each job waits what is left of it

    def one(job: str) -> JobRecord:
        for tries_left in (2, 1, 0):
            record = load_job(storage, job)
            if not force and record.status is JobStatus.RUNNING:
                break
            # No turn in flight (or one to discard): a compare-and-set on the version.
            commit = transitions.cancel(record, owner=None, now=scheduler.now(), forced=force)
            try:
                return _write(storage, scheduler, commit, "cancel")
            except JobConflictError:
                # Another caller moved the job meanwhile (an approval or an input that set it running, a
                # turn's commit): cancel it as it is now; only a job that keeps changing is the caller's.
                if not tries_left:
                    raise

        def build(rec: JobRecord, owner: str | None) -> Commit:
            return transitions.cancel(rec, owner=owner, now=scheduler.now())

        return _at_boundary(job, storage, scheduler, "cancel", build, deadline - time.monotonic())

    try:
        done = one(job_id)
    except JobConflictError:
        done = load_job(storage, job_id)
        if done.status is not JobStatus.CANCELLED or not _finish_cascade(done, storage, one):
            raise
        return done
    # A parent's cancel reaches the child jobs it started, theirs, and so on down the family.
    _each_descendant(done, storage, transitions.ACTIVE, one)
    return done


def _finish_cascade(root: JobRecord, storage: Storage, cancel: Callable[[str], JobRecord]) -> bool:
    """Cancel what is still going in the family of the cancelled ``root``; whether there was any.

    A cancel walks the family in its caller's memory only: a process that dies during the walk leaves
    descendants going. The ones that run stop at their next turn (:func:`children.stopped_above`); the
    ones with no turn coming (paused, waiting for a person) are cancelled by asking again, which goes
    down through the cancelled jobs to finish the walk.
    """
    found: list[str] = []

    def act(job: str) -> JobRecord:
        record = load_job(storage, job)
        if record.status is JobStatus.CANCELLED:
            return record  # gone down through: a job below it may still be going
        found.append(job)
        return cancel(job)

    _each_descendant(root, storage, (*transitions.ACTIVE, JobStatus.CANCELLED), act)
    return bool(found)


def resume_job(job_id: str, *, storage: Storage, scheduler: Scheduler) -> JobRecord:
    """Set a paused job running again from its checkpoint, and enqueue it: due now, or when a delay its
    phase asked for ends (a pause never shortens one).

    A paused job has no turn in flight, so this is a compare-and-set on the
    version; a stale queued message holding the lease for a moment does not
    get in the way. A job waiting for child jobs resumes its family: every
    paused job below it, down through the children that wait in turn.
    """

    def one(job: str) -> JobRecord:
        record = load_job(storage, job)
        if children.waits_for_children(record):
            return record  # no turn of its own: the paused children it waits for resume
        return _write(storage, scheduler, transitions.resume(record, now=scheduler.now()), "resume")

    done = one(job_id)
    _each_descendant(done, storage, (JobStatus.PAUSED, JobStatus.WAITING), one)
    return done


def supply_input(job_id: str, key: str, value: Any, *, storage: Storage, scheduler: Scheduler) -> JobRecord:
    """Give a job waiting in :func:`~pipelines.engine.phase.wait_for_input` its input ``key``; it runs again.

    ``value`` is stored as JSON (by the rules of every stored value). Refused with
    :class:`JobConflictError` unless the job waits for exactly this input; of two people supplying it at
    once, one lands and the other is refused (fenced on the version).
    """
    plain = to_json_value(value, what=f"input {check_input_key(key)!r}")
    for _ in range(3):
        record = load_job(storage, job_id)
        waiting = record.waiting or {}
        if record.status is not JobStatus.WAITING or waiting.get("kind") != INPUT or record.checkpoint is None:
            raise JobConflictError(f"job {job_id!r} is {record.status.value} and waits for no input")
        if waiting.get("key") != key:
            raise JobConflictError(f"job {job_id!r} waits for input {waiting.get('key')!r}, not {key!r}")
        now = scheduler.now()
        event = make_event("input_supplied", now, phase=record.checkpoint.next_phase, key=key)
        commit = transitions.supply_inputs(record, {input_key(key): plain}, resume=True, now=now,
                                           why=f"input {key!r} supplied", event=event)
        try:
            writer.apply(storage, scheduler, commit)
        except StaleVersionError:
            continue
        return detached(commit.record)
    raise JobConflictError(f"job {job_id!r} kept changing while its input {key!r} was supplied; try again")


Build = Callable[[JobRecord, "str | None"], Commit]


def _at_boundary(job_id: str, storage: Storage, scheduler: Scheduler, kind: str, build: Build,
                 wait: float) -> JobRecord:
    """Apply ``kind`` under the job's lease; while a turn holds it, store the request for its holder."""
    record = load_job(storage, job_id)
    build(record, "check")  # a request that cannot apply (wrong status) fails now, with nothing stored
    owner = f"control-{new_token()}"
    deadline = time.monotonic() + max(0.0, wait)
    requested = False
    while True:
        held = storage.acquire_lease(job_id, owner, 30.0)
        if held is not None:
            try:
                return _apply_held(held, storage, scheduler, kind, build, owner, requested)
            finally:
                storage.release_lease(job_id, owner)
        if not requested:
            requested = writer.request_control(storage, job_id, kind)
        current = load_job(storage, job_id)
        if current.control is None and current.status is not JobStatus.RUNNING:
            return _settled(current, kind)
        if time.monotonic() >= deadline:
            return current  # the request stays stored: the turn in flight applies it when it commits
        time.sleep(_POLL)


def _apply_held(record: JobRecord, storage: Storage, scheduler: Scheduler, kind: str, build: Build, owner: str,
                requested: bool) -> JobRecord:
    if record.status is not JobStatus.RUNNING:
        if requested and record.control == kind:  # its own request (another caller's cancel stays)
            writer.request_control(storage, record.job_id, None)
        # The turn in flight ended otherwise (in a wait, say): the request applies as it would have to a
        # job found so from the start (pause_job / cancel_job), not refused for a race it did not lose.
        if kind == "cancel" and record.status not in transitions.FINAL:
            return _write(storage, scheduler, build(record, owner), kind)
        if kind == "pause" and children.waits_for_children(record):
            # No turn of its own: pause_job pauses the children it waits for. Its request was cleared above.
            return detached(record).model_copy(update={"control": None})
        return _settled(record, kind)
    if kind == "pause" and record.control == "cancel":
        # Another caller's cancel waits for this boundary: it lands, not this pause (which would clear it).
        return _write(storage, scheduler, transitions.cancel(record, owner=owner, now=scheduler.now()), "cancel")
    return _write(storage, scheduler, build(record, owner), kind)


def _settled(record: JobRecord, kind: str) -> JobRecord:
    """The job stopped running while we waited: done if a worker applied ``kind``, else say why not."""
    applied = {"pause": JobStatus.PAUSED, "cancel": JobStatus.CANCELLED}[kind]
    if record.status is applied:
        return record
    raise JobConflictError(f"job {record.job_id!r} is {record.status.value}: it stopped running before "
                           f"the {kind} could take effect")


def requeue_overdue(storage: Storage, scheduler: Scheduler, *, grace: float, limit: int = 1000,
                    runs: Callable[[str], bool] | None = None) -> list[str]:
    """Enqueue again (not run) every running job due for ``grace`` seconds and not leased; returns the ids sent.

    A job whose scheduler says its advance still waits in the queue
    (``requeue`` returned ``False``) is not sent again and not returned.
    ``runs``: whether this app runs a pipeline; another's jobs (an app
    sharing the storage) are left to it (:func:`note_foreign`).

    This is the sweep a forking worker runs in a thread of its parent
    process: the advance itself then runs in a work-horse like any other.
    Running phases in that thread instead would be unsafe, because a fork
    taken while the thread holds a lock (an import lock during a lazy import
    inside litellm, say) leaves the horse waiting for it forever. A record
    that cannot be read is logged and skipped: one bad job never stops the
    sweep for the others.
    """
    requeued: list[str] = []
    foreign: Counter[str] = Counter()
    for job_id in storage.due_jobs(scheduler.now() - grace, limit=limit):
        try:
            if storage.lease_owner(job_id) is not None:
                continue  # in progress; if its worker died, the lease runs out and a later sweep gets it
            record = storage.get_job(job_id)
        except PipelineError as exc:
            _log_skip("job", job_id, exc)
            continue
        if record is not None and record.status is JobStatus.RUNNING and record.checkpoint is not None:
            _requeue(record, scheduler, runs, foreign, requeued)  # one at a time: no page of records held
    # Parents whose children all finished but whose wake-up was lost (a crash between the child's
    # final commit and the message): their advance wakes them (pipelines.engine.children).
    for parent in children.ready_parents(storage, limit=limit):
        _requeue(parent, scheduler, runs, foreign, requeued)
    note_foreign(foreign)
    return requeued


def _requeue(record: JobRecord, scheduler: Scheduler, runs: Callable[[str], bool] | None, foreign: Counter[str],
             requeued: list[str]) -> None:
    """Send ``record``'s job again (the sweep's), unless another app runs its pipeline (counted in ``foreign``)."""
    if runs is not None and not runs(record.pipeline):
        foreign[record.pipeline] += 1
        return
    try:
        # At the front of the queue where the scheduler can: the job has
        # already waited out a lease, it should not also wait out the backlog.
        priority = flow.priority_of(record)
        extra = {"priority": priority} if priority != flow.PRIORITIES[0] else {}
        sent = scheduler.requeue(record.job_id, pipeline=record.pipeline, version=record.version, **extra)
    except PipelineError as exc:
        _log_skip("job", record.job_id, exc)
        return
    if sent is not False:  # False: its message still waits in the queue (behind busy workers), not lost
        requeued.append(record.job_id)


def note_foreign(pipelines: Counter[str]) -> None:
    """Say that the sweep left due jobs of pipelines this app does not register (counts by pipeline) to others.

    Logged once per set of pipelines every ``SWEEP_REPEAT_EVERY`` s: another app on the storage runs them,
    or none does any more (a pipeline taken out of the app while jobs of it ran), and they stay running.
    """
    if pipelines:
        _log_skip("the due jobs of pipeline(s)", ", ".join(map(repr, sorted(pipelines))), PipelineError(
            "this app does not register them; left to an app that does. If none does any more, they stay running: "
            "register the pipeline again, or cancel them (`pipelines cancel JOB`)"))


def _log_skip(what: str, job_id: str, exc: PipelineError) -> None:
    """Log, on one line, that the sweep skips ``job_id``: once per job and reason every ``SWEEP_REPEAT_EVERY`` s."""
    reason = " ".join(str(exc).split())  # a validation error spans lines
    now = time.monotonic()
    with _skipped_lock:
        if now - _skipped.get((job_id, reason), -SWEEP_REPEAT_EVERY) < SWEEP_REPEAT_EVERY:
            return
        if len(_skipped) >= 10_000:  # many jobs unreadable at once: forget what was logged, not grow forever
            _skipped.clear()
        _skipped[(job_id, reason)] = now
    logger.error("sweep: skipping %s %s: %s (said again in %g s if it lasts)", what, job_id, reason,
                 SWEEP_REPEAT_EVERY)


def _family(record: JobRecord, storage: Storage, wanted: tuple[JobStatus, ...]) -> list[str]:
    """The child jobs of ``record`` now in one of ``wanted``.

    Unknown or unreadable ones are left out, and so is a job under a child's
    id that does not name ``record`` as its parent: another job's, never this one's to act on.
    """
    found = []
    for child_id in record.children:
        try:
            child = storage.get_job(child_id)
        except PipelineError as exc:
            logger.error("job %s: cannot read child %s: %s", record.job_id, child_id, exc)
            continue
        if child is not None and child.status in wanted and children.owned(child, record.job_id):
            found.append(child_id)
    return found


def _each_descendant(root: JobRecord, storage: Storage, wanted: tuple[JobStatus, ...],
                     act: Callable[[str], JobRecord]) -> None:
    """Apply ``act`` to every descendant of ``root`` in ``wanted``, going down from each record ``act`` returns.

    A loop over a queue, not a recursion: a family may be deeper than the
    stack (the depth limit is newer than some families). A child that moved
    on meanwhile is skipped; each job is visited once.
    """
    queue = deque([root])
    seen = {root.job_id}
    while queue:
        record = queue.popleft()
        for child_id in _family(record, storage, wanted):
            if child_id in seen:
                continue
            seen.add(child_id)
            try:
                queue.append(act(child_id))
            except (JobConflictError, JobNotFoundError) as exc:
                logger.info("job %s: child %s: %s", record.job_id, child_id, exc)

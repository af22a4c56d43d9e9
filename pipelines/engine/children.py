"""Child runs: jobs a tool call (or a phase) of another job starts, and the parent's wait for them.

A parent's turn that starts children raises ``WaitForInput`` with
``details={"kind": "children", "calls": [{"call_id", "child", "on_error"}]}``:
the parent commits ``waiting`` with that on its record and holds no worker.
It is woken by an advance of the parent (:func:`wake`, run by the runner
under the parent's lease) once every child it waits for is finished
(complete, error or cancelled). Three paths send that advance:

* the child's final commit (``writer.apply`` schedules the parent);
* the parent's own wait commit (a child may have finished first);
* the sweep (:func:`ready_parents`, called by ``App.advance_due`` and
  ``requeue_overdue``): the crash-safe path, for a process that died between
  a child's final commit and the message to its parent. It reads the
  storage's status index of waiting jobs (``list_jobs(status=waiting)``),
  skips the ones not waiting for children, and loads their children: a cost
  proportional to the jobs waiting, not to all jobs.

Waking is a compare-and-set on the parent's version (``children_done``): the
children's outcomes go into the open checkpoint's inputs (``tool:<call id>``
is the tool result the model reads, ``child:<call id>`` the structured
outcome a phase reads) and their usage into the parent's, exactly once.

A child whose outcome nothing will read stops (cancelled) at its next turn:
its parent (or a job above it, :func:`stopped_above`) is cancelled or
deleted, or went on to another run. A parent that failed is not one: a
retry runs its turn again, which adopts the child (a child started by a turn
that another call's ``FailJob`` ended runs to its end, and the retried turn
finds its answer).

Two rules hold every child run (issue 30):

* **An invariant between two records is checked in the same atomic step that
  writes** (child ownership, fork and rerun identity). A child's record names
  its parent and call (``parent_job``, ``parent_call``), written by the create
  that refuses a taken id and never changed after: ``start_child`` adopts a
  job found under a child's id only if it names this parent and call (else
  :class:`~pipelines.engine.errors.JobConflictError`, and the model reads
  why), also when another worker's create won the race; the wake-up and the
  family walks (cancel, resume) skip a job that does not name its parent. A
  child its parent still waits for is not deleted (``App.delete`` refuses,
  retention skips it: :func:`waiting_parent`) nor run again (a continuation, a
  message sent, a retry: refused, :func:`check_not_awaited`), and a child
  that is gone all the same is read as failed, never as still running.
* **Nothing recursive over a depth a user or a model controls; every fan-out
  has a limit.** A family is at most :data:`MAX_DEPTH` (8) parents deep: a
  job at that depth that asks for a child gets
  :class:`~pipelines.engine.errors.InvalidInputError` from ``start_child``,
  which a tool call hands to the model as its result ("Error: ...") and an
  ``agent_phase`` fails its job with. One turn starts at most
  :data:`MAX_CHILDREN_PER_TURN` (64) children: the child-starting calls of a
  model's answer past that number are answered with an error result, without
  a child. Every walk over a family (cancel, resume) is a loop over a queue,
  never a recursion.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from adapters.base import page_cursor
from pipelines.engine import transitions
from pipelines.engine.errors import JobConflictError
from pipelines.engine.models import JOB_ID_PATTERN, Commit, JobRecord, JobStatus, JSONValue, Usage

if TYPE_CHECKING:
    from adapters.base import Storage

__all__ = [
    "KIND",
    "MAX_CHILDREN_PER_TURN",
    "MAX_DEPTH",
    "awaited_by",
    "check_not_awaited",
    "child_job_id",
    "child_key",
    "content_of",
    "descendants",
    "fan_out_refused",
    "of_another_run",
    "owned",
    "ready_parents",
    "run_of",
    "stopped_above",
    "waiting_parent",
    "waits_for_children",
    "wake",
]

logger = logging.getLogger("pipelines")

KIND = transitions.CHILDREN
_PLAIN_CALL = JOB_ID_PATTERN  # a call id spelled with job id characters, and no ':' (checked below)

MAX_DEPTH = 8
"""How many parents deep a family of child runs may grow: a job this deep starts no child (module doc)."""
MAX_CHILDREN_PER_TURN = 64
"""How many child runs one turn may start; the model's further child calls get an error result."""


def fan_out_refused(tool: str) -> str:
    """The tool result of a child call past :data:`MAX_CHILDREN_PER_TURN` in one turn (no child started)."""
    return (f"Error: tool {tool!r} was not run: this turn already starts {MAX_CHILDREN_PER_TURN} child runs, "
            "the most one turn may start (pipelines.engine.children.MAX_CHILDREN_PER_TURN); call it again in a "
            "later turn if it is still needed")


def child_key(call_id: str) -> str:
    """The input key holding a child's structured outcome: ``{"status", "result", "error", "job_id"}``."""
    return f"child:{call_id}"


def child_job_id(parent_job_id: str, call_id: str) -> str:
    """The child job of ``parent_job_id``'s call ``call_id``: the same for every re-run of that call.

    ``<parent>:c:<call id>`` when that is a valid job id and the call id has
    no ``:`` (so the last segment is always the call id and no two pairs
    share an id); otherwise ``<parent, cut>:h:<sha256 of both, 32 hex>``.
    """
    plain = f"{parent_job_id}:c:{call_id}"
    if ":" not in call_id and _PLAIN_CALL.fullmatch(call_id) and _PLAIN_CALL.fullmatch(plain):
        return plain
    digest = hashlib.sha256(f"{parent_job_id}\0{call_id}".encode()).hexdigest()[:32]
    return f"{parent_job_id[:160]}:h:{digest}"


def waits_for_children(record: JobRecord) -> bool:
    """Whether ``record`` is a job waiting for child jobs."""
    return record.status is JobStatus.WAITING and (record.waiting or {}).get("kind") == KIND


def _calls(record: JobRecord) -> list[dict[str, Any]]:
    return [c for c in (record.waiting or {}).get("calls") or [] if isinstance(c, dict) and c.get("child")]


def content_of(child: JobRecord) -> str:
    """What the parent's model reads for a finished child: its text, its typed result as JSON, or ``Error: ...``."""
    if child.status is JobStatus.COMPLETE:
        result = child.result
        return result if isinstance(result, str) else json.dumps(result)
    if child.status is JobStatus.CANCELLED:
        return f"Error: child job {child.job_id!r} was cancelled"
    return f"Error: child job {child.job_id!r} failed: {child.error or 'unknown error'}"


def owned(child: JobRecord, parent_job: str, call_id: str | None = None) -> bool:
    """Whether ``child`` is the child run of ``parent_job`` (and of its call ``call_id``, when given)."""
    return child.parent_job == parent_job and (call_id is None or child.parent_call == call_id)


def run_of(record: JobRecord) -> str:
    """The run ``record`` is in: its checkpoint's ``transcript_epoch`` ("": unknown, or no run in flight)."""
    return record.checkpoint.transcript_epoch if record.checkpoint is not None else ""


def of_another_run(child: JobRecord, epoch: str) -> bool:
    """Whether ``child`` was started in another run or life of its parent than the one at ``epoch``.

    ``epoch``: the parent's run now (:func:`run_of`). Unknown on either side (a record from before epochs were
    kept, a child from before they were stamped, a parent with no run in flight): not known to be, as before.
    """
    return bool(epoch) and bool(child.parent_epoch) and child.parent_epoch != epoch


def awaited_by(child: JobRecord, storage: Storage, *, unlisted: bool = True) -> str | None:
    """The parent still waiting for ``child``'s outcome (so ``child`` must not be deleted), or ``None``.

    Waiting for it by name, or about to: a parent not finished that does not list ``child`` yet was
    stopped (a crash, say) between the child's create and the commit of its wait, and the re-run of that
    turn adopts the child it finds under the call's id, or would start the call's work again.
    ``unlisted=False``: waiting for it by name only.
    """
    if child.parent_job is None:
        return None
    parent = storage.get_job(child.parent_job)
    if parent is None or parent.status not in _UNFINISHED:
        return None
    if of_another_run(child, run_of(parent)):
        return None  # a child of a run the parent left (a full retry): nothing reads its outcome
    if waits_for_children(parent) and any(str(c["child"]) == child.job_id for c in _calls(parent)):
        return parent.job_id
    return parent.job_id if unlisted and child.job_id not in parent.children else None


def descendants(record: JobRecord, storage: Storage) -> list[JobRecord]:
    """The child runs below ``record``: those it lists (``children``) that name it, theirs, and so on down.

    Each parent comes before its children (so, walked backwards, each child before its parent: how
    ``App.delete`` deletes a family). A loop over a queue, not a recursion; each job once; one gone (deleted)
    or under a child's id naming another parent is left out. A child its parent never listed (a wait that
    never committed, a title job) is not found here.
    """
    found: list[JobRecord] = []
    queue = deque([record])
    seen = {record.job_id}
    while queue:
        parent = queue.popleft()
        for child_id in parent.children:
            if child_id in seen:
                continue
            child = storage.get_job(child_id)
            if child is not None and owned(child, parent.job_id):
                # Seen once found under its own parent: listed first by a job it does not name, it is still found.
                seen.add(child_id)
                found.append(child)
                queue.append(child)
    return found


_UNFINISHED: Final = (JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PAUSED)
_ANCESTORS_READ: Final = MAX_DEPTH  # a family within the depth limit is read up to its root


def stopped_above(record: JobRecord, storage: Storage) -> bool:
    """Whether a job above ``record`` means it must stop: nothing will read its outcome.

    That is its parent cancelled, gone (deleted) or in another run than the one that started it (a full
    retry, the job made again); and, while the parent has not ended itself (running, waiting, paused), the
    same of the parent's own parent, and so on up. A cancel walks the family down in the canceller's memory
    only: if that process dies after the root's commit, a middle job waiting for its children gets no turn
    to notice, and this is how the jobs below it still stop, each at its next turn. One read a level, for
    child jobs only; at most :data:`MAX_DEPTH` levels (a loop, not a recursion: a family older than the
    limit is read that far, and its jobs further down stop once the ones above them have).
    """
    job = record
    for _ in range(_ANCESTORS_READ):
        if job.parent_job is None:
            return False
        parent = storage.get_job(job.parent_job)
        if parent is None or parent.status is JobStatus.CANCELLED or of_another_run(job, run_of(parent)):
            return True
        if parent.status not in _UNFINISHED:
            return False  # complete or failed: its outcome is settled and a retry of it may still read ours
        job = parent
    return False


def waiting_parent(child: JobRecord, storage: Storage) -> str | None:
    """The parent still waiting for ``child``'s outcome, or ``None``: :func:`awaited_by` as delete, retention and a
    run again all judge it (a child of its parent's whole life, a title job: by name only; see
    :func:`check_not_awaited`)."""
    return awaited_by(child, storage, unlisted=bool(child.parent_epoch))


def check_not_awaited(child: JobRecord, storage: Storage, *, act: str) -> None:
    """:class:`JobConflictError`, nothing written, if ``child``'s parent still waits for its outcome.

    ``act``: what was asked, as the refusal says it ("delete it", "run it again"). Deleting the child,
    or running it again (a continuation, a message sent to it, a retry), would hand the parent none of
    its outcome, or another run's, instead of the one its call asked for. Once the parent has read the
    outcome (:func:`awaited_by` is ``None``), the child is anyone's to act on. A child of the parent's
    whole life (a conversation's title job, started with ``per_run=False``: no run stamp) is waited for by
    name only: its parent never lists it, and a run of it again is the retry a failed one asks for.
    """
    parent = waiting_parent(child, storage)
    if parent is not None:
        raise JobConflictError(f"job {child.job_id!r} is a child run its parent {parent!r} still waits for; "
                               f"{act} once the parent has woken, or cancel the parent first")


def _gone(child_id: str, why: str) -> JobRecord:
    """What a parent reads for a child it cannot read any more: failed, with why (never "still running")."""
    return JobRecord(job_id=child_id, status=JobStatus.ERROR, error=why)


def _outcomes(record: JobRecord, storage: Storage) -> dict[str, JobRecord] | None:
    """Each waited-for call's finished child, or ``None`` while any is still going.

    A child that is gone (deleted) or that is not this parent's (another job
    took its id) counts as failed: waiting for it would wait forever.
    """
    found: dict[str, JobRecord] = {}
    for call in _calls(record):
        child_id, call_id = str(call["child"]), str(call["call_id"])
        child = storage.get_job(child_id)
        if child is None:
            child = _gone(child_id, "it was deleted before its parent read its outcome")
        elif not owned(child, record.job_id, call_id):
            child = _gone(child_id, f"the job under its id is not this job's child (its parent is "
                                    f"{child.parent_job!r}, call {child.parent_call!r})")
        elif child.status not in transitions.FINISHED:
            return None
        found[call_id] = child
    return found


def wake(record: JobRecord, storage: Storage, *, owner: str, now: float) -> Commit | None:
    """The commit that wakes ``record`` (waiting for children, leased by ``owner``), or ``None`` if not yet.

    A failed or cancelled child whose call says ``on_error="fail"`` fails the
    parent (its checkpoint kept: retry the child, then the parent); otherwise
    its ``Error: ...`` text is the call's result.
    """
    found = _outcomes(record, storage)
    if found is None:
        return None
    entries: dict[str, JSONValue] = {}
    usage = Usage()
    failure = None
    for call in _calls(record):
        call_id = str(call["call_id"])
        child = found[call_id]
        usage = usage + child.total_usage
        entries[f"tool:{call_id}"] = content_of(child)
        entries[child_key(call_id)] = {"job_id": child.job_id, "status": child.status.value,
                                       "result": child.result, "error": child.error}
        if child.status is not JobStatus.COMPLETE and call.get("on_error") == "fail" and failure is None:
            detail = f": {child.error}" if child.error else ""
            failure = f"child job {child.job_id!r} of call {call_id} ended {child.status.value}{detail}"
    if failure is not None:
        return transitions.child_failed(record, failure, usage, owner=owner, now=now)
    return transitions.children_done(record, entries, usage, owner=owner, now=now)


def ready_parents(storage: Storage, *, limit: int = 1000, page: int = 500) -> list[JobRecord]:
    """Waiting parents whose children have all finished: what the sweep wakes (see the module doc).

    Every waiting job is looked at, page by page (jobs waiting for a person
    count too, so a first page alone could hide an old parent forever); at
    most ``limit`` parents are returned.
    """
    ready: list[JobRecord] = []
    cursor: str | None = None
    while len(ready) < limit:
        batch = storage.list_jobs(status=JobStatus.WAITING, limit=page, before=cursor)
        for record in batch:
            try:
                if waits_for_children(record) and _outcomes(record, storage) is not None:
                    ready.append(record)
            except Exception as exc:  # noqa: BLE001 - one unreadable child never stops the sweep for the others
                logger.error("sweep: skipping waiting job %s: %s", record.job_id, exc)
        if len(batch) < page:
            break
        cursor = page_cursor(batch[-1])
    return ready[:limit]

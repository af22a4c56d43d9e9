"""Child runs: jobs a tool call (or a phase) of another job starts, and the parent's wait for them.

A parent's turn that starts children raises ``WaitForInput`` with
``details={"kind": "children", "calls": [{"call_id", "child", "on_error"}]}``:
the parent commits ``waiting`` with that on its record and holds no worker.
It is woken by an advance of the parent (:func:`wake`, run by the runner
under the parent's lease) once every child it waits for is finished
(complete, error or cancelled). Three paths send that advance:

* the child's final commit (``transitions.apply`` schedules the parent);
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
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any

from adapters.base import page_cursor
from pipelines.engine import transitions
from pipelines.engine.models import JOB_ID_PATTERN, Commit, JobRecord, JobStatus, JSONValue, Usage

if TYPE_CHECKING:
    from adapters.base import Storage

__all__ = [
    "KIND",
    "child_job_id",
    "child_key",
    "content_of",
    "ready_parents",
    "waits_for_children",
    "wake",
]

logger = logging.getLogger("pipelines")

KIND = transitions.CHILDREN
_PLAIN_CALL = JOB_ID_PATTERN  # a call id spelled with job id characters, and no ':' (checked below)


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


def _outcomes(record: JobRecord, storage: Storage) -> dict[str, JobRecord] | None:
    """Each waited-for call's finished child, or ``None`` while any is still going (or missing)."""
    found: dict[str, JobRecord] = {}
    for call in _calls(record):
        child = storage.get_job(str(call["child"]))
        if child is None or child.status not in transitions.FINISHED:
            return None
        found[str(call["call_id"])] = child
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

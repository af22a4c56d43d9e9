"""What operators and people do to a job between turns: pause, resume, cancel, and supply inputs (approvals)."""

from __future__ import annotations

from pipelines.engine.errors import JobConflictError
from pipelines.engine.events import make_event
from pipelines.engine.models import Commit, Event, JobRecord, JobStatus, JSONValue
from pipelines.engine.tokens import new_token
from pipelines.engine.transitions.building import FINAL, _commit, _log, _moved, _phase_of, _running

__all__ = ["cancel", "pause", "resume", "supply_inputs"]


def pause(rec: JobRecord, *, owner: str, now: float) -> Commit:
    """A running job stops at this turn boundary (the caller holds the lease: no turn is in flight)."""
    if rec.status is not JobStatus.RUNNING:
        raise JobConflictError(f"job {rec.job_id!r} is {rec.status.value}; only a running job can be paused")
    token = new_token()
    new = _moved(rec, token, now, rec.checkpoint, status=JobStatus.PAUSED)
    phase = _phase_of(rec)
    return _commit(rec, new, token, owner=owner, clear_control=True, logs=[_log(now, phase, "job paused")],
                   events=[make_event("job_paused", now, phase=phase)])


def resume(rec: JobRecord, *, now: float) -> Commit:
    """A paused job runs again from its checkpoint (no turn can be in flight: no lease needed).

    Due now, or when it was due if that is later: a delay a phase asked for (``Next(delay=...)``, a
    ``RetryLater`` backoff) still holds; a pause never shortens it.
    """
    if rec.status is not JobStatus.PAUSED:
        pending = " with a pause asked (applied when its turn commits)" if rec.control == "pause" else ""
        wanted = (rec.waiting or {}).get("key") if (rec.waiting or {}).get("kind") == "input" else None
        hint = ("; resume it once it is paused" if pending else
                f"; it waits for input {wanted!r}: give it with app.supply_input" if wanted else "")
        raise JobConflictError(f"job {rec.job_id!r} is {rec.status.value}{pending}; only a paused job can be "
                               f"resumed{hint}")
    token = new_token()
    cp = rec.checkpoint.model_copy(update={"due_at": max(now, rec.checkpoint.due_at)}) if rec.checkpoint else None
    new = _moved(rec, token, now, cp, status=JobStatus.RUNNING)
    phase = _phase_of(rec)
    return _commit(rec, new, token, clear_control=True, logs=[_log(now, phase, "job resumed")],
                   events=[make_event("job_resumed", now, phase=phase)])


def cancel(rec: JobRecord, *, owner: str | None, now: float, forced: bool = False) -> Commit:
    """The job is cancelled, its checkpoint kept. ``owner=None`` fences off a turn in flight (force)."""
    if rec.status in FINAL:
        raise JobConflictError(f"job {rec.job_id!r} is already {rec.status.value}; nothing to cancel")
    token = new_token()
    new = _moved(rec, token, now, rec.checkpoint, status=JobStatus.CANCELLED, waiting=None)
    phase = _phase_of(rec)
    why = "job cancelled" + (" (forced: a turn in flight was discarded)" if forced else "")
    return _commit(rec, new, token, owner=owner, release_lease=owner is not None, clear_control=True,
                   logs=[_log(now, phase, why, "warn")], events=[make_event("job_cancelled", now, phase=phase)])


def supply_inputs(rec: JobRecord, entries: dict[str, JSONValue], *, resume: bool, now: float, why: str,
                  event: Event) -> Commit:
    """Add what a person supplied to the open checkpoint, optionally setting the job running again.

    Fenced on the version only: the job is waiting or failed, so no turn is in
    flight, and two people acting at once cannot both win (the loser's commit
    expects a version that has moved on).
    """
    assert rec.checkpoint is not None
    token = new_token()
    cp = rec.checkpoint.model_copy(update={"inputs": {**rec.checkpoint.inputs, **entries}})
    if resume:
        new = _moved(rec, token, now, cp.model_copy(update={"due_at": now}), **_running())
    else:
        new = _moved(rec, token, now, cp)
    return _commit(rec, new, token, logs=[_log(now, cp.next_phase, why)], events=[event])

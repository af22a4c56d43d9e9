"""Where running jobs are: held by a worker, queued for one, due later, or left by a worker that died.

A ``running`` job is one of four things, told apart from what every storage
answers (its due index, its leases and the record's journal), never from a
second source of truth:

* ``in flight``: a worker holds its lease now;
* ``queued``: due, and no worker holds it (it waits for one);
* ``scheduled``: due later (a delay or a retry's backoff);
* ``worker lost``: an attempt began and its worker went away before it
  committed: its lease ran out instead of being let go (a storage with
  ``Feature.LEASE_HISTORY`` says so, whether or not the attempt journaled
  anything), or, where no lapsed lease tells it (a storage without the
  feature, a lease an older release took), due with no live lease while the
  record holds steps a first attempt journaled (a retried attempt,
  ``attempt`` > 0, may carry its predecessor's steps, so it is called queued:
  that rule errs towards saying less). The next worker or the sweep
  (``pipelines advance --due``) runs the turn again from the journal; taking
  the lease ends the label.

Reading a lease is one storage call a job, so a split reads at most
:data:`LEASE_CHECKS` of them and says so when there are more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipelines.app import App
from pipelines.app.read_model import LeaseState
from pipelines.engine.models import JobRecord, JobStatus

__all__ = ["IN_FLIGHT", "LEASE_CHECKS", "LOST", "QUEUED", "SCHEDULED", "Split", "place", "split_running"]

LEASE_CHECKS = 500
IN_FLIGHT, QUEUED, SCHEDULED, LOST = "in flight", "queued", "scheduled", "worker lost"


def place(app: App, record: JobRecord, now: float | None = None, lease: LeaseState | None = None) -> str | None:
    """Where a running ``record`` is (one of the four above); ``None`` for a job that is not running.

    ``lease``: the job's lease when the caller has read it already (``app.read.lease_state``).
    """
    if record.status is not JobStatus.RUNNING:
        return None
    if lease is None:
        lease = app.read.lease_state(record.job_id)
    if lease.owner is not None:
        return IN_FLIGHT
    if lease.lapsed:
        return LOST
    checkpoint = record.checkpoint
    now = app.scheduler.now() if now is None else now
    if checkpoint is not None and checkpoint.due_at > now:
        return SCHEDULED
    # Steps journaled by a first attempt whose worker no longer holds the job. A later attempt (a retry) may
    # have been handed steps its failed predecessor journaled, so it is not taken for lost.
    if checkpoint is not None and checkpoint.journal and checkpoint.attempt == 0:
        return LOST
    return QUEUED


@dataclass
class Split:
    """Running jobs counted by place, from the ``checked`` earliest due; ``capped``: more were not looked at."""

    counts: dict[str, int] = field(default_factory=lambda: {IN_FLIGHT: 0, QUEUED: 0, SCHEDULED: 0, LOST: 0})
    checked: int = 0
    capped: bool = False
    jobs: list[tuple[JobRecord, str, str | None]] = field(default_factory=list)  # (record, place, lease owner)


def split_running(app: App, *, limit: int = LEASE_CHECKS, keep: bool = False) -> Split:
    """Count the running jobs by place (the due index lists every running job, earliest due first).

    ``keep``: also keep each (record, place, owner) for a listing (the workers page).
    """
    now = app.scheduler.now()
    ids = app.storage.due_jobs(math.inf, limit=limit + 1)
    split = Split(capped=len(ids) > limit)
    for job_id in ids[:limit]:
        record = app.storage.get_job(job_id)
        if record is None or record.status is not JobStatus.RUNNING:
            continue  # finished between the two reads
        lease = app.read.lease_state(job_id)
        where = place(app, record, now, lease) or QUEUED
        split.counts[where] += 1
        split.checked += 1
        if keep:
            split.jobs.append((record, where, lease.owner))
    return split

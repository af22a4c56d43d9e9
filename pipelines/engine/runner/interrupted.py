"""Poison turns: a turn whose work kills the worker running it is not handed to worker after worker for ever.

Such a turn (a segfault in a tool's C extension, the OOM killer, ``os._exit``, a tool that kills its own
process) never commits: its lease runs out, the sweep (or the next delivery) sends the turn again, another
worker takes the lease over, runs the same turn and dies too, across the whole fleet. Storage counts, per job,
the leases that ran out and were taken over since the job's last commit (``JobRecord.interrupted``, kept
beside the lease, filled in when the lease is taken: no extra round trip); any commit starts it again from 0.
Each take-over is logged as a warning; once the count reaches the App's ``max_interrupted_turns`` the runner
(``_LeasedJob.admit``) fails the job instead of running the turn again, through the ordinary failure
(``job_failed``, a parent woken, ``retry`` starts the count again).
"""

from __future__ import annotations

import logging

from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import JobRecord

__all__ = ["DEFAULT_MAX_INTERRUPTED_TURNS", "check_max_interrupted", "interrupted_error"]

logger = logging.getLogger("pipelines")

DEFAULT_MAX_INTERRUPTED_TURNS = 5
"""How many times in a row a job's turn may lose its lease without committing before the job is failed.

A worker killed at random (a deploy, a spot instance, ``make chaos`` killing one of four workers every
0.5 s) interrupts the turn it happens to hold; five such kills of the same turn in a row, each on the worker
that took it over, are far apart from chance (see docs/guide/production.md), while a turn that kills every
worker it runs on reaches five within five lease times."""


def check_max_interrupted(value: object) -> int | None:
    """``value`` as a limit: an int >= 1, or ``None`` (no limit: such a turn runs again for ever)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"max_interrupted_turns must be an int >= 1 or None, got {value!r}")
    return value


def interrupted_error(record: JobRecord, limit: int | None) -> str | None:
    """The error that fails ``record``'s job when its turn was interrupted ``limit`` times in a row, else ``None``.

    Warns (naming the job and the count) for a turn that was interrupted and runs again; the runner fails the
    job with the error through the ordinary failure, under the lease it took.
    """
    count = record.interrupted
    if count <= 0:
        return None
    if limit is not None and count >= limit:
        error = (f"job {record.job_id!r}: its turn was interrupted {count} times in a row without committing (the "
                 "worker process died or its lease ran out each time); failed so it does not take down more "
                 "workers (App(max_interrupted_turns=...); `retry` runs it again)")
        logger.error("%s", error)
        return error
    logger.warning("job %s: its turn lost its lease without committing %d time(s) in a row (the worker that held "
                   "it died or stalled past its lease); running it again%s", record.job_id, count,
                   "" if limit is None else f" (the job fails at {limit})")
    return None

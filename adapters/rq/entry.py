"""What an RQ message may make a ``pipelines worker`` run: the worker's entry point, nothing else.

RQ's own worker imports and calls whatever function a message names, with
the message's arguments, and so any success, failure or stopped callback it
names: whoever can write to the broker picks the code. A queue message
carries data, never a choice of code. ``pipelines worker`` reads its queues
with the job class :func:`entry_point_job` returns, bound to the one
function the worker was started to run (the App's ``WorkerEntry.advance``):
a message naming another function, an instance method or any callback
fails, logged, before anything it names is imported, and lands in RQ's
failed registry for inspection.
"""

from __future__ import annotations

import logging
from typing import Any

from rq.job import Job

from pipelines.engine.errors import ConfigurationError, InvalidInputError

__all__ = ["entry_point_job"]

logger = logging.getLogger(__name__)

_SHOWN = 200  # a name from a message is shown at most this long (it is outside input)


def entry_point_job(entry_point: str) -> type[Job]:
    """An RQ job class that runs only ``entry_point`` (a dotted path), with no instance and no callbacks."""
    if not isinstance(entry_point, str) or "." not in entry_point.strip("."):
        raise ConfigurationError(f"the worker's entry point must be a dotted path, got {entry_point!r}")

    class EntryPointJob(Job):
        @property
        def func(self) -> Any:
            refusal = _refusal(self, entry_point)
            if refusal is not None:
                logger.warning("%s", refusal)
                raise InvalidInputError(refusal)
            return super().func

        # A callback never runs, whatever the message says (func refused such a message already).
        @property
        def success_callback(self) -> None:
            return None

        @property
        def failure_callback(self) -> None:
            return None

        @property
        def stopped_callback(self) -> None:
            return None

    return EntryPointJob


def _refusal(job: Job, entry_point: str) -> str | None:
    """Why ``job`` must not run on a worker whose entry point is ``entry_point`` (None: it may)."""
    name = job.func_name
    if name != entry_point:
        return (f"refused RQ job {job.id}: it names {repr(name)[:_SHOWN]}, and this worker runs only "
                f"{entry_point!r} (a queue message carries data, never a choice of code)")
    if job.instance is not None:
        return f"refused RQ job {job.id}: it names an instance to call {entry_point!r} on"
    callbacks = [n for n in (job._success_callback_name, job._failure_callback_name, job._stopped_callback_name) if n]
    if callbacks:
        return f"refused RQ job {job.id}: it names callbacks {repr(callbacks)[:_SHOWN]}, and this worker runs none"
    return None

"""The scheduler on RQ: every advance an RQ job, and the workers that run them.

* :mod:`adapters.rq.scheduler`: :class:`RQScheduler` (the
  :class:`~adapters.base.Scheduler` port), told by the App what a worker runs.
* :mod:`adapters.rq.ids`: the RQ job id of each turn's advance.
* :mod:`adapters.rq.entry`: the job class a ``pipelines worker`` reads its
  queues with (it runs the worker's entry point and nothing else).
* :mod:`adapters.rq.priority`: the workers (interactive queue first, a share
  for background work).
* :mod:`adapters.rq.lifeline`: a worker's horse and scheduler child end with it.
* :mod:`adapters.rq.recovery`: a worker rides out a Redis outage in RQ's bookkeeping.
* :mod:`adapters.rq.bookkeeping`: a worker's own heartbeat and state cost no round trip a take, not eleven.
"""

from adapters.rq.scheduler import (
    SCHEDULER_LATE,
    RQJobRef,
    RQScheduler,
    decode_rq_job_id,
    parse_rq_job_id,
    rq_job_id,
)

__all__ = [
    "RQJobRef",
    "RQScheduler",
    "SCHEDULER_LATE",
    "decode_rq_job_id",
    "parse_rq_job_id",
    "rq_job_id",
]


def __getattr__(name: str) -> str:
    if name == "ADVANCE_FUNC":  # deprecated, warned about by adapters.rq.scheduler
        from adapters.rq import scheduler

        return scheduler.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

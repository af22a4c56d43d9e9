"""Bare RQ job chaining: the baseline for figure 3.

Each W1 turn is one RQ job, :func:`turn`, that computes the same fake model
answer and runs the same tool in memory, stores nothing of its own and
enqueues its successor (JSON serializer, one RQ id per turn, the same RQ
options as :class:`adapters.rq.RQScheduler` in ``bench.apps``). The last turn
of a job ``INCR``s :data:`DONE_KEY` so the bench knows when all jobs ended.

``python -m bench.baseline_rq --url URL --queue Q --name N [--simple]`` runs a
worker of the same class ``pipelines worker`` uses (``Worker``, or
``SimpleWorker`` with ``--simple``), with RQ's scheduler like ours.
"""

from __future__ import annotations

import argparse
import json
import sys

import redis
from rq import Queue, SimpleWorker, Worker
from rq.job import get_current_job
from rq.serializers import JSONSerializer

from bench import w1

FUNC = "bench.baseline_rq.turn"
DONE_KEY = "bench:baseline:done"
RQ_OPTIONS = {"job_timeout": 120, "result_ttl": 300, "failure_ttl": 3600}


def rq_id(job_id: str, k: int) -> str:
    return f"{job_id}-v{k}"


def enqueue(queue: Queue, job_id: str, k: int, turns: int) -> None:
    queue.enqueue(FUNC, args=[job_id, k, turns], job_id=rq_id(job_id, k),
                  description=f"turn {job_id} v{k}", **RQ_OPTIONS)


def turn(job_id: str, k: int, turns: int) -> str:
    """One W1 turn: model answer + tool, in memory; then enqueue turn ``k + 1`` (or count the job done)."""
    msg = w1.answer(k, turns)
    results = []
    for c in msg.get("tool_calls") or []:
        out = w1.add_impl(**json.loads(c["function"]["arguments"]))
        results.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(out)})
    job = get_current_job()
    assert job is not None
    if not results:
        job.connection.incr(DONE_KEY)
        return "completed"
    enqueue(Queue(job.origin, connection=job.connection, serializer=JSONSerializer), job_id, k + 1, turns)
    return "advanced"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--queue", default="baseline")
    p.add_argument("--name")
    p.add_argument("--simple", action="store_true")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    conn = redis.Redis.from_url(args.url)
    queue = Queue(args.queue, connection=conn, serializer=JSONSerializer)
    cls = SimpleWorker if args.simple else Worker
    worker = cls([queue], connection=conn, name=args.name, serializer=JSONSerializer)
    worker.work(with_scheduler=True, logging_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The App of the chaos runs (bench/chaos.py, tests/system/test_chaos.py): W1 agents whose tool records its effects.

Worker processes load it as ``tests.apps.chaos_app:app``; it is configured by
the environment::

    CHAOS_REDIS_URL    the run's private redis-server (required)
    FAKE_OPENAI_BASE   http://127.0.0.1:PORT/v1 of a fake OpenAI server answering W1 (required)
    CHAOS_QUEUE        RQ queue name (default "chaos")
    CHAOS_LEASE        App lease seconds (default 4)
    CHAOS_DELIVERIES   how many RQ jobs each advance is enqueued as (default 1; 3 = duplicate delivery)

Two agents share the W1 workload and differ only in the tool's crash policy:

``w1_retry``      ``add`` is idempotent (``on_interrupted="retry"``, the
                  default): a call interrupted mid-call runs again.
``w1_reconcile``  ``add`` is declared non-idempotent with
                  ``on_interrupted="reconcile"``: after a crash mid-call it
                  asks Redis whether the effect of this idempotency key landed.

The tool's *effect* is one ``MULTI``: ``INCR chaos:applied:<idempotency key>``
(how many times the effect was applied), ``HSET chaos:result`` (what it
returned, for reconcile) and ``RPUSH chaos:apply-log`` (``"<key> <pid> <time>"``,
so a repeat can be matched with the kill that interrupted the first one).
When that Redis is unreachable (the restart scenario) the tool and its
reconcile raise ``RetryLater``: the turn runs again later, its journaled
model answer reused, instead of telling the model that the tool failed.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import timedelta
from typing import Any

import redis
from pydantic import BaseModel

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler, rq_job_id
from pipelines import Agent, RetryLater, Tool, ToolContext
from pipelines.app import App
from pipelines.worker import ADVANCE_FUNC

APP_PATH = "tests.apps.chaos_app:app"
RETRY_AGENT = "w1_retry"
RECONCILE_AGENT = "w1_reconcile"
SYSTEM = "You add numbers."
APPLIED = "chaos:applied:"  # + idempotency key: INCR per applied effect
RESULTS = "chaos:result"  # hash: idempotency key -> the tool's result (JSON)
APPLY_LOG = "chaos:apply-log"  # list of "<key> <pid> <unix time>"


class AddArgs(BaseModel):
    a: int
    b: int


def user_message(job_id: str, turns: int) -> str:
    """The first user message of a chaos job: the fake server reads ``turns=T`` from it."""
    return f"turns={turns}: keep adding one (job {job_id})"


class TripleDelivery(RQScheduler):
    """An ``RQScheduler`` that enqueues every advance ``deliveries`` times, under distinct RQ ids.

    The first copy is the scheduler's own (``<job>-v<version>``); the others
    get ``<job>-v<version>-dup<n>-<random>`` ids, as if the queue delivered the
    same message again. The runner must make every extra copy a no-op (I6).
    """

    def __init__(self, *args: Any, deliveries: int = 3, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deliveries = deliveries

    def schedule_advance(self, job_id: str, delay: float = 0.0, *, pipeline: str = "default",
                         version: int | None = None, priority: str | None = None) -> None:
        super().schedule_advance(job_id, delay, pipeline=pipeline, version=version, priority=priority)
        base = rq_job_id(job_id, version) if version is not None else "x"
        for n in range(1, self.deliveries):
            options: dict[str, Any] = {
                "args": [job_id, version], "kwargs": {"app": self.app} if self.app else {},
                "job_id": f"{base}-dup{n}-{uuid.uuid4().hex[:8]}", "job_timeout": self.job_timeout,
                "result_ttl": self.result_ttl, "failure_ttl": self.failure_ttl,
                "description": f"duplicate {n} of advance {job_id} v{version}",
            }
            if delay > 0:
                self.queue.enqueue_in(timedelta(seconds=delay), ADVANCE_FUNC, **options)
            else:
                self.queue.enqueue(ADVANCE_FUNC, **options)


APPLICATION = "chaos:application:"  # + a per-call id: SET once the effect is recorded

# One application of an effect, recorded once even when redis-py sends it again because the reply was
# lost (a Redis restart with appendonly kept the write, the connection did not): the tool ran once, and
# that is what the chaos checks count. A second run of the tool has another id and counts.
_APPLY = """
if redis.call('SET', KEYS[4], '1', 'NX', 'EX', 3600) then
  redis.call('INCR', KEYS[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('RPUSH', KEYS[3], ARGV[3])
end
return 1
"""


def _apply(script: Any, key: str, result: dict[str, int]) -> None:
    script(keys=[APPLIED + key, RESULTS, APPLY_LOG, APPLICATION + uuid.uuid4().hex],
           args=[key, json.dumps(result), f"{key} {os.getpid()} {time.time():.6f}"])


def make_tools(client: Any) -> tuple[Tool, Tool]:
    """The two ``add`` tools (retry and reconcile), recording their effects through ``client``."""

    apply = client.register_script(_APPLY)

    def execute(args: AddArgs, ctx: ToolContext) -> dict[str, int]:
        result = {"sum": args.a + args.b}
        try:
            _apply(apply, ctx.idempotency_key, result)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # The effect store is down (the Redis restart scenario): run this turn
            # again later rather than tell the model the tool failed.
            raise RetryLater(1.0, f"effect store unreachable: {exc}") from exc
        return result

    def reconcile(args: AddArgs, ctx: ToolContext) -> Any:
        try:
            found = client.hget(RESULTS, ctx.idempotency_key)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise RetryLater(1.0, f"effect store unreachable: {exc}") from exc
        return None if found is None else json.loads(found)

    retry = Tool(name="add", description="Add two integers.", input_model=AddArgs, execute=execute)
    recon = Tool(name="add", description="Add two integers.", input_model=AddArgs, execute=execute,
                 idempotent=False, on_interrupted="reconcile", reconcile=reconcile)
    return retry, recon


def agents(base: str, client: Any, *, max_turns: int = 20) -> list[Agent]:
    retry, recon = make_tools(client)
    params = {"api_base": base, "api_key": "sk-test", "timeout": 20}
    return [Agent(name=name, model="openai/fake-model", tools=[t], system=SYSTEM, max_turns=max_turns,
                  model_params=params)
            for name, t in ((RETRY_AGENT, retry), (RECONCILE_AGENT, recon))]


def build(url: str, base: str, *, queue: str = "chaos", lease: float = 4.0, deliveries: int = 1) -> App:
    storage = RedisStorage.from_url(url)
    cls = TripleDelivery if deliveries > 1 else RQScheduler
    extra: dict[str, Any] = {"deliveries": deliveries} if deliveries > 1 else {}
    scheduler = cls(storage.client, queue=queue, app=APP_PATH, job_timeout=120, result_ttl=60, failure_ttl=3600,
                    **extra)
    return App(storage=storage, scheduler=scheduler, agents=agents(base, storage.client), lease_seconds=lease)


def _from_env() -> App | None:
    url, base = os.environ.get("CHAOS_REDIS_URL"), os.environ.get("FAKE_OPENAI_BASE")
    if not url or not base:
        return None
    return build(url, base, queue=os.environ.get("CHAOS_QUEUE", "chaos"),
                 lease=float(os.environ.get("CHAOS_LEASE", "4")),
                 deliveries=int(os.environ.get("CHAOS_DELIVERIES", "1")))


app = _from_env()

"""The App the flow-control bench's workers load: ``python -m pipelines worker --app bench.flow_apps:app``.

Environment (set by bench/flow_bench.py)::

    BENCH_REDIS_URL   the bench's private redis-server (required)
    FLOW_RPM          a shared rate limit on the W1 model, requests a minute (0: none)
    FLOW_CONCURRENCY  at most this many turns at once per concurrency key (0: none)
    FLOW_CONTINUE     App.continue_for in seconds
    FLOW_LATENCY      seconds the model takes to answer (a provider's latency, not a wait for capacity)
    FLOW_LEASE        App.lease_seconds (default 60; a concurrency slot is leased for 1.5 x that)
    FLOW_TURNS        model calls per job (default 10, W1's)

The model logs every call to the Redis list ``flowbench:calls`` as
``<start> <end> <job id>`` (the bench reads call rates and overlaps from it).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from bench import w1
from pipelines import Agent
from pipelines.app import App
from pipelines.engine.flow import RateLimit
from pipelines.testing import ScriptedModel

APP_PATH = "bench.flow_apps:app"
CALLS = "flowbench:calls"
MODEL = "bench/w1"


class LoggedModel(ScriptedModel):
    """W1's scripted model under a name a RateLimit matches; logs each call to Redis."""

    model = MODEL

    def __init__(self, client: redis.Redis, latency: float) -> None:
        super().__init__(w1.reply_fn(int(os.environ.get("FLOW_TURNS", "10"))))
        self.client = client
        self.latency = latency

    def complete(self, request: Any) -> Any:
        start = time.time()
        if self.latency:
            time.sleep(self.latency)  # the provider's latency
        out = super().complete(request)
        self.client.rpush(CALLS, f"{start!r} {time.time()!r} {request.job_id}")
        return out


def build(url: str) -> App:
    storage = RedisStorage.from_url(url)
    scheduler = RQScheduler(storage.client, queue="flowbench", app=APP_PATH, job_timeout=120)
    rpm = float(os.environ.get("FLOW_RPM", "0"))
    limit = int(os.environ.get("FLOW_CONCURRENCY", "0"))
    model = LoggedModel(storage.client, float(os.environ.get("FLOW_LATENCY", "0")))
    agent = Agent(name="w1", model=model, tools=[w1.add], system=w1.SYSTEM, max_turns=11, stream=False)
    return App(storage=storage, scheduler=scheduler, agents=[agent], provenance=False,
               continue_for=float(os.environ.get("FLOW_CONTINUE", "0")),
               lease_seconds=float(os.environ.get("FLOW_LEASE", "60")),
               rate_limits=[RateLimit(model=MODEL, rpm=rpm)] if rpm else [],
               concurrency={"*": limit} if limit else None)


app = build(os.environ["BENCH_REDIS_URL"]) if os.environ.get("BENCH_REDIS_URL") else None

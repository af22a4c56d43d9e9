"""A parent agent that starts three child runs, under a concurrency limit of 1 per key, on RQ workers.

``python -m pipelines worker --app tests.apps.family_flow_app:app`` with ``REDIS_URL`` set (the test's
private redis-server). Every model call logs ``<start> <end> <job id>`` to the Redis list :data:`CALLS`
and takes :data:`LATENCY` seconds, so overlapping turns of the key would show.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Agent
from pipelines.app import App
from pipelines.testing import ScriptedModel, call, reply

APP_PATH = "tests.apps.family_flow_app:app"
CALLS = "familyflow:calls"
LATENCY = 0.2


class LoggedModel(ScriptedModel):
    def __init__(self, client: redis.Redis, script: Any) -> None:
        super().__init__(script)
        self.client = client

    def complete(self, request: Any) -> Any:
        start = time.time()
        time.sleep(LATENCY)
        out = super().complete(request)
        self.client.rpush(CALLS, f"{start!r} {time.time()!r} {request.job_id}")
        return out


def _boss(messages: list[Any]) -> Any:
    if messages[-1]["role"] == "user":
        return reply(None, *[{**call("researcher", input=f"q{i}"), "id": f"c{i}"} for i in range(3)])
    return "boss done"


def build(url: str) -> App:
    storage = RedisStorage.from_url(url, prefix="familyflow")
    scheduler = RQScheduler.for_storage(storage, queue="familyflow", app=APP_PATH, job_timeout=120)
    researcher = Agent(name="researcher", model=LoggedModel(storage.client, lambda m: "found"), stream=False)
    boss = Agent(name="boss", model=LoggedModel(storage.client, _boss), stream=False,
                 tools=[researcher.as_tool(description="Research.")])
    return App(storage=storage, scheduler=scheduler, agents=[boss, researcher], provenance=False,
               concurrency={"t-": 1})


app = build(os.environ["REDIS_URL"]) if os.environ.get("REDIS_URL") else None

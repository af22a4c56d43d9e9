"""The App of the streaming system tests and benchmark: a streaming W1 agent on Redis + RQ (or local threads).

Worker processes load ``tests.apps.stream_app:app``, configured from the environment::

    REDIS_URL          the redis-server (required)
    FAKE_OPENAI_BASE   http://127.0.0.1:PORT/v1 of tests/fake_openai.py (required)
    PIPELINES_QUEUE    RQ queue name (default "streaming")
    PIPELINES_LEASE    App lease seconds (default 60; the kill test uses 3)

The test process builds the same App with :func:`make_app` (``app`` is made on
first access, so importing this module needs no environment). ``make_app(...,
workers=N)`` runs its turns on N threads of the process that builds it
(:class:`~adapters.local.LocalScheduler`) instead of RQ: bench figure 18's
one worker process with many streams at once.
"""

from __future__ import annotations

import os
from typing import Any

from adapters.local import LocalScheduler
from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Agent
from pipelines.app import App
from tests.apps.agent_app import add

APP_PATH = "tests.apps.stream_app:app"
AGENT_NAME = "streamer"


def make_app(redis_url: str, base: str, *, queue: str | None = None, lease: float | None = None,
             workers: int | None = None) -> App:
    """The App: one agent, ``streamer`` (W1's ``add`` tool), streaming from the fake server at ``base``.

    ``workers``: run turns on that many local threads (not started here: ``app.scheduler.start()``) instead
    of enqueueing them for RQ workers on ``queue``.
    """
    storage = RedisStorage.from_url(redis_url)
    queue = queue or os.environ.get("PIPELINES_QUEUE", "streaming")
    scheduler: LocalScheduler | RQScheduler
    if workers is not None:
        scheduler = LocalScheduler(workers=workers)
    else:
        scheduler = RQScheduler.for_storage(storage, queue=queue, app=APP_PATH, job_timeout=120, result_ttl=60)
    agent = Agent(name=AGENT_NAME, model="openai/fake-model", tools=[add], system="You add numbers.", max_turns=20,
                  model_params={"api_base": base, "api_key": "sk-test", "timeout": 20})
    return App(storage=storage, scheduler=scheduler, agents=[agent],
               lease_seconds=lease if lease is not None else float(os.environ.get("PIPELINES_LEASE", "60")))


def __getattr__(name: str) -> Any:
    # Made on first access: a worker reads its environment, a test calls make_app itself.
    if name == "app":
        value = make_app(os.environ["REDIS_URL"], os.environ["FAKE_OPENAI_BASE"])
        globals()["app"] = value
        return value
    raise AttributeError(name)

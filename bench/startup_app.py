"""The App of figure 11 (bench/startup_bench.py): ``python -m pipelines worker --app bench.startup_app:app``.

One agent whose model goes through litellm to ``tests/fake_openai.py`` on
127.0.0.1 (so the worker warms litellm), and one pipeline whose phases call
no model. Configured from the environment::

    STARTUP_REDIS_URL  the bench's private redis-server (required)
    STARTUP_QUEUE      RQ queue name (required: one per run)
    FAKE_OPENAI_BASE   http://127.0.0.1:PORT/v1 of the fake server (required)

``app`` is built on first access, so the bench imports this module for
:func:`make_app` without that environment.
"""

from __future__ import annotations

import os
from typing import Any

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Agent, Done, Next, Phase, PhaseContext, Pipeline
from pipelines.app import App
from tests.apps.agent_app import add

APP_PATH = "bench.startup_app:app"
AGENT = "adder"
PLAIN = "plain"


def _first(ctx: PhaseContext[Any]) -> Next:
    return Next("second", state={"n": 1})


def _second(ctx: PhaseContext[Any]) -> Done:
    return Done(result={"n": ctx.state["n"] + 1})


def make_app(redis_url: str, base: str, queue: str) -> App:
    """The App: agent ``adder`` (litellm, streamed, W1's ``add`` tool) and pipeline ``plain`` (no model)."""
    storage = RedisStorage.from_url(redis_url)
    scheduler = RQScheduler.for_storage(storage, queue=queue, app=APP_PATH, job_timeout=120, result_ttl=60)
    agent = Agent(name=AGENT, model="openai/fake-model", tools=[add], system="You add numbers.", max_turns=20,
                  model_params={"api_base": base, "api_key": "sk-test", "timeout": 20})
    return App(storage=storage, scheduler=scheduler, agents=[agent],
               pipelines={PLAIN: Pipeline(phases=[Phase("first", _first), Phase("second", _second)])})


def __getattr__(name: str) -> Any:
    if name == "app":  # made on first access: only a worker has the environment
        value = make_app(os.environ["STARTUP_REDIS_URL"], os.environ["FAKE_OPENAI_BASE"], os.environ["STARTUP_QUEUE"])
        globals()["app"] = value
        return value
    raise AttributeError(name)

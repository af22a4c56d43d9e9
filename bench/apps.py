"""The App the benchmark's RQ workers load: ``python -m pipelines worker --app bench.apps:app``.

Configured from the environment (the bench sets these for its workers)::

    BENCH_REDIS_URL   the bench's private redis-server (required)
    BENCH_QUEUE       RQ queue name (default "bench")
    BENCH_TURNS       W1 turns per job (default 10)
    BENCH_CONTINUE    App.continue_for in seconds (default 0.25, as examples/production
                      configures it; 0 = one turn per queue message)
"""

from __future__ import annotations

import os

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from bench import w1
from pipelines import Agent
from pipelines.app import App
from pipelines.testing import ScriptedModel

APP_PATH = "bench.apps:app"
PIPELINE = "w1"


def w1_agent(turns: int, model: object | None = None) -> Agent:
    """The W1 agent: the ``add`` tool, a stateless scripted model, room for every turn."""
    return Agent(name=PIPELINE, model=model or ScriptedModel(w1.reply_fn(turns)), tools=[w1.add],  # type: ignore[arg-type]
                 system=w1.SYSTEM, max_turns=turns + 1)


def build(url: str, *, queue: str = "bench", turns: int = 10, continue_for: float = 0.25) -> App:
    storage = RedisStorage.from_url(url)
    scheduler = RQScheduler(storage.client, queue=queue, app=APP_PATH, job_timeout=120, result_ttl=300,
                            failure_ttl=3600)
    return App(storage=storage, scheduler=scheduler, agents=[w1_agent(turns)], continue_for=continue_for)


def _from_env() -> App | None:
    url = os.environ.get("BENCH_REDIS_URL")
    if not url:
        return None
    return build(url, queue=os.environ.get("BENCH_QUEUE", "bench"), turns=int(os.environ.get("BENCH_TURNS", "10")),
                 continue_for=float(os.environ.get("BENCH_CONTINUE", "0.25")))


app = _from_env()

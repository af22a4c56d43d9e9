"""The Celery app of the tests: a Celery instance (JSON only) and a phaserunner App on Redis + CeleryScheduler.

``celery worker`` processes load it as ``-A tests.apps.celery_app:celery``;
the phaserunner App they advance with is ``tests.apps.celery_app:app``
(named in every message). Configured by the environment::

    REDIS_URL          the test's private redis-server: broker and storage (required)
    CELERY_QUEUE       queue name (default "pipelines")
    CELERY_LEASE       App lease seconds (default 60; the kill test uses 2)
    CELERY_ALIVE_TTL   seconds a killed worker process stays on the workers page (default 10; the kill test uses 3)
    FAKE_OPENAI_BASE   the W1 fake OpenAI server (tests/fake_openai.py) for the agents
    CELERY_STALL_KEY   an idempotency key: the first time the reconcile agent's
                       ``add`` applies it, the worker records ``"<key> <pid>"``
                       in the list ``celery-test:stalled`` and sleeps (the test
                       SIGKILLs it there: effect applied, result not journaled)

The agents are ``tests.apps.chaos_app``'s W1 agents (``w1_retry`` and
``w1_reconcile``, whose ``add`` records every applied effect in Redis).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from adapters.celery import CeleryScheduler
from adapters.redis import RedisStorage
from pipelines import Agent, Tool, ToolContext
from pipelines.app import App
from tests.apps import chaos_app

APP_PATH = "tests.apps.celery_app:app"
STALLED = "celery-test:stalled"


def make_celery(url: str, *, main: str = "phaserunner-tests", visibility_timeout: float = 3600,
                alive_ttl: float | None = None) -> Celery:
    """A Celery app on ``url`` as the docs recommend: JSON only, late acks, a killed worker's task redelivered."""
    celery = Celery(main, broker=url, set_as_current=False)
    if alive_ttl is not None:
        celery.conf.phaserunner_alive_ttl = alive_ttl
    celery.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"],
        task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
        broker_transport_options={"visibility_timeout": visibility_timeout},
    )
    return celery


def _agents(base: str, client: Any, stall_key: str | None) -> list[Agent]:
    """chaos_app's two W1 agents; the reconcile agent's ``add`` hangs once after applying ``stall_key``."""
    retry, recon = chaos_app.make_tools(client)

    def execute(args: chaos_app.AddArgs, ctx: ToolContext) -> Any:
        result = recon.execute(args, ctx)  # the effect lands here (INCR + HSET + RPUSH in one MULTI)
        if ctx.idempotency_key == stall_key and client.set(f"{STALLED}:once", "1", nx=True):
            client.rpush(STALLED, f"{stall_key} {os.getpid()}")
            time.sleep(120)  # the test SIGKILLs this worker here: effect applied, result not journaled
        return result

    stalling = Tool(name="add", description="Add two integers.", input_model=chaos_app.AddArgs, execute=execute,
                    idempotent=False, on_interrupted="reconcile", reconcile=recon.reconcile)
    params = {"api_base": base, "api_key": "sk-test", "timeout": 20}
    return [Agent(name=name, model="openai/fake-model", tools=[tool], system=chaos_app.SYSTEM, max_turns=20,
                  model_params=params)
            for name, tool in ((chaos_app.RETRY_AGENT, retry), (chaos_app.RECONCILE_AGENT, stalling))]


def build(url: str, base: str | None, *, queue: str = "pipelines", lease: float = 60.0,
          stall_key: str | None = None, alive_ttl: float | None = None) -> tuple[Celery, App]:
    """The Celery app and the phaserunner App of one test run."""
    celery = make_celery(url, alive_ttl=alive_ttl)
    storage = RedisStorage.from_url(url)
    scheduler = CeleryScheduler.for_storage(celery, storage, queue=queue, app=APP_PATH)
    agents = _agents(base, storage.client, stall_key) if base else []
    return celery, App(storage=storage, scheduler=scheduler, agents=agents, lease_seconds=lease)


def _from_env() -> tuple[Celery | None, App | None]:
    url = os.environ.get("REDIS_URL")
    if not url:
        return None, None
    return build(url, os.environ.get("FAKE_OPENAI_BASE"), queue=os.environ.get("CELERY_QUEUE", "pipelines"),
                 lease=float(os.environ.get("CELERY_LEASE", "60")), stall_key=os.environ.get("CELERY_STALL_KEY"),
                 alive_ttl=float(os.environ["CELERY_ALIVE_TTL"]) if os.environ.get("CELERY_ALIVE_TTL") else None)


celery, app = _from_env()

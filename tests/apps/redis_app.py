"""The App that worker processes load in the integration and system tests.

Configured from the environment, like a real deployment::

    REDIS_URL          the test's private redis-server (required): the queues, and the jobs unless...
    REDIS_CLUSTER_URL  a Redis Cluster node: the jobs live there (RQ's queues stay on REDIS_URL)
    PIPELINES_REPLICAS replicas that must acknowledge each write on the cluster (default 0)
    PIPELINES_QUEUE    RQ queue name (default "pipelines")
    PIPELINES_LEASE    App lease seconds (default: the App's default; most kill tests use 3)
    PIPELINES_NAP      seconds the first run of a job's "nap" phase sleeps (default 30)
    FAKE_OPENAI_BASE   http://127.0.0.1:PORT/v1 of tests/fake_openai.py, for the agent
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Done, Next, Phase, PhaseContext
from pipelines.app import App, PipelineSource

APP_PATH = "tests.apps.redis_app:app"
NAP_STARTED = "test:nap-started"
"""A Redis list of "<job id> <pid>": who started a first (long) nap, for the kill test."""
NAP_RUNS = "test:nap-runs"
"""A Redis list of "<job id> <pid> <unix time>": every start of a nap, the first and the recovering one."""


def _one(ctx: PhaseContext[Any]) -> Next:
    return Next("two", state={"n": ctx.state["n"] + 1, "pids": [os.getpid()]})


def _two(ctx: PhaseContext[Any]) -> Next:
    ctx.log("two")
    return Next("three", state={"n": ctx.state["n"] * 10, "pids": [*ctx.state["pids"], os.getpid()]})


def _three(ctx: PhaseContext[Any]) -> Done:
    return Done(result={"n": ctx.state["n"] + 1, "pids": [*ctx.state["pids"], os.getpid()]})


def _start(ctx: PhaseContext[Any]) -> Next:
    return Next("nap")


def _nap(ctx: PhaseContext[Any]) -> Next:
    client = scheduler.connection  # the plain Redis, also when the jobs are on a cluster
    client.rpush(NAP_RUNS, f"{ctx.job_id} {os.getpid()} {time.time()}")
    # Only a job's first nap is long: that is the run the test kills; the
    # run that recovers it is quick.
    if client.incr(f"test:nap:{ctx.job_id}") == 1:
        client.rpush(NAP_STARTED, f"{ctx.job_id} {os.getpid()}")
        time.sleep(float(os.environ.get("PIPELINES_NAP", "30")))
    return Next("end", state={"napped_in": os.getpid()})


def _end(ctx: PhaseContext[Any]) -> Done:
    return Done(result=ctx.state)


def _agents() -> list[PipelineSource]:
    base = os.environ.get("FAKE_OPENAI_BASE")
    if not base:
        return []
    from tests.apps.agent_app import adder_agent

    return [adder_agent(base)]


if os.environ.get("REDIS_CLUSTER_URL"):
    storage = RedisStorage.from_url(os.environ["REDIS_CLUSTER_URL"], cluster=True,
                                    replicas=int(os.environ.get("PIPELINES_REPLICAS", "0")))
    queues = redis.Redis.from_url(os.environ["REDIS_URL"])
else:
    storage = RedisStorage.from_url(os.environ["REDIS_URL"])
    queues = storage.client
scheduler = RQScheduler(queues, queue=os.environ.get("PIPELINES_QUEUE", "pipelines"), app=APP_PATH,
                        job_timeout=120, result_ttl=60, failure_ttl=3600, namespace=storage.prefix)
app = App(
    storage=storage,
    scheduler=scheduler,
    pipelines={
        "multi": [Phase("one", _one), Phase("two", _two), Phase("three", _three)],
        "sleepy": [Phase("start", _start), Phase("nap", _nap), Phase("end", _end)],
    },
    agents=_agents(),
    # Unset: the App's default lease, as a deployment that never names one gets.
    **({"lease_seconds": float(os.environ["PIPELINES_LEASE"])} if os.environ.get("PIPELINES_LEASE") else {}),
)

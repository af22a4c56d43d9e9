"""The turn's environment on real RQ workers (issue 29 item 1; issue 30 defect 13).

An agent used as a tool starts its child job from the tool timeout's thread,
and beside an ``async def`` tool and a timed ``def`` tool, in a forked
work-horse and in a SimpleWorker: each finds the App in its ``ToolContext``.
"""

from __future__ import annotations

import pytest

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import JobStatus
from pipelines.app import App
from pipelines.engine.children import child_job_id
from tests.apps import env_app
from tests.system.conftest import Cluster, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.system]


def _client_app(redis_url: str) -> App:
    storage = RedisStorage.from_url(redis_url, prefix="envapp")
    return env_app.build(storage, RQScheduler(storage.client, queue="envapp", app=env_app.APP_PATH,
                                              namespace=storage.prefix))


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_child_tools_on_timed_and_async_threads_run_on_workers(cluster: Cluster, redis_url: str, kind: str) -> None:
    app = _client_app(redis_url)
    args = ["-m", "pipelines", "worker", "--app", env_app.APP_PATH, "--name", f"env-{kind}",
            "--log-level", "WARNING", *(["--simple"] if kind == "simple" else [])]
    cluster.start(args, f"env-{kind}")
    app.run_agent("boss_timed", job_id=f"t-{kind}", user="go")
    app.run_agent("boss_mixed", job_id=f"m-{kind}", user="go", context={"tenant": kind})

    def finished() -> bool:
        return all((r := app.storage.get_job(j)) is not None and r.status is not JobStatus.RUNNING
                   and r.status is not JobStatus.WAITING for j in (f"t-{kind}", f"m-{kind}"))

    wait_for("both parents to finish", finished, 90, cluster.logs)
    for job_id in (f"t-{kind}", f"m-{kind}"):
        record = app.storage.get_job(job_id)
        assert record is not None and record.status is JobStatus.COMPLETE, (job_id, record and record.error)
        child = app.storage.get_job(child_job_id(job_id, "c0"))
        assert child is not None and child.status is JobStatus.COMPLETE, cluster.logs()
    assert app.messages(f"t-{kind}")[-1]["content"] == "parent heard: child says: look it up"
    results = {m["tool_call_id"]: m["content"] for m in app.messages(f"m-{kind}") if m["role"] == "tool"}
    context = {"tenant": kind}
    assert results == {"c0": "child says: dig", "c1": f"async: app=True context={context}",
                       "c2": f"timed: app=True context={context}"}

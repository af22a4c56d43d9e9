"""A queue message carries data, never a choice of code: forged RQ messages against a real `pipelines worker`.

Whoever can write to the broker writes RQ messages by hand here: one naming
another app for the worker's entry point, one naming another function, one
naming a callback. The worker runs none of that code (tests/apps/foreign_code.py
marks every import and call in Redis); each message lands in RQ's failed
registry, and a message naming the worker's own app path, as a scheduler
built with ``app=`` sends it, is served.
"""

from __future__ import annotations

import pytest
import redis
from rq import Callback, Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from pipelines import JobStatus
from pipelines.app import App
from pipelines.worker import ADVANCE_FUNC
from tests.system.conftest import APP_PATH, Cluster, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.system]

FOREIGN = "tests.apps.foreign_code"  # never imported here: importing it leaves a mark
MARKS = "test:foreign-code"  # where it leaves them (tests/apps/foreign_code.py)


def test_a_worker_runs_only_its_entry_point_with_its_own_app(cluster: Cluster, app: App,
                                                             client: redis.Redis) -> None:
    cluster.worker("guard")  # forking: the refusal happens in the horse, before anything is imported
    queue = Queue("pipelines", connection=client, serializer=JSONSerializer)
    app.run_pipeline("multi", job_id="own", initial_state={"n": 1})  # its messages name APP_PATH, the worker's own
    forged = [
        queue.enqueue(ADVANCE_FUNC, args=["own", 1], kwargs={"app": f"{FOREIGN}:app"}),
        queue.enqueue(f"{FOREIGN}.app"),
        queue.enqueue(ADVANCE_FUNC, args=["own", 1], kwargs={"app": APP_PATH},
                      on_success=Callback(f"{FOREIGN}.callback"), on_failure=Callback(f"{FOREIGN}.callback")),
    ]

    def failed() -> list[Job]:
        for job in forged:
            job.refresh()
        return forged if all(job.get_status() == "failed" for job in forged) else []

    wait_for("the forged messages to fail", failed, 30, cluster.logs)
    wait_for("the job's own messages to be served",
             lambda: (rec := app.storage.get_job("own")) is not None and rec.status is JobStatus.COMPLETE,
             30, cluster.logs)
    assert client.lrange(MARKS, 0, -1) == []  # nothing of the foreign module was imported or called
    for job in forged:
        result = job.latest_result()
        assert result is not None and "refused" in (result.exc_string or ""), result
    assert cluster.logs().count("refused") >= len(forged)  # and each refusal was logged by the worker

"""RidesOutOutages retries the dequeue, on a stand-in for RQ's worker (the real one: test_rq_outage.py)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from rq.exceptions import StopRequested

from adapters.rq.recovery import RidesOutOutages


class _Flaky:
    """RQ's dequeue as it behaves when Redis refuses before its own retry loop: ``fails`` times, then a job."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.calls = 0

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        self.calls += 1
        if self.calls <= self.fails:
            raise redis.ConnectionError("Connection refused.")
        return ("job", "queue")


class _Worker(RidesOutOutages, _Flaky):
    outage_pause = 0.0
    name = "w"
    _stop_requested = False


def test_a_refused_dequeue_is_tried_again_until_redis_answers() -> None:
    worker = _Worker(fails=3)
    assert worker.dequeue_job_and_maintain_ttl(None) == ("job", "queue")
    assert worker.calls == 4


def test_a_worker_asked_to_stop_stops_instead_of_waiting_for_redis() -> None:
    worker = _Worker(fails=3)
    worker._stop_requested = True
    with pytest.raises(StopRequested):
        worker.dequeue_job_and_maintain_ttl(None)
    assert worker.calls == 1


class _Refused(_Flaky):
    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        self.calls += 1
        raise redis.AuthenticationError("invalid username-password pair")


class _RefusedWorker(RidesOutOutages, _Refused):
    outage_pause = 0.0
    _stop_requested = False


def test_refused_credentials_are_no_outage_and_end_the_worker() -> None:
    worker = _RefusedWorker(fails=0)
    with pytest.raises(redis.AuthenticationError):  # redis-py files it under ConnectionError
        worker.dequeue_job_and_maintain_ttl(None)
    assert worker.calls == 1

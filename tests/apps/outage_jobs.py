"""RQ job functions for the outage test (tests/integration/test_rq_outage.py): a Redis outage mid-bookkeeping."""

from __future__ import annotations

import threading
import time
from typing import Any

SERVER: Any = None  # the test's tests.redis_server.RedisServer, set before the worker runs
RAN: list[str] = []
RESTARTS: list[threading.Thread] = []  # joined by the test before it removes the server


def outage(seconds: float) -> str:
    """Stop the server as this job ends; start it again (same port, same data) ``seconds`` later."""
    server = SERVER
    server.stop()  # SIGTERM: with appendonly, what was queued survives

    def back() -> None:
        time.sleep(seconds)
        server.start()

    thread = threading.Thread(target=back, daemon=True)
    thread.start()
    RESTARTS.append(thread)
    return "down"


def mark(name: str) -> str:
    RAN.append(name)
    return name

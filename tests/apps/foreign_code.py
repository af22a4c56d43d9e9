"""Code a forged queue message names: importing this module or calling anything in it leaves a mark.

No test imports it. A worker that did ran a broker writer's choice of code
(a queue message carries data, never a choice of code: tests/system/
test_foreign_messages.py, tests/unit/test_worker_app.py). Each mark goes to
:data:`marks` in the process, and to the Redis list :data:`MARKS` when
``REDIS_URL`` is set (a worker process).
"""

from __future__ import annotations

import os
from typing import Any

MARKS = "test:foreign-code"
marks: list[str] = []


def _mark(what: str) -> None:
    marks.append(what)
    url = os.environ.get("REDIS_URL")
    if url:
        import redis

        client = redis.Redis.from_url(url)
        client.rpush(MARKS, f"{what} in pid {os.getpid()}")
        client.close()


_mark("imported")


def app() -> None:
    """What a message naming ``tests.apps.foreign_code:app`` as its app would have a worker call."""
    _mark("called app")


def callback(*args: Any) -> None:
    """An RQ success or failure callback a message could name."""
    _mark("called callback")

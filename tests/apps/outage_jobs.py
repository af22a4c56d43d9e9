"""RQ job functions for the outage test (tests/integration/test_rq_outage.py): a Redis outage mid-bookkeeping."""

from __future__ import annotations

import os
import signal
import socket
import time

REDIS_PID = 0  # the test's redis-server, set before the worker runs
REDIS_PORT = 0


def outage(then_work: float = 0.0, log: str = "") -> str:
    """Stop the test's redis-server (SIGTERM: with appendonly, what was queued survives), then work ``then_work`` s.

    The test starts it again; this may run in a forking worker's horse, which ends with the job.
    With ``log``, "outage ended" is appended to that file as the job ends.
    """
    os.kill(REDIS_PID, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # returned once it refuses: RQ's record of this job's end meets the outage
        try:
            socket.create_connection(("127.0.0.1", REDIS_PORT), timeout=0.2).close()
        except OSError:
            break
        time.sleep(0.01)
    else:
        raise RuntimeError("redis-server still answers 10 s after SIGTERM")
    time.sleep(then_work)
    _note(log, "outage ended")
    return "down"


def _note(log: str, line: str) -> None:
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")


def mark(name: str, log: str = "") -> str:
    _note(log, name)
    return name  # the test reads that it finished from RQ (it may run in a horse)

"""RQ workers for in-process burst runs in tests: RQ's own classes, minus the command listener.

RQ's worker subscribes to a pubsub channel for commands (stop, kill the horse) on a daemon thread that
reads with a 60 s timeout, and its teardown waits for that thread only 1 s. In a test the thread outlives
the worker, blocked in its read; when its Redis goes away (the session's server at the end, a test's
private one) it logs "Worker ...: could not connect to Redis instance ... retrying in 2 seconds" into the
terminal. A burst run inside a test takes no commands, so these workers do not listen for them. Worker
processes (``pipelines worker``) keep RQ's listener: their output goes to their own log.
"""

from __future__ import annotations

from typing import Any, TypeVar

from rq import SimpleWorker

__all__ = ["BurstWorker", "without_commands"]

W = TypeVar("W", bound=type[Any])


def without_commands(cls: W) -> W:
    """A subclass of the RQ worker class ``cls`` that does not subscribe to RQ's command channel."""

    class NoCommands(cls):  # type: ignore[valid-type, misc]
        def subscribe(self) -> None:
            pass

    NoCommands.__name__ = NoCommands.__qualname__ = f"{cls.__name__}WithoutCommands"
    return NoCommands  # type: ignore[return-value]


BurstWorker = without_commands(SimpleWorker)
"""RQ's ``SimpleWorker`` without the command listener (see the module docstring)."""

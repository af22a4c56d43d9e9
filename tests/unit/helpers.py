"""Small builders shared by the unit tests."""

from __future__ import annotations

from typing import Any

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock


def memory() -> tuple[MemoryStorage, MemoryScheduler, VirtualClock]:
    clock = VirtualClock(start=1_000_000.0)
    return MemoryStorage(clock=clock), MemoryScheduler(clock=clock), clock


def run_scripted(script: list[Any], tools: list[Any], job_id: str = "j") -> MemoryStorage:
    """An agent job of ``tools`` whose model answers ``script``, run to its end on the memory adapters."""
    from pipelines import Agent
    from pipelines.testing import ScriptedModel

    storage, scheduler, _ = memory()
    Agent(model=ScriptedModel(script), tools=tools).run(job_id=job_id, messages=["go"], storage=storage,
                                                        scheduler=scheduler)
    scheduler.drain()
    return storage


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing inside catches it."""


def calls() -> dict[str, Any]:
    return {}

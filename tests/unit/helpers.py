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


def child_the_cancel_misses(app: Any, monkeypatch: Any, parent_id: str, **run: Any) -> str:
    """Run ``parent_id``'s first turn (an agent whose call ``c0`` starts a child) with a forced cancel landing while
    it is in flight: the turn is fenced off before its wait commits, so the parent does not list the child, and
    the cancel's walk cannot reach it. Returns the child's id (running)."""
    import phases.children
    from pipelines.engine.children import child_job_id

    real = phases.children.start_child

    def start_then_force_cancel(*args: Any, **kwargs: Any) -> Any:
        child_id = real(*args, **kwargs)
        app.cancel(parent_id, force=True)  # an operator's forced cancel lands while the turn is in flight
        return child_id

    monkeypatch.setattr(phases.children, "start_child", start_then_force_cancel)
    app.run_agent("boss", job_id=parent_id, **run)
    assert app.advance(parent_id).value == "stale"
    monkeypatch.setattr(phases.children, "start_child", real)
    kid = child_job_id(parent_id, "c0")
    assert app.storage.get_job(parent_id).children == [] and app.storage.get_job(kid).status.value == "running"
    return kid

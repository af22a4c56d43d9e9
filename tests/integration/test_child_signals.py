"""One answer that starts a child run and has another call raise a signal: which one the turn ends with.

The rule is ``phases.tool_runner.execute._signal_of_turn``'s: FailJob, then RetryLater, then a wait for a
person, then the waits for children. Run on memory and on a real redis-server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.redis import RedisStorage
from pipelines import Agent, App, FailJob, JobStatus, RetryLater, WaitForInput, tool
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply

START = 1_000_000.0


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStorage()
        return
    s = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix=f"cs{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


class Family:
    """A parent agent whose first answer calls ``helper`` (a child agent) and ``other`` in the order given."""

    def __init__(self, storage: Any, other: Any, *, child_first: bool = True) -> None:
        self.helper_asked: list[str] = []
        self.clock = VirtualClock(start=START)

        def helper_script(messages: list[Message]) -> str:
            self.helper_asked.append(str(messages[-1]["content"]))
            return "helped"

        helper = Agent(name="helper", model=ScriptedModel(helper_script))
        calls = [call("helper", input="x"), call(other.name)]

        def script(messages: list[Message]) -> Any:
            if messages[-1]["role"] == "tool":
                return "parent: " + " | ".join(str(m["content"]) for m in messages if m["role"] == "tool")
            return reply(None, *(calls if child_first else calls[::-1]))

        parent = Agent(name="boss", model=ScriptedModel(script), tools=[helper.as_tool(description="Help."), other])
        self.app = App(storage=storage, scheduler=MemoryScheduler(clock=self.clock), agents=[parent],
                       provenance=False)
        self.app.run_agent("boss", job_id="P", messages=["hi"])

    def children(self) -> dict[str, JobStatus]:
        return {v.job_id: v.status for v in self.app.jobs() if v.job_id != "P"}


@pytest.mark.parametrize("child_first", [True, False], ids=["child-first", "child-last"])
def test_a_tool_that_fails_the_job_runs_once_and_a_retry_finds_the_child_of_that_turn(storage: Any,
                                                                                       child_first: bool) -> None:
    runs: list[str] = []

    @tool
    def give_up() -> str:
        """Close the case and fail the job."""
        runs.append("closed")  # an effect outside the job: a second run closes the case twice
        raise FailJob("the case is closed")

    family = Family(storage, give_up, child_first=child_first)
    family.app.drain()
    parent = family.app.get("P")
    assert parent.status is JobStatus.ERROR and "the case is closed" in str(parent.record.error)
    assert runs == ["closed"]
    # A failed parent may be retried, and its turn run again adopts the child: the child runs to its end
    # (cancelling it would hand the retried turn "child was cancelled"), once.
    assert list(family.children().values()) == [JobStatus.COMPLETE] and family.helper_asked == ["x"]
    family.app.retry("P")
    family.app.drain()
    assert runs == ["closed", "closed"]  # the retried turn runs its FailJob again (as any retried failing call)
    assert family.helper_asked == ["x"]  # the child is found again by its id, not started twice


def test_a_tool_that_retries_later_runs_again_after_its_delay_not_when_the_child_ends(storage: Any) -> None:
    runs: list[float] = []

    @tool
    def rate_limited() -> str:
        """Call a rate-limited service."""
        runs.append(family.clock())
        if len(runs) == 1:
            raise RetryLater(60.0, "rate limited")
        return "served"

    family = Family(storage, rate_limited)
    family.app.drain()
    view = family.app.get("P")
    assert view.status is JobStatus.COMPLETE
    assert view.result == "parent: helped | served"
    assert runs[1] - runs[0] >= 60.0  # the wait for the child did not cut the delay short
    assert family.helper_asked == ["x"]  # found again by its id on the retry, never started twice


def test_a_question_for_a_person_is_asked_at_once_while_the_child_runs(storage: Any) -> None:
    runs: list[str] = []

    @tool
    def ask_person() -> str:
        """Ask the operator."""
        runs.append("asked")
        raise WaitForInput("which account?", details={"kind": "question"})

    family = Family(storage, ask_person)
    family.app.drain()
    view = family.app.get("P")
    assert view.status is JobStatus.WAITING
    assert (view.record.waiting or {}).get("kind") == "question"  # not the wait for the child
    assert runs == ["asked"]
    assert list(family.children().values()) == [JobStatus.COMPLETE]

"""Conversation titles: a title agent names a new conversation once, as a child job, never failing it."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.redis import RedisStorage
from phases.titles import title_job_id
from pipelines import Agent, App, JobStatus
from pipelines.testing import ScriptedModel
from tests.unit.helpers import memory


class Title(BaseModel):
    title: str


def build(storage: Any, scheduler: Any, namer_model: Any) -> App:
    namer = Agent(name="namer", model=namer_model, output_schema=Title, stream=False)
    chat = Agent(name="chat", model=ScriptedModel(lambda msgs: f"answer to {msgs[-1]['content']}"),
                 title_agent=namer)
    return App(storage=storage, scheduler=scheduler, agents=[chat, namer])


@pytest.fixture(params=["memory", "redis"])
def adapters(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    if request.param == "memory":
        storage, scheduler, _ = memory()
        yield storage, scheduler
        return
    store = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix="titles")
    yield store, MemoryScheduler()
    store.close()


def test_a_new_conversation_is_named_once_and_follow_ups_keep_the_title(adapters: tuple[Any, Any]) -> None:
    namer_model = ScriptedModel(lambda msgs: '{"title": "Where my parcel is"}')
    app = build(*adapters, namer_model)
    app.run_agent("chat", job_id="t1", messages=["where is my parcel?"]).wait(timeout=5)
    app.drain()  # the title job runs as its own job
    view = app.get("t1")
    assert view is not None and view.status is JobStatus.COMPLETE and view.title == "Where my parcel is"
    asked = namer_model.calls[0].messages[-1]["content"]
    assert "where is my parcel?" in asked and "answer to where is my parcel?" in asked
    app.run_agent("chat", job_id="t1", messages=["and when?"]).wait(timeout=5)
    app.drain()
    assert len(namer_model.calls) == 1 and app.get("t1").title == "Where my parcel is"  # named once


def test_a_follow_up_run_before_the_title_job_ran_keeps_it(adapters: tuple[Any, Any]) -> None:
    # The title job belongs to the conversation, not to the run that started it: a run started before it ran
    # neither stops it nor starts a second one.
    namer_model = ScriptedModel(lambda msgs: '{"title": "Where my parcel is"}')
    app = build(*adapters, namer_model)
    app.run_agent("chat", job_id="t5", messages=["where is my parcel?"])
    assert app.advance("t5").value == "completed"  # its one turn: the title job is started, not run yet
    app.run_agent("chat", job_id="t5", messages=["and when?"])
    app.drain()
    assert app.get("t5").title == "Where my parcel is" and len(namer_model.calls) == 1


def test_a_conversation_made_again_under_a_deleted_ones_id_gets_its_own_title(adapters: tuple[Any, Any]) -> None:
    said = iter(['{"title": "Alice asks about her diagnosis"}', '{"title": "Bob orders a pizza"}'])
    app = build(*adapters, ScriptedModel(lambda msgs: next(said)))
    app.run_agent("chat", job_id="t6", messages=["my diagnosis?"])
    app.drain()
    assert app.get("t6").title == "Alice asks about her diagnosis"
    app.delete("t6")
    app.run_agent("chat", job_id="t6", messages=["a pizza please"])
    app.drain()
    assert app.get("t6").title == "Bob orders a pizza"  # not the deleted conversation's


@pytest.mark.parametrize("title_job", ["queued", "failed"])
def test_a_conversations_title_job_goes_with_it_whatever_its_state(adapters: tuple[Any, Any], title_job: str) -> None:
    # Only a finished one was deleted: one not run yet named the next conversation made under the id with the
    # deleted one's first message; a failed one was adopted and the new conversation never got a title.
    asked: list[str] = []

    def namer(messages: list[Any]) -> Any:
        asked.append(messages[-1]["content"])
        if "diagnosis" in messages[-1]["content"] and title_job == "failed":
            raise RuntimeError("namer down")
        return '{"title": "%s"}' % ("Alice asks about her diagnosis" if "diagnosis" in messages[-1]["content"]
                                    else "Bob orders a pizza")

    app = build(*adapters, ScriptedModel(namer))
    app.run_agent("chat", job_id="t8", messages=["my diagnosis?"])
    assert app.advance("t8").value == "completed"  # the title job is started, not run
    if title_job == "failed":
        app.drain()
        failed = app.get(title_job_id("t8"))
        assert failed is not None and failed.status is JobStatus.ERROR
    app.delete("t8")
    assert app.get(title_job_id("t8")) is None
    app.run_agent("chat", job_id="t8", messages=["a pizza please"])
    app.drain()
    assert app.get("t8").title == "Bob orders a pizza"
    assert "pizza" in asked[-1] and sum("diagnosis" in a for a in asked) == (title_job == "failed")


@pytest.mark.parametrize("conversation", ["running", "paused"])
def test_retention_judges_a_finished_title_job_as_delete_does_while_its_conversation_goes_on(
        adapters: tuple[Any, Any], conversation: str) -> None:
    # Its conversation waits for it by name only (never, it is not a call of a run): app.delete takes it, and
    # retention skipped it as a child its parent still waited for, for as long as the conversation ran or paused.
    app = build(*adapters, ScriptedModel(lambda msgs: '{"title": "A question"}'))
    job = f"t9-{conversation}"
    app.run_agent("chat", job_id=job, messages=["a question?"])
    app.drain()
    title = app.get(title_job_id(job))
    assert title is not None and title.status is JobStatus.COMPLETE
    app.run_agent("chat", job_id=job, messages=["and another?"])  # the conversation goes on: not drained
    if conversation == "paused":
        app.pause(job, wait=0)
    assert app.get(job).status.value == conversation
    app.scheduler.clock.advance(3600)  # type: ignore[attr-defined]
    assert app.gc(older_than=60) == [title_job_id(job)]
    assert app.get(title_job_id(job)) is None and app.get(job).status.value == conversation


def test_a_delete_that_dies_at_the_title_job_leaves_the_conversation_and_deleting_it_again_finishes(
        adapters: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # The title job went after its conversation: a process dying between the two left the title job behind,
    # for ever (nothing names it once its conversation is gone, and without retention nothing deletes it).
    from pipelines.crash_harness import SimulatedCrash

    app = build(*adapters, ScriptedModel(lambda msgs: '{"title": "A question"}'))
    app.run_agent("chat", job_id="t10", messages=["a question?"])
    app.drain()
    storage, title = app.storage, title_job_id("t10")
    real = storage.delete_job

    def dying(job_id: str, **kwargs: Any) -> bool:
        if job_id == title:
            raise SimulatedCrash("the process dies deleting the title job")
        return bool(real(job_id, **kwargs))

    monkeypatch.setattr(storage, "delete_job", dying)
    with pytest.raises(SimulatedCrash):
        app.delete("t10")
    monkeypatch.setattr(storage, "delete_job", real)
    assert app.get("t10") is not None  # the conversation is still there to delete again
    app.delete("t10")
    assert app.get("t10") is None and app.get(title) is None


def test_a_failing_title_agent_never_fails_the_conversation(adapters: tuple[Any, Any]) -> None:
    def broken(messages: list[Any]) -> Any:
        raise RuntimeError("namer down")

    app = build(*adapters, ScriptedModel(broken))
    view = app.run_agent("chat", job_id="t2", messages=["hi"]).wait(timeout=5)
    app.drain()
    assert view.status is JobStatus.COMPLETE and view.result == "answer to hi"
    assert app.get("t2").status is JobStatus.COMPLETE and app.get("t2").title is None


def test_pipelines_status_shows_the_title(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.cli import main
    from tests.apps import titles_app

    monkeypatch.delenv("PIPELINES_APP", raising=False)
    app = titles_app.reset()
    app.run_agent("chat", job_id="t3", messages=["where is my parcel?"]).wait(timeout=5)
    app.drain()
    out = io.StringIO()
    assert main(["status", "t3", "--app", "tests.apps.titles_app:app"], out=out, err=io.StringIO()) == 0
    assert "title:       Where my parcel is" in out.getvalue()


def test_a_title_job_runs_on_a_worker_that_did_not_start_it(adapters: tuple[Any, Any]) -> None:
    # The title agent was registered only when a run started a title job in that process: another worker (an RQ
    # worker, the process after a restart) failed the title job with "unknown pipeline 'namer'" every time.
    storage, scheduler = adapters

    def app_with_only_the_chat_agent(model: Any) -> App:
        namer = Agent(name="namer", model=model, output_schema=Title, stream=False)
        chat = Agent(name="chat", model=ScriptedModel(lambda msgs: "sure"), title_agent=namer)
        return App(storage=storage, scheduler=scheduler, agents=[chat])

    first = app_with_only_the_chat_agent(ScriptedModel(lambda msgs: '{"title": "never asked here"}'))
    first.run_agent("chat", job_id="t9", messages=["hello"])
    first.advance("t9")  # the conversation's run completes and starts its title job
    assert storage.get_job(title_job_id("t9")).status is JobStatus.RUNNING
    other = app_with_only_the_chat_agent(ScriptedModel(lambda msgs: '{"title": "A greeting"}'))
    assert "namer" in other.registry.names
    other.advance(title_job_id("t9"))
    assert other.get("t9").title == "A greeting"


def test_a_title_agent_whose_name_is_taken_is_not_registered_and_the_app_is_built_all_the_same(
        caplog: pytest.LogCaptureFixture) -> None:
    # Registering title agents with their agent refused configurations that built before: two agents with title
    # agents of one name (a factory each), an agent and its title agent both left named "agent"; and a reload
    # with replace=True raised halfway.
    import logging

    storage, scheduler, _ = memory()

    def chat(name: str, namer_name: str = "namer") -> Agent:
        namer = Agent(name=namer_name, model=ScriptedModel(lambda msgs: '{"title": "T"}'), output_schema=Title)
        return Agent(name=name, model=ScriptedModel(lambda msgs: "hi"), title_agent=namer)

    with caplog.at_level(logging.WARNING, logger="pipelines"):
        app = App(storage=storage, scheduler=scheduler, agents=[chat("one"), chat("two")])
        lone = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[chat("agent", namer_name="agent")])
    said = [r.getMessage() for r in caplog.records]
    assert any("agent 'two': its title agent is not registered: the name 'namer' is taken" in m for m in said), said
    assert any("agent 'agent': its title agent is not registered" in m for m in said), said
    assert app.registry.names == ["namer", "one", "two"] and lone.registry.names == ["agent"]
    assert lone.agents["agent"].config.title_agent is not None  # type: ignore[attr-defined]  # the chat agent kept
    app.run_agent("one", job_id="c1", messages=["hello"])
    app.drain()
    assert app.get("c1").title == "T"
    rebuilt = chat("one")
    app.add_agent(rebuilt, replace=True)  # a reload: the new title agent replaces the old one
    assert app.agents["one"] is rebuilt and app.agents["namer"] is rebuilt.config.title_agent  # type: ignore[attr-defined]

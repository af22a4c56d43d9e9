"""Messages sent to a running conversation (app.send): they join at the next turn boundary, in order, once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.redis import RedisStorage
from pipelines import Agent, App, JobStatus, Phase, tool
from pipelines.engine.errors import InvalidInputError, JobConflictError, JobNotFoundError
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import Crash, memory


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def answer(messages: list[dict[str, Any]]) -> Any:
    """Looks up once, then answers the newest user message (deterministic per transcript)."""
    users = [m["content"] for m in messages if m["role"] == "user"]
    if messages[-1]["role"] == "user" and len(users) == 1:
        return reply(None, call("lookup", order="A-1"))
    return f"answered: {users[-1]}"


@pytest.fixture(params=["memory", "redis"])
def app(request: pytest.FixtureRequest) -> Iterator[App]:
    if request.param == "memory":
        storage, scheduler, _ = memory()
        yield App(storage=storage, scheduler=scheduler,
                  agents=[Agent(name="a", model=ScriptedModel(answer), tools=[lookup])])
        return
    redis_url = request.getfixturevalue("redis_url")
    store = RedisStorage.from_url(redis_url, prefix="inbox")
    yield App(storage=store, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=ScriptedModel(answer),
                                                                         tools=[lookup])])
    store.client.close()


def roles_and_texts(app: App, job_id: str) -> list[tuple[str, Any]]:
    return [(m["role"], m.get("content")) for m in app.messages(job_id)]


def test_a_message_sent_between_turns_joins_before_the_next_answer(app: App) -> None:
    app.run_agent("a", job_id="j", messages=["where is A-1?"])
    app.scheduler.run_next()  # type: ignore[attr-defined]  # turn 1: the lookup
    assert app.send("j", ["and A-2?"]).record.inbox == 1
    app.drain()
    assert roles_and_texts(app, "j")[-2:] == [("user", "and A-2?"), ("assistant", "answered: and A-2?")]
    assert app.get("j").record.inbox == 0
    assert [t for r, t in roles_and_texts(app, "j") if r == "user"] == ["where is A-1?", "and A-2?"]


def test_a_message_sent_during_the_last_turn_starts_the_next_run_at_once(app: App) -> None:
    gate, entered = threading.Event(), threading.Event()

    @tool
    def slow(order: str) -> str:
        """Waits for the test."""
        entered.set()
        gate.wait(5)
        return "ok"

    model = ScriptedModel(lambda msgs: "done" if msgs[-1]["role"] in ("tool",) else (
        reply(None, call("slow", order="A")) if len([m for m in msgs if m["role"] == "user"]) == 1
        else f"answered: {msgs[-1]['content']}"))
    app.add_agent(Agent(name="b", model=model, tools=[slow], max_turns=2))
    app.run_agent("b", job_id="k", messages=["go"])
    worker = threading.Thread(target=app.drain)
    worker.start()
    assert entered.wait(5)
    app.send("k", ["one more thing"])  # arrives while the turn that will finish the run is in flight
    gate.set()
    worker.join(5)
    app.drain()
    view = app.get("k")
    assert view.status is JobStatus.COMPLETE and view.record.inbox == 0
    assert roles_and_texts(app, "k")[-2:] == [("user", "one more thing"), ("assistant", "answered: one more thing")]


def test_bad_sends_are_clear_errors(app: App) -> None:
    with pytest.raises(JobNotFoundError):
        app.send("nope", ["hi"])
    app.add_pipeline("p", [Phase("x", lambda ctx: None)])  # type: ignore[arg-type, return-value]
    app.run_pipeline("p", job_id="pl")
    with pytest.raises(InvalidInputError, match="not an agent"):
        app.send("pl", ["hi"])
    app.add_agent(Agent(name="strict", model=ScriptedModel(["x"]), on_new_message="reject"))
    app.run_agent("strict", job_id="s", messages=["hi"])
    with pytest.raises(JobConflictError, match="on_new_message='reject'"):
        app.send("s", ["more"])


def test_a_crash_after_the_inbox_was_taken_takes_the_same_messages_once() -> None:
    crashed: list[bool] = []

    @tool
    def fragile(order: str) -> str:
        """Dies once, after the turn took the inbox and the model answered."""
        if not crashed:
            crashed.append(True)
            raise Crash("worker killed")
        return "ok"

    def script(msgs: list[dict[str, Any]]) -> Any:
        users = [m["content"] for m in msgs if m["role"] == "user"]
        if msgs[-1]["role"] == "user":
            return reply(None, call("fragile", order=str(len(users))))
        return f"answered {len(users)}"

    storage, scheduler, clock = memory()
    app = App(storage=storage, scheduler=scheduler, lease_seconds=5,
              agents=[Agent(name="a", model=ScriptedModel(script), tools=[fragile], max_turns=3)])
    app.run_agent("a", job_id="c", messages=["first"])
    app.send("c", ["second"])  # waiting before turn 1: turn 1 takes it
    with pytest.raises(Crash):
        app.drain()
    app.send("c", ["third"])  # arrives after the crash: must not join the re-run of turn 1
    clock.advance(10)
    app.advance_due()
    app.drain()
    users = [t for r, t in roles_and_texts(app, "c") if r == "user"]
    assert users == ["first", "second", "third"]  # each exactly once, in order
    assert app.get("c").record.inbox == 0
    assert isinstance(storage, MemoryStorage)


def test_a_send_or_publish_re_sent_after_a_lost_reply_applies_once(redis_url: str) -> None:
    """redis-py re-sends a command whose reply was lost: the scripts recognise their own token."""
    from adapters import redis_scripts
    from pipelines.engine.models import Event

    store = RedisStorage.from_url(redis_url, prefix="resend")
    app = App(storage=store, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=ScriptedModel(answer),
                                                                         tools=[lookup])])
    app.run_agent("a", job_id="r", messages=["hi"])
    k = store.keys("r")
    send = store.client.register_script(redis_scripts.SEND)
    assert send(keys=[k.record, k.inbox], args=["tok-1", '{"role": "user", "content": "once"}']) == 1
    assert send(keys=[k.record, k.inbox], args=["tok-1", '{"role": "user", "content": "once"}']) == 1
    assert store.inbox("r", 10) == [{"role": "user", "content": "once"}]
    publish = store.client.register_script(redis_scripts.PUBLISH)
    before = store.client.xlen(k.live)
    line = Event(timestamp=1.0, type="text_delta", turn=1, data={"text": "x"}).model_dump_json()
    publish(keys=[k.record, k.live], args=["p-1", line])
    publish(keys=[k.record, k.live], args=["p-1", line])
    assert store.client.xlen(k.live) == before + 1
    store.client.close()


def test_a_re_sent_send_is_recognised_even_after_another_caller_sent_in_between(redis_url: str) -> None:
    from adapters import redis_scripts

    store = RedisStorage.from_url(redis_url, prefix="resend2")
    app = App(storage=store, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=ScriptedModel(answer),
                                                                         tools=[lookup])])
    app.run_agent("a", job_id="r", messages=["hi"])
    k = store.keys("r")
    send = store.client.register_script(redis_scripts.SEND)
    send(keys=[k.record, k.inbox], args=["tok-a", '{"role": "user", "content": "from A"}'])
    send(keys=[k.record, k.inbox], args=["tok-b", '{"role": "user", "content": "from B"}'])
    send(keys=[k.record, k.inbox], args=["tok-a", '{"role": "user", "content": "from A"}'])  # A's retry
    assert [m["content"] for m in store.inbox("r", 10)] == ["from A", "from B"]
    store.client.close()


def test_a_step_journaled_with_parts_re_sent_after_a_lost_reply_publishes_them_once(redis_url: str) -> None:
    """The journal write that carries the answer's last text: a re-sent call finds its own value journaled."""
    from adapters import redis_scripts
    from pipelines.engine.models import Event

    store = RedisStorage.from_url(redis_url, prefix="resend3")
    app = App(storage=store, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=ScriptedModel(answer),
                                                                         tools=[lookup])])
    app.run_agent("a", job_id="r", messages=["hi"])
    assert store.acquire_lease("r", "w1", 30) is not None
    k = store.keys("r")
    step = store.client.register_script(redis_scripts.RECORD_STEP)
    version = str(app.get("r").record.version)
    line = Event(timestamp=1.0, type="text_delta", turn=1, data={"text": "x"}).model_dump_json()
    before = store.client.xlen(k.live)
    for _ in range(2):  # the call, then redis-py's re-send of it
        assert step(keys=[k.record, k.journal, k.lease, k.live],
                    args=[version, "1", "w1", "model", '{"a":1}', line]) == b"ok"
    assert store.client.xlen(k.live) == before + 1
    # Another value under the key is not a re-send: it is journaled and its parts go out.
    step(keys=[k.record, k.journal, k.lease, k.live], args=[version, "1", "w1", "model", '{"a":2}', line])
    assert store.client.xlen(k.live) == before + 2 and store.client.hget(k.journal, "model") == b'{"a":2}'
    store.client.close()

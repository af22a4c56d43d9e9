"""A commit sends a message the journal already holds (the model's answer) as a reference, on a real Redis.

The commit script cuts the message out of the journaled value and checks it;
whenever the journal does not hold it (changed or deleted behind the
adapter's back), nothing is written and the adapter sends it whole. The
live-stream parts sent with a journal write have the text they share with the
journaled value cut out, and the step script puts them back together.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from adapters.redis.compact import EVENT_RUNS, narrow, widen
from adapters.redis.scripts import COMMIT_ARGS
from pipelines import Agent, App, tool
from pipelines.crash_harness import SimulatedCrash
from pipelines.testing import ScriptedModel, call, reply
from tests.redis_spy import spy_commands

pytestmark = pytest.mark.redis

# Long enough to be sent by reference; non-ASCII, so offsets must count bytes, not characters.
TEXT = "Thinking it over - naïve arithmetic is risky, so I ask the adder tool for the next value. Étape {n}."
crash_next = {"on": False}


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    if crash_next["on"]:
        crash_next["on"] = False
        raise SimulatedCrash("killed while the tool ran")
    return {"sum": a + b}


def _answer(msgs: list[dict[str, Any]]) -> Any:
    done = sum(1 for m in msgs if m["role"] == "assistant")
    return "done" if done >= 3 else reply(TEXT.format(n=done), call("add", a=done, b=1))


def _app(storage: RedisStorage) -> App:
    return App(storage=storage, scheduler=MemoryScheduler(),
               agents=[Agent(name="a", model=ScriptedModel(_answer), tools=[add], max_turns=10)])


class Commits:
    """The message arguments of every COMMIT script call the storage sends."""

    def __init__(self, storage: RedisStorage) -> None:
        self.sent: list[list[str]] = []
        # By FCALL (adapters.redis.library), or by EVALSHA where the server has no functions.
        names = (storage.scripts.commit.name, storage.scripts.commit.sha)

        def spy(send: Any, *args: Any) -> Any:
            got = send(*args)  # a first call answered "not found" raises: not counted
            if len(args) > 1 and str(args[0]).upper() in ("FCALL", "EVALSHA") and args[1] in names:
                argv = [a.decode() if isinstance(a, bytes) else str(a) for a in args[3 + int(args[2]):]]
                n, first = int(argv[COMMIT_ARGS.n_messages]), COMMIT_ARGS.fixed
                self.sent.append(argv[first:first + n])
            return got

        spy_commands(storage, spy)


@pytest.fixture
def storage(redis_url: str) -> Iterator[RedisStorage]:
    s = RedisStorage.from_url(redis_url, prefix="refs")
    yield s
    s.close()


def _transcript(r: redis.Redis, storage: RedisStorage, job_id: str) -> list[bytes]:
    return list(r.lrange(storage.keys(job_id).messages, 0, -1))


def _expected(redis_url: str, job_id: str, app_of: Any = None, agent: str = "a", ask: str = "count") -> list[bytes]:
    """The transcript of the same job (``app_of``'s agent, asked ``ask``) written with every message sent whole."""
    other = RedisStorage.from_url(redis_url, prefix="whole")
    other.records.steps.refer = lambda job_id, messages: None  # type: ignore[method-assign]
    app = (app_of or _app)(other)
    app.run_agent(agent, job_id=job_id, messages=[ask])
    app.scheduler.drain()  # type: ignore[attr-defined]
    out = list(other.client.lrange(other.keys(job_id).messages, 0, -1))
    other.close()
    return out


def test_the_model_answer_is_sent_once_and_the_transcript_is_the_same(
        storage: RedisStorage, r: redis.Redis, redis_url: str) -> None:
    commits = Commits(storage)
    app = _app(storage)
    app.run_agent("a", job_id="j1", messages=["count"])
    app.scheduler.drain()  # type: ignore[attr-defined]
    assert app.get("j1").status.value == "complete"
    # Each tool turn's assistant message went as a reference; the tool's short answer went whole.
    turns = [m for m in commits.sent if m]
    assert len(turns) == 4
    for msgs in turns[:3]:
        assert msgs[0].startswith("=") and "Thinking" not in msgs[0]
        assert msgs[1].startswith('{"role":"tool"')
    assert turns[3] == ['{"role":"assistant","content":"done"}']  # too short to be worth a reference
    stored = _transcript(r, storage, "j1")
    assert stored == _expected(redis_url, "j1")
    assert "naïve" in stored[1].decode() and "Étape 0" in stored[1].decode()


@pytest.mark.parametrize("tamper", ["changed", "deleted"])
def test_a_journal_that_no_longer_holds_the_message_gets_it_whole(
        storage: RedisStorage, r: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch, tamper: str) -> None:
    commits = Commits(storage)
    app = _app(storage)
    app.run_agent("a", job_id="j2", messages=["count"])
    journal = storage.keys("j2").journal
    real = storage.commit

    def behind_its_back(commit: Any) -> Any:
        if r.hexists(journal, "model"):
            if tamper == "deleted":
                r.delete(journal)
            else:  # the same length, one byte different: only the hash can tell
                value = r.hget(journal, "model") or b""
                r.hset(journal, "model", value.replace(b"Thinking", b"Thinkinh"))
        return real(commit)

    monkeypatch.setattr(storage, "commit", behind_its_back)
    app.scheduler.drain()  # type: ignore[attr-defined]
    assert app.get("j2").status.value == "complete"
    # Every reference was refused (nothing written) and the same commit went again, whole.
    refs = [i for i, msgs in enumerate(commits.sent) if msgs and msgs[0].startswith("=")]
    assert len(refs) == 3
    for i in refs:
        assert commits.sent[i + 1][0].startswith('{"role":"assistant"') and "Thinking" in commits.sent[i + 1][0]
    assert _transcript(r, storage, "j2") == _expected(redis_url, "j2")


@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decode_responses"])
def test_a_recovered_turn_sends_the_answer_it_loaded_from_the_journal_by_reference(
        storage: RedisStorage, r: redis.Redis, redis_url: str, decode: bool) -> None:
    app = _app(storage)
    app.run_agent("a", job_id="j3", messages=["count"])
    crash_next["on"] = True
    with pytest.raises(SimulatedCrash):
        app.scheduler.drain()  # type: ignore[attr-defined]
    assert r.hexists(storage.keys("j3").journal, "model")
    r.delete(storage.keys("j3").lease)  # as if the dead worker's lease expired
    # Another process: nothing remembered but what its load reads.
    fresh = RedisStorage(redis.Redis.from_url(redis_url, decode_responses=decode), prefix="refs")
    commits = Commits(fresh)
    app2 = _app(fresh)
    app2.advance("j3")
    assert commits.sent[0][0].startswith("=") and len(commits.sent) == 1
    # The rest of the job, then the whole transcript against a clean run.
    while app2.get("j3").status.value == "running":
        app2.advance("j3")
    assert _transcript(r, fresh, "j3") == _expected(redis_url, "j3")
    fresh.close()


def test_live_parts_sent_with_a_journal_write_are_stored_as_they_were_built(
        storage: RedisStorage, r: redis.Redis) -> None:
    from adapters.redis.values import _dump_parts
    from pipelines.engine.models import Event

    app = _app(storage)
    app.run_agent("a", job_id="j4", messages=["count"])
    rec = storage.get_job("j4")
    assert rec is not None
    text = TEXT.format(n=7) + ' with "quotes", a \\ and a\nnewline'
    value = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    parts = [Event(timestamp=1.5, type="text_delta", turn=1, phase="turn", data={"attempt": "a1", "text": text}),
             Event(timestamp=1.6, type="text_delta", turn=1, phase="turn",
                   data={"attempt": "a1", "text": "not in the value " * 8}),
             Event(timestamp=1.7, type="attempt_started", turn=1, phase="turn", data={"attempt": "a1"})]
    sent: list[list[str]] = []

    def spy(send: Any, *args: Any) -> Any:
        if len(args) > 1 and args[1] in (storage.scripts.step.name, storage.scripts.step.sha):
            sent.append([a.decode() if isinstance(a, bytes) else str(a) for a in args[3 + int(args[2]) + 5:]])
        return send(*args)

    spy_commands(storage, spy)
    before = r.xlen(storage.keys("j4").live)
    storage.record_step_and_publish("j4", version=rec.version, owner=None, key="model", value=value, parts=parts)
    # The first part's text went as a slice of the value; the others whole. All of them compact (record
    # format 3: adapters.redis.compact), the sliced one around its slice.
    assert sent[-1][0].startswith("=") and "quotes" not in sent[-1][0] and '"turn"' not in sent[-1][0]
    assert sent[-1][1:] == narrow(_dump_parts(parts)[1:], EVENT_RUNS)
    stored = [fields[b"e"].decode() for _, fields in r.xrange(storage.keys("j4").live)][before:]
    assert stored == narrow(_dump_parts(parts), EVENT_RUNS) and [widen(t) for t in stored] == _dump_parts(parts)
    assert [p.data for p in storage.read_live("j4")][-3:] == [p.data for p in parts]


def test_a_slice_the_step_script_cannot_put_back_together_writes_nothing(
        storage: RedisStorage, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    from adapters.redis import writes as redis_adapter
    from pipelines.engine.errors import StorageError
    from pipelines.engine.models import Event

    app = _app(storage)
    app.run_agent("a", job_id="j5", messages=["count"])
    rec = storage.get_job("j5")
    assert rec is not None
    # A slice past the value's end:
    monkeypatch.setattr(redis_adapter, "slice_parts", lambda value, lines, compact: ["=3 1 99999\n[]"])
    part = Event(timestamp=1.5, type="text_delta", turn=1, phase="turn", data={"attempt": "a1", "text": "x"})
    live = r.xlen(storage.keys("j5").live)
    with pytest.raises(StorageError, match="nothing was written"):
        storage.record_step_and_publish("j5", version=rec.version, owner=None, key="model", value={"a": 1},
                                        parts=[part])
    assert not r.hexists(storage.keys("j5").journal, "model") and r.xlen(storage.keys("j5").live) == live


# A tool's long answer: journaled whole (its content), then inside the tool message the commit appends.
LONG = 'Résumé of "step" {n}: ünïcode, a \\ backslash and a\nnewline. ' * 3


@tool
def describe(n: int) -> str:
    """Describe a step at length."""
    return LONG.format(n=n)


def _describing(msgs: list[dict[str, Any]]) -> Any:
    done = sum(1 for m in msgs if m["role"] == "assistant")
    return "done" if done >= 2 else reply(f"step {done}", call("describe", n=done))


def _describe_app(storage: RedisStorage) -> App:
    return App(storage=storage, scheduler=MemoryScheduler(),
               agents=[Agent(name="d", model=ScriptedModel(_describing), tools=[describe], max_turns=10)])


@pytest.mark.parametrize("tamper", [None, "changed", "deleted"])
def test_a_tools_long_answer_is_sent_once_and_whole_when_the_journal_lost_it(
        storage: RedisStorage, r: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch,
        tamper: str | None) -> None:
    commits = Commits(storage)
    app = _describe_app(storage)
    app.run_agent("d", job_id="j6", messages=["describe"])
    journal, real = storage.keys("j6").journal, storage.commit

    def behind_its_back(commit: Any) -> Any:
        for key in r.hkeys(journal):
            if key.startswith(b"tool:") and tamper == "deleted":
                r.hdel(journal, key)
            elif key.startswith(b"tool:") and tamper == "changed":  # the same length: only the hash can tell
                r.hset(journal, key, (r.hget(journal, key) or b"").replace("ü".encode(), "û".encode()))
        return real(commit)

    monkeypatch.setattr(storage, "commit", behind_its_back)
    app.scheduler.drain()  # type: ignore[attr-defined]
    assert app.get("j6").status.value == "complete"
    tool_msgs = [m for msgs in commits.sent for m in msgs if not m.startswith(("=", '{"role":"assistant"'))]
    if tamper is None:
        # Each tool message went as the text around its journaled answer (the answer itself not again).
        assert len(tool_msgs) == 2 and all(m.startswith(">") and "Résumé" not in m for m in tool_msgs)
    else:
        # Refused with nothing written, then sent whole: a reference, then the same message in full.
        refs = [m for m in tool_msgs if m.startswith(">")]
        assert len(refs) == 2 and sum("Résumé" in m for m in tool_msgs) == 2
    stored = _transcript(r, storage, "j6")
    assert stored == _expected(redis_url, "j6", _describe_app, "d", "describe")
    assert [m.decode().count("Résumé of") for m in stored] == [0, 0, 3, 0, 3, 0]


def test_the_commit_script_puts_a_message_back_together_byte_for_byte_whatever_the_step_key(
        r: redis.Redis) -> None:
    # The commit script's resolve() on its own (adapters/redis/scripts/commit.py), against a real server: a key
    # holding spaces, a newline and non-ASCII; a value and text around it holding non-ASCII too.
    from adapters.redis.refs import JournalValues
    from adapters.redis.scripts.commit import _RESOLVE_FN

    key, answer = "tool:càll 1\nx y", '"' + "Résumé ü " * 20 + '"'
    message = '{"role":"tool","tool_call_id":"càll 1","content":' + answer + "}"
    inside = '{"message":' + message + ',"finish_reason":"stop"}'  # a journaled value holding the whole message
    r.hset("refs:j", mapping={key: answer, "model": inside})
    steps = JournalValues()
    steps.remember("j", 1, key, answer)
    around = (steps.refer("j", [message]) or [""])[0]
    steps.remember("j", 1, "model", inside)
    sliced = (steps.refer("j", [message]) or [""])[0]
    assert around.startswith(">") and sliced.startswith("=")
    resolve = _RESOLVE_FN + "\nreturn resolve(KEYS[1], 1, #ARGV) or 'rebase'"
    assert r.eval(resolve, 1, "refs:j", around, sliced, "{}") == [message.encode(), message.encode(), b"{}"]
    # A value that changed (same length) or is gone: nothing resolves.
    r.hset("refs:j", key, answer.replace("ü", "û"))
    assert r.eval(resolve, 1, "refs:j", around) == b"rebase"
    r.hdel("refs:j", key)
    assert r.eval(resolve, 1, "refs:j", around) == b"rebase"

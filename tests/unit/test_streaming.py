"""The live stream of a job: text as it arrives, attempts, resuming from a cursor (memory adapters)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pipelines import Agent, App, tool
from pipelines.engine.errors import InvalidInputError, JobNotFoundError
from pipelines.streams import turn_texts
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import Crash, memory

LONG = "The order A-1 shipped yesterday with DHL; it should arrive within two to three working days. " * 12


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def start(*turns: Any, **agent: Any) -> App:
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler,
              agents=[Agent(name="a", model=ScriptedModel(list(turns)), tools=[lookup], **agent)])
    app.run_agent("a", job_id="j", messages=["where is A-1?"])
    return app


def assistant_texts(app: App) -> dict[int, str]:
    msgs = [m for m in app.messages("j") if m["role"] == "assistant"]
    return {i + 1: m.get("content") or "" for i, m in enumerate(msgs)}


def test_every_turns_deltas_add_up_to_its_committed_text_and_the_stream_ends_with_the_job() -> None:
    app = start(reply("Let me look.", call("lookup", order="A-1")), LONG)
    app.drain()
    parts = list(app.stream("j"))
    types = [p.type for p in parts]
    assert types[0] == "job_started" and types[-1] == "job_finished"
    assert types.count("attempt_started") == 2 and types.count("turn_committed") == 2
    assert sum(1 for t in types if t == "text_delta") > 2  # batched, but more than one piece for the long text
    assert turn_texts(parts) == assistant_texts(app)
    # Nothing of a turn follows its turn_committed.
    for turn in (1, 2):
        committed = next(i for i, p in enumerate(parts) if p.type == "turn_committed" and p.turn == turn)
        assert not [p for p in parts[committed:] if p.type == "text_delta" and p.turn == turn]


def test_a_client_resuming_from_its_last_cursor_misses_nothing_and_sees_nothing_twice() -> None:
    app = start(reply("Let me look.", call("lookup", order="A-1")), LONG)
    app.drain()
    everything = list(app.stream("j"))
    for cut in (1, 5, len(everything) // 2, len(everything) - 1):
        rest = list(app.stream("j", after=everything[cut - 1].id))
        assert [p.id for p in everything[:cut] + rest] == [p.id for p in everything]


def test_a_follower_sees_text_before_the_turn_commits_and_stops_when_the_job_ends() -> None:
    gate = threading.Event()
    seen: list[str] = []

    class Slow(ScriptedModel):
        def complete(self, request: Any) -> Any:
            response = super().complete(request)
            gate.wait(5)  # the text was streamed; the answer is not back yet
            return response

    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=Slow([LONG]))])
    app.run_agent("a", job_id="j", messages=["hi"])
    worker = threading.Thread(target=app.drain)
    worker.start()
    for part in app.stream("j", timeout=10):
        seen.append(part.type)
        if part.type == "text_delta" and not gate.is_set():
            # The first text arrives while the model call is still going: nothing committed yet.
            assert app.get("j").status.value == "running" and app.messages("j")[-1]["role"] == "user"
            gate.set()
    worker.join(5)
    assert "text_delta" in seen and seen[-1] == "job_finished"


def test_after_a_crash_the_new_attempt_supersedes_the_abandoned_text() -> None:
    crashed: list[bool] = []

    @tool
    def flaky(order: str) -> str:
        """Dies once, after the model's answer was streamed and journaled."""
        if not crashed:
            crashed.append(True)
            raise Crash("worker killed")
        return "ok"

    storage, scheduler, clock = memory()
    app = App(storage=storage, scheduler=scheduler, lease_seconds=5, agents=[Agent(
        name="a", model=ScriptedModel([reply(LONG, call("flaky", order="A-1")), "done"]), tools=[flaky])])
    app.run_agent("a", job_id="j", messages=["go"])
    with pytest.raises(Crash):
        app.drain()
    clock.advance(10)  # the dead worker's lease runs out; the sweep runs the turn again
    app.advance_due()
    app.drain()
    parts = list(app.stream("j"))
    starts = [p for p in parts if p.type == "attempt_started" and p.turn == 1]
    assert len(starts) == 2 and starts[0].data["attempt"] != starts[1].data["attempt"]
    assert turn_texts(parts) == assistant_texts(app)


def test_stream_false_publishes_no_text_and_bad_cursors_and_unknown_jobs_are_clear_errors() -> None:
    app = start("hello there", stream=False)
    app.drain()
    assert [p.type for p in app.stream("j")] == ["job_started", "turn_started", "model_response",
                                                  "turn_committed", "job_finished"]
    with pytest.raises(InvalidInputError, match="cursor"):
        list(app.stream("j", after="not-a-cursor"))
    with pytest.raises(JobNotFoundError):
        list(app.stream("nope"))


def test_a_retried_provider_stream_starts_a_new_attempt_and_the_broken_text_is_dropped() -> None:
    from phases.model import ModelRequest, ModelResponse
    from pipelines.engine.models import Usage

    class BreaksOnce:
        def complete(self, request: ModelRequest) -> ModelResponse:
            assert request.on_delta is not None and request.on_restart is not None and request.stream_retries == 2
            request.on_delta(LONG[:1050])  # published (over FLUSH_CHARS), then the provider's stream breaks ...
            request.on_restart()  # ... and the model tries again as the same call
            request.on_delta(LONG)
            return ModelResponse(message={"role": "assistant", "content": LONG}, finish_reason="stop",
                                 usage=Usage(model_calls=2))

    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler,
              agents=[Agent(name="a", model=BreaksOnce(), stream_retries=2, max_turns=3)])
    app.run_agent("a", job_id="j", messages=["hi"])
    app.drain()
    parts = list(app.stream("j"))
    assert len({p.data["attempt"] for p in parts if p.type == "attempt_started"}) == 2
    assert turn_texts(parts) == {1: LONG} == assistant_texts(app)


def test_batches_reach_the_stream_in_the_order_they_were_taken_whatever_thread_flushes() -> None:
    import random
    import time as _time

    from phases.streaming import DeltaSink

    class SlowCtx:
        attempt_id = "a1"

        def __init__(self) -> None:
            self.published: list[str] = []

        def part(self, type_: str, *, turn: int | None = None, **data: Any) -> Any:
            return (type_, data.get("text", ""))

        def publish_parts(self, parts: list[Any]) -> None:
            _time.sleep(random.random() / 500)  # a slow round trip, while the timer or the model flushes again
            self.published.extend(text for kind, text in parts if kind == "text_delta")

    ctx = SlowCtx()
    sink = DeltaSink(ctx, 1, flush_seconds=0.0005, flush_chars=7)  # type: ignore[arg-type]
    text = "".join(f"{i:04d}|" for i in range(400))
    for i in range(0, len(text), 3):
        sink(text[i : i + 3])
        if i % 30 == 0:
            _time.sleep(0.001)  # let the trailing timer fire between pieces
    sink.finish(text)
    assert "".join(ctx.published) == text


class _TextCtx:
    """A phase context for a DeltaSink alone: records the published text; ``sent`` is set once it reads ``until``."""

    attempt_id = "a1"
    job_id = "j"

    def __init__(self, until: str | None = None) -> None:
        self.published: list[str] = []
        self.sent = threading.Event()
        self.until = until

    def part(self, type_: str, *, turn: int | None = None, **data: Any) -> Any:
        return (type_, data.get("text", ""))

    def publish_parts(self, parts: list[Any]) -> None:
        self.published.extend(text for kind, text in parts if kind == "text_delta")
        if self.until is None or "".join(self.published) == self.until:
            self.sent.set()


def test_text_held_back_in_a_window_goes_out_when_the_window_ends_without_another_piece() -> None:
    from phases.streaming import DeltaSink

    ctx = _TextCtx(until="ab")
    published, sent = ctx.published, ctx.sent
    sink = DeltaSink(ctx, 1, flush_seconds=0.02, first_flush_seconds=0)  # type: ignore[arg-type]
    sink("a")  # the first text goes out at once (no first window)
    sink("b")  # inside the window: held back, and no further piece comes (a slow stream)
    assert published == ["a"]
    assert sent.wait(5), "held-back text was never published"
    sink.finish("ab")
    assert "".join(published) == "ab"


def test_turns_start_no_thread_each_and_a_model_that_does_not_stream_starts_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from phases import streaming
    from phases.model import ModelRequest, ModelResponse

    started: list[str] = []
    real_start = streaming.start_daemon

    def counting_start(target: Any, name: str) -> Any:
        started.append(name)
        return real_start(target, name)

    monkeypatch.setattr(streaming, "start_daemon", counting_start)
    monkeypatch.setattr(streaming, "_FLUSHER", None)  # as in a fresh process

    class Plain:
        def complete(self, request: ModelRequest) -> ModelResponse:
            return ModelResponse(message={"role": "assistant", "content": LONG}, finish_reason="stop")

    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="plain", model=Plain())])
    for j in range(5):
        app.run_agent("plain", job_id=f"p{j}", messages=["hi"])
    app.drain()
    assert started == [] and streaming._FLUSHER is None
    assert turn_texts(list(app.stream("p0"))) == {1: LONG}  # sent whole, once

    turns = [reply(LONG, call("lookup", order=str(i))) for i in range(20)] + ["done"]
    app = App(storage=storage, scheduler=scheduler,
              agents=[Agent(name="a", model=ScriptedModel(turns), tools=[lookup], max_turns=30)])
    app.run_agent("a", job_id="j", messages=["go"])
    app.drain()
    # 21 streamed turns: at most the one flusher thread of the process was started.
    assert started in ([], ["phaserunner-delta-flusher"])
    assert turn_texts(list(app.stream("j"))) == assistant_texts(app)


def test_the_flusher_is_woken_once_for_turns_whose_deadlines_come_after_the_one_it_waits_for() -> None:
    from phases import streaming

    flusher = streaming._Flusher()
    flusher._thread = streaming.Daemon()  # taken as running, but no thread takes the lock: no race
    notified: list[int] = []
    real_notify = flusher._cond.notify

    def counting_notify(n: int = 1) -> None:
        notified.append(n)
        real_notify(n)

    flusher._cond.notify = counting_notify  # type: ignore[method-assign]
    a, b, c = (streaming.DeltaSink(_TextCtx(until="x"), 1) for _ in range(3))  # type: ignore[arg-type]
    flusher.schedule(a, 10.0)  # the thread waits for no work: woken
    flusher.schedule(b, 10.5)  # later than the wake-up it was given: not woken again before it runs
    assert len(notified) == 1
    flusher.schedule(c, 9.0)  # earlier: woken, or it would sleep past c's deadline
    assert len(notified) == 2 and flusher._wake_at == 9.0


def test_turns_that_stream_one_after_another_do_not_wake_the_flusher_each() -> None:
    # Each turn schedules its sink one first window ahead and cancels it when its answer is complete,
    # long before: the thread, looking once a window while turns stream, never has to be woken.
    from phases import streaming

    flusher = streaming._Flusher()
    flusher._thread = streaming.Daemon()  # taken as running; the test plays the thread's looks itself
    notified: list[int] = []
    flusher._cond.notify = lambda n=1: notified.append(n)  # type: ignore[method-assign]
    window = streaming.FIRST_FLUSH_SECONDS
    looks = 0.0
    for turn in range(100):
        now = turn * window / 4  # four turns a window
        while looks + window <= now:  # the thread's wake-ups so far
            looks += window
            with flusher._cond:
                flusher._next_look(looks)
        sink = streaming.DeltaSink(_TextCtx(until="x"), 1)  # type: ignore[arg-type]
        flusher.schedule(sink, now + window)
        flusher.cancel(sink)
    assert len(notified) == 1  # the first turn, when the thread waited for no work
    with flusher._cond:
        assert flusher._next_look(looks + window) is not None  # still streaming: it looks again
        assert flusher._next_look(looks + 2 * window) is None  # a window without a turn: it waits to be woken


def test_a_flusher_loop_that_ended_is_started_again_by_the_next_schedule() -> None:
    from phases import streaming

    flusher = streaming._Flusher()
    flushed = threading.Event()

    class Killer:
        def flush_held(self) -> None:
            raise SystemExit  # what no `except Exception` stops: the loop ends with it

    class Sink:
        def flush_held(self) -> None:
            flushed.set()

    flusher.schedule(Killer(), 0.0)  # type: ignore[arg-type]
    first = flusher._thread
    assert first is not None
    deadline = time.monotonic() + 5
    while first.alive and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not first.alive
    flusher.schedule(Sink(), 0.0)  # type: ignore[arg-type]
    assert flusher._thread is not first
    assert flushed.wait(5), "no loop flushed the next sink"


def test_held_back_text_the_flusher_could_not_publish_fails_the_attempt_and_the_retry_sends_it_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from adapters.memory import MemoryStorage
    from phases import streaming

    monkeypatch.setattr(streaming, "FIRST_FLUSH_SECONDS", 0.0)  # "a" goes out at once, "b" is held back
    from phases.model import ModelRequest, ModelResponse
    from pipelines.engine.errors import StorageUnavailableError

    held_out = threading.Event()
    calls: list[int] = []

    class Outage(MemoryStorage):
        failures = 1

        def publish(self, job_id: str, parts: Any) -> None:
            # The flusher thread's publish of the held-back "b" meets a storage outage.
            if threading.current_thread().name == "phaserunner-delta-flusher" and self.failures:
                self.failures -= 1
                held_out.set()
                raise StorageUnavailableError("redis is restarting")
            super().publish(job_id, parts)

    class Slow:
        def complete(self, request: ModelRequest) -> ModelResponse:
            calls.append(1)
            assert request.on_delta is not None
            request.on_delta("a")  # goes out at once
            request.on_delta("b")  # held back; no more text comes for a while
            assert held_out.wait(5)
            request.on_delta("c")
            return ModelResponse(message={"role": "assistant", "content": "abc"}, finish_reason="stop")

    _, scheduler, clock = memory()
    storage = Outage(clock=clock)
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=Slow())])
    app.run_agent("a", job_id="j", messages=["hi"])
    app.drain()  # the attempt whose stream lacks "b" does not commit; the turn runs again (RetryLater)
    assert app.get("j").status.value == "complete" and len(calls) == 1  # the journaled answer was reused (I5)
    parts = list(app.stream("j"))
    assert [p.type for p in parts if p.type in ("attempt_started", "turn_committed")] == [
        "attempt_started", "attempt_started", "turn_committed"]
    assert turn_texts(parts) == {1: "abc"} == assistant_texts(app)


def test_the_first_text_waits_the_first_window_and_goes_out_without_another_piece() -> None:
    from phases.streaming import DeltaSink

    ctx = _TextCtx()
    published, sent = ctx.published, ctx.sent
    sink = DeltaSink(ctx, 1, first_flush_seconds=0.02)  # type: ignore[arg-type]
    sink("a")
    assert published == []  # held for the first window ...
    assert sent.wait(5), "the first text was never published"
    assert published == ["a"]  # ... and sent when it ended, with no further piece
    assert sink.final_parts("ab") and sink.sent == "ab"
    sink.finish("ab")  # nothing left to send
    assert published == ["a"]


class _Counting:
    """Counts the storage writes a turn's text takes (memory adapters)."""

    def __init__(self) -> None:
        from adapters.memory import MemoryStorage

        counts = self.counts = {"publish": 0, "with_step": 0}

        class Storage(MemoryStorage):
            def publish(self, job_id: str, parts: Any) -> None:
                counts["publish"] += 1
                super().publish(job_id, parts)

            def record_step_and_publish(self, job_id: str, **kw: Any) -> None:
                counts["with_step"] += 1
                counts["publish"] -= 1  # MemoryStorage publishes through publish(): counted here instead
                super().record_step_and_publish(job_id, **kw)

        self.storage_class = Storage


def test_an_answer_complete_within_the_first_window_goes_out_with_its_journal_write() -> None:
    counting = _Counting()
    _, scheduler, clock = memory()
    storage = counting.storage_class(clock=clock)
    app = App(storage=storage, scheduler=scheduler,
              agents=[Agent(name="a", model=ScriptedModel([reply("Let me look.", call("lookup", order="A-1")), LONG]),
                            tools=[lookup])])
    app.run_agent("a", job_id="j", messages=["where is A-1?"])
    app.drain()
    # Turn 1's short text: no publish of its own, it rides with the answer's journal write. Turn 2's
    # long text passes the batch size on the way (published as it streams), its tail rides along.
    assert counting.counts["with_step"] == 2
    parts = list(app.stream("j"))
    assert turn_texts(parts) == assistant_texts(app)
    starts = [p for p in parts if p.type == "attempt_started"]
    assert [p.turn for p in starts] == [1, 2]


def test_a_storage_without_the_capability_gets_the_journal_write_then_the_publish() -> None:
    from adapters.base import Feature, StepPublisher
    from adapters.memory import MemoryStorage

    calls: list[str] = []

    class Plain:
        """Delegates everything to a MemoryStorage but record_step_and_publish (an older storage)."""

        # A wrapper declares what it does: everything its inner storage does but the one write.
        features = MemoryStorage.features - {Feature.STEP_AND_PUBLISH}

        def __init__(self, inner: MemoryStorage) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "record_step_and_publish":
                raise AttributeError(name)
            return getattr(self._inner, name)

        def record_step(self, job_id: str, **kw: Any) -> None:
            calls.append(f"step:{kw['key']}")
            self._inner.record_step(job_id, **kw)

        def publish(self, job_id: str, parts: Any) -> None:
            calls.append("publish")
            self._inner.publish(job_id, parts)

    _, scheduler, clock = memory()
    inner = MemoryStorage(clock=clock)
    storage = Plain(inner)
    assert not isinstance(storage, StepPublisher)
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=ScriptedModel(["hello"]))])  # type: ignore[arg-type]
    app.run_agent("a", job_id="j", messages=["hi"])
    app.drain()
    assert calls[calls.index("step:model") + 1] == "publish"
    assert turn_texts(list(app.stream("j"))) == {1: "hello"} == assistant_texts(app)


def test_pieces_appended_while_another_thread_sends_batches_all_go_out_once_and_in_order() -> None:
    # The model's thread appends without the sink's lock; batches taken meanwhile (here by a thread
    # flushing in a loop, as the flusher does when a window ends) must neither lose nor repeat a piece.
    from phases.streaming import DeltaSink

    ctx = _TextCtx()
    sink = DeltaSink(ctx, 1, flush_seconds=60, first_flush_seconds=60, flush_chars=10**9)  # type: ignore[arg-type]
    pieces = [f"<{i}>" for i in range(20_000)]
    done = threading.Event()

    def flush_while_appending() -> None:
        while not done.is_set():
            sink.flush()

    flusher = threading.Thread(target=flush_while_appending)
    flusher.start()
    try:
        for piece in pieces:
            sink(piece)
    finally:
        done.set()
        flusher.join()
    sink.finish("".join(pieces))
    assert "".join(ctx.published) == "".join(pieces)


def test_a_stream_nothing_drains_says_so_once_instead_of_waiting_in_silence(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import pipelines.streams as streams

    monkeypatch.setattr(streams, "_WAIT", 0.05)  # one blocking read: 50 ms
    app = start("hello")  # its first turn is scheduled; nothing drains the memory scheduler
    with caplog.at_level("WARNING", logger="pipelines"):
        parts = list(app.stream("j", timeout=0.5))
    assert [p.type for p in parts] == ["job_started"]
    warned = [r.getMessage() for r in caplog.records if "runs them only when drained" in r.getMessage()]
    assert len(warned) == 1 and "app.drain()" in warned[0]
    app.drain()  # drained, the same stream call reads to the end without a word
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipelines"):
        assert [p.type for p in app.stream("j")][-1] == "job_finished"
    assert not [r for r in caplog.records if "runs them only when drained" in r.getMessage()]


def test_a_turn_that_took_a_sent_message_names_the_answer_it_committed_too() -> None:
    # The span left out the messages the turn took from the inbox, so it named the sent message and not the
    # answer: a reader of the stream (the AI SDK encoder) showed that turn without its text.
    holder: dict[str, App] = {}

    def answer(msgs: list[Any]) -> Any:
        if msgs[-1]["role"] == "user" and msgs[-1]["content"] == "where is A-1?":
            holder["app"].send("j", ["and A-2?"])  # while the turn that calls the tool runs
            return reply("Let me look.", call("lookup", order="A-1"))
        return "A-1 shipped; A-2 is being packed."

    storage, scheduler, _ = memory()
    app = holder["app"] = App(storage=storage, scheduler=scheduler,
                              agents=[Agent(name="a", model=ScriptedModel(answer), tools=[lookup])])
    app.run_agent("a", job_id="j", messages=["where is A-1?"])
    app.drain()
    msgs = app.messages("j")
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "user", "assistant"]
    spans = [p.data["messages"] for p in app.stream("j", follow=False) if p.type == "turn_committed"]
    assert spans == [[1, 3], [3, 5]]  # the second: the message it took, then its answer


def test_a_turn_that_compacted_and_took_a_sent_message_names_every_message_it_appended() -> None:
    # A turn appends what it took from the inbox, a compaction's note and its own messages: the span named
    # the first two only, so the AI SDK encoder showed that turn without its answer.
    from phases.compaction import MARKER_KEY, Compaction

    holder: dict[str, App] = {}

    def model(msgs: list[Any]) -> Any:
        last = msgs[-1]
        if last["role"] == "user" and last["content"] == "where is A-1?":
            holder["app"].send("j", ["and A-2?"])
            return reply("Checking " + "z" * 400, call("lookup", order="A-1"))
        if len(msgs) <= 2 and "ummar" in str(msgs[0].get("content", "")) + str(last.get("content", "")):
            return "SUMMARY"
        return "FINAL ANSWER"

    storage, scheduler, _ = memory()
    app = holder["app"] = App(storage=storage, scheduler=scheduler, agents=[Agent(
        name="a", model=ScriptedModel(model), tools=[lookup], compaction=Compaction(max_tokens=80, keep_recent=2),
        stream=False)])
    app.run_agent("a", job_id="j", messages=["hello"])
    app.drain()
    app.run_agent("a", job_id="j", user="where is A-1?")
    app.drain()
    msgs = app.messages("j")
    last = [p.data["messages"] for p in app.stream("j", follow=False) if p.type == "turn_committed"][-1]
    assert any(MARKER_KEY in m for m in msgs[last[0]:last[1]])  # this turn compacted...
    assert [m.get("content") for m in msgs[last[0]:last[1]] if m["role"] == "user" and MARKER_KEY not in m] == [
        "and A-2?"]  # ...took the sent message...
    assert last[1] == len(msgs) and msgs[-1]["content"] == "FINAL ANSWER"  # ...and its answer is in its span

"""The AI SDK encoder, part by part: attempts of a turn never duplicate text in the assembled message."""

from __future__ import annotations

import json
from typing import Any

from pipelines.engine.models import Event
from pipelines.web.aisdk import UIMessageEncoder

COMMITTED = [{"role": "assistant", "content": "Hello there, friend."}]


def part(i: int, kind: str, turn: int | None = None, **data: Any) -> Event:
    return Event(id=str(i), timestamp=0.0, type=kind, turn=turn, data=data)


def encode(parts: list[Event]) -> list[dict[str, Any]]:
    encoder = UIMessageEncoder("j", lambda a, b: COMMITTED[a - 1:b - 1])
    return [c for p in parts for c in encoder.feed(p)]


def texts_after_last_start(chunks: list[dict[str, Any]]) -> str:
    last = max(i for i, c in enumerate(chunks) if c["type"] == "start")
    return "".join(c["delta"] for c in chunks[last:] if c["type"] == "text-delta")


def test_a_new_attempt_repeating_the_shown_text_adds_only_what_goes_further() -> None:
    chunks = encode([part(1, "job_started"), part(2, "attempt_started", 1, attempt="a"),
                     part(3, "text_delta", 1, attempt="a", text="Hello th"),
                     part(4, "attempt_started", 1, attempt="b"),  # the turn runs again after a crash
                     part(5, "text_delta", 1, attempt="b", text="Hello there, friend."),
                     part(6, "turn_committed", 1, messages=[1, 2]), part(7, "job_finished")])
    assert [c["type"] for c in chunks].count("start") == 1
    assert "".join(c["delta"] for c in chunks if c["type"] == "text-delta") == "Hello there, friend."
    assert [c["type"] for c in chunks][-3:] == ["text-end", "finish-step", "finish"]


def test_an_attempt_saying_something_else_sends_the_message_again_under_a_new_id() -> None:
    chunks = encode([part(1, "job_started"), part(2, "attempt_started", 1, attempt="a"),
                     part(3, "text_delta", 1, attempt="a", text="Goodbye"),
                     part(4, "attempt_started", 1, attempt="b"),
                     part(5, "text_delta", 1, attempt="b", text="Hello there, "),
                     part(6, "text_delta", 1, attempt="a", text=" (a late piece of the old attempt)"),
                     part(7, "text_delta", 1, attempt="b", text="friend."),
                     part(8, "turn_committed", 1, messages=[1, 2]), part(9, "job_finished")])
    starts = [c for c in chunks if c["type"] == "start"]
    assert len(starts) == 2 and starts[0]["messageId"] != starts[1]["messageId"]
    again = chunks[chunks.index(starts[1]):]
    assert again[1] == {"type": "start-step"}  # the whole message again, from its first step
    assert texts_after_last_start(chunks) == "Hello there, friend."


def test_turns_without_streamed_text_get_their_text_from_the_transcript() -> None:
    chunks = encode([part(1, "job_started"), part(2, "turn_started", 1),
                     part(3, "turn_committed", 1, messages=[1, 2]), part(4, "job_finished")])
    assert [c["type"] for c in chunks] == ["start", "start-step", "text-start", "text-delta", "text-end",
                                           "finish-step", "finish"]
    assert chunks[3]["delta"] == "Hello there, friend."


def test_a_failed_run_ends_with_an_error_and_a_waiting_one_only_when_nothing_follows() -> None:
    failed = encode([part(1, "job_started"), part(2, "job_failed", error="model said no")])
    assert failed[-2:] == [{"type": "error", "errorText": "model said no"}, {"type": "finish", "finishReason": "error"}]
    encoder = UIMessageEncoder("j", lambda a, b: [])
    encoder.feed(part(1, "job_started"))
    assert encoder.feed(part(2, "approval_requested"), final=False) == [] and not encoder.ended
    assert encoder.feed(part(3, "approval_requested"))[-1]["type"] == "finish" and encoder.ended


def test_a_replay_keeps_only_the_attempts_the_latest_one_does_not_contradict() -> None:
    from pipelines.web.aisdk import latest_attempts
    from pipelines.web.cursors import split as _split

    run = [part(1, "job_started"), part(2, "attempt_started", 1, attempt="a"),
           part(3, "text_delta", 1, attempt="a", text="Goodbye"),
           part(4, "attempt_started", 1, attempt="b"),
           part(5, "text_delta", 1, attempt="b", text="Hello th"),  # says something else: "a" goes
           part(6, "attempt_started", 1, attempt="c"),
           part(7, "text_delta", 1, attempt="c", text="Hello there, friend."),  # goes on from "b": "b" stays
           part(8, "turn_committed", 1, messages=[1, 2]), part(9, "job_finished")]
    kept = latest_attempts(run)
    assert [p.id for p in kept] == ["1", "2", "4", "5", "6", "7", "8", "9"]
    chunks = encode(kept)
    assert [c["type"] for c in chunks].count("start") == 1  # one messageId: nothing to take back
    assert "".join(c["delta"] for c in chunks if c["type"] == "text-delta") == "Hello there, friend."
    same = run[:1] + run[3:]  # an attempt that says the same again (a reused journaled answer) drops nothing
    assert latest_attempts(same) is same
    assert _split("7:2:hc") == ("7", 2, "hc") and _split("7:2:c") == ("7", 2, "c") and _split("7:2") == ("7", 2, "")


def test_a_paused_run_ends_its_message_only_when_nothing_follows_the_pause() -> None:
    # A follower of a paused conversation is not left streaming for as long as the pause lasts.
    paused = encode([part(1, "job_started"), part(2, "turn_started", 1), part(3, "turn_committed", 1, messages=[1, 2]),
                     part(4, "job_paused")])
    assert paused[-1] == {"type": "finish", "finishReason": "other"}
    encoder = UIMessageEncoder("j", lambda a, b: COMMITTED[a - 1:b - 1])
    encoder.feed(part(1, "job_started"))
    assert encoder.feed(part(2, "job_paused"), final=False) == [] and not encoder.ended  # a replay: it resumed


def test_a_committed_turn_ends_with_its_text_even_after_an_attempt_that_said_more() -> None:
    # The retry's whole answer is a prefix of what the broken attempt said: taken back at the commit.
    run = [part(1, "job_started"), part(2, "attempt_started", 1, attempt="a"),
           part(3, "text_delta", 1, attempt="a", text="Hello there, friend. And much more besides."),
           part(4, "attempt_started", 1, attempt="b"),
           part(5, "text_delta", 1, attempt="b", text="Hello there, friend."),
           part(6, "turn_committed", 1, messages=[1, 2]), part(7, "job_finished")]
    assert texts_after_last_start(encode(run)) == "Hello there, friend."
    from pipelines.web.aisdk import latest_attempts

    assert [p.id for p in latest_attempts(run)] == ["1", "2", "4", "5", "6", "7"]  # committed: "a" said more
    assert [p.id for p in latest_attempts(run[:5])] == ["1", "2", "3", "4", "5"]  # running: "b" may say it all


def test_text_of_a_fenced_off_worker_for_a_committed_turn_is_not_shown() -> None:
    # A worker that stalled past its lease publishes turn 1's text after another committed turn 1 and began turn 2.
    from pipelines.streams import turn_texts
    from pipelines.web.aisdk import latest_attempts

    run = [part(1, "job_started"), part(2, "attempt_started", 1, attempt="new"),
           part(3, "text_delta", 1, attempt="new", text="Hello there, friend."),
           part(4, "turn_committed", 1, messages=[1, 2]),
           part(5, "attempt_started", 2, attempt="new"),
           part(6, "attempt_started", 1, attempt="zombie"),
           part(7, "text_delta", 1, attempt="zombie", text="STALE"),
           part(8, "text_delta", 2, attempt="new", text="Hello th"),
           part(9, "turn_committed", 2, messages=[1, 2]), part(10, "job_finished")]
    chunks = encode(run)
    assert [c["type"] for c in chunks].count("start-step") == 2 and [c["type"] for c in chunks].count("start") == 1
    assert "STALE" not in json.dumps(chunks)
    assert turn_texts(run) == {1: "Hello there, friend.", 2: "Hello th"}
    assert [p.id for p in latest_attempts(run)] == ["1", "2", "3", "4", "5", "6", "8", "9", "10"]


def test_a_run_stopped_on_an_answer_cut_short_finishes_as_the_ai_sdk_names_it() -> None:
    def finish(**data: Any) -> dict[str, Any]:
        chunks = encode([part(1, "job_started"), part(2, "turn_started", 1),
                         part(3, "turn_committed", 1, messages=[1, 2]), part(4, "job_finished", **data)])
        return chunks[-1]

    assert finish(reason="truncated") == {"type": "finish", "finishReason": "length"}
    assert finish(reason="content_filter") == {"type": "finish", "finishReason": "content-filter"}
    assert finish(reason="done") == finish(reason="max_turns") == finish() == {"type": "finish", "finishReason": "stop"}


def test_a_decision_that_leaves_the_job_waiting_on_another_call_ends_the_message_when_nothing_follows() -> None:
    # Two calls wait for approval and one is decided: the run goes on only once the other is, so a follower
    # that got the decision last (a POST that approved one, a resume) must not stay open for ever.
    asked = part(3, "approval_requested", 1, calls=[{"call_id": "c1", "tool": "pay", "arguments": "{}"},
                                                     {"call_id": "c2", "tool": "pay", "arguments": "{}"}])
    start = [part(1, "job_started"), part(2, "turn_started", 1), asked]
    for decided in (part(4, "call_approved", call_id="c1", pending=1),
                    part(4, "call_rejected", call_id="c1", reason="no", pending=1)):
        encoder = UIMessageEncoder("j", lambda a, b: [])
        for p in start:
            encoder.feed(p, final=False)
        assert encoder.feed(decided) == [{"type": "finish-step"}, {"type": "finish", "finishReason": "other"}]
        assert encoder.ended
    # The last call decided: the run goes on, in this message when its parts follow.
    last = UIMessageEncoder("j", lambda a, b: [])
    for p in start:
        last.feed(p, final=False)
    assert last.feed(part(4, "call_approved", call_id="c1", pending=0)) == [] and not last.ended
    # In a replay, parts that follow the decision (the other call decided, the run going on) keep it open.
    replay = UIMessageEncoder("j", lambda a, b: [])
    for p in start:
        replay.feed(p, final=False)
    assert replay.feed(part(4, "call_approved", call_id="c1", pending=1), final=False) == [] and not replay.ended


def test_a_full_retry_undoes_the_run_in_effect_only() -> None:
    from pipelines.web.aisdk import undone

    # Run 1 ends, run 2 continues the conversation, a full retry restarts run 2: run 1's messages stand.
    parts = [part(1, "job_started"), part(2, "job_finished"), part(3, "job_continued"), part(4, "job_failed"),
             part(5, "job_retried", mode="full"), part(6, "job_finished")]
    assert not undone(parts, 0) and undone(parts, 2) and not undone(parts, 4)
    # A resume goes on with the same run: a full retry after it undoes the run that began before it.
    parts = [part(1, "job_started"), part(2, "job_failed"), part(3, "job_retried", mode="resume"),
             part(4, "job_failed"), part(5, "job_retried", mode="full")]
    assert undone(parts, 0) and undone(parts, 2) and not undone(parts, 4)

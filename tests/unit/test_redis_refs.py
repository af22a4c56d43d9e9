"""``adapters.redis.refs``: which messages a commit sends as references into the journal, which parts as slices."""

from __future__ import annotations

import hashlib

from adapters.redis.refs import REF_MIN_BYTES, JournalValues

MSG = '{"role":"assistant","content":"' + "é" * 20 + "x" * REF_MIN_BYTES + '"}'
VALUE = '{"message":' + MSG + ',"finish_reason":"stop"}'


def _slice(value: str, ref: str) -> bytes:
    start, length, digest, key = ref[1:].split(" ", 3)
    assert key == "model"
    got = value.encode()[int(start) - 1:int(start) - 1 + int(length)]
    assert hashlib.sha1(got).hexdigest()[:16] == digest
    return got


def test_a_message_held_by_a_journaled_value_becomes_a_byte_exact_reference() -> None:
    steps = JournalValues()
    steps.remember("j", 3, "model", VALUE)
    short = '{"role":"tool","content":"1"}'
    sent = steps.refer("j", [MSG, short])
    assert sent is not None and sent[0].startswith("=") and sent[1] == short
    # Offsets count UTF-8 bytes (what Lua's string.sub counts), not characters.
    assert _slice(VALUE, sent[0]) == MSG.encode()


def test_a_message_holding_a_whole_journaled_value_is_sent_as_the_text_around_it() -> None:
    # A tool's answer: its content string is journaled, and the message holds it. Non-ASCII before it and in
    # the step key: the lengths count bytes. The key may hold spaces and a newline: its length is sent.
    answer = '"' + "ü" * 10 + "y" * REF_MIN_BYTES + '"'
    message = '{"role":"tool","tool_call_id":"càll 1","content":' + answer + "}"
    steps = JournalValues()
    steps.remember("j", 3, "tool:càll 1\nx", answer)
    (sent,) = steps.refer("j", [message]) or [None]
    assert sent is not None and sent.startswith(">") and "y" * REF_MIN_BYTES not in sent
    header, rest = sent[1:].split("\n", 1)
    lead, digest, key_len = header.split(" ")
    body = rest.encode()
    key, around = body[:int(key_len)].decode(), body[int(key_len):]
    assert key == "tool:càll 1\nx" and digest == hashlib.sha1(answer.encode()).hexdigest()[:16]
    assert around[:int(lead)] + answer.encode() + around[int(lead):] == message.encode()
    # A short value is not worth a reference.
    steps.remember("j", 3, "tool:càll 1\nx", '"short"')
    assert steps.refer("j", ['{"role":"tool","content":"short"}']) is None


def test_nothing_to_refer_to_gives_none() -> None:
    steps = JournalValues()
    assert steps.refer("j", [MSG]) is None  # nothing journaled
    steps.remember("j", 3, "model", '{"other":1}')
    assert steps.refer("j", [MSG]) is None  # not held by any value
    steps.remember("j", 3, "model", VALUE)
    assert steps.refer("other-job", [MSG]) is None


def test_a_step_of_another_version_starts_the_set_anew_and_forget_drops_it() -> None:
    steps = JournalValues()
    steps.remember("j", 3, "model", VALUE)
    steps.remember("j", 3, "tool:c1", "{}")
    steps.remember("j", 4, "tool:c2", "{}")  # the journal of version 4 no longer holds 'model'
    assert steps.refer("j", [MSG]) is None
    steps.reset("j", 4, {"model": VALUE.encode()})
    assert steps.refer("j", [MSG]) is not None
    steps.forget("j")
    assert steps.refer("j", [MSG]) is None and steps.held_bytes == 0


def test_what_is_kept_is_bounded_oldest_job_first() -> None:
    steps = JournalValues(jobs=2, max_bytes=10 * len(VALUE))
    for job in ("a", "b", "c"):
        steps.remember(job, 1, "model", VALUE)
    assert steps.refer("a", [MSG]) is None
    assert steps.refer("b", [MSG]) is not None and steps.refer("c", [MSG]) is not None
    size = len("model") + len(VALUE.encode())  # what one job's set holds: keys and values, in bytes
    small = JournalValues(max_bytes=size + 10)
    small.remember("a", 1, "model", VALUE)
    small.remember("b", 1, "model", VALUE)  # over the byte bound: "a" goes
    assert small.refer("a", [MSG]) is None and small.refer("b", [MSG]) is not None
    small.remember("c", 1, "model", VALUE * 2)  # larger than the whole bound: not kept at all
    assert small.refer("c", [MSG]) is None and small.held_bytes == size


def test_a_part_sharing_a_long_string_with_the_value_is_cut_where_the_value_holds_it() -> None:
    from adapters.redis.refs import slice_parts

    text = '"' + "é" * 10 + 'y\\"' + "z" * REF_MIN_BYTES + '"'  # a JSON string literal with an escaped quote
    value = '{"message":{"content":' + text + "}}"
    line = '[1.5,6,1,"turn",{"attempt":"a1","text":' + text + "}]"
    other = '[1.5,6,1,"turn",{"text":"' + "q" * REF_MIN_BYTES + '"}]'
    short = '[1.5,5,1,"turn"]'
    sent = slice_parts(value, [line, other, short])
    assert sent is not None and sent[1:] == [other, short]
    head, rest = sent[0].split("\n", 1)
    prefix_len, start, length = (int(x) for x in head[1:].split(" "))
    raw, data = rest.encode(), value.encode()
    # Put back together as the step script does, in bytes: the line as it was built.
    rebuilt = raw[:prefix_len] + data[start - 1:start - 1 + length] + raw[prefix_len:]
    assert rebuilt == line.encode()
    assert slice_parts(value, [other, short]) is None


def test_the_streamed_tail_of_an_answer_is_cut_too() -> None:
    import json

    from adapters.redis.refs import slice_parts

    content = "head of the answer, already streamed. " + 'tail \\ with "escapes" and é ' * 8
    value = json.dumps({"message": {"content": content}}, ensure_ascii=False, separators=(",", ":"))
    tail = content[38:]  # what the last part holds: the content after what went out before
    line = json.dumps([1.5, 6, 1, "turn", {"text": tail}], ensure_ascii=False, separators=(",", ":"))
    sent = slice_parts(value, [line])
    assert sent is not None
    head, rest = sent[0].split("\n", 1)
    prefix_len, start, length = (int(x) for x in head[1:].split(" "))
    raw, data = rest.encode(), value.encode()
    assert raw[:prefix_len] + data[start - 1:start - 1 + length] + raw[prefix_len:] == line.encode()
    assert length == len(json.dumps(tail, ensure_ascii=False)[1:-1].encode())  # the escaped tail, in bytes

"""``adapters.redis.compact``: record format 3's texts, each of the engine's own key runs stored as one byte.

What a reader widens must be the JSON the adapter wrote, byte for byte, whatever the text holds: the runs
themselves, runs back to back or inside a user's strings, non-ASCII, characters JSON escapes.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from adapters.redis.compact import ALL_RUNS, EVENT_RUNS, RECORD_RUNS, WORDS, narrow, narrow_answer, widen
from pipelines.engine.errors import StorageError
from pipelines.engine.models.values import encode_plain

# Texts as the adapter dumps them: each run of the table, runs back to back, a user's text holding runs and
# characters JSON escapes, the empty text.
TEXTS = [
    *WORDS,
    "".join(WORDS),
    "".join(reversed(WORDS)),
    json.dumps({"role": "user", "content": '"turn" {"turn": ,"tool":" \x01\x1f\n é 中 🙂'}),
    json.dumps({"call_id": "c", "tool": "add", "error": False}, separators=(",", ":")),
    '[1796445164.7893429,1,97,"turn",{"finish_reason":"tool_calls","tool_calls":1,"prompt_tokens":5084,'
    '"completion_tokens":51,"cost_usd":0.0,"request":{"messages":194,"tools":["add"]},"model":"scripted"}]',
    "",
]


def test_every_text_is_stored_shorter_or_the_same_and_read_back_whole() -> None:
    stored = narrow(TEXTS, ALL_RUNS)
    assert [widen(t) for t in stored] == TEXTS
    assert all(len(s) <= len(t) for s, t in zip(stored, TEXTS, strict=True))
    assert all(len(stored[i]) == 1 for i in range(len(WORDS)))  # each run alone: its code
    # A user's text holding runs is narrowed too, and comes back the same (its control characters are escaped).
    assert "\\u0001" in stored[len(WORDS) + 2] and widen(stored[len(WORDS) + 2]) == TEXTS[len(WORDS) + 2]
    assert len(stored[-2]) < 0.6 * len(TEXTS[-2])  # a W1 turn's model event: its keys are most of it


def test_a_writer_looks_for_the_runs_of_its_kind_of_text_and_every_run_is_of_one_kind_at_least() -> None:
    record = '{"checkpoint":{"next_phase":"turn","state":{"turn":2},"due_at":1.5},"version":4,"phases_done":3}'
    assert narrow([record], RECORD_RUNS) == narrow([record], ALL_RUNS) and len(narrow([record], RECORD_RUNS)[0]) < 30
    event = TEXTS[len(WORDS) + 4]
    assert narrow([event], EVENT_RUNS) == narrow([event], ALL_RUNS) and widen(narrow([event], EVENT_RUNS)[0]) == event
    assert {w for w, _ in RECORD_RUNS} | {w for w, _ in EVENT_RUNS} == set(WORDS) == {w for w, _ in ALL_RUNS}


def test_a_text_written_whole_reads_as_it_is() -> None:
    # Formats 1 and 2, or a hand-written record: JSON holds no raw control byte, so nothing is widened.
    for text in TEXTS:
        assert widen(text) == text


def test_the_table_is_stored_data_and_never_changes() -> None:
    # Format 3's texts hold these codes: a changed, removed or reordered run (or code) would misread every one
    # of them. Every code is taken (adapters.redis.compact).
    codes = [narrow([word], ALL_RUNS)[0] for word in WORDS]
    digest = hashlib.sha256("\n".join(f"{w}\t{ord(c)}" for w, c in zip(WORDS, codes, strict=True)).encode())
    assert (len(WORDS), digest.hexdigest()) == (
        28, "54a3c9b744b83cc5ffdaec4eef6d2ac3eb85c6b570368986d0cd8bcb1fbf0a5d")
    assert {ord(c) for c in codes} == set(range(1, 32)) - {9, 10, 13}  # never NUL or JSON's whitespace
    for word in WORDS:
        assert word.isascii() and word.isprintable()


def test_json_whitespace_is_never_a_code_and_a_pretty_printed_text_reads_as_it_is() -> None:
    pretty = json.dumps({"checkpoint": {"next_phase": "turn"}, "version": 5}, indent="\t").replace("\n", "\r\n")
    assert widen(pretty) == pretty and json.loads(widen(narrow([pretty], ALL_RUNS)[0])) == json.loads(pretty)


@pytest.mark.parametrize("bad", ["\x01", '{"a":"\x1f"}', "a\x00b", "\x0b"])
def test_a_text_holding_a_raw_control_character_is_refused_before_anything_is_written(bad: str) -> None:
    with pytest.raises(StorageError, match="raw control character"):
        narrow(['{"ok":1}', bad], ALL_RUNS)


def test_newline_is_never_a_code() -> None:
    (code,) = narrow(['{"turn":'], ALL_RUNS)
    assert len(code) == 1 and narrow(['{"turn":1}\n{"turn":2}'], ALL_RUNS) == [f"{code}1}}\n{code}2}}"]


def _answer(content: str) -> dict[str, object]:
    """A model answer as the agent turn journals it (``journal_form``): the message first, its fields after."""
    return {"message": {"role": "assistant", "content": content, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
            "finish_reason": "tool_calls", "usage": {"prompt_tokens": 390, "completion_tokens": 51, "model_calls": 1,
                                                     "cost_usd": 0.5},
            "model": "scripted", "request": {"messages": 16, "tools": ["add", "turn"]}}


@pytest.mark.parametrize("content", ["plain", ',"usage":{"prompt_tokens": "turn" ,"model":"x \x01 é 🙂', ""])
def test_a_model_answer_is_narrowed_after_its_message_and_the_message_stays_as_written(content: str) -> None:
    value = _answer(content)
    text = encode_plain(value)
    stored = narrow_answer(value, text)
    message = encode_plain(value["message"])
    # The message, whatever runs its text holds, is found in what is stored byte for byte: a commit and a
    # live part are cut from it there (adapters.redis.refs).
    assert stored.startswith('{"message":' + message)
    assert len(text) - len(stored) > 80  # usage, model and request: their keys are most of what follows
    assert widen(stored) == text and json.loads(widen(stored)) == value


@pytest.mark.parametrize("value", [
    "a tool's result",  # a JSON string: a tool message holds it whole
    {"message": "not a dict", "usage": {"prompt_tokens": 1}},
    {"usage": {"prompt_tokens": 1}, "message": {"role": "assistant"}},  # not the message first
    [{"message": {"role": "assistant"}}, {"prompt_tokens": 1}],
])
def test_any_other_value_is_journaled_as_it_is(value: object) -> None:
    text = encode_plain(value)
    assert narrow_answer(value, text) == text


def test_an_answer_dumped_otherwise_than_its_message_is_journaled_as_it_is() -> None:
    value = _answer("x")
    text = json.dumps(value)  # spaces after the separators: the message is not found as encode_plain writes it
    assert narrow_answer(value, text) == text

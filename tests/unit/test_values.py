"""Values that storage accepts can always be read back (issue items 4 and 5), on the memory adapter.

Each bad value kind (too deep, an int too long, a lone surrogate in a string
or a key, NaN, an enum of floats, a value over MAX_VALUE_BYTES) meets each
write path (create_job's record, a commit's record, message, log line and
event, record_step): the typed error naming why, and nothing written (the
job's stored form and the write counter unchanged, get_job still works).
Values exactly at the limits round-trip unchanged. The cases and the write
paths are shared with tests/integration/test_values_redis.py.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from enum import Enum, IntEnum, StrEnum
from typing import Any

import pytest

from adapters.memory import MemoryStorage
from pipelines.engine.errors import InvalidInputError, StateNotSerializableError, ValueTooLargeError
from pipelines.engine.models import (
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    MAX_VALUE_BYTES,
    MAX_VALUE_DEPTH,
    Checkpoint,
    Commit,
    Event,
    JobRecord,
    JobStatus,
    LogEntry,
    TurnMark,
    dump_json,
    dump_record,
    to_json_value,
)


def nest(levels: int) -> Any:
    """``levels`` lists around an int: a value ``levels`` deep."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


class Money(Enum):
    CENT = 0.01


class Colour(Enum):
    RED = "red"


class Mode(StrEnum):
    FAST = "fast"


class Level(IntEnum):
    HIGH = 3


# Every write path wraps the value in one dict ({"v": value}, or the message
# around its content), so a value is at most MAX_VALUE_DEPTH - 1 deep on its own.
# (kind, value, error class, text the message must contain)
BAD: list[Any] = [
    pytest.param(nest(MAX_VALUE_DEPTH), StateNotSerializableError, f"deeper than {MAX_VALUE_DEPTH} levels",
                 id="one-level-too-deep"),
    pytest.param(nest(300), StateNotSerializableError, "deeper than", id="far-too-deep"),
    pytest.param(10**MAX_INT_DIGITS, StateNotSerializableError, f"about {MAX_INT_DIGITS + 1} digits", id="big-int"),
    pytest.param(-(10**MAX_INT_DIGITS), StateNotSerializableError, "digits", id="big-negative-int"),
    pytest.param("x\ud83d", StateNotSerializableError, "lone surrogate '\\ud83d' in a string", id="surrogate-str"),
    pytest.param({"k\udc00": 1}, StateNotSerializableError, "lone surrogate '\\udc00' in a dict key",
                 id="surrogate-key"),
    pytest.param(math.nan, StateNotSerializableError, "not JSON-serialisable: nan", id="nan"),
    pytest.param(-math.inf, StateNotSerializableError, "not JSON-serialisable: -inf", id="inf"),
    pytest.param(Money.CENT, StateNotSerializableError, "only enums of str or int", id="enum-of-float"),
    pytest.param((1, 2), StateNotSerializableError, "round trip", id="tuple"),
    pytest.param("z" * (MAX_VALUE_BYTES + 1), ValueTooLargeError, "MiB limit", id="over-max-bytes"),
]

# Values exactly at the limits, and what storage hands back for them.
AT_LIMIT: list[Any] = [
    pytest.param(nest(MAX_VALUE_DEPTH - 1), nest(MAX_VALUE_DEPTH - 1), id="deepest"),
    pytest.param(10**MAX_INT_DIGITS - 1, 10**MAX_INT_DIGITS - 1, id="longest-int"),
    pytest.param(-(10**MAX_INT_DIGITS - 1), -(10**MAX_INT_DIGITS - 1), id="longest-negative-int"),
    pytest.param({"k\U0001f600": "a \U0001f600 pair"}, {"k\U0001f600": "a \U0001f600 pair"}, id="emoji"),
    pytest.param([Mode.FAST, Level.HIGH, Colour.RED], ["fast", 3, "red"], id="enums-as-values"),
    pytest.param({Mode.FAST: 1}, {"fast": 1}, id="str-enum-key"),
]


# --- the write paths: each takes (storage, job id, value) and writes value through one path ----------
def running_record(job_id: str) -> JobRecord:
    return JobRecord(job_id=job_id, pipeline="p", status=JobStatus.RUNNING, version=1,
                     checkpoint=Checkpoint(next_phase="a", state={"n": 0}))


def start(storage: Any, job_id: str = "j") -> JobRecord:
    """A running job at version 1 with one step journaled; returns its record as stored."""
    storage.create_job(running_record(job_id), messages=[{"role": "user", "content": "hi"}])
    storage.record_step(job_id, version=1, owner=None, key="first", value={"ok": True})
    rec: JobRecord | None = storage.get_job(job_id)
    assert rec is not None
    return rec


def commit_with(storage: Any, job_id: str, **parts: Any) -> None:
    rec = storage.get_job(job_id)
    assert rec is not None
    record = parts.pop("record", rec.model_copy(update={"version": rec.version + 1}))
    storage.commit(Commit(job_id=job_id, expected_version=rec.version, token=uuid.uuid4().hex, record=record,
                          **parts))


def via_create_state(storage: Any, job_id: str, value: Any) -> None:
    storage.create_job(running_record("new").model_copy(update={"initial_state": {"v": value}}))


def via_create_message(storage: Any, job_id: str, value: Any) -> None:
    storage.create_job(running_record("new"), messages=[{"role": "user", "content": value}])


def via_commit_state(storage: Any, job_id: str, value: Any) -> None:
    rec = storage.get_job(job_id)
    cp = rec.checkpoint.model_copy(update={"state": {"v": value}})
    commit_with(storage, job_id, record=rec.model_copy(update={"version": rec.version + 1, "checkpoint": cp}))


def via_commit_result(storage: Any, job_id: str, value: Any) -> None:
    rec = storage.get_job(job_id)
    done = rec.model_copy(update={"version": rec.version + 1, "status": JobStatus.COMPLETE, "result": {"v": value}})
    commit_with(storage, job_id, record=done)


def via_commit_message(storage: Any, job_id: str, value: Any) -> None:
    commit_with(storage, job_id, append_messages=[{"role": "assistant", "content": "ok"},
                                                  {"role": "tool", "content": value}])


def via_commit_event(storage: Any, job_id: str, value: Any) -> None:
    commit_with(storage, job_id, events=[Event(timestamp=1.0, type="tool_result", data={"v": value})])


def via_record_step(storage: Any, job_id: str, value: Any) -> None:
    storage.record_step(job_id, version=1, owner=None, key="fetch", value={"v": value})


PATHS: list[Any] = [
    pytest.param(via_create_state, id="create-state"),
    pytest.param(via_create_message, id="create-message"),
    pytest.param(via_commit_state, id="commit-state"),
    pytest.param(via_commit_result, id="commit-result"),
    pytest.param(via_commit_message, id="commit-message"),
    pytest.param(via_commit_event, id="commit-event"),
    pytest.param(via_record_step, id="record-step"),
]


def read_back(storage: Any, path: Callable[..., None], job_id: str) -> Any:
    """The value the path wrote, as storage hands it back now."""
    if path is via_create_state:
        return storage.get_job("new").initial_state["v"]
    if path is via_create_message:
        return storage.messages("new")[0]["content"]
    rec = storage.get_job(job_id)
    if path is via_commit_state:
        return rec.checkpoint.state["v"]
    if path is via_commit_result:
        return rec.result["v"]
    if path is via_commit_message:
        return storage.messages(job_id)[-1]["content"]
    if path is via_commit_event:
        return storage.events(job_id)[-1].data["v"]
    return rec.checkpoint.journal["fetch"]["v"]


def snapshot(storage: MemoryStorage) -> Any:
    return storage.inspect("j"), storage.get_job("new"), storage.writes


# --- memory ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("value", "error", "why"), BAD)
def test_a_value_storage_could_not_read_back_is_refused_with_nothing_written(
        path: Callable[..., None], value: Any, error: type[Exception], why: str) -> None:
    storage = MemoryStorage()
    before_rec = start(storage)
    before = snapshot(storage)
    with pytest.raises(error) as info:
        path(storage, "j", value)
    assert isinstance(info.value, InvalidInputError) and why in str(info.value)
    assert snapshot(storage) == before
    assert storage.get_job("j") == before_rec  # still readable, unchanged


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("value", "expected"), AT_LIMIT)
def test_a_value_exactly_at_the_limits_round_trips(path: Callable[..., None], value: Any, expected: Any) -> None:
    storage = MemoryStorage()
    start(storage)
    path(storage, "j", value)
    back = read_back(storage, path, "j")
    assert back == expected and type(back) is type(expected)


def test_a_log_line_with_a_lone_surrogate_or_a_nan_timestamp_is_refused_with_nothing_written() -> None:
    storage = MemoryStorage()
    start(storage)
    before = snapshot(storage)
    with pytest.raises(StateNotSerializableError, match=r"a log entry: message contains a lone surrogate"):
        commit_with(storage, "j", logs=[LogEntry(timestamp=1.0, message="bad \udfff")])
    with pytest.raises(StateNotSerializableError, match=r"a log entry: timestamp is not JSON-serialisable: nan"):
        commit_with(storage, "j", logs=[LogEntry(timestamp=math.nan, message="fine")])
    with pytest.raises(ValueTooLargeError, match=r"a log entry is 8\.0 MiB"):
        commit_with(storage, "j", logs=[LogEntry(timestamp=1.0, message="z" * MAX_VALUE_BYTES)])
    assert snapshot(storage) == before


def test_a_record_field_that_pydantic_would_write_as_null_is_refused() -> None:
    # An infinite due time or a NaN cost is written as null and no reader accepts it back.
    storage = MemoryStorage()
    start(storage)
    before = snapshot(storage)
    rec = storage.get_job("j")
    assert rec is not None and rec.checkpoint is not None
    later = rec.checkpoint.model_copy(update={"due_at": math.inf})
    with pytest.raises(StateNotSerializableError, match=r"the record of job 'j': checkpoint\.due_at"):
        commit_with(storage, "j", record=rec.model_copy(update={"version": 2, "checkpoint": later}))
    usage = rec.usage.model_copy(update={"cost_usd": math.nan})
    with pytest.raises(StateNotSerializableError, match=r"usage\.cost_usd is not JSON-serialisable"):
        commit_with(storage, "j", record=rec.model_copy(update={"version": 2, "usage": usage}))
    with pytest.raises(StateNotSerializableError, match=r"error contains a lone surrogate"):
        commit_with(storage, "j", record=rec.model_copy(update={"version": 2, "error": "tool said \ud800"}))
    assert snapshot(storage) == before


def test_a_bad_value_in_the_turn_history_is_named_by_its_place_and_fields_never_written_are_not_checked() -> None:
    storage = MemoryStorage()
    start(storage)
    before = snapshot(storage)
    rec = storage.get_job("j")
    assert rec is not None
    marks = [TurnMark(phases_done=0, state={"ok": 1}), TurnMark(phases_done=1, state={"n": ("a", "tuple")})]
    with pytest.raises(StateNotSerializableError, match=r"the record of job 'j': history\[1\]\.state does not "):
        commit_with(storage, "j", record=rec.model_copy(update={"version": 2, "history": marks}))
    assert snapshot(storage) == before
    # ``dropped`` and ``control`` live beside the record (exclude=True): they are not written, so not refused.
    odd = rec.model_copy(update={"version": 2, "dropped": rec.dropped.model_copy(update={"cost_usd": math.nan})})
    commit_with(storage, "j", record=odd)
    assert storage.get_job("j") is not None and storage.get_job("j").dropped.cost_usd == 0.0  # type: ignore[union-attr]


def test_a_step_result_at_the_depth_limit_still_reads_back_inside_the_record() -> None:
    # The deepest place a value sits: record -> checkpoint -> journal -> step result.
    storage = MemoryStorage()
    start(storage)
    deepest = nest(MAX_VALUE_DEPTH)
    storage.record_step("j", version=1, owner=None, key="deep", value=deepest)
    rec = storage.get_job("j")
    assert rec is not None and rec.checkpoint is not None and rec.checkpoint.journal["deep"] == deepest
    kept = rec.model_copy(update={"version": 2})  # a commit that writes the journal into the record
    commit_with(storage, "j", record=kept, keep_journal=True)
    stored = storage.inspect("j")["record"]
    assert stored["checkpoint"]["journal"]["deep"] == deepest
    again = JobRecord.model_validate_json(dump_record(kept, "r")).checkpoint
    assert again is not None and again.journal["deep"] == deepest
    assert MAX_VALUE_DEPTH + 3 == MAX_JSON_DEPTH


def test_an_oversized_record_names_its_size_and_nothing_is_written() -> None:
    storage = MemoryStorage()
    start(storage)
    before = snapshot(storage)
    with pytest.raises(ValueTooLargeError, match=r"the record of job 'j' is 8\.0 MiB"):
        via_commit_state(storage, "j", "z" * MAX_VALUE_BYTES)
    assert snapshot(storage) == before


def test_a_message_of_exactly_max_value_bytes_is_stored_and_one_byte_more_is_not() -> None:
    storage = MemoryStorage()
    start(storage)
    empty = {"role": "tool", "content": ""}
    fill = MAX_VALUE_BYTES - len(dump_json(empty, "m"))
    exact = {"role": "tool", "content": "z" * fill}
    assert len(dump_json(exact, "m").encode()) == MAX_VALUE_BYTES
    commit_with(storage, "j", append_messages=[exact])
    assert storage.messages("j")[-1] == exact
    with pytest.raises(ValueTooLargeError, match=r"a transcript message is 8\.0 MiB"):
        commit_with(storage, "j", append_messages=[{"role": "tool", "content": "z" * (fill + 1)}])


# --- the rules themselves (to_json_value) ---------------------------------------------------------
def test_enums_of_str_or_int_become_their_value_whatever_their_kind() -> None:
    assert to_json_value({"m": Mode.FAST, "l": Level.HIGH, "c": Colour.RED}) == {"m": "fast", "l": 3, "c": "red"}
    out = to_json_value([Level.HIGH])
    assert type(out[0]) is int  # the value, not the member: it is what storage hands back
    assert dump_json({"c": Colour.RED}, "v") == '{"c":"red"}'


def test_an_int_enum_key_is_refused_like_any_int_key() -> None:
    with pytest.raises(StateNotSerializableError, match="round trip"):
        to_json_value({Level.HIGH: 1})


def test_errors_name_what_the_value_is() -> None:
    with pytest.raises(StateNotSerializableError, match=r"^initial_state of job 'x' contains a lone surrogate"):
        to_json_value({"a": ["ok", "bad\ud83d"]}, what="initial_state of job 'x'")


def test_a_cycle_is_refused_as_too_deep_not_a_recursion_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(StateNotSerializableError, match="deeper than"):
        to_json_value(loop)
    with pytest.raises(StateNotSerializableError, match="deeper than"):
        to_json_value({"mode": Mode.FAST, "loop": loop})  # the converting (slow) path too


def test_a_plain_value_is_returned_as_is_and_a_converted_one_is_plain() -> None:
    value = {"a": [1, 2.5, "x", None, True]}
    assert to_json_value(value) is value
    assert to_json_value({"a": [Mode.FAST]}) == {"a": ["fast"]}


def test_usage_is_frozen_so_a_sum_that_shares_an_operand_cannot_change_it() -> None:
    from pydantic import ValidationError

    from pipelines.engine.models import Usage

    paid = Usage(prompt_tokens=3, completion_tokens=2, model_calls=1, cost_usd=0.5)
    total = paid + Usage()  # adding nothing hands back the same object
    with pytest.raises(ValidationError):
        total.prompt_tokens = 100
    assert paid.prompt_tokens == 3 and (Usage() + paid) == paid
    assert paid + paid == Usage(prompt_tokens=6, completion_tokens=4, model_calls=2, cost_usd=1.0)

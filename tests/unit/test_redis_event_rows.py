"""The Redis adapter's stream entries: the usual event's one-pass row is the text the general path writes."""

from __future__ import annotations

import enum

import pytest

from adapters.redis import values
from adapters.redis.values import _dump_parts, _load_part
from pipelines.engine.errors import StateNotSerializableError
from pipelines.engine.models import Event, plain_event

USUAL = [
    Event(timestamp=1.5, type="tool_call", turn=2, phase="turn", data={"call_id": "c", "tool": "add"}),
    Event(timestamp=2.0, type="job_started"),  # trailing defaults left out
    Event(timestamp=3.25, type="my_own_type", turn=0, data={"ünï": ["x", 1, 2.5, None, True, {"d": []}]}),
    Event(timestamp=4.0, type="text_delta", phase="turn", data={}),  # empty data left out, turn kept as null
]


class Colour(enum.StrEnum):
    RED = "red"


def test_the_usual_event_s_row_is_the_text_the_general_path_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(plain_event(e) for e in USUAL)
    fast = _dump_parts(USUAL)
    monkeypatch.setattr(values, "plain_event", lambda e: False)  # every event through the general path
    assert _dump_parts(USUAL) == fast
    assert fast[0] == '[1.5,2,2,"turn",{"call_id":"c","tool":"add"}]'
    assert fast[1] == "[2.0,7]" and fast[3] == '[4.0,6,null,"turn"]'
    assert [_load_part(t).model_dump(exclude={"id"}) for t in fast] == [e.model_dump(exclude={"id"}) for e in USUAL]


def test_an_unusual_event_takes_the_general_path_which_converts_or_refuses_naming_it() -> None:
    enum_data = Event(timestamp=1.0, type="tool_call", data={"colour": Colour.RED})
    assert not plain_event(enum_data)
    assert _dump_parts([enum_data]) == ['[1.0,2,null,null,{"colour":"red"}]']
    with pytest.raises(StateNotSerializableError, match="event 'tool_call'"):
        _dump_parts([Event(timestamp=1.0, type="tool_call", data={"pair": (1, 2)})])
    with pytest.raises(StateNotSerializableError, match="event 'tool_call'"):
        _dump_parts([Event(timestamp=float("nan"), type="tool_call")])


@pytest.mark.parametrize("fields", [
    [b"e", b'{"a":1}'], ["e", '{"a":1}'], [b"e", "{}"],  # the one field this storage writes: bytes or str
    [b"x", b"1", b"e", b'{"a":1}'], {b"e": b'{"a":1}'}, {"e": '{"a":1}'}, [b"x", b"1"], [], None,
])
def test_a_stream_entry_s_text_is_found_whatever_its_shape(fields: object) -> None:
    from adapters.redis.events import entry

    as_dict = dict(zip(fields[::2], fields[1::2], strict=False)) if isinstance(fields, list) else fields
    raw = (as_dict or {}).get(b"e") or (as_dict or {}).get("e") or ""
    assert entry(fields) == (raw.decode() if isinstance(raw, bytes) else raw)

"""Record format 2's reading rests on JSON's later member winning; its delta on field identity."""

from __future__ import annotations

import json

from adapters.redis.compact import RECORD_RUNS, narrow
from adapters.redis.record_format import changed_fields, delta_json, format_of, merged, record_fields, stored_text
from pipelines.engine.models import Checkpoint, JobRecord, JobStatus, Usage


def test_pydantic_and_json_read_a_later_member_over_an_earlier_one() -> None:
    # A format-2 record is read as its base with the delta's members after its own: if pydantic-core
    # ever read the first of two members, every such record would read as its base. This says so first.
    text = merged('{"job_id":"a","version":1,"usage":{"prompt_tokens":5}}', '{"version":7,"usage":{}}')
    rec = JobRecord.model_validate_json(text)
    assert rec.version == 7 and rec.usage == Usage()
    assert json.loads(text) == {"job_id": "a", "version": 7, "usage": {}}


def test_merged_and_stored_text_put_a_base_and_its_delta_together() -> None:
    assert merged('{"a":1}', "") == '{"a":1}' and merged('{"a":1}', "{}") == '{"a":1}'
    assert merged('{"a":1}', "{ \n }") == '{"a":1}'  # no member, however spaced (a hand-written dx)
    assert json.loads(merged('{"a":1} ', ' {"b":[2]}')) == {"a": 1, "b": [2]}
    assert json.loads(merged("{}", '{"b":2}')) == {"b": 2}
    assert stored_text(b'{"x":1}', b'{"a":1}', b'{"a":2}') == '{"x":1}'  # format 1's 'data' wins
    assert json.loads(stored_text(None, b'{"a":1}', b'{"a":2}') or "") == {"a": 2}
    assert stored_text(None, None, b'{"a":2}') is None
    # Format 3 stores the delta compact: read back as the JSON it was (adapters.redis.compact).
    (dx,) = narrow(['{"checkpoint":{"next_phase":"turn","state":{"turn":2}},"version":4}'], RECORD_RUNS)
    assert len(dx) < 30 and json.loads(stored_text(None, b'{"a":1}', dx.encode()) or "") == {
        "a": 1, "checkpoint": {"next_phase": "turn", "state": {"turn": 2}}, "version": 4}


def test_the_layout_names_the_format_beside_the_buckets() -> None:
    assert format_of("buckets=0", "buckets=0") == 1
    assert format_of("buckets=3 records=2", "buckets=3") == 2
    assert format_of("buckets=3 records=2", "buckets=0") is None
    assert format_of("buckets=0 records=3", "buckets=0") == 3
    assert format_of("buckets=0 records=4", "buckets=0") is None  # a later format: not this version's to read


def _record() -> JobRecord:
    return JobRecord(job_id="j", pipeline="p", status=JobStatus.RUNNING, version=3, options={"tags": ["x"]},
                     checkpoint=Checkpoint(next_phase="turn", state={"turn": 1}, due_at=1.0))


def test_the_delta_holds_the_fields_set_since_the_base_and_reads_back_as_the_record() -> None:
    base = _record()
    new = base.model_copy(update={"version": 4, "error": "e", "checkpoint": base.checkpoint.model_copy(  # type: ignore[union-attr]
        update={"state": {"turn": 2}})})
    fields = changed_fields(new, base, frozenset({"title"}))
    assert fields == {"version", "error", "checkpoint", "title"}
    assert "history" not in record_fields() and "control" not in record_fields()
    text = delta_json(new, fields, "the record")
    assert json.loads(text)["title"] is None  # at its default, so written: the base may hold another
    whole = base.model_dump_json(exclude_defaults=True, exclude={"history"})
    assert JobRecord.model_validate_json(merged(whole, text)) == new


def test_a_delta_checks_the_fields_it_names_and_refuses_a_name_that_is_not_stored() -> None:
    import math

    import pytest

    from pipelines.engine.errors import StateNotSerializableError
    from pipelines.engine.models import dump_fields

    base = _record()
    bad = base.model_copy(update={"version": 4, "checkpoint": base.checkpoint.model_copy(  # type: ignore[union-attr]
        update={"state": {"turn": math.nan}})})
    with pytest.raises(StateNotSerializableError, match=r"the record: checkpoint\.state"):
        delta_json(bad, {"version", "checkpoint"}, "the record")
    # A field the delta does not name is not written, so not looked at: the stored base holds what it held.
    assert json.loads(dump_fields(bad, {"version"}, "the record")) == {"version": 4}
    with pytest.raises(ValueError, match=r"not stored fields of a record: \['history'\]"):
        dump_fields(base, {"version", "history"}, "the record")

"""Issue 30, defect 3: every backend bounds a reader's cursor the same way, before it reads.

A cursor comes from outside (an SSE ``Last-Event-ID``, a query parameter), so
``events`` and ``read_live`` refuse anything but ASCII digits with each part
at most 2**64-1 and no leading zero, with :class:`InvalidInputError` naming the cursor: never a
storage error, and never a cursor that ``int()`` would take (``"1_0"``,
other scripts' digits) read as some other place.
"""

from __future__ import annotations

from typing import Any

import pytest

from adapters.base import Storage
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Checkpoint, Event, JobRecord, JobStatus
from tests.contract.ports import covers

BAD = [
    "18446744073709551616-0",  # one past 2**64-1: Redis answered "ERR Invalid stream ID"
    "0-18446744073709551616",
    "18446744073709551616",
    "9" * 30,
    "0" * 21,
    "1_0-0",  # int() takes "1_0"
    "1_0",
    "\u0661",  # ARABIC-INDIC DIGIT ONE: str.isdigit() and int() take it
    "\u00b2",  # SUPERSCRIPT TWO: isdigit() but not int()
    " 1",
    "+1",
    "1\n",
    "1-2-3",
    "-1",
    "007",  # int() reads a padded id as the id it pads: the SSE endpoint took "00<ms>-0" as the part's cursor
    "01-0",
    "1-00",
]


@pytest.fixture
def storage(make_storage: Any) -> Storage:
    s: Storage = make_storage()
    cp = Checkpoint[Any](next_phase="a", state={}, version=1, due_at=1.0)
    s.create_job(JobRecord(job_id="j", status=JobStatus.RUNNING, checkpoint=cp, version=1),
                 events=[Event(timestamp=1.0, type="job_started")])
    return s


@pytest.mark.parametrize("cursor", BAD)
@covers("HistoryStore.events", "LiveStore.read_live", "ReadStore.read_live")
def test_a_cursor_that_is_not_ascii_digits_within_64_bits_is_invalid_input(storage: Storage, cursor: str) -> None:
    with pytest.raises(InvalidInputError, match=r"cursor .* (is not a part id|is out of range)"):
        storage.events("j", after=cursor)
    with pytest.raises(InvalidInputError, match=r"cursor .* (is not a part id|is out of range)"):
        storage.read_live("j", after=cursor)
    with pytest.raises(InvalidInputError, match=r"cursor .* (is not a part id|is out of range)"):
        storage.read_live("j", after=cursor, block=0.01)


@covers("HistoryStore.events", "LiveStore.read_live", "ReadStore.read_live")
def test_the_largest_cursor_reads_nothing_after_it(storage: Storage) -> None:
    # Each backend's own largest id: a position on memory, a stream id on Redis (whose XRANGE refuses
    # to start after it, so the adapter answers without asking).
    top = "18446744073709551615"
    last = top if storage.events("j")[0].id.isdigit() else f"{top}-{top}"
    assert storage.events("j", after=last) == []
    assert storage.read_live("j", after=last) == []
    assert storage.read_live("j", after=last, block=0.01) == []

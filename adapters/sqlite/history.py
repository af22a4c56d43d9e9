"""The records this process last wrote, kept with their turn history apart, so a turn neither dumps nor
parses a whole history.

The file keeps each record whole, its history inside its JSON text: what every process (and every
version of this library) reads. But a history changes by one mark a turn and holds up to
``HISTORY_LIMIT`` marks, so dumping and parsing all of them at every commit and every load made a
late turn cost more than an early one (at 11 marks a W1 record dumped in 22 us instead of 10, and
parsed in 18 us instead of 3). For the jobs it committed lately this process keeps the text it
stored, the same record without its history, and the marks with their lines (as
:mod:`adapters.memory.history` keeps them):

* a commit whose history continues the kept one (the engine builds it from the marks it loaded,
  object for object) dumps only its new marks, and splices the lines into the record's text;
* a load that finds exactly the kept text parses the record without its history and hands out
  the kept marks (frozen, shared as the memory and Redis adapters share theirs).

Anything else (another process's commit, a history rebuilt, an entry evicted) takes the whole
path. A stale entry costs only that: a load uses one only when the stored text is the very text
the entry was made with.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from adapters.memory.history import NO_HISTORY, StoredHistory, dump_apart
from pipelines.engine.models import JobRecord, check_size, dump_record

__all__ = ["KEPT_JOBS", "Histories", "Kept"]

KEPT_JOBS = 1024
"""How many jobs' records a storage keeps (the ones committed last): the jobs this process works on."""


class Kept(NamedTuple):
    """A record as stored (``text``), the same without its history (``apart``), and that history."""

    text: str
    apart: str
    history: StoredHistory


class Histories:
    """The :class:`Kept` records of one storage in this process, by job id (the last :data:`KEPT_JOBS`)."""

    def __init__(self, size: int = KEPT_JOBS) -> None:
        self._kept: dict[str, Kept] = {}
        self._size = size
        self._lock = threading.Lock()  # for changes; a lookup is one dict read

    def dump(self, record: JobRecord, what: str) -> tuple[str, Kept | None]:
        """The text to store for ``record`` (checked like ``dump_record``), and what to keep once it is stored."""
        if not record.history:
            return dump_record(record, what), None
        held = self._kept.get(record.job_id)
        apart, history, _ = dump_apart(record, NO_HISTORY if held is None else held.history, what)
        # The history goes last: a JSON object's keys are read in any order (apart is never "{}": it has an id).
        text = check_size(f'{apart[:-1]},"history":[{",".join(history.lines)}]}}', what)
        return text, Kept(text, apart, history)

    def keep(self, job_id: str, kept: Kept | None) -> None:
        """Note what was just stored for ``job_id`` (``None``: nothing to keep, and the old entry goes)."""
        with self._lock:
            self._kept.pop(job_id, None)  # re-inserted last: the oldest entries are the first evicted
            if kept is not None:
                self._kept[job_id] = kept
                while len(self._kept) > self._size:
                    del self._kept[next(iter(self._kept))]

    def load(self, job_id: str, text: str) -> JobRecord:
        """The record stored as ``text`` (raises pydantic's ``ValidationError`` if it does not parse)."""
        held = self._kept.get(job_id)
        if held is None or held.text != text:
            return JobRecord.model_validate_json(text)
        record = JobRecord.model_validate_json(held.apart)
        record.history = list(held.history.marks)
        return record

"""The memory storage's sorted listing index (issue 35): pages in the order list_jobs promises, at the cost
of a page."""

from __future__ import annotations

import time

from adapters.base import page_cursor
from adapters.memory import MemoryStorage
from adapters.memory.listing import SortedIndex
from pipelines.engine.models import JobRecord, JobStatus


def test_newest_first_ties_by_id_moves_and_removals() -> None:
    index = SortedIndex()
    for job_id, t in (("a", 1.0), ("b", 2.0), ("c", 2.0), ("d", 0.5)):
        index[job_id] = t
    assert list(index.newest()) == ["c", "b", "a", "d"]
    index["a"] = 3.0  # updated: moves to the front
    assert list(index.newest()) == ["a", "c", "b", "d"]
    assert list(index.newest((2.0, "c"))) == ["b", "d"]
    assert index.pop("b") == 2.0 and index.pop("b") is None and len(index) == 3
    index.clear()
    assert list(index.newest()) == [] and len(index) == 0


def test_a_deep_page_costs_about_what_the_first_one_does() -> None:
    storage = MemoryStorage()
    for n in range(20_000):
        storage.create_job(JobRecord(job_id=f"j{n:05d}", status=JobStatus.COMPLETE, updated_at=float(n)))

    def page_time(before: str | None) -> float:
        start = time.perf_counter()
        for _ in range(20):
            storage.list_jobs(limit=50, before=before)
        return time.perf_counter() - start

    deep = page_cursor(storage.list_jobs(limit=19_000)[-1])
    assert [r.job_id for r in storage.list_jobs(limit=2, before=deep)] == ["j00999", "j00998"]
    # Sorting 20,000 entries a page took ~10x a page's own work; a generous bound, never a tight timing.
    assert page_time(deep) < 5 * page_time(None) + 0.05

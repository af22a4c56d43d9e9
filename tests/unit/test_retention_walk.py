"""Retention's walk over the finished index (:class:`pipelines.app.retention.FinishedWalk`), on a list."""

from __future__ import annotations

from adapters.base import FinishedEntry
from pipelines.app.retention import FinishedWalk


class Index:
    """A finished index in a list: what ``finished_page`` reads."""

    def __init__(self, ids: list[str]) -> None:
        self.entries: list[FinishedEntry] = [(1.0, i) for i in ids]

    def finished_page(self, before: float, *, after: FinishedEntry | None = None,
                      limit: int = 1000) -> list[FinishedEntry]:
        return [e for e in sorted(self.entries) if e[0] <= before and (after is None or e > after)][:limit]

    def delete_job(self, job_id: str, *, if_version: int | None = None) -> bool:
        self.entries = [e for e in self.entries if e[1] != job_id]
        return True

    def finished_jobs(self, before: float, *, limit: int = 1000) -> list[str]:
        return [j for _, j in self.finished_page(before, limit=limit)]


def test_each_call_goes_on_from_the_last_and_never_examines_an_entry_twice() -> None:
    index, walk = Index([f"j{n}" for n in range(7)]), FinishedWalk()
    assert walk.take(index, 5.0, 3, now=0.0) == ["j0", "j1", "j2"]
    assert walk.take(index, 5.0, 3, now=0.0) == ["j3", "j4", "j5"]
    assert walk.take(index, 5.0, 3, now=0.0) == ["j6", "j0", "j1"]  # the end: a new lap from the oldest
    index.delete_job("j2")  # the cursor's next entry gone meanwhile
    assert walk.take(index, 5.0, 10, now=0.0) == ["j3", "j4", "j5", "j6", "j0", "j1"]  # once each, up to its start
    assert walk.take(index, 5.0, 0, now=0.0) == [] and walk.take(index, 0.5, 10, now=0.0) == []


def test_the_sweeps_start_a_new_lap_at_most_once_per_rescan_period() -> None:
    index, walk = Index(["a", "b"]), FinishedWalk()
    assert walk.take(index, 5.0, 10, now=100.0, rescan_after=60) == ["a", "b"]
    assert walk.take(index, 5.0, 10, now=130.0, rescan_after=60) == []  # at the end: only what is new
    index.entries.append((2.0, "c"))
    assert walk.take(index, 5.0, 10, now=140.0, rescan_after=60) == ["c"]
    assert walk.take(index, 5.0, 10, now=160.0, rescan_after=60) == ["a", "b", "c"]  # a lap is over: again
    assert walk.take(index, 5.0, 10, now=100.0, rescan_after=60) == ["a", "b", "c"]  # a clock set back: too

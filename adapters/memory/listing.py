"""The memory storage's listing indexes: job id -> ``updated_at``, kept sorted, so a page costs a page.

A plain dict sorted on every ``list_jobs`` made each page of 100,000 jobs
cost a sort of all of them (and a search reading the listing in batches, one
sort a batch). :class:`SortedIndex` keeps ``(updated_at, job_id)`` pairs in a
sorted list beside the dict: an update is a bisect and a list insert (a
memmove), a page from a cursor a bisect and a slice, like the sorted sets of
Redis and SQLite's index.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

__all__ = ["SortedIndex"]


class SortedIndex:
    """job id -> score, iterable newest (highest score, then id) first from a cursor. Not thread-safe: the
    storage's lock guards it."""

    def __init__(self) -> None:
        self._score: dict[str, float] = {}
        self._sorted: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._score)

    def __setitem__(self, job_id: str, score: float) -> None:
        self.pop(job_id, None)
        self._score[job_id] = score
        bisect.insort(self._sorted, (score, job_id))

    def pop(self, job_id: str, default: float | None = None) -> float | None:
        score = self._score.pop(job_id, None)
        if score is None:
            return default
        at = bisect.bisect_left(self._sorted, (score, job_id))
        del self._sorted[at]
        return score

    def clear(self) -> None:
        self._score.clear()
        self._sorted.clear()

    def newest(self, before: tuple[float, str] | None = None) -> Iterator[str]:
        """Job ids, highest ``(score, id)`` first, only those below ``before``."""
        end = len(self._sorted) if before is None else bisect.bisect_left(self._sorted, before)
        for at in range(end - 1, -1, -1):
            yield self._sorted[at][1]

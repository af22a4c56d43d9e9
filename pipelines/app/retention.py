"""Where retention's walk over the finished index stands, so each sweep goes on from where the last one stopped.

The finished index holds ``(finish time, id)`` entries, oldest first
(:meth:`adapters.base.RetentionStore.finished_page`). Some of the oldest may
be jobs retention keeps for now (a finished child its parent still waits for,
a record that cannot be read): reading the oldest ``limit`` entries on every
sweep would read those same jobs again each time and never reach the jobs
behind them. So :class:`FinishedWalk` keeps a cursor (in this process: each
worker walks on its own; a restart walks again from the oldest). A call
examines at most ``limit`` entries from the cursor on; at the end of the
index it starts again from the oldest entry (a new lap, for the jobs kept
last time), up to where the call began, so no call examines an entry twice
and one call covers the whole index when it holds at most ``limit``. An
on-demand ``gc`` starts a new lap whenever it reaches the end; the sweeps
(every worker, every few seconds) at most once per :data:`RESCAN_EVERY`
seconds, and in between read only the entries after the end (jobs newly
expired): one index read, no record.
"""

from __future__ import annotations

import threading

from adapters.base import FinishedEntry, RetentionStore

__all__ = ["RESCAN_EVERY", "SWEEP_LIMIT", "FinishedWalk"]

RESCAN_EVERY = 60.0
"""Seconds between two laps of the sweeps' walk from the oldest entry (jobs kept last lap are looked at again)."""
SWEEP_LIMIT = 1000
"""How many entries of the finished index one sweep examines at most."""


class FinishedWalk:
    """The cursor of retention's walk over the finished index (see the module doc); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cursor: FinishedEntry | None = None  # the last entry examined; None: start from the oldest
        self._lap_began: float | None = None

    def take(self, store: RetentionStore, before: float, limit: int, *, now: float,
             rescan_after: float = 0.0) -> list[str]:
        """Ids of the next (at most) ``limit`` jobs of the index finished by ``before``, in the walk's order.

        ``now``: the clock the laps are timed by; ``rescan_after``: seconds a lap lasts at least before the
        walk starts again from the oldest entry (0: whenever it reaches the end).
        """
        if limit <= 0:
            return []
        with self._lock:
            start = self.cursor
            if start is None:
                self._lap_began = now
            rows = store.finished_page(before, after=start, limit=limit)
            if rows:
                self.cursor = rows[-1]
            left = limit - len(rows)
            if left and start is not None and self._lap_over(now, rescan_after):
                # The end of the index: a new lap from the oldest entry, up to where this call began.
                self._lap_began = now
                more = [e for e in store.finished_page(before, limit=left) if e <= start]
                if len(more) == left:  # stopped short of where this call began: the next call goes on from there
                    self.cursor = more[-1]
                rows += more
        return [job_id for _, job_id in rows]

    def _lap_over(self, now: float, rescan_after: float) -> bool:
        began = self._lap_began
        return began is None or not 0 <= now - began < rescan_after

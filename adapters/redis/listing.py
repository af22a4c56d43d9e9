"""The index readers of :class:`~adapters.redis.RedisStorage`: due and finished jobs, the listing, counts.

Every reader walks the layout's index sets (one, or one per bucket on Redis
Cluster: :mod:`adapters.redis.keys`) and merges them, so its cost follows
the number of buckets and what it returns, not the number of jobs stored.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import ValidationError

from adapters.base import FinishedEntry, parse_cursor
from adapters.redis.client import _mapped
from adapters.redis.connection import RedisConnection
from adapters.redis.record_format import stored_text
from adapters.redis.records import parse_record
from adapters.redis.values import _batched, _bounded, _listed, _text
from pipelines.engine.errors import CorruptRecordError
from pipelines.engine.models import JobRecord, JobStatus

__all__ = ["IndexReads"]

_BATCH = 200  # records fetched per round trip by list_jobs
_log = logging.getLogger("pipelines")


class IndexReads:
    """Everything that reads an index or many records (a part of :class:`~adapters.redis.RedisStorage`)."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn
        self._warned = False  # once per storage: a listing page would repeat the warning


    def due_jobs(self, now: float, *, limit: int = 1000) -> list[str]:
        """Running jobs with ``due_at <= now``, earliest first (ties by id), via ZRANGEBYSCORE."""
        return self._earliest([ix.due for ix in self.conn.layout.indexes], now, limit, "reading the due index")

    def _earliest(self, keys: Sequence[str], until: float, limit: int, what: str) -> list[str]:
        """The ``limit`` members scored at most ``until`` across ``keys``, lowest score first (ties by id).

        One ZRANGEBYSCORE per key, pipelined: with buckets, each bucket's first
        ``limit`` are merged, so the cost follows what is due, not what is stored.
        """
        if limit <= 0:
            return []
        limit = _bounded(limit)
        self.conn.check_read_layout()
        with _mapped(what):
            if len(keys) == 1:
                return [_text(i) for i in self.conn.client.zrangebyscore(keys[0], "-inf", repr(float(until)),
                                                                    start=0, num=limit)]
            pipe = self.conn.client.pipeline(transaction=False)
            for key in keys:
                pipe.zrangebyscore(key, "-inf", repr(float(until)), start=0, num=limit, withscores=True)
            rows = [(float(score), _text(m)) for reply in pipe.execute() for m, score in reply]
        return [m for _, m in sorted(rows)[:limit]]

    # --- listing -----------------------------------------------------------
    def list_jobs(self, *, status: JobStatus | None = None, limit: int = 1000,
                  before: str | None = None) -> list[JobRecord]:
        """Jobs (optionally in ``status``), newest ``updated_at`` first, read from the listing indexes.

        ``before``: :func:`~adapters.base.page_cursor` of the previous page's
        last job. Only the page's records are read (one ZRANGE, then batches).
        While jobs written before the indexes existed are missing from them
        (:meth:`unindexed`), every record is read instead and a warning names
        ``pipelines reindex``.
        """
        cursor = parse_cursor(before)
        if limit <= 0:
            return []
        if self._needs_scan():
            return self._scan(status, cursor)[:limit]
        position = 0 if status is None else list(JobStatus).index(status) + 1
        size = min(limit, 1000)
        # Each bucket's index newest first, merged: a page reads about `limit` entries per bucket at most.
        rows = heapq.merge(*(self._index_rows(ix.listing[position], cursor, size) for ix in self.conn.layout.indexes),
                           reverse=True)
        out: list[JobRecord] = []
        for ids in _batched((job_id for _, job_id in rows), size):
            out.extend(r for r in self._fetch(ids) if status is None or r.status is status)
            if len(out) >= limit:
                break
        return out[:limit]

    def count_jobs(self, status: JobStatus | None = None) -> int:
        """How many jobs (in ``status``): ZCARD of a listing index (reads every record until :meth:`reindex`)."""
        if self._needs_scan():
            return len(self._scan(status, None))
        position = 0 if status is None else list(JobStatus).index(status) + 1
        with _mapped("counting jobs"):
            pipe = self.conn.client.pipeline(transaction=False)
            for ix in self.conn.layout.indexes:
                pipe.zcard(ix.listing[position])
            return sum(int(n) for n in pipe.execute())

    def unindexed(self) -> int:
        """About how many jobs are missing from the listing indexes (written before they existed): SCARD - ZCARD."""
        with _mapped("reading the listing index"):
            pipe = self.conn.client.pipeline(transaction=False)
            for ix in self.conn.layout.indexes:
                pipe.scard(ix.jobs)
                pipe.zcard(ix.listing[0])
            counts = [int(n) for n in pipe.execute()]
        return max(0, sum(counts[::2]) - sum(counts[1::2]))

    def _needs_scan(self) -> bool:
        self.conn.check_read_layout()
        missing = self.unindexed()
        if missing and not self._warned:
            self._warned = True
            _log.warning("%d jobs are not in the listing index (written before it existed): listings read every "
                         "record until `pipelines reindex --app MODULE:APP` (RedisStorage.reindex) runs", missing)
        return missing > 0

    def _index_rows(self, key: str, cursor: tuple[float, str] | None, size: int) -> Iterator[tuple[float, str]]:
        """(score, id) of index ``key`` newest first, after ``cursor``, read ``size`` per round trip."""
        top, offset = ("+inf" if cursor is None else repr(cursor[0])), 0
        while True:
            with _mapped("reading the listing index"):
                rows: list[Any] = self.conn.client.zrevrangebyscore(key, top, "-inf", start=offset, num=size,
                                                               withscores=True)
            offset += len(rows)
            # Same-score entries come in reverse id order: those at or above the cursor's id were listed.
            for m, score in rows:
                row = (float(score), _text(m))
                if cursor is None or row < cursor:
                    yield row
            if len(rows) < size:
                return

    def _scan(self, status: JobStatus | None, cursor: tuple[float, str] | None) -> list[JobRecord]:
        """Every record (in ``status``, after ``cursor``), newest first: the listing without its index."""
        with _mapped("listing jobs"):
            client = self.conn.client
            ids = [_text(i) for ix in self.conn.layout.indexes for i in client.sscan_iter(ix.jobs, count=1000)]
        found = [r for r in self._fetch(ids) if (status is None or r.status is status)
                 and (cursor is None or (r.updated_at, r.job_id) < cursor)]
        return sorted(found, key=lambda r: (r.updated_at, r.job_id), reverse=True)

    def _fetch(self, ids: Sequence[str]) -> list[JobRecord]:
        """The records of ``ids`` in that order, ``_BATCH`` per round trip; gone or unreadable ones skipped."""
        out: list[JobRecord] = []
        for i in range(0, len(ids), _BATCH):
            batch = ids[i : i + _BATCH]
            with _mapped("listing jobs"):
                pipe = self.conn.client.pipeline(transaction=False)
                for job_id in batch:
                    k = self.conn.keys(job_id)
                    pipe.hmget(k.record, ["data", "jver", "control", "hist", "base", "dx"])
                    pipe.hgetall(k.journal)
                replies = pipe.execute()
            for n, job_id in enumerate(batch):
                (data, jver, control, hist, base, dx), journal = replies[2 * n], replies[2 * n + 1]
                data = stored_text(data, base, dx)  # either record format (adapters.redis.record_format)
                if data is None:
                    continue  # deleted since the index was read
                pairs = [x for kv in journal.items() for x in kv]
                try:
                    out.append(parse_record(job_id, data, "" if jver is None else jver, pairs, control, hist))
                except CorruptRecordError as exc:
                    # A listing shows the rest; the bad one is named in the log.
                    _log.error("job %s: unreadable record skipped: %s", job_id, exc)
        return out

    def reindex(self, *, batch: int = 500) -> int:
        """Put every job in the listing indexes and drop entries of jobs gone; how many jobs were indexed.

        For jobs written before the indexes existed (``pipelines reindex``).
        Safe while workers run: a job is indexed only if its version is still
        the one read (a commit since then indexed it itself). Run it once every
        worker runs a version that maintains the indexes.
        """
        ids: set[str] = set()
        with _mapped("reindexing jobs"):
            for ix in self.conn.layout.indexes:
                found = _text(self.conn.client.type(ix.listing[0]))
                if found not in ("none", "zset"):  # ZSCAN would fail on it: named like the scripts' refusals
                    raise CorruptRecordError(f"reindexing jobs: key {ix.listing[0]!r} (updated) is a Redis "
                                             f"{found}, expected a zset (WRONGTYPE); nothing was written")
                ids.update(_text(i) for i in self.conn.client.sscan_iter(ix.jobs, count=1000))
                ids.update(_text(m) for m, _ in self.conn.client.zscan_iter(ix.listing[0], count=1000))
        ordered, done = sorted(ids), 0
        for i in range(0, len(ordered), max(1, batch)):
            done += self._reindex_batch(ordered[i : i + max(1, batch)])
        self._warned = False
        return done

    def _reindex_batch(self, ids: Sequence[str]) -> int:
        with _mapped("reindexing jobs"):
            pipe = self.conn.client.pipeline(transaction=False)
            for job_id in ids:
                pipe.hmget(self.conn.keys(job_id).record, ["data", "version", "base", "dx"])
            rows = [(stored_text(data, base, dx), version) for data, version, base, dx in pipe.execute()]
            # A cluster pipeline cannot carry EVALSHA, so there each script is its own round trip (a rare tool).
            pipe = None if self.conn.cluster else self.conn.client.pipeline(transaction=False)
            replies: list[Any] = []
            sent: list[str] = []  # the jobs whose script was run, in the order of replies
            for job_id, (data, version) in zip(ids, rows, strict=True):
                try:
                    place = [] if data is None else _listed(JobRecord.model_validate_json(data))
                except ValidationError as exc:
                    _log.error("job %s: unreadable record not indexed: %s", job_id, exc)
                    continue
                args = [job_id, "" if version is None else _text(version), *(place or ["0", "0"])]
                keys = [self.conn.keys(job_id).record, *self.conn.layout.indexes_of(job_id).listing]
                replies.append(self.conn.scripts.reindex(keys=keys, args=args, client=pipe or self.conn.client))
                sent.append(job_id)
            if pipe is not None:
                replies = pipe.execute()
        for job_id, reply in zip(sent, replies, strict=True):
            self.conn.check_types(job_id, reply, f"reindexing job {job_id!r}")
        return sum(1 for r in replies if _text(r) == "ok")

    def finished_jobs(self, before: float, *, limit: int = 1000) -> list[str]:
        """Ids of jobs that finished (complete, error, cancelled) at or before ``before``, oldest first.

        Read from the finished index the commits keep; jobs that finished
        before that index existed are not in it (``App.gc(scan=True)`` finds them).
        """
        return self._earliest([ix.finished for ix in self.conn.layout.indexes], before, limit,
                              "reading the finished index")

    def finished_page(self, before: float, *, after: FinishedEntry | None = None,
                      limit: int = 1000) -> list[FinishedEntry]:
        """``(finish time, id)`` of jobs finished by ``before``, oldest first (ties: id), after the cursor ``after``.

        Each bucket's finished index from the cursor's score up, merged; the
        entries tied with the cursor's score at or below its id are read and
        passed over (as :meth:`list_jobs` does), so a page costs a page.
        """
        if limit <= 0:
            return []
        limit = _bounded(limit)
        self.conn.check_read_layout()
        size = min(limit, 1000)
        rows = heapq.merge(*(self._rows_after(ix.finished, after, before, size) for ix in self.conn.layout.indexes))
        return list(itertools.islice(rows, limit))

    def _rows_after(self, key: str, cursor: FinishedEntry | None, until: float,
                    size: int) -> Iterator[FinishedEntry]:
        """(score, id) of index ``key`` scored at most ``until``, lowest first, after ``cursor``, ``size`` a read."""
        low, offset = ("-inf" if cursor is None else repr(float(cursor[0]))), 0
        while True:
            with _mapped("reading the finished index"):
                rows: list[Any] = self.conn.client.zrangebyscore(key, low, repr(float(until)), start=offset,
                                                                 num=size, withscores=True)
            offset += len(rows)
            for m, score in rows:  # same-score entries come in id order: those up to the cursor's were read
                row = (float(score), _text(m))
                if cursor is None or row > cursor:
                    yield row
            if len(rows) < size:
                return

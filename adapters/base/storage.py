"""The whole storage port, and the storage capabilities beyond it (retention, flow state, a schema)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol, runtime_checkable

from adapters.base.read import LiveStore, ReadStore
from adapters.base.run import RunStore

__all__ = ["Storage", "FinishedEntry", "RetentionStore", "FlowCapable", "FlowStore", "VersionedSchema", "ClaimingStore",
           "KeyPrefixed"]


@runtime_checkable
class Storage(RunStore, ReadStore, LiveStore, Protocol):
    """Where jobs, transcripts, logs, journals and leases live: the engine's port and the readers' together."""


FinishedEntry = tuple[float, str]
"""An entry of the finished index: ``(finish time, job id)``, the index's order (a finish time's ties by id)."""


@runtime_checkable
class RetentionStore(Protocol):
    """What retention needs beyond the port (memory, SQLite and Redis have it): a delete fenced on the version, the
    index of finished jobs and a page of it after a cursor."""

    def delete_job(self, job_id: str, *, if_version: int | None = None) -> bool:
        """Delete the job and everything it stored if it is at ``if_version`` (``StaleVersionError`` if not)."""
        ...

    def finished_jobs(self, before: float, *, limit: int = 1000) -> list[str]:
        """Ids of jobs that finished (complete, error, cancelled) at or before ``before``, oldest first."""
        ...

    def finished_page(self, before: float, *, after: FinishedEntry | None = None,
                      limit: int = 1000) -> list[FinishedEntry]:
        """The entries of up to ``limit`` jobs finished at or before ``before``, oldest first, only those after
        ``after`` (an entry, of a job that may be gone): retention pages on with it past jobs it keeps."""
        ...


@runtime_checkable
class FlowCapable(Protocol):
    """A storage that keeps flow-control state itself (memory and Redis do): the App uses it by default."""

    def flow_store(self) -> FlowStore:
        """The :class:`FlowStore` sharing this storage (and its clock or server)."""
        ...


@runtime_checkable
class FlowStore(Protocol):
    """Shared flow-control state (:mod:`pipelines.engine.flow`): rate buckets and concurrency slots.

    Every method is one atomic check-and-take; none ever waits. A refusal is
    the number of seconds after which trying again makes sense. ``now`` is the
    caller's clock (the memory twin's; Redis uses its own, one for all workers).
    """

    def take_rate(self, model: str, *, rpm: float | None, tpm: float | None, burst: float, tokens: int,
                  now: float) -> float:
        """Take one request and ``tokens`` from ``model``'s bucket: 0 when granted, else seconds to wait."""
        ...

    def adjust_rate(self, model: str, tokens: int) -> None:
        """Take ``tokens`` more (or give back, when negative) from ``model``'s token bucket."""
        ...

    def block_rate(self, model: str, seconds: float, *, now: float) -> None:
        """Refuse every take of ``model`` for ``seconds`` (a provider's 429 with Retry-After)."""
        ...

    def take_slot(self, key: str, member: str, *, limit: int, ttl: float, now: float) -> float:
        """Hold one of ``limit`` slots of ``key`` for ``ttl`` seconds: 0 when held, else seconds to wait.

        ``member``: ``"<job id>"`` or ``"<job id> <owner>"``. Slots go to jobs in the order they asked: a
        refused job waits in the key's line (for ``LINE_SECONDS`` from its last ask), and a free slot
        goes to a job only if fewer jobs wait ahead of it than slots are free (see
        :func:`adapters.memory.flow.take_in_line`, the rules every store follows)."""
        ...

    def renew_slot(self, key: str, member: str, *, ttl: float, now: float) -> bool:
        """Extend ``member``'s live slot of ``key`` to ``ttl`` seconds from now; ``False`` (nothing written) if
        it holds none (released, or run out: a slot is never taken back past the limit here)."""
        ...

    def release_slot(self, key: str, member: str) -> str | None:
        """Give ``member``'s slot of ``key`` back (a no-op if it holds none); the job first in the key's line
        now, if any (the caller wakes it: a slot freed is taken at once, not when the job next asks)."""
        ...


@runtime_checkable
class VersionedSchema(Protocol):
    """A storage whose file keeps a schema version (SQLite): ``pipelines migrate`` upgrades it in place."""

    path: str  # where the data lives (a file's absolute path)

    def migrate(self) -> tuple[int, int]:
        """Upgrade the schema to this library's version; ``(before, after)``."""
        ...


@runtime_checkable
class ClaimingStore(Protocol):
    """A storage that hands out due work to one claimer at a time and knows this machine's processes (SQLite).

    What :class:`~adapters.local.LocalScheduler` reads due work from, so several processes on one file share it.
    """

    def claim_due(self, cut: float, *, limit: int, hold: float, pipelines: Collection[str] | None = None) -> list[str]:
        """Ids of up to ``limit`` running jobs due at or before ``cut``, kept off other claimers for ``hold`` s.

        ``pipelines``: only jobs of these pipelines (``None``: any), so that a process claims only work it
        can run and leaves the rest to the processes on the same file that can.
        """
        ...

    def reap_dead_processes(self) -> int:
        """Release the leases and claims of this machine's processes that are gone; how many processes live."""
        ...


@runtime_checkable
class KeyPrefixed(Protocol):
    """A storage whose every key starts with a prefix (Redis): queue message ids carry it, so two apps on one
    broker never share an id."""

    def key_prefix(self) -> str:
        """The prefix of every key this storage writes."""
        ...

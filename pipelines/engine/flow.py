"""Flow control across workers: shared model rate limits, concurrency keys, priorities.

Everything here is a decision taken before work starts, never a wait: a turn
that cannot get capacity is rescheduled for when it can (the runner's
deferral, no commit, no sleep), so a worker always moves on to other work.

* **Rate limits** (:class:`RateLimit`): a token bucket per model, requests and
  tokens, shared by every worker through the :class:`~adapters.base.FlowStore`
  (one atomic check-and-take). A take that would overdraw says how long to
  wait; the agent turn raises :class:`FlowDeferred` with that delay before it
  calls the model. Real usage corrects the token estimate afterwards; a 429
  with Retry-After blocks the model's bucket for that long, for every worker.
* **Concurrency keys**: a run's ``concurrency_key`` (per run, or a function
  of the run evaluated at start) and ``App(concurrency={prefix or "*": n})``
  allow at most ``n`` turns of jobs with that key at once. A turn holds a
  leased slot (member = job, expiry = now + 1.5 x lease), so a killed
  worker's slot comes back when its lease expires. Slots go to jobs in the
  order they asked: a refused job waits in the key's line, and a job that
  just gave its slot back (its next turn queued at once, or kept by
  ``continue_for``) goes to the back of it, so one busy conversation cannot
  keep the others of its key waiting.
* **Priorities**: ``priority="interactive" | "background"`` per run selects
  the queue its advances go to (see :mod:`adapters.rq.priority`).

Two rules hold everything here:

* **Whatever lives with a lease is renewed with it and released with it.**
  A concurrency slot is attached to the job's lease in the lease keeper
  (:meth:`~pipelines.engine.leases.LeaseKeeper.attach`): each renewal of the
  lease renews the slot (a tool may run far longer than the slot's first
  expiry), and a lease found lost releases the slot at once (the turn is
  fenced off; its slot must not keep another job waiting).
* **Every number from outside is bounded before use.** Limits are checked
  when the App is built (finite, positive, below the ``MAX_*`` constants,
  never a bool); a provider's Retry-After is cut to
  :data:`~pipelines.engine.errors.MAX_RETRY_AFTER_SECONDS`; a reported usage
  to :data:`MAX_CALL_TOKENS`; a store's answer to :data:`MAX_WAIT_SECONDS`.
  An endless number would block a model or a key for ever, for every job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipelines.engine.capabilities import lateness_of
from pipelines.engine.errors import MAX_RETRY_AFTER_SECONDS, InvalidInputError, bound_retry_after
from pipelines.engine.leases import LEASE_KEEPER
from pipelines.engine.phase.outcomes import RetryLater

if TYPE_CHECKING:
    from adapters.base import FlowStore, Scheduler
    from pipelines.engine.models import JobRecord

__all__ = [
    "CONCURRENCY_RETRY_SECONDS",
    "FRONT_RETRY_SECONDS",
    "LINE_SECONDS",
    "MAX_CALL_TOKENS",
    "MAX_CONCURRENCY",
    "MAX_RATE_PER_MINUTE",
    "MAX_SLOT_SECONDS",
    "MAX_WAIT_SECONDS",
    "PRIORITIES",
    "FlowControl",
    "FlowDeferred",
    "RateLimit",
    "bucket_sizes",
    "priority_of",
    "with_priority",
]

PRIORITIES = ("interactive", "background")
"""Run priorities, highest first. ``interactive`` is the default."""

CONCURRENCY_RETRY_SECONDS = 2.0
"""Longest wait before a turn refused a concurrency slot tries again (slots usually free sooner than they
expire): how often a job far back in the key's line asks, often enough to keep its place
(:data:`LINE_SECONDS`) through a queue's delay, rarely enough that a long line costs its store little."""

LINE_SECONDS = 5.0
"""How long a job refused a concurrency slot keeps its place in the key's line without asking again.

A refused job asks again within :data:`CONCURRENCY_RETRY_SECONDS` (plus its queue's delay); one that
stopped asking (deleted, cancelled) holds free slots back from the jobs behind it at most this long."""

FRONT_RETRY_SECONDS = 0.5
"""When a job among the first ``limit`` of the line asks again: a freed slot waits at most this long for it."""

MAX_RATE_PER_MINUTE = 1e9
"""The largest ``rpm`` / ``tpm`` a :class:`RateLimit` takes (beyond any provider's; larger is a typo)."""

MAX_CONCURRENCY = 1_000_000
"""The largest concurrency limit a key takes."""

MAX_SLOT_SECONDS = 7 * 86400.0
"""The longest a concurrency slot may be leased for (``1.5 x lease_seconds`` in an App)."""

MAX_CALL_TOKENS = 100_000_000
"""The most tokens one call's reported usage counts for when it corrects a budget."""

MAX_WAIT_SECONDS = MAX_RETRY_AFTER_SECONDS
"""The longest flow control defers a turn at once (it looks again then): a store's answer is cut to it."""


class FlowDeferred(RetryLater):
    """Raised before any work when flow control refuses a turn: run the same turn after ``delay``.

    Unlike a plain :class:`RetryLater` the runner commits nothing (no attempt
    is spent, no version used): it reschedules the advance and moves on.
    """


@dataclass(frozen=True)
class RateLimit:
    """A shared budget for one model across every worker: ``rpm`` requests and/or ``tpm`` tokens a minute.

    ``burst``: seconds of budget that may be spent at once (default 1 s, so
    the call rate stays close to the limit over any window).
    """

    model: str
    rpm: float | None = None
    tpm: float | None = None
    burst: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise InvalidInputError(f"RateLimit.model must be a non-empty model string, got {self.model!r}")
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and not _in_range(value, MAX_RATE_PER_MINUTE):
                raise InvalidInputError(f"RateLimit.{name} must be a positive number of at most "
                                        f"{MAX_RATE_PER_MINUTE:g} (a minute's budget) or None, got {value!r}")
        if self.rpm is None and self.tpm is None:
            raise InvalidInputError(f"RateLimit for {self.model!r} needs rpm= or tpm=")
        if not _in_range(self.burst, 60):
            raise InvalidInputError(f"RateLimit.burst must be seconds in (0, 60], got {self.burst!r}")



def _in_range(value: object, top: float) -> bool:
    """Whether ``value`` is a real number (not a bool) in ``(0, top]``: NaN, inf and negatives are not."""
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 < value <= top


def check_block_seconds(seconds: object) -> float:
    """A block of a model's bucket (a store's ``block_rate``): seconds in ``(0, MAX_RETRY_AFTER_SECONDS]``."""
    if not _in_range(seconds, MAX_RETRY_AFTER_SECONDS):
        raise InvalidInputError(f"a model's block must be seconds in (0, {MAX_RETRY_AFTER_SECONDS:g}], "
                                f"got {seconds!r}; nothing was written")
    return float(seconds)  # type: ignore[arg-type]


def check_slot_ttl(ttl: object) -> float:
    """A concurrency slot's lease (a store's ``take_slot`` / ``renew_slot``): seconds in ``(0, MAX_SLOT_SECONDS]``."""
    if not _in_range(ttl, MAX_SLOT_SECONDS):
        raise InvalidInputError(f"a concurrency slot's ttl must be seconds in (0, {MAX_SLOT_SECONDS:g}], "
                                f"got {ttl!r}; nothing was written")
    return float(ttl)  # type: ignore[arg-type]


def check_slot_member(member: object) -> str:
    """A slot's holder (a store's ``take_slot``): ``"<job id>"`` or ``"<job id> <owner>"``, never a line entry."""
    if not isinstance(member, str) or not member or member[0] in "?! ":
        raise InvalidInputError(f"a concurrency slot's member must be '<job id>[ <owner>]', got {member!r:.80}; "
                                "nothing was written")
    return member


def bounded_wait(value: float) -> float:
    """A store's "seconds to wait" as a delay to defer by: within ``[0, MAX_WAIT_SECONDS]`` (NaN: 0)."""
    return min(value, MAX_WAIT_SECONDS) if value > 0 else 0.0


@dataclass(frozen=True)
class _Slot:
    """A concurrency slot held by a turn: a lease companion (renewed and released with the job's lease)."""

    store: FlowStore
    key: str
    member: str
    ttl: float
    clock: Callable[[], float]

    def renew(self) -> bool:
        return self.store.renew_slot(self.key, self.member, ttl=self.ttl, now=self.clock())

    def release(self) -> None:
        self.give_back()

    def give_back(self) -> str | None:
        """Release the slot; the job first in the key's line, to wake (``None``: none, or a store of old)."""
        first = self.store.release_slot(self.key, self.member)
        return first if isinstance(first, str) and first else None


def bucket_sizes(rpm: float | None, tpm: float | None, burst: float) -> tuple[float, float]:
    """Bucket sizes ``(requests, tokens)``: ``burst`` seconds of each rate (at least one request / token)."""
    req = max(1.0, rpm * burst / 60.0) if rpm else 0.0
    tok = max(1.0, tpm * burst / 60.0) if tpm else 0.0
    return req, tok


def priority_of(record: JobRecord) -> str:
    """The run's priority as stored in its options (``interactive`` when unset)."""
    value = record.options.get("priority")
    return value if isinstance(value, str) and value in PRIORITIES else PRIORITIES[0]


def check_priority(value: object) -> str:
    """``value`` if it is a known priority; :class:`InvalidInputError` naming the choices otherwise."""
    if value not in PRIORITIES:
        raise InvalidInputError(f"priority must be one of {', '.join(PRIORITIES)}, got {value!r}")
    return str(value)


class _PriorityScheduler:
    """A scheduler that sends every advance it is asked for with one run's priority."""

    def __init__(self, inner: Scheduler, priority: str) -> None:
        self.inner = inner
        self.priority = priority
        self.precision = inner.precision

    def lateness(self) -> float:
        return lateness_of(self.inner)

    def now(self) -> float:
        return self.inner.now()

    def schedule_advance(self, job_id: str, delay: float = 0.0, *, pipeline: str = "default",
                         version: int | None = None, priority: str | None = None) -> None:
        self.inner.schedule_advance(job_id, delay, pipeline=pipeline, version=version,
                                    priority=priority or self.priority)

    def requeue(self, job_id: str, *, pipeline: str = "default", version: int | None = None,
                priority: str | None = None) -> bool | None:
        return self.inner.requeue(job_id, pipeline=pipeline, version=version, priority=priority or self.priority)

    def work_waiting(self, priority: str | None = None) -> bool:
        waiting = getattr(self.inner, "work_waiting", None)
        return bool(waiting(priority or self.priority)) if callable(waiting) else False

    def probe_work_waiting(self, priority: str | None = None) -> Callable[[], bool]:
        probe = getattr(self.inner, "probe_work_waiting", None)
        if callable(probe):
            answer: Callable[[], bool] = probe(priority or self.priority)
            return answer
        waiting = self.work_waiting(priority)  # the inner scheduler cannot defer the question: asked now
        return lambda: waiting


def with_priority(scheduler: Scheduler, priority: str) -> Scheduler:
    """``scheduler`` sending advances with ``priority``: itself for the default (interactive) one.

    A scheduler that sends with another run's priority is unwrapped first: the priority given here wins."""
    scheduler = scheduler.inner if isinstance(scheduler, _PriorityScheduler) else scheduler
    if priority == PRIORITIES[0]:
        return scheduler
    return _PriorityScheduler(scheduler, priority)


class FlowControl:
    """The App's flow-control settings bound to a :class:`~adapters.base.FlowStore` (shared state).

    ``clock``: the App scheduler's (the memory twin's is virtual); ``slot_seconds``:
    a concurrency slot's lease, after which a dead worker's slot is free again.
    """

    def __init__(self, store: FlowStore | None, *, rate_limits: Sequence[RateLimit] = (),
                 concurrency: Mapping[str, int] | None = None, slot_seconds: float = 60.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.storage_default = False  #: the store is the storage's own (App(flow_store=...) named none)
        self.clock = clock
        self.limits: dict[str, RateLimit] = {}
        for limit in rate_limits:
            if not isinstance(limit, RateLimit):
                raise InvalidInputError(f"rate_limits must be RateLimit objects, got {type(limit).__name__}")
            if limit.model in self.limits:
                raise InvalidInputError(f"two rate limits for model {limit.model!r}")
            self.limits[limit.model] = limit
        self.concurrency = _check_concurrency(concurrency or {})
        if self.concurrency and not _in_range(slot_seconds, MAX_SLOT_SECONDS):  # unused without concurrency
            raise InvalidInputError(f"a concurrency slot's lease (1.5 x lease_seconds) must be seconds in "
                                    f"(0, {MAX_SLOT_SECONDS:g}], got {slot_seconds!r}")
        self.slot_seconds = float(slot_seconds)
        if (self.limits or self.concurrency) and store is None:
            raise InvalidInputError("rate_limits / concurrency need a storage with flow_store() "
                                    "(MemoryStorage, RedisStorage) or App(flow_store=...)")

    @property
    def enabled(self) -> bool:
        return bool(self.limits or self.concurrency)

    def limit_for(self, key: str | None) -> int | None:
        """The concurrency limit of ``key``: the longest matching prefix, else ``"*"``, else none."""
        if key is None:
            return None
        best = max((p for p in self.concurrency if p != "*" and key.startswith(p)), key=len, default=None)
        return self.concurrency[best] if best is not None else self.concurrency.get("*")

    # --- concurrency slots (the runner, around each turn) -----------------------------------
    def enter_turn(self, record: JobRecord, now: float, *, lease: int | None = None, owner: str | None = None) -> float:
        """Take a slot of the run's concurrency key; 0 when granted, else seconds to wait.

        ``lease``: the job's lease in :data:`~pipelines.engine.leases.LEASE_KEEPER`
        (the runner's); a granted slot is renewed and released with it. ``owner``: the
        lease's owner, whose slot it is (see :meth:`_slot_of`).
        """
        slot = self._slot_of(record, owner)
        if slot is None:
            return 0.0
        limit = self.limit_for(slot.key)
        assert limit is not None and self.store is not None  # _slot_of found both
        wait = bounded_wait(self.store.take_slot(slot.key, slot.member, limit=limit, ttl=slot.ttl, now=now))
        if wait > 0:
            return min(wait, CONCURRENCY_RETRY_SECONDS)
        if lease is not None:
            LEASE_KEEPER.attach(lease, slot)
        return 0.0

    def leave_turn(self, record: JobRecord, *, lease: int | None = None, owner: str | None = None) -> str | None:
        """Give the slot back (a no-op for a run without a limited key); it no longer follows ``lease``.

        Returns the job first in the key's line, for the caller to wake: its own retry may be a second away
        (a queue's delayed message), and the slot would stand idle that long; ``None`` when none waits.
        """
        slot = self._slot_of(record, owner)
        if slot is None:
            return None
        if lease is not None:
            LEASE_KEEPER.detach(lease, slot)  # before the release: a late renewal finds no slot to extend
        return slot.give_back()  # (this job's own, when a stalled turn's new owner waits for its slot)

    def _slot_of(self, record: JobRecord, owner: str | None) -> _Slot | None:
        """The slot a turn of ``record`` holds under ``owner``'s lease, or ``None`` when its key has no limit.

        Held in the owner's name, not the job's: a worker that stalled past its lease, whose job another
        worker took over, may still be running its turn, so it keeps counting until it gives its own slot
        back (or the slot runs out), and then gives back only its own, never the new holder's.
        """
        key = _key_of(record)
        if key is None or self.limit_for(key) is None or self.store is None:
            return None
        member = record.job_id if owner is None else f"{record.job_id} {owner}"
        return _Slot(self.store, key, member, self.slot_seconds, self.clock)

    # --- rate limits (the agent turn, around the model call) -------------------------------
    def before_call(self, model: str, tokens: int, now: float) -> float:
        """Take one request and ``tokens`` from ``model``'s budget; 0 when granted, else seconds to wait."""
        limit = self.limits.get(model)
        if limit is None or self.store is None:
            return 0.0
        tokens = min(max(0, tokens), MAX_CALL_TOKENS)
        return bounded_wait(self.store.take_rate(model, rpm=limit.rpm, tpm=limit.tpm, burst=limit.burst,
                                                 tokens=tokens, now=now))

    def after_call(self, model: str, estimated: int, used: int) -> None:
        """Correct the token budget with what the call really used (``used - estimated`` more, or back).

        ``used`` is the provider's number: it counts for at most :data:`MAX_CALL_TOKENS`.
        """
        limit = self.limits.get(model)
        if isinstance(used, bool) or not isinstance(used, int):
            return  # no usable count (a provider's null or float): the estimate stands
        used = min(used, MAX_CALL_TOKENS)
        if limit is not None and limit.tpm and self.store is not None and used > 0 and used != estimated:
            self.store.adjust_rate(model, used - estimated)

    def throttled(self, model: str, seconds: float, now: float) -> None:
        """The provider said 429 with Retry-After: no worker calls ``model`` for ``seconds``.

        At most :data:`~pipelines.engine.errors.MAX_RETRY_AFTER_SECONDS`: an endless hint is an hour.
        """
        bounded = bound_retry_after(seconds)
        if model in self.limits and self.store is not None and bounded is not None and bounded > 0:
            self.store.block_rate(model, bounded, now=now)


def _key_of(record: JobRecord) -> str | None:
    value = record.options.get("concurrency_key")
    return value if isinstance(value, str) and value else None


def _check_concurrency(concurrency: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(concurrency, Mapping):
        raise InvalidInputError(f"concurrency must be a mapping of key prefix -> limit, got "
                                f"{type(concurrency).__name__}")
    for prefix, limit in concurrency.items():
        if not isinstance(prefix, str) or not prefix:
            raise InvalidInputError(f"concurrency keys must be non-empty key prefixes or '*', got {prefix!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CONCURRENCY:
            raise InvalidInputError(f"concurrency limit for {prefix!r} must be an int in [1, {MAX_CONCURRENCY}], "
                                    f"got {limit!r}")
    return dict(concurrency)

"""Versioned jobs: which code version last wrote a job, migrations of older jobs, and newer jobs left alone.

A pipeline (or agent) declares ``version="2"`` (dotted numbers: ``"1.10"`` is
newer than ``"1.9"``) and ``migrations={"1": fn}``: ``fn(state)`` returns the
state as version 2 expects it. When a worker loads a job that an older
version wrote, it applies every migration from the job's version up, in
order, to the state the turn starts from; the turn's commit writes the new
state and the new version together, so a migration is applied once (a turn
that crashes before its commit migrates again from the same stored state:
migrations must be pure functions of the state). A job written by a newer
version than the worker's is not touched: the worker logs why and asks for
the job again later, with backoff, for a newer worker to take.

An agent's ``view_migrations={"1": fn(messages)}`` upgrade the messages its
model sees in the same turn; the runner tells the turn what it migrates from
(:class:`Migrating`, ``PhaseContext.migrating``) and :mod:`phases.view_migration`
records the new view in the transcript (see there).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple

from pipelines.engine.contain import contained, describe
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import JobRecord, dump_json, to_json_value

__all__ = [
    "MAX_DEFER_SECONDS",
    "Admission",
    "Migrating",
    "admit",
    "check_migrations",
    "check_version",
    "is_version",
    "pending",
    "stamp",
    "version_key",
]

logger = logging.getLogger("pipelines.versions")

_VERSION: Final = re.compile(r"\d{1,9}(\.\d{1,9}){0,7}")
MAX_DEFER_SECONDS: Final = 600.0
"""The longest a worker waits before asking again for a job a newer version wrote."""
_FIRST_DEFER: Final = 5.0

Migration = Callable[[Any], Any]


def is_version(value: object) -> bool:
    """Whether ``value`` is a version string (dotted numbers)."""
    return isinstance(value, str) and _VERSION.fullmatch(value) is not None


def check_version(value: object, what: str = "version") -> str | None:
    """``value`` as a version (an int becomes its string), ``None`` as is; else :class:`InvalidInputError`."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        value = str(value)
    if not is_version(value):
        raise InvalidInputError(f"{what} must be dotted numbers like '3' or '1.2', got {value!r}")
    assert isinstance(value, str)
    return value


def version_key(version: str) -> tuple[int, ...]:
    """The order of versions: ``"1.10"`` after ``"1.9"``, ``"2"`` equal to ``"2.0"``."""
    parts = [int(p) for p in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def check_migrations(migrations: object, version: str | None, *, of: str = "the state",
                     name: str = "migrations") -> dict[str, Migration]:
    """``{from_version: fn}`` checked: versions valid and older than ``version``, functions callable.

    ``of`` and ``name`` word the errors (``view_migrations`` are functions of the messages).
    """
    if migrations is None:
        return {}
    if not isinstance(migrations, Mapping):
        raise InvalidInputError(f"{name} must be a dict {{from_version: function}}, "
                                f"got {type(migrations).__name__}")
    if migrations and version is None:
        raise InvalidInputError(f"{name} need a version= to migrate to")
    checked: dict[str, Migration] = {}
    for old, fn in migrations.items():
        key = check_version(old, "a migration's from_version")
        assert key is not None and version is not None
        if version_key(key) >= version_key(version):
            raise InvalidInputError(f"migration from {key!r} is not older than version {version!r}")
        if not callable(fn):
            raise InvalidInputError(f"migration from {key!r} must be a function of {of}")
        checked[key] = fn
    return dict(sorted(checked.items(), key=lambda kv: version_key(kv[0])))


def stamp(record: JobRecord, version: str | None, *, new: bool = False, run: bool = False) -> JobRecord:
    """``record`` marked as written by ``version`` (unchanged when the pipeline has none).

    ``new``: a job this code just created; its latest turn mark (where a fork at that turn
    starts) is this version's too. ``run`` (implied by ``new``): a run this code just started
    (created or continued), which a full retry goes back to.
    """
    if version is None:
        return record
    update: dict[str, Any] = {"code_version": version}
    if new or run:
        update["run_code_version"] = version
    if new and record.history:
        update["history"] = [*record.history[:-1], record.history[-1].model_copy(update={"code_version": version})]
    return record.model_copy(update=update)


def pending(migrations: Mapping[str, Migration], stored: str | None,
            upto: str | None = None) -> list[tuple[str, Migration]]:
    """The migrations a job written by ``stored`` goes through, in order (all for a job from before versions).

    ``upto``: only those older than it (what a worker of that version knows).
    """
    return [(old, fn) for old, fn in migrations.items()
            if (stored is None or version_key(old) >= version_key(stored))
            and (upto is None or version_key(old) < version_key(upto))]


class Migrating(NamedTuple):
    """A turn that upgrades its job: written by ``from_version`` (``None``: before versions), run by ``to_version``."""

    from_version: str | None
    to_version: str


class Admission(NamedTuple):
    """What a worker does with a job it loaded: run ``record`` (migrated), wait ``delay`` seconds, or fail.

    ``migrating`` says what the turn upgrades from, when the job was older than the worker.
    """

    record: JobRecord
    delay: float = 0.0
    error: str | None = None
    migrating: Migrating | None = None


_deferrals: dict[str, int] = {}  # job id -> deferrals in a row (this process's backoff)
_lock = threading.Lock()


def _backoff(job_id: str) -> float:
    with _lock:
        n = _deferrals.get(job_id, 0)
        if len(_deferrals) > 10_000:
            _deferrals.clear()  # bounded: a backoff that restarts is harmless
        _deferrals[job_id] = n + 1
    return float(min(MAX_DEFER_SECONDS, _FIRST_DEFER * 2 ** min(n, 20)))


def admit(record: JobRecord, version: str | None, migrations: Mapping[str, Migration]) -> Admission:
    """Whether a worker of ``version`` may run ``record``'s turn, and with which state (see the module doc)."""
    stored = record.code_version
    if stored == version or (version is None and stored is None):
        return Admission(record)
    # A worker without a version is older than every versioned one (as a job without one is): it leaves a
    # versioned job alone, rather than running its code on a state a newer one wrote or migrated.
    if stored is not None and (version is None or version_key(stored) > version_key(version)):
        delay = _backoff(record.job_id)
        logger.warning("job %s was written by version %s, newer than this worker's %s: not touched, asked for "
                       "again in %.0fs (run a worker of version %s or newer)", record.job_id, stored, version, delay,
                       stored)
        return Admission(record, delay=delay)
    assert version is not None  # a worker without one ran the job above, or left it
    with _lock:
        _deferrals.pop(record.job_id, None)
    cp = record.checkpoint
    migrating = Migrating(stored, version)
    if cp is None:
        return Admission(stamp(record, version), migrating=migrating)
    try:
        state = _migrate(cp.state, stored, migrations)
    except _MigrationError as exc:
        return Admission(record, error=f"{exc} (migrating job {record.job_id!r} to version {version!r})")
    logger.info("job %s: migrated from version %s to %s", record.job_id, stored or "(none)", version)
    migrated = record.model_copy(update={"checkpoint": cp.model_copy(update={"state": state})})
    return Admission(stamp(migrated, version), migrating=migrating)


class _MigrationError(Exception):
    pass


def _migrate(state: Any, stored: str | None, migrations: Mapping[str, Migration]) -> Any:
    """``state`` through every migration from ``stored`` up (all of them for a job from before versions)."""
    for old, fn in pending(migrations, stored):
        try:
            what = f"the state returned by the migration from {old!r}"
            state = to_json_value(fn(state), what=what)
            # Too large to store is this migration's failure too: the job fails with its stored state kept,
            # rather than every attempt's commit being refused (the failure's as well) and the job due forever.
            dump_json(state, what)
        except BaseException as exc:  # user code: any failure fails the job, with its reason (I9)
            if not contained(exc):  # the process is going down: not the job's fault
                raise
            raise _MigrationError(f"migration from version {old!r} failed: {describe(exc)}") from exc
    return state

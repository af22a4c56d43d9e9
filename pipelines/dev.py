"""``pipelines dev``: an App's agents and pipelines, run durably in one process on an SQLite file.

:func:`dev_app` gives the App to serve: the user's own if it already runs on
:class:`~adapters.sqlite.SQLiteStorage` with a
:class:`~adapters.local.LocalScheduler`; otherwise the same agents, pipelines,
schemas and settings on an SQLite file (default ``.phaserunner/dev.db``) with
local worker threads. :func:`summary` is the one screen the command prints.
Stopping the process (Ctrl-C, or ``kill -9``) loses nothing committed: the
next start picks every unfinished run up where it stopped.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from adapters.local import LocalScheduler
from adapters.sqlite import SQLiteStorage
from adapters.sqlite.connection import wal_defect
from adapters.sqlite.schema import SCHEMA_VERSION
from pipelines.app import App
from pipelines.engine.errors import ConfigurationError
from pipelines.engine.models import JobStatus

__all__ = ["DEFAULT_DB", "dev_app", "summary"]

DEFAULT_DB = ".phaserunner/dev.db"
"""Where ``pipelines dev`` keeps its runs unless the app has an SQLite file of its own or ``--db`` says."""


def dev_app(app: App, *, db: str | None = None, workers: int = 4) -> App:
    """The App ``pipelines dev`` serves: ``app`` itself on SQLite + LocalScheduler, else its twin on ``db``."""
    if isinstance(app.storage, SQLiteStorage) and isinstance(app.scheduler, LocalScheduler):
        if db is not None and SQLiteStorage(db).path != app.storage.path:
            raise ConfigurationError(f"the app already keeps its runs in {app.storage.path}; leave out --db "
                                     f"({db}) or point the app at it")
        return app
    storage = SQLiteStorage(db or DEFAULT_DB)
    twin = App(storage=storage, scheduler=LocalScheduler(workers=workers), schemas=app.schemas.values(),
               lease_seconds=app.lease_seconds, continue_for=app.continue_for, version=app.version,
               provenance=app.provenance, retention=app.retention,
               rate_limits=list(app.flow.limits.values()), concurrency=app.flow.concurrency or None,
               flow_store=_chosen_flow_store(app), max_interrupted_turns=app.max_interrupted_turns)
    for name in app.names:
        agent = app.agents.get(name)
        if agent is not None:
            twin.add_agent(agent, replace=True)
        else:
            twin.add_pipeline(name, app.pipeline(name), replace=True)
    return twin


def _chosen_flow_store(app: App) -> Any:
    """The flow store the app was given (``App(flow_store=...)``), else ``None``: the twin then keeps its flow
    state in its own file, not in the storage it replaces (whose default store would be a memory one)."""
    return None if app.flow.storage_default else app.flow.store


def _counts(app: App) -> str:
    counter: Any = app.storage
    found = {s: counter.count_jobs(s) for s in JobStatus}
    parts = [f"{n} {s.value}" for s, n in found.items() if n]
    return ", ".join(parts) or "none yet"


def summary(app: App, *, source: str, url: str | None) -> str:
    """What ``pipelines dev`` serves, on one screen."""
    storage, scheduler = app.storage, app.scheduler
    assert isinstance(storage, SQLiteStorage) and isinstance(scheduler, LocalScheduler)
    agents = sorted(app.agents)
    pipelines = [n for n in app.names if n not in app.agents]
    unfinished = sum(storage.count_jobs(s) for s in (JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PAUSED))
    lines = [
        f"phaserunner dev: {source}",
        f"  runs      {storage.path}",
        f"            SQLite {sqlite3.sqlite_version}, WAL, synchronous={storage._db.synchronous}, "
        f"schema v{SCHEMA_VERSION}",
        f"  workers   {scheduler.workers} threads in this process; sweep every {scheduler.sweep_interval:g} s",
        f"  web page  {url}" if url else "  web page  off",
        f"  agents    {', '.join(agents) or '-'}",
        f"  pipelines {', '.join(pipelines) or '-'}",
        f"  jobs      {_counts(app)}",
    ]
    if unfinished:
        lines.append(f"            {unfinished} unfinished: picked up where they stopped")
    if wal_defect():
        lines.append(f"  note      SQLite {sqlite3.sqlite_version} has the WAL-reset defect (fixed in 3.51.3): "
                     "keep to this one process on the file")
    lines.append("  Ctrl-C stops; runs in flight finish their turn, the rest resume on the next start.")
    return "\n".join(lines)

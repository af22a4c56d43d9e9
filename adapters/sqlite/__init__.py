"""The embedded durable storage: one SQLite file (WAL), shared by the threads and processes of one machine.

``SQLiteStorage("app.db")`` (or ``SQLiteStorage.from_url("sqlite:///app.db")``);
with :class:`adapters.local.LocalScheduler` it runs agents durably in one
process (``pipelines dev``). See :mod:`adapters.sqlite.storage`.
"""

from adapters.sqlite.storage import SQLiteStorage

__all__ = ["SQLiteStorage"]

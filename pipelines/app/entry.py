"""What a queue worker runs, by import path: the App tells its queue scheduler (adapters never name this layer)."""

from __future__ import annotations

from adapters.base import WorkerEntry

__all__ = ["WORKER_ENTRY"]

WORKER_ENTRY = WorkerEntry(advance="pipelines.worker.advance_job",
                           advance_with_default="pipelines.worker.advance_with_default")
"""The functions of :mod:`pipelines.worker` a queue message makes a worker run (RQ) or a task body calls (Celery)."""

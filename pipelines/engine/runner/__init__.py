"""The phase runner: ``advance_phase`` runs one phase of a job (``pipelines.engine.start`` writes jobs).

One advance, step by step (DESIGN "The turn"):

1. take the job's lease and load the record in one call; unknown, leased,
   not running or not yet due → no-op (duplicates are normal, I6); a pause
   or cancel requested while the last turn ran is applied here instead;
2. run the phase; ``ctx.step`` journals results as it goes (I5);
3. commit atomically, fenced on the version read (I1, I2); the commit also
   releases the lease, so the next advance can start at once;
4. schedule the next advance (the fast path; storage's due index is the
   truth, I7).

The commits themselves are built in :mod:`pipelines.engine.transitions`. Every
failure ends as data (I9): status ``error``, a readable message, the last
good checkpoint kept for ``retry_mode="resume"``.

The runner is a package of five modules, from the entry down:

- :mod:`~pipelines.engine.runner.advance`: the lease taken and let go (the entry points);
- :mod:`~pipelines.engine.runner.turn`: the turns run under that lease, and their commits;
- :mod:`~pipelines.engine.runner.interrupted`: a turn that kills its workers (its lease taken over, uncommitted,
  too many times in a row) fails its job instead of running again;
- :mod:`~pipelines.engine.runner.attempt`: one phase attempt (its context, its outcome);
- :mod:`~pipelines.engine.runner.results`: what an advance did.
"""

from __future__ import annotations

import warnings
from typing import Any

from pipelines.engine.runner.advance import (
    DEFAULT_LEASE_SECONDS,
    advance_phase,
    advance_under_lease,
    try_advance,
)
from pipelines.engine.runner.advance import as_pipeline as as_pipeline
from pipelines.engine.runner.advance import check_continue_for as check_continue_for
from pipelines.engine.runner.attempt import STORAGE_RETRY_SECONDS as STORAGE_RETRY_SECONDS
from pipelines.engine.runner.interrupted import DEFAULT_MAX_INTERRUPTED_TURNS as DEFAULT_MAX_INTERRUPTED_TURNS
from pipelines.engine.runner.results import AdvanceResult
from pipelines.engine.runner.turn import PipelineFor as PipelineFor

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "AdvanceResult",
    "advance_phase",
    "advance_under_lease",
    "try_advance",
]


def __getattr__(name: str) -> Any:
    # Deprecated for one release: the engine's ``advance_job`` is ``advance_under_lease`` now, so that
    # ``advance_job`` names one thing, the queue's entry point (:func:`pipelines.worker.advance_job`).
    if name == "advance_job":
        warnings.warn("pipelines.engine.runner.advance_job is advance_under_lease now (the old name goes in the "
                      "next release)", DeprecationWarning, stacklevel=2)
        return advance_under_lease
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

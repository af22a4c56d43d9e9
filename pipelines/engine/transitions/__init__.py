"""Every state change of a job: a pure function from the current record to a :class:`Commit`.

Starting, restarting, each phase outcome, saving state mid-phase, pause,
resume, cancel and the inputs a person supplies (approvals, recorded tool
outcomes) are all built here and nowhere else, so they agree on what a
commit carries: the version moves by one, one token per commit (which is
also the new checkpoint's ``commit_id``), every transition emits its event
and its log line, and the checkpoint's ``transcript_epoch`` is drawn anew by
every creation and every commit that truncates the transcript (also by a run
that starts afresh), never carried across one: workers' transcript caches rely
on it. :func:`pipelines.engine.writer.apply` is the one function that writes a
commit, notifies its events and schedules the next advance.

Nothing here reads storage or the clock: callers pass the record they
loaded and ``now``, so each transition is tested as a plain function.

The transitions live in one module per kind of change, all pure:

- :mod:`~pipelines.engine.transitions.building`: the blocks they share (a record one version on, its commit);
- :mod:`~pipelines.engine.transitions.starts`: create, continue, retry, fork;
- :mod:`~pipelines.engine.transitions.turns`: the end of a turn, one commit per phase outcome;
- :mod:`~pipelines.engine.transitions.controls`: pause, resume, cancel, a person's inputs;
- :mod:`~pipelines.engine.transitions.child_runs`: a child run's start, and its parent woken or failed.
"""

from __future__ import annotations

from pipelines.engine.phase import PhaseOutput
from pipelines.engine.transitions.building import (
    ACTIVE,
    FINAL,
    FINISHED,
    HISTORY_BYTES,
    HISTORY_LIMIT,
)
from pipelines.engine.transitions.building import CHILDREN as CHILDREN
from pipelines.engine.transitions.building import _commit as _commit
from pipelines.engine.transitions.child_runs import child_failed, children_done, create_child
from pipelines.engine.transitions.controls import cancel, pause, resume, supply_inputs
from pipelines.engine.transitions.starts import (
    continue_conversation,
    create,
    fork,
    retry_full,
    retry_resume,
    turn_mark,
)
from pipelines.engine.transitions.turns import Outcome as Outcome
from pipelines.engine.transitions.turns import after_phase, done_and_continued, save_state

__all__ = [
    "ACTIVE",
    "FINAL",
    "FINISHED",
    "HISTORY_BYTES",
    "HISTORY_LIMIT",
    "PhaseOutput",
    "after_phase",
    "cancel",
    "child_failed",
    "children_done",
    "continue_conversation",
    "create",
    "done_and_continued",
    "create_child",
    "fork",
    "pause",
    "resume",
    "retry_full",
    "retry_resume",
    "save_state",
    "supply_inputs",
    "turn_mark",
]

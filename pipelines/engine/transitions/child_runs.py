"""Child runs (:mod:`pipelines.engine.children`): a child's creation, and its parent woken or failed by it."""

from __future__ import annotations

from pipelines.engine.events import make_event
from pipelines.engine.models import Commit, JobRecord, JSONValue, Message, Usage
from pipelines.engine.phase import Fail, PhaseOutput
from pipelines.engine.tokens import new_token
from pipelines.engine.transitions.building import _commit, _log, _moved, _running
from pipelines.engine.transitions.starts import create
from pipelines.engine.transitions.turns import _on_fail

__all__ = ["child_failed", "children_done", "create_child"]


def create_child(job_id: str, *, parent_job: str, parent_call: str, pipeline: str, first: str, state: JSONValue,
                 messages: list[Message], options: dict[str, JSONValue], now: float, depth: int = 1,
                 parent_epoch: str | None = None) -> Commit:
    """A new job started by the call ``parent_call`` of ``parent_job``, ``depth`` parents below its family's
    root, in the parent's run ``parent_epoch``; its record names them (the ownership ``start_child`` checks when
    it finds the job again)."""
    commit = create(job_id, pipeline=pipeline, first=first, state=state, messages=messages, options=options, now=now)
    record = commit.record.model_copy(update={"parent_job": parent_job, "parent_call": parent_call, "depth": depth,
                                              "parent_epoch": parent_epoch})
    event = make_event("job_started", now, phase=first, pipeline=pipeline, parent_job=parent_job,
                       parent_call=parent_call)
    return commit.model_copy(update={"record": record, "events": [event]})


def children_done(rec: JobRecord, entries: dict[str, JSONValue], usage: Usage, *, owner: str, now: float) -> Commit:
    """A job waiting for its children runs again, their outcomes in its open checkpoint and their usage in its own.

    ``entries`` land in the checkpoint's ``inputs`` (``tool:<call id>`` is what
    the model reads), so the woken turn reuses them instead of calling again;
    the usage is added once, by this compare-and-set. The caller holds the
    lease (``owner``) and keeps it to run the turn at once.
    """
    assert rec.checkpoint is not None
    token = new_token()
    cp = rec.checkpoint.model_copy(update={"inputs": {**rec.checkpoint.inputs, **entries}, "due_at": now})
    new = _moved(rec, token, now, cp, **_running(), usage=rec.usage + usage)
    phase = cp.next_phase
    calls = sorted(k.removeprefix("child:") for k in entries if k.startswith("child:"))
    return _commit(rec, new, token, owner=owner, release_lease=False,
                   logs=[_log(now, phase, f"child jobs finished: {', '.join(calls)}")],
                   events=[make_event("children_finished", now, phase=phase, calls=calls)])


def child_failed(rec: JobRecord, error: str, usage: Usage, *, owner: str, now: float) -> Commit:
    """A job waiting for its children fails because one failed (``on_child_error="fail"``); checkpoint kept."""
    return _on_fail(rec, Fail(error), PhaseOutput(usage=usage), owner, now)

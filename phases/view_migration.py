"""View migrations: a newer agent upgrades the messages its model sees in an older conversation, once.

``Agent(version="2", view_migrations={"1": fn})``: ``fn(messages)`` gets the
model view of a conversation version 1 wrote (the pinned system prompt first,
when there is one; compaction summaries in place of what they cover) and
returns the view as version 2 expects it. It runs in the first turn a newer
worker runs on the job (``PhaseContext.migrating``, set by the runner when it
migrates the job's state), before compaction and before the model is asked.

The result is not a rewrite: the stored transcript is append-only and kept.
A marker message (:func:`phases.compaction.view_marker`, the compaction
marker's mechanism) recording the new view is appended with the turn's
messages, so it lands in the turn's commit together with the new state and
version; the view is rebuilt from the transcript exactly (the latest marker
wins), so fork and replay stay deterministic. Once: a crash before the
commit runs ``fn`` again on the same stored view (it must be a pure function
of the messages); after the commit the job is the new version's and it never
runs again. A turn that ends without appending its messages (a retry later,
a wait for approval or children, a failure) has still stamped the job with
the new version, so the turn journals what it owes (``view:migration``) before
``fn`` runs and its next attempt, or a ``retry``, migrates from that.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from phases import journal
from phases.compaction import MARKER_KEY, compacted_view, view_marker
from pipelines.engine import versions
from pipelines.engine.contain import contained, describe
from pipelines.engine.models import Message, to_json_value
from pipelines.engine.phase import FailJob, PhaseContext

__all__ = ["ViewMigration", "migrate_view"]

ViewMigration = Callable[[list[Message]], list[Message]]
"""``fn(messages) -> messages``: the model view as the next version expects it."""


def migrate_view(ctx: PhaseContext[Any], migrations: Mapping[str, ViewMigration],
                 past: list[Message]) -> list[Message]:
    """``past`` with a view-migration marker appended when this turn upgrades the job (else ``past``)."""
    found, owed = ctx.recorded(journal.VIEW_MIGRATION)
    if not found:
        step = ctx.migrating
        if step is None or not migrations or not versions.pending(migrations, step.from_version,
                                                                   step.to_version):
            return past
        owed = {"from": step.from_version, "to": step.to_version}
        # Journaled before fn runs: a failing migration fails the job with the new version stamped,
        # and a retry (after the fix) must still know what the view owes.
        ctx.record(journal.VIEW_MIGRATION, owed)
    assert isinstance(owed, dict)
    source, target = owed.get("from"), str(owed["to"])
    view = compacted_view(past)
    for old, fn in versions.pending(migrations, source if isinstance(source, str) else None, target):
        try:
            out = fn(json.loads(json.dumps(view)))  # a copy: fn may edit it in place
        except BaseException as exc:  # user code: the job fails with the reason, the transcript untouched (I9)
            if not contained(exc):  # sys.exit() included; only a process going down passes
                raise
            raise FailJob(f"view migration from version {old!r} failed: {describe(exc)} "
                          f"(migrating job {ctx.job_id!r} to version {target!r})") from exc
        view = _checked(out, old)
    note = view_marker(view, upto=len(past), version=target)
    ctx.append_messages([note])
    ctx.emit("view_migrated", upto=len(past), to_version=target, from_version=source, messages=len(view))
    ctx.log(f"model view migrated from version {source or '(none)'} to {target} ({len(view)} messages)")
    return [*past, note]


def _checked(value: Any, old: str) -> list[Message]:
    """``value`` as a model view: a list of JSON messages, each with a ``role``; else the job fails."""
    what = f"the messages returned by the view migration from {old!r}"
    if not isinstance(value, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                              for m in value):
        raise FailJob(f"{what} must be a list of messages (dicts with a 'role'), got {value!r:.200}")
    if any(MARKER_KEY in m for m in value):
        raise FailJob(f"{what} must not carry the {MARKER_KEY!r} bookkeeping key")
    try:
        plain = to_json_value(value, what=what)
    except Exception as exc:  # not storable: the job fails saying so, the transcript untouched
        raise FailJob(str(exc)) from exc
    assert isinstance(plain, list)
    return plain

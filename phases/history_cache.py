"""The transcripts a worker holds of the jobs it advanced, so a turn reads only the messages it lacks.

A worker that ran a job's last turn holds its whole transcript; one that ran
an earlier turn holds a prefix of it. Which prefix is provably the stored one
is told by the checkpoint's ``transcript_epoch``
(:class:`~pipelines.engine.models.Checkpoint`):

* The epoch is drawn at random when a job is created (a fork, a continued
  run, a re-created id included) and by every commit that truncates the
  transcript (a ``"full"`` retry); every other commit carries it. Within one
  epoch the stored transcript therefore only grows (I4): its first ``k``
  messages never change.
* An entry is stored only for what was the stored transcript under its
  epoch: after this worker's own commit landed (fenced, so exactly what
  storage holds), or as read from storage for a loaded record.
* So if the loaded record has the entry's epoch and at least ``k``
  messages, the entry is its first ``k``: the turn reads
  ``messages(start=k, stop=transcript_len)``; with exactly ``k``, nothing.
  Any other epoch, a shorter record or a short read: the whole transcript
  is read, as without a cache. A random epoch is never drawn twice, so a
  job deleted and re-created under the same id (even with the same length)
  is never served its predecessor's messages.
* A record from before epochs (``""``) is served only the entry of the
  exact commit that wrote it (``commit_id``), as before epochs existed.

Each entry also keeps the tool call ids its messages hold, so the turn's
id-uniqueness check (:func:`phases.tool_calls.normalise_tool_calls`) looks
only at the messages added since, and the model view of its messages when the
turn built one, extended as messages are added while
:func:`phases.agent_run.extended_view` allows. Bounded by jobs and by
messages held in all (least recently used out); a finished job's entry is
dropped.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from phases.agent_run import extended_view
from phases.tool_calls import call_ids
from pipelines.engine.models import Checkpoint, Message
from pipelines.engine.phase import PhaseContext

__all__ = ["Held", "HistoryCache", "View"]


@dataclass(frozen=True)
class View:
    """The model view of a transcript (:func:`phases.agent_run.turn_messages`) for configurations of ``key``."""

    key: Hashable
    messages: list[Message]


@dataclass(frozen=True)
class Held:
    """A job's committed transcript as of one checkpoint, the tool call ids in it, maybe its view. Never modified."""

    messages: list[Message]
    ids: frozenset[str]
    epoch: str = ""
    commit_id: str = ""
    view: View | None = None

    def extended(self, new: list[Message], epoch: str, commit_id: str) -> Held:
        """This transcript with ``new`` appended (the view too, when it extends)."""
        view = self.view
        if view is not None:
            grown = extended_view(view.messages, new)
            view = None if grown is None else View(view.key, grown)
        return Held([*self.messages, *new], self.ids | call_ids(new), epoch, commit_id, view)


class HistoryCache:
    """The transcript of recently advanced jobs (see the module docstring for when an entry is trusted)."""

    def __init__(self, size: int = 256, max_messages: int = 50_000) -> None:
        self._entries: OrderedDict[str, Held] = OrderedDict()
        self._size = size
        self._max_messages = max_messages
        self._held = 0
        self._lock = threading.Lock()

    def forget(self, job_id: str) -> None:
        with self._lock:
            old = self._entries.pop(job_id, None)
            if old is not None:
                self._held -= len(old.messages)

    def get(self, ctx: PhaseContext[Any]) -> Held:
        """The committed transcript ``ctx`` starts from, reading from storage only what is not held."""
        cp, n = ctx.checkpoint, ctx.transcript_len
        with self._lock:
            hit = self._entries.get(ctx.job_id)
        if hit is not None:
            k = len(hit.messages)
            if k == n and cp.commit_id and hit.commit_id == cp.commit_id:
                return hit  # the very checkpoint this entry was taken at
            if cp.transcript_epoch and hit.epoch == cp.transcript_epoch and k <= n:
                if k == n:
                    return hit
                new = ctx.messages(k)
                if len(new) == n - k:  # else storage disagrees with the record: trust neither, read all
                    return self._put(ctx.job_id, hit.extended(new, cp.transcript_epoch, cp.commit_id))
        messages = ctx.messages()
        held = Held(messages, frozenset(call_ids(messages)), cp.transcript_epoch, cp.commit_id)
        # A read shorter than the record says is not "the transcript under this epoch": used, not kept.
        return self._put(ctx.job_id, held) if len(messages) == n else held

    def remember_after_commit(self, ctx: PhaseContext[Any], messages: list[Message], ids: frozenset[str],
                              view: View | None = None) -> None:
        """Hold ``messages`` (the whole transcript this turn commits, ``ids`` its call ids, ``view`` its model
        view if known) once the commit lands."""

        job_id = ctx.job_id  # not ctx itself: the context holds this callback (no reference cycle)

        def put(cp: Checkpoint[Any]) -> None:
            self._put(job_id, Held(messages, ids, cp.transcript_epoch, cp.commit_id, view))

        ctx.on_commit(put, reads_only=True)  # the epoch and commit id only

    def _put(self, job_id: str, held: Held) -> Held:
        with self._lock:
            old = self._entries.pop(job_id, None)
            self._held += len(held.messages) - (len(old.messages) if old else 0)
            self._entries[job_id] = held
            while self._entries and (len(self._entries) > self._size or self._held > self._max_messages):
                _, dropped = self._entries.popitem(last=False)
                self._held -= len(dropped.messages)
        return held

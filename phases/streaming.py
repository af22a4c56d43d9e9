"""Text as it arrives: the agent turn's delta sink, batching a model's text into ``text_delta`` parts.

A streaming model calls the sink with each piece of text; the sink publishes
them to the job's live stream in batches (at most every ``flush_seconds`` or
``flush_chars``, whichever comes first), outside the turn's commit. The first
publish of an attempt carries ``attempt_started``, so a client drops the text
of an earlier attempt of the same turn (a crash re-run, a retried stream).
A model that does not stream, or an answer replayed from the journal, sends
its whole text once: every attempt's deltas add up to its answer's text.

The first batch of an attempt waits ``first_flush_seconds`` (10 ms), later
ones ``flush_seconds``. An answer that is complete by then (a fast model, a
short tool-calling turn) has its whole text published with the journal write
of the answer itself (:meth:`DeltaSink.final_parts`), one round trip instead
of two or three; a client sees the first text at most 10 ms later than it
could have, next to the hundreds of a model's first token.

Batches are published by the thread that hands over the text whenever the
window has ended or the batch is full. Text held back inside a window is
published when the window ends by one flusher thread per process, started the
first time it is needed: no thread per turn (a thread start costs more than a
whole memory-adapter turn), and none at all for a model that does not stream.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any

from pipelines.engine._daemon import Daemon, start_daemon
from pipelines.engine.models import Event
from pipelines.engine.phase import PhaseContext

__all__ = ["FIRST_FLUSH_SECONDS", "FLUSH_CHARS", "FLUSH_SECONDS", "DeltaSink"]

FIRST_FLUSH_SECONDS = 0.01
"""The first batch of an attempt waits at most this long before it is published."""
FLUSH_SECONDS = 0.015
"""A later batch waits at most this long before it is published.

Below the 20 ms between a 50-tokens/s model's chunks: at that pace or slower every chunk goes out as it
arrives (a batch is sent at once when the last one is older than this), and a follower sees it ~3 ms
later (bench figure 14); a faster model is batched, at most ~67 publishes a second. At 30 ms, half of
such a model's chunks waited for the window: p50 ~18 ms."""
FLUSH_CHARS = 1000
"""... or until it is this long."""

_log = logging.getLogger(__name__)
_monotonic = time.monotonic  # bound once: read for every piece of text


class DeltaSink:
    """Batches one attempt's text for the live stream (thread-safe: a model may call it from any thread)."""

    def __init__(self, ctx: PhaseContext[Any], turn: int, *, retries: int = 0, flush_seconds: float = FLUSH_SECONDS,
                 flush_chars: int = FLUSH_CHARS, first_flush_seconds: float | None = None) -> None:
        self.ctx = ctx
        self.turn = turn
        self.retries = retries
        self.attempt = ctx.attempt_id
        self._restarts = 0
        self.flush_seconds = flush_seconds
        self.flush_chars = flush_chars
        self.first_flush_seconds = FIRST_FLUSH_SECONDS if first_flush_seconds is None else first_flush_seconds
        # Pieces, joined once when they go out: text kept as one string grown by ``+=`` is copied
        # whole at every piece and every batch, quadratic in the answer (~500 MB for 1 MB of text).
        self._sent: list[str] = []  # every batch published so far in this attempt (or handed to final_parts)
        self._sent_len = 0
        # Pieces not yet sent. A model hands over every token, so they are appended without the lock
        # (which cost more than the rest of the call): a deque's append is atomic, and a batch pops the
        # pieces there when it is taken, so one appended meanwhile waits for the next batch.
        self._pending: deque[str] = deque()
        self._pending_len = 0  # characters pending: only the size rule reads it (see __call__)
        self._started = False
        self._window_end: float | None = None  # when the batch being filled goes out; None before any text
        self._scheduled = False  # the flusher holds a deadline for this sink's pending text
        self._failed: tuple[str, Exception] | None = None  # (attempt, error): a batch the flusher lost
        self._lock = threading.Lock()  # guards taking the pending text and what was sent (not the appends)
        self._publishing = threading.Lock()  # one batch on the wire at a time, in the order they were taken

    def __call__(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            return
        self._pending.append(text)
        # Added outside the lock: a batch taken at this very moment may leave the count off by a piece,
        # which only moves when the size rule sends a batch; the text sent is exactly what was appended.
        self._pending_len += len(text)
        now = _monotonic()
        end = self._window_end
        if end is None:  # the attempt's first text (only the model's thread sets it from None)
            end = self._window_end = now + self.first_flush_seconds
        if self._pending_len >= self.flush_chars or now >= end:
            self.flush()
        elif not self._scheduled:
            with self._lock:
                if not self._scheduled:
                    # Text that arrives inside the window goes out when the window ends, not when
                    # (if ever) the next piece arrives: a slow stream is never held back longer.
                    self._scheduled = True
                    at = self._window_end  # a batch sent meanwhile started a later window
                    _flusher().schedule(self, end if at is None else at)

    def flush(self) -> None:
        """Publish what is pending (with ``attempt_started`` first, once).

        The publish happens under the lock: the flusher thread and the model's
        thread may both flush, and two batches sent out of order would garble
        the text a client assembles.
        """
        self._flush(held=False)

    def flush_held(self) -> None:
        """The flusher thread's flush: a failure is kept for :meth:`finish` to raise (no caller here to catch it)."""
        try:
            self._flush(held=True)
        except Exception as exc:  # noqa: BLE001 - recorded by _flush; the turn decides at finish()
            _log.warning("live stream: publishing held-back text of job %s failed: %s", self.ctx.job_id, exc)

    def _flush(self, *, held: bool) -> None:
        with self._publishing:
            with self._lock:
                self._unschedule()
                attempt = self.attempt
                batch = self._take_pending()
                parts = self._parts(batch)
                self._mark_sent(batch)
                self._window_end = _monotonic() + self.flush_seconds
            if parts:
                try:
                    self.ctx.publish_parts(parts)
                except Exception as exc:
                    if held:
                        # Recorded before _publishing is released: a finish() waiting for it sees the failure.
                        self._failed = (attempt, exc)
                    raise

    def restart(self) -> None:
        """A broken provider stream is tried again: drop what is pending and start a new attempt."""
        with self._lock:
            self._unschedule()
            self._restarts += 1
            self.attempt = f"{self.ctx.attempt_id}.{self._restarts}"
            self._pending.clear()  # the model's thread restarts: it appends nothing meanwhile
            self._pending_len, self._sent, self._sent_len = 0, [], 0
            self._started = False
            self._window_end = None

    @property
    def sent(self) -> str:
        """Every character published so far in this attempt (or handed to :meth:`final_parts`)."""
        with self._lock:
            return "".join(self._sent)

    def _take_pending(self) -> str:
        # Under self._lock: the pieces pending now, as one batch. Popped, not swapped for a new deque:
        # the model's thread may be appending to this one, and its piece must not be lost.
        pending = self._pending
        batch = "".join([pending.popleft() for _ in range(len(pending))])
        self._pending_len = 0
        return batch

    def _mark_sent(self, batch: str) -> None:
        # Under self._lock.
        if batch:
            self._sent.append(batch)
            self._sent_len += len(batch)

    def _sent_is_prefix_of(self, text: str) -> bool:
        # Under self._lock. Compared in place (startswith at an offset copies nothing).
        at = 0
        for batch in self._sent:
            if not text.startswith(batch, at):
                return False
            at += len(batch)
        return True

    def final_parts(self, full_text: str | None) -> list[Event]:
        """The attempt's last parts, to publish with the journal write of its answer (``ctx.step(publish=...)``).

        What is still pending, whatever of ``full_text`` the model did not
        stream, and ``attempt_started`` if nothing went out yet, taken as sent.
        Called once the model has returned (no more text comes); waits for a
        batch the flusher thread is sending, so the order holds. A later
        :meth:`finish` then has nothing left to send.
        """
        with self._publishing, self._lock:
            self._unschedule()
            text = full_text or ""
            pending = self._take_pending()
            done = self._sent_len + len(pending)
            streamed = self._sent_is_prefix_of(text) and text.startswith(pending, self._sent_len)
            last = pending + text[done:] if streamed else pending
            parts = self._parts(last)
            self._mark_sent(last)
        return parts

    def finish(self, full_text: str | None) -> None:
        """End the attempt: flush, then send whatever of ``full_text`` the model did not stream.

        Raises what made a batch published by the flusher thread fail: that
        text is missing from this attempt, so the attempt must not be the
        one that commits. The turn runs again (a storage outage is a
        ``RetryLater``) from its journaled answer, as a new attempt that sends
        the whole text, and clients drop this one's.
        """
        parts = self.final_parts(full_text)  # an attempt with no text still says it started
        if parts:
            self.ctx.publish_parts(parts)
        if self._failed is not None and self._failed[0] == self.attempt:  # an abandoned attempt's loss is moot
            raise self._failed[1]

    def _unschedule(self) -> None:
        # Under self._lock. Skips the flusher's lock in the common case: nothing was held back.
        if self._scheduled:
            self._scheduled = False
            _flusher().cancel(self)

    def _parts(self, text: str) -> list[Event]:
        parts = []
        if not self._started:
            self._started = True
            parts.append(self.ctx.part("attempt_started", turn=self.turn, attempt=self.attempt))
        if text:
            parts.append(self.ctx.part("text_delta", turn=self.turn, text=text, attempt=self.attempt))
        return parts


class _Flusher:
    """One daemon thread that flushes each sink whose window ended with text still held back.

    Lock order: a sink's own lock, then this one; the thread never takes a
    sink's lock while holding this one (it flushes outside it), so the two
    cannot deadlock.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._due: dict[DeltaSink, float] = {}
        # When the thread wakes next: None while it waits for work, 0.0 while it is
        # flushing (it looks at the deadlines again before it sleeps).
        self._wake_at: float | None = None
        self._thread: Daemon | None = None
        self._active = False  # something was scheduled since the thread last looked

    def schedule(self, sink: DeltaSink, at: float) -> None:
        with self._cond:
            self._due[sink] = at
            self._active = True
            if self._thread is None or not self._thread.alive:
                # The first time, or the loop ended (only something no `except Exception` stops does
                # that, a flush is otherwise caught): without a new one no held-back text would go out
                # before its turn's end, for the rest of the process.
                self._thread = start_daemon(self._run, "phaserunner-delta-flusher")
                self._wake_at = None
            # Wake the thread only when it would sleep past this deadline: a busy worker's turns
            # mostly cancel their deadline before it comes, and cost the thread nothing.
            if self._wake_at is None or at < self._wake_at:
                self._cond.notify()
                # Taken as the thread's next wake-up until it runs and looks for itself: it may not get the
                # GIL before the next turn schedules, which then need not wake it again.
                self._wake_at = at

    def cancel(self, sink: DeltaSink) -> None:
        with self._cond:
            self._due.pop(sink, None)  # no wake-up: the thread finds nothing due and sleeps on

    def _next_look(self, now: float) -> float | None:
        """When the thread, finding nothing due at ``now``, looks again (``None``: once woken); under the lock.

        While turns stream it looks again one first window later even if nothing is
        held back then: a sink scheduled meanwhile has a deadline at least that late,
        so it need not wake the thread. Busy streaming costs one wake-up a window,
        not one a turn (each a GIL handover, which a turn on a loaded machine waits for).
        """
        wake = min(self._due.values(), default=None)
        if self._active:
            self._active = False
            tick = now + FIRST_FLUSH_SECONDS
            wake = tick if wake is None else min(wake, tick)
        self._wake_at = wake
        return wake

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [s for s, at in self._due.items() if at <= now]
                if not due:
                    wake = self._next_look(now)
                    self._cond.wait(None if wake is None else wake - now)
                    continue
                for sink in due:
                    del self._due[sink]
                self._wake_at = 0.0
            for sink in due:
                sink.flush_held()


_FLUSHER: _Flusher | None = None
_FLUSHER_LOCK = threading.Lock()


def _flusher() -> _Flusher:
    global _FLUSHER
    if _FLUSHER is None:
        with _FLUSHER_LOCK:
            if _FLUSHER is None:
                _FLUSHER = _Flusher()
    return _FLUSHER


def _after_fork() -> None:
    # A forked child (RQ's forking worker) has no flusher thread and maybe a lock held at fork
    # time: it starts its own, from scratch, the first time it needs one.
    global _FLUSHER, _FLUSHER_LOCK
    _FLUSHER, _FLUSHER_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)

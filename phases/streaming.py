"""Text as it arrives: the agent turn's delta sink, batching a model's text into ``text_delta`` parts.

A streaming model calls the sink with each piece of text; the sink publishes
them to the job's live stream in batches (at most every ``flush_seconds`` or
``flush_chars``, whichever comes first), outside the turn's commit. The first
publish of an attempt carries ``attempt_started``, so a client drops the text
of an earlier attempt of the same turn (a crash re-run, a retried stream).
A model that does not stream, or an answer replayed from the journal, sends
its whole text once: every attempt's deltas add up to its answer's text.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pipelines.engine.models import Event
from pipelines.engine.phase import PhaseContext

__all__ = ["FLUSH_CHARS", "FLUSH_SECONDS", "DeltaSink"]

FLUSH_SECONDS = 0.03
"""A batch of text waits at most this long before it is published."""
FLUSH_CHARS = 200
"""... or until it is this long."""


class DeltaSink:
    """Batches one attempt's text for the live stream (thread-safe: a model may call it from any thread)."""

    def __init__(self, ctx: PhaseContext[Any], turn: int, *, retries: int = 0, flush_seconds: float = FLUSH_SECONDS,
                 flush_chars: int = FLUSH_CHARS) -> None:
        self.ctx = ctx
        self.turn = turn
        self.retries = retries
        self.attempt = ctx.attempt_id
        self._restarts = 0
        self.flush_seconds = flush_seconds
        self.flush_chars = flush_chars
        self.sent = ""  # every character published so far in this attempt
        self._pending = ""
        self._started = False
        self._last = 0.0  # the first text goes out at once
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()  # guards the pending text (the model's thread appends while we send)
        self._publishing = threading.Lock()  # one batch on the wire at a time, in the order they were taken

    def __call__(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            return
        with self._lock:
            self._pending += text
            wait = self.flush_seconds - (time.monotonic() - self._last)
            due = len(self._pending) >= self.flush_chars or wait <= 0
            if not due and self._timer is None:
                # Text that arrives inside the window goes out when the window ends, not when
                # (if ever) the next piece arrives: a slow stream is never held back longer.
                self._timer = threading.Timer(wait, self.flush)
                self._timer.daemon = True
                self._timer.start()
        if due:
            self.flush()

    def flush(self) -> None:
        """Publish what is pending (with ``attempt_started`` first, once).

        The publish happens under the lock: the trailing timer and the model's
        thread may both flush, and two batches sent out of order would garble
        the text a client assembles.
        """
        with self._publishing:
            with self._lock:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                parts = self._parts(self._pending)
                self.sent += self._pending
                self._pending = ""
                self._last = time.monotonic()
            if parts:
                self.ctx.publish_parts(parts)

    def restart(self) -> None:
        """A broken provider stream is tried again: drop what is pending and start a new attempt."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._restarts += 1
            self.attempt = f"{self.ctx.attempt_id}.{self._restarts}"
            self._pending, self.sent, self._started = "", "", False

    def finish(self, full_text: str | None) -> None:
        """End the attempt: flush, then send whatever of ``full_text`` the model did not stream."""
        self.flush()
        text = full_text or ""
        rest = text[len(self.sent):] if text.startswith(self.sent) else ""
        with self._lock:
            self._pending = rest
        self.flush()
        if not self._started:
            self.ctx.publish_parts(self._parts(""))  # an attempt with no text still says it started

    def _parts(self, text: str) -> list[Event]:
        parts = []
        if not self._started:
            self._started = True
            parts.append(self.ctx.part("attempt_started", turn=self.turn, attempt=self.attempt))
        if text:
            parts.append(self.ctx.part("text_delta", turn=self.turn, text=text, attempt=self.attempt))
        return parts

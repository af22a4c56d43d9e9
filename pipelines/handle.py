"""What users hold for a run: :class:`RunHandle` (one job of an App) and :class:`JobView` (a job as read).

``app.run_agent(...)`` and ``app.run_pipeline(...)`` return a ``RunHandle``;
``app.get(job_id)`` and every control operation return a ``JobView``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from pipelines.engine.errors import JobFailedError, JobNotFoundError, WaitTimeoutError
from pipelines.engine.models import FINISHED_STATUSES, Event, JobRecord, JobStatus, Usage

__all__ = ["FINISHED", "JobView", "RunHandle"]

FINISHED = FINISHED_STATUSES
"""Statuses a run stays in until someone acts: what :meth:`RunHandle.wait` waits for."""


class _Runs(Protocol):
    """What a handle needs of its :class:`~pipelines.app.App` (so this module does not import it)."""

    def get(self, job_id: str) -> JobView | None: ...

    def cancel(self, job_id: str, *, wait: float = 30.0, force: bool = False) -> JobView: ...

    def run_in_process(self) -> bool | None: ...

    def stream(self, job_id: str, *, after: str | None = None, follow: bool = True,
               timeout: float | None = None) -> Iterator[Event]: ...


@dataclass(frozen=True)
class JobView:
    """A job as read from storage, with its result and state typed where the App knows their models.

    ``result``: the ``output_schema`` instance of an agent that has one (else
    the stored JSON); ``state``: the pipeline's ``state`` model instance when
    it declares one. ``pending_calls``: the tool calls a waiting job needs a
    decision on. ``record`` is the raw :class:`JobRecord`.
    """

    record: JobRecord
    result: Any = None
    state: Any = None
    pending_calls: tuple[dict[str, Any], ...] = ()
    title: str | None = None

    @property
    def job_id(self) -> str:
        return self.record.job_id

    @property
    def status(self) -> JobStatus:
        return self.record.status

    @property
    def pipeline(self) -> str:
        return self.record.pipeline

    @property
    def error(self) -> str | None:
        return self.record.error

    @property
    def usage(self) -> Usage:
        """Every paid model call of the job: committed turns and attempts fenced off alike."""
        return self.record.total_usage

    @property
    def stop_reason(self) -> str | None:
        return self.record.stop_reason

    @property
    def version(self) -> int:
        return self.record.version

    @property
    def control(self) -> str | None:
        """A pause or cancel requested and not yet applied (a turn was in flight)."""
        return self.record.control

    @property
    def finished(self) -> bool:
        return self.record.status in FINISHED


_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,100}")  # a call id safe to show inside a shell command


def _acts(view: JobView) -> str:
    """What a person does for a job waiting for one, or paused (``""`` for any other)."""
    job = view.job_id
    if view.status is JobStatus.PAUSED:
        return f"; it runs on once resumed: app.resume({job!r}) or `pipelines resume {job}`"
    if view.status is not JobStatus.WAITING:
        return ""
    kind = (view.record.waiting or {}).get("kind")
    if kind == "children":
        return f"; it waits for its child runs (`pipelines status {job}`; `pipelines jobs` lists them)"
    calls = [c for c in view.pending_calls if isinstance(c.get("call_id"), str)] if kind == "approval" else []
    if calls:
        # Call ids and tool names come from the model: shown as reprs (no control character reaches a terminal).
        named = ", ".join(f"{c['call_id']!r} ({str(c.get('tool', '?'))!r})" for c in calls[:5])
        first = calls[0]["call_id"]
        command = f", `pipelines approve {job} {first}`" if _PLAIN_ID.fullmatch(first) else ""
        return (f"; it waits for a person to approve or reject {len(calls)} call(s): {named}; app.approve({job!r}, "
                f"{first!r}) or app.reject(...){command}")
    return f"; it waits for a person (an input, an approval): `pipelines status {job}` shows what it asks"


class RunHandle:
    """One run of an :class:`~pipelines.app.App`: ``run.get()``, ``run.wait()``, ``run.result()``, ``run.cancel()``."""

    def __init__(self, app: _Runs, job_id: str) -> None:
        self.app = app
        self.job_id = job_id

    def __repr__(self) -> str:
        return f"RunHandle(job_id={self.job_id!r})"

    def get(self) -> JobView | None:
        """The job as it stands now (``None`` if it was deleted)."""
        return self.app.get(self.job_id)

    def wait(self, timeout: float = 60.0, *, poll: float = 0.1, since: float | None = None) -> JobView:
        """Wait until the job is complete, failed or cancelled; returns its view.

        With an in-process scheduler the App runs the job's turns here
        (``drain``); otherwise this polls storage every ``poll`` seconds, so it
        works from any process. Raises :class:`WaitTimeoutError` after
        ``timeout`` seconds, naming the status the job is in, and what a job
        waiting for a person waits for (the calls to approve, the input). Under
        a scheduler that runs jobs only when drained (the memory one) it raises
        at once for a job waiting for a person or paused: nothing runs it until
        someone acts. ``since``: when
        (``time.monotonic()``) the timeout started, for a caller that waited
        already (streamed the run first); now by default.
        """
        deadline = (time.monotonic() if since is None else since) + timeout
        in_process = bool(self.app.run_in_process())
        while True:
            view = self.get()
            if view is None:
                raise JobNotFoundError(f"job {self.job_id!r} not found")
            if view.finished:
                return view
            left = deadline - time.monotonic()
            stuck = in_process and view.status in (JobStatus.WAITING, JobStatus.PAUSED)
            if left <= 0 or stuck:
                when = "now (its scheduler runs jobs only when drained)" if stuck else f"after {timeout:g} s"
                raise WaitTimeoutError(f"job {self.job_id!r} is still {view.status.value} {when}{_acts(view)}",
                                       status=view.status.value)
            time.sleep(min(poll, left))

    def result(self, timeout: float = 60.0) -> Any:
        """Wait for the job, then its result (typed by the output schema); a failed job raises its error."""
        view = self.wait(timeout)
        if view.status is not JobStatus.COMPLETE:
            raise JobFailedError(f"job {self.job_id!r} ended {view.status.value}: {view.error or 'no result'}")
        return view.result

    def stream(self, *, after: str | None = None, follow: bool = True, timeout: float | None = None) -> Iterator[Event]:
        """The run's live stream (see :meth:`App.stream`)."""
        return self.app.stream(self.job_id, after=after, follow=follow, timeout=timeout)

    def cancel(self, *, wait: float = 30.0, force: bool = False) -> JobView:
        """Cancel the run at its turn boundary (see :meth:`App.cancel`)."""
        return self.app.cancel(self.job_id, wait=wait, force=force)


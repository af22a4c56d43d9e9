"""Crash injection: run a job once per persistence boundary, killing the worker there, and check recovery.

Usage from a user's pytest (the model must be deterministic, e.g. a
``ScriptedModel`` built from a function of the messages, and ``start`` must
build a fresh agent each time)::

    from pipelines.testing import crash_test

    def test_my_agent_survives_crashes():
        report = crash_test(lambda storage, scheduler: make_agent().run(
            job_id="t", messages=["hi"], storage=storage, scheduler=scheduler), job_id="t")
        report.assert_ok()

A clean run first records every boundary: before and after each
``create_job``, journal write (model step, tools started, each tool result),
``commit`` and ``schedule_advance``. Then, for each boundary, a fresh run
crashes there (a ``BaseException`` nothing in the library catches, like a
killed process), and recovery runs the way production does: queued messages,
then the due-index sweep (``pipelines advance --due``). Each run is checked:

* the job ends as the clean run did (complete), or in the state its tools'
  ``on_interrupted`` policy documents (``fail`` → error, ``ask`` → waiting);
* the transcript is valid (each tool call answered once, in order) and equal
  to the clean run's: no message lost or duplicated;
* no tool call whose result was journaled before the crash ran again, and the
  model was not called again for a turn whose answer was journaled.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from adapters.base import Scheduler, Storage
from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from phases.observe import observe_calls
from phases.tool_runner.invoke import never_called
from pipelines.engine.children import ready_parents, waits_for_children
from pipelines.engine.models import Commit, CommitReply, Event, JobRecord, JobStatus, JSONValue, LogEntry, Message

__all__ = ["CrashPoint", "CrashReport", "CrashResult", "SimulatedCrash", "crash_test", "transcript_problems"]

StartFn = Callable[[Storage, Scheduler], None]


# Steps whose value is a model answer: a crash right before journaling one means the process
# died inside that very call, the one case where the model may be asked again (I5).
_MODEL_STEPS = ("record_step:model", "record_step:compaction")


class SimulatedCrash(BaseException):
    """The worker dies here. A BaseException, so no ``except Exception`` in the library swallows it."""


@dataclass(frozen=True)
class CrashPoint:
    index: int
    when: str  # "before" or "after"
    operation: str  # "create_job", "record_step:<key>", "commit", "schedule_advance"
    calls: tuple[str, ...] = ()  # for "record_step:tools:started": the call ids marked started

    def __str__(self) -> str:
        return f"#{self.index} {self.when} {self.operation}"


@dataclass
class CrashResult:
    point: CrashPoint
    status: str
    problems: list[str] = field(default_factory=list)


@dataclass
class CrashReport:
    """One result per crash point; ``assert_ok()`` raises listing every problem."""

    clean_status: str
    clean_transcript: list[Message]
    results: list[CrashResult]

    @property
    def failures(self) -> list[CrashResult]:
        return [r for r in self.results if r.problems]

    def assert_ok(self) -> None:
        if self.failures:
            lines = [f"{r.point}: {p}" for r in self.failures for p in r.problems]
            raise AssertionError(f"{len(self.failures)} of {len(self.results)} crash points failed:\n"
                                 + "\n".join(lines))


class _Injector:
    """Counts boundaries and raises ``SimulatedCrash`` at the chosen one."""

    def __init__(self, crash_at: int | None) -> None:
        self.crash_at = crash_at
        self.points: list[CrashPoint] = []
        self.crashed: CrashPoint | None = None
        self._lock = threading.Lock()

    def hit(self, when: str, operation: str, calls: Sequence[str] = ()) -> None:
        with self._lock:
            point = CrashPoint(len(self.points), when, operation, tuple(calls))
            self.points.append(point)
            if self.crash_at is not None and point.index == self.crash_at and self.crashed is None:
                self.crashed = point
                raise SimulatedCrash(str(point))


class _CrashingStorage(MemoryStorage):
    def __init__(self, injector: _Injector, clock: VirtualClock) -> None:
        super().__init__(clock=clock)
        self._inj = injector

    def create_job(self, record: JobRecord, *, messages: Sequence[Message] = (),
                   logs: Sequence[LogEntry] = (), events: Sequence[Event] = ()) -> None:
        self._inj.hit("before", "create_job")
        super().create_job(record, messages=messages, logs=logs, events=events)
        self._inj.hit("after", "create_job")

    def commit(self, commit: Commit) -> CommitReply:
        self._inj.hit("before", "commit")
        reply = super().commit(commit)
        self._inj.hit("after", "commit")
        return reply

    def record_step(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue) -> None:
        op = f"record_step:{key}"
        calls = [str(c) for c in value] if key == "tools:started" and isinstance(value, list) else []
        self._inj.hit("before", op, calls)
        super().record_step(job_id, version=version, owner=owner, key=key, value=value)
        self._inj.hit("after", op, calls)


class _CrashingScheduler(MemoryScheduler):
    def __init__(self, injector: _Injector, clock: VirtualClock) -> None:
        super().__init__(clock=clock)
        self._inj = injector

    def schedule_advance(self, job_id: str, delay: float = 0.0, *, pipeline: str = "default",
                         version: int | None = None, priority: str | None = None) -> None:
        self._inj.hit("before", "schedule_advance")
        super().schedule_advance(job_id, delay, pipeline=pipeline, version=version, priority=priority)
        self._inj.hit("after", "schedule_advance")


@dataclass
class _Run:
    storage: _CrashingStorage
    injector: _Injector
    executions: Counter[tuple[str, str]]
    journaled_at_crash: set[str]


def _run(start: StartFn, job_id: str, crash_at: int | None, max_rounds: int) -> _Run:
    injector = _Injector(crash_at)
    clock = VirtualClock(start=1_000_000.0)
    storage = _CrashingStorage(injector, clock)
    scheduler = _CrashingScheduler(injector, clock)
    executions: Counter[tuple[str, str]] = Counter()
    journaled: set[str] = set()
    lock = threading.Lock()

    def observe(kind: str, jid: str, key: str) -> None:
        if jid == job_id:
            with lock:
                executions[(kind, key)] += 1

    def note_crash() -> None:
        # What was durable when the worker died: journal keys of the open turn
        # plus every tool call already answered in the committed transcript.
        rec = storage.get_job(job_id)
        if rec is not None and rec.checkpoint is not None:
            journaled.update(rec.checkpoint.journal)
        journaled.update(f"tool:{m['tool_call_id']}" for m in storage.messages(job_id) if m.get("role") == "tool")

    with observe_calls(observe):
        try:
            start(storage, scheduler)
            scheduler.drain()
        except SimulatedCrash:
            note_crash()
        # Recovery as in production: whatever is queued, then the sweep over
        # the due index, until the job settles.
        for _ in range(max_rounds):
            scheduler.drain()
            rec = storage.get_job(job_id)
            if rec is None or not (rec.status is JobStatus.RUNNING or waits_for_children(rec)):
                break
            due = _due(storage, scheduler, clock, rec)
            if not due:
                break  # waiting for children that wait for nothing due: settled as it is
            for jid in due:
                scheduler.schedule_advance(jid, pipeline=rec.pipeline)
    return _Run(storage, injector, executions, journaled)


def _due(storage: Storage, scheduler: Scheduler, clock: VirtualClock, rec: JobRecord) -> list[str]:
    """What the production sweep advances next: due jobs (the clock moved on to the next one if none is
    due yet), and parents whose children all finished (``advance_due`` wakes them)."""
    due = storage.due_jobs(scheduler.now()) + [p.job_id for p in ready_parents(storage)]
    if due:
        return due
    if rec.status is JobStatus.RUNNING and rec.checkpoint is not None:
        clock.advance_to(rec.checkpoint.due_at)
    else:
        # The job waits for children: the next of theirs (or of anything else) to fall due.
        later = [r.checkpoint.due_at for r in storage.list_jobs(status=JobStatus.RUNNING) if r.checkpoint]
        if later:
            clock.advance_to(min(later))
    return storage.due_jobs(scheduler.now())


def transcript_problems(messages: Sequence[Message]) -> list[str]:
    """Problems of a transcript: each tool call must be answered exactly once, right after its message."""
    problems: list[str] = []
    open_calls: list[str] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            cid = m.get("tool_call_id")
            if not open_calls or cid not in open_calls:
                problems.append(f"message {i}: tool result {cid!r} answers no open tool call")
            else:
                open_calls.remove(cid)
            continue
        if open_calls:
            problems.append(f"message {i}: tool calls {open_calls} were never answered")
            open_calls = []
        if role == "assistant":
            open_calls = [c.get("id") for c in m.get("tool_calls") or []]
    if open_calls:
        problems.append(f"end: tool calls {open_calls} were never answered")
    return problems


def _expected_status(point: CrashPoint, clean: str, policies: dict[str, str], call_tools: dict[str, str],
                     not_called: frozenset[str] = frozenset()) -> str:
    """The documented end state of a run that crashed at ``point``."""
    if point.operation == "create_job" and point.when == "before":
        return "missing"  # the caller got the crash; nothing was written
    # Between "started" and a call's journaled result, a call counts as
    # interrupted mid-flight (a crash right after "started" looks the same
    # from storage): the first such call whose tool does not retry decides.
    interrupted: tuple[str, ...] = ()
    if point.when == "before" and point.operation.startswith("record_step:tool:"):
        interrupted = (point.operation.removeprefix("record_step:tool:"),)
    elif point.when == "after" and point.operation == "record_step:tools:started":
        interrupted = point.calls
    for call_id in interrupted:
        if call_id in not_called:
            continue  # never reaches its tool (its arguments do not parse, say): it runs again, whatever the policy
        policy = policies.get(call_tools.get(call_id, ""), "retry")
        if policy in ("fail", "ask"):
            return {"fail": "error", "ask": "waiting"}[policy]
    return clean


def crash_test(start: StartFn, *, job_id: str, policies: dict[str, str] | None = None,
               max_rounds: int = 1000) -> CrashReport:
    """Crash once at every persistence boundary of ``start``'s job and check each recovery (see module doc).

    ``policies`` maps tool name → ``on_interrupted`` for tools that are not
    ``"retry"`` (the default), so the harness knows which end state to expect.
    """
    clean = _run(start, job_id, None, max_rounds)
    clean_rec = clean.storage.get_job(job_id)
    if clean_rec is None:
        raise AssertionError(f"start() did not create job {job_id!r}")
    clean_msgs = clean.storage.messages(job_id)
    call_tools = {c["id"]: (c.get("function") or {}).get("name", "") for m in clean_msgs
                  for c in m.get("tool_calls") or []}
    not_called = frozenset(str(m.get("tool_call_id")) for m in clean_msgs
                           if m.get("role") == "tool" and never_called(m.get("content")))
    results = []
    first_create = next((p.index for p in clean.injector.points if p.operation == "create_job"), -1)
    for point in clean.injector.points:
        run = _run(start, job_id, point.index, max_rounds)
        rec = run.storage.get_job(job_id)
        status = rec.status.value if rec is not None else "missing"
        res = CrashResult(point, status)
        expected = _expected_status(point, clean_rec.status.value, policies or {}, call_tools, not_called)
        if expected == "missing" and point.index != first_create:
            expected = clean_rec.status.value  # a child job's creation (the job itself exists by then)
        if run.injector.crashed is None:
            res.problems.append("the run did not reach this crash point (is the model deterministic?)")
        if status != expected:
            res.problems.append(f"ended {status} ({rec.error if rec else ''}), expected {expected}")
        msgs = run.storage.messages(job_id)
        res.problems += transcript_problems(msgs)
        if expected == clean_rec.status.value and msgs != clean_msgs:
            res.problems.append("transcript differs from the clean run: "
                                f"{json.dumps(msgs)[:300]} vs {json.dumps(clean_msgs)[:300]}")
        for (kind, key), n in run.executions.items():
            if kind == "tool" and n > 1 and f"tool:{key}" in run.journaled_at_crash:
                res.problems.append(f"tool call {key} ran {n} times although its result was journaled")
        extra_model = sum(run.executions[k] for k in run.executions if k[0] == "model") - \
            sum(clean.executions[k] for k in clean.executions if k[0] == "model")
        if extra_model > (1 if point.when == "before" and point.operation in _MODEL_STEPS else 0):
            res.problems.append(f"the model was called {extra_model} extra time(s) after a crash at {point}")
        results.append(res)
    return CrashReport(clean_rec.status.value, clean_msgs, results)

"""Model faults from the loopback fake OpenAI server, each through an agent on the memory adapters.

Every fault goes through litellm's real HTTP path (``model="openai/fake-model"``,
``api_base`` on 127.0.0.1). :func:`run_faults` returns one :class:`FaultResult`
per fault: what the job ended as, and whether that is the documented outcome
(README "Errors"; DESIGN "Errors"):

* transient (429 + Retry-After, 500, 503, timeout, empty choices): retried,
  then the job completes with the same transcript as a clean run;
* permanent (400, context window): the job ends ``error`` with a message that
  says what happened, after one request (nothing retried blindly);
* tool problems (malformed arguments, unknown tool): the error goes back to
  the model as a ``role: "tool"`` message starting with ``Error:``; the job
  completes;
* a model that fails on every call: ``error`` after ``max_model_attempts``
  turns rescheduled later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from bench.chaos_lib import expected_transcript
from phases.litellm_model import LiteLLMModel
from pipelines import Agent, JobStatus
from tests.apps import chaos_app
from tests.apps.agent_app import add
from tests.fake_openai import (
    FakeOpenAI,
    Reply,
    bad_request,
    context_window_exceeded,
    empty_choices,
    malformed_tool_reply,
    rate_limited,
    server_error,
    slow,
    unavailable,
    unknown_tool_reply,
    w1_reply,
)

TURNS = 3

Check = Callable[[Any, list[dict[str, Any]], list[dict[str, Any]], int], "str | None"]
"""(record, transcript, clean transcript, requests) -> what is wrong, or None."""


@dataclass
class FaultResult:
    name: str
    outcome: str  # what happened, in a few words
    expected: str  # the documented outcome
    ok: bool
    seconds: float
    requests: int


@dataclass
class Fault:
    name: str
    script: list[Reply]
    expected: str
    check: Check
    params: dict[str, Any]
    model: Callable[[str], Any] | None = None


def _completes_like_clean(rec: Any, got: list[dict[str, Any]], want: list[dict[str, Any]], requests: int) -> str | None:
    if rec.status is not JobStatus.COMPLETE:
        return f"status {rec.status.value}: {rec.error}"
    if got != want:
        return "transcript differs from a clean run"
    if requests != TURNS + 1:
        return f"{requests} requests, expected {TURNS + 1} (one retried)"
    return None


def _fails_with(*words: str) -> Check:
    def check(rec: Any, got: list[dict[str, Any]], want: list[dict[str, Any]], requests: int) -> str | None:
        if rec.status is not JobStatus.ERROR:
            return f"status {rec.status.value}, expected error"
        missing = [w for w in words if w not in (rec.error or "")]
        if missing:
            return f"error {rec.error!r} lacks {missing}"
        if requests != 1:
            return f"{requests} requests: a permanent error was retried"
        return None

    return check


def _fails_after_attempts(rec: Any, got: list[dict[str, Any]], want: list[dict[str, Any]], requests: int) -> str | None:
    if rec.status is not JobStatus.ERROR:
        return f"status {rec.status.value}, expected error"
    if "model call failed 5 times" not in (rec.error or ""):
        return f"error {rec.error!r}"
    return None


def _tool_error_back_to_model(prefix: str) -> Check:
    def check(rec: Any, got: list[dict[str, Any]], want: list[dict[str, Any]], requests: int) -> str | None:
        if rec.status is not JobStatus.COMPLETE:
            return f"status {rec.status.value}: {rec.error}"
        tools = [m for m in got if m.get("role") == "tool"]
        if not tools or not str(tools[0].get("content")).startswith(prefix):
            return f"first tool message is {tools[0] if tools else None!r}"
        if got[-1].get("content") != "done":
            return "did not end with the model's final answer"
        return None

    return check


def faults() -> list[Fault]:
    done = "retried, then complete (transcript = clean run)"
    return [
        Fault("429 + Retry-After: 1", [rate_limited(retry_after=1)], done, _completes_like_clean, {}),
        Fault("500", [server_error(500)], done, _completes_like_clean, {}),
        Fault("503", [unavailable()], done, _completes_like_clean, {}),
        Fault("timeout (reply after 4 s, timeout 1 s)", [slow(4)], done, _completes_like_clean, {"timeout": 1}),
        Fault("empty choices", [empty_choices()], "turn rescheduled, then complete (transcript = clean run)",
              _completes_like_clean, {}),
        Fault("400 bad request", [bad_request()], "job error 'model error: bad request ...', not retried",
              _fails_with("model error", "bad request"), {}),
        Fault("400 context window", [context_window_exceeded()],
              "job error 'model error: context window exceeded ...', not retried",
              _fails_with("model error", "context window exceeded"), {}),
        Fault("malformed tool arguments", [malformed_tool_reply("add")],
              "'Error: ... not valid JSON' tool message to the model, then complete",
              _tool_error_back_to_model("Error: arguments for tool 'add' are not valid JSON"), {}),
        Fault("unknown tool", [unknown_tool_reply("no_such_tool")],
              "'Error: unknown tool ...' tool message to the model, then complete",
              _tool_error_back_to_model("Error: unknown tool 'no_such_tool'"), {}),
        Fault("500 on every call (short budget)", [server_error(500)] * 200,
              "job error after 5 attempts ('model call failed 5 times')", _fails_after_attempts, {},
              model=lambda url: LiteLLMModel("openai/fake-model", params={"api_base": url, "api_key": "sk-test"},
                                             max_retry_seconds=0.5, backoff_initial=0.05, backoff_max=0.1)),
    ]


def run_fault(fault: Fault) -> FaultResult:
    fake = FakeOpenAI().start()
    try:
        fake.script(*fault.script, w1_reply)
        clock = VirtualClock(start=1_000_000.0)
        storage, scheduler = MemoryStorage(clock=clock), MemoryScheduler(clock=clock)
        params = {"api_base": fake.url, "api_key": "sk-test", **fault.params}
        model: Any = fault.model(fake.url) if fault.model else "openai/fake-model"
        agent = Agent(name="faults", model=model, tools=[add], system=chaos_app.SYSTEM, max_turns=10,
                      model_params=None if fault.model else params)
        job_id = "fault-" + "".join(c if c.isalnum() else "-" for c in fault.name)[:40]
        t0 = time.monotonic()
        agent.run(job_id=job_id, messages=[chaos_app.user_message(job_id, TURNS)], storage=storage,
                  scheduler=scheduler)
        scheduler.drain(max_advances=100)
        seconds = time.monotonic() - t0
        rec = storage.get_job(job_id)
        assert rec is not None
        got = storage.messages(job_id)
        problem = fault.check(rec, got, expected_transcript(job_id, TURNS), len(fake.requests))
        if rec.status is JobStatus.COMPLETE:
            tool_errors = sum(1 for m in got if m.get("role") == "tool" and str(m.get("content")).startswith("Error"))
            outcome = f"complete, {rec.phases_done} turns, {len(fake.requests)} requests" + (
                f", {tool_errors} tool error(s) sent to the model" if tool_errors else "")
        else:
            outcome = f"{rec.status.value}: {(rec.error or '')[:70]}"
        if problem:
            outcome += f" [{problem}]"
        return FaultResult(fault.name, outcome, fault.expected, problem is None, seconds, len(fake.requests))
    finally:
        fake.stop()


def run_faults() -> list[FaultResult]:
    return [run_fault(f) for f in faults()]

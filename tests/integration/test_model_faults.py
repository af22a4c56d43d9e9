"""Each model fault, end to end: an agent on the memory adapters, litellm's real HTTP path, the loopback fake server.

The documented outcomes (docs/guide/operations.md "Errors", DESIGN "Errors"):

* transient (429 + Retry-After, 500, 503, timeout, empty choices): retried,
  then the job completes with the transcript of a clean run;
* a Retry-After beyond the retry budget: the turn is rescheduled for later
  instead of holding the worker asleep;
* permanent (400, context window, 401): the job ends ``error`` with a message
  saying what went wrong, after one request, the checkpoint kept for a retry;
* malformed tool arguments and unknown tools: the error goes back to the
  model as a ``role: "tool"`` message starting with ``Error:``; the job completes;
* a model failing on every call: ``error`` once ``max_model_attempts`` turns failed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from phases.litellm_model import LiteLLMModel
from pipelines import Agent, JobRecord, JobStatus
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
    unauthorized,
    unavailable,
    unknown_tool_reply,
    w1_reply,
)

TURNS = 3
SYSTEM = "You add numbers."
JOB = "fault-job"


def expected_transcript(turns: int = TURNS) -> list[dict[str, Any]]:
    """What a clean run stores: the pinned system prompt, the fake server's W1 answers and the tool's results."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": f"turns={turns}: keep adding one"}]
    while True:
        reply = w1_reply({"messages": messages})
        assert reply.message is not None
        messages.append(dict(reply.message))
        calls = reply.message.get("tool_calls") or []
        if not calls:
            return messages
        for c in calls:
            args = json.loads(c["function"]["arguments"])
            result = json.dumps({"sum": args["a"] + args["b"]})
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})


class Run:
    """One agent job on the memory adapters against ``fake``; ``drain()`` runs it to the end."""

    def __init__(self, fake: FakeOpenAI, *replies: Reply, model: Any = None, **params: Any) -> None:
        fake.script(*replies, w1_reply)
        self.fake = fake
        self.clock = VirtualClock(start=1_000_000.0)
        self.storage = MemoryStorage(clock=self.clock)
        self.scheduler = MemoryScheduler(clock=self.clock)
        self.agent = Agent(name="faults", model=model or "openai/fake-model", tools=[add], system=SYSTEM,
                           max_turns=10,
                           model_params=None if model else {"api_base": fake.url, "api_key": "sk-test", **params})

    def start(self, retry_mode: Any = None) -> Run:
        # A retry resumes from the kept checkpoint: no new messages.
        messages = [] if retry_mode else [f"turns={TURNS}: keep adding one"]
        self.agent.run(job_id=JOB, messages=messages, storage=self.storage, scheduler=self.scheduler,
                       retry_mode=retry_mode)
        return self

    def drain(self) -> JobRecord:
        self.scheduler.drain(max_advances=50)
        rec = self.storage.get_job(JOB)
        assert rec is not None
        return rec

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.storage.messages(JOB)

    def logs(self) -> list[str]:
        return [e.message for e in self.storage.logs(JOB)]


def assert_clean_completion(run: Run, rec: JobRecord, requests: int = TURNS + 1) -> None:
    assert rec.status is JobStatus.COMPLETE, rec.error
    assert rec.result == "done"
    assert run.messages == expected_transcript()
    assert len(run.fake.requests) == requests  # the faulty request, then one per turn


# --- transient: retried, then complete ----------------------------------------------------
def test_429_with_retry_after_waits_then_completes(fake_openai: FakeOpenAI) -> None:
    run = Run(fake_openai, rate_limited(retry_after=1)).start()
    rec = run.drain()
    assert_clean_completion(run, rec)
    ts = fake_openai.timestamps
    assert ts[1] - ts[0] >= 0.95  # Retry-After honoured, not a blind immediate retry
    assert rec.usage.model_calls == TURNS  # the failed attempt is not a turn


def test_429_with_retry_after_beyond_the_budget_reschedules_the_turn(fake_openai: FakeOpenAI) -> None:
    run = Run(fake_openai, rate_limited(retry_after=120)).start()
    t0 = time.monotonic()
    assert run.scheduler.run_next()  # the first turn: 429, Retry-After 120 s > the 60 s budget
    assert time.monotonic() - t0 < 10  # no sleeping inside the turn
    rec = run.storage.get_job(JOB)
    assert rec is not None and rec.status is JobStatus.RUNNING and rec.checkpoint is not None
    assert rec.checkpoint.attempt == 1
    assert rec.checkpoint.due_at - run.clock() == pytest.approx(120, abs=1)
    assert any("retrying phase in 120" in m for m in run.logs())
    rec = run.drain()
    assert_clean_completion(run, rec)


@pytest.mark.parametrize("reply", [server_error(500), server_error(502), unavailable()], ids=["500", "502", "503"])
def test_5xx_is_retried_then_completes(fake_openai: FakeOpenAI, reply: Reply) -> None:
    run = Run(fake_openai, reply).start()
    assert_clean_completion(run, run.drain())


def test_timeout_is_retried_then_completes(fake_openai: FakeOpenAI) -> None:
    run = Run(fake_openai, slow(4), timeout=1).start()
    rec = run.drain()
    assert_clean_completion(run, rec)
    # The client gave up at its timeout, not at the server's reply: had it waited, that reply was the answer and
    # no second request went (counted, not timed: litellm's first import in a process takes seconds).
    assert not any(m.get("content") == "slow answer" for m in run.storage.messages(JOB))
    assert len(fake_openai.requests) >= 2


def test_empty_choices_reschedules_the_turn_then_completes(fake_openai: FakeOpenAI) -> None:
    run = Run(fake_openai, empty_choices()).start()
    rec = run.drain()
    assert_clean_completion(run, rec)
    # Streamed (the default), an answer with no choices is a stream that held no answer (no chunk of a choice).
    assert any("retrying phase" in m and ("empty response" in m or "held no answer" in m) for m in run.logs()), \
        run.logs()


# --- permanent: job error with a clear message, not retried --------------------------------
@pytest.mark.parametrize(("reply", "words"), [
    (bad_request("Invalid value for 'messages'."), ["model error", "bad request to model openai/fake-model",
                                                    "Invalid value for 'messages'"]),
    (context_window_exceeded(), ["model error", "context window exceeded for model openai/fake-model"]),
    (unauthorized(), ["model error", "authentication failed for model openai/fake-model"]),
], ids=["400", "context-window", "401"])
def test_permanent_errors_fail_the_job_with_a_clear_message(fake_openai: FakeOpenAI, reply: Reply,
                                                            words: list[str]) -> None:
    run = Run(fake_openai, reply).start()
    rec = run.drain()
    assert rec.status is JobStatus.ERROR
    for w in words:
        assert w in (rec.error or ""), rec.error
    assert "sk-test" not in (rec.error or "")
    assert len(fake_openai.requests) == 1  # never retried blindly
    assert run.messages == expected_transcript()[:2]  # nothing of the failed turn was appended
    assert rec.checkpoint is not None and rec.checkpoint.next_phase == "turn"  # the last good checkpoint (I9)

    # ... so once the cause is fixed, a resume retry finishes the job.
    run.start(retry_mode="resume")
    rec = run.drain()
    assert rec.status is JobStatus.COMPLETE
    assert run.messages == expected_transcript()


def test_a_model_failing_on_every_call_ends_in_error_after_max_attempts(fake_openai: FakeOpenAI) -> None:
    model = LiteLLMModel("openai/fake-model", params={"api_base": fake_openai.url, "api_key": "sk-test"},
                         max_retry_seconds=0.3, backoff_initial=0.02, backoff_max=0.05)
    run = Run(fake_openai, *[server_error(500)] * 500, model=model).start()
    rec = run.drain()
    assert rec.status is JobStatus.ERROR
    assert "model call failed 5 times" in (rec.error or ""), rec.error
    assert "unavailable" in (rec.error or "")
    assert sum("retrying phase" in m for m in run.logs()) == 4
    assert run.messages == expected_transcript()[:2]


# --- tool problems go back to the model ---------------------------------------------------
def _tool_error_turn(run: Run, rec: JobRecord, prefix: str) -> None:
    assert rec.status is JobStatus.COMPLETE, rec.error
    msgs = run.messages[1:]  # after the pinned system prompt
    bad_call = msgs[1]["tool_calls"][0]
    assert msgs[2]["role"] == "tool" and msgs[2]["tool_call_id"] == bad_call["id"]
    assert msgs[2]["content"].startswith(prefix), msgs[2]["content"]
    # The model saw the error in its next request and carried on.
    assert msgs[2] in fake_requests_messages(run.fake, 1)
    assert msgs[-1] == {"role": "assistant", "content": "done"}
    assert [m["content"] for m in msgs if m["role"] == "tool"][1:] == ['{"sum": 3}']


def fake_requests_messages(fake: FakeOpenAI, i: int) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items()} for m in fake.requests[i]["messages"]]


def test_malformed_tool_arguments_go_back_to_the_model(fake_openai: FakeOpenAI) -> None:
    run = Run(fake_openai, malformed_tool_reply("add")).start()
    rec = run.drain()
    _tool_error_turn(run, rec, "Error: arguments for tool 'add' are not valid JSON")
    assert "Fix the arguments" in run.messages[3]["content"]


def test_an_unknown_tool_goes_back_to_the_model(fake_openai: FakeOpenAI) -> None:
    run = Run(fake_openai, unknown_tool_reply("no_such_tool")).start()
    rec = run.drain()
    _tool_error_turn(run, rec, "Error: unknown tool 'no_such_tool'; available tools: add")

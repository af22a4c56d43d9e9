"""16 agent jobs of 5 turns each on two real workers, the model served by the loopback fake OpenAI server."""

from __future__ import annotations

import re
from typing import Any

import pytest
import redis

from adapters.rq import rq_job_id
from pipelines import JobStatus, run_agent
from pipelines.app import App
from tests.apps.agent_app import AGENT_NAME, add
from tests.system.conftest import Cluster, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.system]

JOBS, TURNS = 16, 5  # enough jobs that both workers take many turns of many jobs; 50 proved no more


def fake_server(cluster: Cluster) -> str:
    cluster.start(["-m", "tests.fake_openai", "--port", "0", "--mode", "w1"], "fake-openai")
    log = cluster.logdir / "fake-openai.log"

    def ready() -> str | None:
        found = re.search(r"READY (\S+)", log.read_text()) if log.exists() else None
        return found.group(1) if found else None

    url: str = wait_for("the fake OpenAI server", ready, 20, cluster.logs)
    return url


def check_transcript(job_id: str, messages: list[dict[str, Any]]) -> None:
    """Every tool call has exactly one tool result, after it; the agent ends with its final text."""
    calls: list[str] = []
    results: dict[str, int] = {}
    for m in messages:
        if m["role"] == "assistant":
            calls += [c["id"] for c in m.get("tool_calls") or []]
        elif m["role"] == "tool":
            assert m["tool_call_id"] in calls, f"{job_id}: result for an unknown call {m['tool_call_id']}"
            results[m["tool_call_id"]] = results.get(m["tool_call_id"], 0) + 1
    assert len(calls) == len(set(calls)) == TURNS - 1, (job_id, calls)
    assert results == dict.fromkeys(calls, 1), (job_id, results)
    assert [m for m in messages if m["role"] == "assistant"][-1]["content"] == "done"
    assert messages[-1]["role"] == "assistant"


def test_two_workers_run_16_agent_jobs_of_5_turns(cluster: Cluster, app: App, client: redis.Redis) -> None:
    url = fake_server(cluster)
    cluster.env["FAKE_OPENAI_BASE"] = url
    # SimpleWorkers: a forked horse pays litellm's lazy first-call set-up on
    # every turn (~0.7 s here), which would blow the time budget; the forking
    # worker is covered by the pipeline and kill tests.
    cluster.worker("agents-1", "--simple")
    cluster.worker("agents-2", "--simple")

    jobs = [f"agent-{i}" for i in range(JOBS)]
    for job_id in jobs:
        run_agent(job_id=job_id, name=AGENT_NAME, model="openai/fake-model", tools=[add],
                  initial_messages=[f"turns={TURNS}: keep adding one"], storage=app.storage,
                  scheduler=app.scheduler, max_turns=20,
                  model_params={"api_base": url, "api_key": "sk-test"})

    def progress() -> dict[str, int]:
        out: dict[str, int] = {}
        for j in jobs:
            rec = app.storage.get_job(j)
            key = rec.status.value if rec else "missing"
            out[key] = out.get(key, 0) + 1
        return out

    def diagnose() -> str:
        lines = [str(progress())]
        for j in jobs:
            rec = app.storage.get_job(j)
            if rec is not None and rec.status is not JobStatus.COMPLETE:
                rq_id = rq_job_id(j, rec.version)
                rq_status = client.hget(f"rq:job:{rq_id}", "status")
                lines.append(f"{j}: lease={app.storage.lease_owner(j)} rq {rq_id}={rq_status!r} "
                             f"{rec.model_dump_json()[:600]}")
        return "\n".join(lines) + "\n" + cluster.logs()

    wait_for(f"{JOBS} agent jobs to complete", lambda: progress() == {"complete": JOBS}, 90, diagnose)
    for job_id in jobs:
        rec = app.storage.get_job(job_id)
        assert rec is not None and rec.status is JobStatus.COMPLETE
        messages = app.storage.messages(job_id)
        assert len(messages) == rec.transcript_len
        check_transcript(job_id, messages)
        assert rec.usage.model_calls == TURNS  # I5: one model call per turn, none repeated

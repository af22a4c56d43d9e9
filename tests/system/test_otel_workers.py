"""One trace per job across processes: the web side opens the run, a real worker's turns join its trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipelines.engine import telemetry
from tests.system.conftest import ROOT, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.system]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    # This process plays the web side; its provider can be set once per process, so reuse one if set.
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    telemetry.reset()
    yield memory
    telemetry.reset()


def test_a_jobs_turns_on_a_worker_process_join_the_trace_its_run_opened(
        redis_url: str, tmp_path: Path, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    spans_file = tmp_path / "worker-spans.jsonl"
    env = {"REDIS_URL": redis_url, "OTEL_SPANS_FILE": str(spans_file), "PYTHONPATH": str(ROOT)}
    monkeypatch.setenv("REDIS_URL", redis_url)
    from tests.apps import otel_app

    otel_app.app.run_pipeline("steps", job_id="traced", initial_state={"n": 0})
    run = next(s for s in exporter.get_finished_spans() if s.name == "run steps")
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.run([sys.executable, "-m", "pipelines", "worker", "--app", otel_app.APP_PATH,
                                 "--simple", "--burst", "--sweep-interval", "0"], cwd=ROOT,
                                env={**os.environ, **env}, stdout=out, stderr=out, timeout=120)
    assert worker.returncode == 0, log.read_text()
    wait_for("the job to complete", lambda: otel_app.app.get("traced").status.value == "complete", 10,
             log.read_text)
    spans: list[dict[str, Any]] = [json.loads(line) for line in spans_file.read_text().splitlines() if line]
    turns = [s for s in spans if s["name"] == "turn steps"]
    assert len(turns) == 3  # one per phase run, all in the worker process
    trace_id = f"0x{run.context.trace_id:032x}"
    assert {s["context"]["trace_id"] for s in turns} == {trace_id}
    assert {s["parent_id"] for s in turns} == {f"0x{run.context.span_id:016x}"}
    assert all(s["attributes"]["phaserunner.job_id"] == "traced" for s in turns)

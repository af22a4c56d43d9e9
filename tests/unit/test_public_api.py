"""The public surface: names exported, and what `import pipelines` must not pull in."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pipelines


def test_all_names_exist_and_are_public() -> None:
    for name in pipelines.__all__:
        assert hasattr(pipelines, name), name
    contract = {"Phase", "PhaseContext", "Next", "Done", "Fail", "run_pipeline", "advance_phase",
                "JobRecord", "JobStatus", "Checkpoint", "LogEntry", "run_agent", "build_agent_phase", "tool", "Tool",
                "approve", "reject", "pause_job", "resume_job", "cancel_job"}
    assert contract <= set(pipelines.__all__)


def test_import_pipelines_does_not_import_redis_rq_or_litellm() -> None:
    code = (
        "import sys, pipelines, phases, adapters, adapters.memory, adapters.base\n"
        "bad = [m for m in ('redis', 'rq', 'litellm') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("first", ["phases", "phases.agent_turn", "adapters.base", "adapters.memory",
                                   "pipelines.testing", "phases.tools"])
def test_any_module_can_be_imported_first(first: str) -> None:
    code = f"import {first}; import pipelines; print(pipelines.run_pipeline.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "run_pipeline"

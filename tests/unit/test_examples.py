"""The shipped examples run offline and do what their docs say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from adapters.memory import MemoryScheduler, MemoryStorage
from examples.support_agent import build_agent

ROOT = Path(__file__).resolve().parents[2]


def test_make_demo_program_runs_offline_and_completes(tmp_path: Path) -> None:
    # On its SQLite file, as `make demo` runs it (a kill and a restart: tests/system/test_demo_resume.py).
    out = subprocess.run([sys.executable, "examples/support_agent.py", "--db", str(tmp_path / "demo.db"), "--pace",
                          "0"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PIPELINES_BLOCK_REMOTE_MODELS": "1"})
    assert out.returncode == 0, out.stderr
    assert "status: complete" in out.stdout
    assert "lookup_order" in out.stdout and "get_policy" in out.stdout
    assert "waiting for a person: issue_refund" in out.stdout  # the approval step
    expected = "structured result: SupportAnswer(order_id='A-1001', order_status='shipped', refund_issued=True"
    assert expected in out.stdout


def test_support_agent_transcript_pairs_every_tool_call_with_one_result() -> None:
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    agent = build_agent(refunds=False)
    for i in range(3):
        agent.run(job_id=f"s-{i}", messages=["Where is A-1001?"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    for i in range(3):
        msgs = storage.messages(f"s-{i}")
        calls = [c["id"] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        results = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
        assert calls == results and len(calls) == 2
        assert "DHL" in msgs[-1]["content"]

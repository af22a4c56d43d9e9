"""The public surface: names exported, what public signatures use, and what imports must not pull in."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

import pipelines

# The contract with users (issue "One handle and one transition core"): changing it is a decision.
PINNED = [
    "AdvanceResult", "Agent", "App", "Done", "Event", "Fail", "FailJob", "JobRecord", "JobStatus", "JobView",
    "LogEntry", "Model", "Next", "Phase", "PhaseContext", "Pipeline", "PipelineError", "PrepareTurn",
    "RateLimit", "RetryLater", "RetryMode", "RunHandle", "StopCondition", "Tool", "ToolContext", "TurnInfo", "TurnPlan",
    "Usage", "WaitForInput", "advance_phase", "build_agent_phase", "has_tool_call", "max_turns", "run_agent",
    "run_pipeline", "tool",
]


def test_all_is_sorted_small_and_pinned() -> None:
    assert pipelines.__all__ == sorted(pipelines.__all__, key=lambda n: (n[0].islower(), n))
    assert pipelines.__all__ == PINNED
    assert len(pipelines.__all__) <= 36
    for name in pipelines.__all__:
        assert getattr(pipelines, name) is not None, name


def _names_in(annotation: Any) -> set[str]:
    """Public class or alias names of this library that a (string) annotation mentions."""
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return {w for w in text.replace("[", " ").replace("]", " ").replace("|", " ").replace(",", " ").split()
            if w.split(".")[-1][:1].isupper()}


def _signatures() -> list[tuple[str, inspect.Signature]]:
    out = []
    for name in pipelines.__all__:
        obj = getattr(pipelines, name)
        if inspect.isclass(obj):
            for meth_name, meth in inspect.getmembers(obj, inspect.isfunction):
                ours = (meth.__module__ or "").split(".")[0] in ("pipelines", "phases", "adapters")
                if ours and (not meth_name.startswith("_") or meth_name == "__init__"):
                    out.append((f"{name}.{meth_name}", inspect.signature(meth)))
        elif callable(obj) and inspect.isfunction(obj):
            out.append((name, inspect.signature(obj)))
    return out


def test_every_library_type_in_a_public_signature_is_exported() -> None:
    exported = set(pipelines.__all__)
    # Types from elsewhere that signatures may name: the ports, pydantic, typing and builtins.
    allowed = {"Storage", "Scheduler", "BaseModel", "Any", "Sequence", "Mapping", "Iterable", "Callable",
               "Awaitable", "None", "Checkpoint", "Message", "JSONValue", "RunOptions", "AgentConfig", "T", "S",
               "PipelineSource", "PipelineFor", "Outcome", "InterruptPolicy", "ModelRequest", "ModelResponse",
               "BaseException", "Literal", "Build", "AdvanceFn", "LogLevel", "PhaseFn", "PhaseOutput",
               "Migrating",  # what a turn migrates from: built by the runner, read by phases.view_migration
               "RunEnv"}  # the turn's environment: built by the App, read by phases and tools (pipelines.engine.env)
    missing: dict[str, set[str]] = {}
    for where, sig in _signatures():
        mentioned: set[str] = set()
        for p in sig.parameters.values():
            mentioned |= _names_in(p.annotation)
        mentioned |= _names_in(sig.return_annotation)
        bad = {n.split(".")[-1] for n in mentioned} - exported - allowed - {"Signature", "Parameter"}
        bad = {n for n in bad if n not in dir(typing) and n not in dir(__builtins__)}
        if bad:
            missing[where] = bad
    assert missing == {}


def test_import_pipelines_does_not_import_redis_rq_or_litellm() -> None:
    code = (
        "import sys, pipelines, phases, adapters, adapters.memory, adapters.base\n"
        "pipelines.App, pipelines.Agent, pipelines.run_agent\n"
        "bad = [m for m in ('redis', 'rq', 'litellm') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_memory_adapters_load_no_composition_module() -> None:
    code = ("import json, sys, adapters.memory, adapters.base\n"
            "mods = sorted(m for m in sys.modules if m.startswith(('pipelines', 'phases', 'adapters')))\n"
            "print(json.dumps(mods))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    composition = {"pipelines.app", "pipelines.agent", "pipelines.lowlevel", "pipelines.cli", "pipelines.worker",
                   "pipelines.handle"}
    assert not composition & set(loaded)
    assert not [m for m in loaded if m.startswith("phases")]


@pytest.mark.parametrize("first", ["phases", "phases.agent_turn", "adapters.base", "adapters.memory",
                                   "pipelines.testing", "phases.tools", "pipelines.engine.transitions"])
def test_any_module_can_be_imported_first(first: str) -> None:
    code = f"import {first}; import pipelines; print(pipelines.run_pipeline.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "run_pipeline"


def _imports(path: Path) -> set[str]:
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_the_engine_imports_only_itself_and_the_ports() -> None:
    root = Path(__file__).resolve().parents[2]
    ours = ("pipelines", "phases", "adapters")
    for path in (root / "pipelines" / "engine").rglob("*.py"):
        bad = {m for m in _imports(path) if m.split(".")[0] in ours
               and not m.startswith(("pipelines.engine", "adapters.base")) and m != "pipelines"}
        assert bad == set(), f"{path.name} imports {sorted(bad)}"


def test_adapters_and_phases_import_only_the_engine_and_the_ports() -> None:
    root = Path(__file__).resolve().parents[2]
    for folder in ("adapters", "phases"):
        for path in (root / folder).rglob("*.py"):
            bad = {m for m in _imports(path) if m.startswith("pipelines") and not m.startswith("pipelines.engine")
                   and m != "pipelines"}
            assert bad == set(), f"{folder}/{path.name} imports {sorted(bad)}"

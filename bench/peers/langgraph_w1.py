"""Workload W1 (bench/w1.py) on LangGraph: a StateGraph loop agent -> tools -> agent ... with a scripted model.

    bench/peers/.venv/bin/python bench/peers/langgraph_w1.py --saver memory|sqlite --jobs 200 --turns 10 --runs 1

Run by bench/peers/run.py in its own venv (LangGraph is not a dependency of
phaserunner), which passes W1's strings in ``BENCH_W1`` so every message has
the same size as ours. Prints one JSON line: ``{"peer": ..., "turns_per_s":
[one per run], ...}``.

The graph is the one LangGraph's docs build for a tool-calling agent:
``MessagesState``, an ``agent`` node calling a chat model, the prebuilt
``ToolNode`` and ``tools_condition``, compiled with a checkpointer
(``InMemorySaver``, or ``SqliteSaver`` on a file in a temp dir) and one
``thread_id`` per job. ``durability="sync"`` by default: every step is
persisted before the next one starts, as phaserunner and cl-pipelines commit
each turn before the next (LangGraph's own default, ``"async"``, writes the
checkpoint while the next step already runs; ``--durability async`` measures
that). One W1 turn is two LangGraph steps (agent, then tools), so the
recursion limit is set to let ``turns + 1`` turns through, W1's
``max_turns``.

No network: the model is a local class, LangSmith tracing is off unless the
environment turns it on (run.py clears it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

W1 = json.loads(os.environ.get("BENCH_W1") or "{}")
if not W1:
    sys.exit("BENCH_W1 is not set: run this through bench/peers/run.py (it passes W1's strings)")
TEXT, USER, SYSTEM = W1["text"], W1["user"], W1["system"]


class W1Chat(BaseChatModel):
    """W1's scripted model as a LangChain chat model: stateless, turn ``k`` = assistant messages shown.

    Usage is estimated over the whole prompt (chars / 4 + 1), as
    ``pipelines.testing.ScriptedModel`` does, so both sides walk the history.
    """

    turns: int

    @property
    def _llm_type(self) -> str:
        return "w1-scripted"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        k = sum(1 for m in messages if isinstance(m, AIMessage))
        chars = sum(len(m.content) for m in messages if isinstance(m.content, str))
        usage = {"input_tokens": chars // 4 + 1, "output_tokens": 51, "total_tokens": chars // 4 + 52}
        if k >= self.turns - 1:
            msg = AIMessage(content="done", usage_metadata=usage)
        else:
            msg = AIMessage(content=TEXT, usage_metadata=usage,
                            tool_calls=[{"name": "add", "args": {"a": k, "b": 1}, "id": f"call_{k}",
                                         "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=msg)])


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


def build(turns: int, saver: Any) -> Any:
    """The agent graph: agent -> (tool calls?) tools -> agent ..., else the end."""
    model = W1Chat(turns=turns)

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        # The system prompt is pinned at each call and not stored, as phaserunner's Agent(system=...) does.
        return {"messages": [model.invoke([SystemMessage(SYSTEM), *state["messages"]])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([add]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


def check(messages: list[BaseMessage], turns: int) -> None:
    """A finished W1 job: user, (assistant + tool) x (turns - 1), then "done"; last tool result {"sum": turns - 1}."""
    if len(messages) != 2 * turns or messages[-1].content != "done":
        raise AssertionError(f"unexpected W1 transcript: {len(messages)} messages, last {messages[-1]!r:.120}")
    if json.loads(str(messages[-2].content)) != {"sum": turns - 1}:
        raise AssertionError(f"unexpected last tool result {messages[-2]!r:.120}")


def run_once(graph: Any, jobs: int, turns: int, tag: str, durability: str) -> float:
    limit = 2 * (turns + 1) + 1
    gc.collect()
    t0 = time.perf_counter()
    for j in range(jobs):
        graph.invoke({"messages": [{"role": "user", "content": USER}]},
                     {"configurable": {"thread_id": f"{tag}-{j}"}, "recursion_limit": limit}, durability=durability)
    seconds = time.perf_counter() - t0
    for j in (0, jobs - 1):
        check(graph.get_state({"configurable": {"thread_id": f"{tag}-{j}"}}).values["messages"], turns)
    return seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--saver", choices=("memory", "sqlite"), required=True)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--durability", choices=("sync", "async", "exit"), default="sync")
    a = p.parse_args()
    rates = []
    with tempfile.TemporaryDirectory(prefix="w1-langgraph-") as tmp:
        # A fresh saver (and SQLite file) per run, as ours gets fresh MemoryStorage per run.
        for r in range(-1, a.runs):
            jobs = a.warm if r < 0 else a.jobs
            if a.saver == "memory":
                seconds = run_once(build(a.turns, InMemorySaver()), jobs, a.turns, f"r{r}", a.durability)
            else:
                with SqliteSaver.from_conn_string(str(Path(tmp) / f"run{r}.sqlite")) as saver:
                    seconds = run_once(build(a.turns, saver), jobs, a.turns, f"r{r}", a.durability)
            if r >= 0:
                rates.append(a.jobs * a.turns / seconds)
    versions = {name: version(name) for name in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite",
                                                 "langchain-core")}
    print(json.dumps({"peer": f"langgraph-{a.saver}", "turns_per_s": rates, "durability": a.durability,
                      "versions": versions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

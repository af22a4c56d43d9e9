"""The W1 agent of DESIGN.md for the system tests: one ``add`` tool, a model on the loopback fake server."""

from __future__ import annotations

from pipelines import Agent, tool

AGENT_NAME = "adder"


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


def adder_agent(base: str) -> Agent:
    """The agent, talking to ``tests.fake_openai`` at ``base`` (``http://127.0.0.1:PORT/v1``)."""
    return Agent(name=AGENT_NAME, model="openai/fake-model", tools=[add], system="You add numbers.", max_turns=20,
                 model_params={"api_base": base, "api_key": "sk-test", "timeout": 20})

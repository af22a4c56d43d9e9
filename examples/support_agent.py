"""A customer-support agent: looks up orders and policies, then answers.

Offline (the default, what `make demo` runs): memory adapters and a scripted
model, no keys, no network. With a real model, unchanged otherwise:

    python examples/support_agent.py --model openai/gpt-4o-mini      # needs OPENAI_API_KEY
    python examples/support_agent.py --model ollama/llama3.1 --api-base http://127.0.0.1:11434

The same `build_agent()` serves a Redis/RQ deployment (see examples/production/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, tool
from pipelines.models import Message
from pipelines.testing import ScriptedModel, call, reply

ORDERS = {
    "A-1001": {"status": "shipped", "carrier": "DHL", "eta": "2026-12-03", "total_eur": 89.90, "days_since": 4},
    "A-1002": {"status": "processing", "carrier": None, "eta": None, "total_eur": 12.00, "days_since": 1},
}
POLICIES = {
    "returns": "Items can be returned within 30 days of delivery for a full refund. Shipping back is free.",
    "shipping": "Standard shipping takes 3-5 business days within the EU.",
}

SYSTEM = (
    "You are the support agent of a small online shop. Look facts up with your tools before answering; "
    "never guess order details. Answer in two or three friendly sentences."
)


@tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id (like A-1001): status, carrier, estimated delivery, total."""
    order = ORDERS.get(order_id.strip().upper())
    if order is None:
        return {"error": f"no order {order_id!r}"}
    return {"order_id": order_id, **order}


@tool
def get_policy(topic: str) -> str:
    """Read the shop's policy on a topic: 'returns' or 'shipping'."""
    return POLICIES.get(topic.strip().lower(), f"No policy named {topic!r}; topics: {', '.join(POLICIES)}")


def scripted_support_model() -> ScriptedModel:
    """What a good model would do here, decided from the transcript so every job gets its own answers."""

    def next_turn(messages: list[Message]) -> Any:
        tool_results = [m for m in messages if m.get("role") == "tool"]
        if not tool_results:
            return reply("Let me look that up.", call("lookup_order", order_id="A-1001"))
        if len(tool_results) == 1:
            return reply(None, call("get_policy", topic="returns"))
        order = json.loads(tool_results[0]["content"])
        return reply(
            f"Your order {order['order_id']} has {order['status']} with {order['carrier']} and should arrive on "
            f"{order['eta']}. You can return it within 30 days of delivery for a full refund, and shipping it "
            "back is free."
        )

    return ScriptedModel(next_turn)


def build_agent(model: Any = None, model_params: dict[str, Any] | None = None) -> Agent:
    """The agent, described once: used by the demo, the tests and the production worker."""
    return Agent(name="support", model=model or scripted_support_model(), tools=[lookup_order, get_policy],
                 system=SYSTEM, max_turns=6, model_params=model_params)


def print_transcript(messages: list[Message]) -> None:
    for m in messages:
        role = m["role"]
        if role == "tool":
            print(f"  tool[{m['tool_call_id']}] -> {m['content']}")
            continue
        if m.get("content"):
            print(f"  {role}: {m['content']}")
        for c in m.get("tool_calls") or []:
            print(f"  {role} calls {c['function']['name']}({c['function']['arguments']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a litellm model id; default: the offline scripted model")
    parser.add_argument("--api-base", help="an OpenAI-compatible endpoint for --model")
    parser.add_argument("--question", default="Hi! Where is my order A-1001, and can I still return it?")
    args = parser.parse_args(argv)

    params = {"api_base": args.api_base} if args.api_base else None
    agent = build_agent(args.model, params)
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    agent.run(job_id="support-1", messages=[args.question], storage=storage, scheduler=scheduler)

    print(f"job support-1 enqueued ({scheduler.pending()} advance pending); running turns:\n")
    shown = 0
    turn = 0
    while scheduler.run_next():  # one turn per advance; `scheduler.drain()` does the same in one call
        turn += 1
        messages = storage.messages("support-1")
        print(f"turn {turn}:")
        print_transcript(messages[shown:] if shown else messages)
        shown = len(messages)
    job = storage.get_job("support-1")
    assert job is not None
    print(f"\nstatus: {job.status}   model calls: {job.usage.model_calls}   "
          f"tokens: {job.usage.total_tokens}   transcript: {len(storage.messages('support-1'))} messages")
    if job.error:
        print(f"error: {job.error}")
    return 0 if job.status == "complete" else 1


if __name__ == "__main__":
    raise SystemExit(main())

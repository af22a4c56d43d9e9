"""A customer-support agent: looks up orders and policies, then answers.

Offline (the default, what `make demo` runs): a scripted model, no keys, no network, and the run kept in
an SQLite file (`.phaserunner/demo.db`) worked by local worker threads. Stop it mid-run (Ctrl-C, or
`kill -9`) and start it again: it resumes the same job where it stopped, and says so. With a real model,
unchanged otherwise:

    python examples/support_agent.py --model openai/gpt-4o-mini      # needs OPENAI_API_KEY
    python examples/support_agent.py --model ollama/llama3.1 --api-base http://127.0.0.1:11434
    python examples/support_agent.py --memory                         # memory adapters, nothing on disk

The same `build_agent()` serves a Redis/RQ deployment (see examples/production/).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from adapters.local import LocalScheduler
from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.sqlite import SQLiteStorage
from pipelines import Agent, App, JobStatus, ToolContext, tool
from pipelines.engine.models import Message
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


REFUNDS: list[dict[str, Any]] = []


@tool(needs_approval=True, idempotent=False, on_interrupted="ask")
def issue_refund(order_id: str, amount_eur: float, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order. A person approves every refund before it is paid."""
    # The idempotency key lets the payment provider drop a duplicate request.
    REFUNDS.append({"order_id": order_id, "amount_eur": amount_eur, "idempotency_key": ctx.idempotency_key})
    return {"refunded": True, "order_id": order_id, "amount_eur": amount_eur}


class SupportAnswer(BaseModel):
    """What the shop's systems get back from a conversation (structured output)."""

    order_id: str
    order_status: str
    refund_issued: bool
    reply: str


def scripted_support_model(pace: float = 0.0) -> ScriptedModel:
    """What a good model would do here, decided from the transcript so every job gets its own answers.

    ``pace``: seconds each answer takes, as a real model's would (the demo's, so a turn can be interrupted).
    """

    def next_turn(messages: list[Message]) -> Any:
        time.sleep(pace)
        results = [m for m in messages if m.get("role") == "tool"]
        last = messages[-1]
        if last.get("role") == "user" and str(last.get("content", "")).startswith("Now reply with only a JSON"):
            order = json.loads(results[0]["content"])
            refunded = any('"refunded": true' in str(m.get("content")) for m in results)
            return reply(json.dumps({"order_id": order["order_id"], "order_status": order["status"],
                                     "refund_issued": refunded, "reply": messages[-2]["content"]}))
        question = next(str(m.get("content", "")) for m in messages if m.get("role") == "user")
        wants_refund = "refund" in question.lower()
        if not results:
            return reply("Let me look that up.", call("lookup_order", order_id="A-1001"))
        if len(results) == 1:
            return reply(None, call("get_policy", topic="returns"))
        order = json.loads(results[0]["content"])
        if len(results) == 2 and wants_refund:
            return reply(None, call("issue_refund", order_id=order["order_id"], amount_eur=order["total_eur"]))
        refund = " I have refunded it." if len(results) == 3 and "refunded" in results[2]["content"] else ""
        return reply(
            f"Your order {order['order_id']} has {order['status']} with {order['carrier']} and should arrive on "
            f"{order['eta']}. You can return it within 30 days of delivery for a full refund, and shipping it "
            f"back is free.{refund}"
        )

    return ScriptedModel(next_turn)


def build_agent(model: Any = None, model_params: dict[str, Any] | None = None, *, refunds: bool = True,
                pace: float = 0.0) -> Agent:
    """The agent, described once: used by the demo, the tests and the production worker."""
    tools = [lookup_order, get_policy, *([issue_refund] if refunds else [])]
    return Agent(name="support", model=model or scripted_support_model(pace), tools=tools, system=SYSTEM,
                 max_turns=8, model_params=model_params, output_schema=SupportAnswer if refunds else None)


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a litellm model id; default: the offline scripted model")
    parser.add_argument("--api-base", help="an OpenAI-compatible endpoint for --model")
    parser.add_argument("--question", default="Hi! Where is my order A-1001? It arrived damaged, please refund it.")
    parser.add_argument("--db", default=".phaserunner/demo.db", help="the SQLite file (default: %(default)s)")
    parser.add_argument("--memory", action="store_true", help="memory adapters instead: nothing kept on disk")
    parser.add_argument("--pace", type=float, default=0.5,
                        help="seconds the scripted model takes per answer, to leave time for a Ctrl-C (default: 0.5)")
    return parser


def _start_or_resume(app: App, question: str) -> str:
    """The unfinished support job left by a stopped run (said so), else a new one; its id."""
    unfinished = [v for v in app.jobs() if v.record.pipeline == "support" and not v.finished]
    if unfinished:
        view = unfinished[-1]
        print(f"resuming job {view.job_id} where it stopped: {len(app.messages(view.job_id))} messages committed "
              f"before the stop, status {view.status.value} (a stopped or killed run loses nothing it committed)\n")
        return view.job_id
    # A name no job had: counting the jobs would give a deleted one's number to a job that still exists.
    job_id = f"support-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    app.run_agent("support", job_id=job_id, messages=[question])
    print(f"job {job_id} started; running turns:\n")
    return job_id


class _Printer:
    """Prints each committed turn's new messages, and approves what waits for a person (the demo's person)."""

    def __init__(self, app: App, job_id: str) -> None:
        self.app, self.job_id, self.shown = app, job_id, 0

    def step(self) -> bool:
        """Show what was committed since the last call; ``True`` once the job finished."""
        view = self.app.get(self.job_id)
        assert view is not None
        messages = self.app.messages(self.job_id)
        if len(messages) > self.shown:  # (an advance that stopped to wait for a person committed no messages)
            print("so far:" if not self.shown else f"turn {view.record.phases_done}:", flush=True)
            print_transcript(messages[self.shown:])
            self.shown = len(messages)
        for p in view.pending_calls:  # in production a person does this: `pipelines approve JOB CALL`
            print(f"\n  waiting for a person: {p['tool']}({p['arguments']}) -> approved\n", flush=True)
            self.app.approve(self.job_id, p["call_id"])
        return view.finished


_TURN_ENDS = {"turn_committed", "approval_requested", "job_waiting", "job_finished", "job_failed", "job_cancelled"}


def _follow_live(app: App, job_id: str) -> None:
    """Wait on the job's live stream (woken by each commit) and print every turn as it commits."""
    printer = _Printer(app, job_id)
    cursor = None
    while not printer.step():
        for part in app.stream(job_id, after=cursor, timeout=5):
            cursor = part.id
            if part.type in _TURN_ENDS:
                break


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    params = {"api_base": args.api_base} if args.api_base else None
    agent = build_agent(args.model, params, pace=0.0 if args.memory else args.pace)
    if args.memory:
        memory = MemoryScheduler()
        app = App(storage=MemoryStorage(), scheduler=memory, agents=[agent])
        job_id = _start_or_resume(app, args.question)
        printer = _Printer(app, job_id)
        while not printer.step() and (memory.pending() or app.get(job_id).pending_calls):  # type: ignore[union-attr]
            memory.run_next()  # one turn per advance; `app.drain()` runs them all
    else:
        Path(args.db).parent.mkdir(parents=True, exist_ok=True)
        # One demo a file: a second would "resume" the first one's live job as if it had stopped. The lock
        # goes with this process (a kill -9 included), so a stopped demo never keeps the next one out.
        import fcntl  # Unix only, as the embedded default's process checks are; --memory needs none

        lock = open(f"{Path(args.db).resolve()}.demo-lock", "w")  # noqa: SIM115 - held for the life of the process
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"another demo is running on {args.db}: stop it first, or give this one its own file with "
                  "--db PATH", file=sys.stderr)
            return 1
        local = LocalScheduler(workers=2)
        storage = SQLiteStorage(args.db)
        # The demo is the one process on its file, so it upgrades a file an earlier release wrote itself (a
        # service runs `pipelines migrate --app M:A` with its workers stopped).
        before, after = storage.migrate()
        if 0 < before < after:
            print(f"{args.db}: upgraded from schema version {before} to {after}")
        app = App(storage=storage, scheduler=local, agents=[agent])
        print(f"runs kept in {Path(args.db).resolve()} (SQLite), turns run by {local.workers} worker threads")
        job_id = _start_or_resume(app, args.question)
        with local:  # the workers stop with this block; a turn in flight finishes first
            _follow_live(app, job_id)
    return _report(app, job_id)


def _report(app: App, job_id: str) -> int:
    job = app.get(job_id)
    assert job is not None
    print(f"\nstatus: {job.status}   model calls: {job.usage.model_calls}   "
          f"tokens: {job.usage.total_tokens}   transcript: {len(app.messages(job_id))} messages")
    if job.error:
        print(f"error: {job.error}")
    else:
        print(f"structured result: {job.result!r}")
    return 0 if job.status is JobStatus.COMPLETE else 1


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("\nstopped; run it again and the job resumes where it stopped", file=sys.stderr)
        raise SystemExit(130) from None

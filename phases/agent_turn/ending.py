"""After a turn's tools ran: its events, and whether the run stops (and with what result) or goes on."""

from __future__ import annotations

from typing import Any

from phases import journal
from phases.agent_config import AgentConfig
from phases.agent_turn.plan import TURN_PHASE
from phases.model import ModelResponse
from phases.stop import CUT_REASON, CUT_WHY, TurnInfo, should_stop
from pipelines.engine.models import Message, Usage
from pipelines.engine.phase import Done, Next, PhaseContext

__all__: list[str] = []


def _decide(ctx: PhaseContext[Any], cfg: AgentConfig, info: TurnInfo, cut: str | None, usage: Usage) -> Next | Done:
    """Stop or go on, after a turn's tools ran; ``cut``: why the answer was cut short (:func:`cut_short`)."""
    n = info.turn
    if cut is not None:
        ctx.log(f"model answer {CUT_WHY[cut]} (finish_reason={cut}) at turn {n}; stopping", "warn")
        return Done(reason=CUT_REASON[cut])
    if not info.tool_calls:
        return Done(reason="done")
    reason = should_stop(cfg.stop_when, info)
    if reason is not None:
        ctx.log(f"stopped by {reason} at turn {n}")
        return Done(reason="stop_when")
    if n >= cfg.max_turns:
        ctx.log(f"stopped: max_turns={cfg.max_turns} reached with tool calls pending a reply", "warn")
        return Done(reason="max_turns")
    over = _over_budget(usage, cfg)
    if over:
        ctx.log(f"budget reached at turn {n}: {over}", "warn")
        return Done(reason="budget")
    # The state's JSON form (what AgentState(turn=n) dumps to): the runner stores it as it is.
    return Next(TURN_PHASE, state={"turn": n})


def _emit_turn_events(ctx: PhaseContext[Any], turn: int, response: ModelResponse, results: list[Message]) -> None:
    # Small on purpose: the transcript already holds arguments and results;
    # events say what happened, in order, with the turn number. They are built
    # once the turn's work is done; turn_started keeps the time the turn began.
    # Each event carries the time its step was journaled in this attempt (a timeline's spans), else now.
    ctx.emit_at(ctx.started_at, "turn_started", turn=turn, attempt=ctx.attempt)
    usage = response.usage
    answered = ctx.recorded_at(journal.MODEL)
    # "reused": the answer was journaled by an earlier attempt of this turn (a timeline draws no model call here).
    reused = {} if ctx.journaled_here(journal.MODEL) else {"reused": True}
    # What was sent, in short (phases.agent_turn.model_call.request_summary), and which model answered.
    sent = {} if response.request is None else {"request": response.request}
    answered_by = {} if response.model is None else {"model": response.model}
    raw = {} if response.raw is None else {"raw": response.raw}  # the provider's response around the message
    ctx.emit_at(answered, "model_response", turn=turn, finish_reason=response.finish_reason,
                tool_calls=len(response.tool_calls), prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens, cost_usd=usage.cost_usd, **reused, **sent,
                **answered_by, **raw)
    names = {c["id"]: (c.get("function") or {}).get("name") for c in response.tool_calls}
    for call_id, name in names.items():
        ctx.emit_at(answered, "tool_call", turn=turn, call_id=call_id, tool=name)
    for msg in results:
        content = msg.get("content")
        ctx.emit_at(ctx.recorded_at(journal.tool_key(str(msg["tool_call_id"]))), "tool_result", turn=turn,
                    call_id=msg["tool_call_id"], tool=names.get(msg["tool_call_id"]),
                    error=isinstance(content, str) and content.startswith("Error:"))


def _over_budget(usage: Usage, cfg: AgentConfig) -> str:
    if cfg.max_tokens is not None and usage.total_tokens >= cfg.max_tokens:
        return f"max_tokens={cfg.max_tokens} (used {usage.total_tokens})"
    if cfg.max_cost_usd is not None and usage.cost_usd >= cfg.max_cost_usd:
        return f"max_cost_usd={cfg.max_cost_usd} (used {usage.cost_usd:.4f})"
    return ""


def _result_of(message: Message, results: list[Message]) -> Any:
    content = message.get("content")
    if content:
        return content
    return results[-1]["content"] if results else None

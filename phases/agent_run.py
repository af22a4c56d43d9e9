"""What an agent turn derives from its run before calling the model: tools, prepare_call, warnings, tool calls.

Kept apart from :mod:`phases.agent_turn` so the turn stays small. Everything
here is recomputed by whichever worker runs a turn, from the job's stored
options (``context`` included): providers and hooks must be deterministic.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from phases import conversation, journal
from phases.agent_config import AgentConfig
from phases.callbacks import CALLBACKS, fire
from phases.compaction import MARKER_KEY, compacted_view
from phases.model import ModelResponse
from phases.run_input import tool_context_of
from phases.stop import CUT_WHY, cut_short
from phases.tool_runner import run_tools, tool_message
from phases.tools import Tool, tool_map
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import JSONValue, Message, Usage
from pipelines.engine.phase import Done, Fail, FailJob, Next, PhaseContext

Outcome = TypeVar("Outcome", Next, Done, Fail, Next | Done | Fail)

__all__ = ["CallPlan", "TOOLS_KEY", "callbacks_of", "context_of", "ended", "extended_view", "first_turn",
           "only_commit_follows", "quiet", "resolve_run", "run_turn_calls", "tool_contexts", "turn_ended",
           "turn_messages", "view_key"]

TOOLS_KEY = journal.TOOLS_NAMES
"""Journal key: the tool names a provider returned for this turn (a re-run must get the same)."""


@dataclass
class CallPlan:
    """What a whole run uses; ``prepare_call`` may change it (model, params, system, tools, max_turns).

    ``context`` is the run's ``context=`` (read it, do not change it).
    """

    job_id: str
    context: JSONValue
    model: Any
    params: dict[str, Any]
    system: str | None
    tools: list[Any]
    max_turns: int


def context_of(ctx: PhaseContext[Any]) -> JSONValue:
    """The run's ``context=`` (stored with the job)."""
    return ctx.options.get("context")


def tool_contexts(ctx: PhaseContext[Any], cfg: AgentConfig) -> dict[str, Any]:
    """Each tool's ``tools_context`` entry, as the tool reads it (``context_model`` instances)."""
    entries = ctx.options.get("tools_context") or {}
    return {name: tool_context_of(t, entries) for name, t in cfg.tmap.items() if name in entries}


def callbacks_of(cfg: AgentConfig) -> dict[str, Any]:
    """The agent's lifecycle callbacks that are set, by name (worked out once per config: it is frozen)."""
    found: dict[str, Any] | None = cfg.__dict__.get("_callbacks")
    if found is None:
        found = cfg.__dict__["_callbacks"] = {n: fn for n in CALLBACKS if (fn := getattr(cfg, n)) is not None}
    return found


def quiet(ctx: PhaseContext[Any], cfg: AgentConfig) -> bool:
    """No lifecycle callback to call, the agent's or the run's: a turn then builds none of their arguments."""
    return not callbacks_of(cfg) and not len(ctx.env.callbacks)


def only_commit_follows(ctx: PhaseContext[Any], cfg: AgentConfig) -> bool:
    """Whether nothing with effects outside the job runs between a turn's last journal write and its commit:
    no lifecycle callback, structured answer or title (the write's reply may then wait for the commit's)."""
    return quiet(ctx, cfg) and cfg.output_schema is None and cfg.title_agent is None


def resolve_run(ctx: PhaseContext[Any], cfg: AgentConfig) -> AgentConfig:
    """``cfg`` with a tools provider's tools for this run, then ``prepare_call`` applied."""
    provider = cfg.tools_provider
    if provider is not None:
        cfg = replace(cfg, tools=tool_map(provider(context_of(ctx))))
        names = sorted(cfg.tmap)
        found, before = ctx.recorded(TOOLS_KEY)
        if found and before != names:
            # The model's journaled answer may call a tool that is gone: never guess.
            raise FailJob(f"the tools provider returned {names} on this attempt but {before} when the turn "
                          "started; it must be a deterministic function of the run's context")
        if not found:
            ctx.record(TOOLS_KEY, names)
    if cfg.prepare_call is None:
        return cfg
    plan = CallPlan(job_id=ctx.job_id, context=context_of(ctx), model=cfg.model,
                    params=dict(cfg.model_params or {}), system=cfg.system, tools=list(cfg.tmap.values()),
                    max_turns=cfg.max_turns)
    plan = cfg.prepare_call(plan) or plan
    unknown = [getattr(t, "name", t) for t in plan.tools if cfg.tmap.get(getattr(t, "name", "")) is not t]
    if unknown:
        raise InvalidInputError(f"prepare_call offered tools the agent does not have: {unknown}")
    return replace(cfg, model=plan.model, model_params=plan.params, system=plan.system, tools=plan.tools,
                   max_turns=plan.max_turns)


def turn_messages(cfg: AgentConfig, past: list[Message]) -> list[Message]:
    """The messages the model gets: one system message (pinned or current), then the conversation.

    Older turns are replaced by their compaction summary, and a tool with a
    ``preview`` shows the model only the start of a long result (the
    transcript keeps it whole).
    """
    view = conversation.model_messages(compacted_view(past), system=cfg.system,
                                       conflict=conversation.check_conflict_mode(cfg.system_prompt_conflict))
    return _previewed(view, cfg.tmap)


def view_key(cfg: AgentConfig) -> Hashable | None:
    """What :func:`turn_messages` reads of ``cfg``; ``None`` when a view of it cannot be extended (previews).

    Two configurations with the same key build the same view of the same
    transcript, so a view kept from an earlier turn is valid for this one.
    """
    if any(t.preview for t in cfg.tmap.values()):
        return None  # a preview depends on which call a result answers, anywhere in the view
    return (cfg.system, cfg.system_prompt_conflict)


def extended_view(view: list[Message], new: Sequence[Message]) -> list[Message] | None:
    """``view`` (the model view of a transcript) + ``new``, when that is the view of the transcript + ``new``.

    That holds when no message of ``new`` is a marker or a system message
    (and the tools have no previews, see :func:`view_key`): appending then
    leaves the latest marker, the pin and every earlier message where they
    were, and each new message shows as it is. Otherwise ``None``: build the
    view whole.
    """
    if any(MARKER_KEY in m or m.get("role") == "system" for m in new):
        return None
    return [*view, *new]


def _previewed(view: list[Message], tmap: Mapping[str, Tool]) -> list[Message]:
    limits = {name: t.preview for name, t in tmap.items() if t.preview}
    if not limits:
        return view
    tool_of = {c.get("id"): (c.get("function") or {}).get("name") for m in view for c in m.get("tool_calls") or []
               if isinstance(c, dict)}
    out = []
    for m in view:
        limit = limits.get(str(tool_of.get(m.get("tool_call_id")))) if m.get("role") == "tool" else None
        content = m.get("content")
        if limit and isinstance(content, str) and len(content) > limit:
            m = {**m, "content": f"{content[:limit]}\n... ({len(content) - limit} more characters not shown)"}
        out.append(m)
    return out


def first_turn(ctx: PhaseContext[Any], cfg: AgentConfig, past: list[Message]) -> None:
    """A run's first turn: its warnings (``warn`` log + ``agent_warning`` event), then ``on_start``."""
    dropped = ctx.options.get(conversation.DROPPED_KEY)
    # The pin the model sees: a view migration may have re-pinned the prompt.
    warnings = conversation.system_warnings(
        compacted_view(past), system=cfg.system, conflict=conversation.check_conflict_mode(cfg.system_prompt_conflict),
        suppress=cfg.suppress_system_prompt_conflict_warning, dropped=dropped if isinstance(dropped, int) else 0)
    for text in warnings:
        ctx.log(text, "warn")
        ctx.emit("agent_warning", turn=ctx.job_turn, message=text)
    if not quiet(ctx, cfg):
        fire(ctx, callbacks_of(cfg), "on_start", turn=1, context=context_of(ctx))


def run_turn_calls(ctx: PhaseContext[Any], cfg: AgentConfig, response: ModelResponse, turn: int) -> list[Message]:
    """The turn's tool calls run with ``cfg``'s tools (a provider's included), callbacks around them."""
    calls = response.tool_calls
    cut = cut_short(response.finish_reason)
    if cut is not None and calls:
        # Arguments of a cut-off answer cannot be trusted: answer every
        # call without running it, so the transcript stays valid.
        return [tool_message(c, f"Error: not run, the model's answer was {CUT_WHY[cut]}") for c in calls]
    offered = cfg.tmap if response.tools_offered is None else {
        n: t for n, t in cfg.tmap.items() if n in response.tools_offered}
    if quiet(ctx, cfg):
        return run_tools(ctx, offered, calls, turn, default_timeout=cfg.tool_timeout,
                         before_commit=only_commit_follows(ctx, cfg))
    hooks, context = callbacks_of(cfg), context_of(ctx)
    for c in calls:
        fn = c.get("function") or {}
        fire(ctx, hooks, "on_tool_start", turn=turn + 1, context=context, call_id=c["id"], tool=fn.get("name"),
             arguments=fn.get("arguments"))
    results = run_tools(ctx, offered, calls, turn, default_timeout=cfg.tool_timeout)
    names = {c["id"]: (c.get("function") or {}).get("name") for c in calls}
    for msg in results:
        fire(ctx, hooks, "on_tool_end", turn=turn + 1, context=context, call_id=msg["tool_call_id"],
             tool=names.get(msg["tool_call_id"]), result=msg.get("content"))
    return results


def turn_ended(ctx: PhaseContext[Any], cfg: AgentConfig, response: ModelResponse, turn: int) -> None:
    """``on_turn_end`` with the turn's usage and finish reason."""
    if quiet(ctx, cfg):
        return
    fire(ctx, callbacks_of(cfg), "on_turn_end", turn=turn + 1, context=context_of(ctx),
         usage=response.usage.model_dump(), finish_reason=response.finish_reason)


def ended(ctx: PhaseContext[Any], cfg: AgentConfig, outcome: Outcome, usage: Usage, turn: int) -> Outcome:
    """``on_end`` (the job's total usage, result, reason) when ``outcome`` ends the run; returns ``outcome``."""
    if quiet(ctx, cfg):
        return outcome
    if isinstance(outcome, Done):
        fire(ctx, callbacks_of(cfg), "on_end", turn=turn + 1, context=context_of(ctx), usage=usage.model_dump(),
             result=outcome.result, reason=outcome.reason or "done")
    elif isinstance(outcome, Fail):
        fire(ctx, callbacks_of(cfg), "on_end", turn=turn + 1, context=context_of(ctx), usage=usage.model_dump(),
             result=None, reason="error", error=outcome.error)
    return outcome

"""What decides whether a call runs: the turn's fan-out limit, approvals, and the interrupted-call policies."""

from __future__ import annotations

from typing import Any

from phases import journal
from phases.tool_runner.calls import _function, _tool_of, arguments_digest, journal_result, tool_context
from phases.tools import Tool, ToolArgumentsError, result_content
from pipelines.engine import children
from pipelines.engine._aio import resolve
from pipelines.engine.contain import message_of
from pipelines.engine.phase import FailJob, PhaseContext, RetryLater, WaitForInput

__all__: list[str] = []


def _refuse_extra_children(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]]) -> None:
    """Journal an error result for each child-starting call past the turn's fan-out limit (no child starts).

    Counted in the answer's order over all its calls, done or not, so a
    re-run after a crash refuses the same calls.
    """
    starting = [c for c in calls if getattr(_tool_of(tmap, c), "starts_child", False) is True]
    for call in starting[children.MAX_CHILDREN_PER_TURN:]:
        if not ctx.recorded(journal.tool_key(call['id']))[0]:
            ctx.record(journal.tool_key(call['id']), children.fan_out_refused(str(_function(call).get("name"))))


def _check_approvals(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]]) -> None:
    """Calls of tools that need approval run only once a person approved these exact arguments."""
    waiting = []
    for call in calls:
        fn = _function(call)
        t = _tool_of(tmap, call)
        if t is None or t.needs_approval is False:
            continue
        try:
            args = t.parse(fn.get("arguments"))
        except ToolArgumentsError:
            continue  # never runs: the model gets the argument error instead
        try:
            asks = t.requires_approval(args)
        except (FailJob, RetryLater, WaitForInput):
            raise  # the hook's own signal (ask again later, say): as any phase code's
        except Exception as exc:  # the app's hook, not the model's arguments: the job says whose it is
            raise FailJob(f"needs_approval of tool {t.name!r} raised {type(exc).__name__} for call {call['id']}: "
                          f"{message_of(exc)}") from exc
        if not asks:
            continue
        found, decision = ctx.recorded(journal.approval_key(call['id']))
        if not found or decision.get("digest") != arguments_digest(call):
            waiting.append({"call_id": call["id"], "tool": t.name, "arguments": fn.get("arguments")})
        elif decision.get("decision") == "rejected":
            reason = decision.get("reason") or "no reason given"
            ctx.record(journal.tool_key(call['id']), f"Error: a person rejected this call: {reason}")
    if waiting:
        names = ", ".join(f"{w['tool']} ({w['call_id']})" for w in waiting)
        raise WaitForInput(f"approval needed for {names}", call_id=waiting[0]["call_id"],
                           details={"kind": "approval", "calls": waiting})


def _apply_interrupt_policies(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]],
                              turn: int) -> None:
    for call in calls:
        name = _function(call).get("name", "")
        t = _tool_of(tmap, call)
        if t is None or t.on_interrupted == "retry":
            continue  # runs again below
        try:
            args = t.parse(_function(call).get("arguments"))
        except ToolArgumentsError:
            continue  # never called (its arguments do not parse): runs again below, which tells the model so
        what = f"tool {name!r} call {call['id']} was interrupted mid-call; whether it took effect is unknown"
        if t.on_interrupted == "fail":
            raise FailJob(f"{what} (on_interrupted='fail'); record its outcome with record_tool_result, then retry")
        if t.on_interrupted == "ask":
            raise WaitForInput(f"{what}; record its outcome with record_tool_result to continue", call_id=call["id"],
                               details={"kind": "outcome", "tool": name})
        assert t.reconcile is not None
        tctx = tool_context(ctx, call["id"], name, turn)
        found = resolve(t.reconcile(args, tctx))
        if found is not None:
            journal_result(ctx, call, result_content(found))  # too large for the transcript: an error
        ctx.log(f"reconciled interrupted call {call['id']} of {name!r}: "
                f"{'effect found' if found is not None else 'no effect, running it again'}")

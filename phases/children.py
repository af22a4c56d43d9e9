"""Agents and pipelines as tools, and an agent as one phase of a pipeline: durable child runs.

``agent.as_tool(description=...)`` (:func:`agent_tool`), :func:`pipeline_tool`
and :func:`agent_phase` start a **child job** instead of running anything in
the parent's turn. Its id derives from the parent job and the call id
(:func:`pipelines.engine.children.child_job_id`), so a re-run after a crash
finds the same child and never starts a second one (``create_job`` refuses a
taken id). The parent then waits (status ``waiting``, ``waiting={"kind":
"children", "calls": [...]}``) without holding a worker, and the child's final
commit wakes it: the child's result (its text, or its typed result as JSON)
becomes the tool result; a failed child gives ``Error: ...`` or, with
``on_child_error="fail"``, fails the parent. See :mod:`pipelines.engine.children`
for the wake-up and the sweep that makes it crash-safe.

Child runs need an :class:`~pipelines.app.App` (workers advance jobs through
one): the App hands itself to every turn it runs as ``ctx.env.children``
(:class:`~pipelines.engine.env.RunEnv`), so a tool finds it on whichever thread
it runs, and registers the agents its tools and phases start.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from phases.tools import Tool, ToolContext
from pipelines.engine import children as children_rules
from pipelines.engine import transitions, versions, writer
from pipelines.engine.children import KIND, child_job_id, child_key, owned
from pipelines.engine.env import ChildRuns
from pipelines.engine.errors import InvalidInputError, JobConflictError, StaleVersionError
from pipelines.engine.models import check_messages, to_json_value
from pipelines.engine.phase import Done, Fail, Next, Phase, PhaseContext, WaitForInput

# The App (pipelines.app) is not imported here: phases import only the engine. ``App`` below is the
# App as the turn's environment hands it (pipelines.engine.env.ChildRuns).
App = ChildRuns

__all__ = ["AgentToolInput", "OnChildError", "agent_phase", "agent_tool", "check_child_error",
           "pipeline_tool", "start_child"]

OnChildError = Literal["error_result", "fail"]
"""A failed or cancelled child: its ``Error: ...`` text is the tool result, or the parent fails."""

MapRun = Callable[[Any], Mapping[str, Any]]


class AgentToolInput(BaseModel):
    """The default arguments of an agent used as a tool: one request in plain words."""

    input: str = Field(description="What to ask, in plain words, with everything the agent needs to know")


def _default_map_run(args: Any) -> Mapping[str, Any]:
    if isinstance(args, AgentToolInput):
        return {"user": args.input}
    if isinstance(args, str):
        return {"user": args}
    return {"user": json.dumps(to_json_value(args, what="the child's input"))}


def check_child_error(on_child_error: object) -> OnChildError:
    """``on_child_error`` if it is a policy, else :class:`InvalidInputError`."""
    if on_child_error not in ("error_result", "fail"):
        raise InvalidInputError(f"on_child_error must be 'error_result' or 'fail', got {on_child_error!r}")
    return on_child_error


# --- starting a child -----------------------------------------------------------------------
def start_child(app: App, *, parent_job: str, call_id: str, target: Any, run: Mapping[str, Any],
                per_run: bool = True, parent_run: str = "") -> str:
    """Start the child job of ``parent_job``'s call ``call_id`` unless it exists; returns its id.

    ``target`` is an agent (``run`` holds ``user``/``messages`` and per-run
    options) or a registered pipeline's name (``run`` holds
    ``initial_state``). Bad input raises before anything is written. A job
    found under the child's id is adopted only if its record names this
    parent and call (else :class:`JobConflictError`); a new child deeper than
    :data:`~pipelines.engine.children.MAX_DEPTH` is refused with
    :class:`InvalidInputError` (see :mod:`pipelines.engine.children`).
    ``per_run``: the child belongs to the parent's run that started it (a tool call's); ``False``: to the
    parent's whole life, found again by every run (a conversation's title). ``parent_run``: the run of the
    turn that starts it (``ToolContext.run``); a turn of a run its job has left (fenced off by a forced
    cancel, then a full retry) starts nothing: :class:`StaleVersionError`. The child takes the parent's
    ``concurrency_key`` and ``priority`` unless ``run`` names them (:data:`FLOW_OPTIONS`).
    """
    parent = app.storage.get_job(parent_job)
    epoch = children_rules.run_of(parent) if per_run and parent is not None else ""
    if per_run and parent_run and epoch and parent_run != epoch:
        raise StaleVersionError(f"job {parent_job!r} went on to another run while call {call_id} ran; "
                                "its turn was fenced off and starts no child run")
    child_id = child_job_id(parent_job, call_id)
    existing = app.storage.get_job(child_id)
    if existing is not None and children_rules.of_another_run(existing, epoch):
        # The child of a call with this id in an earlier run or life of the parent (a full retry, the job deleted
        # and made again, a model that repeats its call ids): not this call's. This call's gets an id of its own.
        child_id = child_job_id(parent_job, f"{call_id}@{epoch}")
        existing = app.storage.get_job(child_id)
    if existing is not None:
        return _adopted(existing, parent_job, call_id)  # a re-run of the call: the child it started is the one
    depth = _depth_below(parent_job, parent)
    name, first, version, start = _child_start(app, child_id, target, dict(run))
    options = _flow_inherited(parent, run, start.get("options", {}))
    commit = transitions.create_child(
        child_id, parent_job=parent_job, parent_call=call_id, pipeline=name, first=first,
        state=to_json_value(start.get("initial_state"), what=f"initial state of child job {child_id!r}"),
        messages=check_messages(start.get("messages", []), f"messages of child job {child_id!r}"),
        options=to_json_value(options, what=f"options of child job {child_id!r}"),
        now=app.scheduler.now(), depth=depth, parent_epoch=epoch or None)
    commit = commit.model_copy(update={"record": versions.stamp(commit.record, version, new=True)})
    try:
        writer.apply(app.storage, app.scheduler, commit)
    except JobConflictError:
        # The id was taken between the look and the create (the create refuses a taken id atomically):
        # a duplicate worker's child is the one; anything else is judged on the owner its create wrote.
        existing = app.storage.get_job(child_id)
        if existing is None:
            raise JobConflictError(f"child job {child_id!r} was created and deleted while call {call_id} of "
                                   f"job {parent_job!r} started it; try again") from None
        return _adopted(existing, parent_job, call_id)
    return child_id


FLOW_OPTIONS = ("concurrency_key", "priority")
"""The per-run options a child run takes from its parent unless its ``map_run`` names them."""


def _flow_inherited(parent: Any, asked: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The child's ``options`` with the parent's concurrency key and priority where ``asked`` (the child's run,
    as ``map_run`` gave it) does not name them: a tenant's limit and a background job's queue hold for the whole
    family. Named, even as ``None``, the child's own stands (``None``: no key, the interactive queue)."""
    inherited = dict(options)
    for name in FLOW_OPTIONS:
        value = parent.options.get(name) if parent is not None else None
        if name not in asked and isinstance(value, str) and value:
            inherited[name] = value
    return inherited


def _adopted(found: Any, parent_job: str, call_id: str) -> str:
    """``found``'s id if it is the child of ``parent_job``'s call ``call_id``; else :class:`JobConflictError`.

    The owner fields are written by the child's create and never change, so
    reading them after the create refused the id is as sound as inside it.
    """
    if not owned(found, parent_job, call_id):
        owner = (f"call {found.parent_call} of job {found.parent_job!r}" if found.parent_job is not None
                 else "no parent (a job started on its own)")
        raise JobConflictError(f"job {found.job_id!r} is not the child run of call {call_id} of job "
                               f"{parent_job!r}: it belongs to {owner}; no child was started")
    return str(found.job_id)


def _depth_below(parent_job: str, parent: Any) -> int:
    """The depth of ``parent_job``'s next child (``parent``: its record), or :class:`InvalidInputError` past
    ``MAX_DEPTH``."""
    depth = (parent.depth if parent is not None else 0) + 1
    if depth > children_rules.MAX_DEPTH:
        raise InvalidInputError(
            f"job {parent_job!r} may not start a child run: it is {depth - 1} levels below its family's root, "
            f"the deepest a family of child runs may grow (pipelines.engine.children.MAX_DEPTH = "
            f"{children_rules.MAX_DEPTH}); answer without it")
    return depth


def _child_start(app: App, child_id: str, target: Any,
                 run: dict[str, Any]) -> tuple[str, str, str | None, Mapping[str, Any]]:
    """(pipeline name, first phase, version, start_run's keyword arguments) for a new child."""
    if isinstance(target, str):
        pipeline = app.pipeline(target)
        unknown = sorted(set(run) - {"initial_state"})
        if unknown:
            raise InvalidInputError(f"map_run of a pipeline tool returns only 'initial_state', got {unknown}")
        return target, pipeline.first, pipeline.version, {"initial_state": run.get("initial_state")}
    if app.agents.get(target.name) is not target:
        app.add_agent(target)
    messages = list(run.pop("messages", None) or [])
    user = run.pop("user", None)
    if user is not None:
        messages.append(user)
    start = target.start_run(child_id, messages, run, app)
    pipeline = app.pipeline(target.name)
    return target.name, pipeline.first, pipeline.version, start


def _wait(call_id: str, child_id: str, on_error: OnChildError, what: str) -> WaitForInput:
    return WaitForInput(f"waiting for child job {child_id} ({what})", call_id=call_id,
                        details={"kind": KIND, "calls": [{"call_id": call_id, "child": child_id,
                                                          "on_error": on_error, "what": what}]})


# --- tools ---------------------------------------------------------------------------------
def _child_tool(target: Any, *, name: str, description: str, input_model: type[BaseModel] | None,
                map_run: MapRun | None, on_child_error: OnChildError) -> Tool:
    policy = check_child_error(on_child_error)
    mapper = map_run or _default_map_run

    def execute(args: BaseModel, ctx: ToolContext) -> Any:
        # Reached only while the call has no result: the wake-up puts the child's into the journal.
        child_id = start_child(ctx.env.child_runs(), parent_job=ctx.job_id, call_id=ctx.call_id, target=target,
                               run=mapper(args), parent_run=ctx.run)
        raise _wait(ctx.call_id, child_id, policy, f"tool {name}")

    built = Tool(name=name, description=description, input_model=input_model or AgentToolInput, execute=execute)
    built.child_agent = None if isinstance(target, str) else target  # type: ignore[attr-defined]
    # Counted against the turn's fan-out limit by the tool runner (children.MAX_CHILDREN_PER_TURN).
    built.starts_child = True  # type: ignore[attr-defined]
    return built


def agent_tool(agent: Any, *, description: str, name: str | None = None,
               input_model: type[BaseModel] | None = None, map_run: MapRun | None = None,
               on_child_error: OnChildError = "error_result") -> Tool:
    """``agent`` as a tool of another agent: each call runs it as a child job (see the module doc).

    ``input_model`` (default :class:`AgentToolInput`, one ``input`` string) is
    what the calling model fills in; ``map_run(args)`` turns it into the
    child's run: ``user``/``messages`` plus per-run options (``context``,
    ``max_turns``, ...). Default: the ``input`` text as the user message.
    The child runs under the parent's ``concurrency_key`` and ``priority``
    unless ``map_run`` names them (``"concurrency_key": None``: no key).
    """
    return _child_tool(agent, name=name or agent.name, description=description, input_model=input_model,
                       map_run=map_run, on_child_error=on_child_error)


def pipeline_tool(pipeline: str, *, description: str, input_model: type[BaseModel], name: str | None = None,
                  map_run: MapRun | None = None, on_child_error: OnChildError = "error_result") -> Tool:
    """The pipeline registered as ``pipeline`` as a tool: each call runs it as a child job.

    ``map_run(args)`` returns ``{"initial_state": ...}`` (default: the
    arguments as the initial state); the child's result is the tool result.
    """
    if not isinstance(pipeline, str) or not pipeline:
        raise InvalidInputError(f"pipeline_tool needs a registered pipeline's name, got {pipeline!r}")

    def default(args: Any) -> Mapping[str, Any]:
        return {"initial_state": args}

    return _child_tool(pipeline, name=name or pipeline, description=description, input_model=input_model,
                       map_run=map_run or default, on_child_error=on_child_error)


# --- an agent as a phase ---------------------------------------------------------------------
class _AgentPhase:
    """The ``run`` of :func:`agent_phase`: start the agent's child job, wait, go on with its result."""

    def __init__(self, agent: Any, name: str, next_phase: str | None, map_run: MapRun,
                 map_result: Callable[[Any, Any], Any] | None, on_child_error: OnChildError) -> None:
        self.child_agent = agent
        self.name = name
        self.next_phase = next_phase
        self.map_run = map_run
        self.map_result = map_result
        self.on_child_error = on_child_error

    def call_id(self, ctx: PhaseContext[Any]) -> str:
        # The checkpoint's creation time is kept through waits and resume retries, and new for a run that
        # reaches this phase again (a full retry, a loop, a fork): one child per arrival at the phase.
        return f"phase-{self.name}-{int(ctx.checkpoint.created_at * 1000)}"

    def __call__(self, ctx: PhaseContext[Any]) -> Next | Done | Fail:
        call_id = self.call_id(ctx)
        found, outcome = ctx.recorded(child_key(call_id))
        if not found:
            child_id = start_child(ctx.env.child_runs(), parent_job=ctx.job_id, call_id=call_id,
                                   target=self.child_agent, run=self.map_run(ctx.state),
                                   parent_run=ctx.checkpoint.transcript_epoch)
            raise _wait(call_id, child_id, "error_result", f"phase {self.name}")
        if outcome.get("status") != "complete":
            error = f"child job {outcome.get('job_id')!r} ended {outcome.get('status')}: {outcome.get('error')}"
            if self.on_child_error == "fail":
                return Fail(error)
        result = outcome.get("result") if outcome.get("status") == "complete" else f"Error: {error}"
        if self.next_phase is None:
            return Done(result=result)
        state = self.map_result(ctx.state, result) if self.map_result is not None else result
        return Next(self.next_phase, state=state)


def agent_phase(agent: Any, *, name: str | None = None, next_phase: str | None = None,
                map_run: MapRun | None = None, map_result: Callable[[Any, Any], Any] | None = None,
                on_child_error: OnChildError = "fail") -> Phase:
    """``agent`` as one phase of a multi-phase pipeline, with a conversation of its own (a child job).

    ``map_run(state)`` gives the child's run (default: the state as the user
    message); ``map_result(state, result)`` the state for ``next_phase``
    (default: the result). Without ``next_phase`` the phase ends the job with
    the agent's result. A failed child fails the job (``on_child_error``).
    """
    phase_name = name or agent.name
    run = _AgentPhase(agent, phase_name, next_phase, map_run or _default_map_run, map_result,
                      check_child_error(on_child_error))
    return Phase(phase_name, run)

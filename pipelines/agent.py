"""``Agent``: an agent described once — model, tools, system prompt, limits.

Register it on an :class:`~pipelines.app.App` (``App(agents=[support])``)
and start runs by name (``app.run_agent("support", job_id=..., messages=...)``);
workers find it by the pipeline name stored on each job. Model settings (api
keys included) live in code or the environment, never in the stored job.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from phases.agent_config import AgentConfig, check_run_options
from phases.agent_turn import TURN_PHASE, AgentState, AgentTurn
from phases.children import agent_tool, check_child_error
from phases.conversation import DROPPED_KEY, start_messages
from phases.model import Model
from phases.run_input import check_context, check_tools_context
from phases.tools import Tool, tool_map
from pipelines.engine import versions
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import JobRecord, JobStatus, Message, validate_job_id
from pipelines.engine.phase import Phase, Pipeline

if TYPE_CHECKING:
    from adapters.base import Scheduler, Storage
    from pipelines.app import App
    from pipelines.engine.start import RetryMode
    from pipelines.handle import RunHandle

__all__ = ["Agent", "as_messages"]


# What other agent libraries call an option of ours.
_OTHER_NAMES = {"system_prompt": "system", "instructions": "system", "prompt": "system", "temperature": "model_params",
                "max_iterations": "max_turns", "max_steps": "max_turns", "response_format": "output_schema",
                "output_type": "output_schema"}


class Agent:
    """An agent described once: ``Agent(name=, model=, tools=, system=, max_turns=, ...)``.

    Options (each documented on :class:`~phases.agent_config.AgentConfig`):
    ``tools``, ``system``, ``max_turns``, ``stop_when``, ``model_params``,
    ``output_schema``, ``max_tokens``, ``max_cost_usd``, ``prepare_turn``,
    ``tool_timeout``, ``max_model_attempts``, ``max_retries``, ``prepare_call``,
    ``system_prompt_conflict``, ``suppress_system_prompt_conflict_warning`` and
    the lifecycle callbacks (``on_start``, ``on_turn_start``, ``on_tool_start``,
    ``on_tool_end``, ``on_turn_end``, ``on_end``: see :mod:`phases.callbacks`).
    ``tools`` may be a provider: a deterministic function of the run's
    ``context`` returning the tools. ``system`` is pinned as the first message
    of each new conversation (see :mod:`phases.conversation`). ``name`` is the
    pipeline name stored on its jobs: workers find the agent by it.
    ``version`` (dotted numbers, default: the App's ``version`` when it is
    one) and ``migrations={from_version: fn(state)}``: see
    :mod:`pipelines.engine.versions`. ``view_migrations={from_version:
    fn(messages)}`` upgrade the model view of an older job in the same turn,
    recorded in its transcript: see :mod:`phases.view_migration`.
    """

    def __init__(self, *, name: str = "agent", model: str | Model, **options: Any) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidInputError(f"an agent needs a non-empty name, got {name!r}")
        self._name = name
        # Versioned jobs (pipelines.engine.versions): checked now, carried by the agent's pipeline.
        self.version = versions.check_version(options.pop("version", None))
        self.migrations = versions.check_migrations(options.pop("migrations", None), self.version)
        self.view_migrations = versions.check_migrations(options.pop("view_migrations", None), self.version,
                                                         of="the messages", name="view_migrations")
        known = {f.name for f in dataclasses.fields(AgentConfig) if f.init} | {"version", "migrations",
                                                                            "view_migrations"}
        unknown = sorted(set(options) - known)
        if unknown:  # a typo, or another library's name: said so, with ours, instead of AgentConfig's TypeError
            name = unknown[0]
            close = _OTHER_NAMES.get(name) or next(iter(difflib.get_close_matches(name, sorted(known), n=1)), None)
            raise InvalidInputError(f"Agent: unknown option {name!r}" + (f" (did you mean {close!r}?)" if close
                                    else "") + f"; the options are {', '.join(sorted(known - {'model'}))}")
        try:
            # Built now, so a bad tool or limit fails at definition, not at the first job.
            self.config = AgentConfig(model=model, **options)
        except TypeError as exc:
            raise InvalidInputError(f"Agent: {exc}") from None
        self._turn = AgentTurn(self.config, self.view_migrations)
        self._phase = Phase(TURN_PHASE, self._turn, copy_state=False)  # it returns a new state each turn

    def __repr__(self) -> str:
        return f"Agent(name={self._name!r})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def output_schema(self) -> type[BaseModel] | None:
        return self.config.output_schema

    @property
    def takes_messages_while_running(self) -> bool:
        """``app.send`` to a run in progress queues the messages (``on_new_message="enqueue"``)."""
        return self.config.on_new_message == "enqueue"

    @property
    def titles_conversations(self) -> bool:
        """Whether its conversations get a title from a title job (it has a ``title_agent``)."""
        return self.config.title_agent is not None

    @property
    def uses_litellm(self) -> bool:
        """Whether workers should import litellm before forking (``pipelines worker``)."""
        model = self.config.model
        return isinstance(model, str) or type(model).__module__ == "phases.litellm_model"

    def as_tool(self, *, description: str, name: str | None = None, input_model: type[BaseModel] | None = None,
                map_run: Any = None, on_child_error: str = "error_result") -> Tool:
        """This agent as a tool of another agent: each call runs it as a durable child job.

        See :func:`phases.children.agent_tool` (``input_model``, ``map_run``,
        ``on_child_error``). The tool's name defaults to the agent's.
        """
        return agent_tool(self, description=description, name=name, input_model=input_model, map_run=map_run,
                          on_child_error=check_child_error(on_child_error))

    # --- PipelineSource (what an App needs) ----------------------------------------------
    def pipeline(self) -> Pipeline:
        """The agent's pipeline: one ``turn`` phase that reschedules itself."""
        return Pipeline([self._phase], version=self.version, migrations=self.migrations or None)

    def phases(self) -> list[Phase]:
        return [self._phase]

    def accept_schemas(self, schemas: Mapping[str, type[BaseModel]]) -> None:
        self._turn.schemas.update(schemas)

    def start_options(self, messages: Any, options: Mapping[str, Any], app: App) -> dict[str, Any]:
        return {"initial_state": AgentState().model_dump(), "messages": as_messages(messages),
                "options": check_run_options(options, {**self._turn.schemas, **app.schemas})}

    def start_run(self, job_id: str, messages: Any, options: Mapping[str, Any], app: App) -> dict[str, Any]:
        """:meth:`start_options` for the job ``job_id``: pins the system prompt on a new conversation.

        The caller's system messages are dropped (the run's first turn warns);
        ``context`` and ``tools_context`` are checked and stored with the run.
        """
        opts = dict(options)
        context = opts.pop("context", None)
        tools_context = opts.pop("tools_context", None)
        stored = check_run_options(opts, {**self._turn.schemas, **app.schemas})
        if context is not None:
            stored["context"] = check_context(context)
        if tools_context is not None:
            stored["tools_context"] = check_tools_context(tools_context, self._tools_for(stored.get("context")))
        existing = app.storage.get_job(validate_job_id(job_id))
        msgs, dropped = start_messages(as_messages(messages), system=self.config.system,
                                       new_conversation=existing is None)
        if dropped:
            stored[DROPPED_KEY] = dropped
        return {"initial_state": AgentState().model_dump(), "messages": msgs, "options": stored}

    def _tools_for(self, context: Any) -> Mapping[str, Tool]:
        provider = self.config.tools_provider
        return self.config.tmap if provider is None else tool_map(provider(context))

    def typed_result(self, record: JobRecord, app: App) -> Any:
        """The result as an ``output_schema`` instance when the run had one, else the final text."""
        if record.status is not JobStatus.COMPLETE or not isinstance(record.result, dict):
            return record.result
        name = record.options.get("output_schema")
        schemas = {**self._turn.schemas, **app.schemas}
        schema = schemas.get(name) if isinstance(name, str) else self.config.output_schema
        return record.result if schema is None else schema.model_validate(record.result)

    # --- the low-level layer ---------------------------------------------------------------
    def run(self, *, job_id: str, messages: Sequence[Message | str] = (), storage: Storage, scheduler: Scheduler,
            retry_mode: RetryMode | None = None, **options: Any) -> RunHandle:
        """Start a run on these adapters (the low-level form of ``app.run_agent(self, ...)``)."""
        from pipelines.app import App

        app = App.for_adapters(storage, scheduler)
        app.add_agent(self, replace=True)
        return app.run_agent(self, job_id=job_id, messages=messages, retry_mode=retry_mode, **options)

    def result(self, job_id: str, *, storage: Storage) -> Any:
        """The job's result: an ``output_schema`` instance when the agent has one, else the final text.

        ``None`` while the job has not completed.
        """
        from pipelines.engine.control import load_job

        record = load_job(storage, job_id)
        if record.status is not JobStatus.COMPLETE or record.result is None:
            return None
        if self.output_schema is not None and isinstance(record.result, dict):
            return self.output_schema.model_validate(record.result)
        return record.result


def as_messages(messages: Any, *, name: str = "messages") -> list[Message]:
    """``messages`` as transcript messages: a string is a user message; a dict needs a ``role``."""
    if isinstance(messages, str | dict) or not isinstance(messages, Sequence):
        raise InvalidInputError(f"{name} must be a list of messages (or strings), got {type(messages).__name__}")
    out: list[Message] = []
    for m in messages:
        if isinstance(m, str):
            out.append({"role": "user", "content": m})
        elif isinstance(m, dict) and isinstance(m.get("role"), str):
            out.append(_checked_message(dict(m)))
        else:
            raise InvalidInputError(f"a message must be a string or a dict with a 'role', got {m!r:.80}")
    return out


_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
"""The roles a message given to a run may have (the OpenAI chat format's, which litellm takes for every provider;
``function`` is its older form of ``tool``)."""


def _checked_message(m: Message) -> Message:
    """``m`` if a model could read it: a known role, and what that role needs; else InvalidInputError saying what."""
    role = m["role"]
    if role not in _ROLES:
        raise InvalidInputError(f"a message's role must be one of {', '.join(_ROLES)}, got {role!r} (in {m!r:.80})")
    content = m.get("content")
    if role == "assistant":
        # An answer as the agent keeps it: its text, its calls, a refusal, a legacy function call, audio.
        if all(m.get(k) is None for k in ("content", "tool_calls", "refusal", "function_call", "audio")):
            raise InvalidInputError(f"an assistant message needs a 'content' or 'tool_calls', got {m!r:.80}")
    elif role == "function":
        pass  # the older form of a tool message: the provider says what it needs
    elif not isinstance(content, str | list):
        # A list is content parts (text, images): the provider checks their shape.
        raise InvalidInputError(f"a {role} message needs a 'content' (a string or a list of content parts), "
                                f"got {m!r:.80}")
    if role == "tool" and (not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]):
        raise InvalidInputError(f"a tool message needs the 'tool_call_id' of the call it answers, got {m!r:.80}")
    return m

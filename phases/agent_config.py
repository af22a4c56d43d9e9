"""An agent's options, listed and checked once; and the per-run options that travel with a job.

:class:`AgentConfig` is what ``Agent(...)``, ``run_agent(...)`` and
``build_agent_phase(...)`` all build from their keywords, so an option is
spelled, defaulted and validated in one place. :class:`RunOptions` is the
subset a single run may change (``app.run_agent(..., max_turns=3)``): JSON
only, stored on the job record, so every worker honours it. Anything else
given per run is refused with the list of what is allowed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from phases.callbacks import CALLBACKS
from phases.compaction import Compaction
from phases.conversation import check_conflict_mode
from phases.model import Model
from phases.stop import StopCondition
from phases.tools import Tool, tool_map
from pipelines.engine.errors import ConfigurationError, InvalidInputError
from pipelines.engine.models import JSONValue

__all__ = ["AgentConfig", "RunOptions", "RUN_OPTIONS"]


class RunOptions(BaseModel):
    """Per-run overrides of an agent's options, stored with the job (JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(default=None, min_length=1, description="a litellm model string")
    # Strict (True is no count) and bounded, as every number from outside is: far past any real run.
    max_turns: int | None = Field(default=None, gt=0, le=1_000_000, strict=True)
    max_tokens: int | None = Field(default=None, gt=0, le=10**12, strict=True)
    max_cost_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    output_schema: str | None = Field(default=None, description="the name of a schema registered on the App")
    tool_timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    stream: bool | None = Field(default=None, description="publish the answer's text as it arrives")
    stream_retries: int | None = Field(default=None, ge=0, le=100, strict=True,
                                       description="retries of a stream broken mid-way")
    system_prompt_conflict: Literal["keep", "use-current"] | None = None
    suppress_system_prompt_conflict_warning: bool | None = None
    max_retries: int | None = Field(default=None, ge=0, le=100, strict=True,
                                    description="model call retries; 0 = no retry")
    context: JSONValue = Field(default=None, description="JSON data for tools and hooks; never sent to the model")
    tools_context: dict[str, JSONValue] | None = Field(default=None, description="tool name -> that tool's entry")
    tags: list[str] | None = None
    # Flow control (pipelines.engine.flow): the queue this run's turns go to, and the key its turns are counted under.
    priority: Literal["interactive", "background"] | None = None
    concurrency_key: str | None = Field(default=None, min_length=1, max_length=200)


RUN_OPTIONS = tuple(RunOptions.model_fields)
"""The option names a single run may set."""


def _positive(name: str, value: Any, *, integer: bool = False, optional: bool = True) -> None:
    kinds = int if integer else int | float
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < math.inf:
        raise InvalidInputError(f"{name} must be a positive {'int' if integer else 'number'}, got {value!r}")


@dataclass(frozen=True)
class AgentConfig:
    """Everything that describes an agent; validated when built, so a bad option fails at definition."""

    model: str | Model
    tools: Sequence[Tool] | Mapping[str, Tool] | Callable[..., Any] | None = ()
    system: str | None = None
    max_turns: int = 10
    stop_when: StopCondition | Sequence[StopCondition] | None = None
    model_params: Mapping[str, Any] | None = None
    max_model_attempts: int = 5
    output_schema: type[BaseModel] | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    prepare_turn: Callable[..., Any] | None = None
    tool_timeout: float | None = None
    # Publish the model's text to the job's live stream as it arrives (text_delta parts).
    stream: bool = True
    # A provider stream that breaks after it started is tried again as the same turn this many times.
    stream_retries: int = 0
    # What app.send does while a run of this agent is in progress: "enqueue" (the next turn takes the
    # messages) or "reject" (a clear error for the sender).
    on_new_message: Literal["enqueue", "reject"] = "enqueue"
    # Summarise older turns for the model once its view passes a size (phases.compaction); None: never.
    compaction: Compaction | None = None
    # An Agent that names a new conversation after its first run, as a child job (phases.titles).
    title_agent: Any = None
    system_prompt_conflict: str = "keep"
    suppress_system_prompt_conflict_warning: bool = False
    prepare_call: Callable[..., Any] | None = None
    max_retries: int | None = None
    on_start: Callable[..., Any] | None = None
    on_turn_start: Callable[..., Any] | None = None
    on_tool_start: Callable[..., Any] | None = None
    on_tool_end: Callable[..., Any] | None = None
    on_turn_end: Callable[..., Any] | None = None
    on_end: Callable[..., Any] | None = None
    tmap: dict[str, Tool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # ``tools`` may be a provider (a function of the run's context): its
        # tools are known per run only (``with_tools``), so the map starts empty.
        tools = self.tools
        object.__setattr__(self, "tmap", {} if callable(tools) and self.tools_provider is not None
                           else tool_map(tools))  # type: ignore[arg-type]
        if self.max_retries is not None:
            if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
                raise InvalidInputError(f"max_retries must be an int >= 0, got {self.max_retries!r}")
            object.__setattr__(self, "max_model_attempts", self.max_retries + 1)
        check_conflict_mode(self.system_prompt_conflict)
        self._check_limits()
        self._check_shapes()

    def _check_limits(self) -> None:
        _positive("max_turns", self.max_turns, integer=True, optional=False)
        _positive("max_model_attempts", self.max_model_attempts, integer=True, optional=False)
        _positive("max_tokens", self.max_tokens, integer=True)
        _positive("max_cost_usd", self.max_cost_usd)
        _positive("tool_timeout", self.tool_timeout)
        if isinstance(self.stream_retries, bool) or not isinstance(self.stream_retries, int) or self.stream_retries < 0:
            raise InvalidInputError(f"stream_retries must be an int >= 0, got {self.stream_retries!r}")
        if self.on_new_message not in ("enqueue", "reject"):
            raise InvalidInputError(f"on_new_message must be 'enqueue' or 'reject', got {self.on_new_message!r}")

    def _check_shapes(self) -> None:
        for hook in ("prepare_call", "prepare_turn", *CALLBACKS):
            if getattr(self, hook) is not None and not callable(getattr(self, hook)):
                raise InvalidInputError(f"{hook} must be callable, got {getattr(self, hook)!r}")
        if self.system is not None and not isinstance(self.system, str):
            raise InvalidInputError(f"system must be a string, got {type(self.system).__name__}")
        stop = self.stop_when
        if stop is not None and not callable(stop) and (
            isinstance(stop, str) or not isinstance(stop, Sequence) or not all(callable(c) for c in stop)
        ):
            raise InvalidInputError(f"stop_when must be a callable or a list of callables, got {stop!r}")
        schema = self.output_schema
        if schema is not None and not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise InvalidInputError(f"output_schema must be a pydantic model class, got {schema!r}")
        if self.model_params is not None and not isinstance(self.model_params, Mapping):
            raise InvalidInputError(f"model_params must be a dict, got {type(self.model_params).__name__}")

    @property
    def tools_provider(self) -> Callable[..., Any] | None:
        """``tools`` when it is a provider function of the run's context, else ``None``."""
        tools = self.tools
        if callable(tools) and not isinstance(tools, Tool | Mapping | Sequence):
            return tools
        return None

    def for_run(self, options: Mapping[str, JSONValue], schemas: Mapping[str, type[BaseModel]]) -> AgentConfig:
        """This config with a job's stored :class:`RunOptions` applied (what a worker runs)."""
        if not options:
            return self
        # Every turn of a run asks again with the same options: the answer is kept, by their JSON text
        # (the config is frozen, and a schema registry does not change under a running worker). Their
        # repr finds it first: a job's options come back in the same order turn after turn, and repr
        # costs a tenth of json.dumps's Python wrapper.
        cache: dict[str, AgentConfig] = self.__dict__.setdefault("_for_run", {})
        seen = "r" + repr(options)
        found = cache.get(seen)
        if found is not None:
            return found
        key = "j" + json.dumps(options, sort_keys=True, default=repr)
        found = cache.get(key)
        if found is not None:
            if len(cache) < 2 * _FOR_RUN_KEPT:
                cache[seen] = found
            return found
        # Keys with a leading "_" are the library's own notes on the run, not options.
        opts = RunOptions.model_validate({k: v for k, v in options.items() if not k.startswith("_")})
        changes: dict[str, Any] = {k: v for k, v in opts.model_dump(exclude_none=True).items()
                                   if k in _CONFIG_FIELDS and k != "output_schema"}
        if opts.output_schema is not None:
            changes["output_schema"] = _schema(opts.output_schema, schemas)
        config = replace(self, **changes) if changes else self
        if len(cache) >= 2 * _FOR_RUN_KEPT:
            cache.clear()
        cache[key] = cache[seen] = config
        return config


_CONFIG_FIELDS = frozenset(AgentConfig.__dataclass_fields__)
_FOR_RUN_KEPT = 256  # distinct runs' options a worker keeps the resolved config of


def _schema(name: str, schemas: Mapping[str, type[BaseModel]]) -> type[BaseModel]:
    try:
        return schemas[name]
    except KeyError:
        known = ", ".join(sorted(schemas)) or "none"
        raise ConfigurationError(f"output schema {name!r} is not registered on this app (App(schemas=[...])); "
                                 f"registered: {known}") from None


def check_run_options(options: Mapping[str, Any], schemas: Mapping[str, type[BaseModel]]) -> dict[str, JSONValue]:
    """Per-run ``options`` in their stored form; unknown or invalid ones raise :class:`InvalidInputError`."""
    unknown = sorted(set(options) - set(RUN_OPTIONS))
    if unknown:
        raise InvalidInputError(f"unknown per-run option(s) {', '.join(map(repr, unknown))}; a run may set "
                                f"{', '.join(RUN_OPTIONS)} (others belong on the Agent)")
    data = dict(options)
    schema = data.get("output_schema")
    if schema is not None and not isinstance(schema, str):
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise InvalidInputError(f"output_schema must be a pydantic model class, got {schema!r}")
        if schemas.get(schema.__name__) is not schema:
            raise ConfigurationError(f"output_schema {schema.__name__} is not registered on the App, so workers "
                                     f"could not find it: App(..., schemas=[{schema.__name__}])")
        data["output_schema"] = schema.__name__
    elif schema is not None:
        _schema(schema, schemas)
    try:
        return RunOptions.model_validate(data).model_dump(exclude_none=True)
    except ValidationError as exc:
        raise InvalidInputError(f"invalid per-run option: {exc.errors()[0]['loc'][0]}: "
                                f"{exc.errors()[0]['msg']}") from None

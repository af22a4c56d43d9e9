"""Tools the model can call: ``@tool`` on a typed function, or ``Tool(...)`` explicitly.

The name comes from the function, the description from its docstring, the
JSON schema and argument validation from pydantic. A tool receives a
:class:`ToolContext` (if it asks for one) carrying the job id and an
idempotency key ``"<job id>/<tool call id>"`` for external systems that
deduplicate requests (``/`` never occurs in a job id, so no two pairs of job
id and call id share a key). ``timeout=`` bounds how long a turn waits for
one call.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_type_hints

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model
from pydantic.errors import PydanticInvalidForJsonSchema, PydanticSchemaGenerationError

from pipelines.engine.env import EMPTY_ENV, RunEnv
from pipelines.engine.errors import InvalidInputError, validation_summary
from pipelines.engine.models import JSONValue, to_json_value

__all__ = [
    "InterruptPolicy",
    "Tool",
    "ToolArgumentsError",
    "ToolContext",
    "tool",
    "tool_map",
]

InterruptPolicy = Literal["retry", "fail", "reconcile", "ask"]
"""What to do with a call found started but not finished after a crash (see README "Guarantees")."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what OpenAI-style APIs accept as a function name


# json.dumps with an option builds a new encoder per call: one shared for every tool result.
_RESULT_JSON = json.JSONEncoder(ensure_ascii=False)


@dataclass(frozen=True)
class ToolContext:
    """What a running tool knows about its call, and the environment of the App that runs it.

    ``context``: the run's ``context=`` (JSON; never sent to the model).
    ``tool_context``: this tool's entry of the run's ``tools_context=`` (an
    instance of the tool's ``context_model`` when it declares one), or ``None``.
    ``env``: the App's :class:`~pipelines.engine.env.RunEnv` (child runs, flow
    limits, clock). All three are handed over by the turn that runs the tool,
    so a tool sees them on whichever thread it runs. ``run``: the run of the
    job the call is in (its checkpoint's ``transcript_epoch``; ``""`` unknown),
    what a child run started by the call is stamped with.
    """

    job_id: str
    call_id: str
    tool_name: str
    turn: int = 0
    context: JSONValue = None
    tool_context: Any = None
    env: RunEnv = EMPTY_ENV
    run: str = ""

    @property
    def idempotency_key(self) -> str:
        """Stable across re-runs of the same call: ``"<job id>/<tool call id>"``.

        Unambiguous: job ids never contain ``/``, so the first ``/`` splits
        the key back into its job id and call id (``a:b`` + ``c`` and ``a`` +
        ``b:c`` get different keys). Call ids are unique within a job's
        transcript (the agent turn renames a repeated or missing one).
        """
        return f"{self.job_id}/{self.call_id}"


class ToolArgumentsError(Exception):
    # Not a PipelineError: it never reaches users; its text goes back to the model.
    """The model's arguments did not parse or validate; the text goes back to the model."""


class Tool:
    """A tool: ``Tool(name=, description=, input_model=, execute=)``.

    ``execute(input)`` or ``execute(input, ctx)``, plain or ``async def``;
    ``input`` is a validated ``input_model`` instance. Its return value (JSON
    data or a string) becomes the tool message's content.

    ``needs_approval``: ``True`` (or a function of the validated arguments
    returning ``True``) makes the turn stop before running the call: the job
    waits until a person calls ``approve`` or ``reject`` for these exact
    arguments.

    ``idempotent``: running the call twice is harmless (the default). After a
    crash in the middle of a call, ``on_interrupted`` decides: ``"retry"``
    (default for idempotent tools), ``"fail"`` (default otherwise: the job
    stops with an error and a person decides), ``"reconcile"`` (call
    ``reconcile(input, ctx)``, which asks the outside system what happened and
    returns the result), or ``"ask"`` (the job waits until someone records the
    outcome).

    ``context_model``: a pydantic model the run's ``tools_context[name]``
    entry must fit (checked when the run starts); the tool reads it as
    ``ctx.tool_context``.

    ``timeout``: seconds the turn waits for one call (finite, > 0), or
    ``None`` (the default: the ``default_timeout`` of ``run_tools``, if any).
    A call that runs longer is abandoned: for a ``"retry"`` tool the model
    reads ``Error: tool 'x' timed out after N s``; otherwise the
    ``on_interrupted`` policy decides, as for a call interrupted by a crash
    (``"fail"`` fails the job, ``"ask"`` waits for its outcome,
    ``"reconcile"`` asks ``reconcile``). An ``async def`` tool is cancelled.
    A ``def`` tool cannot be killed: it runs on a thread of its own, which
    the turn stops waiting for and leaves to finish (its result is dropped).
    """

    def __init__(
        self,
        *,
        name: str,
        description: str,
        input_model: type[BaseModel],
        execute: Callable[..., Any],
        idempotent: bool = True,
        on_interrupted: InterruptPolicy | None = None,
        reconcile: Callable[..., Any] | None = None,
        needs_approval: bool | Callable[[Any], bool] = False,
        timeout: float | None = None,
        context_model: type[BaseModel] | None = None,
        preview: int | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidInputError(f"tool name {name!r} must be 1-64 of [A-Za-z0-9_-]")
        if not (isinstance(input_model, type) and issubclass(input_model, BaseModel)):
            raise InvalidInputError(f"tool {name!r}: input_model must be a pydantic model class")
        if not callable(execute):
            raise InvalidInputError(f"tool {name!r}: execute must be callable")
        policy = on_interrupted or ("retry" if idempotent else "fail")
        if policy not in ("retry", "fail", "reconcile", "ask"):
            raise InvalidInputError(f"tool {name!r}: on_interrupted must be retry, fail, reconcile or ask")
        if policy == "reconcile" and reconcile is None:
            raise InvalidInputError(f"tool {name!r}: on_interrupted='reconcile' needs a reconcile function")
        self.name = name
        self.description = description or ""
        self.input_model = input_model
        self.execute = execute
        self.idempotent = idempotent
        self.on_interrupted: InterruptPolicy = policy
        self.reconcile = reconcile
        if not (isinstance(needs_approval, bool) or callable(needs_approval)):
            raise InvalidInputError(f"tool {name!r}: needs_approval must be a bool or a function of the arguments")
        self.needs_approval = needs_approval
        self.timeout = check_timeout(timeout, f"tool {name!r}: timeout")
        if context_model is not None and not (isinstance(context_model, type) and issubclass(context_model, BaseModel)):
            raise InvalidInputError(f"tool {name!r}: context_model must be a pydantic model class")
        self.context_model = context_model
        if preview is not None and (isinstance(preview, bool) or not isinstance(preview, int) or preview <= 0):
            raise InvalidInputError(f"tool {name!r}: preview must be a positive number of characters, got {preview!r}")
        # The model sees at most this many characters of a result; the transcript keeps it whole.
        self.preview = preview
        self.is_async = inspect.iscoroutinefunction(execute)
        self._wants_ctx = _positional_arity(execute) >= 2

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r})"

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools=[...]`` entry for this tool (built once: pydantic's schema costs ~1 ms a turn)."""
        cached: dict[str, Any] | None = self.__dict__.get("_schema")
        if cached is None or cached["function"]["description"] != self.description:
            params = self.input_model.model_json_schema()
            params.pop("title", None)
            cached = {"type": "function", "function": {"name": self.name, "description": self.description,
                                                        "parameters": params}}
            self.__dict__["_schema"] = cached
        return copy.deepcopy(cached)  # callers (prepare_turn hooks) may edit theirs

    def parse(self, arguments: str | Mapping[str, Any] | None) -> BaseModel:
        """Validate the model's arguments (a JSON string, as models send them)."""
        if arguments is None or arguments == "":
            data: Any = {}
        elif isinstance(arguments, str):
            try:
                data = json.loads(arguments)
            except ValueError as exc:  # not JSON, or an int longer than the interpreter reads (4300 digits)
                raise ToolArgumentsError(f"arguments for tool {self.name!r} are not valid JSON: {exc}") from exc
            except RecursionError:  # the model's to correct, as any malformed arguments, not the job's end
                raise ToolArgumentsError(f"arguments for tool {self.name!r} nest lists/objects too deeply "
                                         "to read") from None
        elif isinstance(arguments, Mapping):
            data = dict(arguments)
        else:
            # Models send a JSON text; anything else (123, a list) is the
            # model's mistake to correct, not a TypeError that fails the job.
            raise ToolArgumentsError(f"arguments for tool {self.name!r} must be a JSON object text, "
                                     f"got {type(arguments).__name__}")
        if not isinstance(data, dict):
            raise ToolArgumentsError(f"arguments for tool {self.name!r} must be a JSON object")
        try:
            return self.input_model.model_validate(data)
        except ValidationError as exc:
            raise ToolArgumentsError(f"invalid arguments for tool {self.name!r}: {validation_summary(exc)}") from exc

    def requires_approval(self, args: BaseModel) -> bool:
        """Whether this call waits for a person (``needs_approval``, or its verdict on ``args``)."""
        if isinstance(self.needs_approval, bool):
            return self.needs_approval
        return bool(self.needs_approval(args))

    def call(self, args: BaseModel, ctx: ToolContext) -> Any:
        """Run ``execute``; returns its result, or an awaitable for ``async def`` tools."""
        return self.execute(args, ctx) if self._wants_ctx else self.execute(args)


def check_timeout(value: Any, what: str) -> float | None:
    """``value`` as a timeout in seconds: ``None``, or a finite number > 0 (else InvalidInputError)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{what} must be a finite number of seconds > 0, or None; got {value!r}")
    return float(value)


def _positional_arity(fn: Callable[..., Any]) -> int:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in sig.parameters.values()):
        return 2
    return sum(1 for p in sig.parameters.values() if p.kind in kinds)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = True,
    on_interrupted: InterruptPolicy | None = None,
    reconcile: Callable[..., Any] | None = None,
    needs_approval: bool | Callable[[Any], bool] = False,
    timeout: float | None = None,
    context_model: type[BaseModel] | None = None,
    preview: int | None = None,
) -> Any:
    """Turn a typed function (``def`` or ``async def``) into a :class:`Tool`.

    Every parameter needs a type annotation; one parameter annotated
    ``ToolContext`` receives the call's context instead of a model argument.
    Parameter names pydantic reserves (a leading ``_``, a ``model_`` prefix,
    a ``BaseModel`` attribute such as ``json`` or ``copy``) are refused.
    Used bare (``@tool``) or with options (``@tool(idempotent=False)``);
    the options are those of :class:`Tool`, ``timeout`` and ``context_model`` included.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return _from_function(f, name=name, description=description, idempotent=idempotent,
                              on_interrupted=on_interrupted, reconcile=reconcile, needs_approval=needs_approval,
                              timeout=timeout, context_model=context_model, preview=preview)

    return wrap(fn) if fn is not None else wrap


def _from_function(f: Callable[..., Any], *, name: str | None, description: str | None, **options: Any) -> Tool:
    if not callable(f):
        raise InvalidInputError(f"@tool needs a function, got {type(f).__name__}")
    tool_name: str = name or str(getattr(f, "__name__", ""))
    fields, ctx_param = _fields_of(f, tool_name)
    try:
        model = create_model(f"{tool_name}_args", __config__=ConfigDict(extra="forbid"), **fields)
        model.model_json_schema()  # some types validate but have no JSON schema to show the model
    except (PydanticSchemaGenerationError, PydanticInvalidForJsonSchema, TypeError) as exc:
        bad = next((n for n, (t, _) in fields.items() if not _schema_ok(t)), "?")
        raise InvalidInputError(f"tool {tool_name!r}: parameter {bad!r} has a type pydantic cannot "
                                f"describe as JSON: {exc}") from exc
    names = list(fields)

    def kwargs_of(args: BaseModel, ctx: ToolContext) -> dict[str, Any]:
        kwargs = {n: getattr(args, n) for n in names}
        if ctx_param:
            kwargs[ctx_param] = ctx
        return kwargs

    if inspect.iscoroutinefunction(f):
        async def execute_async(args: BaseModel, ctx: ToolContext) -> Any:
            return await f(**kwargs_of(args, ctx))

        execute: Callable[..., Any] = execute_async
    else:
        def execute_sync(args: BaseModel, ctx: ToolContext) -> Any:
            return f(**kwargs_of(args, ctx))

        execute = execute_sync
    doc = description if description is not None else inspect.getdoc(f) or ""
    t = Tool(name=tool_name, description=doc, input_model=model, execute=execute, **options)
    t.__doc__ = f.__doc__
    return t


def _fields_of(f: Callable[..., Any], tool_name: str) -> tuple[dict[str, Any], str | None]:
    """The pydantic fields for ``f``'s parameters, and the name of its ``ToolContext`` parameter (if any)."""
    try:
        hints = get_type_hints(f)
    except Exception as exc:  # any failure to resolve annotations is a signature problem
        raise InvalidInputError(f"tool {tool_name!r}: cannot resolve type annotations: {exc}") from exc
    fields: dict[str, Any] = {}
    ctx_param: str | None = None
    for pname, param in inspect.signature(f).parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise InvalidInputError(f"tool {tool_name!r}: *args/**kwargs are not supported; name every argument")
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise InvalidInputError(f"tool {tool_name!r}: positional-only parameter {pname!r} is not supported")
        if pname not in hints:
            raise InvalidInputError(f"tool {tool_name!r}: parameter {pname!r} needs a type annotation")
        if hints[pname] is ToolContext:
            if ctx_param is not None:  # only one is passed: the other would be a required argument never given
                raise InvalidInputError(f"tool {tool_name!r}: parameters {ctx_param!r} and {pname!r} both ask for the "
                                        "ToolContext; keep one")
            ctx_param = pname
            continue
        if ToolContext in get_args(hints[pname]):
            raise InvalidInputError(f"tool {tool_name!r}: parameter {pname!r} is {hints[pname]}; ask for the context "
                                    f"as '{pname}: ToolContext' (it is always given)")
        _check_field_name(tool_name, pname)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hints[pname], default)
    return fields, ctx_param


def _check_field_name(tool_name: str, pname: str) -> None:
    # The arguments become fields of a pydantic model: such names would vanish
    # from the schema (``_x``), receive pydantic's own values (``model_config``)
    # or fail inside pydantic (``model_dump``, ``json``).
    if pname.startswith(("_", "model_")) or hasattr(BaseModel, pname):
        raise InvalidInputError(f"tool {tool_name!r}: parameter name {pname!r} is reserved by pydantic "
                                "(a leading '_', a 'model_' prefix or a BaseModel attribute); rename it")


def _schema_ok(annotation: Any) -> bool:
    try:
        TypeAdapter(annotation).json_schema()
    except Exception:  # noqa: BLE001 - any failure means the type is the culprit
        return False
    return True


def tool_map(tools: Iterable[Tool] | Mapping[str, Tool] | None) -> dict[str, Tool]:
    """Index tools by name; accepts a list or a dict keyed by name. Duplicate names are an error."""
    if tools is None:
        return {}
    if isinstance(tools, Tool | str | bytes) or not isinstance(tools, Iterable):
        raise InvalidInputError(f"tools must be a list of Tool or a dict keyed by name, got {type(tools).__name__}")
    out: dict[str, Tool] = {}
    if isinstance(tools, Mapping):
        for key, t in tools.items():
            if not isinstance(t, Tool):
                raise InvalidInputError(f"tools[{key!r}] is a {type(t).__name__}, not a Tool (use @tool)")
            if key != t.name:
                raise InvalidInputError(f"tools dict key {key!r} does not match the tool's name {t.name!r}")
            out[key] = t
        return out
    for t in tools:
        if not isinstance(t, Tool):
            raise InvalidInputError(f"{t!r} is a {type(t).__name__}, not a Tool (decorate it with @tool)")
        if t.name in out:
            raise InvalidInputError(f"duplicate tool name {t.name!r}")
        out[t.name] = t
    return out


def result_content(value: Any) -> str:
    """The tool message content for a tool's return value: strings as they are, anything else as JSON."""
    if type(value) is str and value.isascii():
        return value
    # A str too: one holding a lone surrogate (a model's "\ud800" echoed back) cannot be stored.
    data: JSONValue = to_json_value(value, what="tool result")
    if isinstance(data, str):
        return data
    return _RESULT_JSON.encode(data)

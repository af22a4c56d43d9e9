"""OpenTelemetry traces and metrics, when ``opentelemetry-api`` is installed (``phaserunner[otel]``).

One trace per job, across workers: starting a job opens a ``run`` span and
stores its W3C trace context on the record (``record.trace``); every turn,
on whichever worker, is a span in that trace, and so are the model call
(GenAI semantic conventions: ``chat <model>``, ``gen_ai.request.model`` (the
model asked for), ``gen_ai.response.model`` (the one the answer names),
``gen_ai.provider.name`` (a litellm model's provider; left out for other
models), ``gen_ai.usage.input_tokens`` / ``output_tokens``,
``gen_ai.response.finish_reasons``; none for a call the rate limit defers)
and each tool call (``execute_tool <name>``, ``gen_ai.tool.name``,
``gen_ai.tool.call.id``). A failed model call, tool call or turn ends with
status ERROR and ``error.type`` (:func:`error_type`; ``timeout``, ``_OTHER``),
never an error's message or a call's arguments; one that raised has an
exception event with its type and :func:`redacted` message (no stack trace). Metrics: turns,
turn and model latency, tokens, cost, retries, failures, the due backlog.

Without the package (or with ``PIPELINES_OTEL=0``) every function here is a
no-op that costs one attribute check: nothing is recorded, nothing imported.
With the API but no SDK provider set (no tracer provider, or no meter
provider), spans (or metrics) cost one provider lookup: the API's no-op
objects would record nothing, so they are not built. Configure the SDK
(exporters, sampling) in your app module as usual, before or after the
library's first turn, in the processes that start jobs too: a job started
where no tracer provider is set stores no context, and each of its turns is
then a trace of its own. The library only uses the API.

Telemetry never changes what a job does: whatever the SDK, a span processor
or an exporter raises while a span starts, is annotated or ends is logged
(once per kind of failure, per process) and swallowed; the turn goes on
without that span. An environment the API cannot set up (``OTEL_PROPAGATORS``
naming a propagator that is not installed, ``OTEL_PYTHON_TRACER_PROVIDER`` or
``OTEL_PYTHON_METER_PROVIDER`` naming a provider that is not) turns telemetry
off (metrics only, for a meter provider) in that process, with one warning.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pipelines.engine.contain import describe, message_of
from pipelines.engine.masking import mask
from pipelines.engine.otel_api import ENV, OtelApi

__all__ = [
    "ENV",
    "MESSAGE_MAX",
    "enabled",
    "error_type",
    "model_span",
    "record_backlog",
    "record_error",
    "record_model",
    "record_turn",
    "redacted",
    "run_context",
    "span",
    "tool_span",
    "turn_span",
]

logger = logging.getLogger(__name__)

MESSAGE_MAX = 500
"""The longest error message an exception event carries (:func:`redacted`)."""
_REPORTED: set[str] = set()  # the kinds of telemetry failure logged already (each is logged once)


def _misconfigured(what: str, exc: BaseException) -> None:
    """Setting up ``what`` raised: one warning line, once (the environment is wrong, not a turn: no traceback)."""
    if what in _REPORTED:
        return
    _REPORTED.add(what)
    logger.warning("telemetry: %s raised %s; it is off in this process (check the OTEL_* environment variables)",
                   what, describe(exc))


def _broken(what: str, exc: Exception) -> None:
    """The SDK or a span processor / exporter raised while ``what``: log it the first time, then swallow it."""
    if what in _REPORTED:
        return
    _REPORTED.add(what)
    logger.warning("telemetry: %s raised %s; the job goes on without it (logged once, not per turn)", what,
                   type(exc).__name__, exc_info=exc)


_otel: OtelApi | None = None
_NO_SPAN = contextlib.nullcontext()  # reusable: it holds no state


def _get() -> OtelApi:
    global _otel
    if _otel is None:
        _otel = OtelApi(_misconfigured)
    return _otel


def enabled() -> bool:
    """Whether spans and metrics are recorded in this process."""
    return _get().trace is not None


def reset() -> None:
    """Look the API up again (tests that install a provider or change ``PIPELINES_OTEL``)."""
    global _otel
    _otel = None


def run_context(job_id: str, pipeline: str) -> dict[str, str] | None:
    """Open and close the job's ``run`` span; the W3C context to store on the record (``None`` when off)."""
    otel = _get()
    if otel.trace is None:
        return None
    carrier: dict[str, str] = {}
    run = _start(otel, f"run {pipeline}", {"phaserunner.job_id": job_id, "phaserunner.pipeline": pipeline}, None,
                 "PRODUCER")
    if run is None:
        return carrier
    try:
        otel.propagate.inject(carrier, context=otel.trace.set_span_in_context(run))
    except Exception as exc:  # noqa: BLE001 - telemetry never changes what a job does
        _broken("storing the trace context", exc)
    _end(run)
    return carrier


def _start(otel: OtelApi, name: str, attributes: Mapping[str, Any] | None, parent: Mapping[str, str] | None,
           kind: str) -> Any:
    """A started span, not yet current; ``None`` if the SDK or a span processor raised."""
    try:
        tracer = otel.tracer()
        if tracer is None:
            return None
        ctx = otel.propagate.extract(dict(parent)) if parent else None
        return tracer.start_span(name, context=ctx, kind=getattr(otel.trace.SpanKind, kind),
                                                       attributes=dict(attributes or {}))
    except Exception as exc:  # noqa: BLE001 - telemetry never changes what a job does
        _broken("starting a span", exc)
        return None


def _end(current: Any) -> None:
    try:
        current.end()
    except Exception as exc:  # noqa: BLE001 - telemetry never changes what a job does
        _broken("ending a span", exc)


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None, *, parent: Mapping[str, str] | None = None,
         kind: str = "INTERNAL") -> Iterator[Any]:
    """A span (a child of ``parent``, a stored W3C context, when given); yields ``None`` when off.

    An exception from the block marks the span failed (see :func:`record_error`) and propagates; one from
    the SDK or a span processor is logged and swallowed (the block runs without the span, or it ends unended).
    """
    otel = _get()
    if otel.trace is None or (not parent and not otel.tracing()):
        yield None
        return
    current = _start(otel, name, attributes, parent, kind)
    if current is None:
        yield None
        return
    token = None
    try:
        token = otel.context.attach(otel.trace.set_span_in_context(current))
    except Exception as exc:  # noqa: BLE001 - telemetry never changes what a job does
        _broken("making a span current", exc)
    try:
        yield current
    except Exception as exc:  # not a BaseException: a crash or an interrupt is not the operation's error
        _failed(current, exc)
        raise
    finally:
        if token is not None:
            otel.context.detach(token)  # the API's detach logs and swallows its own failures
        _end(current)


def _failed(current: Any, exc: Exception) -> None:
    """``exc`` left the span's block: an exception event, and the span failed unless ``exc`` is a control signal
    (a turn retried later, deferred or waiting for input has not failed)."""
    from pipelines.engine.phase.outcomes import RetryLater, WaitForInput  # lazy: only when a block raised

    try:
        # Not record_exception: its event carries the raw message (a model's error may hold a key or a
        # user:password@ address) and a stack trace. Ours: the type and the redacted, shortened message.
        current.add_event("exception", {"exception.type": error_type(exc), "exception.message": redacted(exc)})
    except Exception as broken:  # noqa: BLE001 - telemetry never changes what a job does
        _broken("marking a span failed", broken)
    if not isinstance(exc, RetryLater | WaitForInput):
        record_error(current, exc)


def redacted(exc: BaseException) -> str:
    """``exc``'s message with credentials masked (``***``), at most :data:`MESSAGE_MAX` characters.

    Masked: the value of every environment variable named as a secret (``*API_KEY*``, ``*_TOKEN*``...),
    a bearer token, an ``sk-...`` key, an address's ``user:password@`` and the value of a query parameter
    named as a credential (``?key=``, ``?access_token=``, ``?sig=``): :func:`pipelines.engine.masking.mask`, the
    rules a litellm model's errors are masked by too, for any model's or tool's error.
    """
    text = mask(message_of(exc))
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 1] + "…"  # cut after masking: no half secret


def error_type(error: BaseException | str) -> str:
    """``error.type`` for ``error``: an exception's fully qualified class name (a builtin's bare name), or the text."""
    if isinstance(error, str):
        return error
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def record_error(current: Any, error: BaseException | str) -> None:
    """Mark a span failed: status ERROR and ``error.type`` (:func:`error_type`), never the error's message.

    ``current``: the span, or ``None`` for the current one (a tool's contained exception, a phase's).
    """
    otel = _get()
    if otel.trace is None:
        return
    try:
        target = otel.trace.get_current_span() if current is None else current
        target.set_attribute("error.type", error_type(error))
        target.set_status(otel.trace.Status(otel.trace.StatusCode.ERROR))
    except Exception as exc:  # noqa: BLE001 - telemetry never changes what a job does
        _broken("marking a span failed", exc)


def _idle(parent: Mapping[str, str] | None) -> bool:
    """Whether a span here would record nothing and carry no context: then none is made (the hot path).

    A stored ``parent`` context still gets its (non-recording) span when no
    provider is set, so calls made inside it propagate the job's trace id.
    """
    otel = _get()
    return otel.trace is None or (not parent and not otel.tracing())


def turn_span(job_id: str, pipeline: str, phase: str, *, trace: Mapping[str, str] | None, due_at: float,
              now: float, attempt: int) -> contextlib.AbstractContextManager[Any]:
    """The span of one phase run, in the job's trace, with its queue lag (due → started)."""
    if _idle(trace):
        return _NO_SPAN
    return span(f"turn {pipeline}", {
        "phaserunner.job_id": job_id, "phaserunner.pipeline": pipeline, "phaserunner.phase": phase,
        "phaserunner.attempt": attempt, "phaserunner.queue_lag_s": max(0.0, now - due_at),
    }, parent=trace, kind="CONSUMER")


def model_span(model: str | None, provider: str | None = None) -> contextlib.AbstractContextManager[Any]:
    """A GenAI ``chat <model>`` span around one model call (its attributes are completed by :func:`record_model`).

    ``model``: the model requested (``gen_ai.request.model``; unknown: the span is named ``chat`` until the
    answer names its model); ``provider``: ``gen_ai.provider.name`` when known (:func:`phases.model.provider_of`).
    """
    if _idle(None):
        return _NO_SPAN
    attrs = {"gen_ai.operation.name": "chat"}
    if model:
        attrs["gen_ai.request.model"] = model
    if provider:
        attrs["gen_ai.provider.name"] = provider
    return span(f"chat {model}" if model else "chat", attrs, kind="CLIENT")


def tool_span(name: str, call_id: str) -> contextlib.AbstractContextManager[Any]:
    """A GenAI ``execute_tool`` span around one tool call."""
    if _idle(None):
        return _NO_SPAN
    return span(f"execute_tool {name}", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                                         "gen_ai.tool.call.id": call_id})


def record_model(current: Any, *, model: str | None, input_tokens: int, output_tokens: int,
                 finish_reason: str | None, cost_usd: float, started: float, request_model: str | None = None,
                 provider: str | None = None) -> None:
    """Finish a model span's attributes and record the model metrics.

    ``model``: the model the answer names (``gen_ai.response.model``); ``request_model`` and ``provider``: as
    given to :func:`model_span`. A span whose requested model was unknown is named after the answering one.
    """
    otel = _get()
    if otel.trace is None:
        return
    try:
        if current is not None:
            if model:
                current.set_attribute("gen_ai.response.model", model)
                if not request_model:
                    current.update_name(f"chat {model}")
            current.set_attribute("gen_ai.usage.input_tokens", input_tokens)
            current.set_attribute("gen_ai.usage.output_tokens", output_tokens)
            if finish_reason:
                current.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        if not otel.metering():
            return
        attrs = {key: value for key, value in (
            ("gen_ai.operation.name", "chat"), ("gen_ai.request.model", request_model),
            ("gen_ai.response.model", model), ("gen_ai.provider.name", provider)) if value}
        otel.instruments["model_time"].record(time.monotonic() - started, attrs)
        otel.instruments["tokens"].record(input_tokens, {**attrs, "gen_ai.token.type": "input"})
        otel.instruments["tokens"].record(output_tokens, {**attrs, "gen_ai.token.type": "output"})
        if cost_usd:
            otel.instruments["cost"].add(cost_usd, attrs)
    except Exception as exc:  # noqa: BLE001 - telemetry never changes what a job does
        _broken("recording a model call", exc)


def record_turn(current: Any, *, pipeline: str, result: str, seconds: float) -> None:
    """Close a turn span's attributes and count the turn (``result``: an AdvanceResult value)."""
    otel = _get()
    if otel.trace is None:
        return
    try:
        if current is not None:
            current.set_attribute("phaserunner.result", result)
            if result == "failed":  # ERROR; error.type: that of the exception the phase raised, if it raised
                known = getattr(current, "attributes", None) or {}
                record_error(current, known.get("error.type") or "_OTHER")
        if not otel.metering():
            return
        attrs = {"phaserunner.pipeline": pipeline, "phaserunner.result": result}
        otel.instruments["turns"].add(1, attrs)
        otel.instruments["turn_time"].record(seconds, attrs)
        if result == "failed":
            otel.instruments["failures"].add(1, attrs)
        elif result == "retry_later":
            otel.instruments["retries"].add(1, attrs)
    except Exception as exc:  # noqa: BLE001 - telemetry never changes what a job does
        _broken("recording a turn", exc)


def record_backlog(due: int) -> None:
    """The number of jobs the sweep found due (and not advanced by the queue)."""
    otel = _get()
    try:
        if otel.metering():
            otel.instruments["backlog"].set(due)
    except Exception as exc:  # noqa: BLE001 - telemetry never changes what a job does
        _broken("recording the backlog", exc)

"""The OpenTelemetry API as :mod:`pipelines.engine.telemetry` uses it: its modules, providers and instruments.

Looked up once per process (again after ``telemetry.reset()``). An environment
the API cannot set up (``OTEL_PROPAGATORS`` naming a propagator that is not
installed, ``OTEL_PYTHON_TRACER_PROVIDER`` / ``OTEL_PYTHON_METER_PROVIDER``
naming a provider that is not) raises from the API's own lookups, on every
call: here it turns telemetry off (or only metrics) and is told once to the
``misconfigured`` callback, so a job never meets it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

__all__ = ["ENV", "NAME", "OtelApi"]

ENV = "PIPELINES_OTEL"
"""Set to ``0`` to turn telemetry off even where ``opentelemetry-api`` is installed."""

NAME = "phaserunner"
"""The instrumentation scope of the library's tracer and meter."""


class OtelApi:
    """The API modules and instruments, looked up once (or found absent once)."""

    def __init__(self, misconfigured: Callable[[str, BaseException], None]) -> None:
        self.misconfigured = misconfigured
        self.trace: Any = None
        self.propagate: Any = None
        self.context: Any = None
        self.metrics: Any = None
        self.instruments: dict[str, Any] = {}
        # Providers that record nothing: while the global one is one of these, spans (metrics) are skipped.
        self.idle_tracers: tuple[type, ...] = ()
        self.idle_meters: tuple[type, ...] = ()
        # The hot path's shortcut: while the API's own global is None and no environment variable named
        # a provider when this was looked up (reset() looks again), none is set; the public lookup reads
        # os.environ on every call. Where the API keeps its global elsewhere, the public lookup decides.
        self.meters: Any = None
        self.metrics_off = False  # the meter provider could not be looked up: no metrics, spans still
        self.env_tracers = os.environ.get("OTEL_PYTHON_TRACER_PROVIDER")
        self.env_meters = os.environ.get("OTEL_PYTHON_METER_PROVIDER")
        if os.environ.get(ENV, "1") == "0":
            return
        try:
            self.trace = importlib.import_module("opentelemetry.trace")
            self.propagate = importlib.import_module("opentelemetry.propagate")
            self.context = importlib.import_module("opentelemetry.context")
            metrics = importlib.import_module("opentelemetry.metrics")
        except ImportError:
            self.trace = None
            return
        except Exception as exc:  # noqa: BLE001 - OTEL_PROPAGATORS naming an absent propagator: a ValueError on import
            self.trace = None
            self.misconfigured("loading OpenTelemetry (OTEL_PROPAGATORS?)", exc)
            return
        self.metrics = metrics
        self.meters = importlib.import_module("opentelemetry.metrics._internal")
        self.idle_tracers = (self.trace.ProxyTracerProvider, self.trace.NoOpTracerProvider)
        # The API's stand-in until a meter provider is set has no public name; without it, metrics are always built.
        proxy = getattr(self.meters, "_ProxyMeterProvider", None)
        self.idle_meters = (metrics.NoOpMeterProvider,) if proxy is None else (proxy, metrics.NoOpMeterProvider)
        try:  # OTEL_PYTHON_METER_PROVIDER naming an absent provider raises here (StopIteration, ValueError)
            meter = metrics.get_meter(NAME)
        except Exception as exc:  # noqa: BLE001 - telemetry never changes what a job does
            self._metrics_broken(exc)
            return
        self.instruments = {
            "turns": meter.create_counter("phaserunner.turns", description="phases (agent turns) run"),
            "turn_time": meter.create_histogram("phaserunner.turn.duration", unit="s"),
            "failures": meter.create_counter("phaserunner.failures", description="turns that failed the job"),
            "retries": meter.create_counter("phaserunner.retries", description="turns scheduled to run again"),
            "model_time": meter.create_histogram("gen_ai.client.operation.duration", unit="s"),
            "tokens": meter.create_histogram("gen_ai.client.token.usage", unit="{token}"),
            "cost": meter.create_counter("phaserunner.cost", unit="USD"),
            "backlog": meter.create_gauge("phaserunner.due_backlog", description="jobs due and not advanced"),
        }

    def tracing(self) -> bool:
        """Whether a span would be recorded: the API is there and a real tracer provider is set (now)."""
        trace = self.trace
        if trace is None or (self.env_tracers is None and getattr(trace, "_TRACER_PROVIDER", 0) is None):
            return False
        try:
            return not isinstance(trace.get_tracer_provider(), self.idle_tracers)
        except Exception as exc:  # noqa: BLE001 - OTEL_PYTHON_TRACER_PROVIDER naming an absent provider
            self._tracing_broken(exc)
            return False

    def tracer(self) -> Any:
        """The library's tracer; ``None`` when the tracer provider cannot be looked up (telemetry then goes off)."""
        trace = self.trace
        if trace is None:
            return None
        try:
            return trace.get_tracer(NAME)
        except Exception as exc:  # noqa: BLE001 - OTEL_PYTHON_TRACER_PROVIDER naming an absent provider
            self._tracing_broken(exc)
            return None

    def metering(self) -> bool:
        """Whether a metric would be recorded: the API is there and a real meter provider is set (now)."""
        if self.trace is None or self.metrics_off or (
                self.env_meters is None and getattr(self.meters, "_METER_PROVIDER", 0) is None):
            return False
        try:
            return not isinstance(self.metrics.get_meter_provider(), self.idle_meters)
        except Exception as exc:  # noqa: BLE001 - OTEL_PYTHON_METER_PROVIDER naming an absent provider
            self._metrics_broken(exc)
            return False

    def _tracing_broken(self, exc: BaseException) -> None:
        # Every later lookup would raise again (and the API logs each one): off for good in this process,
        # metrics too (they share the on/off switch, ``trace``).
        self.trace = None
        self.misconfigured("looking up the tracer provider (OTEL_PYTHON_TRACER_PROVIDER?)", exc)

    def _metrics_broken(self, exc: BaseException) -> None:
        self.metrics_off = True
        self.misconfigured("looking up the meter provider (OTEL_PYTHON_METER_PROVIDER?)", exc)

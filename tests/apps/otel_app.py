"""The App of the OpenTelemetry system test: a worker that exports its spans as JSON lines to a file.

    REDIS_URL          the test's private redis-server
    OTEL_SPANS_FILE    where the worker writes one JSON span per line
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Done, Next, Phase, PhaseContext
from pipelines.app import App

APP_PATH = "tests.apps.otel_app:app"


def _setup_tracing() -> None:
    # What a user's app module does: configure the SDK; the library only uses the API.
    out = open(os.environ["OTEL_SPANS_FILE"], "a", buffering=1)  # noqa: SIM115 - lives as long as the worker
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=out, formatter=lambda span: span.to_json(indent=None) + "\n")))
    trace.set_tracer_provider(provider)


def _step(ctx: PhaseContext[Any]) -> Next | Done:
    n = int(ctx.state["n"])
    return Done(result={"n": n}) if n >= 2 else Next("step", state={"n": n + 1})


if os.environ.get("OTEL_SPANS_FILE"):
    _setup_tracing()
storage = RedisStorage.from_url(os.environ["REDIS_URL"], prefix="otel")
app = App(storage=storage, scheduler=RQScheduler.for_storage(storage, queue="otel", app=APP_PATH),
          pipelines={"steps": [Phase("step", _step)]})

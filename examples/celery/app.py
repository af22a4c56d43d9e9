"""The app of a Redis + Celery deployment: one module for the web side, the Celery workers and beat.

    export REDIS_URL=redis://127.0.0.1:6379/0
    export SUPPORT_MODEL=openai/gpt-4o-mini OPENAI_API_KEY=...    # omit both for the offline scripted model
    celery -A examples.celery.app:celery worker -Q agents,agents-background -c 4    # as many as you like
    celery -A examples.celery.app:celery beat                     # one per deployment: the sweep, every minute
    python -c "from examples.celery.app import app; app.run_agent('support', job_id='chat-1', messages=['Hi'])"

The Celery app accepts JSON only (CeleryScheduler refuses anything else), and
acknowledges a task after it ran (``task_acks_late``), handing a killed
worker's task back to the broker (``task_reject_on_worker_lost``): the job's
lease fences the redelivery against a turn still running elsewhere. Storage's
due index stays the truth: the beat entry below re-sends every job that is
overdue and not leased, whatever happened to its message.
"""

from __future__ import annotations

import os

from celery import Celery

from adapters.celery import CeleryScheduler
from adapters.redis import RedisStorage
from examples.support_agent import build_agent
from pipelines import App

APP_PATH = "examples.celery.app:app"
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
SWEEP_GRACE = 30.0
"""Seconds a job may be overdue before the sweep re-sends it: above the queue's usual wait."""

celery = Celery("support", broker=REDIS_URL)
celery.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=True,  # ack after the turn: a worker that dies mid-turn leaves the task to the broker
    task_reject_on_worker_lost=True,  # ... and a killed pool process hands it back at once
    worker_prefetch_multiplier=1,  # turns can be long: do not let one worker hoard messages
    broker_connection_retry_on_startup=True,
    # A late-acked task comes back once this long has passed without an ack: keep it above the longest
    # countdown you schedule and the longest turn (a redelivery is harmless, but costs a no-op advance).
    broker_transport_options={"visibility_timeout": 3600},
    # The sweep goes to a queue the workers consume (-Q agents,...): sent to Celery's default queue
    # "celery", no worker would take it, and a killed worker's job would stay running for good.
    beat_schedule={"phaserunner-sweep": {"task": "support.sweep", "schedule": 60.0,
                                         "options": {"queue": "agents"}}},
)

storage = RedisStorage.from_url(REDIS_URL, prefix="support")
# Task ids carry the storage's prefix: two apps on one broker never share an id.
scheduler = CeleryScheduler.for_storage(celery, storage, queue="agents", app=APP_PATH)
app = App(storage=storage, scheduler=scheduler, agents=[build_agent(os.environ.get("SUPPORT_MODEL") or None)],
          lease_seconds=120)


@celery.task(name="support.sweep", ignore_result=True, shared=False)
def sweep() -> list[str]:
    """Beat's safety net: re-send every running job overdue by ``SWEEP_GRACE`` and not leased (I7)."""
    return app.requeue_overdue(grace=SWEEP_GRACE)

"""The app of a Redis + RQ deployment: the same module serves the web side, the workers and cron.

    export REDIS_URL=redis://127.0.0.1:6379/0
    export SUPPORT_MODEL=openai/gpt-4o-mini OPENAI_API_KEY=...     # omit both for the offline scripted model
    pipelines worker  --app examples.production.app:app             # as many as you like, on any machines
    pipelines advance --app examples.production.app:app --due       # cron, every minute: the safety net
    python -m examples.production.web "Where is my order A-1001?"   # what a web request does

Secrets come from the environment (litellm reads OPENAI_API_KEY and the like)
and never reach storage: a worker rebuilds the agent from this module.
"""

from __future__ import annotations

import os

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from examples.support_agent import build_agent
from pipelines import App

APP_PATH = "examples.production.app:app"

storage = RedisStorage.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), prefix="support")
# The scheduler takes its namespace from the storage, so two apps on one Redis never share RQ job ids.
scheduler = RQScheduler.for_storage(storage, queue="agents", app=APP_PATH, job_timeout=300)
support = build_agent(os.environ.get("SUPPORT_MODEL") or None)
app = App(
    storage=storage,
    scheduler=scheduler,
    agents=[support],
    lease_seconds=120,  # at least the longest model call plus tools (the lease is renewed while a turn runs)
    continue_for=0.5,  # a worker may run a job's next turn at once for up to 0.5 s before requeueing it
)

"""The App of the browser tests (tests/system/test_ui_browser.py): a support desk on Redis + RQ.

Its ``refund`` tool needs a person's approval; its model is ``tests.fake_openai``
at ``$FAKE_OPENAI_BASE``. Worker and ``pipelines ui`` processes load
``tests.apps.ui_app:app``; the test builds its own with :func:`build`.
"""

from __future__ import annotations

import os

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Agent, App, tool

APP_PATH = "tests.apps.ui_app:app"


@tool(needs_approval=True)
def refund(amount: int) -> str:
    """Refund an amount of money."""
    return f"refunded {amount}"


def build(redis_url: str, model_base: str) -> App:
    """The app on the Redis at ``redis_url``, its agent talking to the fake model server at ``model_base``."""
    storage = RedisStorage.from_url(redis_url)
    scheduler = RQScheduler(storage.client, queue="pipelines", app=APP_PATH, job_timeout=120, result_ttl=60,
                            failure_ttl=3600)
    desk = Agent(name="desk", model="openai/fake-model", tools=[refund], system="You help customers.",
                 max_turns=10, model_params={"api_base": model_base, "api_key": "sk-test", "timeout": 20})
    return App(storage=storage, scheduler=scheduler, agents=[desk], version="1.4.2")


app = build(os.environ["REDIS_URL"], os.environ.get("FAKE_OPENAI_BASE", "http://127.0.0.1:9/v1")) \
    if os.environ.get("REDIS_URL") else None

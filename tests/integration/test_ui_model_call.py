"""A turn's model call on the page (issue 35): what was sent, in short and with secrets hidden, and what
came back, per turn, with the attempts that came before the one that committed."""

from __future__ import annotations

import warnings
from typing import Any

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient

from adapters.memory import MemoryScheduler, MemoryStorage
from phases.model import ModelRequest, ModelResponse
from pipelines import Agent, App, tool
from pipelines.engine.errors import TransientModelError
from pipelines.testing import ScriptedModel, call, reply
from pipelines.web.ui import ui_app
from tests.fake_openai import FakeOpenAI, text_reply
from tests.integration.test_ui import LOCAL

SECRET = "sk-live-do-not-show-0123456789"
PARAMS = {"temperature": 0.2, "max_tokens": 300, "api_key": SECRET, "extra_headers": {"x-token": SECRET},
          "api_base": f"https://user:{SECRET}@llm.example.test/v1?key={SECRET}", "seed": 7,
          # A secret under a name the rule did not know, and one whose value says what it is.
          "auth": f"Bearer {SECRET}", "gateway_pass_through": SECRET}


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


class FailsOnce(ScriptedModel):
    """The scripted answers; the second call fails once with a transient error (the turn is retried)."""

    def __init__(self, fn: Any) -> None:
        super().__init__(fn)
        self.tries = 0

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.tries += 1
        if self.tries == 2:
            raise TransientModelError("the provider said 503")
        return super().complete(request)


def _app() -> App:
    model = FailsOnce(lambda msgs: "It has shipped." if msgs[-1]["role"] == "tool" else reply(
        "Let me look.", call("lookup", order="A-1")))
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(), provenance=False,
               agents=[Agent(name="desk", model=model, tools=[lookup], model_params=PARAMS)])


def test_a_turns_call_shows_what_was_sent_and_what_came_back_and_never_a_secret() -> None:
    app = _app()
    app.run_agent("desk", job_id="c1", user="where is A-1?")
    app.drain()
    assert app.get("c1").status.value == "complete"  # type: ignore[union-attr]
    stored = repr(app.events("c1")) + repr(app.storage.get_job("c1"))
    assert SECRET not in stored and "llm.example.test" in stored  # kept in short, the secrets left out
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        job = c.get("/jobs/c1").text
        assert 'href="/jobs/c1/turns/1" class="open-call"' in job
        first = c.get("/jobs/c1/turns/1")
        second = c.get("/jobs/c1/turns/2").text
        missing, bad = c.get("/jobs/c1/turns/9"), c.get("/jobs/c1/turns/x")
    page = first.text
    assert first.status_code == 200 and SECRET not in page and SECRET not in second
    assert '<dd id="call-tools"><code>lookup</code>' in page
    assert "&#34;api_key&#34;: &#34;[hidden]&#34;" in page and "&#34;extra_headers&#34;: &#34;[hidden]&#34;" in page
    assert "https://llm.example.test/v1?[hidden]" in page and "&#34;max_tokens&#34;: 300" in page
    assert "&#34;auth&#34;: &#34;[hidden]&#34;" in page and "&#34;gateway_pass_through&#34;: &#34;[hidden]&#34;" in page
    assert 'id="call-messages">1 &middot;' in page  # the user's question (this agent has no system prompt)
    assert "Let me look." in page and "&#34;lookup&#34;" in page and "order A-1: shipped" in page
    assert 'id="call-one-attempt"' in page
    # Turn 2's call failed once (a 503) and ran again: the page says so, and what the attempt that committed sent.
    assert "attempt failed and was retried" in second and "503" in second
    assert 'id="call-messages">3 &middot;' in second and "It has shipped." in second
    assert missing.status_code == 404 and bad.status_code == 400


def test_a_litellm_turn_shows_the_providers_response_around_the_message(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_reply("It has shipped."))
    agent = Agent(name="desk", model="openai/fake-model", model_params={"api_base": fake_openai.url,
                                                                        "api_key": SECRET})
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), provenance=False, agents=[agent])
    app.run_agent("desk", job_id="raw1", user="where is A-1?")
    app.drain()
    assert app.get("raw1").status.value == "complete"  # type: ignore[union-attr]
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        page = c.get("/jobs/raw1/turns/1").text
    raw = page.split('id="call-raw">', 1)[1].split("</pre>", 1)[0]
    assert "chatcmpl-fake-" in raw and "&#34;finish_reason&#34;: &#34;stop&#34;" in raw and "total_tokens" in raw
    assert "It has shipped." not in raw  # the message is shown once, above it
    assert SECRET not in page and fake_openai.url not in raw
    # A model with no provider response (scripted) has no such block.
    scripted = _app()
    scripted.run_agent("desk", job_id="s1", user="where is A-1?")
    scripted.drain()
    with TestClient(ui_app(scripted), base_url=LOCAL) as c:
        assert 'id="call-raw"' not in c.get("/jobs/s1/turns/1").text

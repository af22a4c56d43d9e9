"""Which cursors the SSE endpoint takes, alike on memory, SQLite and Redis (docs/guide/streaming.md).

A cursor this job's stream never gave out is a 400, as far as the stream still shows it (see
:mod:`pipelines.web.cursors`); ``"0"`` is the cursor before every part on every backend.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.routing import Route

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from pipelines import Agent, App
from pipelines.engine.models import Event, Message
from pipelines.testing import ScriptedModel, call, reply
from pipelines.web import sse_response
from tests.integration.test_ai_sdk_resume import KINDS, storage_of
from tests.integration.test_sse import lookup, read_events, routes, serve


def chat(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> App:
    return App(storage=storage_of(kind, request, tmp_path), scheduler=MemoryScheduler(),
               agents=[Agent(name="a", model=ScriptedModel(lambda msgs: "The answer is 42."))])


def key(part_id: str) -> tuple[int, ...]:
    return tuple(int(x) for x in part_id.split("-"))


def status(base: str, job_id: str, cursor: str, fmt: str) -> int:
    url = f"{base}/jobs/{job_id}/stream?format={fmt}"
    return httpx.get(url, headers={"Last-Event-ID": cursor}, timeout=30).status_code


@pytest.mark.parametrize("kind", KINDS)
def test_a_cursor_of_another_job_running_at_the_same_time_is_refused_where_the_stream_can_tell(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # Two jobs stream at once: on Redis their ids interleave, and a cursor of B fell inside A's range; it was
    # taken (200), and A's parts before it were skipped without a word.
    app = chat(kind, request, tmp_path)
    app.run_agent("a", job_id="A", messages=["q"])
    app.run_agent("a", job_id="B", messages=["q"])
    for _ in range(3):
        for job_id in ("A", "B"):
            time.sleep(0.002)  # Redis stream ids are times: in one millisecond the two streams give out the same ids
            app.storage.publish(job_id, [Event(timestamp=1.0, type="attempt_started", turn=1, data={"attempt": "x"}),
                                         Event(timestamp=1.0, type="text_delta", turn=1,
                                               data={"attempt": "x", "text": "The "})])
    app.drain()
    a = [p.id for p in app.stream("A", follow=False)]
    b = [p.id for p in app.stream("B", follow=False)]
    # B's ids after A's first published part and before A's last that name no part of A.
    inside = [i for i in b if key(a[2]) < key(i) < key(a[-1]) and i not in a]
    with serve(routes(app)) as base:
        for fmt in ("parts", "ai-sdk"):
            if isinstance(app.storage, RedisStorage):
                assert inside and all(status(base, "A", i, fmt) == 400 for i in inside)
            else:
                # Memory and SQLite count each job's parts on its own: B's ids name parts of A (the limit the
                # docs state); every id of A is taken, and one past A's last is not.
                assert not inside and all(status(base, "A", i, fmt) == 200 for i in a)
            *ms, seq = a[-1].split("-")
            assert status(base, "A", "-".join([*ms, str(int(seq) + 1)]), fmt) == 400  # one past A's last


@pytest.mark.parametrize("kind", KINDS)
def test_zero_is_the_cursor_before_every_part_and_a_padded_id_is_refused_on_every_backend(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # "0" was 200 on memory and SQLite and 400 on Redis; "00<id>" was taken as <id> and answered with a replay.
    app = chat(kind, request, tmp_path)
    app.run_agent("a", job_id="z", messages=["q"])
    app.drain()
    first = next(iter(app.stream("z", follow=False))).id
    with serve(routes(app)) as base:
        for fmt in ("parts", "ai-sdk"):
            assert status(base, "z", "0", fmt) == 200
            assert status(base, "z", f"00{first}", fmt) == 400
        assert status(base, "z", f"{first}:00", "ai-sdk") == 400
        parts = httpx.get(f"{base}/jobs/z/stream", headers={"Last-Event-ID": "0"}, timeout=30).text
        assert parts.count("\nid: ") + parts.startswith("id: ") == len(list(app.stream("z", follow=False)))


def _alpha_then_beta() -> ScriptedModel:
    calls: list[int] = []

    def script(msgs: list[Message]) -> Any:
        calls.append(1)
        if len(calls) == 1:
            return reply("Alpha: let me check.", call("lookup", order="A-1"))
        if len(calls) == 2:
            raise ValueError("model exploded")
        return "Beta: a completely different final answer."
    return ScriptedModel(script)


@pytest.mark.parametrize("kind", KINDS)
def test_a_cursor_in_a_run_a_full_retry_undid_is_refused_not_answered_with_the_new_runs_text(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # Run 1 said "Alpha" and called lookup, then failed; a full retry cut the transcript back and run 2 said
    # "Beta". A reader of run 1 resuming got Alpha, then "start -r1" and Beta under ids run 1 had used for other
    # chunks, and lost run 1's tool call: its turn_committed named indices run 2 now holds.
    app = App(storage=storage_of(kind, request, tmp_path), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=_alpha_then_beta(), tools=[lookup])])
    app.run_agent("a", job_id="f", messages=["where?"])
    app.drain()
    assert app.get("f").status.value == "error"
    first = next(iter(app.stream("f", follow=False))).id

    async def from_first(request: Request) -> Any:
        return sse_response(app, "f", request, format="ai-sdk", start_at=first)

    server = routes(app)
    server.routes.append(Route("/first", from_first))
    with serve(server) as base:
        run1 = [i for i, _ in read_events(httpx.get(f"{base}/jobs/f/stream?format=ai-sdk", timeout=30)) if i]
        assert len(run1) >= 8 and httpx.get(f"{base}/first", timeout=30).status_code == 200
        app.retry("f", mode="full")
        app.drain()
        assert [m["content"] for m in app.messages("f")][-1] == "Beta: a completely different final answer."
        assert [status(base, "f", i, "ai-sdk") for i in run1] == [400] * len(run1)
        # A bare part id where run 1 ended asks for what follows it, none of run 1 (what a POST that started
        # the retry streams from): that is run 2.
        assert status(base, "f", run1[-1].split(":")[0], "ai-sdk") == 200
        assert httpx.get(f"{base}/first", timeout=30).status_code == 400
        # The parts themselves are what they were: the parts format takes the cursors; run 2 resumes as ever.
        assert all(status(base, "f", i.split(":")[0], "parts") == 200 for i in run1)
        run2 = [i for i, _ in read_events(httpx.get(f"{base}/jobs/f/stream?format=ai-sdk", timeout=30)) if i]
        assert run2 and all(status(base, "f", i, "ai-sdk") == 200 for i in run2)

"""A long job stays usable on its page (issue 35): a 1,200-message conversation paged, events and log lines
newest first a page at a time (read from the end of the history, never whole), and a live refresh that sends
only the messages committed since those shown."""

from __future__ import annotations

import html
import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, App
from pipelines.engine.models import Event, JobRecord, JobStatus, LogEntry
from pipelines.testing import ScriptedModel, reply
from pipelines.web.job_page import EVENTS_PAGE, LOGS_PAGE, MESSAGES_PAGE
from pipelines.web.ui import ui_app

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient

LOCAL = "http://127.0.0.1"


class CountingStorage(MemoryStorage):
    """Memory storage that counts the reads a page makes of a job's whole history."""

    def __init__(self) -> None:
        super().__init__()
        self.whole: list[str] = []

    def logs(self, job_id: str) -> list[LogEntry]:
        self.whole.append("logs")
        return super().logs(job_id)

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        self.whole.append("events")
        return super().events(job_id, after=after, limit=limit)


def _model(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    return reply(f"you said: {msgs[-1].get('content')}")


@pytest.fixture
def app() -> App:
    return App(storage=CountingStorage(), scheduler=MemoryScheduler(), provenance=False,
               agents=[Agent(name="desk", model=ScriptedModel(_model))])


@pytest.fixture
def client(app: App) -> Iterator[TestClient]:
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        yield c


def long_job(app: App, job_id: str = "long", *, messages: int = 1200, events: int = 1000, logs: int = 700) -> None:
    app.storage.create_job(
        JobRecord(job_id=job_id, pipeline="desk", status=JobStatus.COMPLETE, transcript_len=messages),
        messages=[{"role": "user" if n % 2 == 0 else "assistant", "content": f"message {n}"} for n in range(messages)],
        logs=[LogEntry(timestamp=1.0 + n, phase="turn", message=f"log line {n}") for n in range(logs)],
        events=[Event(timestamp=1.0 + n, type="note", data={"n": n}) for n in range(events)])


def shown(page: str) -> list[int]:
    return [int(n) for n in re.findall(r'class="msg role-[a-z]+" id="m-(\d+)"', page)]


def test_a_long_conversation_is_paged_from_its_latest_messages(app: App, client: TestClient) -> None:
    long_job(app)
    page = client.get("/jobs/long").text
    assert shown(page) == list(range(1100, 1200)) and MESSAGES_PAGE == 100
    assert "1200 messages" in page and "messages 1101&ndash;1200" in page
    earlier = re.search(r'href="\?([^"#]*)#transcript" id="earlier"', page)
    assert earlier is not None and html.unescape(earlier.group(1)) == "upto=1100"
    before = client.get("/jobs/long?upto=1100").text
    assert shown(before) == list(range(1000, 1100)) and 'id="later"' in before and 'id="latest"' in before
    assert shown(client.get("/jobs/long?upto=30").text) == list(range(30))
    assert client.get("/jobs/long?upto=ten").status_code == 400


def test_events_and_logs_newest_first_a_page_at_a_time_read_from_the_end(app: App, client: TestClient) -> None:
    long_job(app)
    storage: CountingStorage = app.storage  # type: ignore[assignment]
    page = client.get("/jobs/long").text
    numbers = [int(n) for n in re.findall(r'<b>note</b> <code>\{"n": (\d+)\}</code>', page)]
    assert numbers == list(range(999, 999 - EVENTS_PAGE, -1))
    lines = [int(n) for n in re.findall(r"turn: log line (\d+)</div>", page)]
    assert lines == list(range(699, 699 - LOGS_PAGE, -1))
    older = re.search(r'href="\?([^"#]*)#events" id="events-older"', page)
    assert older is not None
    second = client.get("/jobs/long?" + html.unescape(older.group(1))).text
    assert re.findall(r'<b>note</b> <code>\{"n": (\d+)\}</code>', second)[:2] == ["899", "898"]
    logs_older = client.get("/jobs/long?logs_skip=600").text
    assert [int(n) for n in re.findall(r"turn: log line (\d+)</div>", logs_older)] == list(range(99, -1, -1))
    assert 'id="log-older"' not in logs_older and 'id="log-newest"' in logs_older
    assert storage.whole == []  # neither the whole log nor the events from the start were read


def test_the_live_refresh_sends_only_the_messages_committed_since_those_shown(app: App, client: TestClient) -> None:
    long_job(app)
    quiet = client.get("/jobs/long/live", params={"from": 1200, "first": 1100})
    assert shown(quiet.text) == [] and 'data-len="1200"' in quiet.text
    assert "message 1199" not in quiet.text and "message 1199" in client.get("/jobs/long").text
    app.run_agent("desk", job_id="chat", user="hello")
    app.drain()
    assert shown(client.get("/jobs/chat/live", params={"from": 1}).text) == [1]  # the reply, not the question
    app.send("chat", ["again"])
    app.drain()
    assert shown(client.get("/jobs/chat/live", params={"from": 2}).text) == [2, 3]
    cut = client.get("/jobs/chat/live", params={"from": 9}).text  # more than it has: cut back, reload
    assert 'data-reset="yes"' in cut


def test_a_live_refresh_more_than_a_page_behind_reloads_instead_of_sending_the_transcript(app: App,
                                                                                          client: TestClient) -> None:
    long_job(app)  # 1,200 messages
    whole = client.get("/jobs/long/live", params={"from": 0})
    assert 'data-reset="yes"' in whole.text and shown(whole.text) == []
    behind = client.get("/jobs/long/live", params={"from": 1200 - MESSAGES_PAGE - 1})
    assert 'data-reset="yes"' in behind.text and shown(behind.text) == []
    page = client.get("/jobs/long/live", params={"from": 1200 - MESSAGES_PAGE})
    assert 'data-reset="no"' in page.text and len(shown(page.text)) == MESSAGES_PAGE


def test_a_page_whose_transcript_was_cut_back_and_grew_again_reloads(app: App, client: TestClient) -> None:
    # Another operator retried the job from the start meanwhile: the page's "from" is in range again, but what it
    # shows up to there is not what the transcript now holds, so appending would mix two runs.
    app.run_agent("desk", job_id="chat", user="hello")
    app.drain()
    page = client.get("/jobs/chat").text
    tail = re.search(r'id="messages" data-first="0" data-len="2" data-tail="([0-9a-f]{16})"', page)
    assert tail is not None
    same = client.get("/jobs/chat/live", params={"from": 2, "tail": tail.group(1)}).text
    assert 'data-reset="no"' in same and f'data-tail="{tail.group(1)}"' in same
    app.storage.commit(_cut_back_and_grown(app.storage.get_job("chat"), app))
    moved = client.get("/jobs/chat/live", params={"from": 2, "tail": tail.group(1)}).text
    assert 'data-reset="yes"' in moved


def _cut_back_and_grown(rec: Any, app: App) -> Any:
    """The commit of a full retry's first turn, in one: the transcript cut back to the user's message and another
    reply after it, as long as before."""
    from pipelines.engine.models import Commit

    new = rec.model_copy(update={"version": rec.version + 1})
    return Commit(job_id=rec.job_id, expected_version=rec.version, token="retried", record=new,
                  truncate_messages_to=1, append_messages=[{"role": "assistant", "content": "another run's reply"}])


def test_the_live_refresh_sends_only_the_log_lines_and_events_after_those_shown(app: App,
                                                                               client: TestClient) -> None:
    app.run_agent("desk", job_id="chat", user="hello")
    app.drain()
    page = client.get("/jobs/chat").text
    newest = re.search(r'id="event-list" data-newest="([^"]+)"', page)
    lines = re.search(r'id="log-lines" data-total="(\d+)"', page)
    assert newest is not None and lines is not None
    quiet = client.get("/jobs/chat/live", params={"from": 2, "logs_seen": lines.group(1),
                                                   "events_seen": newest.group(1)}).text
    assert '<div id="live-logs" data-total="' + lines.group(1) + '"></div>' in quiet
    assert '<ul id="live-events"></ul>' in quiet
    app.send("chat", ["again"])
    app.drain()
    fresh = client.get("/jobs/chat/live", params={"from": 2, "logs_seen": lines.group(1),
                                                   "events_seen": newest.group(1)}).text
    new_events = re.findall(r'<li data-event="([^"]+)">', fresh.split('<ul id="live-events">', 1)[1])
    after = [e.id for e in app.events("chat", after=newest.group(1))]
    assert new_events == after[::-1] and new_events  # only the new ones, newest first
    new_lines = fresh.split('<div id="live-logs"', 1)[1].split("</div>", 1)[0]
    assert int(re.search(r'data-total="(\d+)"', new_lines).group(1)) > int(lines.group(1))  # type: ignore[union-attr]
    assert "job started" not in new_lines  # the first run's lines are not sent again
    assert "live-logs" not in client.get("/jobs/chat/live").text  # a page not following the log asks for none


def test_bad_paging_input_is_a_400_naming_it(app: App, client: TestClient) -> None:
    long_job(app, messages=10, events=10, logs=10)
    cases = [("/jobs/long", {"events_before": "yesterday"}, "cursor"),
             ("/jobs/long", {"logs_skip": "-1"}, "logs_skip must be a whole number"),
             ("/jobs/long/live", {"from": "1e9"}, "from must be a whole number"),
             ("/jobs/long/live", {"events_seen": "1; DROP"}, "cursor"),
             ("/jobs/long/live", {"logs_seen": "x"}, "logs_seen must be a whole number"),
             # Digits str.isdigit() takes and int() refuses: a bare 500 before.
             ("/jobs/long", {"logs_skip": "\u00b2"}, "logs_skip must be a whole number"),
             ("/jobs/long/live", {"from": "1\u00b2"}, "from must be a whole number"),
             ("/", {"page": "\u00b2"}, "page must be a whole number"),
             ("/jobs/long/turns/\u00b2", {}, "a turn is a whole number"),
             ("/", {"partial": "1", "ids": "a b"}, "invalid job id"),
             ("/", {"partial": "1", "ids": "a", "loaded": "soon"}, "loaded must be a time"),
             ("/", {"before": "1.0/ok", "back": "nonsense", "page": "2"}, None)]
    for path, params, text in cases:
        response = client.get(path, params=params)
        if text is None:  # a bad cursor in "back" is only read when "previous" is followed
            assert response.status_code == 200
            prev = re.search(r'href="\?([^"]*)" id="prev"', response.text)
            assert prev is not None and client.get("/?" + html.unescape(prev.group(1))).status_code == 400
            continue
        assert response.status_code == 400, (path, params, response.status_code)
        assert text in response.text, (path, params)

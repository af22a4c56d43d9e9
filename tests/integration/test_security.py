"""Issue 5, "Security", against a real redis-server.

* Nothing is pickled anywhere: agent and pipeline jobs run through
  RedisStorage + RQScheduler (an in-process ``SimpleWorker`` with RQ's
  JSONSerializer), then every key of every type in Redis is read back.
* An API key in model settings never reaches storage, logs (ours, RQ's,
  litellm's), call events, job errors, or raised errors.
* A crafted job id cannot escape its job's key namespace.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import re
import traceback
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from rq.serializers import JSONSerializer

from adapters.memory import MemoryScheduler
from adapters.redis import JobKeys, RedisStorage, finished_key, index_keys, job_keys, listing_keys
from adapters.redis.compact import widen
from adapters.redis.keys import KeyLayout, layout_key
from adapters.rq import RQScheduler, rq_job_id
from phases.agent_turn import resolve_model
from phases.model import ModelRequest
from phases.observe import observe_calls
from pipelines import Agent, App, Done, JobStatus, Next, Phase, PhaseContext, tool, worker
from pipelines.engine.errors import InvalidJobIdError, ModelError
from pipelines.testing import ScriptedModel, call, reply
from tests.fake_openai import FakeOpenAI, bad_request, text_reply, tool_reply, unauthorized
from tests.fake_openai import call as fake_call
from tests.rq_workers import BurstWorker

pytestmark = pytest.mark.redis

PREFIX = "sec"
SENTINEL = "sk-SENTINEL-9f8e7d"
# The distinctive part: a redaction that kept "SENTINEL-9f8e7d" would still leak the key.
SENTINEL_CORE = "SENTINEL-9f8e7d"
PICKLE_HEADERS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


@pytest.fixture
def rq_app(storage: RedisStorage) -> Iterator[App]:
    """An App on RedisStorage + RQScheduler, installed as this process's worker app."""
    sched = RQScheduler(storage.client, queue="sec", job_timeout=60, result_ttl=600, failure_ttl=600)
    app = App(storage=storage, scheduler=sched)
    worker.forget_apps()
    worker.use_app(app)
    yield app
    worker.forget_apps()


def work(app: App, *, level: str = "WARNING") -> None:
    sched = app.scheduler
    assert isinstance(sched, RQScheduler)
    worker = BurstWorker([sched.queue], connection=sched.connection, serializer=JSONSerializer)
    worker.work(burst=True, logging_level=level)


# --- reading every value in Redis --------------------------------------------------
def every_value(r: redis.Redis) -> tuple[list[tuple[bytes, bytes, bytes]], set[str]]:
    """``(key, field, value)`` for every value of every key (field is b"" where there is none), and the types seen."""
    out: list[tuple[bytes, bytes, bytes]] = []
    kinds: set[str] = set()
    for key in r.scan_iter("*"):
        kind = r.type(key).decode()
        kinds.add(kind)
        if kind == "string":
            out.append((key, b"", r.get(key) or b""))
        elif kind == "hash":
            for f, v in r.hgetall(key).items():
                out += [(key, b"<field>", f), (key, f, v)]
        elif kind == "list":
            out += [(key, b"", v) for v in r.lrange(key, 0, -1)]
        elif kind == "set":
            out += [(key, b"", v) for v in r.smembers(key)]
        elif kind == "zset":
            out += [(key, b"", v) for v, _ in r.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            for entry_id, fields in r.xrange(key):
                out.append((key, b"<id>", entry_id))
                for f, v in fields.items():
                    out += [(key, b"<field>", f), (key, f, v)]
        else:
            pytest.fail(f"unexpected Redis type {kind} at {key!r}")
    return out, kinds


def _printable(data: bytes) -> bool:
    """Plain ASCII text: printable characters, plus the newlines and tabs of a traceback."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\n\t" for c in text)


def decoded_forms(field: bytes, value: bytes) -> list[bytes]:
    """The value as stored, plus what RQ wraps in it: zlib (job data, exc_info), base64 (results stream)."""
    forms = [value]
    if field in (b"return_value", b"exc_string"):
        with contextlib.suppress(binascii.Error):
            forms.append(base64.b64decode(value, validate=True))
    for form in list(forms):
        if not _printable(form):
            with contextlib.suppress(zlib.error):
                forms.append(zlib.decompress(form))
    return forms


def assert_plain_data(key: bytes, field: bytes, value: bytes) -> None:
    """Not pickled, and (once RQ's wrapping is undone) JSON or a plain printable token."""
    forms = decoded_forms(field, value)
    for form in forms:
        assert not form.startswith(PICKLE_HEADERS), (key, field, form[:40])
    last = forms[-1]
    assert _json_text(last) or _printable(last), (key, field, last[:80])


def _json_text(data: bytes) -> bool:
    """JSON text, as written or compact (record format 3 stores events and record deltas with runs as bytes)."""
    try:
        json.loads(widen(data.decode("utf-8")))
    except (UnicodeDecodeError, ValueError):
        return False
    return True


# --- 1. nothing is pickled anywhere ---------------------------------------------------
def _slow(ctx: PhaseContext[Any]) -> Next:
    return Next("slow", delay=3600)  # stays in RQ's scheduled registry (a zset)


def test_nothing_is_pickled_anywhere_after_agent_and_pipeline_jobs_ran_through_rq(
    rq_app: App, r: redis.Redis, storage: RedisStorage
) -> None:
    model = ScriptedModel(lambda msgs: reply("thinking", call("add", a=len(msgs), b=1)) if len(msgs) < 5 else "done")
    agent = Agent(name="adder", model=model, tools=[add], system="You add.", max_turns=5)
    rq_app.add_agent(agent)
    rq_app.add_pipeline("slow", [Phase("slow", _slow)])
    rq_app.add_pipeline("boom", [Phase("boom", lambda ctx: 1 / 0)])  # type: ignore[arg-type, return-value]
    for i in range(3):
        agent.run(job_id=f"chat:{i}", messages=[f"hello {i} \u00e9\u4e2d"], storage=storage,
                  scheduler=rq_app.scheduler)
    rq_app.run_pipeline("slow", job_id="slow.1")
    rq_app.run_pipeline("boom", job_id="boom_1")
    # An advance that fails inside RQ (its app cannot be imported): RQ stores a traceback.
    missing = RQScheduler(storage.client, queue="sec", app="tests.apps.no_such_module:app")
    App(storage=storage, scheduler=missing)
    missing.schedule_advance("chat:0", version=99)
    work(rq_app)

    for i in range(3):
        assert storage.get_job(f"chat:{i}").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    assert storage.get_job("boom_1").status is JobStatus.ERROR  # type: ignore[union-attr]
    values, kinds = every_value(r)
    # Every kind of key RQ and the storage write was there to be checked.
    assert {"string", "hash", "list", "set", "zset", "stream"} <= kinds, kinds
    assert any(k.startswith(b"rq:job:") for k, _, _ in values)
    assert any(f == b"exc_string" or f == b"exc_info" for _, f, _ in values)  # the failed advance's traceback
    for key, field, value in values:
        assert_plain_data(key, field, value)
    # And the payloads themselves are the JSON we expect, not just "not pickle".
    data = r.hget(f"rq:job:{rq_job_id('chat:0', 1)}", "data")
    assert data is not None and json.loads(zlib.decompress(data))[0] == "pipelines.worker.advance_job"


# --- 2. API keys never leak ----------------------------------------------------------------
def _texts_of(exc: BaseException) -> list[str]:
    shown = [str(exc), repr(exc), "".join(traceback.format_exception(exc)), repr(exc.args)]
    chained = exc.__cause__ or exc.__context__
    while chained is not None:
        shown += [str(chained), repr(chained), repr(chained.args)]
        chained = chained.__cause__ or chained.__context__
    return shown


def test_an_api_key_in_model_settings_reaches_no_storage_log_event_or_error(
    rq_app: App, r: redis.Redis, storage: RedisStorage, fake_openai: FakeOpenAI,
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    import litellm

    sent_keys: list[Any] = []
    real_completion = litellm.completion

    def spying_completion(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("model") != "openai/warmup":  # litellm's offline warm-up (mock_response): no request
            sent_keys.append(kwargs.get("api_key"))
        return real_completion(*args, **kwargs)

    monkeypatch.setattr(litellm, "completion", spying_completion)
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="LiteLLM")
    events: list[tuple[str, str, str]] = []
    params = {"api_key": SENTINEL, "api_base": fake_openai.url, "timeout": 10}
    agent = Agent(name="keyed", model="openai/fake", tools=[add], system="You add.", model_params=params)
    rq_app.add_agent(agent)

    with observe_calls(lambda kind, job, key: events.append((kind, job, key))):
        fake_openai.script(tool_reply(fake_call("add", {"a": 1, "b": 2})), text_reply("3"))
        agent.run(job_id="ok", messages=["1+2?"], storage=storage, scheduler=rq_app.scheduler)
        work(rq_app, level="DEBUG")
        fake_openai.script(unauthorized())
        agent.run(job_id="e401", messages=["hi"], storage=storage, scheduler=rq_app.scheduler)
        work(rq_app, level="DEBUG")
        # The server echoes the key back in its error text, as some providers do.
        fake_openai.script(bad_request(f"Incorrect API key provided: {SENTINEL}"))
        agent.run(job_id="e400", messages=["hi"], storage=storage, scheduler=rq_app.scheduler)
        work(rq_app, level="DEBUG")

    # The key was really used on every call (the test is not vacuous) ...
    assert sent_keys == [SENTINEL] * 4
    assert len(fake_openai.requests) == 4
    ok, e401, e400 = (storage.get_job(j) for j in ("ok", "e401", "e400"))
    assert ok is not None and ok.status is JobStatus.COMPLETE and ok.result == "3"
    assert e401 is not None and e401.status is JobStatus.ERROR
    assert e401.error is not None and "authentication failed for model openai/fake" in e401.error
    assert e400 is not None and e400.status is JobStatus.ERROR
    assert e400.error is not None and "bad request to model openai/fake" in e400.error

    # ... and it is nowhere: Redis (every value, RQ's too, decoded), job errors and logs,
    shown: list[str] = []
    values, _ = every_value(r)
    for key, field, value in values:
        shown += [form.decode("utf-8", "replace") for form in decoded_forms(field, value)]
        shown.append(key.decode("utf-8", "replace"))
    for job in (ok, e401, e400):
        shown += [job.model_dump_json(), str(job.error), repr(job)]
        shown += [e.model_dump_json() for e in storage.logs(job.job_id)]
        shown += [json.dumps(m) for m in storage.messages(job.job_id)]
    # Python logging (ours, RQ's, litellm's), with tracebacks, and anything printed,
    for rec in caplog.records:
        shown.append(rec.getMessage())
        if rec.exc_info and rec.exc_info[1] is not None:
            shown += _texts_of(rec.exc_info[1])
    captured = capfd.readouterr()
    shown += [captured.out, captured.err, caplog.text]
    # call events, and the agent's own representations,
    shown += [repr(e) for e in events]
    shown += [repr(agent), repr(agent.phases())]
    assert events and {kind for kind, _, _ in events} == {"model", "tool"}
    for text in shown:
        assert SENTINEL_CORE not in text

    # ... nor in the errors the model seam raises, their chain and traceback included.
    model = resolve_model("openai/fake", params)
    assert SENTINEL_CORE not in repr(model)
    for reply_ in (unauthorized(), bad_request(f"Incorrect API key provided: {SENTINEL}")):
        fake_openai.script(reply_)
        with pytest.raises(ModelError) as info:
            model.complete(ModelRequest(messages=[{"role": "user", "content": "hi"}]))  # type: ignore[union-attr]
        for text in _texts_of(info.value):
            assert SENTINEL_CORE not in text


# --- 3. keys stay in their job's namespace ---------------------------------------------------
CRAFTED = ["a}b", "{a}", "a{", "}", "a*", "*", "a?b", "a[b]", "a b", "a\r\nFLUSHALL", "a\x00b", "pr:{x}:record"]


@pytest.mark.parametrize("job_id", CRAFTED, ids=repr)
def test_a_crafted_job_id_is_rejected_at_every_entry_and_writes_nothing(
    rq_app: App, r: redis.Redis, storage: RedisStorage, job_id: str
) -> None:
    rq_app.add_pipeline("p", [Phase("a", lambda ctx: Done())])
    sched = rq_app.scheduler
    assert isinstance(sched, RQScheduler)
    calls = [
        lambda: rq_app.run_pipeline("p", job_id=job_id),
        lambda: Agent(name="x", model=ScriptedModel(["hi"])).run(job_id=job_id, messages=["hi"], storage=storage,
                                                                  scheduler=sched),
        lambda: storage.keys(job_id),
        lambda: storage.get_job(job_id),
        lambda: storage.acquire_lease(job_id, "w1", 30),
        lambda: storage.delete_job(job_id),
        lambda: sched.schedule_advance(job_id, version=1),
        lambda: rq_job_id(job_id, 1),
        lambda: rq_app.try_advance(job_id),
    ]
    for fn in calls:
        with pytest.raises(InvalidJobIdError):
            fn()
    assert every_value(r)[0] == []


ALLOWED = ["a", "a:b", "a:b:record", "due", "jobs", "x.y", "-", "a_b", "A.b:C-9_z"]
_KEY = re.compile(rf"{PREFIX}:\{{(?P<job>[^{{}}]+)\}}:(?P<kind>{'|'.join(JobKeys._fields)})")


def _busy(ctx: PhaseContext[Any]) -> Next | Done:
    ctx.step("whoami", lambda: ctx.job_id)
    ctx.append_messages([{"role": "user", "content": f"I am {ctx.job_id}"}])
    ctx.log(f"log of {ctx.job_id}")
    if ctx.state["n"] == 0:
        return Next("busy", state={"n": 1, "me": ctx.job_id})
    return Done(result=ctx.job_id)


def test_every_key_written_for_a_job_carries_the_prefix_and_exactly_its_hash_tag(
    storage: RedisStorage, r: redis.Redis
) -> None:
    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("busy", _busy)]})
    for job_id in ALLOWED:
        app.run_pipeline("p", job_id=job_id, initial_state={"n": 0})
    # "a:b" is held by a worker that journaled a step and never finished: lease and journal keys too.
    storage.acquire_lease("a:b", "w1", 60)
    storage.record_step("a:b", version=1, owner="w1", key="s", value=1)
    scheduler.drain()

    due, jobs = index_keys(PREFIX)
    indexes = {due, jobs, finished_key(PREFIX), *listing_keys(PREFIX), layout_key(PREFIX)}
    seen: dict[str, set[str]] = {j: set() for j in ALLOWED}
    for key in (k.decode() for k in r.scan_iter("*")):
        if key in indexes:
            continue
        m = _KEY.fullmatch(key)
        assert m is not None, f"key {key!r} is outside every job namespace"
        # Redis hashes the text between the first "{" and the next "}": the job id, whole.
        assert key[key.index("{") + 1 : key.index("}")] == m["job"]
        assert m["job"] in seen, key
        seen[m["job"]].add(m["kind"])
    for job_id, kinds in seen.items():
        assert {"record", "logs"} <= kinds, (job_id, kinds)
        assert set(job_keys(PREFIX, job_id)) >= {f"{PREFIX}:{{{job_id}}}:{kind}" for kind in kinds}
    assert seen["a:b"] == {"record", "logs", "journal", "lease", "events", "live"}
    assert seen["a"] >= {"record", "messages", "logs", "events"}
    # The index members are the ids themselves, not key fragments.
    assert sorted(x.decode() for x in r.smembers(jobs)) == sorted(ALLOWED)


def test_a_job_id_that_is_a_prefix_of_another_never_reads_or_deletes_its_data(
    storage: RedisStorage, r: redis.Redis
) -> None:
    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("busy", _busy)]})
    family = ["a", "a:b", "a:b:c", "a:"]
    for job_id in family:
        app.run_pipeline("p", job_id=job_id, initial_state={"n": 0})
    scheduler.drain()
    for job_id in family:
        rec = storage.get_job(job_id)
        assert rec is not None and rec.job_id == job_id and rec.result == job_id
        assert {m["content"] for m in storage.messages(job_id)} == {f"I am {job_id}"}
        assert {e.message for e in storage.logs(job_id) if e.message.startswith("log of")} == {f"log of {job_id}"}

    def keys_of(job_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in job_keys(PREFIX, job_id):
            kind = r.type(k).decode()
            if kind == "hash":
                out[k] = (kind, r.hgetall(k))
            elif kind == "list":
                out[k] = (kind, r.lrange(k, 0, -1))
            elif kind == "stream":
                out[k] = (kind, r.xrange(k))
            else:
                out[k] = (kind, r.get(k))
        return out

    others = {j: keys_of(j) for j in family[1:]}
    assert storage.delete_job("a") is True
    assert storage.get_job("a") is None
    assert {j: keys_of(j) for j in family[1:]} == others  # nothing of "a:b", "a:b:c" or "a:" went with it
    assert sorted(x.decode() for x in r.smembers(index_keys(PREFIX)[1])) == sorted(family[1:])


def test_key_names_are_injective_over_prefixes_and_ids() -> None:
    prefixes = ["ns", "ns:a", "ns:a:b", "a"]
    ids = ["a", "a:b", "b", "b:record", "record", "due", "jobs", "ns"]
    names: dict[str, tuple[str, str, str]] = {}
    for prefix in prefixes:
        for name in (*index_keys(prefix), finished_key(prefix), *listing_keys(prefix), layout_key(prefix)):
            assert name not in names, (name, names.get(name))
            names[name] = (prefix, "index", name)
        for job_id in ids:
            for kind, name in zip(JobKeys._fields, job_keys(prefix, job_id), strict=True):
                assert name not in names, (name, names.get(name), (prefix, job_id, kind))
                names[name] = (prefix, job_id, kind)
        # The bucketed layout (Redis Cluster) beside the unbucketed one, over the same prefixes and ids.
        layout = KeyLayout(prefix, 4)
        for ix in layout.indexes:
            for name in (ix.due, ix.jobs, ix.finished, *ix.listing):
                assert name not in names, (name, names.get(name))
                names[name] = (prefix, "bucket index", name)
        for job_id in ids:
            for kind, name in zip(JobKeys._fields, layout.job(job_id), strict=True):
                assert name not in names, (name, names.get(name), (prefix, job_id, kind))
                names[name] = (prefix, job_id, f"bucketed {kind}")
    assert len({rq_job_id(j, v) for j in ids for v in (0, 1, 10)}) == len(ids) * 3

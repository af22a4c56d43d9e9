"""What ``bench/chaos.py`` and ``tests/system/test_chaos.py`` share: processes, the W1 server, the checks.

* :class:`Procs`: a private redis-server (optionally ``appendonly yes``, restartable
  on the same port and dir) and ``python -m pipelines worker`` processes of
  ``tests.apps.chaos_app``, each in its own session, killed by pid/group in
  :meth:`Procs.cleanup` (and with the parent, via ``PR_SET_PDEATHSIG``).
* :class:`W1Server`: the loopback fake OpenAI server (``tests.fake_openai``) in
  this process, answering W1 and counting requests per job and turn.
* :class:`Killer`: SIGKILLs a random ready worker (its process group and its
  children: a forking worker's horse) and starts a fresh one; tracks the jobs
  each victim held until they advance again.
* :func:`check_jobs` / :func:`check_effects`: transcripts against the expected
  W1 transcript, and the tool's effects per idempotency key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rq import Worker
from rq.serializers import JSONSerializer

from adapters.rq import decode_rq_job_id, rq_job_id
from pipelines import JobStatus
from pipelines.app import App
from pipelines.streams import turn_texts
from tests.apps import chaos_app
from tests.fake_openai import FakeOpenAI, Reply, w1_reply
from tests.redis_server import die_with_parent, find_redis_server, free_port

ROOT = Path(__file__).resolve().parents[1]
APP_PATH = chaos_app.APP_PATH
_JOB_IN_MESSAGE = re.compile(r"\(job ([^)]+)\)")


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (a forking worker's horse lives in its own process group)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


# --- the fake model server ---------------------------------------------------------
class W1Server:
    """``tests.fake_openai`` in this process, answering W1 from the messages and counting requests.

    ``calls[(job id, k)]`` counts the requests for turn ``k`` (1-based) of each
    job (the job id is read from the first user message, see
    :func:`tests.apps.chaos_app.user_message`). ``delay``: seconds each answer
    waits before it is sent (a run that must last long enough to be disturbed).
    """

    def __init__(self, *, delay: float = 0.0) -> None:
        self.delay = delay
        self.fake = FakeOpenAI().start()
        # Killed workers reset their connections: not worth a traceback on stderr.
        server = getattr(self.fake, "_server", None)
        if server is not None:
            server.handle_error = lambda request, client_address: None
        self.calls: Counter[tuple[str, int]] = Counter()
        self._lock = threading.Lock()
        self.fake.script(self._answer)

    @property
    def url(self) -> str:
        return self.fake.url

    def _answer(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        first = next((m for m in messages if m.get("role") == "user"), {})
        found = _JOB_IN_MESSAGE.search(str(first.get("content") or ""))
        k = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        with self._lock:
            self.calls[(found.group(1) if found else "?", k)] += 1
            # The server keeps every body for tests; a long chaos run needs none of them.
            self.fake.requests.clear()
            self.fake.timestamps.clear()
        reply = w1_reply(body)
        return dataclasses.replace(reply, delay=self.delay) if self.delay else reply

    def requests_for(self, job_ids: Iterable[str]) -> int:
        wanted = set(job_ids)
        with self._lock:
            return sum(n for (job, _k), n in self.calls.items() if job in wanted)

    def repeated_for(self, job_ids: Iterable[str]) -> int:
        """Requests beyond the first for the same job and turn."""
        wanted = set(job_ids)
        with self._lock:
            return sum(n - 1 for (job, _k), n in self.calls.items() if job in wanted and n > 1)

    def stop(self) -> None:
        self.fake.stop()


# --- expected transcripts ----------------------------------------------------------
def expected_transcript(job_id: str, turns: int) -> list[dict[str, Any]]:
    """The W1 transcript of ``job_id``: the pinned system prompt, what the fake server answers, the tool's results."""
    system = {"role": "system", "content": chaos_app.SYSTEM}
    messages: list[dict[str, Any]] = [system, {"role": "user", "content": chaos_app.user_message(job_id, turns)}]
    while True:
        reply = w1_reply({"messages": messages})
        assert reply.message is not None
        msg = dict(reply.message)
        if msg.get("content") is None:
            msg.pop("content")
        messages.append(msg)
        calls = msg.get("tool_calls") or []
        if not calls:
            return messages
        for c in calls:
            args = json.loads(c["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": c["id"],
                             "content": json.dumps({"sum": args["a"] + args["b"]})})


def transcript_problems(messages: list[dict[str, Any]]) -> list[str]:
    """Structural checks: each tool call answered exactly once, after it; ends with the assistant."""
    problems: list[str] = []
    calls: list[str] = []
    answered: Counter[str] = Counter()
    for m in messages:
        if m.get("role") == "assistant":
            calls += [c["id"] for c in m.get("tool_calls") or []]
        elif m.get("role") == "tool":
            if m.get("tool_call_id") not in calls:
                problems.append(f"result for an unknown call {m.get('tool_call_id')}")
            answered[m.get("tool_call_id") or ""] += 1
    if len(calls) != len(set(calls)):
        problems.append("a tool call id repeats")
    for c in calls:
        if answered[c] != 1:
            problems.append(f"call {c} answered {answered[c]} times")
    if not messages or messages[-1].get("role") != "assistant":
        problems.append("does not end with an assistant message")
    return problems


@dataclass
class JobsCheck:
    jobs: int
    complete: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    equal: int = 0  # transcripts equal to the expected one
    invalid: int = 0  # structurally broken transcripts
    lost: int = 0  # expected messages missing
    extra: int = 0  # messages present beyond the expected ones (duplicates)
    # Jobs whose live stream, read back as a client assembles it (the latest attempt of each turn), does not
    # give every turn's committed assistant text: kills during streaming must never leave a client wrong.
    stream_mismatch: int = 0
    stream_checked: int = 0  # jobs whose live stream carried text to check
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.complete == self.jobs == self.equal and not (self.invalid or self.lost or self.extra
                                                                  or self.stream_mismatch)


def check_jobs(app: App, job_ids: list[str], turns: int) -> JobsCheck:
    out = JobsCheck(jobs=len(job_ids))
    for job_id in job_ids:
        rec = app.storage.get_job(job_id)
        status = rec.status.value if rec is not None else "missing"
        out.statuses[status] += 1
        if rec is not None and rec.status is JobStatus.COMPLETE:
            out.complete += 1
        elif len(out.examples) < 5:
            out.examples.append(f"{job_id}: {status} {rec.error if rec else ''}")
        got = app.storage.messages(job_id) if rec is not None else []
        checked = _stream_matches(app, job_id, got) if rec is not None and rec.status is JobStatus.COMPLETE else None
        out.stream_checked += checked is not None
        if checked is False:
            out.stream_mismatch += 1
            if len(out.examples) < 5:
                out.examples.append(f"{job_id}: the live stream's text differs from the committed transcript")
        want = expected_transcript(job_id, turns)
        if got == want:
            out.equal += 1
            continue
        if transcript_problems(got):
            out.invalid += 1
        have = Counter(json.dumps(m, sort_keys=True) for m in got)
        need = Counter(json.dumps(m, sort_keys=True) for m in want)
        out.lost += sum((need - have).values())
        out.extra += sum((have - need).values())
        if len(out.examples) < 5:
            out.examples.append(f"{job_id}: transcript differs ({len(got)} vs {len(want)} messages)")
    return out


def _stream_matches(app: App, job_id: str, messages: list[dict[str, Any]]) -> bool | None:
    """Whether a client reading the job's stream now assembles every turn's committed text (None: no text)."""
    texts = turn_texts(list(app.stream(job_id, follow=False)))
    if not texts:
        return None  # no live part (expired, or the agent does not stream): nothing a client could get wrong
    committed = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
    return all(texts[turn] == text for turn, text in enumerate(committed, start=1) if turn in texts)


# --- tool effects ------------------------------------------------------------------
@dataclass
class Kill:
    at: float  # time.time() of the SIGKILL
    name: str
    pids: list[int]  # the worker, its group, its children (horses)
    held: list[tuple[str, int]] = field(default_factory=list)  # (job id, version) the victim was advancing


@dataclass
class EffectsCheck:
    keys: int = 0  # idempotency keys expected (one per tool call of the expected transcripts)
    missing: int = 0  # expected keys never applied
    repeated: int = 0  # keys applied more than once
    repeats_after_kill: int = 0  # ... whose earlier application's process was killed before the repeat
    repeats_after_outage: int = 0  # ... whose earlier application was just before or during a Redis outage
    repeats_unexplained: int = 0
    extra_applications: int = 0  # applications beyond one per key
    unexplained: list[str] = field(default_factory=list)  # "<key>: (time, pid), ..." of each unexplained repeat

    @property
    def ok(self) -> bool:
        return not (self.missing or self.repeated)


OUTAGE_LEAD = 5.0
"""Seconds before a Redis outage in which an applied effect may still be repeated after it."""


def check_effects(client: redis.Redis, job_ids: list[str], turns: int, kills: Sequence[Kill] = (),
                  outages: Sequence[tuple[float, float]] = ()) -> EffectsCheck:
    """Count applications per idempotency key (``chaos:applied:<job>/<call id>``) and explain the repeats.

    A repeat is explained by a kill (the earlier application's process was
    killed before the repeat) or by an outage ``(start, end)`` of the Redis that
    holds both the effects and the journal: an effect applied just before it
    (:data:`OUTAGE_LEAD`) or as it began, whose journal write (or whose own
    reply) the outage lost, is applied again once Redis is back. That is the
    retry tool's contract (``idempotent=True``: at least once); the reconcile
    tool must never repeat, whatever explains it.
    """
    out = EffectsCheck()
    log: dict[str, list[tuple[float, int]]] = {}
    for raw in client.lrange(chaos_app.APPLY_LOG, 0, -1):
        key, pid, t = raw.decode().rsplit(" ", 2)
        log.setdefault(key, []).append((float(t), int(pid)))
    killed: dict[int, float] = {}
    for k in kills:
        for pid in k.pids:
            killed[pid] = k.at
    for job_id in job_ids:
        for k in range(1, turns):
            key = f"{job_id}/call_{k}"
            out.keys += 1
            n = int(client.get(chaos_app.APPLIED + key) or 0)
            if n == 0:
                out.missing += 1
            elif n > 1:
                out.repeated += 1
                out.extra_applications += n - 1
                apps = sorted(log.get(key, []))
                pairs = list(itertools.pairwise(apps))
                by_kill = all(prev[1] in killed and prev[0] <= killed[prev[1]] <= nxt[0] for prev, nxt in pairs)
                by_outage = all(any(start - OUTAGE_LEAD <= prev[0] <= end <= nxt[0] for start, end in outages)
                                for prev, nxt in pairs)
                if len(apps) != n or not (by_kill or by_outage):
                    out.repeats_unexplained += 1
                    kills_seen = [(p, killed[p]) for _, p in apps if p in killed]
                    out.unexplained.append(f"{key}: applied (time, pid) {apps}; killed (pid, time) {kills_seen}")
                elif by_kill:
                    out.repeats_after_kill += 1
                else:
                    out.repeats_after_outage += 1
    return out


# --- processes -------------------------------------------------------------------
class Procs:
    """A private redis-server and chaos-app workers; every process is ended by pid in :meth:`cleanup`."""

    def __init__(self, *, appendonly: bool = False, logdir: Path | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pr-chaos-"))
        self.logdir = logdir or self.dir
        self.appendonly = appendonly
        self.port = free_port()
        self.redis_proc: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}  # alive (as far as we know), by name
        self.all: list[subprocess.Popen[bytes]] = []
        self.env: dict[str, str] = {}
        self.generation = 0
        self.started_redis = False  # once true, the port is fixed: clients hold the URL

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it until it exits
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=die_with_parent)
        log.close()
        self.all.append(proc)
        return proc

    # --- redis-server ---
    def start_redis(self) -> str:
        binary = find_redis_server()
        if binary is None:
            raise RuntimeError("redis-server not found (apt-get install redis-server)")
        data = self.dir / "redis"
        data.mkdir(exist_ok=True)
        # free_port() only finds a port that was free a moment ago: another process (a parallel test run)
        # can take it first. Before anything holds our URL, a taken port is swapped for a new one; a
        # restart must keep its port (the workers hold the URL), so it is never swapped.
        for _ in range(5 if not self.started_redis else 1):
            url = self._start_redis_on_port(binary, data)
            if url is not None:
                self.started_redis = True
                return url
            self.port = free_port()
        raise RuntimeError(f"redis-server found every port it tried taken\n{self.logs()}")

    def _start_redis_on_port(self, binary: str, data: Path) -> str | None:
        """Start redis-server on ``self.port``: its URL, or None if another process holds the port."""
        log = self.logdir / "redis.log"
        seen = log.stat().st_size if log.exists() else 0
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(data), "--save", "",
                "--appendonly", "yes" if self.appendonly else "no", "--protected-mode", "yes"]
        proc = self.redis_proc = self._spawn("redis", args)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                if not self.started_redis and b"Address already in use" in log.read_bytes()[seen:]:
                    return None
                raise RuntimeError(f"redis-server exited with {proc.returncode}\n{self.logs()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self.url
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING within 15 s")

    def stop_redis(self) -> None:
        """SIGTERM (redis-server writes its AOF and exits), then wait."""
        proc, self.redis_proc = self.redis_proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    # --- workers ---
    def configure(self, base: str, **env: str) -> None:
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                    "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true",
                    "CHAOS_REDIS_URL": self.url, "FAKE_OPENAI_BASE": base, **env}
        self.env.pop("PIPELINES_APP", None)

    def start_worker(self, slot: int, *, simple: bool = True, sweep_interval: float | None = 1.0,
                     sweep_grace: float | None = 2.0, log_level: str = "WARNING", app: str = APP_PATH) -> str:
        """Start a worker of ``app``; ``None`` for the sweep settings leaves the worker's defaults."""
        self.generation += 1
        name = f"w{slot}-g{self.generation}"
        args = [sys.executable, "-m", "pipelines", "worker", "--app", app, "--name", name, "--log-level", log_level]
        if sweep_interval is not None:
            args += ["--sweep-interval", f"{sweep_interval:g}"]
        if sweep_grace is not None:
            args += ["--sweep-grace", f"{sweep_grace:g}"]
        if simple:
            args.append("--simple")
        self.workers[name] = self._spawn(name, args, self.env)
        return name

    def ready(self, client: redis.Redis, *, worked: bool = True) -> list[str]:
        """Names of live workers past start-up: they have finished a job of RQ's (app loaded, litellm warm);
        ``worked=False``: they have asked RQ for one (what waiting for workers to start before any work needs).

        Registered is not enough: RQ registers a worker before its warm-up
        (state "started"). Asking for a job ("idle", "busy": warm-up done) was
        not enough either: on two cores four workers restarting warm litellm at
        once (~4 s of CPU each, far more side by side), a worker that turned
        ready was a victim within half a second, before its first turn, and the
        scenario made almost no progress. It no longer tested "workers that live
        longer than one turn make progress". One finished job says the worker
        lived that long.
        """
        try:
            registered = {k.decode().removeprefix("rq:worker:") for k in client.smembers("rq:workers")}
            names = [n for n, p in self.workers.items() if p.poll() is None and n in registered]
            with client.pipeline(transaction=False) as pipe:
                for n in names:
                    pipe.hmget(f"rq:worker:{n}", "state", "successful_job_count")
                replies = pipe.execute()
        except redis.RedisError:
            return []
        return [n for n, (state, done) in zip(names, replies, strict=True)
                if state in (b"idle", b"busy") and (not worked or int(done or 0) >= 1)]

    def wait_ready(self, client: redis.Redis, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.ready(client, worked=False)) >= n:
                return
            dead = [name for name, p in self.workers.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"workers exited during start-up: {dead}\n{self.logs()}")
            time.sleep(0.05)
        raise RuntimeError(f"{n} workers not ready after {timeout:.0f}s\n{self.logs()}")

    def kill_worker(self, name: str) -> list[int]:
        """SIGKILL the worker's process group and its children (a horse has its own group); their pids."""
        proc = self.workers.pop(name)
        pids = [proc.pid, *children_of(proc.pid)]
        for pid in pids[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        return pids

    def dead_workers(self) -> list[str]:
        return [n for n, p in self.workers.items() if p.poll() is not None]

    def logs(self, tail: int = 1500) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-tail:]}"
                         for p in sorted(self.logdir.glob("*.log")))

    def cleanup(self) -> None:
        procs = [p for p in self.all if p is not self.redis_proc]
        extra = [c for p in procs if p.poll() is None for c in children_of(p.pid)]
        for pid in extra:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
        self.workers.clear()
        self.stop_redis()
        for p in self.all:
            if p.poll() is None:
                p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


# --- the killer ----------------------------------------------------------------------
@dataclass
class Recovery:
    job_id: str
    version: int
    killed_at: float
    requeued_after: float | None = None  # seconds from the kill until the advance was enqueued again
    advanced_after: float | None = None  # ... until the job's version moved on
    queue_depth: int | None = None  # RQ messages waiting when it was enqueued again
    # The worker that took the job over was killed too before it advanced: a second recovery, timed on its
    # own (this one's time would be both recoveries together).
    killed_again: bool = False


def _current_rq_job(client: redis.Redis, name: str) -> str | None:
    """The RQ job id a (possibly dead) worker was running, from its registration in Redis."""
    try:
        worker = Worker.find_by_key(f"rq:worker:{name}", connection=client, serializer=JSONSerializer)
        return worker.get_current_job_id() if worker is not None else None
    except Exception:  # noqa: BLE001 - a figure, not a check: unknown is fine
        return None


class Killer:
    """Every ``every`` seconds, SIGKILL a random ready worker and start a fresh one in its slot.

    A victim is chosen only among workers past start-up, and only while at
    least ``keep`` other workers are ready, so the run always makes progress.
    """

    def __init__(self, procs: Procs, app: App, client: redis.Redis, *, every: float = 0.5, keep: int = 1,
                 queue: str = "chaos", start: Callable[[int], str] | None = None, seed: int = 7) -> None:
        self.procs, self.app, self.client = procs, app, client
        self.every, self.keep, self.queue = every, keep, queue
        self.start = start or (lambda slot: procs.start_worker(slot))
        self.rng = random.Random(seed)
        self.kills: list[Kill] = []
        self.recoveries: list[Recovery] = []
        self.slots: dict[str, int] = {}
        self._next = time.monotonic() + every

    def adopt(self, name: str, slot: int) -> None:
        self.slots[name] = slot

    def tick(self, *, killing: bool = True) -> None:
        """Kill if it is time, restart dead workers, and follow the jobs the victims held."""
        now = time.monotonic()
        for name in self.procs.dead_workers():  # died on their own: restart, and say so in the logs
            slot = self.slots.pop(name, 0)
            self.procs.workers.pop(name)
            self.adopt(self.start(slot), slot)
        if killing and now >= self._next:
            self._next = now + self.every
            ready = self.procs.ready(self.client)
            if len(ready) > self.keep:
                self._kill(self.rng.choice(ready))
        self._follow()

    def _kill(self, name: str) -> None:
        pids = self.procs.kill_worker(name)
        # Once it is dead (kill_worker waits for it): before the SIGKILL lands (the /proc scan for its children
        # takes a while on a busy machine) the victim may still apply an effect, which a time taken before
        # the kill would leave "unexplained" when the turn runs again.
        at = time.time()
        kill = Kill(at=at, name=name, pids=pids)
        # The dead worker's RQ hash still names the RQ job it was running. RQ clears it only after the job's
        # bookkeeping, after the turn committed and sent the next one: the job was held only if the record is
        # still at the version that message advances.
        current = _current_rq_job(self.client, name)
        if current:
            with contextlib.suppress(Exception):
                job_id, version = decode_rq_job_id(current.split("-dup")[0])
                rec = self.app.storage.get_job(job_id)
                if rec is not None and rec.status is JobStatus.RUNNING and rec.version == version:
                    kill.held.append((job_id, rec.version))
                    for earlier in self.recoveries:
                        if (earlier.advanced_after is None and earlier.job_id == job_id
                                and earlier.version == rec.version):
                            earlier.killed_again = True
                    self.recoveries.append(Recovery(job_id, rec.version, at))
        self.kills.append(kill)
        slot = self.slots.pop(name, 0)
        self.adopt(self.start(slot), slot)

    def _follow(self) -> None:
        now = time.time()
        for r in self.recoveries:
            if r.advanced_after is not None:
                continue
            rec = self.app.storage.get_job(r.job_id)
            if rec is None or rec.version > r.version or rec.status is not JobStatus.RUNNING:
                r.advanced_after = now - r.killed_at
                if r.requeued_after is None:
                    r.requeued_after = r.advanced_after
                continue
            queued = f"rq:queue:{self.queue}"
            if r.requeued_after is None:
                pos = self.client.lpos(queued, rq_job_id(r.job_id, r.version))
                if pos is not None:
                    r.requeued_after = now - r.killed_at
                    r.queue_depth = int(self.client.llen(queued))

    def pending(self) -> int:
        return sum(1 for r in self.recoveries if r.advanced_after is None)


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(median, p95, max); NaNs when empty."""
    if not values:
        return (float("nan"),) * 3
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return statistics.median(ordered), p95, ordered[-1]


def start_jobs(app: App, job_ids: list[str], turns: int) -> None:
    """Start W1 jobs, alternating the retry and the reconcile agent."""
    agents = app.agents
    for i, job_id in enumerate(job_ids):
        agent = agents[chaos_app.RETRY_AGENT if i % 2 == 0 else chaos_app.RECONCILE_AGENT]
        agent.run(job_id=job_id, messages=[chaos_app.user_message(job_id, turns)], storage=app.storage,  # type: ignore[attr-defined]
                  scheduler=app.scheduler)


def agent_of(index: int) -> str:
    return chaos_app.RETRY_AGENT if index % 2 == 0 else chaos_app.RECONCILE_AGENT


def diagnose(app: App, client: redis.Redis, job_ids: list[str], queue: str = "chaos") -> list[str]:
    """Why each unfinished job is stuck: its record, lease, and where its RQ message is."""
    lines = []
    for job_id in unfinished(app, job_ids):
        rec = app.storage.get_job(job_id)
        if rec is None or rec.checkpoint is None:
            lines.append(f"{job_id}: {rec.status.value if rec else 'missing'}")
            continue
        rq_id = rq_job_id(job_id, rec.version)
        status = client.hget(f"rq:job:{rq_id}", "status")
        lines.append(
            f"{job_id}: v{rec.version} due {rec.checkpoint.due_at - time.time():+.0f}s "
            f"lease={app.storage.lease_owner(job_id)} rq {rq_id} status={status!r} "
            f"in queue={client.lpos(f'rq:queue:{queue}', rq_id)} "
            f"in intermediate={client.lpos(f'rq:queue:{queue}:intermediate', rq_id)}")
    return lines


def unfinished(app: App, job_ids: list[str]) -> list[str]:
    out = []
    for job_id in job_ids:
        rec = app.storage.get_job(job_id)
        if rec is None or rec.status in (JobStatus.RUNNING, JobStatus.IDLE):
            out.append(job_id)
    return out

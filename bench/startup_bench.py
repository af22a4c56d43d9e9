"""Figure 11: worker start -> first turn committed (issue 16), with litellm really used.

    python -m bench.startup_bench [--runs 3]

The job is in the queue before the worker exists (what a replacement worker
finds after a kill). The bench then starts ``python -m pipelines worker`` as
users run it, on ``bench.startup_app:app`` (an agent whose model goes through
litellm, streamed, to ``tests/fake_openai.py`` on 127.0.0.1 in this process,
and a pipeline that calls no model), and times from just before ``Popen``:
interpreter start, imports, app load and litellm's warm-up are all inside.

- 11a/11c: the worker is ready: it asks RQ for its first job (RQ's state for it
  turns "idle" or "busy"; it registers earlier, "started", while it warms up);
- 11b/11d: the agent job's first turn is committed (user, assistant with a tool
  call, tool result: readable from Redis), forking worker / ``--simple``;
- 11e: ``--simple``, the same app, a job whose first phase calls no model
  (like a recovered turn whose model answer was journaled before the kill);
- 11f: ``bench.apps:app`` (W1 on a scripted model: no litellm at all), forking
  worker: the floor of the start path.
- 11g/11h: 11b - 11a and 11d - 11c per worker: ready -> first turn committed.
  What a worker killed soon after it is ready gets done (make chaos's kill
  scenario): it must be about one turn, not litellm's import.
- 11i/11j: the floor under 11b/11d: a bare ``rq worker --burst`` process that
  first imports litellm, started with a trivial job (``builtins.len``) already
  queued, timed from ``Popen`` to the job finished; forking worker /
  ``SimpleWorker``. 11k/11l: 11b / 11i and 11d / 11j, paired run by run (issue
  33: <= 1.3x).

Each figure is the median of ``--runs`` fresh worker processes on a private
redis-server (one queue per run); nothing is asserted, a missed goal reads ``MISS``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.procs import Children

__all__ = ["main"]

GOAL_S = 2.0  # issue 16: worker start -> first turn committed <= 2 s on 2 cores
RATIO_GOAL = 1.3  # issue 33: that, over (import litellm + a bare RQ worker's start), <= 1.3x
POLL_S = 0.01
TIMEOUT_S = 60.0

# One run's set-up, given the run's queue name: (app, app path, job committed?, worker environment).
Setup = Callable[[str], tuple[Any, str, Callable[[], bool], dict[str, str]]]


def _wait(what: str, ready: Callable[[], bool], proc: Any, kids: Children) -> float:
    """Poll ``ready`` until true; the monotonic time it became true."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if ready():
            return time.monotonic()
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited ({proc.returncode}) before {what}\n{kids.logs()}")
        time.sleep(POLL_S)
    raise RuntimeError(f"no {what} within {TIMEOUT_S:.0f} s\n{kids.logs()}")


def _starts(kids: Children, name: str, runs: int, setup: Setup, simple: bool) -> tuple[list[float], list[float]]:
    """``runs`` fresh workers, each with a job already queued: (seconds to ready, seconds to first commit)."""
    from rq import Worker

    ready: list[float] = []
    committed: list[float] = []
    for i in range(runs):
        queue = f"startup-{name}-{i}"
        app, app_path, done, env = setup(queue)
        client = app.storage.client
        args = ["-m", "pipelines", "worker", "--app", app_path, "--name", queue, "--log-level", "WARNING"]
        started = time.monotonic()
        proc = kids.python(queue, [*args, *(["--simple"] if simple else [])], **env)
        try:
            key = f"{Worker.redis_worker_namespace_prefix}{queue}"
            asked = lambda: client.hget(key, "state") in (b"idle", b"busy")  # noqa: B023, E731
            ready.append(_wait("the first ask for a job", asked, proc, kids) - started)
            committed.append(_wait("the first commit", done, proc, kids) - started)
        finally:
            kids.stop(proc)
            # Nothing of this run left for the next worker's due-job sweep to hand it (a later turn of this job).
            client.flushdb()
            client.close()
    return ready, committed


_BARE = ("import sys, litellm; from rq.cli import main; sys.argv[0] = 'rq'; "
         "sys.exit(main())")  # litellm imported first, then RQ's own CLI: `rq worker --burst ...`


def _bare_starts(kids: Children, url: str, runs: int, simple: bool) -> list[float]:
    """``runs`` fresh bare RQ workers (litellm imported first), each with a trivial job queued: seconds to done."""
    import redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    done: list[float] = []
    for i in range(runs):
        queue = f"bare-{'simple' if simple else 'fork'}-{i}"
        client = redis.Redis.from_url(url)
        job = Queue(queue, connection=client, serializer=JSONSerializer).enqueue("builtins.len", [1, 2, 3])
        args = ["-c", _BARE, "worker", "--burst", "--url", url, "--serializer", "rq.serializers.JSONSerializer",
                "--logging_level", "WARNING", *(["--worker-class", "rq.worker.SimpleWorker"] if simple else []), queue]
        started = time.monotonic()
        # Offline, as our worker makes litellm (phases.litellm_model): no fetch of its remote cost map.
        proc = kids.python(queue, args, LITELLM_LOCAL_MODEL_COST_MAP="True")
        try:
            finished = lambda: client.hget(f"rq:job:{job.id}", "status") == b"finished"  # noqa: B023, E731
            done.append(_wait("the bare worker's job done", finished, proc, kids) - started)
        finally:
            kids.stop(proc)
            client.flushdb()
            client.close()
    return done


def _ratio(key: str, what: str, ours: list[float], bare: list[float], goal: float) -> str:
    ratios = [a / b for a, b in zip(ours, bare, strict=True)]
    med = statistics.median(ratios)
    return (f"{key:<4} {what:<66} median {med:5.2f} x ({min(ratios):.2f} .. {max(ratios):.2f})"
            f"   goal <= {goal:g} x: {'ok' if med <= goal else 'MISS'}")


def _agent_setup(url: str, fake_url: str) -> Setup:
    from bench.startup_app import AGENT, APP_PATH, make_app

    def setup(queue: str) -> tuple[Any, str, Callable[[], bool], dict[str, str]]:
        app = make_app(url, fake_url, queue)
        job_id = f"{queue}-job"
        app.run_agent(AGENT, job_id=job_id, messages=["turns=3: add one"])
        env = {"STARTUP_REDIS_URL": url, "STARTUP_QUEUE": queue, "FAKE_OPENAI_BASE": fake_url}
        return app, APP_PATH, lambda: len(app.messages(job_id)) >= 3, env

    return setup


def _plain_setup(url: str, fake_url: str) -> Setup:
    from bench.startup_app import APP_PATH, PLAIN, make_app

    def setup(queue: str) -> tuple[Any, str, Callable[[], bool], dict[str, str]]:
        app = make_app(url, fake_url, queue)
        job_id = f"{queue}-job"
        app.run_pipeline(PLAIN, job_id=job_id, initial_state={})

        def done() -> bool:
            view = app.get(job_id)
            return view is not None and view.record.phases_done >= 1

        env = {"STARTUP_REDIS_URL": url, "STARTUP_QUEUE": queue, "FAKE_OPENAI_BASE": fake_url}
        return app, APP_PATH, done, env

    return setup


def _scripted_setup(url: str) -> Setup:
    from bench import apps

    def setup(queue: str) -> tuple[Any, str, Callable[[], bool], dict[str, str]]:
        app = apps.build(url, queue=queue, turns=3)
        job_id = f"{queue}-job"
        app.run_agent(apps.PIPELINE, job_id=job_id, messages=["go"])
        env = {"BENCH_REDIS_URL": url, "BENCH_QUEUE": queue, "BENCH_TURNS": "3"}
        return app, apps.APP_PATH, lambda: len(app.messages(job_id)) >= 3, env

    return setup


def _line(key: str, what: str, values: list[float], goal: float | None = None) -> str:
    med = statistics.median(values)
    spread = f"({min(values):.2f} .. {max(values):.2f})"
    verdict = f"   goal <= {goal:g} s: {'ok' if med <= goal else 'MISS'}" if goal is not None else ""
    return f"{key:<4} {what:<66} median {med:5.2f} s {spread}{verdict}"


def main(argv: list[str] | None = None) -> int:
    """Print figure 11 (figures only; a missed goal reads MISS, nothing is asserted)."""
    from tests.fake_openai import running, w1_reply

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="fresh worker processes per row (median)")
    args = p.parse_args(argv)
    kids = Children()
    try:
        try:
            url = kids.redis()
        except RuntimeError as exc:
            print(f"figure 11: skipped ({exc})")
            return 0
        with running() as fake:
            fake.script(w1_reply)  # type: ignore[arg-type]
            agent, plain = _agent_setup(url, fake.url), _plain_setup(url, fake.url)
            fork_reg, fork_first = _starts(kids, "fork", args.runs, agent, simple=False)
            simple_reg, simple_first = _starts(kids, "simple", args.runs, agent, simple=True)
            _, plain_first = _starts(kids, "plain", args.runs, plain, simple=True)
        _, scripted_first = _starts(kids, "scripted", args.runs, _scripted_setup(url), simple=False)
        bare_fork = _bare_starts(kids, url, args.runs, simple=False)
        bare_simple = _bare_starts(kids, url, args.runs, simple=True)
    finally:
        kids.cleanup()
    print(f"figure 11: worker start -> first commit, the job queued before the worker starts, median of {args.runs} "
          "fresh worker processes")
    print(_line("11a", "litellm agent, forking worker: start -> ready (asks RQ for a job)", fork_reg))
    print(_line("11b", "litellm agent, forking worker: start -> first turn committed", fork_first, GOAL_S))
    print(_line("11c", "litellm agent, --simple: start -> ready (asks RQ for a job)", simple_reg))
    print(_line("11d", "litellm agent, --simple: start -> first turn committed", simple_first, GOAL_S))
    print(_line("11e", "same app, --simple, a first phase that calls no model -> committed", plain_first, GOAL_S))
    print(_line("11f", "scripted model (no litellm), forking worker -> first turn committed", scripted_first))
    print(_line("11g", "litellm agent, forking worker: ready -> first turn committed",
                [b - a for a, b in zip(fork_reg, fork_first, strict=True)]))
    print(_line("11h", "litellm agent, --simple: ready -> first turn committed",
                [b - a for a, b in zip(simple_reg, simple_first, strict=True)]))
    print(_line("11i", "bare `rq worker` importing litellm first, forking: start -> job done", bare_fork))
    print(_line("11j", "bare `rq worker` importing litellm first, SimpleWorker: start -> job done", bare_simple))
    print(_ratio("11k", "11b / 11i: forking worker, ours over its floor", fork_first, bare_fork, RATIO_GOAL))
    print(_ratio("11l", "11d / 11j: --simple, ours over its floor", simple_first, bare_simple, RATIO_GOAL))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

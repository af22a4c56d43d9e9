"""Figure 6: streaming on Redis with a worker process (``python bench/run.py --only 6``).

One RQ worker (``--simple``) runs ``tests.apps.stream_app:app``; the model is
the loopback fake server (tests/fake_openai.py) in this process, streaming a
one-turn text answer in chunks of 4 characters (one "token" each); a client in
this process follows the job's stream (``app.stream``, XREAD BLOCK).

- 6a/6b: delta latency, p50 and p99 over every chunk: the server sends a chunk
  -> the client receives the ``text_delta`` holding its last character. It
  includes the worker's batching (flush after 10 ms first, then every 15 ms or 1,000 characters: phases.streaming);
  6c/6d are the chunks that triggered a flush (no batching wait).
- 6e/6f: Redis commands and bytes (in + out) per 1,000 streamed tokens, for
  the whole job (worker and follower), from ``INFO`` before and after.
- 6g: a streamed turn's wall time (run -> ``job_finished`` at the client) over
  the same turn not streamed (``stream=False``), both with no model delay.
Nothing is asserted; a missed target reads ``MISS``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.procs import Children

__all__ = ["fig6"]

CHUNK = 4  # characters a streamed chunk ("token")
TOKENS = 500  # chunks of the latency run
PACE = 0.002  # seconds between chunks in the latency run (~500 tokens/s)
WALL_TOKENS = 1000


def _text(tokens: int) -> str:
    return ("word " * (tokens * CHUNK // 5 + 1))[: tokens * CHUNK]


def _follow(app: Any, job_id: str) -> list[tuple[float, Any]]:
    """Every part of the job's stream with the time it arrived, until the job ends."""
    return [(time.monotonic(), part) for part in app.stream(job_id, timeout=60)]


def _latencies(sent: list[tuple[float, str]], received: list[tuple[float, Any]]) -> tuple[list[float], list[float]]:
    """(every chunk's latency, the flush-triggering chunks' latencies), in ms."""
    deliveries: list[tuple[int, float]] = []  # (characters received so far, when)
    total = 0
    for at, part in received:
        if part.type == "text_delta":
            total += len(str(part.data.get("text", "")))
            deliveries.append((total, at))
    every: list[float] = []
    triggers: list[float] = []
    end, i = 0, 0
    for at, text in sent:
        end += len(text)
        while i < len(deliveries) and deliveries[i][0] < end:
            i += 1
        if i == len(deliveries):
            break
        every.append((deliveries[i][1] - at) * 1000)
        if deliveries[i][0] == end:
            triggers.append(every[-1])
    return every, triggers


def _redis_counters(client: Any) -> tuple[int, int]:
    stats = client.info("stats")
    calls = sum(int(v.get("calls", 0)) for v in client.info("commandstats").values())
    return calls, int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _one_job(app: Any, fake: Any, job_id: str, *, stream: bool) -> tuple[float, list[tuple[float, Any]]]:
    fake.sent_text.clear()
    started = time.monotonic()
    app.run_agent("streamer", job_id=job_id, messages=["say it"], stream=stream)
    parts = _follow(app, job_id)
    return time.monotonic() - started, parts


def fig6(rep: Any, runs: int, url: str, kids: Children) -> None:
    """Figure 6 rows into ``rep`` (a bench.run.Report), on the redis-server at ``url``."""
    from tests.apps.stream_app import APP_PATH, make_app
    from tests.fake_openai import running, streamed, text_reply

    with running() as fake:
        pace = {"delay": 0.0, "tokens": TOKENS}
        fake.script(lambda body: streamed(text_reply(_text(pace["tokens"])), chunk_chars=CHUNK,  # type: ignore[arg-type]
                                          chunk_delay=pace["delay"]))
        worker = kids.python("stream-worker", ["-m", "pipelines", "worker", "--app", APP_PATH, "--simple",
                                               "--name", "stream-bench", "--log-level", "WARNING"],
                             REDIS_URL=url, FAKE_OPENAI_BASE=fake.url, PIPELINES_QUEUE="bench-stream")
        app = make_app(url, fake.url, queue="bench-stream")
        client = app.storage.client  # type: ignore[attr-defined]
        try:
            _one_job(app, fake, "stream-warmup", stream=True)  # litellm's import and first stream in the worker
            _measure(rep, runs, app, fake, client, pace)
        finally:
            kids.stop(worker)
            client.close()


def _measure(rep: Any, runs: int, app: Any, fake: Any, client: Any, pace: dict[str, Any]) -> None:
    every: list[list[float]] = []
    flushed: list[list[float]] = []
    cmds: list[float] = []
    nbytes: list[float] = []
    ratio_num: list[float] = []
    ratio_den: list[float] = []
    for run in range(runs):
        pace.update(delay=PACE, tokens=TOKENS)
        _, parts = _one_job(app, fake, f"stream-lat-{run}", stream=True)
        all_ms, trigger_ms = _latencies(list(fake.sent_text), parts)
        every.append(all_ms)
        flushed.append(trigger_ms)
        pace.update(delay=0.0, tokens=WALL_TOKENS)
        before = _redis_counters(client)
        wall_streamed, _ = _one_job(app, fake, f"stream-wall-{run}", stream=True)
        after = _redis_counters(client)
        wall_plain, _ = _one_job(app, fake, f"plain-wall-{run}", stream=False)
        cmds.append((after[0] - before[0]) * 1000 / WALL_TOKENS)
        nbytes.append((after[1] - before[1]) * 1000 / WALL_TOKENS)
        ratio_num.append(wall_streamed)
        ratio_den.append(wall_plain)
    rep.add("6a", "delta latency p50 (chunk sent -> client)", [_pct(v, 0.5) for v in every], "ms", "<= 5",
            lambda m: m <= 5, "{:.1f}")
    rep.add("6b", "delta latency p99", [_pct(v, 0.99) for v in every], "ms", "<= 20", lambda m: m <= 20, "{:.1f}")
    rep.add("6c", "latency p50, chunks that triggered a flush", [_pct(v, 0.5) for v in flushed], "ms", "", None,
            "{:.1f}")
    rep.add("6d", "latency p99, chunks that triggered a flush", [_pct(v, 0.99) for v in flushed], "ms", "", None,
            "{:.1f}")
    rep.add("6e", "Redis commands per 1,000 streamed tokens", cmds, "cmds")
    rep.add("6f", "Redis bytes per 1,000 streamed tokens", nbytes, "B")
    rep.ratio("6g", "streamed turn / plain turn, wall time", ratio_num, ratio_den, "<= 1.2", lambda m: m <= 1.2)
    rep.notes.append(f"figure 6: {TOKENS} chunks of {CHUNK} chars at {PACE * 1000:g} ms for latency "
                     f"({statistics.fmean(len(v) for v in every):.0f} measured a run); "
                     f"{WALL_TOKENS} chunks, no model delay, for 6e-6g (a job streamed "
                     f"{statistics.median(ratio_num) * 1000:.0f} ms, plain {statistics.median(ratio_den) * 1000:.0f} "
                     "ms; the openai SDK's parsing of each chunk is most of the difference: figure 16)")

"""Figure 17: delta latency of N concurrent streamed model calls in one process (issue 31, "100 active streams").

    python -m bench.stream_active                        # 25, 50 and 100 streams, 3 runs (~1 min)
    python -m bench.stream_active --streams 10 50 --runs 2

The floor under the issue's target "100 concurrent active streams on one worker, delta latency p50 <= 5 ms,
p99 <= 20 ms": before any storage, live stream or SSE, can one process's model client keep up? A server in a
child process (its CPU is not counted) streams every request 50 chunks 20 ms apart (a model at 50 tokens/s),
each chunk's text being the ``time.monotonic()`` it was sent (one clock for both processes). This process starts
N threads spread over one call's length (1 s), each making 3 streamed calls one after another (so ~N stream at
any time), and notes for every piece of text the time from its sending to its arrival at the caller:

- the ``openai`` SDK: ``chat.completions.create(stream=True)``, iterated;
- ours: ``LiteLLMModel.complete`` (litellm underneath) with an ``on_delta`` that notes the times
  (the agent turn's model call, without the ``DeltaSink`` and storage behind it).

16a-16d: p50 / p99 over every piece of every call (median over ``--runs`` runs, min-max); 16e/16f: this
process's CPU over the run's wall time, percent of one core (with the GIL, Python code in one process tops out
near 100 %). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["main"]

CHUNKS = 50
GAP = 0.02
CALLS = 3  # calls a thread makes, one after another


def serve() -> int:
    """The child process: every POST streams CHUNKS pieces of text GAP apart, each its own send time."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _event(self, payload: Any) -> None:
            data = b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def handle(self) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client gone: nothing to serve
                super().handle()

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            base = {"id": "chatcmpl-active", "object": "chat.completion.chunk", "created": 1, "model": "m"}
            try:
                self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                  "finish_reason": None}]})
                for _ in range(CHUNKS):
                    time.sleep(GAP)
                    self._event({**base, "choices": [{"index": 0, "delta": {"content": f"{time.monotonic():.6f}|"},
                                                      "finish_reason": None}]})
                self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                self._event({**base, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": CHUNKS,
                                                              "total_tokens": CHUNKS + 5}})
                self._event(b"[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"READY http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    server.serve_forever()
    return 0


def _recorder(latencies: list[float]) -> Callable[[str], None]:
    def on_delta(text: str) -> None:
        now = time.monotonic()
        for piece in text.split("|"):
            if piece:
                latencies.append((now - float(piece)) * 1000)
    return on_delta


def _paths(url: str) -> dict[str, Callable[[list[float]], None]]:
    import openai

    from phases.litellm_model import LiteLLMModel
    from phases.model import ModelRequest

    model = LiteLLMModel("openai/m", params={"api_base": url, "api_key": "sk-bench"})
    sdk = openai.OpenAI(base_url=url, api_key="sk-bench", max_retries=0)
    messages = [{"role": "user", "content": "go"}]

    def sdk_call(latencies: list[float]) -> None:
        on_delta = _recorder(latencies)
        for chunk in sdk.chat.completions.create(model="m", messages=messages, stream=True):  # type: ignore[arg-type]
            if chunk.choices and chunk.choices[0].delta.content:
                on_delta(chunk.choices[0].delta.content)

    def ours(latencies: list[float]) -> None:
        model.complete(ModelRequest(messages=messages, on_delta=_recorder(latencies)))

    return {"sdk": sdk_call, "ours": ours}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _run(call: Callable[[list[float]], None], streams: int, calls: int = CALLS) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, CPU % of a core) of ``streams`` threads making ``calls`` calls each, one after another.

    The threads start spread over one call's length, so about ``streams`` calls stream at any time (in
    steady state: starts and ends are spread too, as on a worker serving many conversations).
    """
    latencies: list[float] = []
    errors: list[BaseException] = []
    spread = GAP * CHUNKS / streams

    def one(i: int) -> None:
        time.sleep(i * spread)
        try:
            for _ in range(calls):
                call(latencies)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(streams)]
    cpu, wall = time.process_time(), time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    if errors or len(latencies) != streams * calls * CHUNKS:
        raise RuntimeError(f"{len(errors)} call(s) failed ({errors[:1]!r}); {len(latencies)} pieces arrived")
    return _pct(latencies, 0.5), _pct(latencies, 0.99), cpu / wall * 100


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve()
    p = argparse.ArgumentParser(prog="python -m bench.stream_active", description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, nargs="+", default=[25, 50, 100], help="concurrent calls per row")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import warnings

    warnings.simplefilter("ignore")  # litellm's first stream builds models that warn (phases.litellm_model)
    server = subprocess.Popen([sys.executable, "-m", "bench.stream_active", "serve"], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    results: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"the stream server did not start: {line!r}")
        paths = _paths(line.split()[1])
        for call in paths.values():
            _run(call, 1, 1)  # warm-up: litellm's first stream, connection pools
        for _ in range(args.runs):
            for streams in args.streams:
                for name, call in paths.items():
                    results.setdefault((streams, name), []).append(_run(call, streams))
    finally:
        server.terminate()
        server.wait(10)
    print(f"figure 17: N streamed model calls at once in one process, {CHUNKS} chunks {GAP * 1000:g} ms apart each; "
          f"median of {args.runs} runs (min-max); targets (issue 31, end to end): p50 <= 5 ms, p99 <= 20 ms")
    labels = {"sdk": "openai SDK", "ours": "ours (LiteLLMModel)"}
    for streams in args.streams:
        print(f" {streams} concurrent streams:")
        rows = iter("abcdef")
        for i, what in enumerate(("delta latency p50 (sent -> caller)", "delta latency p99", "CPU, % of a core")):
            for name in paths:
                values = [r[i] for r in results[(streams, name)]]
                unit = "%" if i == 2 else "ms"
                print(f"  16{next(rows)}  {labels[name] + ': ' + what:<58} {statistics.median(values):8.1f} {unit} "
                      f"({min(values):.1f}-{max(values):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Figure 16: client CPU per streamed chunk of a model call (issue 31, item 5).

    python -m bench.model_chunk_bench                   # 2,000 and 50 chunks, 7 paired rounds (~1.5 min)
    python -m bench.model_chunk_bench --chunks 500 --short 20 --runs 3

The model is the loopback fake server (tests/fake_openai.py) in a child
process (its CPU is not counted), streaming one answer of ``--chunks`` text
chunks of 4 characters, then one tool call whose arguments come in 4-character
pieces (~20 chunks), the finish reason and the usage chunk. This process reads
it four ways, in turn, every round (paired: the machine's load hits each alike):

- 15a raw: httpx, the SSE lines split and each ``data:`` parsed with ``json.loads``;
- 15b the ``openai`` SDK: ``client.chat.completions.create(stream=True)``, iterated;
- 15c litellm: ``litellm.completion(stream=True)``, iterated, then ``stream_chunk_builder``
  (what a caller needs to have the message, tool calls and usage);
- 15d ours: ``LiteLLMModel.complete`` with an ``on_delta`` :class:`~phases.streaming.DeltaSink`
  (publishing to a list): the agent turn's model call, answer built, usage and cost counted.

Each figure is ``time.process_time()`` of this process from the call's start
until the process is idle again (every thread counts: litellm logs chunks on
its thread pool after the call returned), divided by the text chunks; the
median over ``--runs`` rounds (spread min-max), after one warm-up round.
15e-15g are medians of the per-round ratios. Targets (issue 31): ours <= 2x
the SDK per chunk. 15h-15j: the same for a short answer (``--short`` chunks,
a typical turn), where the per-call work (litellm's request set-up, its
end-of-stream logging and answer building) weighs more. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["main"]

CHUNK = 4


def _text(chunks: int) -> str:
    return ("word " * (chunks * CHUNK // 5 + 1))[: chunks * CHUNK]


def serve(argv: list[str]) -> int:
    """The child process: the fake server answering every request with the streamed answer."""
    import signal
    import threading

    from tests.fake_openai import FakeOpenAI, call, streamed, tool_reply

    def reply(body: dict[str, Any]) -> Any:  # the user message says how many chunks
        chunks = int(body["messages"][0]["content"])
        return streamed(tool_reply(call("add", {"a": 1, "b": 2, "note": "x" * 40}, id="call_1"),
                                   content=_text(chunks)), chunk_chars=CHUNK)

    server = FakeOpenAI()
    server.script(reply)
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"READY {server.url}", flush=True)
    done.wait()
    server.stop()
    return 0


class _Ctx:
    """The phase context a DeltaSink publishes through: parts kept in a list."""

    attempt_id = "a1"
    job_id = "bench"

    def __init__(self) -> None:
        self.published: list[Any] = []

    def part(self, type_: str, *, turn: int | None = None, **data: Any) -> Any:
        return (type_, data)

    def publish_parts(self, parts: list[Any]) -> None:
        self.published.extend(parts)


TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": {"type": "object", "properties": {}}}}]


def _paths(url: str) -> dict[str, Callable[[list[dict[str, Any]]], int]]:
    """Each way to read the stream: a function of the messages that reads it whole, returns the characters read."""
    import httpx
    import openai

    from phases.litellm_model import LiteLLMModel, _litellm
    from phases.model import ModelRequest
    from phases.streaming import DeltaSink

    http = httpx.Client(timeout=30)
    sdk = openai.OpenAI(base_url=url, api_key="sk-bench", max_retries=0)
    litellm = _litellm()
    model = LiteLLMModel("openai/fake-model", params={"api_base": url, "api_key": "sk-bench"})

    def raw(messages: list[dict[str, Any]]) -> int:
        n = 0
        body = {"model": "fake-model", "messages": messages, "tools": TOOLS, "stream": True,
                "stream_options": {"include_usage": True}}
        with http.stream("POST", f"{url}/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    for choice in chunk.get("choices") or ():
                        n += len((choice.get("delta") or {}).get("content") or "")
        return n

    def sdk_path(messages: list[dict[str, Any]]) -> int:
        n = 0
        for chunk in sdk.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                                                 stream=True, stream_options={"include_usage": True}):
            if chunk.choices:
                n += len(chunk.choices[0].delta.content or "")
        return n

    def litellm_path(messages: list[dict[str, Any]]) -> int:
        chunks = list(litellm.completion(model="openai/fake-model", messages=messages, tools=TOOLS, api_base=url,
                                         api_key="sk-bench", stream=True, stream_options={"include_usage": True},
                                         max_retries=0, num_retries=0))
        built = litellm.stream_chunk_builder(chunks, messages=messages)
        return len(built.choices[0].message.content or "")

    def ours(messages: list[dict[str, Any]]) -> int:
        sink = DeltaSink(_Ctx(), 1)  # type: ignore[arg-type]
        response = model.complete(ModelRequest(messages=messages, tools=TOOLS, on_delta=sink))
        sink.finish(response.message.get("content"))
        return len(sink.sent)

    return {"raw": raw, "sdk": sdk_path, "litellm": litellm_path, "ours": ours}


def _settle(timeout: float = 10.0) -> None:
    """Wait until this process is idle (its threads' work for the last call done): < 2 ms CPU over 50 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = time.process_time()
        time.sleep(0.05)
        if time.process_time() - before < 0.002:
            return


def measure(url: str, lengths: list[int], runs: int,
            only: list[str] | None = None) -> dict[int, dict[str, list[float]]]:
    """Per-chunk CPU (µs) of each path for each answer length, ``runs`` paired rounds after a warm-up round."""
    import warnings

    paths = _paths(url)
    if only:
        paths = {k: v for k, v in paths.items() if k in only}
    out: dict[int, dict[str, list[float]]] = {n: {name: [] for name in paths} for n in lengths}
    for round_ in range(runs + 1):
        for chunks in lengths:
            messages = [{"role": "user", "content": str(chunks)}]
            for name, read in paths.items():
                gc.collect()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    started = time.process_time()
                    got = read(messages)
                    _settle()  # litellm logs chunks on its thread pool: that work is the call's too
                    spent = time.process_time() - started
                if got != len(_text(chunks)):
                    raise RuntimeError(f"{name}: read {got} characters, expected {len(_text(chunks))}")
                if round_:
                    out[chunks][name].append(spent / chunks * 1e6)
    return out


LABELS = {"raw": "raw SSE (httpx + json.loads)", "sdk": "openai SDK",
          "litellm": "litellm.completion(stream=True) + stream_chunk_builder",
          "ours": "ours: LiteLLMModel + DeltaSink"}


def _ratio(results: dict[str, list[float]], a: str, b: str) -> float | None:
    if a not in results or b not in results:
        return None
    return statistics.median(x / y for x, y in zip(results[a], results[b], strict=True))


def report(results: dict[int, dict[str, list[float]]], runs: int) -> list[str]:
    """The rows: per path and per answer length (the long one first: 15a-15g, then the short one: 15h-15n)."""
    lines: list[str] = []
    letters = iter("abcdefghijklmn")
    for i, (chunks, by_path) in enumerate(results.items()):
        lines.append(f" {chunks:,} text chunks of {CHUNK} chars + ~20 of a tool call; µs of CPU per text chunk, "
                     f"median of {runs} paired rounds (min-max):")
        rows = [f"15{next(letters)}" for _ in range(7)]
        for row, name in zip(rows, LABELS, strict=False):
            if name in by_path:
                values = by_path[name]
                per_call = statistics.median(values) * chunks / 1000
                lines.append(f"  {row}  {LABELS[name]:<58} {statistics.median(values):8.1f} µs "
                             f"({min(values):.1f}-{max(values):.1f}), {per_call:.1f} ms a call")
        target_ours = 2.0 if i == 0 else None  # the target is for the long answer
        for row, (a, b, target) in zip(rows[4:], (("ours", "sdk", target_ours), ("litellm", "sdk", None),
                                                  ("ours", "litellm", None)), strict=True):
            ratio = _ratio(by_path, a, b)
            if ratio is not None:
                verdict = "" if target is None else f"   target <= {target:g}  {'ok' if ratio <= target else 'MISS'}"
                lines.append(f"  {row}  {a + ' / ' + b:<58} {ratio:8.2f} x{verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench.model_chunk_bench", description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=2000, help="text chunks of the long answer (default 2,000)")
    p.add_argument("--short", type=int, default=50, help="text chunks of the short answer (default 50; 0: none)")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--only", nargs="*", help="paths to run (raw sdk litellm ours)")
    args = p.parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import subprocess

    server = subprocess.Popen([sys.executable, "-m", "bench.model_chunk_bench", "serve"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"the fake server did not start: {line!r}")
        lengths = [args.chunks] + ([args.short] if args.short else [])
        results = measure(line.split()[1], lengths, args.runs, args.only)
    finally:
        server.terminate()
        server.wait(10)
    print("figure 16: client CPU per streamed chunk of a model call (fake server in another process)")
    print("\n".join(report(results, args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real call's path through litellm, warmed offline: what a forking worker's parent does for its horses.

:func:`phases.litellm_model.warm` makes offline calls (``mock_response``): they import litellm's lazy
modules, but not those of a real call's HTTP path. A forking worker's parent (``pipelines worker``)
never makes a real call, so each work-horse, one a turn, imported them at its first model call:
``httpcore`` and ``h2`` with the transport litellm builds, and litellm's service logger (its
Prometheus types) in the response's logging. That was ~90 ms a turn on the forking worker against a
``--simple`` one's ~10 ms (bench/README.md, issue 33's eleventh sitting). :func:`warm_http` makes the
real call's path run once, offline: an OpenAI client whose ``httpx`` transport answers in process
(no socket, no DNS), a streamed call and a plain one, and one default ``httpx`` client built and closed.
No connection is made and none is kept, so a horse never shares a socket with the parent.
"""

from __future__ import annotations

import json
import logging
import warnings
from typing import Any

__all__ = ["warm_http"]

logger = logging.getLogger(__name__)

_MESSAGES = [{"role": "user", "content": "hi"}]


def _chunk(delta: dict[str, Any], finish_reason: str | None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    return "data: " + json.dumps({"id": "warm", "object": "chat.completion.chunk", "created": 0, "model": "warmup",
                                  "choices": [choice]}) + "\n\n"


_STREAM = (_chunk({"role": "assistant", "content": "ok"}, None) + _chunk({}, "stop") + "data: [DONE]\n\n").encode()
_ANSWER = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
_PLAIN = json.dumps({"id": "warm", "object": "chat.completion", "created": 0, "model": "warmup", "choices": [_ANSWER],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


def warm_http(litellm: Any) -> None:
    """Run a streamed and a plain ``litellm.completion`` through an in-process transport, and build one client.

    An optimisation only: any failure is logged at debug level and ignored.
    """
    try:
        import httpx
        import openai

        httpx.Client().close()  # the default transport: what litellm builds for a real call imports httpcore

        def answer(request: Any) -> Any:
            streamed = json.loads(request.content or b"{}").get("stream")
            return httpx.Response(200, content=_STREAM if streamed else _PLAIN,
                                  headers={"content-type": "text/event-stream" if streamed else "application/json"})

        # An httpx client, as litellm itself hands the OpenAI SDK (whose annotations name its own fork, httpx2).
        http: Any = httpx.Client(transport=httpx.MockTransport(answer))
        client = openai.OpenAI(api_key="warmup", base_url="http://warmup.invalid/v1", http_client=http, max_retries=0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _ in litellm.completion(model="openai/warmup", messages=_MESSAGES, client=client, stream=True,
                                            stream_options={"include_usage": True}, max_retries=0, num_retries=0):
                    pass
                litellm.completion(model="openai/warmup", messages=_MESSAGES, client=client, max_retries=0,
                                   num_retries=0)
        finally:
            client.close()
    except Exception:  # warming is an optimisation: never fail a worker's start over it
        logger.debug("litellm HTTP path warm-up failed", exc_info=True)

"""``LiteLLMModel``: the model seam over litellm, with our own retry policy and no secret leaks.

litellm is imported on first use, never at module import (it costs ~3 s and
~200 MiB). ``pipelines worker`` runs :func:`warm` to its end before it asks
for its first job (a job taken meanwhile would hold its lease through the
import), so forked work-horses inherit the loaded module.
:func:`warm_in_background` is for a process that must not wait for it (a fork
waits for the warm-up to end).

Retries are ours, not litellm's or the OpenAI SDK's (both are turned off: the
SDK alone turned one 429 into 14 s of hidden retries). Transient failures
(rate limit, timeout, connection, 5xx, 409/529) are retried with exponential
backoff and full jitter, or after the server's Retry-After, within
``max_retry_seconds``. When the next wait would overrun that budget, the call
raises :class:`~pipelines.engine.errors.TransientModelError` at once with
``retry_after`` set: the agent turn then schedules the same turn for later
instead of holding a worker asleep. Everything else (bad request, auth,
permission, not found, context window) raises
:class:`~pipelines.engine.errors.PermanentModelError`, and so does an answer
litellm cannot read (its "Invalid response object", filed as a 500): the
same request gets the same shape again. An empty answer (no choices)
raises ``TransientModelError`` without retrying here. Both were answered:
the error's ``usage`` counts the paid call.

Streaming: when the request has an ``on_delta`` (the agent turn streams by
default), the call is made with ``stream=True`` and
``stream_options={"include_usage": True}``; each text delta is handed to
``on_delta`` as it arrives and the chunks are rebuilt with
``litellm.stream_chunk_builder`` into the same :class:`~phases.model.ModelResponse`
(text, tool calls whose arguments came split, usage, finish reason, provider
fields); :mod:`phases.litellm_stream` says how an OpenAI-compatible stream
is read at the SDK's level, with litellm's wrapper on merged chunks. A
stream that breaks after it started is retried as the same call up to
``request.stream_retries`` times (``on_restart()`` first), then raises
``TransientModelError``; a dropped attempt's usage is added to the answer's.
``params={"stream": False}`` keeps the plain call.

``params`` may hold api keys and auth headers: error messages are redacted
("***"), ``repr`` shows only non-secret parameter names, and
:meth:`LiteLLMModel.safe_params` gives what is fine to log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import warnings
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import tenacity

# The error translation and the streamed call live in their own modules; the names tests and benches
# import from here stay importable from here.
from phases.litellm_answer import plain_message, raw_response, usage_of
from phases.litellm_errors import _is_loopback_url, _RetryableError, _translate, _without_secrets
from phases.litellm_errors import _redact as _redact
from phases.litellm_errors import _retry_after as _retry_after
from phases.litellm_stream import _complete_streamed
from phases.litellm_warm import warm_http
from phases.model import ModelRequest, ModelResponse, ReadOnlyMessages, is_secret_param
from pipelines.engine.errors import InvalidInputError, PermanentModelError, TransientModelError
from pipelines.engine.models import Usage

logger = logging.getLogger("pipelines")

__all__ = ["BLOCK_REMOTE_MODELS_ENV", "LiteLLMModel", "warm", "warm_in_background"]

BLOCK_REMOTE_MODELS_ENV = "PIPELINES_BLOCK_REMOTE_MODELS"
"""When this environment variable is "1" (the test suite sets it), only loopback or mocked calls run."""

_litellm_module: Any = None


def _litellm() -> Any:
    """The configured litellm module, imported on first use."""
    global _litellm_module
    # A model call while the worker's warm-up runs waits for all of it: racing its offline calls for
    # the GIL would slow both, and the call's socket reads would each wait out a switch interval.
    _wait_for_warm_up()
    if _litellm_module is None:
        # Without these, import fetches the model price list (5 s timeout) and
        # the first Anthropic call fetches a beta-header list over the network.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
        import litellm

        litellm.suppress_debug_info = True
        # Token counting would otherwise download tokenizers from Hugging Face.
        litellm.disable_hf_tokenizer_download = True
        _litellm_module = litellm
    return _litellm_module


def warm() -> None:
    """Import and configure litellm now (~3-5 s), e.g. in an RQ worker's parent before it forks.

    Also makes one offline call (``mock_response``, no network): litellm
    imports more modules lazily at its first completion, and a forked
    work-horse would otherwise pay for them on every turn; then a real call's
    HTTP path, offline too (:mod:`phases.litellm_warm`: ~90 ms a horse).
    """
    llm = _litellm()
    tool = {"type": "function", "function": {"name": "noop", "description": "", "parameters": {"type": "object"}}}
    try:
        response = llm.completion(model="openai/warmup", messages=[{"role": "user", "content": "hi"}],
                                  tools=[tool], mock_response="ok", max_retries=0, num_retries=0)
        with contextlib.suppress(Exception):  # pricing an unknown model raises; only the imports matter
            llm.completion_cost(completion_response=response)
    except Exception:  # warming is an optimisation: never fail a worker's start over it
        logger.debug("litellm warm-up call failed", exc_info=True)
    _warm_stream()
    warm_http(llm)


_warming: threading.Thread | None = None
_warming_lock = threading.Lock()


def warm_in_background() -> threading.Thread:
    """Run :func:`warm` on a daemon thread, once per process; returns that thread.

    Until it has finished, every ``os.fork()`` of this process (a work-horse,
    RQ's scheduler process) first waits for it: a child forked while another
    thread is inside ``import litellm`` inherits a half-imported litellm and
    module locks owned by a thread that does not exist in the child, and
    hangs at its first import of one of them. A model call on another thread
    meanwhile waits for the whole warm-up, so litellm is imported once.
    """
    global _warming
    with _warming_lock:
        if _warming is None:
            os.register_at_fork(before=_before_fork)
            _warming = threading.Thread(target=_warm_quietly, name="pipelines-warm-litellm", daemon=True)
            _warming.start()
        return _warming


def _warm_quietly() -> None:
    try:
        warm()
    except Exception:  # warm() already swallows call failures; an import failure shows at the first real call
        logger.debug("litellm warm-up failed", exc_info=True)


def _wait_for_warm_up() -> None:
    thread = _warming
    # Never from the warm-up thread itself (it would wait for itself). join() releases the GIL.
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join()


def _before_fork() -> None:
    # CPython takes the import lock only after the before-fork hooks, so the import can finish meanwhile.
    _wait_for_warm_up()


_stream_warmed = False


def _warm_stream() -> None:
    """One offline streamed call, once per process: builds litellm's lazy stream models up front.

    Their first build emits pydantic warnings (ReadOnly TypedDict fields); left
    to the first real stream, a warnings-as-errors setting (the test suite)
    turned that into a broken stream.
    """
    global _stream_warmed
    if _stream_warmed:
        return
    _stream_warmed = True
    messages = [{"role": "user", "content": "hi"}]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stream = _litellm().completion(model="openai/warmup", messages=messages, mock_response="ok", stream=True,
                                           stream_options={"include_usage": True}, max_retries=0, num_retries=0)
            _litellm().stream_chunk_builder(list(stream), messages=messages)
    except Exception:  # an optimisation, as in warm()
        logger.debug("litellm stream warm-up failed", exc_info=True)


# Parameters each call sets itself (see LiteLLMModel._kwargs), with what to use instead: passed in params, they
# were overridden without a word, or (stream=True) failed every job at its first model call.
_OWNED_PARAMS = {
    "model": "the model string is LiteLLMModel's first argument (Agent(model=...))",
    "messages": "each call sends the job's transcript",
    "tools": "each call offers the agent's tools (Agent(tools=...))",
    "max_retries": "retries are the library's own: LiteLLMModel(max_retry_seconds=...) within a call, "
                   "Agent(max_retries=...) across turns",
    "num_retries": "retries are the library's own: LiteLLMModel(max_retry_seconds=...) within a call, "
                   "Agent(max_retries=...) across turns",
}


def _owned_param(params: Mapping[str, Any]) -> str | None:
    """What is wrong with ``params`` if one of them is a parameter each call sets itself, else None."""
    stream = params.get("stream")
    if stream is not None and stream is not False:
        return (f"'stream' is set by each call: an agent streams by default; pass Agent(stream=False) "
                f"(or 'stream': False, the one value taken here) for a plain call, got {stream!r}")
    for name, why in _OWNED_PARAMS.items():
        if name in params:
            return f"{name!r} may not be passed: {why}"
    return None


class LiteLLMModel(ReadOnlyMessages):  # it sends litellm a copy of its own (see _kwargs)
    """A :class:`~phases.model.Model` that calls ``litellm.completion``.

    ``model`` is a litellm model string (``"openai/gpt-4o-mini"``,
    ``"anthropic/claude-..."``); ``params`` are passed to every call
    (``api_base``, ``api_key``, ``temperature``, ``timeout`` ...), and each
    request's ``params`` are merged over them. Retries of transient failures
    stop once ``max_retry_seconds`` would be exceeded; the backoff starts near
    ``backoff_initial`` seconds and is capped at ``backoff_max``.
    """

    def __init__(
        self,
        model: str,
        *,
        params: Mapping[str, Any] | None = None,
        max_retry_seconds: float = 60.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
    ) -> None:
        if not model or not isinstance(model, str):
            raise ValueError("model must be a non-empty litellm model string, e.g. 'openai/gpt-4o-mini'")
        self.model = model
        self._params: dict[str, Any] = dict(params or {})
        problem = _owned_param(self._params)
        if problem is not None:  # refused here, when the agent is built, not at every job's first call
            raise InvalidInputError(f"LiteLLMModel({model!r}) params: {problem}")
        self.max_retry_seconds = max_retry_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._backoff = tenacity.wait_random_exponential(multiplier=backoff_initial, max=backoff_max)
        # One retry controller for every call: its per-call state is thread-local, and one made per call
        # is a reference cycle (its state holds its own bound methods) left for the garbage collector.
        self._retry = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_RetryableError),
            wait=self._wait,
            stop=self._stop,
            retry_error_callback=self._give_up,
            before_sleep=self._log_retry,
            reraise=True,
        )

    def __repr__(self) -> str:
        names = sorted(name for name in self._params if not is_secret_param(name))
        return f"LiteLLMModel(model={self.model!r}, params={names!r})"

    def safe_params(self) -> dict[str, Any]:
        """The parameters without anything secret-looking: fine to log."""
        safe: dict[str, Any] = _without_secrets(self._params)
        return safe

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Call the model once (retrying transient failures within the budget) and return its answer.

        Raises :class:`TransientModelError` (try again later; ``retry_after``
        says when, if known) or :class:`PermanentModelError`.
        """
        params = {**self._params, **request.params}
        self._check_allowed(params)
        kwargs = self._kwargs(request, params)
        # litellm's one import (and the worker's warm-up, if it runs) before the retry budget's clock starts:
        # seconds of it inside the first attempt left a transient error no time to be retried.
        _litellm()
        # litellm cannot stream a mock_response that is a whole message (a tool-call turn): its
        # stream builder fails on it, so such an offline test call takes the plain path.
        mock = params.get("mock_response")
        streamable = mock is None or isinstance(mock, str)
        if request.on_delta is not None and params.get("stream") is not False and streamable:
            return self._complete_streamed(request, kwargs, params)
        response = self._retrying()(self._call_once, kwargs, params)
        return self._to_response(response, params)

    def _kwargs(self, request: ModelRequest, params: dict[str, Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            **params,
            "model": self.model,
            # A private copy: some provider transforms edit messages in place.
            "messages": json.loads(json.dumps(request.messages)),
            "max_retries": 0,
            "num_retries": 0,
        }
        if request.tools:
            kwargs["tools"] = request.tools
        # Structured output only without tools: offered both, some models skip the tools.
        response_format = getattr(request, "response_format", None)
        if response_format is not None and not request.tools:
            kwargs["response_format"] = response_format
        return kwargs

    def _retrying(self) -> tenacity.Retrying:
        return self._retry

    def _complete_streamed(self, request: ModelRequest, kwargs: dict[str, Any],
                           params: dict[str, Any]) -> ModelResponse:
        """The streamed call (:mod:`phases.litellm_stream`): each text delta goes to ``request.on_delta``."""
        return _complete_streamed(self, request, kwargs, params)

    # --- one attempt, and the retry policy ---------------------------------

    def _call_once(self, kwargs: dict[str, Any], params: dict[str, Any]) -> Any:
        litellm = _litellm()
        try:
            return litellm.completion(**kwargs)
        except Exception as exc:  # noqa: BLE001 - every backend failure is translated below
            error = _translate(exc, self.model, params)
        # Raised outside the except block so no __context__ carries litellm's
        # unredacted message along.
        raise error

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        """Stop before the next attempt would start past ``max_retry_seconds`` (read at each call, as it was set)."""
        return tenacity.stop_before_delay(self.max_retry_seconds)(state)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        backoff = float(self._backoff(state))
        if isinstance(exc, TransientModelError) and exc.retry_after is not None:
            # The server's hint, but never less than our own backoff: "Retry-After: 0" (or a date gone by)
            # would otherwise have every attempt of the budget sent at once.
            return max(exc.retry_after, backoff)
        return backoff

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        """Tell the operator: each retry is a warning naming the model, the (redacted) error and the wait."""
        exc = state.outcome.exception() if state.outcome else None
        logger.warning("model %s: %s; retrying in %.1fs (attempt %d)", self.model, exc,
                       state.upcoming_sleep, state.attempt_number + 1)

    def _give_up(self, state: tenacity.RetryCallState) -> Any:
        exc = state.outcome.exception() if state.outcome else None
        elapsed = state.seconds_since_start or 0.0
        raise TransientModelError(
            f"{exc} (not retried now: the next attempt is due in {state.upcoming_sleep:.1f}s, beyond the "
            f"{self.max_retry_seconds:g}s retry budget; {state.attempt_number} attempt(s) in {elapsed:.1f}s)",
            retry_after=state.upcoming_sleep,
        )

    def _check_allowed(self, params: Mapping[str, Any]) -> None:
        problem = _owned_param(params)  # a request's own params (the model's were checked when it was built)
        if problem is not None:
            raise PermanentModelError(f"model {self.model}: {problem}")
        if os.environ.get(BLOCK_REMOTE_MODELS_ENV) != "1" or "mock_response" in params:
            return
        base = params.get("api_base") or params.get("base_url")
        if isinstance(base, str) and _is_loopback_url(base):
            return
        host = urlsplit(base).hostname if isinstance(base, str) else None
        raise PermanentModelError(
            f"real model calls are blocked in the test suite ({BLOCK_REMOTE_MODELS_ENV}=1): model {self.model} "
            f"would call {host or 'its provider'}; point api_base at 127.0.0.1 (tests/fake_openai.py) "
            "or pass mock_response"
        )

    # --- the answer ----------------------------------------------------------

    def _to_response(self, response: Any, params: Mapping[str, Any]) -> ModelResponse:
        choices = getattr(response, "choices", None) or []
        message = getattr(choices[0], "message", None) if choices else None
        if message is None:
            error = TransientModelError(f"model {self.model} returned an empty response (no choices)")
            error.usage = self._usage(response)  # answered all the same: paid for, counted for the job's budgets
            raise error
        return ModelResponse(
            message=plain_message(message),
            finish_reason=getattr(choices[0], "finish_reason", None),
            usage=self._usage(response),
            model=getattr(response, "model", None) or self.model,
            raw=raw_response(response, lambda text: _redact(text, params)),
        )

    def _usage(self, response: Any) -> Usage:
        return usage_of(response)

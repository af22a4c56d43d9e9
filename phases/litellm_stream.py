"""The streamed model call: text handed to ``on_delta`` as it arrives, the answer rebuilt by litellm.

Each chunk litellm's stream yields is kept; its text goes to ``on_delta`` at
once. The chunks are rebuilt with ``litellm.stream_chunk_builder`` into the
same answer a plain call returns (text, tool calls whose arguments came split,
usage, finish reason, provider fields). A stream that breaks after it started
is retried as the same call up to ``request.stream_retries`` times.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from phases.litellm_errors import _translate
from phases.model import ModelRequest, ModelResponse
from pipelines.engine.errors import ModelError, TransientModelError
from pipelines.engine.models import Usage

if TYPE_CHECKING:
    from phases.litellm_model import LiteLLMModel

__all__: list[str] = []  # private helpers of phases.litellm_model


class _BrokenStreamError(TransientModelError):
    """A provider stream that failed after it started; ``usage`` is what the dropped attempt cost."""

    def __init__(self, message: str, *, usage: Usage) -> None:
        super().__init__(message)
        self.usage = usage


def _complete_streamed(model: LiteLLMModel, request: ModelRequest, kwargs: dict[str, Any],
                       params: dict[str, Any]) -> ModelResponse:
    """The streamed call: each text delta goes to ``request.on_delta`` as it arrives.

    Failures before the stream starts follow the same retry policy as a
    plain call. A stream that breaks after it started (litellm's
    ``MidStreamFallbackError``, an error chunk) is run again as the same
    call up to ``request.stream_retries`` times, ``request.on_restart()``
    first; the usage of every dropped attempt is added to the answer's.
    Past those retries it raises :class:`TransientModelError` (the turn is
    run again later).
    """
    from phases.litellm_model import _litellm, _warm_stream

    options = {**(params.get("stream_options") or {}), "include_usage": True}
    kwargs = {**kwargs, "stream": True, "stream_options": options}
    on_delta = request.on_delta
    assert on_delta is not None
    _warm_stream()
    dropped = Usage()
    broken: _BrokenStreamError | None = None
    for attempt in range(max(0, request.stream_retries) + 1):
        if attempt and request.on_restart is not None:
            request.on_restart()
        try:
            chunks = model._retrying()(_stream_once, model, kwargs, params, on_delta)
        except _BrokenStreamError as exc:
            dropped += exc.usage
            broken = exc
            continue
        response = model._to_response(_litellm().stream_chunk_builder(chunks, messages=kwargs["messages"]))
        return response.model_copy(update={"usage": response.usage + dropped})
    raise TransientModelError(f"{broken} (the stream broke {request.stream_retries + 1} time(s); "
                              f"the turn is run again later)")


def _stream_once(model: LiteLLMModel, kwargs: dict[str, Any], params: dict[str, Any],
                 on_delta: Callable[[str], None]) -> list[Any]:
    """One streamed attempt: every chunk, the text handed to ``on_delta`` as it comes."""
    stream = model._call_once(kwargs, params)
    chunks: list[Any] = []
    iterator = iter(stream)
    while True:
        error = None
        try:
            chunk = next(iterator, None)
        except Exception as exc:  # noqa: BLE001 - every backend failure is translated below
            error = _translate(exc, model.model, params)
        if error is not None:
            # Outside the except block, as in _call_once: no unredacted __context__.
            raise _broken(model, error, chunks, kwargs)
        if chunk is None:
            return chunks
        chunks.append(chunk)
        text = _delta_text(chunk)
        if text:
            on_delta(text)  # outside the try: a failing sink is not a broken provider stream


def _broken(model: LiteLLMModel, error: ModelError, chunks: list[Any], kwargs: dict[str, Any]) -> ModelError:
    """A mid-stream failure as an error to raise: a permanent one as is, else a broken stream with its usage."""
    from phases.litellm_model import _litellm

    if not isinstance(error, TransientModelError):
        return error
    usage = Usage(model_calls=1, unknown_cost_calls=1)
    with contextlib.suppress(Exception):  # an estimate only: litellm counts the partial answer's tokens
        partial = _litellm().stream_chunk_builder(chunks, messages=kwargs["messages"]) if chunks else None
        if partial is not None:
            usage = model._usage(partial)
    return _BrokenStreamError(str(error), usage=usage)


def _delta_text(chunk: Any) -> str | None:
    """The text a stream chunk adds to the answer (None for role, tool call, finish and usage chunks)."""
    choices = getattr(chunk, "choices", None) or []
    delta = getattr(choices[0], "delta", None) if choices else None
    text = getattr(delta, "content", None)
    return text if isinstance(text, str) else None

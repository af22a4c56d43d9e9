"""The streamed model call: text handed to ``on_delta`` as it arrives, the answer rebuilt by litellm.

litellm's stream wrapper costs ~1-3 ms of CPU per chunk (it builds and
validates its own chunk objects, logs each one on a thread pool, formats
debug strings whether or not they are printed) where the OpenAI SDK that
reads the bytes costs ~0.1-0.3 ms: at 50 tokens/s a few dozen streaming
conversations filled a core (issue 31). So for a stream whose source is the
OpenAI SDK's own (``openai/...`` and the OpenAI-compatible providers litellm
routes through the SDK), the SDK's chunks are read here directly: each
chunk's text goes to ``on_delta`` at once, and runs of chunks that only add
text (or only add to one tool call's arguments) are merged into one chunk.
When the source ends, litellm's wrapper gets the merged chunks (and the
error that ended the source, if any) as its source and does everything it
would have done, per merged chunk: its chunk processing, finish reasons,
error mapping (a connection lost mid-stream is its ``MidStreamFallbackError``,
an error event or a stream ended without a finish reason too), its end of
stream, then ``stream_chunk_builder`` (text, tool calls, usage, provider
fields). The answer is the one litellm builds; only its per-chunk work is
done once per run instead of once per token. A tool call that came without an
id (or a name), which the builder leaves out, is kept as a plain answer's is
(:func:`phases.litellm_answer.mark_unnamed_calls`).

A chunk with anything else (a finish reason, usage, logprobs, a refusal, a
provider's extra field such as ``reasoning_content``, several choices, a new
tool call) is passed on as it came. A run of identical pieces is never
merged, so litellm's loop guard (the same chunk ``REPEATED_STREAMING_CHUNK_LIMIT``
times raises) still fires; the source is not read past the point where it will.
Everything else (another provider, a mocked response, ``merge_reasoning_content_in_choices``,
litellm ``post_call_rules``, ``LITELLM_MAX_STREAMING_DURATION_SECONDS``, any litellm
callback configured) goes through litellm's wrapper chunk by chunk, as before.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from phases.litellm_answer import mark_unnamed_calls, mended, unmarked
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
    assert request.on_delta is not None
    sink = request.on_delta

    def on_delta(text: str) -> None:
        sink(mended(text))  # as the answer's message will be (phases.litellm_answer.plain_message)

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
        except ModelError as exc:  # the call fails for good: what the broken attempts before it cost goes with it
            exc.usage = dropped + exc.usage if isinstance(exc.usage, Usage) else dropped
            raise
        mark_unnamed_calls(chunks)
        response = model._to_response(_litellm().stream_chunk_builder(chunks, messages=kwargs["messages"]), params)
        return response.model_copy(update={"usage": response.usage + dropped,
                                           "message": unmarked(response.message)})
    error = TransientModelError(f"{broken} (the stream broke {request.stream_retries + 1} time(s); "
                                f"the turn is run again later)")
    error.usage = dropped
    raise error


def _stream_once(model: LiteLLMModel, kwargs: dict[str, Any], params: dict[str, Any],
                 on_delta: Callable[[str], None]) -> list[Any]:
    """One streamed attempt: every chunk litellm yields, the text handed to ``on_delta`` as it comes."""
    stream = model._call_once(kwargs, params)
    source = _sdk_source(stream, params)
    hand_over: Callable[[str], None] | None = on_delta
    if source is not None:
        _read_ahead(stream, source, on_delta)  # the text is handed over here, litellm reads merged chunks below
        hand_over = None
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
        if hand_over is not None:
            text = _delta_text(chunk)
            if text:
                hand_over(text)  # outside the try: a failing sink is not a broken provider stream
        elif not chunk.choices and getattr(stream, "sent_stream_usage", False) is True:
            # The usage chunk, litellm's last: its next next() only builds the whole answer again (~5 ms) for a
            # success log its logger drops as a duplicate, then closes the stream.
            stream.close()
            return chunks


def _broken(model: LiteLLMModel, error: ModelError, chunks: list[Any], kwargs: dict[str, Any]) -> ModelError:
    """A mid-stream failure as an error to raise: a permanent one as is, else a broken stream with its usage."""
    from phases.litellm_model import _litellm

    usage = Usage(model_calls=1, unknown_cost_calls=1)
    with contextlib.suppress(Exception):  # an estimate only: litellm counts the partial answer's tokens
        partial = _litellm().stream_chunk_builder(chunks, messages=kwargs["messages"]) if chunks else None
        if partial is not None:
            usage = model._usage(partial)
    if not isinstance(error, TransientModelError):
        error.usage = usage  # a permanent failure mid-stream: paid for all the same
        return error
    return _BrokenStreamError(str(error), usage=usage)


def _first_choice(chunk: Any) -> Any:
    """The chunk's choice of the answer, or None: none in it, a provider's odd shape (``choices`` not a list; litellm's
    wrapper says what is wrong), or another choice's chunk (with ``n`` > 1 the answer is the first choice)."""
    choices = getattr(chunk, "choices", None)
    if not choices or not isinstance(choices, list) or getattr(choices[0], "index", 0) not in (0, None):
        return None
    return choices[0]


def _delta_text(chunk: Any) -> str | None:
    """The text a stream chunk adds to the answer (None for role, tool call, finish and usage chunks, and for
    another choice's)."""
    text = getattr(getattr(_first_choice(chunk), "delta", None), "content", None)
    return text if isinstance(text, str) else None


# --- reading the OpenAI SDK's stream under litellm's wrapper ---------------------------------------


# litellm's callback lists: with any of them set, its logging is someone's data (see _sdk_source).
_CALLBACK_LISTS = ("callbacks", "success_callback", "_async_success_callback", "failure_callback",
                   "_async_failure_callback", "input_callback", "_async_input_callback", "service_callback",
                   "audit_log_callbacks")


def _sdk_source(stream: Any, params: dict[str, Any]) -> Any:
    """The OpenAI SDK stream under litellm's wrapper, when its chunks may be read here; else None.

    Not with litellm callbacks (global or in ``params``): they would see merged chunks, and litellm's
    logging of the last chunk and of the whole answer, submitted to its thread pool a few µs apart
    instead of milliseconds, raced into logging the answer twice (its check-then-set duplicate guard).
    """
    from phases.litellm_model import _litellm

    lm = _litellm()
    import openai
    from litellm import constants

    source = getattr(stream, "completion_stream", None)
    if not isinstance(stream, lm.CustomStreamWrapper) or type(source) is not openai.Stream:
        return None  # another provider's chunks, or a mocked response: litellm's wrapper reads them
    if (getattr(stream, "merge_reasoning_content_in_choices", False) or lm.post_call_rules
            or getattr(constants, "LITELLM_MAX_STREAMING_DURATION_SECONDS", None) is not None):
        return None  # per-chunk work of litellm's that merged chunks would change
    if any(getattr(lm, name, None) for name in _CALLBACK_LISTS) or any("callback" in key for key in params):
        return None
    return source


def _read_ahead(stream: Any, source: Any, on_delta: Callable[[str], None]) -> None:
    """Read ``source`` to its end (or its error), text to ``on_delta``; the wrapper then reads the merged chunks."""
    from phases.litellm_model import _litellm

    merger = _Merger(int(_litellm().REPEATED_STREAMING_CHUNK_LIMIT))
    error: BaseException | None = None
    first = True
    answered = False  # a chunk of a choice came: the stream is one of an answer
    try:
        while not merger.looping:
            try:
                chunk = next(source)
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001 - raised again from the wrapper's source: litellm maps it
                error = exc
                break
            if first:
                first = False
                _note_first_chunk(stream)
            answered = answered or bool(isinstance(getattr(chunk, "choices", None), list) and chunk.choices)
            text = merger.add(chunk)
            if text:
                on_delta(text)
    except BaseException:
        source.close()  # the sink failed: nothing reads the rest of the answer
        raise
    if error is None and not answered:
        # A 200 that was no stream of an answer (an empty body, only [DONE], a usage chunk alone): litellm would
        # make an empty answer of it, committed as the turn's. A failed attempt instead, retried as one is.
        error = ConnectionError("the provider's stream held no answer (no chunk of a choice)")
    stream.completion_stream = _Replay(merger.finish(), error, source)


def _note_first_chunk(stream: Any) -> None:
    """litellm's time to first token (its logging callbacks report it), which it sets at the first chunk it reads."""
    logging_obj = getattr(stream, "logging_obj", None)
    if logging_obj is not None and getattr(logging_obj, "completion_start_time", 1) is None:
        with contextlib.suppress(Exception):
            logging_obj.update_completion_start_time(completion_start_time=datetime.datetime.now())


class _Replay:
    """The wrapper's source once the SDK's has been read: the merged chunks, then the error that ended it."""

    def __init__(self, chunks: list[Any], error: BaseException | None, source: Any) -> None:
        self._chunks = iter(chunks)
        self._error = error
        self._source = source

    def __iter__(self) -> _Replay:
        return self

    def __next__(self) -> Any:
        chunk = next(self._chunks, None)
        if chunk is not None:
            return chunk
        error, self._error = self._error, None
        if error is not None:
            raise error
        raise StopIteration

    def close(self) -> None:
        self._source.close()


class _Merger:
    """Chunks as they come, runs of plain text (or of one tool call's arguments) merged into their first chunk.

    A run's pieces are kept in a list and joined once when it ends (text grown
    by ``+=`` copies itself at every piece). ``looping`` turns true once the
    same piece came ``limit`` + 1 times in a row: litellm raises there.
    """

    def __init__(self, limit: int) -> None:
        self.chunks: list[Any] = []
        self._head: Any = None  # the chunk the current run is merged into (None: no run)
        self._kind: object = None  # "text", or the index of the tool call whose arguments run
        self._pieces: list[str] = []
        self._last: Any = None  # the chunk of the run's last piece
        self._piece: str | None = None  # the text of the previous chunk, for the loop guard
        self._repeats = 0
        self._limit = limit
        self.looping = False

    def add(self, chunk: Any) -> str | None:
        """Take one SDK chunk; the text it adds to the answer."""
        try:
            kind, piece, text = _run_kind(chunk)
        except (AttributeError, TypeError, KeyError, IndexError):
            kind = piece = text = None  # a chunk of no shape we know: passed on whole, litellm's wrapper judges it
        if text is not None and len(text) > 2 and text == self._piece:
            self._repeats += 1
            self.looping = self._repeats > self._limit
        else:
            self._repeats = 1
        self._piece = text
        if self._repeats > 1:
            # Identical pieces stay apart, as litellm's loop guard compares chunk to chunk.
            last = self._last
            if self._head is not None and last is not self._head:  # the previous piece ended a run: taken out
                self._pieces.pop()
                self._end_run()
                self.chunks.append(last)
            else:
                self._end_run()
            self.chunks.append(chunk)
            return text
        if piece is not None and self._head is not None and kind == self._kind and _continues(self._head, chunk):
            self._pieces.append(piece)
            self._last = chunk
            return text
        self._end_run()
        if kind is not None and piece is not None:
            self._head, self._kind, self._pieces, self._last = chunk, kind, [piece], chunk
        else:
            self.chunks.append(chunk)
        return text

    def finish(self) -> list[Any]:
        self._end_run()
        return self.chunks

    def _end_run(self) -> None:
        head = self._head
        if head is None:
            return
        if len(self._pieces) > 1:
            delta = head.choices[0].delta
            joined = "".join(self._pieces)
            if self._kind == "text":
                delta.content = joined
            else:
                delta.tool_calls[0].function.arguments = joined
        self.chunks.append(head)
        self._head = self._last = None
        self._pieces = []


def _run_kind(chunk: Any) -> tuple[object, str | None, str | None]:
    """(what run the chunk can be in: "text", a tool call's index or None; its piece; its text)."""
    choice = _first_choice(chunk)
    if choice is None:
        return None, None, None
    choices = chunk.choices
    delta = getattr(choice, "delta", None)
    text = getattr(delta, "content", None)
    if not isinstance(text, str):
        text = None
    if (len(choices) != 1 or delta is None or chunk.usage is not None or chunk.model_extra
            or choice.finish_reason is not None or choice.logprobs is not None or choice.model_extra
            or delta.function_call is not None or delta.refusal is not None or delta.model_extra):
        return None, None, text
    calls = delta.tool_calls
    if calls is None:
        return ("text", text, text) if text is not None else (None, None, None)
    if text is not None or len(calls) != 1:
        return None, None, text
    call = calls[0]
    function = call.function
    if (call.model_extra or function is None or function.model_extra
            or not isinstance(function.arguments, str)):
        return None, None, text
    return call.index, function.arguments, text


def _continues(head: Any, chunk: Any) -> bool:
    """Whether ``chunk`` may be merged into the run ``head`` started (same response, choice and role)."""
    if (chunk.id != head.id or chunk.model != head.model or chunk.system_fingerprint != head.system_fingerprint
            or chunk.service_tier != head.service_tier):
        return False
    choice, first = chunk.choices[0], head.choices[0]
    if choice.index != first.index:
        return False
    delta = choice.delta
    if delta.role is not None and delta.role != first.delta.role:
        return False
    calls = delta.tool_calls
    if calls is None:
        return True
    call, function = calls[0], calls[0].function
    return call.id is None and call.type is None and function.name is None  # a piece of arguments, no new call

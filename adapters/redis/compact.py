"""Record format 3's compact JSON: each of the engine's own key runs stored as one control byte.

A W1 turn's record delta (``dx``) and its events are JSON the engine writes in the same shape every turn:
``{"checkpoint":{"next_phase":"``, ``,"transcript_len":``, ``{"call_id":"``, ``,"prompt_tokens":``. In record
format 3 (:mod:`adapters.redis.record_format`) a storage writes ``dx`` and every stream entry (the durable
events and the live parts) with each run of :data:`WORDS` as its code byte, and every reader of this
version puts the runs back (:func:`widen`) before it parses. That is ~40 % of those texts: less to send,
to store and to keep in a job's streams.

Why control bytes: JSON text never holds a raw one but for its whitespace (RFC 8259 has them escaped
inside strings, as pydantic-core and :mod:`json` do), so in a stored text a code byte can only be a code,
and widening a text written whole (formats 1 and 2, a hand-written or pretty-printed record) changes
nothing: one reader serves every format. The codes are the 28 control bytes that are neither NUL nor
JSON whitespace (tab, newline, carriage return), one a run; :func:`narrow` refuses a text that already
holds one.

**WORDS is stored data**: once a prefix holds format-3 texts, every later version must read them as
written. Entries are never changed, removed or reordered; every code is taken, so another run needs
another scheme and a new record format.

The scripts never parse these texts (they store, slice and copy them), so they need no change; a
live part sent as a slice of a journaled value (:mod:`adapters.redis.refs`) keeps the slice whole
between narrowed text, which widens as any other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from pipelines.engine.errors import StorageError
from pipelines.engine.models.values import encode_plain

__all__ = ["ALL_RUNS", "ANSWER_RUNS", "EVENT_RUNS", "RECORD_RUNS", "WORDS", "Runs", "narrow", "narrow_answer", "widen"]

#: Record format 3's runs, in code order (byte 1 upward, tab, newline and carriage return skipped): the record
#: delta's fields, then the agent turn's events' (the phase name ``"turn"`` among them). Never edited: see the module.
WORDS: Final = (
    '{"checkpoint":{"next_phase":"', '","state":', ',"due_at":', ',"created_at":', ',"updated_at":',
    ',"commit_id":"', ',"transcript_epoch":"', ',"version":', ',"transcript_len":', ',"usage":{"prompt_tokens":',
    ',"completion_tokens":', ',"model_calls":', ',"phases_done":', ',"cost_usd":', '"turn"', '{"attempt":',
    '{"finish_reason":"', ',"tool_calls":', ',"prompt_tokens":', ',"request":{"messages":', ',"tools":[',
    ',"model":"', '{"call_id":"', ',"tool":"', ',"error":false', '{"messages":[', '{"turn":', ',"text":"',
)

# Every control byte but NUL (narrow's joint) and JSON's own whitespace (tab, newline, carriage return: a JSON
# text may hold them raw, between its tokens, and the turn history separates its marks with newlines).
_CODES: Final = tuple(chr(c) for c in range(1, 32) if c not in (9, 10, 13))
_WIDE: Final = dict(zip(_CODES, WORDS, strict=True))
_CODE: Final = re.compile("[\x01-\x08\x0b\x0c\x0e-\x1f]")

if len(WORDS) != len(_CODES):  # pragma: no cover - every code is taken: a new run needs another scheme
    raise RuntimeError(f"{len(WORDS)} runs for {len(_CODES)} codes")

Runs = tuple[tuple[str, str], ...]
"""The runs a writer looks for in one kind of text, with their codes."""


def _runs(words: Sequence[str]) -> Runs:
    # Longest first: a run that holds a shorter one ('{"turn":' holds '"turn"') goes whole.
    return tuple(sorted(((w, _CODES[WORDS.index(w)]) for w in words), key=lambda wc: -len(wc[0])))


#: What a record delta holds (each text is looked for every run it is given: a writer gives only those its
#: kind of text holds, which halves the work; a reader widens every code).
RECORD_RUNS: Final = _runs((*WORDS[:14], '{"turn":'))
#: What an event or a live part holds.
EVENT_RUNS: Final = _runs([w for w in WORDS if w not in dict(RECORD_RUNS)] +
                          [',"completion_tokens":', ',"cost_usd":'])
#: Every run (a text of no one kind).
ALL_RUNS: Final = _runs(WORDS)
#: What a journaled model answer holds after its message (``ModelResponse``'s usage, model and request).
ANSWER_RUNS: Final = _runs((',"usage":{"prompt_tokens":', ',"completion_tokens":', ',"model_calls":', ',"cost_usd":',
                            ',"prompt_tokens":', ',"model":"', ',"request":{"messages":', ',"tools":[', '"turn"'))

# A journaled model answer's first key (``journal_form``): the message, which stays as written.
_ANSWER_HEAD: Final = '{"message":'


def narrow(texts: Sequence[str], runs: Runs) -> list[str]:
    """``texts`` (JSON texts) as format 3 stores them: each of ``runs`` as its code byte.

    Raises :class:`StorageError` for a text already holding a code byte (a raw control byte other than
    JSON's whitespace: no JSON text does), before anything is written.
    """
    if not texts:
        return []
    joined = "\x00".join(texts)  # one pass over the runs for all of them
    if _CODE.search(joined) or joined.count("\x00") != len(texts) - 1:
        raise StorageError("a JSON text to store holds a raw control character, which JSON escapes: "
                           "not written (nothing was)")
    for word, code in runs:
        joined = joined.replace(word, code)
    return joined.split("\x00")


def narrow_answer(value: object, text: str) -> str:
    """A journaled step value's ``text`` as format 3 stores it: a model answer's fields after its message narrowed.

    Only what follows the message: a commit sends the transcript's assistant message as a slice of the
    journaled answer, and a live part the text streamed with it (:mod:`adapters.redis.refs`), each found in
    the stored text byte for byte, so the message is kept as written (~100 bytes a W1 turn are the fields
    after it). Any other value (a tool's result, which a message holds whole) is stored as it is.
    """
    if not (isinstance(value, dict) and text.startswith(_ANSWER_HEAD)):
        return text
    message = value.get("message")
    try:
        inner = encode_plain(message) if isinstance(message, dict) else ""
    except (ValueError, TypeError):  # not plain data: the step's own dump converted it (then not found below)
        return text
    end = len(_ANSWER_HEAD) + len(inner)
    if not inner or not text.startswith(inner, len(_ANSWER_HEAD)):
        return text  # dumped otherwise: nothing is narrowed rather than a part of the message
    return text[:end] + narrow([text[end:]], ANSWER_RUNS)[0]


def widen(text: str) -> str:
    """A stored text with its runs put back: the JSON it was (a text written whole comes back as it is)."""
    return _CODE.sub(_run, text) if _CODE.search(text) else text


def _run(match: re.Match[str]) -> str:
    return _WIDE.get(match.group(), match.group())

"""Transcript messages a commit sends as a reference into the job's journal instead of in full.

A turn journals the model's answer before it commits (so a crash does not
call the model again), and the commit then appends the assistant message that
answer holds: the same JSON text would cross the network twice. The storage
remembers the step values it journaled, or loaded with the lease, and a
message found inside one of them byte for byte is sent as::

    =<start> <length> <sha1 prefix> <step key>

The other way round, a tool's result: the journaled value (the message's
content, a JSON string) is inside the message, and a message holding a whole
value (:data:`REF_MIN_BYTES` or more) is sent as the text around it::

    ><prefix length> <sha1 prefix of the value> <key length>\n<step key><prefix><suffix>

The commit script cuts the message out of the journaled value (or puts it
around the value), checks the SHA-1 prefix (and the length), and replies
``rebase`` (nothing written) when either differs or the value is gone; the
adapter then sends the message whole. So a reference only ever saves bytes:
what is remembered here may be out of date without a wrong message being
stored. A transcript message is JSON text and always starts with ``{``, never
``=`` or ``>``; lengths count bytes (Lua's strings are bytes).

Live-stream parts sent with a journal write get the same treatment against
the value journaled in that very call (:func:`slice_parts`): the streamed text
of a model's answer is inside the answer.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence

from adapters.redis.compact import EVENT_RUNS, narrow

__all__ = ["REF_MIN_BYTES", "JournalValues", "slice_parts"]

#: A message shorter than this goes whole: a reference is ~30 bytes plus the step key.
REF_MIN_BYTES = 96
_HASH_CHARS = 16  # 64 bits of SHA-1: a stale value that matches by chance is not a risk worth a byte


class JournalValues:
    """The step values a job's journal holds, as this process wrote or loaded them (bounded, thread-safe).

    ``jobs`` and ``max_bytes`` bound what is kept; the job remembered longest
    ago goes first. Each job's values belong to one record version: a step
    journaled under another version starts the job's set anew, as the
    journal itself does.
    """

    def __init__(self, *, jobs: int = 1024, max_bytes: int = 32 << 20) -> None:
        self._jobs: dict[str, tuple[int, dict[str, bytes]]] = {}
        self._sizes: dict[str, int] = {}
        self._bytes = 0
        self._max_jobs = jobs
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def remember(self, job_id: str, version: int, key: str, text: str) -> None:
        """One step journaled under ``version`` (its JSON text, as sent)."""
        value = text.encode()
        with self._lock:
            held = self._jobs.get(job_id)
            values = held[1] if held is not None and held[0] == version else {}
            values[key] = value
            self._store(job_id, version, values)

    def reset(self, job_id: str, version: int, pairs: dict[str, bytes]) -> None:
        """The journal as loaded with the lease (step key -> stored value) for record ``version``."""
        with self._lock:
            self._store(job_id, version, dict(pairs))

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._drop(job_id)

    def refer(self, job_id: str, messages: Sequence[str]) -> list[str] | None:
        """``messages`` with each one found in a remembered value replaced by its reference; ``None`` if none is."""
        with self._lock:
            held = self._jobs.get(job_id)
            values = list(held[1].items()) if held is not None else []
        if not values:
            return None
        out: list[str] = []
        found = False
        for text in messages:
            ref = _reference(text, values) if len(text) >= REF_MIN_BYTES else None
            found = found or ref is not None
            out.append(ref if ref is not None else text)
        return out if found else None

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def _store(self, job_id: str, version: int, values: dict[str, bytes]) -> None:
        self._drop(job_id)
        size = sum(len(k) + len(v) for k, v in values.items())
        if size > self._max_bytes:
            return
        while self._jobs and (len(self._jobs) >= self._max_jobs or self._bytes + size > self._max_bytes):
            self._drop(next(iter(self._jobs)))
        self._jobs[job_id] = (version, values)
        self._sizes[job_id] = size
        self._bytes += size

    def _drop(self, job_id: str) -> None:
        if self._jobs.pop(job_id, None) is not None:
            self._bytes -= self._sizes.pop(job_id)


# A JSON string literal, quotes included (escapes kept as they are).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # unrolled: no alternation per character


def slice_parts(value: str, lines: Sequence[str], *, compact: bool = False) -> list[str] | None:
    """Live-stream parts sent with a journal write, each long string it shares with ``value`` cut out.

    The text a model streamed is inside its journaled answer too. A part
    holding a string literal whose text (:data:`REF_MIN_BYTES` or more) ``value``
    holds as it is goes as ``=<prefix length> <start> <length>\\n<prefix><suffix>``
    (in bytes, ``start`` 1-based in ``value``), which the step script puts back
    together from the value sent in the same call: nothing can be stale.
    ``None`` when no part has such a string. ``compact`` (record format 3): the
    prefix and suffix of a part so cut go compact (:mod:`adapters.redis.compact`;
    the others are left to the caller), found in the JSON as written.
    """
    out: list[str] = []
    found = False
    for line in lines:
        cut = None
        if len(line) >= REF_MIN_BYTES:
            for m in _STRING.finditer(line):
                # Inside the quotes: the streamed tail of an answer is the end of its content string,
                # and escaping goes character by character, so its text is that string's end too.
                inner = m.group()[1:-1]
                if len(inner) >= REF_MIN_BYTES and (at := value.find(inner)) >= 0:
                    cut = (m.start() + 1, m.end() - 1, at)
                    break
        if cut is None:
            out.append(line)
            continue
        found = True
        a, b, at = cut
        head, tail = narrow([line[:a], line[b:]], EVENT_RUNS) if compact else (line[:a], line[b:])
        # Lua counts bytes: the offsets of UTF-8 text, not of characters.
        start, size, lead = len(value[:at].encode()) + 1, len(line[a:b].encode()), len(head.encode())
        out.append(f"={lead} {start} {size}\n{head}{tail}")
    return out if found else None


def _reference(text: str, values: list[tuple[str, bytes]]) -> str | None:
    message = text.encode()
    for key, value in values:
        at = value.find(message)
        if at >= 0:
            digest = hashlib.sha1(message, usedforsecurity=False).hexdigest()[:_HASH_CHARS]
            return f"={at + 1} {len(message)} {digest} {key}"  # 1-based, as Lua's string.sub counts
    for key, value in values:
        if len(value) >= REF_MIN_BYTES and (at := message.find(value)) >= 0:
            # The value is whole JSON text (a string literal, quotes included): cut at character boundaries.
            digest = hashlib.sha1(value, usedforsecurity=False).hexdigest()[:_HASH_CHARS]
            prefix, suffix = message[:at].decode(), message[at + len(value):].decode()
            return f">{len(prefix.encode())} {digest} {len(key.encode())}\n{key}{prefix}{suffix}"
    return None

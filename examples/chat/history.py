"""What a ``useChat`` client holds of a conversation, checked against what the server holds.

The transcript is append-only; a client is not: ``sendMessage({text, messageId})`` replaces a message it
sent and drops what followed, ``regenerate()`` drops an answer. Before a ``POST /chat`` goes on from the
client's messages, the user messages the client holds are compared with the person's messages of the
conversation, position by position: a client that disagrees (an edit refused, then another message; another
tab's edit) is told to reload instead of being answered from messages it does not show. A client that holds
fewer (a tab left behind while another went on) agrees as far as it goes.
"""

from __future__ import annotations

from typing import Any

from phases.compaction import MARKER_KEY
from pipelines.engine.errors import JobConflictError
from pipelines.engine.models import Message

__all__ = ["check_agrees", "from_person", "held_users", "is_edit", "ui_text"]


def from_person(message: Message) -> bool:
    """Whether ``message`` is one a person sent: a user message, not a compaction's summary (stored as one)."""
    return message["role"] == "user" and MARKER_KEY not in message


def ui_text(message: Any) -> str | None:
    """The text of a ``useChat`` UI message (its text parts joined); ``None`` when it has none or not only text."""
    parts = message.get("parts") if isinstance(message, dict) else None
    texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == "text"
             ] if isinstance(parts, list) else []
    plain = [t for t in texts if isinstance(t, str)]
    return "".join(plain) if plain and len(plain) == len(texts) else None


def held_users(body: Any) -> list[dict[str, Any]]:
    """The user messages of a ``useChat`` body, in order (none for a ``{"id", "text"}`` body)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    return [m for m in messages if isinstance(m, dict) and m.get("role") == "user"
            ] if isinstance(messages, list) else []


def is_edit(body: Any) -> bool:
    """Whether the body is ``sendMessage({text, messageId})`` of a user message: the client replaced it.

    (An approval's message names a message too: the assistant's, which is not the last user message.)
    """
    messages = body.get("messages") if isinstance(body, dict) else None
    last = messages[-1] if isinstance(messages, list) and messages else None
    edited = body.get("messageId") if isinstance(body, dict) and body.get("trigger") == "submit-message" else None
    return isinstance(edited, str) and isinstance(last, dict) and last.get("role") == "user" and \
        last.get("id") == edited


def check_agrees(job_id: str, held: list[dict[str, Any]], transcript: list[Message]) -> None:
    """Raise :class:`JobConflictError` unless each of ``held`` says what the person's message at its place says.

    A message whose text either side does not hold as plain text (files, content parts) is not compared.
    """
    said = [m.get("content") for m in transcript if from_person(m)]
    for n, (mine, theirs) in enumerate(zip(held, said, strict=False)):
        text = ui_text(mine)
        if isinstance(text, str) and isinstance(theirs, str) and text != theirs:
            raise JobConflictError(
                f"conversation {job_id!r}: this client's message {n + 1} is not the one the conversation holds (an "
                "edit it did not take, or another tab's): reload the conversation before going on")

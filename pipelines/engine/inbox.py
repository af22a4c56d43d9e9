"""Messages sent to a conversation (``app.send``): what may be sent, and where it goes.

The rule: an invariant between two records is checked in the same atomic
step that writes. The inbox and the job's status are such a pair ("every
message in an inbox is read by a later turn"), and each side checks it as it
writes:

* ``Storage.send`` appends only while the status is one of
  :data:`~adapters.base.INBOX_OPEN`, reading it inside the append (a Lua
  script on Redis, the storage lock in memory). A run that ended between
  :func:`send`'s read and that append makes the append fail, nothing written;
  :func:`send` reads the job again and, now that it is complete, continues
  the conversation with the messages instead.
* The commit that ends a run (``Commit.ends_run``) is refused while the inbox
  holds messages its turn did not take (``InboxNotEmptyError``, nothing
  written). The runner then ends the run and starts the next one with those
  messages in one commit (:func:`~pipelines.engine.transitions.done_and_continued`),
  so no crash can strand them: the job is running, and the sweep finds it.

So a complete job's inbox is always empty, and a message is either in a
running job's inbox, in the transcript, or refused to its sender.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pipelines.engine.models as models  # MAX_VALUE_BYTES is a setting, read at each check
from adapters.base import INBOX_OPEN, Storage
from pipelines.engine import children, writer
from pipelines.engine.control import load_job
from pipelines.engine.errors import InvalidInputError, JobConflictError, JobNotFoundError, ValueTooLargeError
from pipelines.engine.models import STEP_ENVELOPE, JobRecord, JobStatus, Message, dump_json

__all__ = ["PERSON_ROLES", "SEND_TRIES", "person_messages", "send"]

PERSON_ROLES = ("user", "assistant")
"""The roles of what a person may send: a tool result, a tool call or an instruction (system, developer) is not
something a conversation's participant writes, and a forged one would steer the model."""

SEND_TRIES = 5
"""How often :func:`send` reads the job again when its status moved between the read and the write."""


def person_messages(messages: Sequence[Any]) -> list[Message]:
    """``messages`` (strings are user messages) if each is what a person could write, else InvalidInputError."""
    out: list[Message] = []
    for i, m in enumerate(messages):
        msg = {"role": "user", "content": m} if isinstance(m, str) else m
        if not isinstance(msg, Mapping):
            raise InvalidInputError(f"message {i} sent is a {type(m).__name__}, not a message (a dict) or a string")
        role = msg.get("role")
        if role not in PERSON_ROLES:
            raise InvalidInputError(
                f"message {i} sent has role {role!r}: a conversation takes what a person writes (role 'user', "
                "or 'assistant' without tool calls); tool results and system or developer instructions are not sent")
        if msg.get("tool_calls") or msg.get("function_call"):
            raise InvalidInputError(f"message {i} sent is a {role!r} message with tool_calls: a tool call and its "
                                    "result belong to a turn, not to what a person sends")
        if not isinstance(msg.get("content"), str | list):
            # Joined to the transcript, a message no model reads would fail every later turn of the conversation.
            raise InvalidInputError(f"message {i} sent needs a 'content': a string, or a list of content parts "
                                    f"(text, images); got {msg.get('content')!r:.60}")
        _check_fits_a_turn(msg, i)
        out.append(dict(msg))
    return out


def _check_fits_a_turn(message: Mapping[str, Any], i: int) -> None:
    """Refuse a message the turn that takes it could not journal (the inbox step holds it with some room around)."""
    size = len(dump_json(dict(message), f"message {i} sent").encode())
    limit = models.MAX_VALUE_BYTES - STEP_ENVELOPE
    if size > limit:
        raise ValueTooLargeError(f"message {i} sent is {size:,} bytes of JSON, above the {limit:,} a turn takes "
                                 "at once (pipelines.engine.models.MAX_VALUE_BYTES less STEP_ENVELOPE)")


def send(storage: Storage, record: JobRecord, messages: list[Message], *, agent: str, takes_while_running: bool,
         continue_run: Callable[[JobRecord], object]) -> None:
    """Put ``messages`` in the inbox of ``record``'s job, or continue it with them if it is complete.

    ``continue_run(record)`` starts the next run of the complete conversation ``record`` with
    ``messages`` (``app.run_agent``), with the per-run options of its last run, as a message sent during
    the last turn does (``done_and_continued``). Raises :class:`JobConflictError` for a
    job that takes no messages (failed, cancelled, or an agent with
    ``on_new_message="reject"`` while it runs).
    """
    for _ in range(SEND_TRIES):
        if record.status is not JobStatus.COMPLETE:
            _check_open(record, agent, takes_while_running)
        else:
            # Said here: the same refusal from continue_run would read as the job moving meanwhile.
            children.check_not_awaited(record, storage, act="run it again")
        if _sent(storage, record, messages, continue_run):
            return
        record = load_job(storage, record.job_id)  # it moved between the read and the write: judge it again
    raise JobConflictError(f"job {record.job_id!r} kept changing while messages were sent to it; try again")


def _check_open(record: JobRecord, agent: str, takes_while_running: bool) -> None:
    if record.status not in INBOX_OPEN:
        raise JobConflictError(f"job {record.job_id!r} is {record.status.value}; retry it before sending messages")
    if not takes_while_running:
        raise JobConflictError(f"agent {agent!r} does not take messages while a run is in progress "
                               "(on_new_message='reject'); wait for it to complete")


def _sent(storage: Storage, record: JobRecord, messages: list[Message],
          continue_run: Callable[[JobRecord], object]) -> bool:
    """One attempt on the record as read; ``False`` when the write found the job's status moved (nothing written)."""
    try:
        if record.status is JobStatus.COMPLETE:
            continue_run(record)  # fenced on the version read: another run started meanwhile is a conflict
        elif writer.send(storage, record.job_id, messages) is None:
            raise JobNotFoundError(f"job {record.job_id!r} not found")
    except JobConflictError:
        return False
    return True

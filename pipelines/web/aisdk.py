"""A job's stream as the Vercel AI SDK UI message stream (protocol ``v1``, the ``ai`` npm package's
``uiMessageChunkSchema``): ``start``, ``start-step``, ``text-start``, ``text-delta``, ``text-end``,
``tool-input-available``, ``tool-approval-request``, ``tool-output-available``, ``tool-output-denied``,
``finish-step``, ``finish``, ``error``.

One run of the job (``job_started`` / ``job_continued`` / ``job_retried`` up to ``job_finished``,
``job_failed``, ``job_cancelled``, or a wait or pause nothing follows yet) is one assistant UI message; each turn is one
step. Text is forwarded as it arrives; the committed transcript stays the truth: at
``turn_committed`` the turn's text is reconciled with the committed assistant message, and its
tool calls and results are read from the transcript (the stream's parts carry only their ids).

A turn can be run again (a crash, a retried provider stream): a new attempt that repeats what was
already shown sends nothing until it goes further. When it says something else, the text shown
cannot be taken back chunk by chunk, so the message is sent again from its ``start`` under a new
``messageId``: ``readUIMessageStream`` and ``useChat``'s resume reset their state on a new id, and
the assembled message equals the transcript.

That reset happens only where the reader resets on a new id: ``readUIMessageStream`` and
``useChat``'s resume (``trigger === "resume-stream"``). ``useChat``'s send path (the response to
``sendMessage``) appends to the message it holds, so text once sent stays. With ``hold_text`` the
encoder sends no text while a turn runs: each turn's text comes whole at its ``turn_committed``,
from the transcript (or at an approval wait, whose model answer is already journaled), so the send
path never shows an attempt that is then abandoned. The steps and tool parts still come as they happen.

A call waiting for a person's approval (``approval_requested``) is sent as its tool part
(``tool-input-available``) and a ``tool-approval-request`` whose ``approvalId`` is the call id: the
AI SDK shows it ``approval-requested``. When the run goes on, the same message goes on (no new
``start``): an approved call's result comes as ``tool-output-available``, a rejected one as
``tool-output-denied`` (the model still reads the reason from its tool result).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pipelines.engine.models import RUN_STARTS, Event, Message

__all__ = ["ENDS", "RUN_STARTS", "UIMessageEncoder", "latest_attempts", "run_start", "undone"]

Chunk = dict[str, Any]

# Events that end the run's UI message, with the finish reason the AI SDK knows.
ENDS = {"job_finished": "stop", "job_failed": "error", "job_cancelled": "other", "job_waiting": "other",
        "approval_requested": "other", "job_paused": "other"}
# A run that ended on an answer cut short (its record's stop_reason) finishes as the AI SDK names that.
_STOPS = {"truncated": "length", "content_filter": "content-filter"}
_DECIDED = frozenset({"call_approved", "call_rejected"})
# Ends only when nothing follows yet: a run that goes on after them (resumed, approved) is one message in a replay.
_WAITS = frozenset({"job_waiting", "approval_requested", "job_paused"})
_TURN_PARTS = frozenset({"attempt_started", "text_delta", "turn_started", "turn_committed"})


def run_start(parts: list[Event], upto: int | None = None) -> int:
    """Index in ``parts`` of the last run start at or before ``upto`` (default: the end); 0 if none."""
    last = len(parts) - 1 if upto is None else upto
    for i in range(last, -1, -1):
        if parts[i].type in RUN_STARTS:
            return i
    return 0


def undone(parts: list[Event], first: int) -> bool:
    """Whether a full retry undid the run starting at ``parts[first]``: cut the transcript back to its start,
    so the indices its ``turn_committed`` parts name now hold the retried run's messages. A full retry undoes
    the run in effect: this one if no other run started since (a resume goes on with the same run).
    """
    for p in parts[first + 1:]:
        if p.type in RUN_STARTS and not (p.type == "job_retried" and p.data.get("mode") != "full"):
            return p.type == "job_retried"
    return False


class UIMessageEncoder:
    """Turns a job's parts, in order, into UI message chunks (see the module docstring).

    ``messages(start, stop)`` reads the committed transcript. The output is a
    function of the parts alone, so feeding a run's parts again rebuilds the
    state a client holds (a resume from ``Last-Event-ID``).
    """

    def __init__(self, job_id: str, messages: Callable[[int, int], list[Message]], *,
                 hold_text: bool = False) -> None:
        self.job_id = job_id
        self.hold_text = hold_text
        self._messages = messages
        self.message_id: str | None = None
        self.ended = False  # the message ended: the HTTP response can end
        # The next message start goes out under an id of its own: the client holds a state this run's parts
        # no longer rebuild (see pipelines.web.sse), and the AI SDK's readers reset on a new id.
        self.again = False
        self._base = job_id
        self._resets = 0
        self._log: list[Chunk] = []  # chunks of the open message after its start, to send it again
        self._asked: set[str] = set()  # calls sent as waiting for approval: their input is shown already
        self._denied: set[str] = set()  # calls a person rejected: shown as denied, not as a result
        # The last turn of this run that committed: text for it or an earlier turn after that comes from a
        # worker fenced off meanwhile (its lease ran out mid-turn, another committed the turn) and is not shown.
        self._done_turn = 0
        # The last part fed was a turn_committed that sent its turn's text whole, none of it shown before
        # (not held back: the turn's text came live, if at all, in parts that are gone now): its chunks are
        # not those a stream that had those parts made, and their ids say so (pipelines.web.sse).
        self.whole = False
        self._end_step()

    def anew(self) -> UIMessageEncoder:
        """A new encoder with this one's settings, in the state of one that was fed nothing."""
        return UIMessageEncoder(self.job_id, self._messages, hold_text=self.hold_text)

    def _end_step(self) -> None:
        self._held: list[str] = []  # hold_text: the latest attempt's text, not sent yet
        self._turn: int | None = None
        self._attempt: str | None = None
        self._text_id: str | None = None
        # The open text part's text as the client has it, in pieces (joined only when a new attempt
        # replays it): one string grown per delta and compared whole per delta is quadratic in the answer.
        self._shown: list[str] = []
        self._shown_len = 0
        self._shown_text: str | None = ""  # the pieces joined, while no piece came since
        # The turn's latest attempt is always the first _current_len characters of what is shown: each
        # delta either extends both, repeats shown text, or sends the message again from it.
        self._current_len = 0

    def feed(self, part: Event, *, final: bool = True) -> list[Chunk]:
        """The chunks ``part`` adds. ``final=False``: more parts are known to follow (a wait is not an end)."""
        kind = part.type
        self.whole = False
        if kind in RUN_STARTS:
            return [*self._finish("other"), *self._start(f"{self.job_id}-{part.id}")]
        if kind in ENDS:
            # A call waiting for approval is shown whether or not the run goes on after it.
            out = self._ask(part) if kind == "approval_requested" and self.message_id is not None else []
            if kind in _WAITS and not final:
                return out
            error = part.data.get("error") if kind == "job_failed" else None
            reason = _STOPS.get(str(part.data.get("reason")), "stop") if kind == "job_finished" else ENDS[kind]
            return out + self._finish(reason, None if error is None else str(error))
        if kind in _DECIDED:
            return self._decided(part, final)
        if part.turn is None or kind not in _TURN_PARTS or (part.turn <= self._done_turn and kind != "turn_committed"):
            return []  # not a turn's part, or a fenced-off worker's late text for a turn already committed
        out = [] if self.message_id is not None else self._start(f"{self.job_id}-{part.id}")
        if kind == "turn_committed":
            return out + self._commit(part)
        attempt = part.data.get("attempt")
        if part.turn != self._turn:
            out += self._open_step(part.turn)
        if kind == "attempt_started" or (kind == "text_delta" and self._attempt is None):
            self._attempt, self._current_len, self._held = str(attempt), 0, []
        if kind == "text_delta" and str(attempt) == self._attempt:
            out += self._delta(str(part.data.get("text", "")))
        return out

    def _delta(self, piece: str) -> list[Chunk]:
        if self.hold_text:
            self._held.append(piece)
            return []
        return self._add_text(piece)

    # --- message and steps -------------------------------------------------------------------
    def _start(self, message_id: str) -> list[Chunk]:
        self._base, self._resets, self._log, self.ended = message_id, 0, [], False
        self.message_id = message_id + ("-again" if self.again else "")
        self.again = False
        self._asked, self._denied = set(), set()
        self._done_turn = 0
        self._end_step()
        return [{"type": "start", "messageId": self.message_id}]

    def _emit(self, *chunks: Chunk) -> list[Chunk]:
        self._log.extend(chunks)
        return list(chunks)

    def _decided(self, part: Event, final: bool) -> list[Chunk]:
        """A call's approval decided (``call_approved`` / ``call_rejected``)."""
        if part.type == "call_rejected":
            self._denied.add(str(part.data.get("call_id")))
        # A decision that leaves the job waiting on others ends the message as the wait did, when nothing
        # follows it yet: the run goes on only once they are decided (then in a message of its own).
        pending = part.data.get("pending")
        return self._finish("other") if final and type(pending) is int and pending > 0 else []

    def _open_step(self, turn: int) -> list[Chunk]:
        out = self._close_step()
        self._turn = turn
        return out + self._emit({"type": "start-step"})

    def _close_step(self) -> list[Chunk]:
        if self._turn is None:
            return []
        out = [] if self._text_id is None else self._emit({"type": "text-end", "id": self._text_id})
        self._end_step()
        return out + self._emit({"type": "finish-step"})

    def abort(self, error: str) -> list[Chunk]:
        """End an open message with ``error`` (the job's stream ended before its run did); ``[]`` when none is open."""
        return self._finish("error", error)

    def _finish(self, reason: str, error: str | None = None) -> list[Chunk]:
        if self.message_id is None:
            return []
        out = self._close_step()
        if error is not None:
            out.append({"type": "error", "errorText": error})
        out.append({"type": "finish", "finishReason": reason})
        self.message_id, self._log, self.ended = None, [], True
        return out

    # --- text --------------------------------------------------------------------------------
    def _add_text(self, piece: str) -> list[Chunk]:
        """The latest attempt says ``piece`` more: send what it adds, or send the message again.

        Costs the piece's length, not the text's: an attempt in step with what is
        shown sends the piece as it is; one that repeats shown text is compared
        with it in place.
        """
        start = self._current_len
        self._current_len += len(piece)
        if start == self._shown_len:
            return self._send(piece)
        shown = self._joined()
        overlap = min(len(piece), self._shown_len - start)
        if not shown.startswith(piece[:overlap], start):
            return self._rewrite(shown[:start] + piece)
        return self._send(piece[overlap:])  # a new attempt repeating what is shown sends only what goes further

    def _sync_text(self, target: str, *, final: bool = False) -> list[Chunk]:
        """Bring the open text part to ``target``: send what it adds, or send the message again.

        ``final``: ``target`` is the committed text, after which nothing comes: shown text it does not
        hold all of (an abandoned attempt that said more) is taken back.
        """
        shown = self._joined()
        if target.startswith(shown):
            return self._send(target[len(shown):])
        if shown.startswith(target) and not final:
            return []  # a new attempt repeating what is shown: wait until it says more
        return self._rewrite(target)

    def _send(self, extra: str) -> list[Chunk]:
        if not extra:
            return []
        out = [] if self._text_id is not None else self._emit(self._text_start())
        self._shown.append(extra)
        self._shown_len += len(extra)
        self._shown_text = None
        return out + self._emit({"type": "text-delta", "id": self._text_id, "delta": extra})

    def _joined(self) -> str:
        if self._shown_text is None:
            self._shown_text = "".join(self._shown)
            self._shown = [self._shown_text]
        return self._shown_text

    def _show(self, text: str) -> None:
        self._shown, self._shown_len, self._shown_text = ([text] if text else []), len(text), text

    def _text_start(self) -> Chunk:
        # Made of what a replay of the same parts rebuilds (no count of chunks sent): a client resuming
        # from a cursor inside the part gets the ids its own text-start used.
        self._text_id = f"{self._base}-t{self._turn}-{self._resets}"
        return {"type": "text-start", "id": self._text_id}

    def _rewrite(self, target: str) -> list[Chunk]:
        old = self._text_id
        self._log = [c for c in self._log if c.get("id") != old]
        self._resets += 1
        self.message_id = f"{self._base}-r{self._resets}"
        self._text_id = None
        self._show("")
        if target:
            self._emit(self._text_start())
            self._emit({"type": "text-delta", "id": self._text_id, "delta": target})
            self._show(target)
        return [{"type": "start", "messageId": self.message_id}, *self._log]

    # --- approvals ---------------------------------------------------------------------------
    def _ask(self, part: Event) -> list[Chunk]:
        """The calls ``part`` (``approval_requested``) waits on, each as a tool part awaiting approval.

        The text part ends first, whether or not the message does: the client that
        gets this part as its last ends it, and the response the run goes on in
        must find it in the same state.
        """
        # The model's answer is journaled before a call waits: the latest attempt's text is the turn's.
        out = self._sync_text("".join(self._held)) if self.hold_text and self._held else []
        self._held = []
        if self._text_id is not None:
            out += self._emit({"type": "text-end", "id": self._text_id})
            self._text_id = None
        for call in part.data.get("calls") or []:
            call_id = str(call.get("call_id", "")) if isinstance(call, dict) else ""
            if not call_id or call_id in self._asked:
                continue
            self._asked.add(call_id)
            out += self._emit({"type": "tool-input-available", "toolCallId": call_id, "toolName": str(call.get("tool")),
                               "input": _arguments(call.get("arguments"))},
                              {"type": "tool-approval-request", "toolCallId": call_id, "approvalId": call_id})
        return out

    # --- a committed turn --------------------------------------------------------------------
    def _commit(self, part: Event) -> list[Chunk]:
        self._done_turn = max(self._done_turn, int(part.turn or 0))
        span = part.data.get("messages")
        start, stop = (int(span[0]), int(span[1])) if isinstance(span, list) and len(span) == 2 else (0, 0)
        committed = self._messages(start, stop) if stop > start else []
        out = [] if part.turn == self._turn else self._open_step(int(part.turn or 0))
        assistants = [m for m in committed if m.get("role") == "assistant"]
        text = "".join(_text_of(m) for m in assistants)
        self.whole = bool(text) and not self.hold_text and self._text_id is None and not self._shown_len
        out += self._sync_text(text, final=True)
        if self._text_id is not None:
            out += self._emit({"type": "text-end", "id": self._text_id})
            self._text_id = None
        out += self._emit(*_tool_chunks(assistants, committed, self._asked, self._denied))
        self._end_step()
        return out + self._emit({"type": "finish-step"})


def _text_of(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: only the text ones are shown as text
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _tool_chunks(assistants: list[Message], committed: list[Message], asked: set[str],
                 denied: set[str]) -> list[Chunk]:
    """A turn's tool calls (``tool-input-available``) and the results it committed (``tool-output-available``).

    A call already sent as awaiting approval is not sent again (that would take its approval away); a
    rejected call is ``tool-output-denied``.
    """
    out: list[Chunk] = []
    called: set[str] = set()
    for message in assistants:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            call_id, name = str(call.get("id", "")), str(function.get("name", ""))
            called.add(call_id)
            if call_id in asked:
                continue
            out.append({"type": "tool-input-available", "toolCallId": call_id, "toolName": name,
                        "input": _arguments(function.get("arguments"))})
    for message in committed:
        call_id = str(message.get("tool_call_id", ""))
        if message.get("role") == "tool" and call_id in called:
            out.append({"type": "tool-output-denied", "toolCallId": call_id} if call_id in denied else
                       {"type": "tool-output-available", "toolCallId": call_id, "output": message.get("content")})
    return out


def _arguments(raw: Any) -> Any:
    """Tool arguments as the model gave them: a JSON string parsed, or kept as it is when it does not parse."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def latest_attempts(run: list[Event]) -> list[Event]:
    """``run``'s parts without the text of attempts that a later attempt of the same turn contradicts.

    Per turn, the latest attempt that sent text decides: an earlier attempt whose text it repeats or
    goes on from (an attempt that reuses a journaled answer, after an approval or a crash, says the
    same again) stays, and the encoder sends only what goes further; one that said something else
    is dropped, so the replay never has to take text back. While the turn runs, an earlier attempt
    that said more than the latest has so far stays too (the latest may say it all again); once the
    turn committed, its latest attempt said all it will, and one that said more is dropped.
    """
    said: dict[tuple[int, str], list[str]] = {}
    latest: dict[int, str] = {}
    committed: set[int] = set()
    late: set[int] = set()  # parts of a fenced-off worker, for a turn already committed (the encoder skips them)
    for i, part in enumerate(run):
        if part.type == "text_delta" and part.turn is not None:
            if part.turn <= max(committed, default=0):
                late.add(i)
                continue
            attempt = str(part.data.get("attempt"))
            said.setdefault((part.turn, attempt), []).append(str(part.data.get("text", "")))
            latest[part.turn] = attempt
        elif part.type == "turn_committed" and part.turn is not None:
            committed.add(part.turn)
    final = {turn: "".join(said[(turn, attempt)]) for turn, attempt in latest.items()}
    dropped = set()
    for (turn, attempt), pieces in said.items():
        text = "".join(pieces)
        if not (final[turn].startswith(text) or (turn not in committed and text.startswith(final[turn]))):
            dropped.add((turn, attempt))
    if not dropped and not late:
        return run
    return [p for i, p in enumerate(run) if i not in late and (
        p.type != "text_delta" or p.turn is None or (p.turn, str(p.data.get("attempt"))) not in dropped)]

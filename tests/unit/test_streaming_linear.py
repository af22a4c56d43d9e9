"""Issue 30: streaming a long answer costs work linear in its length (the live stream's sink, the AI SDK encoder).

Measured as work, never as time: every piece of text is a :class:`Counted`
string, which adds the length of each string built by concatenating it (and
keeps counting through ``str()`` and further concatenation). Text kept as one
string grown per piece copies the whole text again at every piece: ~500 MB
built for a 1 MB answer. Kept as pieces and joined once, nothing is built by
concatenation at all.
"""

from __future__ import annotations

from typing import Any

from phases.streaming import DeltaSink
from pipelines.engine.models import Event
from pipelines.web.aisdk import UIMessageEncoder

MB = 1_000_000


class Counted(str):
    """A piece of model text that counts the characters of every string built by ``+`` from it."""

    built = 0

    def __str__(self) -> str:
        return self  # str(piece) keeps the counting piece, as str() keeps a str

    def __add__(self, other: object) -> Any:
        result = str.__add__(self, other)  # type: ignore[operator]
        return result if result is NotImplemented else Counted._count(result)

    def __radd__(self, other: object) -> Any:
        if not isinstance(other, str):
            return NotImplemented
        return Counted._count(str.__add__(other, self))

    @staticmethod
    def _count(text: str) -> Counted:
        Counted.built += len(text)
        return Counted(text)


def pieces(total: int, size: int, tag: str = "") -> list[Counted]:
    text = ("The order A-1 shipped yesterday; it arrives within two days. " * (total // 60 + 1))[:total]
    return [Counted(tag + text[i:i + size]) for i in range(0, total, size)]


class _Ctx:
    attempt_id = "a1"
    job_id = "j"

    def __init__(self) -> None:
        self.published: list[str] = []

    def part(self, type_: str, *, turn: int | None = None, **data: Any) -> Any:
        return type_, data.get("text", "")

    def publish_parts(self, parts: list[Any]) -> None:
        self.published.extend(text for kind, text in parts if kind == "text_delta")


def test_the_delta_sink_builds_no_text_per_piece_for_a_1_mb_answer() -> None:
    ctx = _Ctx()
    sink = DeltaSink(ctx, 1)  # type: ignore[arg-type]
    text = pieces(MB, 100)
    Counted.built = 0
    for piece in text:
        sink(piece)
    full = "".join(text)
    sink.finish(full + "!")  # the tail the model did not stream goes out at the end
    assert "".join(ctx.published) == full + "!"
    assert Counted.built <= 2 * MB, f"{Counted.built:,} characters built for a {MB:,}-character answer"


def delta(i: int, text: str, attempt: str = "a1") -> Event:
    return Event(id=str(i), timestamp=0.0, type="text_delta", turn=1, data={"text": text, "attempt": attempt})


def started(i: int, attempt: str) -> Event:
    return Event(id=str(i), timestamp=0.0, type="attempt_started", turn=1, data={"attempt": attempt})


def test_the_ai_sdk_encoder_builds_no_text_per_delta_for_a_1_mb_answer_and_a_retried_attempt() -> None:
    encoder = UIMessageEncoder("j", lambda start, stop: [])
    first = pieces(MB, 1000)
    again = [*pieces(MB, 1000), Counted(" More.")]  # a retried attempt: the same text, then further
    Counted.built = 0
    chunks = encoder.feed(Event(id="0", timestamp=0.0, type="job_started"))
    chunks += encoder.feed(started(1, "a1"))
    for i, piece in enumerate(first):
        chunks += encoder.feed(delta(i + 2, piece))
    chunks += encoder.feed(started(len(first) + 2, "a2"))
    for i, piece in enumerate(again):
        chunks += encoder.feed(delta(len(first) + 3 + i, piece, "a2"))
    shown = [c["delta"] for c in chunks if c["type"] == "text-delta"]
    assert "".join(shown) == "".join(first) + " More."  # the repeat sent nothing, only what goes further
    assert not [c for c in chunks if c["type"] == "start"][1:]  # no message sent again
    assert Counted.built <= 2 * MB, f"{Counted.built:,} characters built for a {MB:,}-character answer"

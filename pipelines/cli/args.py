"""The ``pipelines`` command line's bounds and escaping: numbers checked before use, model text made safe to print.

Every whole number a person types is checked by argparse with one of the
types here, so ``--limit -5`` or ``--port 70000`` ends at once with
``error: argument --limit: ...`` (exit 2) and nothing done, instead of a
listing that silently drops its last five rows or a server that fails deep
inside uvicorn. Every text from a model, a tool or a job printed for a person
goes through :func:`printable`: an escape sequence in a model's answer must
not move the cursor, rewrite earlier lines or retitle the terminal.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

__all__ = ["MAX_LIMIT", "count", "json_printable", "non_negative", "port", "printable"]

MAX_LIMIT = 1_000_000
"""The most rows one command reads (``--limit``): a bound a backend's range query takes as it is."""

# Cc: C0 controls, DEL and C1 controls (0x9b is an 8-bit CSI, as good as ESC [). Newline and tab
# are what text is made of; a carriage return is not kept, since it overwrites the line it ends.
# Then the bidi controls (embeddings, overrides, isolates, marks): a terminal that reorders text shows
# a tool's arguments or a log line in another order than they are ("Trojan Source"). Joiners and other
# invisible characters are left: emoji and some scripts are made with them.
_C1_AND_BIDI = "\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # a character class's ranges
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f{_C1_AND_BIDI}]")


def _shown(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab, and every bidi control, shown as an escape
    (``\\x1b``, ``\\u202e``), not sent to the terminal."""
    return _CONTROL.sub(lambda m: _shown(m.group()), text)


# In JSON text: the characters JSON leaves raw that a terminal obeys (C1 controls) or reorders by (bidi
# controls), and the line separators; written as \uXXXX escapes, the text is the same JSON value.
_JSON_RAW = re.compile(f"[{_C1_AND_BIDI}\u2028\u2029]")


def json_printable(text: str) -> str:
    """JSON ``text`` (as ``json.dumps(..., ensure_ascii=False)`` writes it) with what :func:`printable` escapes,
    and the line separators, as ``\\uXXXX``: the same JSON value, safe on a terminal, other text kept as it is."""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _whole(low: int, high: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r:.40}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} must be between {low} and {high}, got {value}")
        return value
    parse.__name__ = what.split()[0]  # argparse names the type in its own messages
    return parse


count = _whole(1, MAX_LIMIT, "a count")
"""``--limit``: a whole number from 1 to :data:`MAX_LIMIT`."""
port = _whole(1, 65535, "a TCP port")
"""``--port``: a whole number from 1 to 65535."""
non_negative = _whole(0, MAX_LIMIT, "a number")
"""A whole number from 0 to :data:`MAX_LIMIT` (``--background-every``, ``--at-turn``)."""

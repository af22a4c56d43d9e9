"""How the page shows text a model or a caller wrote: every invisible or reordering character made visible.

A bidi override (U+202E) can make ``{"to": "alice", "amount": 5}`` read as
something else on screen; a zero-width space can hide a second word in a name.
What a person approves must display as it is, so :func:`visible` replaces each
such character with a marked ``<U+202E>`` token (escaped, in a ``span.invisible``).
"""

from __future__ import annotations

import unicodedata

from markupsafe import Markup, escape

__all__ = ["hidden_chars", "visible", "visible_plain"]

_ALWAYS = frozenset(
    [*range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x2070), 0x2028, 0x2029, 0xFEFF, 0x061C,
     0x115F, 0x1160, 0x3164, 0xFFA0, 0x180E, 0x00AD, 0x034F, *range(0xFFF9, 0xFFFC)]
)


def _hidden(ch: str) -> bool:
    code = ord(ch)
    if code in _ALWAYS:
        return True
    if ch in "\n\t":
        return False
    # Other format (Cf) and control (Cc) characters, and the tag block (U+E0000..), which renders as nothing.
    return unicodedata.category(ch) in ("Cf", "Cc", "Co") or 0xE0000 <= code <= 0xE007F


def hidden_chars(text: str) -> list[str]:
    """The characters of ``text`` that :func:`visible` marks, as ``U+XXXX`` names, in order."""
    return [f"U+{ord(ch):04X}" for ch in text if _hidden(ch)]


def visible(value: object) -> Markup:
    """``value`` as escaped HTML with each invisible or bidi-control character shown as ``<U+XXXX>``."""
    text = "" if value is None else str(value)
    out: list[str] = []
    plain: list[str] = []
    for ch in text:
        if _hidden(ch):
            if plain:
                out.append(str(escape("".join(plain))))
                plain = []
            out.append(f'<span class="invisible" title="an invisible character">&lt;U+{ord(ch):04X}&gt;</span>')
        else:
            plain.append(ch)
    if plain:
        out.append(str(escape("".join(plain))))
    return Markup("".join(out))


def visible_plain(value: object) -> str:
    """``value`` as plain text with each character :func:`visible` marks written ``<U+XXXX>``: for an attribute
    (a ``title``), which holds no markup; the template escapes it."""
    text = "" if value is None else str(value)
    return "".join(f"<U+{ord(ch):04X}>" if _hidden(ch) else ch for ch in text)

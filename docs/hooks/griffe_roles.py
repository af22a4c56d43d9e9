"""A griffe extension: the docstrings' Sphinx roles become cross-references in the built reference.

The library's docstrings say :class:`App`, :func:`~pipelines.engine.errors.bound_retry_after`,
:mod:`pipelines.worker` and the like (Sphinx's roles, read fine in an editor). mkdocstrings renders
Markdown, where a role would show raw. After griffe has read a package, each role is replaced
with an ``<autoref identifier="..." optional>`` element around the name in code: mkdocs-autorefs
turns it into a link when the object is documented on some page, and into plain code (no warning)
when it is not. Names are resolved from the docstring's own scope (its module's imports, its
class's members), as Sphinx would; ``~`` keeps only the last part as the title, and
``Title <target>`` sets it. Static, like the rest of the build: nothing is imported.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|mod|meth|data|attr|exc|obj|const):`([^`]+)`")
"""A Sphinx role in a docstring: ``:class:`X```, ``:py:func:`~a.b.c```, ``:meth:`title <X.y>```."""


def _target(obj: griffe.Object, name: str) -> str:
    """The full path ``name`` refers to from ``obj``'s scope, or ``name`` itself when it cannot be resolved."""
    name = name.lstrip(".")
    head, _, rest = name.partition(".")
    try:
        path = obj.resolve(head)
    except Exception:  # noqa: BLE001 - not in scope (a dotted full path, or a name Sphinx would not find either)
        return name
    return f"{path}.{rest}" if rest else path


def _replace(obj: griffe.Object, match: re.Match[str]) -> str:
    text = match.group(1).strip()
    explicit = re.fullmatch(r"(.+?)\s*<([^<>]+)>", text)
    if explicit:
        title, name = explicit.group(1), explicit.group(2)
    else:
        name = text
        title = text[1:].rsplit(".", 1)[-1] if text.startswith("~") else text
    name = name.lstrip("~")
    identifier = _target(obj, name)
    return f'<autoref identifier="{escape(identifier)}" optional><code>{escape(title)}</code></autoref>'


def convert(obj: griffe.Object, text: str) -> str:
    """``text`` with every Sphinx role replaced by an optional cross-reference resolved from ``obj``."""
    return ROLE.sub(lambda m: _replace(obj, m), text)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring of a package once griffe has loaded it."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        todo: list[griffe.Object] = [pkg]
        while todo:  # a loop over the tree, not a recursion
            obj = todo.pop()
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = convert(obj, obj.docstring.value)
            todo.extend(member for member in obj.members.values() if not member.is_alias)

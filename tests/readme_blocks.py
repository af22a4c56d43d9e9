"""The README's code blocks, as the tests that run them see them.

Each fenced block has its language, the README section it sits in and its text. A Python block whose
first line is a ``# path/to/file.py`` comment is a file the reader saves (``myapp/agents.py``); the others
are programs to run. Shell blocks of ``make`` commands are the repository's own commands (``make test``
runs the suite itself): they are not run by the README tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README."""

    lang: str
    section: str
    text: str

    @property
    def file(self) -> str | None:
        """The path a ``# path.py`` first line names (a file to save, not a program), else None."""
        first = self.text.splitlines()[0] if self.text else ""
        match = re.fullmatch(r"# ([\w/]+\.py)", first.strip())
        return match.group(1) if match else None

    @property
    def is_make(self) -> bool:
        """A shell block of ``make`` commands only."""
        lines = [line for line in self.text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        return self.lang in ("sh", "bash", "shell") and all(line.startswith("make ") for line in lines)

    def commands(self) -> list[str]:
        """A shell block's commands, one a line, without their trailing comments."""
        found = []
        for line in self.text.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                found.append(command)
        return found


def blocks(path: Path = README) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    section, found, lang, lines = "", [], None, []
    for line in path.read_text().splitlines():
        if lang is None and line.startswith("## "):
            section = line[3:].strip()
        elif lang is None and line.startswith("```"):
            lang, lines = line[3:].strip(), []
        elif lang is not None and line.startswith("```"):
            found.append(Block(lang, section, "\n".join(lines) + "\n"))
            lang = None
        elif lang is not None:
            lines.append(line)
    return found

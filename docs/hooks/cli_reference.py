"""The ``pipelines`` command's reference page, written from its argparse parsers at build time.

``python docs/hooks/cli_reference.py`` prints the page's generated part: for each command, its
one-line description and ``pipelines <command> --help`` exactly as the command prints it (80
columns). The mkdocs hook :func:`on_page_markdown` puts that output where
``docs/reference/cli.md`` holds the marker; it runs the script in a child process, so building the
docs still imports nothing of the library (``tests/unit/test_docs.py`` checks it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- the commands, generated from pipelines.cli.build_parser() -->"
ROOT = Path(__file__).resolve().parents[2]


def render() -> str:
    """Markdown for every command of ``pipelines``, in the parser's order."""
    from pipelines.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = ["```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in commands.choices.items():
        parts += [f"## pipelines {name}", "", sub.description or "", "", "```text", sub.format_help().rstrip(),
                  "```", ""]
    return "\n".join(parts)


def generate() -> str:
    """:func:`render`'s output, from a child process (the docs build itself imports nothing of the library)."""
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve())], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the CLI reference could not be generated: {out.stderr.strip()[-2000:]}")
    return out.stdout


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """mkdocs hook: fill the CLI reference page's marker with the generated commands."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, generate())


if __name__ == "__main__":
    os.environ["COLUMNS"] = "80"  # argparse wraps help to this width: the page is the same on every terminal
    sys.stdout.write(render())

"""``pipelines health``: the checks of :mod:`pipelines.health`, printed, with exit code 0 healthy and 1 not.

Registered by :func:`pipelines.cli.build_parser`; see that module for the
common ``--app`` option and exit codes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, TextIO

from pipelines.health import check

if TYPE_CHECKING:
    from pipelines.app import App

__all__ = ["register"]

AddCommand = Callable[[str, Callable[[argparse.Namespace, TextIO], int], str], argparse.ArgumentParser]


def register(add: AddCommand, load: Callable[[str | None], App], seconds: Callable[[str], float]) -> None:
    """Add ``pipelines health`` to the command line."""

    def cmd_health(args: argparse.Namespace, out: TextIO) -> int:
        started = time.monotonic()
        checks = check(load(args.app), max_overdue=args.max_overdue)
        if args.json:
            print(json.dumps({"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks],
                              "seconds": round(time.monotonic() - started, 3)}), file=out)
        else:
            for c in checks:
                print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<9} {c.detail}", file=out)
        return 0 if all(c.ok for c in checks) else 1

    p = add("health", cmd_health, "check storage, the due backlog and the workers (exit 0 healthy, 1 not)")
    p.add_argument("--max-overdue", type=seconds, default=60.0,
                   help="a job overdue longer than this is unhealthy (default: 60)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")

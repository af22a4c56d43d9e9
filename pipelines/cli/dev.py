"""``pipelines dev`` (one process: local workers, the sweep and the web page on an SQLite file) and
``pipelines migrate`` (upgrade the schema of an app's SQLite file), and ``pipelines ui`` (the web page alone).

Registered by :func:`pipelines.cli.build_parser`; see that module for the
common ``--app`` option and exit codes.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from pipelines.cli import loading
from pipelines.cli.args import count, port
from pipelines.errors import ConfigurationError

if TYPE_CHECKING:
    from pipelines.app import App

__all__ = ["add_token_options", "cmd_ui", "register", "ui_token"]

AddCommand = Callable[[str, Callable[[argparse.Namespace, TextIO], int], str], argparse.ArgumentParser]
LoadApp = Callable[[str | None], "App"]


def _serve(app: App, args: argparse.Namespace, out: TextIO) -> None:
    """Start the workers, print the summary, serve the web page until stopped; the workers stop with it."""
    try:
        import uvicorn

        from pipelines.web.ui import ui_app
    except ImportError as exc:
        raise ConfigurationError(f"pipelines dev serves the web page, which needs the web extra: "
                                 f"pip install 'phaserunner[web]' ({exc})") from exc
    from pipelines.dev import summary

    asgi = ui_app(app, token=ui_token(args))
    host = f"[{args.host}]" if ":" in args.host else args.host
    _check_free(args.host, args.port)  # before any worker starts or "serving" is said
    # The summary reads the file before any worker starts: one that needs `pipelines migrate` (or is not this
    # library's) ends the command with its one-line error, not worker threads' tracebacks before it.
    said = summary(app, source=args.app or os.environ.get("PIPELINES_APP", "-"), url=f"http://{host}:{args.port}/")
    scheduler = app.scheduler
    scheduler.start()  # type: ignore[attr-defined]
    try:
        print(said, file=out, flush=True)
        uvicorn.run(asgi, host=args.host, port=args.port, log_level="warning")
    finally:
        scheduler.stop()  # type: ignore[attr-defined]


TOKEN_ENV = "PIPELINES_UI_TOKEN"


def add_token_options(p: argparse.ArgumentParser) -> None:
    """``--token-file`` (and ``--token``, refused: a token on the command line shows in ``ps`` and shell history)."""
    p.add_argument("--token-file", metavar="PATH",
                   help=f"require the token in this file to log in (default: ${TOKEN_ENV})")
    p.add_argument("--token", help=argparse.SUPPRESS)


def ui_token(args: argparse.Namespace) -> str | None:
    """The web page's token: from ``--token-file`` or ``$PIPELINES_UI_TOKEN``; ``--token VALUE`` is refused."""
    if args.token is not None:
        raise ConfigurationError(f"--token puts the token on the command line, where ps and shell history show it: "
                                 f"set {TOKEN_ENV} in the environment or pass --token-file PATH")
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ConfigurationError(f"cannot read the token file {args.token_file!r}: {exc.strerror}") from exc
        if not token:
            raise ConfigurationError(f"the token file {args.token_file!r} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


def register(add: AddCommand, load: LoadApp) -> None:
    """Add ``pipelines dev`` and ``pipelines migrate``."""

    def cmd_dev(args: argparse.Namespace, out: TextIO) -> int:
        from pipelines.dev import DEFAULT_DB, dev_app
        from pipelines.web.ui import check_bind

        check_bind(args.host, ui_token(args))
        app = dev_app(load(args.app), db=args.db, workers=args.workers)
        if args.db is None and app.storage_path == os.path.abspath(DEFAULT_DB):
            os.makedirs(os.path.dirname(DEFAULT_DB), exist_ok=True)
        _serve(app, args, out)
        return 0

    def cmd_migrate(args: argparse.Namespace, out: TextIO) -> int:
        app = load(args.app)
        where = app.storage_path or ""
        if where and not os.path.isfile(where):  # a mistyped path would become a new, empty database
            raise ConfigurationError(f"{where} does not exist (or is not a file): nothing to migrate. Is the path "
                                     "right? A new file needs no migration: the first process makes it")
        before, after = app.migrate_storage()
        if before == after:
            print(f"{where}: schema already at version {after}; nothing to do", file=out)
        else:
            print(f"{where}: schema upgraded from version {before} to {after}", file=out)
        return 0

    p = add("dev", cmd_dev, "run the app in one process on an SQLite file: local workers, the sweep and the web page")
    p.add_argument("--db", help="the SQLite file (default: the app's own, else .phaserunner/dev.db)")
    p.add_argument("--workers", type=count, default=4, help="worker threads (default: 4)")
    p.add_argument("--host", default="127.0.0.1", help="address of the web page (default: 127.0.0.1)")
    p.add_argument("--port", type=port, default=8008, help="port of the web page, 1-65535 (default: 8008)")
    add_token_options(p)
    add("migrate", cmd_migrate, "upgrade the schema of the app's SQLite file to this version (stop workers first)")


def cmd_ui(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the web page (pipelines.web.ui); a non-loopback host needs a token."""
    try:
        import uvicorn

        from pipelines.web.ui import check_bind, ui_app
    except ImportError as exc:
        raise ConfigurationError(f"the web page needs the web extra: pip install 'phaserunner[web]' ({exc})") from exc
    token = ui_token(args)
    check_bind(args.host, token)  # before loading anything: an unsafe address is refused at once
    asgi = ui_app(loading.load(args.app), token=token, read_only=args.read_only)
    host = f"[{args.host}]" if ":" in args.host else args.host
    _check_free(args.host, args.port)  # not "serving" on a port another process holds
    print(f"serving the web page on http://{host}:{args.port}/{' (read-only)' if args.read_only else ''}",
          file=out, flush=True)
    uvicorn.run(asgi, host=args.host, port=args.port, log_level="warning")
    return 0


def _check_free(host: str, port: int) -> None:
    """:class:`ConfigurationError` naming the address when another process listens there (a test bind)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is no bar
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigurationError(f"cannot serve the web page on {host}:{port}: {exc.strerror or exc}") from None

"""Seeing every command a ``RedisStorage`` sends, whichever way it goes (tests that count or read them).

A storage's commands go through its client's ``execute_command``, except the turn's three functions,
which go on a connection each thread keeps (``adapters/redis/held.py``), and a journal write whose reply
is read later, with the commit sent right behind it (``adapters/redis/deferred.py``, ``Deferred.write``):
a test that watches only the client would miss them. The spy sees a command when it goes, the same
way for all three (a deferred one's ``send`` returns nothing: its reply is read later).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["spy_commands"]


def spy_commands(storage: Any, spy: Callable[..., Any]) -> None:
    """Route every command ``storage`` sends through ``spy(send, *args)``, which sends it with ``send(*args)``."""
    inner = storage.client.execute_command

    def through_client(*args: Any, **options: Any) -> Any:
        return spy(lambda *a: inner(*a, **options), *args)

    storage.client.execute_command = through_client
    held = storage.conn._held
    if held is not None:
        call = held.call

        def on_kept_connection(client: Any, command: Any) -> Any:
            return spy(lambda *a: call(client, a), *command)

        held.call = on_kept_connection
    deferred = storage.conn._deferred
    write = deferred.write

    def unanswered(conn: Any, command: Any, **options: Any) -> None:
        spy(lambda *a: write(conn, a, **options), *command)

    deferred.write = unanswered

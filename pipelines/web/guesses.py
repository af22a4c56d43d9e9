"""Failed logins counted per client address: a token cannot be guessed at the speed of the server.

Each address has a budget of :data:`GUESS_BURST` wrong tokens (the login
form's and ``Authorization: Bearer``'s alike), refilled by one every
:data:`GUESS_REFILL_SECONDS`. An address whose budget is spent gets 429 with
``Retry-After`` for every login it tries, right or wrong, until one comes
back: answering a right token meanwhile would tell a guesser it was right.

Behind a reverse proxy every client has the proxy's address, so a flood of
wrong tokens keeps everyone from logging in until it stops (sessions already
open keep working). That is the price of not trusting ``X-Forwarded-For``,
which any client can write.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["GUESS_BURST", "GUESS_REFILL_SECONDS", "MAX_GUESSERS", "Guesses"]

GUESS_BURST = 10
"""Wrong tokens an address may send at once (a person's typos pass unnoticed)."""
GUESS_REFILL_SECONDS = 6.0
"""One more wrong token comes back this often: ten a minute, where the form took ~900 a second."""
MAX_GUESSERS = 10_000
"""Addresses remembered at most (the least recently wrong is forgotten): a flood from many addresses
cannot grow memory without bound."""


class Guesses:
    """Each address's budget of wrong tokens (thread-safe; in this process, as sessions are)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._spent: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (level, when)
        self._lock = threading.Lock()

    def wait(self, address: str) -> int:
        """Whole seconds until ``address`` may try a token again; 0: it may now."""
        with self._lock:
            level = self._level(address)
        over = level - (GUESS_BURST - 1)  # one more wrong token must fit in the budget
        return 0 if over <= 0 else max(1, math.ceil(over * GUESS_REFILL_SECONDS))

    def wrong(self, address: str) -> None:
        """Count a wrong token from ``address``."""
        with self._lock:
            level = self._level(address) + 1
            self._spent[address] = (level, self._clock())
            self._spent.move_to_end(address)
            while len(self._spent) > MAX_GUESSERS:
                self._spent.popitem(last=False)

    def _level(self, address: str) -> float:
        # Under the lock: the wrong tokens still counted against ``address`` now.
        level, when = self._spent.get(address, (0.0, 0.0))
        return max(0.0, level - (self._clock() - when) / GUESS_REFILL_SECONDS)

"""The turn's three scripts (and a finished job's archive) as one Redis function library, called by name.

(Not :mod:`adapters.redis.scripts.functions`, the Lua helpers several scripts share.)

A W1 turn runs LOAD, RECORD_STEP (twice: the model's answer, the tool's result) and COMMIT. By
``EVALSHA`` each call names its script by a 40-character SHA-1: ~190 of the ~2,200 bytes a turn sent
to Redis (bench/README.md, figure 4a). Redis 7 keeps *functions* too (``FUNCTION LOAD``, ``FCALL``):
the same Lua, registered under a name the library chooses. :data:`LIBRARY` registers the three scripts
as ``pr<6 hex>l``, ``pr<6 hex>s`` and ``pr<6 hex>c`` (and ARCHIVE, which the worker that finishes a job runs
right after its commit, as ``pr<6 hex>a``), the hex from the library's own code, so two
versions of this package on one server (a rolling deploy) each have their own library and never run
the other's code. ``FCALL`` also costs the server a little less than ``EVALSHA`` (a name looked up,
no SHA parsed: 0.66 against 0.73 µs a call measured with redis-benchmark on this machine).

Lifecycle (:class:`Library`):

* before its first call on a server (the storage's client, or a Cluster node's), a process calls the
  library's function ``v``, which answers the full SHA-1 of the library's code: this version's, and
  the server is checked; ``Function not found``, and it loads the library (``FUNCTION LOAD``); another
  SHA-1 (a library of that name from another version: 6 hex digits clash once in 16 million pairs of
  versions), and it turns functions off, so it never runs another version's Lua. One small round trip
  a process and server: ``pipelines worker`` makes it before it forks work-horses, which inherit it.
* a call answered ``Function not found`` later (a restart without persistence, ``FUNCTION FLUSH``, a
  failover to a server that never had it) did not run: the library is loaded there and the call made
  again. Calls are idempotent anyway (tokens, owner checks).
* ``Library already exists`` when loading (another process loaded it meanwhile) is checked with ``v``.
* any other answer to ``v`` or ``FUNCTION LOAD`` but a passing one (``LOADING``, ``BUSY``, ``OOM``,
  ``READONLY``, ``MASTERDOWN``, ``TRYAGAIN``, ``CLUSTERDOWN``: raised, as the call itself would be) turns
  functions off: a server without them (Redis before 7, Dragonfly, a proxy that does not pass them,
  whatever each answers), a user not allowed ``FCALL`` or ``FUNCTION LOAD``. The calls then go by
  ``EVALSHA`` as before, for the life of the process, and a warning in the log says why.

Reads go by ``EVALSHA`` always (:meth:`RedisConnection.run <adapters.redis.connection.RedisConnection.run>`,
``write=False``): Redis refuses a function that may write (all of them but ``v``) before it starts
when the server is out of memory (``maxmemory``) or a read-only replica, where a script is refused only
at its first write. So a page, a listing or the sweep reads a job whatever the server's memory, as before.
A running call is stopped with ``FUNCTION KILL``, not ``SCRIPT KILL`` (these calls last microseconds).

Functions persist with the dataset (RDB, AOF) and replicate, unlike the script cache: a version whose
scripts changed leaves its library behind on the server (~17 KB; ``FUNCTION LIST LIBRARYNAME
'phaserunner_*'`` lists them; :func:`prune` (``pipelines prune-functions``) deletes every one but this
version's: safe while an older version still runs, whose processes load theirs again where they call it).
"""

from __future__ import annotations

import hashlib
import logging
import re
import weakref
from collections.abc import Sequence
from functools import partial
from typing import Any, Final, NamedTuple

import redis

from adapters.redis.held import Held
from adapters.redis.scripts import ARCHIVE, COMMIT, LOAD, RECORD_STEP
from adapters.redis.values import _text

__all__ = ["LIBRARY", "Hot", "Library", "LibrarySpec", "library_code", "prune"]

_log = logging.getLogger(__name__)

# Errors that say the server is not ready now, not that it cannot have functions: raised as the call's own
# (redis-py maps each but BUSY to a class of its own, its code taken off the message).
_PASSING: Final = (redis.exceptions.BusyLoadingError, redis.exceptions.OutOfMemoryError,
                   redis.exceptions.ReadOnlyError, redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)
# "unknown command 'FCALL'" (Redis 7), "unknown command `FCALL`" (Redis 6, Dragonfly), "no permissions to run
# the 'fcall' command" (ACL). Quoted: a pipeline's error names the command it failed unquoted, whatever failed.
_NO_FCALL: Final = re.compile(r"(unknown command|permissions to run the) [`'\"]fcall[`'\"]", re.IGNORECASE)


class LibrarySpec(NamedTuple):
    """A function library: its name, its code, each role's function name, the SHA-1 function ``v`` answers."""

    name: str
    code: str
    names: dict[str, str]
    digest: str


def library_code(bodies: dict[str, str]) -> LibrarySpec:
    """The library registering each of ``bodies`` (role letter -> script) as a function of its own.

    Beside them, function ``v`` answers the full SHA-1 of the library's code: what a process checks on a
    server before it calls a function there (:meth:`Library.ready`), as the 6 hex digits of the names
    could be another version's. The digest is of the code with its names and digest left out, so it
    covers the wrapping as well as the scripts.
    """
    if "v" in bodies:
        raise ValueError("role 'v' is the library's own check")

    def names_for(digest: str) -> dict[str, str]:
        return {role: f"pr{digest}{role}" for role in [*bodies, "v"]}

    def code_for(digest: str, full: str) -> str:
        names = names_for(digest)
        # A script's KEYS and ARGV are globals; a function's, its callback's arguments. The body is the
        # callback's, unchanged: its top-level locals and returns are a function's as they were a chunk's.
        return f"#!lua name=phaserunner_{digest}\n" + "".join(
            f"redis.register_function('{names[role]}', function(KEYS, ARGV)\n{body}\nend)\n"
            for role, body in sorted(bodies.items())) + (
            f"redis.register_function{{function_name='{names['v']}', callback=function() return '{full}' end, "
            "flags={'no-writes'}}\n")

    full = hashlib.sha1(code_for("", "").encode()).hexdigest()
    digest = full[:6]
    return LibrarySpec(f"phaserunner_{digest}", code_for(digest, full), names_for(digest), full)


#: The turn's three scripts and ARCHIVE (run by the worker that finishes a job, right after its commit), by role
#: letter: the library's name, its code, each role's function name.
LIBRARY: Final = library_code({"a": ARCHIVE, "c": COMMIT, "l": LOAD, "s": RECORD_STEP})


class Library:
    """Whether this process calls the library's functions, and on which servers it checked them (see the module).

    A server is known by its client: the storage's, or on a Cluster each node's. No lock: two threads
    checking or loading at once both succeed ("already exists" is checked as any load), and a lock held
    over a round trip would be inherited held by a process forked meanwhile (an RQ work-horse).
    """

    def __init__(self, spec: LibrarySpec) -> None:
        self.name, self.code = spec.name, spec.code
        self._check, self._full = spec.names["v"], spec.digest
        self.on = True  # until a server says it cannot have them
        self._checked: weakref.WeakSet[Any] = weakref.WeakSet()

    def ready(self, client: Any) -> bool:
        """Whether to call the functions on ``client``'s server: on, and checked there (once per client).

        Raises what a call would for a server not ready now (``LOADING``, ``OOM``..., a lost connection).
        """
        if self.on and client not in self._checked:
            try:
                self._verify(client)
            except redis.exceptions.ResponseError as exc:
                if not _not_found(exc):
                    self._refused(f"FCALL of the library's check answered {exc}", exc)
                    return False
                self.load(client)
            if self.on:
                self._checked.add(client)
        return self.on

    def load(self, client: Any) -> None:
        """Load the library on ``client``'s server, which answered that it has none (or turn functions off)."""
        if not self.on:
            return
        try:
            client.function_load(self.code)
        except redis.exceptions.ResponseError as exc:
            if "already exists" not in str(exc):
                self._refused(f"FUNCTION LOAD answered {exc}", exc)
                return
            try:
                self._verify(client)  # loaded by another process meanwhile: this version's?
            except redis.exceptions.ResponseError as again:
                if not _not_found(again):  # else deleted again meanwhile: the call's retry says what is wrong
                    self._refused(f"FCALL of the library's check answered {again}", again)

    def unknown(self, exc: BaseException) -> bool:
        """Whether ``exc`` (a call's error) says the server has no ``FCALL``, or this user may not run it.

        Functions are then turned off.
        """
        # A pipeline's error quotes the failed command's arguments first: only the server's answer counts.
        said = str(exc).rpartition(" caused error: ")[2]
        if isinstance(exc, redis.exceptions.ResponseError) and _NO_FCALL.search(said):
            self._off(f"FCALL answered {exc}")
            return True
        return False

    def _verify(self, client: Any) -> None:
        if _text(client.fcall(self._check, 0)) != self._full:
            self._off(f"library {self.name} on the server holds other code than this version's")

    def _refused(self, why: str, exc: redis.exceptions.ResponseError) -> None:
        if isinstance(exc, _PASSING) or str(exc).startswith("BUSY "):
            raise exc
        self._off(why)

    def _off(self, why: str) -> None:
        if self.on:
            self.on = False
            _log.warning("Redis functions not used (%s): the turn's scripts run by EVALSHA", why)


class Hot:
    """One of the library's functions, called like a redis-py ``Script`` (``keys``, ``args``, ``client``).

    ``sha`` and ``script`` are the script's, which runs by ``EVALSHA`` once functions are off.
    """

    def __init__(self, script: Any, library: Library, name: str) -> None:
        self.script = script
        self.sha: str = script.sha
        self.library = library
        self.name = name

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None,
                 held: Held | None = None) -> Any:
        """Run it on ``client`` (the one it was registered on by default).

        A pipeline queues it: its caller checks the pipeline's server first (:meth:`Library.ready`).
        ``held``: the ``FCALL`` goes on the connection the calling thread keeps for ``client``
        (:mod:`adapters.redis.held`) instead of one taken from its pool for it.
        """
        client = self.script.registered_client if client is None else client
        if isinstance(client, redis.client.Pipeline):
            if self.library.on:
                return client.fcall(self.name, len(keys), *keys, *args)
        elif self.library.ready(client):
            call = client.fcall if held is None else partial(_held_fcall, held, client)
            try:
                return call(self.name, len(keys), *keys, *args)
            except redis.exceptions.ResponseError as exc:
                if not self.not_run(exc, client):
                    raise
            if self.library.on:
                return call(self.name, len(keys), *keys, *args)
        return self.script(keys=keys, args=args, client=client)

    def not_run(self, exc: BaseException, client: Any) -> bool:
        """Whether ``exc`` (a call's error) says it did not run for want of the function or of functions.

        Then the library is loaded on ``client``'s server, or functions are turned off: call it again.
        """
        if self.library.unknown(exc):
            return True
        if isinstance(exc, redis.exceptions.ResponseError) and _not_found(exc):
            self.library.load(client)
            return True
        return False

    def command(self, keys: Sequence[Any], args: Sequence[Any], client: Any) -> tuple[Any, ...]:
        """The command that runs it on ``client``'s server, for a connection's ``send_command``."""
        if self.library.ready(client):
            return ("FCALL", self.name, len(keys), *keys, *args)
        return ("EVALSHA", self.sha, len(keys), *keys, *args)


def _held_fcall(held: Held, client: Any, *args: Any) -> Any:
    return held.call(client, ("FCALL", *args))


def _not_found(exc: BaseException) -> bool:
    # "Function not found", or a pipeline's "Command # 1 (FCALL ...) of pipeline caused error: Function not found"
    return str(exc).endswith("Function not found")


def prune(client: Any, keep: str = LIBRARY.name) -> list[str]:
    """Delete the libraries :func:`library_code` named on ``client``'s server but ``keep``; those deleted, sorted.

    Only names of that form (``phaserunner_`` and 6 hex digits): any other library is left alone. A
    process of the version whose library goes loads it again at its next call there (``Function not
    found``: the call did not run), so this is safe while one runs; run it once every process runs this
    version, or the older ones load theirs again.
    """
    gone = []
    for lib in client.function_list(library="phaserunner_*") or ():
        pairs = lib.items() if isinstance(lib, dict) else zip(lib[::2], lib[1::2], strict=True)  # RESP3 / RESP2
        name = _text({_text(k): v for k, v in pairs}.get("library_name", ""))
        if _GENERATED.fullmatch(name) and name != keep:
            try:
                client.function_delete(name)
            except redis.exceptions.ResponseError as exc:
                if "not found" not in str(exc).lower():
                    raise
                continue  # deleted meanwhile (another prune): not this one's to report
            gone.append(name)
    return sorted(gone)


_GENERATED: Final = re.compile(r"phaserunner_[0-9a-f]{6}")

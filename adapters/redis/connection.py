"""The Redis connection every part of :class:`~adapters.redis.RedisStorage` shares: client, key layout, scripts.

:class:`RedisConnection` holds the client, the prefix and its key layout
(:mod:`adapters.redis.keys`), the write settings (replicas, failover), and
the Lua scripts registered on the client (:class:`Scripts`); it runs a script
(on a Cluster, on its slot's node, retried through a failover) and turns a
script's ``corrupt:`` reply into :class:`~pipelines.engine.errors.CorruptRecordError`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from adapters.redis import held, library, record_format, scripts
from adapters.redis.client import _FAILOVER_ERRORS, _check_url, _mapped, _redact, driver_info, settle_driver_info
from adapters.redis.deferred import Deferred
from adapters.redis.keys import JobKeys, KeyLayout, check_prefix, index_keys, layout_key
from adapters.redis.scripts import naming
from adapters.redis.values import _KEY_TYPES, _status, _text
from pipelines.engine.errors import ConfigurationError, CorruptRecordError, StorageUnavailableError

__all__ = ["CLUSTER_BUCKETS", "RedisConnection", "Scripts", "connect_url"]

#: The buckets a storage on a Redis Cluster client uses unless told otherwise: enough to spread
#: over a few dozen masters, few enough that walking them all (the sweep, a listing) stays cheap.
CLUSTER_BUCKETS = 64


class Scripts:
    """The storage's Lua scripts (:mod:`adapters.redis.scripts`), registered on one client.

    ``register_script`` runs EVALSHA and reloads the script after ``SCRIPT FLUSH``. The turn's three
    (``load``, ``step``, ``commit``) and ``archive`` are functions of one library where the server has them
    (:mod:`adapters.redis.library`), loaded again after ``FUNCTION FLUSH`` or a restart.
    """

    def __init__(self, client: Any) -> None:
        names = library.LIBRARY.names
        self.library = library.Library(library.LIBRARY)
        self.create = client.register_script(scripts.CREATE)
        self.commit = library.Hot(client.register_script(scripts.COMMIT), self.library, names["c"])
        self.step = library.Hot(client.register_script(scripts.RECORD_STEP), self.library, names["s"])
        self.load = library.Hot(client.register_script(scripts.LOAD), self.library, names["l"])
        self.renew = client.register_script(scripts.RENEW)
        self.release = client.register_script(scripts.RELEASE)
        self.lease_state = client.register_script(scripts.STATE)
        self.delete = client.register_script(scripts.DELETE)
        self.control = client.register_script(scripts.CONTROL)
        self.postpone = client.register_script(scripts.POSTPONE)
        self.publish = client.register_script(scripts.PUBLISH)
        self.send = client.register_script(scripts.SEND)
        self.dropped = client.register_script(scripts.DROPPED)
        self.reindex = client.register_script(scripts.REINDEX)
        self.archive = library.Hot(client.register_script(scripts.ARCHIVE), self.library, names["a"])
        self.events = client.register_script(scripts.EVENTS)
        self.read_live = client.register_script(scripts.READ_LIVE)
        self.upgrade_records = client.register_script(scripts.UPGRADE_RECORDS)


class RedisConnection:
    """The client, the key layout and the scripts, and how a script runs (see the module)."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, *, prefix: str, buckets: int | None,
                 replicas: int, replica_timeout: float, failover_timeout: float) -> None:
        self.client: Any = client  # redis.Redis or redis.RedisCluster: the calls used here are on both
        settle_driver_info(client)  # before a forking worker forks: no horse looks redis-py's version up again
        self.prefix = check_prefix(prefix)
        self.cluster = isinstance(client, redis.RedisCluster)
        if buckets is None:
            buckets = CLUSTER_BUCKETS if self.cluster else 0
        if self.cluster and buckets == 0:
            raise ConfigurationError("a Redis Cluster needs buckets >= 1: the global indexes would be in another "
                                     "slot than the job's keys (CROSSSLOT)")
        self.layout = KeyLayout(self.prefix, buckets)
        self._layout_checked = False
        #: How this storage writes a record (:mod:`adapters.redis.record_format`): what the prefix's layout key
        #: records, known once :meth:`check_layout` ran; 1 (read by every version) until then.
        self.record_format = 1
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ConfigurationError(f"replicas must be an int >= 0, got {replicas!r}")
        for name, value in (("replica_timeout", replica_timeout), ("failover_timeout", failover_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ConfigurationError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        self.replicas = replicas
        self.replica_timeout = float(replica_timeout)
        self.failover_timeout = float(failover_timeout)
        self.scripts = Scripts(client)
        self._deferred = Deferred()
        # The turn's functions go on a connection each thread keeps (adapters.redis.held): a plain Redis only.
        self._held = held.Held() if held.usable(client) else None

    def keys(self, job_id: str) -> JobKeys:
        """The Redis keys of ``job_id`` (validated)."""
        return self.layout.job(job_id)

    def all_keys(self, job_id: str) -> list[str]:
        """Every key of ``job_id``'s COMMIT, CREATE and DELETE, in their order (:data:`naming.COMMIT_KEYS`)."""
        return self.ordered_keys(job_id, naming.COMMIT_KEYS)

    def ordered_keys(self, job_id: str, order: Sequence[str]) -> list[str]:
        """The keys of ``job_id`` a script's KEYS ``order`` names (roles: :mod:`adapters.redis.scripts.naming`)."""
        k, ix = self.keys(job_id), self.layout.indexes_of(job_id)
        listing = dict(zip(scripts.INDEX_ROLES, ix.listing, strict=True))
        indexes = {"due": ix.due, "jobs": ix.jobs, "finished": ix.finished}
        return [listing.get(role) or indexes.get(role) or getattr(k, role) for role in order]

    def script_keys(self, job_id: str, order: tuple[str, ...]) -> list[str]:
        """The KEYS a job's script is sent: without buckets, the record key and the due index's; else every key.

        The script names the rest from those two (:mod:`adapters.redis.scripts.naming`, which says why
        only a layout without buckets).
        """
        if self.layout.buckets:
            return self.ordered_keys(job_id, order)
        record = self.keys(job_id).record
        return [record, self.layout.indexes_of(job_id).due] if naming.short(order) else [record]

    def job_arg(self, job_id: str, keys: Sequence[str]) -> str:
        """``job_id`` as a script's ARGV beside ``keys``: empty when those are the two keys that hold it.

        Sent the record key and the due index's (:meth:`script_keys`, no buckets), a script reads the
        job's id from them (:func:`adapters.redis.scripts.naming.naming_fn`): a UUID's ~40 bytes twice a
        turn (the load and the commit) not sent.
        """
        return "" if len(keys) == 2 and not self.layout.buckets else job_id

    def run(self, script: Any, keys: Sequence[str], args: Sequence[Any], what: str, *, write: bool = True) -> Any:
        """Run one of the Lua scripts: on a plain Redis directly, on a Cluster on the node of its slot.

        On a Cluster a failover makes the slot's master unreachable for a few
        seconds; redis-py retries at once and gives up within milliseconds, so
        the call is retried here with backoff until ``failover_timeout``. Every
        script is idempotent (tokens, owner checks), so re-sending is safe.
        With ``replicas``, the write is followed by ``WAIT`` on the same
        connection: acknowledged means copied to that many replicas, so a
        failover cannot roll it back.
        """
        if self._deferred.waiting():
            sent, reply = self._behind_deferred(script, keys, args, what, write)
            if sent:
                return reply
        if not write and isinstance(script, library.Hot):
            script = script.script  # a read by EVALSHA: a function that may write is refused at maxmemory
        if not self.cluster and (not self.replicas or not write):
            with _mapped(what):
                return self._direct(script, keys, args, write)
        deadline, pause = time.monotonic() + self.failover_timeout, 0.05
        while True:
            try:
                with _mapped(what):
                    try:
                        return self._run_on_node(script, keys, args, what, write)
                    except _FAILOVER_ERRORS:
                        if not self.cluster or time.monotonic() + pause > deadline:
                            raise
                        self.client.nodes_manager.initialize()  # read the new slot map (a replica took over)
            except StorageUnavailableError:
                if not self.cluster or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _kept_for(self, script: Any, write: bool) -> held.Held | None:
        """The ``Held`` whose connections ``script`` goes on (the turn's writes on a plain Redis), else ``None``.

        A finished job's archive goes on the thread's connection only if it keeps one already: a forking
        worker's horse that ran one turn sent it through the pool, and makes none for the archive, its
        last call before it exits.
        """
        if not write or not isinstance(script, library.Hot) or self._held is None:
            return None
        if script is self.scripts.archive and not self._held.keeps(self.client):
            return None
        return self._held

    def _direct(self, script: Any, keys: Sequence[str], args: Sequence[Any], write: bool) -> Any:
        """Run ``script`` on a plain Redis: the turn's writes on the thread's kept connection (adapters.redis.held)."""
        kept = self._kept_for(script, write)
        if kept is None:
            return script(keys=keys, args=args)
        reply = script(keys=keys, args=args, held=kept)
        if script is self.scripts.commit and _status(reply).startswith(("ok", "applied")):
            # A forking worker's horse that goes on keeps a connection from here (not after a commit refused
            # or sent again whole: 'rebase'; a one-turn horse's re-sent commit goes through the pool too).
            kept.committed()
        return reply

    def _behind_deferred(self, script: Any, keys: Sequence[str], args: Sequence[Any], what: str,
                         write: bool) -> tuple[bool, Any]:
        """The turn's commit sent right behind its journal write on the thread's kept connection, both replies
        read after both went (:meth:`adapters.redis.deferred.Deferred.then`); ``(False, None)``: not so sent,
        the write's reply read, the call to go the usual way."""
        if self._kept_for(script, write) is not None:
            with _mapped(what):
                sent, reply = self._deferred.then(script, keys, args, self.client, what, self.run)
            if sent:
                return True, reply
        self.collect_deferred()  # the write's reply read first; the call goes the usual way
        return False, None

    def send_deferred(self, script: Any, keys: Sequence[str], args: Sequence[Any], what: str,
                      on_reply: Callable[[Any], None]) -> bool:
        """Send a write whose reply this thread's next script reads (:mod:`adapters.redis.deferred`).

        ``False`` (nothing sent) on a Cluster, with ``replicas`` (the write is acknowledged by ``WAIT``
        on its own connection) or when it could not be sent: the caller then runs it with :meth:`run`.
        """
        if self.cluster or self.replicas:
            return False
        if self._deferred.waiting():
            self.collect_deferred()
        return self._deferred.send(self.client, script, keys, args, what, on_reply, self._held)

    def collect_deferred(self) -> None:
        """Read the reply of this thread's deferred write, if one waits (see :meth:`send_deferred`)."""
        with _mapped("reading the reply of a journal write"):
            self._deferred.collect(self.run)

    def _run_on_node(self, script: Any, keys: Sequence[str], args: Sequence[Any], what: str, write: bool) -> Any:
        node = self.client.get_node_from_key(keys[0]).redis_connection if self.cluster else self.client
        if not self.replicas or not write:
            return script(keys=keys, args=args, client=node)
        if isinstance(script, library.Hot):
            script.library.ready(node)  # checked on that server before it goes in a pipeline
        try:
            reply, acked = self._waited(node, script, keys, args)
        except redis.exceptions.ResponseError as exc:
            if not isinstance(script, library.Hot) or not script.not_run(exc, node):
                raise
            reply, acked = self._waited(node, script, keys, args)  # the library loaded, or by EVALSHA
        if int(acked) < self.replicas:
            raise StorageUnavailableError(f"{what}: written, but only {acked} of {self.replicas} replicas "
                                          f"acknowledged it within {self.replica_timeout}s (a failover could lose it)")
        return reply

    def close(self) -> None:
        """Close every connection of the client, a deferred write's reply read first (``RedisStorage.close``)."""
        try:
            self.collect_deferred()
        finally:
            if self._held is not None:
                self._held.close()
            if self.cluster:
                # Every node's pool (RedisCluster.close() closes the node clients, not the pools it gave them,
                # and drops the default node, which a later call needs: the storage stays usable).
                self.client.disconnect_connection_pools()
            else:
                self.client.close()

    def check_library(self) -> None:
        """Check the turn's function library on the server now (one round trip), as a first call would.

        ``pipelines worker`` does before it forks work-horses, which inherit it checked. On a Cluster, on
        every master it knows now (a node that takes slots later is checked by its first call).
        """
        with _mapped("checking the turn's function library"):
            for node in self._masters():
                self.scripts.library.ready(node)

    def prune_libraries(self) -> list[str] | None:
        """Delete other versions' function libraries (:func:`adapters.redis.library.prune`), on every master.

        ``None``: the server has no functions (``FUNCTION`` unknown), so none to delete.
        """
        with _mapped("deleting other versions' function libraries"):
            try:
                return sorted({name for node in self._masters() for name in library.prune(node)})
            except redis.exceptions.ResponseError as exc:
                if "unknown command" in str(exc).lower():
                    return None
                raise

    def _masters(self) -> list[Any]:
        """A client for each server that takes writes: the storage's, or on a Cluster each master's it knows."""
        return [n.redis_connection for n in self.client.get_primaries()] if self.cluster else [self.client]

    def _waited(self, node: Any, script: Any, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, Any]:
        """The script's reply and how many replicas ``WAIT`` counted it on (one pipeline, one connection)."""
        pipe = node.pipeline(transaction=False)  # one connection: WAIT counts that connection's writes
        script(keys=keys, args=args, client=pipe)
        pipe.wait(self.replicas, int(self.replica_timeout * 1000))
        reply, acked = pipe.execute()
        return reply, acked

    def check_layout(self, job_id: str | None) -> None:
        """Record this prefix's layout on first use, or refuse to run with another one (once per storage).

        ``job_id``: the job about to be written, named in errors. ``None``: checked ahead of any write, as
        ``pipelines worker`` does before it takes a job (a forking worker's horses then inherit it checked,
        instead of each spending a round trip on it).
        """
        if self._layout_checked:
            return
        key = layout_key(self.prefix)
        # A prefix first written by this version records the newest record format: it has no older readers.
        mine = self.layout.description + record_format.LAYOUT_SUFFIX[record_format.NEWEST]
        what = "before any write" if job_id is None else f"before writing job {job_id!r}"
        with _mapped(f"checking the key layout {what}"):
            if self.layout.buckets and self.client.get(key) is None and self.client.exists(index_keys(self.prefix)[1]):
                raise ConfigurationError(
                    f"prefix {self.prefix!r} holds jobs written without buckets (its {index_keys(self.prefix)[1]!r} "
                    f"index); a storage with buckets={self.layout.buckets} would never find them: keep buckets=0 "
                    "for this prefix, or use a new prefix")
            stored = self.client.set(key, mine, nx=True, get=True)
        self.record_format = self._format_of(mine if stored is None else _text(stored))
        self._layout_checked = True

    def _format_of(self, stored: str) -> int:
        """The record format a recorded layout names, or ConfigurationError if its buckets are not this storage's."""
        fmt = record_format.format_of(stored, self.layout.description)
        record_format.check_known(self.prefix, stored, self.layout.description)
        if fmt is None:
            raise ConfigurationError(
                f"the jobs under prefix {self.prefix!r} were written with {stored}, this storage uses "
                f"{self.layout.description}: every process on one prefix must use the same buckets (a job would be "
                "looked up in the wrong bucket)"
            )
        return fmt

    def check_read_layout(self) -> None:
        """Before the first index read: refuse a prefix whose recorded layout is another (its indexes would read empty).

        Nothing recorded yet (no job written through a storage with the guard) reads what is there.
        """
        if self._layout_checked:
            return
        with _mapped("checking the key layout before reading the indexes"):
            stored = self.client.get(layout_key(self.prefix))
        if stored is None:
            return
        fmt = record_format.format_of(_text(stored), self.layout.description)
        record_format.check_known(self.prefix, _text(stored), self.layout.description)
        if fmt is None:
            raise ConfigurationError(
                f"the jobs under prefix {self.prefix!r} were written with {_text(stored)}, this storage uses "
                f"{self.layout.description}: its index reads (the sweep, listings, gc) would find none of them")
        self.record_format = fmt
        self._layout_checked = True

    def check_types(self, job_id: str, reply: Any, what: str) -> None:
        """Raise CorruptRecordError for a script's ``corrupt:<role>:<type>`` reply (nothing was written)."""
        if not isinstance(reply, bytes | str) or not _text(reply).startswith("corrupt:"):
            return
        _, role, found = _text(reply).split(":", 2)
        ix = self.layout.indexes_of(job_id)
        indexes = dict(zip(scripts.INDEX_ROLES, ix.listing, strict=True))
        key = ({"due": ix.due, "jobs": ix.jobs, "finished": ix.finished, **indexes}.get(role)
               or getattr(self.keys(job_id), role))
        raise CorruptRecordError(
            f"{what}: key {key!r} ({role}) is a Redis {found}, expected a {_KEY_TYPES[role]} (WRONGTYPE); "
            "nothing was written"
        )


def connect_url(url: str, *, retries: int, backoff_base: float, backoff_cap: float, socket_timeout: float,
                connect_timeout: float, cluster: bool) -> redis.Redis | redis.RedisCluster:
    """A client for ``url`` that connects lazily, with retries (see :meth:`~adapters.redis.RedisStorage.from_url`)."""
    _check_url(url)
    retry = Retry(ExponentialWithJitterBackoff(cap=backoff_cap, base=backoff_base), retries)
    client: redis.Redis | redis.RedisCluster
    try:
        if cluster:
            if urlsplit(url).path.strip("/") not in ("", "0"):
                raise ConfigurationError(f"bad Redis URL {_redact(url)!r}: a Redis Cluster has only database 0")
            # The cluster client retries a command on another node after a failover (MOVED, a dead node).
            # Its nodes' clients are made inside it: the driver info goes in here, not in __init__.
            client = redis.RedisCluster.from_url(url, retry=retry, socket_timeout=socket_timeout,
                                                 socket_connect_timeout=connect_timeout, **_driver_options())
        else:  # its connections get redis-py's driver info in __init__ (settle_driver_info)
            client = redis.Redis.from_url(url, retry=retry, socket_timeout=socket_timeout,
                                          socket_connect_timeout=connect_timeout)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"bad Redis URL {_redact(url)!r}: {exc}") from exc
    # A cluster client reads the slot map when it is made; no seed node answering is a RedisClusterException,
    # which is no RedisError (redis-py 8): it was reported as an app that failed to import.
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        if "cluster mode is not enabled" in str(exc).lower():  # a plain Redis that answers: a setting, not an outage
            raise ConfigurationError(f"Redis at {_redact(url)!r} is not a Cluster (cluster mode is not enabled); "
                                     "use cluster=False for it") from exc
        raise StorageUnavailableError(f"Redis Cluster at {_redact(url)!r} is unreachable: {exc}") from exc
    return client


def _driver_options() -> dict[str, Any]:
    info = driver_info()
    return {} if info is None else {"driver_info": info}

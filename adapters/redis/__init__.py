"""The production storage on Redis 7 (standalone, Sentinel, Cluster): :class:`RedisStorage`.

* :mod:`adapters.redis.storage`: :class:`RedisStorage` (the
  :class:`~adapters.base.Storage` port), composed of the parts below.
* :mod:`adapters.redis.connection`: the client, key layout and registered
  scripts every part shares, and how a script runs.
* :mod:`adapters.redis.records`, :mod:`adapters.redis.writes`,
  :mod:`adapters.redis.events`: loading a record (and what a worker
  remembers of it), every write, the durable events.
* :mod:`adapters.redis.keys`: every key name, and the bucketed layout on a Cluster.
* :mod:`adapters.redis.record_format`: how a record is written (whole, or a delta of a base), and
  moving a prefix to the newer format (:func:`upgrade_record_format`).
* :mod:`adapters.redis.scripts`: the Lua scripts (one per check-then-write); :mod:`adapters.redis.library`:
  the turn's three as Redis functions, by ``FCALL``.
* :mod:`adapters.redis.compact`: record format 3's compact texts.
* :mod:`adapters.redis.listing`, :mod:`adapters.redis.recent`: the listing
  indexes and the newest-first reads.
* :mod:`adapters.redis.live`, :mod:`adapters.redis.live_async`: the live stream.
* :mod:`adapters.redis.archive`: a finished job's events in one compressed field.
* :mod:`adapters.redis.refs`: what a commit sends as references into the journal.
* :mod:`adapters.redis.pending`: the backlog probe on side connections.
* :mod:`adapters.redis.flow`: the flow-control state.
* :mod:`adapters.redis.values`, :mod:`adapters.redis.client`: value encoding;
  the client, its URL checks and error mapping.
"""

from adapters.redis.keys import JobKeys, check_prefix, finished_key, index_keys, job_keys, listing_keys
from adapters.redis.record_format import upgrade_record_format
from adapters.redis.storage import CLUSTER_BUCKETS, DEFAULT_PREFIX, RedisStorage

__all__ = ["CLUSTER_BUCKETS", "DEFAULT_PREFIX", "JobKeys", "RedisStorage", "check_prefix", "finished_key",
           "index_keys", "job_keys", "listing_keys", "upgrade_record_format"]

"""The Lua scripts behind :class:`adapters.redis.RedisStorage`.

Every write that must check something first (a version, a commit token, a
lease owner) is one script, so the check and the write are atomic on the
server and cost one round trip. Scripts reply with a short status string
(``"ok"``, ``"applied"``, ``"stale:<why>"``...) that the adapter maps to
exceptions; they never raise from Lua, because a Lua error after a write
would leave a half-applied commit (scripts are atomic, not transactional).

Wrong key types: a key planted by hand or by other software with the wrong
Redis type would make a command fail half-way through a script. So every
script first checks the type of every key whose command could fail on it
(``TYPE``; a missing key is fine) and, before its first write, replies
``"corrupt:<role>:<type found>"`` instead, with nothing written. The roles
are the :class:`~adapters.redis.JobKeys` field names plus ``due``, ``jobs``
and ``finished`` (finished jobs scored by the time they finished: what
retention removes), and the listing indexes' :data:`INDEX_ROLES` (``updated``:
every job by ``updated_at``; ``status_<status>``: one zset per status), which
always come last in ``KEYS``. Plain ``DEL`` works on every type, so the keys a script only
deletes (CREATE's leftovers of a dead job, DELETE's job keys) are not
checked: that is how a corrupt job can still be deleted.

Hash fields of ``<prefix>:{<job>}:record``: ``st`` (the job's status, so a
commit touches only the status index it leaves and the one it enters; absent
on records written before it, whose next commit touches them all), ``data``
(the record JSON),
``version`` (decimal), ``token`` (the last commit's token), ``jver`` (the
version the journal was written under; absent until the first commit),
``held`` (the owner of the last lease taken and not let go: see
:mod:`adapters.redis.scripts.lease`), ``lapses`` (``<version> <n>``: how many leases
that ran out LOAD took over at that version, none committing: the record's
``interrupted``; absent until a lease first lapses), ``dropped`` and ``fenced`` (the usage,
and the answers, of attempts fenced off after their model call: see
:mod:`adapters.redis.scripts.record`), ``lcut`` (the id of the last event the last write of events added: it
says the live stream shares the durable stream's ids; absent on records written before that, whose live
stream's own copies of the events the next commit cuts), ``lrun`` (the live id of the event that started
the run in flight: the commit that starts the next run cuts the live stream there, keeping one run
before its own; absent on records written before 2026-12-05) and
``hist`` (the record's turn history, one mark's JSON per line, oldest first;
``data`` then has no ``history``). A record written before ``hist`` existed
keeps its history inside ``data`` and has no ``hist`` until its next commit.
Each commit sends only the marks it adds and how many it drops from the
front, relative to the history the commit with a given token wrote (the
adapter remembers it); a record whose ``token`` is another replies ``rebase``
and the adapter sends the whole history instead. Likewise a transcript message
the journal already holds (the model's answer) travels as a checked slice of
the journaled value (:mod:`adapters.redis.refs`), and ``rebase`` asks for it whole.

Conventions: ``KEYS`` are passed in full (hash-tagged per job), but for a job's
scripts on the layout without buckets, which are sent the record key and the due
index's and name the rest themselves (:mod:`adapters.redis.scripts.naming`); an
optional owner travels as a flag plus a value, so an empty-string owner is
still an owner. Nothing in the scripts reads the clock: leases expire by
Redis's own ``PX``, so workers' clocks never matter.
"""

from __future__ import annotations

from adapters.redis.scripts.commit import COMMIT, CREATE, RECORD_STEP
from adapters.redis.scripts.inbox import SEND
from adapters.redis.scripts.index import DELETE, REINDEX
from adapters.redis.scripts.layout import (
    COMMIT_ARGS,
    CREATE_ARGS,
    INDEX_ROLES,
    UPGRADE_RECORDS,
    ArgLayout,
    index_position,
)
from adapters.redis.scripts.lease import LOAD, RELEASE, RENEW, STATE
from adapters.redis.scripts.record import CONTROL, DROPPED, POSTPONE
from adapters.redis.scripts.streams import ARCHIVE, EVENTS, PUBLISH, READ_LIVE

__all__ = ["ARCHIVE", "COMMIT", "COMMIT_ARGS", "CONTROL", "CREATE", "CREATE_ARGS", "DELETE", "DROPPED", "EVENTS",
           "INDEX_ROLES", "LOAD", "POSTPONE", "PUBLISH", "READ_LIVE", "RECORD_STEP", "REINDEX", "RELEASE", "RENEW",
           "SEND", "STATE", "UPGRADE_RECORDS", "ArgLayout", "index_position"]

"""The KEYS a job's scripts are sent: two on a layout without buckets, the rest named by the script; else all.

A turn runs three scripts (LOAD, RECORD_STEP, COMMIT) that touch up to 19 keys, and their names were
~470 of the ~3,400 bytes a W1 turn sent to Redis. Every key is its base plus a fixed suffix
(:mod:`adapters.redis.keys`): a job's keys share ``<base>:record``'s base, the indexes its scripts write
share ``<base>:due``'s. So these scripts, and CREATE and DELETE, are sent the record key, and the due
index's if they touch an index, and name the others themselves from the suffixes below, built by the
same functions as the Python names. A test compares the two.

Only on the layout without buckets (``buckets=0``: a standalone server or Sentinel). Redis asks scripts
to declare every key they touch, for standalone deployments too; what a declaration is for is routing:
a Redis Cluster, or a proxy sharding a "standalone" endpoint, sends a script to the node of its declared
keys' slot and checks that slot, and one being migrated, on those keys only. A layout without buckets
already has every script touch the global indexes, in other slots than the job's keys, so it only ever
runs on one unsharded server, where an undeclared key is a key like any other (these scripts carry no
shebang flags, which keeps that behaviour). A layout with buckets (required on a Cluster, and what a
sharding proxy needs) is sent every key, as before. So is it what a Redis-compatible server that refuses
undeclared keys needs (Dragonfly does by default: "script tried accessing undeclared key").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from adapters.redis.keys import IndexKeys, JobKeys, index_suffixes, job_suffixes
from adapters.redis.scripts.layout import INDEX_ROLES

__all__ = ["COMMIT_KEYS", "LOAD_KEYS", "STEP_KEYS", "naming_fn", "short"]

_JOB_ROLES = JobKeys._fields
_INDEX_ROLES = ("due", "jobs", "finished", *INDEX_ROLES)

#: The roles of COMMIT's (and CREATE's and DELETE's) KEYS, in order: the listing indexes always last.
COMMIT_KEYS = ("record", "messages", "logs", "journal", "lease", "events", "due", "jobs", "live", "finished",
               "inbox", *INDEX_ROLES)
#: LOAD's KEYS: the job's record, journal and lease; the indexes that say whether a missing record is debris.
LOAD_KEYS = ("record", "journal", "lease", "due", "jobs", "updated")
#: RECORD_STEP's KEYS.
STEP_KEYS = ("record", "journal", "lease", "live")


def _suffix(role: str) -> tuple[int, str]:
    """(0, the suffix) for a role among a job's keys, (1, the suffix) for an index's."""
    if role in _JOB_ROLES:
        return 0, getattr(job_suffixes(), role)
    ix: IndexKeys = index_suffixes()
    place = _INDEX_ROLES.index(role)
    return 1, (ix.due, ix.jobs, ix.finished, *ix.listing)[place]


@functools.cache
def short(order: tuple[str, ...]) -> bool:
    """Whether a script of this KEYS order is sent the due index's key beside the record key (it writes an index)."""
    if order[0] != "record":
        raise ValueError(f"a named KEYS order starts with the record key, not {order[0]!r}")
    return any(role in _INDEX_ROLES for role in order)


def naming_fn(order: Sequence[str], job_arg: int = 0) -> str:
    """Lua that, sent only the record key (and the due index's), names the rest (a script's first statement).

    ``job_arg``: the place (1-based) of the job's id among the script's ARGV, sent empty with the two keys:
    the job's keys hold it (``<prefix>:{<job>}:record``), so it is read from there (0: the script takes none).
    """
    parts = [_suffix(role) for role in order[1:]]
    table = ", ".join(f"{{{which}, '{suffix}'}}" for which, suffix in parts)
    record_len, due_len = len(job_suffixes().record), len(index_suffixes().due)
    if job_arg and not short(tuple(order)):
        raise ValueError("only a script sent the due index's key beside the record key can read the job's id")
    job = "" if not job_arg else f"""
    -- bases[1] is '<prefix>:{{<job>}}', bases[2] '<prefix>'.
    if ARGV[{job_arg}] == '' then ARGV[{job_arg}] = string.sub(bases[1], #bases[2] + 3, -2) end"""
    return f"""
do
  local named = {{{table}}}
  if #KEYS == {2 if short(tuple(order)) else 1} then  -- every key is never so few (a Cluster's COMMIT: 13 at least)
    local bases = {{string.sub(KEYS[1], 1, -{record_len + 1}), KEYS[2] and string.sub(KEYS[2], 1, -{due_len + 1})}}
    for i, s in ipairs(named) do KEYS[i + 1] = bases[s[1] + 1] .. s[2] end{job}
  end
end
"""

"""Where the scripts' arguments and keys go: CREATE's and COMMIT's ARGV layouts, the listing indexes' roles;
and UPGRADE_RECORDS, the one script on the prefix's layout key (:mod:`adapters.redis.record_format`)."""

from __future__ import annotations

from typing import NamedTuple

from pipelines.engine.models import JobStatus

__all__ = ["COMMIT_ARGS", "CREATE_ARGS", "INDEX_ROLES", "UPGRADE_RECORDS", "ArgLayout", "index_position"]


class ArgLayout(NamedTuple):
    """Where CREATE's and COMMIT's ARGV keep their parts (0-based, as the adapter builds the list).

    ``fixed`` arguments come first (the turn history's from ``history`` on, then COMMIT's ``record_mode``, status
    place, whether to hand back the archive's read and which event starts a run); then
    ``ARGV[n_messages]`` messages, ``ARGV[n_logs]`` log lines and the events up to the end. The
    bench's byte breakdown reads the same numbers.
    """

    data: int
    n_messages: int
    n_logs: int
    history: int
    fixed: int
    record_mode: int = -1  # COMMIT: how data is written (adapters.redis.record_format), then the status place


CREATE_ARGS = ArgLayout(data=2, n_messages=5, n_logs=6, history=10, fixed=11)
COMMIT_ARGS = ArgLayout(data=2, n_messages=11, n_logs=12, history=19, fixed=27, record_mode=23)

INDEX_ROLES = ("updated", *(f"status_{s.value}" for s in JobStatus))
"""The roles of the listing indexes, in the order they end ``KEYS`` (after every other key): every job by
``updated_at``, then one zset per status (in :class:`JobStatus` order)."""


def index_position(status: JobStatus) -> str:
    """ARGV naming the status index a job goes in: its 1-based place among the status indexes."""
    return str(list(JobStatus).index(status) + 1)


# KEYS: the prefix's layout key; ARGV: its value in the newest record format, then in each older one.
# Reply: 1 moved to the newest now (or recorded so, nothing recorded yet), 0 there already, else the value
# recorded (another layout, or a format not named: nothing written).
UPGRADE_RECORDS = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then return 0 end
local older = not cur
for i = 2, #ARGV do older = older or cur == ARGV[i] end
if older then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return cur
"""

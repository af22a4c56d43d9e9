"""Deprecated alias of :mod:`adapters.redis.scripts`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.scripts import (
    ARCHIVE,
    COMMIT,
    COMMIT_ARGS,
    CONTROL,
    CREATE,
    CREATE_ARGS,
    DELETE,
    DROPPED,
    EVENTS,
    INDEX_ROLES,
    LOAD,
    PUBLISH,
    READ_LIVE,
    RECORD_STEP,
    REINDEX,
    RELEASE,
    RENEW,
    SEND,
    ArgLayout,
    index_position,
)

__all__ = ["ARCHIVE", "COMMIT", "COMMIT_ARGS", "CONTROL", "CREATE", "CREATE_ARGS", "DELETE", "DROPPED", "EVENTS",
           "INDEX_ROLES", "LOAD", "PUBLISH", "READ_LIVE", "RECORD_STEP", "REINDEX", "RELEASE", "RENEW", "SEND",
           "ArgLayout", "index_position"]

moved(__name__, "adapters.redis.scripts")

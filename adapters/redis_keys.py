"""Deprecated alias of :mod:`adapters.redis.keys`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.keys import (
    IndexKeys,
    JobKeys,
    KeyLayout,
    check_prefix,
    finished_key,
    index_keys,
    job_keys,
    layout_key,
    listing_keys,
)

__all__ = ["IndexKeys", "JobKeys", "KeyLayout", "check_prefix", "finished_key", "index_keys", "job_keys", "layout_key",
           "listing_keys"]

moved(__name__, "adapters.redis.keys")

"""Deprecated alias of :mod:`adapters.redis.archive`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.archive import ARCHIVE_FIELD, entry_key, merge, pack, unpack

__all__ = ["ARCHIVE_FIELD", "entry_key", "merge", "pack", "unpack"]

moved(__name__, "adapters.redis.archive")

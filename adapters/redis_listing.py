"""Deprecated alias of :mod:`adapters.redis.listing`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.listing import IndexReads

__all__ = ["IndexReads"]

moved(__name__, "adapters.redis.listing")

"""Deprecated alias of :mod:`adapters.blobs.s3`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.blobs.s3 import S3BlobStore

__all__ = ["S3BlobStore"]

moved(__name__, "adapters.blobs.s3")

"""RQ job ids of advances: one per turn, namespaced by the storage's key prefix, only ``[A-Za-z0-9_-]``.

One RQ job id per turn
----------------------
The RQ job id of an advance is ``<namespace>_n<job id>-v<version>``, both
names escaped (see :func:`rq_job_id`). A worker that enqueued its successor
under its own id would re-run forever, and enqueuing an id that is still
waiting is a harmless duplicate we skip. RQ job ids live in one keyspace per
Redis (``rq:job:<id>``), so the namespace (the storage's key prefix) is part
of the id: two apps on one Redis whose storages both hold ``chat-1`` must not
overwrite each other's RQ jobs.

RQ ids allow ``[A-Za-z0-9_-]``; namespaces and job ids use
``[A-Za-z0-9._:-]``, so both are escaped injectively: ``_`` → ``__``,
``.`` → ``_d``, ``:`` → ``_c``. Every ``_`` in an escaped name starts a
two-character escape, so the separator ``_n`` cannot occur inside one and
decoding is unambiguous; the version suffix is split off at the last ``-v``
(the suffix is all digits, so it cannot contain another ``-v``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from adapters.redis.keys import check_prefix
from adapters.redis.storage import DEFAULT_PREFIX
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import validate_job_id

__all__ = ["RQJobRef", "decode_rq_job_id", "escape", "parse_rq_job_id", "rq_job_id"]

_ENCODE = {"_": "__", ".": "_d", ":": "_c"}
_DECODE = {v[1]: k for k, v in _ENCODE.items()}
_NAME = r"(?:[A-Za-z0-9-]|_[_dc])+"  # an escaped name: "_" only ever starts a two-character escape
_RQ_ID = re.compile(rf"(?P<ns>{_NAME})_n(?P<job>{_NAME})-v(?P<version>[0-9]+)")


class RQJobRef(NamedTuple):
    """What an RQ job id made by :func:`rq_job_id` names."""

    namespace: str
    job_id: str
    version: int


def escape(job_id: str, namespace: str = DEFAULT_PREFIX) -> str:
    """``<escaped namespace>_n<escaped job id>``: the part of an RQ id before its suffix."""
    ns = "".join(_ENCODE.get(c, c) for c in check_prefix(namespace, "an RQ namespace"))
    return f"{ns}_n" + "".join(_ENCODE.get(c, c) for c in validate_job_id(job_id))


def _unescape(name: str) -> str:
    return re.sub(r"_(.)", lambda e: _DECODE[e.group(1)], name)


def rq_job_id(job_id: str, version: int, namespace: str = DEFAULT_PREFIX) -> str:
    """The RQ job id of ``job_id``'s advance at ``version`` under ``namespace`` (a storage prefix).

    ``<escaped namespace>_n<escaped job id>-v<version>``: injective in all
    three, and only ``[A-Za-z0-9_-]`` as RQ requires. A bad job id raises
    :class:`InvalidJobIdError`, a bad namespace :class:`ConfigurationError`.
    """
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise InvalidInputError(f"version must be an int >= 0, got {version!r}")
    return f"{escape(job_id, namespace)}-v{version}"


def parse_rq_job_id(rq_id: str) -> RQJobRef:
    """Invert :func:`rq_job_id`: ``(namespace, job_id, version)``; ``InvalidInputError`` for other ids."""
    m = _RQ_ID.fullmatch(rq_id) if isinstance(rq_id, str) else None
    if m is None:
        raise InvalidInputError(f"{rq_id!r} is not an RQ job id made by rq_job_id()")
    return RQJobRef(_unescape(m.group("ns")), _unescape(m.group("job")), int(m.group("version")))


def decode_rq_job_id(rq_id: str, namespace: str | None = None) -> tuple[str, int]:
    """Invert :func:`rq_job_id`: ``(job_id, version)``; ``InvalidInputError`` for other ids.

    With ``namespace``, an id of another namespace is refused too (it belongs
    to another app on the same Redis). :func:`parse_rq_job_id` also returns
    the namespace.
    """
    ref = parse_rq_job_id(rq_id)
    if namespace is not None and ref.namespace != namespace:
        raise InvalidInputError(f"RQ job id {rq_id!r} belongs to namespace {ref.namespace!r}, not {namespace!r}")
    return ref.job_id, ref.version

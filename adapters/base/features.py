"""The optional capabilities (:class:`Feature`), each standing for one protocol of the ports."""

from __future__ import annotations

from enum import StrEnum

from adapters.base.read import AsyncLiveStore, CountingIndex, RecentHistory
from adapters.base.run import FencedAnswers, LeaseHistory, StepBeforeCommit, StepPublisher
from adapters.base.scheduling import (
    Backlog,
    BacklogProbe,
    HostedScheduler,
    InProcessScheduler,
    LateDelivery,
    NamedQueues,
)
from adapters.base.storage import ClaimingStore, FlowCapable, KeyPrefixed, RetentionStore, VersionedSchema

__all__ = ["Feature", "FEATURE_PROTOCOLS"]


class Feature(StrEnum):
    """An optional capability of an adapter, declared once by its class in ``features`` (see
    :func:`pipelines.engine.capabilities.has`); each stands for the protocol in :data:`FEATURE_PROTOCOLS`."""

    STEP_AND_PUBLISH = "step_and_publish"  # StepPublisher: journal a step and publish its parts in one write
    ASYNC_LIVE = "async_live"  # AsyncLiveStore: a follower's wait holds no thread
    COUNTS = "counts"  # CountingIndex: counts from the listing indexes, and reindex
    RETENTION = "retention"  # RetentionStore: a delete fenced on the version, and the finished index
    FLOW = "flow"  # FlowCapable: shared rate limits and concurrency slots in the storage
    BACKLOG = "backlog"  # Backlog: whether work of a priority waits in the queue
    BACKLOG_PROBE = "backlog_probe"  # BacklogProbe: ask that question without waiting for the answer
    IN_PROCESS = "in_process"  # InProcessScheduler: runs advances in this process (attach, drain)
    NAMED_QUEUES = "named_queues"  # NamedQueues: says which queue a run waits on
    SCHEMA = "schema"  # VersionedSchema: a file with a schema version that `pipelines migrate` upgrades
    RECENT = "recent"  # RecentHistory: a job's latest events and log lines, read from the end
    CLAIMS = "claims"  # ClaimingStore: claims due work for one process, releases what dead processes held
    KEY_PREFIX = "key_prefix"  # KeyPrefixed: every key starts with a prefix queue message ids carry
    HOSTED = "hosted"  # HostedScheduler: learns from the App it is built into (the worker entry, the sweep)
    LEASE_HISTORY = "lease_history"  # LeaseHistory: tells a lease that ran out (its holder died) from one let go
    FENCED_ANSWERS = "fenced_answers"  # FencedAnswers: keeps the answers of attempts fenced off after the model call
    STEP_BEFORE_COMMIT = "step_before_commit"  # StepBeforeCommit: a last step's reply read with the commit
    LATE_DELIVERY = "late_delivery"  # LateDelivery: how late a delayed advance may arrive


FEATURE_PROTOCOLS: dict[Feature, type] = {
    Feature.STEP_AND_PUBLISH: StepPublisher,
    Feature.ASYNC_LIVE: AsyncLiveStore,
    Feature.COUNTS: CountingIndex,
    Feature.RETENTION: RetentionStore,
    Feature.FLOW: FlowCapable,
    Feature.BACKLOG: Backlog,
    Feature.BACKLOG_PROBE: BacklogProbe,
    Feature.IN_PROCESS: InProcessScheduler,
    Feature.NAMED_QUEUES: NamedQueues,
    Feature.SCHEMA: VersionedSchema,
    Feature.RECENT: RecentHistory,
    Feature.CLAIMS: ClaimingStore,
    Feature.KEY_PREFIX: KeyPrefixed,
    Feature.HOSTED: HostedScheduler,
    Feature.LEASE_HISTORY: LeaseHistory,
    Feature.FENCED_ANSWERS: FencedAnswers,
    Feature.STEP_BEFORE_COMMIT: StepBeforeCommit,
    Feature.LATE_DELIVERY: LateDelivery,
}
"""The protocol each feature stands for: an adapter that declares a feature implements its protocol (the
contract suites check both ways)."""

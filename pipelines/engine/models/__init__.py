"""Persisted data: job records, checkpoints, log entries, commits, and the rules for the JSON values in them.

Everything here is a pydantic v2 model that travels as JSON, in storage and on
the queue. Fields added later must carry defaults so old records still load.
The package holds it in four modules, each named for what it holds:

- :mod:`~pipelines.engine.models.values`: JSON values, their limits, job ids;
- :mod:`~pipelines.engine.models.records`: the job record, its status, checkpoint, usage, logs and events;
- :mod:`~pipelines.engine.models.commits`: the commit and storage's reply to it;
- :mod:`~pipelines.engine.models.stored`: the JSON text storage keeps for them.

Import from here (``from pipelines.engine.models import JobRecord``): these names are the contract.
"""

from __future__ import annotations

from pipelines.engine.models.commits import Commit, CommitReply
from pipelines.engine.models.records import (
    FINISHED_STATUSES,
    Checkpoint,
    Event,
    JobRecord,
    JobStatus,
    LogEntry,
    LogLevel,
    TurnMark,
    Usage,
)
from pipelines.engine.models.records import NO_USAGE as NO_USAGE
from pipelines.engine.models.records import RUN_STARTS as RUN_STARTS
from pipelines.engine.models.records import first_run_start as first_run_start
from pipelines.engine.models.stored import (
    as_stored,
    changed_fields,
    check_event_size,
    check_record_fields,
    detached,
    dump_events,
    dump_fields,
    dump_logs,
    dump_marks,
    dump_record,
    dump_record_apart,
    plain_event,
    record_fields,
)
from pipelines.engine.models.values import (
    JOB_ID_PATTERN,
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    MAX_VALUE_DEPTH,
    STEP_ENVELOPE,
    JSONValue,
    Message,
    check_messages,
    check_size,
    dump_json,
    encode_plain,
    fitting_start,
    fresh_json,
    owned_json_value,
    same_json,
    to_json_value,
    validate_job_id,
)
from pipelines.engine.models.values import json_data as json_data

__all__ = [
    "FINISHED_STATUSES",
    "JOB_ID_PATTERN",
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "MAX_VALUE_BYTES",
    "MAX_VALUE_DEPTH",
    "STEP_ENVELOPE",
    "Checkpoint",
    "Commit",
    "CommitReply",
    "Event",
    "JobRecord",
    "JobStatus",
    "JSONValue",
    "LogEntry",
    "LogLevel",
    "Message",
    "TurnMark",
    "Usage",
    "as_stored",
    "detached",
    "changed_fields",
    "check_messages",
    "check_event_size",
    "check_record_fields",
    "check_size",
    "dump_json",
    "dump_events",
    "dump_fields",
    "dump_logs",
    "dump_marks",
    "dump_record",
    "dump_record_apart",
    "encode_plain",
    "fitting_start",
    "fresh_json",
    "owned_json_value",
    "plain_event",
    "record_fields",
    "same_json",
    "to_json_value",
    "validate_job_id",
]

MAX_VALUE_BYTES = 8 * 1024 * 1024
"""The largest JSON text storage takes for one value: a transcript message, a step
result, a log or event line, or a job record with its state. A larger one is refused
with :class:`ValueTooLargeError` before anything is written. Change it here
(``pipelines.engine.models.MAX_VALUE_BYTES = ...``) if your jobs need more."""

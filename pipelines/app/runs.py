"""Starting runs: an agent's or a pipeline's, a message sent to a conversation, a fork of a run.

The App's ``run_agent``, ``run_pipeline``, ``send``, ``fork`` and ``rerun``
are a thin face over :class:`Runs`; every write goes through
:func:`~pipelines.engine.start.start_job`, :mod:`pipelines.engine.inbox` or
:mod:`pipelines.engine.writer`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from phases.agent_config import RUN_OPTIONS
from phases.callbacks import CALLBACKS, check_callbacks
from pipelines.engine import children, control, flow, inbox, transitions, writer
from pipelines.engine.capabilities import Feature, has
from pipelines.engine.errors import (
    ConfigurationError,
    CorruptRecordError,
    InvalidInputError,
    JobConflictError,
    JobNotFoundError,
)
from pipelines.engine.models import JobRecord, Message, TurnMark, to_json_value, validate_job_id
from pipelines.engine.start import RetryMode, check_retry_mode, start_job
from pipelines.handle import JobView, RunHandle
from pipelines.provenance import with_provenance

if TYPE_CHECKING:
    from pipelines.app.face import App
    from pipelines.app.registry import PipelineSource

__all__ = ["Runs", "as_message_list"]


class Runs:
    """Starting runs on ``app``'s storage and scheduler (see the module doc)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.storage = app.storage
        self.scheduler = app.scheduler
        self.env = app.env
        self.registry = app.registry

    def run_agent(self, agent: str | PipelineSource, *, job_id: str, messages: Sequence[Message | str] = (),
                  retry_mode: RetryMode | None = None, user: str | None = None, tags: Sequence[str] | None = None,
                  **options: Any) -> RunHandle:
        """Write an agent run (its messages and per-run options) and enqueue its first turn; returns at once.

        Documented on :meth:`pipelines.app.App.run_agent`.
        """
        if (not isinstance(agent, str) and self.registry.agents.get(agent.name) is not agent
                and not has(self.scheduler, Feature.IN_PROCESS)):
            # Registered now, it would be known in this process only: every worker, which builds the App from
            # its module, would refuse the job's turns ("unknown pipeline") and the job would wait for ever.
            raise ConfigurationError(
                f"agent {agent.name!r} is not registered with this App, so the workers of "
                f"{type(self.scheduler).__name__} (which build the App from its module) would not know it: add it "
                "to App(agents=[...]) where the App is built, and run it by name")
        source = self.registry.agent(agent)
        if user is not None:
            if not isinstance(user, str):
                raise InvalidInputError(f"user must be a string, got {type(user).__name__}")
            messages = [*as_message_list(messages), user]
        app = self.app
        all_tags = with_provenance(tags, version=app.version, commit=app.provenance_commit, enabled=app.provenance)
        if all_tags:  # no tags, no key: an untagged run's options stay as the caller gave them
            options["tags"] = all_tags
        run_callbacks = check_callbacks({k: options.pop(k) for k in CALLBACKS if k in options})
        if run_callbacks and not has(self.scheduler, Feature.IN_PROCESS):
            raise ConfigurationError(
                f"per-run callbacks ({', '.join(run_callbacks)}) are Python callables that cannot reach the workers "
                f"of {type(self.scheduler).__name__}; set them on the Agent instead (it is rebuilt on every worker)")
        _evaluate_concurrency_key(job_id, options)
        kwargs = source.start_run(job_id, messages, options, self.app)
        self.env.callbacks.set(job_id, run_callbacks)
        # The first turn goes to the queue of the run's priority, like every later one.
        scheduler = flow.with_priority(self.scheduler, flow.check_priority(options.get("priority") or "interactive"))
        try:
            start_job(job_id=job_id, pipeline=self.registry.pipeline(source.name), name=source.name,
                      storage=self.storage, scheduler=scheduler, retry_mode=check_retry_mode(retry_mode),
                      continue_completed=True, **kwargs)
        except BaseException:
            self.env.callbacks.forget(job_id)
            raise
        return RunHandle(self.app, job_id)

    def run_pipeline(self, name: str, *, job_id: str, initial_state: Any = None,
                     retry_mode: RetryMode | None = None, initial_phase: str | None = None) -> RunHandle:
        """Start (or retry) a job of the registered pipeline ``name``; returns at once."""
        start_job(job_id=job_id, pipeline=self.registry.pipeline(name), name=name, storage=self.storage,
                  scheduler=self.scheduler, initial_state=initial_state, retry_mode=check_retry_mode(retry_mode),
                  initial_phase=initial_phase)
        return RunHandle(self.app, job_id)

    def handle(self, job_id: str) -> RunHandle:
        """A handle on an existing run (``app.handle(id).wait()``)."""
        return RunHandle(self.app, validate_job_id(job_id))
    # --- forks ---------------------------------------------------------------------------------
    def fork(self, job_id: str, *, at_turn: int, new_job_id: str, run: bool = False,
             **options: Any) -> RunHandle:
        """A new job ``new_job_id`` that goes on from ``job_id`` as it was after turn ``at_turn``.

        Documented on :meth:`pipelines.app.App.fork`.
        """
        validate_job_id(new_job_id)
        src = control.load_job(self.storage, job_id)
        mark = transitions.turn_mark(src, at_turn)
        if run and mark.next_phase is None:
            raise InvalidInputError(f"turn {at_turn} ended job {job_id!r}: nothing runs after it; re-run from "
                                    "an earlier turn, or fork it and continue with new messages")
        overrides = self._fork_options(src, new_job_id, options)
        request = _fork_request(src.job_id, mark.phases_done, run, overrides)
        existing = self.storage.get_job(new_job_id)
        if existing is not None:
            return RunHandle(self.app, _landed_fork(existing, new_job_id, request))
        try:
            messages = self.storage.messages(job_id, 0, mark.transcript_len)
        except CorruptRecordError:  # a blob it refers to gone: deleted meanwhile, or damaged
            self._still_there(src)
            raise
        if len(messages) != mark.transcript_len:
            self._still_there(src)  # deleted or cut back meanwhile (retention, a full retry): say that
            raise CorruptRecordError(f"job {job_id!r} holds {len(messages)} messages, fewer than the "
                                     f"{mark.transcript_len} its turn {at_turn} committed")
        self._turn_kept(src, mark)
        commit = transitions.fork(src, mark, new_job_id=new_job_id, messages=messages, request=request,
                                  options={**src.options, **overrides}, run=run, now=self.scheduler.now())
        try:
            writer.apply(self.storage, self.scheduler, commit)
        except JobConflictError:
            # Taken since the look above (the create refuses a taken id atomically): the request the
            # other create wrote, never changed after, says whether it is this very fork.
            return RunHandle(self.app, _landed_fork(self.storage.get_job(new_job_id), new_job_id, request))
        return RunHandle(self.app, new_job_id)

    def _still_there(self, src: JobRecord) -> None:
        """Raise what happened to ``src`` since it was read (deleted, or moved on); return if it is as read."""
        now = self.storage.get_job(src.job_id)
        if now is None:
            raise JobNotFoundError(f"job {src.job_id!r} was deleted while it was being forked")
        if now.version != src.version:
            raise JobConflictError(f"job {src.job_id!r} changed while it was being forked; try again")

    def _options_kept(self, done: JobRecord) -> dict[str, Any]:
        """The options a caller gave ``done``'s last run, for the next one: not the ones the run keeps for itself
        (the system messages it dropped), and its ``version:`` / ``commit:`` tags drawn anew by this App."""
        kept = {k: v for k, v in done.options.items() if k in RUN_OPTIONS}
        if self.app.provenance and isinstance(kept.get("tags"), list):
            kept["tags"] = [t for t in kept["tags"] if not str(t).startswith(("version:", "commit:"))]
        return kept

    def _turn_kept(self, src: JobRecord, mark: TurnMark) -> None:
        """Raise unless the source still holds the turn ``mark`` after its messages were read.

        A full retry cuts the transcript back and the new run writes it again: read between the two, the
        messages are the new run's, as many as the turn's, and the turn's state the old run's.
        """
        now = self.storage.get_job(src.job_id)
        if now is None:
            raise JobNotFoundError(f"job {src.job_id!r} was deleted while it was being forked")
        # A cut draws a new transcript epoch; a turn that only went on keeps it (and may have dropped the mark from
        # the bounded history: that is no cut).
        same_run = children.run_of(src) == children.run_of(now) != ""
        if now.version != src.version and not same_run and mark not in now.history:
            raise JobConflictError(f"job {src.job_id!r} was cut back before turn {mark.phases_done} (a full retry) "
                                   "while it was being forked; try again")

    def rerun(self, job_id: str, *, from_turn: int, new_job_id: str, **options: Any) -> RunHandle:
        """Fork ``job_id`` after turn ``from_turn`` and run the fork at once, with ``options`` overriding
        the original's (``model=``, ``max_turns=``, ...): "what if" and regression runs."""
        return self.fork(job_id, at_turn=from_turn, new_job_id=new_job_id, run=True, **options)

    def _fork_options(self, src: JobRecord, new_job_id: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` checked as a new run's would be: what a fork puts over the original's per-run options.

        A ``concurrency_key`` function is evaluated as ``run_agent`` does, for the new job ``new_job_id``.
        """
        if not options:
            return {}
        source = self.registry.agents.get(src.pipeline)
        if source is None:
            raise InvalidInputError(f"per-run options ({', '.join(sorted(options))}) apply to agent runs; "
                                    f"job {src.job_id!r} runs the pipeline {src.pipeline!r}")
        options = dict(options)
        _evaluate_concurrency_key(new_job_id, options)
        checked: dict[str, Any] = source.start_run(src.job_id, [], options, self.app)["options"]
        return checked


    def send(self, job_id: str, messages: Sequence[Message | str]) -> JobView:
        """Send messages to a conversation: they join its transcript at the next turn boundary, in order, once.

        Documented on :meth:`pipelines.app.App.send`.
        """
        record = control.load_job(self.storage, job_id)
        source = self.registry.agents.get(record.pipeline)
        if source is None:
            self.registry.pipeline(record.pipeline)  # not registered here at all: say so, naming what is
            raise InvalidInputError(f"job {job_id!r} runs pipeline {record.pipeline!r}, not an agent: "
                                    "only conversations take messages")
        msgs = inbox.person_messages(as_message_list(messages))
        inbox.send(self.storage, record, msgs, agent=source.name,
                   takes_while_running=source.takes_messages_while_running,
                   # The last run's options (concurrency key, priority, model, ...): what a message sent during its
                   # last turn keeps too; a caller who wants others runs the conversation on with run_agent.
                   continue_run=lambda done: self.run_agent(source, job_id=job_id, messages=msgs,
                                                            **self._options_kept(done)))
        return self.app.read.view(control.load_job(self.storage, job_id))



def _evaluate_concurrency_key(job_id: str, options: dict[str, Any]) -> None:
    """A ``concurrency_key`` given as a function of the run (``fn(job_id, options)``) becomes its value, now."""
    key = options.get("concurrency_key")
    if callable(key):
        value = key(job_id, dict(options))
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidInputError(f"the concurrency_key function returned {value!r}; expected a string or None")
        options["concurrency_key"] = value


def _fork_request(source: str, at_turn: int, run: bool, overrides: Mapping[str, Any]) -> str:
    """What a fork asks, as a digest kept on its record: a repeat lands only if it asks the same."""
    asked = {"source": source, "at_turn": at_turn, "run": run,
             "options": to_json_value(dict(overrides), what="the fork's options")}
    return hashlib.sha256(json.dumps(asked, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _landed_fork(existing: JobRecord | None, new_job_id: str, request: str) -> str:
    """``new_job_id`` if ``existing`` is the fork ``request`` asks for (a retried call); else JobConflictError."""
    if existing is None:
        raise JobConflictError(f"job {new_job_id!r} was created and deleted while it was being forked; try again")
    if existing.fork_request == request:
        return new_job_id
    if existing.forked_from is None:
        what = "it is not a fork"
    elif existing.fork_request is None:
        what = "a fork from before requests were recorded, which cannot be told from this one"
    else:
        what = "a fork asked with another source, turn, run or options"
    raise JobConflictError(f"job {new_job_id!r} already exists ({what}); fork to a new id")


def as_message_list(messages: Any) -> list[Any]:
    """``messages`` as a list (a single string or dict is refused, as :func:`~pipelines.agent.as_messages` does)."""
    if isinstance(messages, str | dict) or not isinstance(messages, Sequence):
        raise InvalidInputError(f"messages must be a list of messages (or strings), got {type(messages).__name__}")
    return list(messages)


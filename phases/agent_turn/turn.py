"""The agent turn phase: :class:`AgentTurn` reads the history, calls the model, runs the tools, decides.

The model call itself is :mod:`phases.agent_turn.model_call`, the tools run in
:mod:`phases.tool_runner`, and the end of the turn is :mod:`phases.agent_turn.ending`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from phases import agent_run, journal
from phases.agent_config import AgentConfig
from phases.agent_turn.ending import _decide, _emit_turn_events, _over_budget, _result_of
from phases.agent_turn.model_call import _call_model, _content_of, _kept_answer, _structured, journal_form
from phases.agent_turn.plan import TURN_PHASE, AgentState, TurnPlan, resolve_model
from phases.callbacks import fire
from phases.compaction import estimate_tokens, find_cut, marker, summary_request
from phases.history_cache import Held, HistoryCache, View
from phases.model import Model, ModelResponse
from phases.stop import TurnInfo, cut_short
from phases.streaming import DeltaSink
from phases.titles import start_title
from phases.tool_calls import call_ids
from phases.view_migration import ViewMigration, migrate_view
from pipelines.engine.errors import (
    InvalidInputError,
    ModelError,
    PermanentModelError,
    StaleVersionError,
    TransientModelError,
)
from pipelines.engine.models import Message, Usage
from pipelines.engine.phase import INBOX_STEP, Done, Fail, Next, Phase, PhaseContext, RetryLater, ToolScope

__all__ = ["AgentTurn", "build_agent_phase"]

logger = logging.getLogger("pipelines")


def build_agent_phase(*, model: str | Model, **options: Any) -> Phase:
    """Build the agent's turn phase (named ``"turn"``); it reschedules itself until a stop.

    Takes the options of :class:`~phases.agent_config.AgentConfig` (tools,
    system, max_turns, stop_when, model_params, max_model_attempts,
    output_schema, max_tokens, max_cost_usd, prepare_turn, tool_timeout).
    ``model_params`` go to litellm unchanged (api_base, api_key, temperature,
    ...) and are never stored. Transient model errors re-run the turn later,
    up to ``max_model_attempts`` times; permanent ones fail the job.
    ``output_schema`` makes the job's result a validated instance (stored as
    JSON). ``max_tokens`` / ``max_cost_usd`` stop the job once its usage,
    counted across retries and crashes, reaches them (the turn that crosses
    the line still commits). ``prepare_turn`` may change model, params, tools
    offered or messages for one turn. A job's stored per-run options
    (:class:`~phases.agent_config.RunOptions`) override these for that job.
    """
    try:
        config = AgentConfig(model=model, **options)
    except TypeError as exc:
        raise InvalidInputError(f"build_agent_phase: {exc}") from None
    return Phase(TURN_PHASE, AgentTurn(config), copy_state=False)  # it returns a new state each turn


class AgentTurn:
    """The turn phase's ``run``: holds the agent's configuration, resolved once.

    ``schemas``: output schemas a job may name in its per-run options (the
    App adds the schemas registered on it). ``view_migrations``: the agent's
    upgrades of an older job's model view (:mod:`phases.view_migration`).
    """

    def __init__(self, config: AgentConfig, view_migrations: Mapping[str, ViewMigration] | None = None) -> None:
        self.config = config
        self.view_migrations = dict(view_migrations or {})
        self.schemas: dict[str, type[BaseModel]] = {}
        if config.output_schema is not None:
            self.schemas[config.output_schema.__name__] = config.output_schema
        self.model = resolve_model(config.model, config.model_params)
        self.tmap = config.tmap
        self.tool_schemas = [t.schema() for t in self.tmap.values()]
        # The system prompt is no longer a fixed prefix: a conversation's pinned
        # prompt (or the run's current one) is chosen per turn (phases.conversation).
        self.prefix: list[Message] = []
        self.history = HistoryCache()

    def _model(self, spec: str | Model, params: Mapping[str, Any] | None) -> tuple[Model, dict[str, Any]]:
        """The model to call and the params it gets with each request."""
        same = spec is self.config.model and params == self.config.model_params
        model = self.model if same else resolve_model(spec, params)
        # A model string's params went into its LiteLLMModel; a Model object gets them with each request.
        return model, ({} if isinstance(spec, str) else dict(params or {}))

    def call_model(self, ctx: PhaseContext[Any], cfg: AgentConfig, messages: list[Message],
                   turn: int, view: View | None = None, taken: frozenset[str] | None = None) -> ModelResponse:
        """The model's answer for ``messages``; ``taken``: the tool call ids already in the whole transcript."""
        tmap = cfg.tmap  # the run's tools: a provider's, or prepare_call's choice
        # ``view``: the model view of ``messages``, already built; a copy goes out (a model may change its list).
        messages = list(view.messages) if view is not None else agent_run.turn_messages(cfg, messages)
        schema = None if tmap else cfg.output_schema
        if cfg.prepare_turn is None:
            model, params = self._model(cfg.model, cfg.model_params)
            # A run's options may rebuild the config (and its tool map) around the same tools: same schemas.
            schemas = self.tool_schemas if tmap == self.tmap else [t.schema() for t in tmap.values()]
            return _call_model(model, ctx, messages, schemas, params, turn, schema, taken=taken)
        plan = TurnPlan(job_id=ctx.job_id, turn=turn, model=cfg.model, params=dict(cfg.model_params or {}),
                        # A deep copy: the hook may edit messages in place without touching
                        # the transcript cache shared by later turns.
                        tools=list(tmap.values()), messages=json.loads(json.dumps(messages)))
        plan = cfg.prepare_turn(plan) or plan
        unknown = [t.name for t in plan.tools if tmap.get(t.name) is not t]
        if unknown:
            raise InvalidInputError(f"prepare_turn offered tools the agent does not have: {unknown}")
        model, params = self._model(plan.model, plan.params)
        offered = [t.name for t in plan.tools]
        response = _call_model(model, ctx, plan.messages, [t.schema() for t in plan.tools], params, turn,
                               None if offered else cfg.output_schema, taken=taken)
        return response.model_copy(update={"tools_offered": offered}) if offered != list(tmap) else response

    def __call__(self, ctx: PhaseContext[Any]) -> Next | Done | Fail:
        cfg = agent_run.resolve_run(ctx, self.config.for_run(ctx.options, self.schemas))
        state = AgentState.model_validate(ctx.state or {})
        held = self.history.get(ctx)
        # Before anything reads the view: the first turn a newer version runs upgrades it, in this commit
        # (whatever the turn's outcome that appends its messages, a budget stop included).
        past = migrate_view(ctx, self.view_migrations, held.messages)
        over = _over_budget(ctx.job_usage, cfg)
        if over:
            ctx.log(f"budget reached before turn {state.turn + 1}: {over}", "warn")
            return agent_run.ended(ctx, cfg, Done(result=None, reason="budget"), ctx.job_usage, state.turn)
        if state.turn == 0:
            agent_run.first_turn(ctx, cfg, past)
        if cfg.compaction is not None:
            try:
                past = self.compact(ctx, cfg, past, state.turn)
            except (TransientModelError, PermanentModelError) as exc:  # as the turn's own model call
                return agent_run.ended(ctx, cfg, _model_failed(ctx, cfg, exc, "the compaction call"), ctx.job_usage,
                                       state.turn)
        # Messages sent to the running conversation (app.send) join it here, in order, before the
        # model's answer; a turn whose answer is already journaled takes none (the model never saw them).
        taken_before = ctx.recorded(INBOX_STEP)[0]
        sent = ctx.take_inbox() if taken_before or not ctx.recorded(journal.MODEL)[0] else []
        if sent:
            ctx.append_messages(sent)
            past = [*past, *sent]
        # Each step above only appended to what the cache held: its ids plus those of the appended messages.
        ids = (held.ids | call_ids(past[len(held.messages):])) if len(past) > len(held.messages) else held.ids
        if not agent_run.quiet(ctx, cfg):
            fire(ctx, agent_run.callbacks_of(cfg), "on_turn_start", turn=state.turn + 1,
                 context=agent_run.context_of(ctx))
        # Tools read the run's context from their ToolContext, which the tool runner builds from this scope.
        ctx.tool_scope = ToolScope(agent_run.context_of(ctx), agent_run.tool_contexts(ctx, cfg))
        try:
            view = self.view_of(cfg, held, past)
            answer = self.answer(ctx, cfg, past, state.turn, ids, view)
            if isinstance(answer, Fail):
                return agent_run.ended(ctx, cfg, answer, ctx.job_usage, state.turn)
            return self.finish_turn(ctx, cfg, past, state, answer, ids, view)
        finally:
            ctx.tool_scope = None

    def view_of(self, cfg: AgentConfig, held: Held, past: list[Message]) -> View | None:
        """The model view of ``past``: the cached one extended by what was appended since, when it can be.

        ``None`` when no view of this configuration can be kept (tool previews): the model call builds it.
        """
        key = None if self.prefix else agent_run.view_key(cfg)
        if key is None:
            return None
        if held.view is not None and held.view.key == key:
            extra = past[len(held.messages):]
            grown = agent_run.extended_view(held.view.messages, extra) if extra else held.view.messages
            if grown is not None:
                return View(key, grown)
        return View(key, agent_run.turn_messages(cfg, past))

    def compact(self, ctx: PhaseContext[Any], cfg: AgentConfig, past: list[Message], turn: int) -> list[Message]:
        """Summarise older turns when the model view is too large (see :mod:`phases.compaction`); journaled."""
        assert cfg.compaction is not None
        found, raw = ctx.recorded(journal.COMPACTION)
        if not found:
            if ctx.recorded(journal.MODEL)[0]:
                return past  # this turn's answer was made without a compaction: keep it that way
            view = agent_run.turn_messages(cfg, past)
            cut = find_cut(past, cfg.compaction.keep_recent)
            if estimate_tokens(view) <= cfg.compaction.max_tokens or cut is None:
                return past
            request = summary_request(agent_run.turn_messages(cfg, past[:cut]), cfg.compaction.prompt)
            model, params = self._model(cfg.model, cfg.model_params)
            raw = ctx.step(journal.COMPACTION, lambda: {
                "cut": cut, "answer": _call_model(model, ctx, request, [], params, turn).model_dump(exclude_none=True)})
        response = ModelResponse.model_validate(raw["answer"])
        ctx.add_usage(response.usage, key=journal.COMPACTION)
        note = marker(str(response.message.get("content") or ""), int(raw["cut"]))
        ctx.append_messages([note])
        ctx.emit("compacted", turn=ctx.job_turn, upto=int(raw["cut"]))
        return [*past, note]

    def answer(self, ctx: PhaseContext[Any], cfg: AgentConfig, past: list[Message], turn: int,
               ids: frozenset[str] | None = None, view: View | None = None) -> ModelResponse | Fail:
        """The model's answer for this turn: journaled, so a re-run reuses it (I5).

        ``ids``: the tool call ids in ``past`` (computed from it when not given); ``view``: its model view
        (:meth:`view_of`; built by the call when not given).
        With ``stream`` on, its text goes to the job's live stream as it
        arrives (a replayed answer is sent whole): see :mod:`phases.streaming`.
        """
        # Events and live parts number a turn over the job's life (forks, the page): not ``turn``, the run's.
        sink = DeltaSink(ctx, ctx.job_turn, retries=cfg.stream_retries) if cfg.stream else None
        ctx.on_delta = sink
        # Call ids must be unique in the whole transcript (idempotency keys, child jobs), not only in the
        # model's view, which compaction shortens: the id check sees every earlier message.
        whole = frozenset(call_ids(past)) if ids is None else ids

        def dropped(answer: Any) -> None:
            # Fenced off after the model answered: the answer is lost to this attempt, its cost is not, and the
            # page's view of this turn's model call shows what it said.
            if isinstance(answer, dict):
                # Kept with every field (the journal leaves the defaults out): what the page shows of it.
                whole = ModelResponse.model_validate(answer)
                ctx.count_dropped(whole.usage, answer=_kept_answer(whole.model_dump(mode="json")),
                                  turn=ctx.job_turn)

        try:
            # The answer's last text goes out with its journal write (one round trip, see phases.streaming).
            # A final answer (no tool calls) is the turn's last write before its commit when nothing else
            # with effects runs in between: its reply is then read with the commit's (StepBeforeCommit).
            raw = ctx.step(journal.MODEL,
                           lambda: journal_form(self.call_model(ctx, cfg, self.prefix + past, turn, view, whole)),
                           publish=None if sink is None else lambda value: sink.final_parts(_content_of(value)),
                           before_commit=_final_and_quiet(ctx, cfg), on_refused=dropped)
        except StaleVersionError as exc:
            dropped(exc.unrecorded)
            raise
        except (TransientModelError, PermanentModelError) as exc:
            return _model_failed(ctx, cfg, exc)
        finally:
            ctx.on_delta = None
        response = ModelResponse.model_validate(raw)
        ctx.add_usage(response.usage, key=journal.MODEL)
        if sink is not None:
            content = response.message.get("content")
            sink.finish(content if isinstance(content, str) else None)
        return response

    def finish_turn(self, ctx: PhaseContext[Any], cfg: AgentConfig, past: list[Message], state: AgentState,
                    response: ModelResponse, ids: frozenset[str] | None = None,
                    view: View | None = None) -> Next | Done | Fail:
        message = response.message
        results = agent_run.run_turn_calls(ctx, cfg, response, state.turn)
        new_messages = [message, *results]
        _emit_turn_events(ctx, ctx.job_turn, response, results)
        info = TurnInfo(turn=state.turn + 1, message=message, tool_calls=response.tool_calls, tool_results=results,
                        state=state, usage=response.usage)
        total = ctx.job_usage + response.usage
        outcome: Next | Done | Fail = _decide(ctx, cfg, info, cut_short(response.finish_reason), total)
        if isinstance(outcome, Done):
            outcome = Done(result=_result_of(message, results), reason=outcome.reason)
            if cfg.output_schema is not None:
                model, params = self._model(cfg.model, cfg.model_params)
                try:
                    outcome = _structured(ctx, model, cfg.output_schema, agent_run.turn_messages(cfg, past),
                                          new_messages, outcome, params, state.turn)
                except (TransientModelError, PermanentModelError) as exc:  # as the turn's own model call
                    outcome = _model_failed(ctx, cfg, exc, "the structured-output call")
        agent_run.turn_ended(ctx, cfg, response, state.turn)
        agent_run.ended(ctx, cfg, outcome, total, state.turn)
        ctx.append_messages(new_messages)
        if not isinstance(outcome, Fail):
            # Closes the turn for a live-stream client: no text of it follows; these messages are its truth:
            # every one the turn appends (what it took from the inbox, a compaction's or a view migration's
            # note, and its own), which the commit puts at the transcript's end.
            ctx.emit("turn_committed", turn=ctx.job_turn,
                     messages=[ctx.transcript_len, ctx.transcript_len + ctx.appended])
        if isinstance(outcome, Done) and cfg.title_agent is not None:
            start_title(ctx, cfg.title_agent, [*past, *new_messages])
        if isinstance(outcome, Next):
            before = frozenset(call_ids(past)) if ids is None else ids
            after = None if view is None else agent_run.extended_view(view.messages, new_messages)
            self.history.remember_after_commit(ctx, [*past, *new_messages], before | call_ids(new_messages),
                                               None if view is None or after is None else View(view.key, after))
        else:
            self.history.forget(ctx.job_id)
        return outcome


def _model_failed(ctx: PhaseContext[Any], cfg: AgentConfig, exc: ModelError, call: str = "model call") -> Fail:
    """The turn's outcome when one of its model calls (its answer, the structured follow-up, the compaction
    summary) failed: a transient failure runs the turn again later (``RetryLater`` is raised; its journaled steps
    are kept) until ``max_model_attempts``; a permanent one fails the job. The paid attempts count either way."""
    _count_paid(ctx, exc)
    if not isinstance(exc, TransientModelError):
        return Fail(f"model error: {exc}")
    if ctx.attempt + 1 >= cfg.max_model_attempts:
        return Fail(f"{call} failed {ctx.attempt + 1} times, last: {exc}")
    delay = exc.retry_after if exc.retry_after is not None else min(300.0, 2.0 * 2**ctx.attempt)
    name = cfg.model if isinstance(cfg.model, str) else type(cfg.model).__name__
    where = "" if call == "model call" else f" ({call})"
    logger.warning("job %s: model %s failed%s: %s; the turn runs again in %.1fs", ctx.job_id, name, where, exc, delay)
    raise RetryLater(delay, f"model: {exc}") from exc


def _count_paid(ctx: PhaseContext[Any], exc: ModelError) -> None:
    """A failed model call's paid attempts (``ModelError.usage``) count for the job: committed with the retry or
    the failure, so budgets see them (the answer they paid for was never journaled)."""
    if isinstance(exc.usage, Usage) and exc.usage.model_calls:
        ctx.add_usage(exc.usage)


def _final_and_quiet(ctx: PhaseContext[Any], cfg: AgentConfig) -> Any:
    """Whether a model answer is the turn's last write before its commit: no tool calls to run after it, and no
    callback, structured answer or title (a predicate on the answer, or None when the config rules it out)."""
    if not agent_run.only_commit_follows(ctx, cfg):
        return None
    return lambda answer: isinstance(answer, dict) and not (answer.get("message") or {}).get("tool_calls")

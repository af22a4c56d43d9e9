"""Issue 5, "Bad input catalogue", on the memory adapters.

Every case asserts two things: a clear error naming the problem (the right
``pipelines.engine.errors`` class, a message naming the offending value or field),
and that nothing was half written (no job in storage, the job unchanged, or
nothing enqueued). Redis-only cases live in tests/integration/test_bad_input_redis.py.
"""

from __future__ import annotations

import logging
import math
import threading
from datetime import datetime
from typing import Any

import pytest
from pydantic import BaseModel

from adapters.memory import MemoryScheduler, MemoryStorage
from phases.approvals import record_tool_result
from pipelines import (
    Agent,
    App,
    Done,
    Fail,
    FailJob,
    JobStatus,
    Next,
    Phase,
    PhaseContext,
    RetryLater,
    Tool,
    ToolContext,
    WaitForInput,
    run_agent,
    run_pipeline,
    tool,
)
from pipelines.engine.control import cancel_job
from pipelines.engine.errors import (
    ConfigurationError,
    InvalidInputError,
    InvalidJobIdError,
    InvalidPipelineError,
    JobConflictError,
    JobNotFoundError,
    StateNotSerializableError,
    StateValidationError,
)
from pipelines.engine.models import validate_job_id
from pipelines.engine.phase import validate_state
from pipelines.engine.runner import AdvanceResult, try_advance
from pipelines.testing import ScriptedModel, call, reply
from pipelines.worker import load_app
from tests.unit.helpers import memory


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


def done_phase(ctx: PhaseContext[Any]) -> Done:
    return Done(result="ok")


ONE = [Phase("a", done_phase)]


def assert_nothing_written(storage: MemoryStorage, scheduler: MemoryScheduler) -> None:
    assert storage.list_jobs() == []
    assert scheduler.pending() == 0
    assert storage.writes == 0


def errored_job(storage: MemoryStorage, scheduler: MemoryScheduler, job_id: str = "j") -> dict[str, Any]:
    """A job that ran one phase and failed in the second: status error, checkpoint kept. Returns its snapshot."""

    def boom(ctx: PhaseContext[Any]) -> Done:
        raise RuntimeError("upstream down")

    run_pipeline(job_id=job_id, phases=[Phase("a", lambda ctx: Next("b", state={"n": 1})), Phase("b", boom)],
                 storage=storage, scheduler=scheduler, initial_state={"n": 0})
    scheduler.drain()
    rec = storage.get_job(job_id)
    assert rec is not None and rec.status is JobStatus.ERROR
    return storage.inspect(job_id)


def agent_kwargs(storage: MemoryStorage, scheduler: MemoryScheduler, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"job_id": "chat-1", "model": ScriptedModel(["hi"]), "tools": [add],
                            "initial_messages": ["hello"], "storage": storage, "scheduler": scheduler}
    base.update(kw)
    return base


# --- 1. invalid job ids ----------------------------------------------------------
BAD_IDS = [
    pytest.param("", "it is empty", id="empty"),
    pytest.param("x" * 201, "201 characters long", id="201-chars"),
    pytest.param("has space", "' '", id="space"),
    pytest.param("open{brace", "'{'", id="open-brace"),
    pytest.param("close}brace", "'}'", id="close-brace"),
    pytest.param("line\nbreak", r"'\n'", id="newline"),
    pytest.param("tab\there", r"'\t'", id="tab"),
    pytest.param("a/b", "'/'", id="slash"),
    pytest.param("\uff4aob-1", "'\uff4a'", id="fullwidth-j"),
    pytest.param("j\u043eb-1", "'\u043e'", id="cyrillic-o"),
    pytest.param("job-\U0001f600", "'\U0001f600'", id="emoji"),
    pytest.param("zero\u200bwidth", r"'\u200b'", id="zero-width-space"),
    pytest.param("nul\x00byte", r"'\x00'", id="nul"),
    pytest.param("star*", "'*'", id="glob-star"),
    pytest.param("caf\u00e9", "'\u00e9'", id="accented"),
]


@pytest.mark.parametrize(("bad", "why"), BAD_IDS)
def test_an_invalid_job_id_names_the_offending_character_and_nothing_is_written(bad: str, why: str) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidJobIdError) as info:
        run_agent(**agent_kwargs(storage, scheduler, job_id=bad))
    assert why in str(info.value)
    assert "allowed are 1-200 of [A-Za-z0-9._:-]" in str(info.value)
    assert_nothing_written(storage, scheduler)

    app = App(storage=storage, scheduler=scheduler, pipelines={"p": ONE})
    with pytest.raises(InvalidJobIdError, match="invalid job id"):
        app.run_pipeline("p", job_id=bad)
    assert_nothing_written(storage, scheduler)


@pytest.mark.parametrize("bad", [123, None, b"job-1", ["job-1"], 1.5], ids=lambda v: type(v).__name__)
def test_a_job_id_that_is_not_a_string_names_its_type(bad: Any) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidJobIdError, match=f"job id must be a string, got {type(bad).__name__}"):
        run_pipeline(job_id=bad, phases=ONE, storage=storage, scheduler=scheduler)
    assert_nothing_written(storage, scheduler)


def test_a_200_character_id_is_the_longest_accepted() -> None:
    storage, scheduler, _ = memory()
    run_pipeline(job_id="x" * 200, phases=ONE, storage=storage, scheduler=scheduler)
    assert scheduler.pending() == 1
    assert validate_job_id("a.b:c_d-9") == "a.b:c_d-9"


@pytest.mark.parametrize("bad", [".", ".."])
def test_dot_ids_are_refused_because_paths_would_resolve_them(bad: str) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidJobIdError, match="names a directory"):
        run_pipeline(job_id=bad, phases=ONE, storage=storage, scheduler=scheduler)
    assert_nothing_written(storage, scheduler)
    assert validate_job_id("..a") == "..a"


@pytest.mark.parametrize("bad", ["", "a b", "x}", "."])
def test_control_calls_reject_invalid_ids_too(bad: str) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidJobIdError):
        cancel_job(bad, storage=storage, scheduler=scheduler)
    with pytest.raises(InvalidJobIdError):
        record_tool_result(bad, "call_1", "ok", storage=storage, scheduler=scheduler)
    with pytest.raises(InvalidJobIdError):
        try_advance(job_id=bad, phases=ONE, storage=storage, scheduler=scheduler)
    assert_nothing_written(storage, scheduler)


def test_app_try_advance_rejects_an_invalid_id_like_redis_does() -> None:
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": ONE})
    with pytest.raises(InvalidJobIdError, match="' '"):
        app.try_advance("has space")


# --- 2. unknown pipeline ---------------------------------------------------------
def test_app_run_pipeline_of_an_unregistered_name_lists_the_known_ones() -> None:
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, pipelines={"etl": ONE, "chat": ONE})
    with pytest.raises(InvalidPipelineError, match=r"unknown pipeline 'nope'; this app has: chat, etl"):
        app.run_pipeline("nope", job_id="j")
    assert_nothing_written(storage, scheduler)


def test_app_try_advance_of_a_record_naming_an_unregistered_pipeline_changes_nothing(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.engine import control

    monkeypatch.setattr(control, "_skipped", {})  # said once every 10 min a process: not said by an earlier test
    storage, scheduler, _ = memory()
    App(storage=storage, scheduler=scheduler, pipelines={"etl": ONE}).run_pipeline("etl", job_id="j")
    before = storage.inspect("j")
    pending = scheduler.pending()
    # A worker deployed without the "etl" pipeline picks the job up.
    other = App(storage=storage, scheduler=scheduler, pipelines={"chat": ONE})
    with pytest.raises(InvalidPipelineError, match="unknown pipeline 'etl'; this app has: chat"):
        other.try_advance("j")
    assert storage.inspect("j") == before  # same record, no lease taken, still due
    assert scheduler.pending() == pending
    # The sweep reports it and goes on instead of crashing; the log says why in one line, not a traceback.
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        assert other.advance_due() == [("j", AdvanceResult.UNREACHED)]  # not "unknown": that is no such job
    assert storage.inspect("j") == before
    said = [r.getMessage() for r in caplog.records]
    assert any("the due jobs of pipeline(s) 'etl'" in m and "this app does not register them" in m
               and "pipelines cancel" in m for m in said), said


# --- 3. unknown initial_phase ----------------------------------------------------
def test_an_unknown_initial_phase_is_named_with_the_known_ones() -> None:
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("a", done_phase), Phase("b", done_phase)]})
    with pytest.raises(InvalidPipelineError, match=r"unknown initial_phase 'c'; phases are a, b"):
        app.run_pipeline("p", job_id="j", initial_phase="c")
    assert_nothing_written(storage, scheduler)


def test_an_unknown_initial_phase_on_a_retry_leaves_the_job_unchanged() -> None:
    storage, scheduler, _ = memory()
    before = errored_job(storage, scheduler)
    with pytest.raises(InvalidPipelineError, match="'zz'"):
        run_pipeline(job_id="j", phases=ONE, storage=storage, scheduler=scheduler, retry_mode="full",
                     initial_phase="zz")
    assert storage.inspect("j") == before and scheduler.pending() == 0


# --- 4. unknown next phase at runtime --------------------------------------------
def test_an_unknown_next_phase_fails_the_job_and_drops_the_phases_output() -> None:
    storage, scheduler, _ = memory()

    def a(ctx: PhaseContext[Any]) -> Next:
        ctx.append_messages([{"role": "assistant", "content": "must not land"}])
        ctx.step("work", lambda: 1)
        return Next("nowhere", state={"n": 99})

    run_pipeline(job_id="j", phases=[Phase("a", a), Phase("b", done_phase)], storage=storage, scheduler=scheduler,
                 initial_state={"n": 1})
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error == "phase 'a' asked for unknown next phase 'nowhere'; phases are a, b"
    assert job.checkpoint is not None and job.checkpoint.next_phase == "a" and job.checkpoint.state == {"n": 1}
    assert storage.messages("j") == [] and job.transcript_len == 0
    assert scheduler.pending() == 0


# --- 5. state that is not JSON ---------------------------------------------------
class Opaque:
    pass


BAD_STATES = [
    pytest.param({"o": Opaque()}, "not JSON-serialisable", id="object"),
    pytest.param({"s": {1, 2}}, "not JSON-serialisable", id="set"),
    pytest.param({"x": math.nan}, "not JSON-serialisable", id="nan"),
    pytest.param({"x": math.inf}, "not JSON-serialisable", id="inf"),
    pytest.param({"t": (1, 2)}, "round trip", id="tuple"),
    pytest.param({1: "x"}, "round trip", id="int-key"),
    pytest.param({"b": b"raw"}, "not JSON-serialisable", id="bytes"),
    pytest.param({"when": datetime(2024, 1, 1)}, "not JSON-serialisable", id="datetime"),
]


@pytest.mark.parametrize(("state", "why"), BAD_STATES)
def test_an_initial_state_that_is_not_json_is_rejected_before_anything_is_written(state: Any, why: str) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(StateNotSerializableError) as info:
        run_pipeline(job_id="j", phases=ONE, storage=storage, scheduler=scheduler, initial_state=state)
    assert "initial_state of job 'j'" in str(info.value) and why in str(info.value)
    assert_nothing_written(storage, scheduler)


def test_a_bad_initial_state_on_a_full_retry_leaves_the_errored_job_unchanged() -> None:
    storage, scheduler, _ = memory()
    before = errored_job(storage, scheduler)
    with pytest.raises(StateNotSerializableError, match="initial_state of job 'j'"):
        run_pipeline(job_id="j", phases=ONE, storage=storage, scheduler=scheduler, retry_mode="full",
                     initial_state={"s": {1}})
    assert storage.inspect("j") == before and scheduler.pending() == 0


def _next_bad(ctx: PhaseContext[Any]) -> Next:
    return Next("b", state={"s": {1}})


def _done_bad(ctx: PhaseContext[Any]) -> Done:
    return Done(result=(1, 2))


def _save_bad(ctx: PhaseContext[Any]) -> Next:
    ctx.save_state({"x": math.nan})
    return Next("b")


def _step_bad(ctx: PhaseContext[Any]) -> Next:
    ctx.step("fetch", lambda: {"rows": {1, 2}})
    return Next("b")


@pytest.mark.parametrize(
    ("phase", "named"),
    [
        pytest.param(_next_bad, "state returned by phase 'a'", id="next-state"),
        pytest.param(_done_bad, "result returned by phase 'a'", id="done-result"),
        pytest.param(_save_bad, "state saved by phase 'a'", id="save-state"),
        pytest.param(_step_bad, "result of step 'fetch'", id="step-result"),
    ],
)
def test_a_phase_producing_non_json_fails_the_job_naming_what_and_keeps_the_checkpoint(phase: Any,
                                                                                        named: str) -> None:
    storage, scheduler, _ = memory()

    def wrapped(ctx: PhaseContext[Any]) -> Any:
        ctx.append_messages([{"role": "assistant", "content": "must not land"}])
        return phase(ctx)

    run_pipeline(job_id="j", phases=[Phase("a", wrapped), Phase("b", done_phase)], storage=storage,
                 scheduler=scheduler, initial_state={"n": 1})
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error is not None and named in job.error
    assert job.checkpoint is not None and job.checkpoint.next_phase == "a" and job.checkpoint.state == {"n": 1}
    assert storage.messages("j") == [] and job.checkpoint.journal == {}
    assert scheduler.pending() == 0


def test_a_transcript_message_without_a_role_fails_the_phase_and_nothing_lands() -> None:
    storage, scheduler, _ = memory()

    def a(ctx: PhaseContext[Any]) -> Next:
        ctx.append_messages([{"role": "assistant", "content": "fine"}])
        ctx.append_messages([{"content": "no role"}])
        return Next("b")

    run_pipeline(job_id="j", phases=[Phase("a", a), Phase("b", done_phase)], storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error is not None and job.error.startswith("StateNotSerializableError:") and "'role'" in job.error
    assert storage.messages("j") == []


# --- 6. a stored state that no longer validates (the schema changed) --------------
class CartV1(BaseModel):
    items: list[str]


class CartV2(BaseModel):
    items: list[str]
    currency: str  # added in v2, no default: old checkpoints no longer validate


class CartV3(BaseModel):
    items: list[str]
    currency: str = "EUR"  # the fix: a default


def test_a_stored_state_that_fails_the_new_schema_fails_the_job_naming_field_and_model() -> None:
    storage, scheduler, _ = memory()
    run_pipeline(job_id="cart", phases=[Phase("pay", done_phase, state_model=CartV1)], storage=storage,
                 scheduler=scheduler, initial_state=CartV1(items=["a"]))
    scheduler.drop_all()  # deployed v2 before any worker ran it
    stored = storage.inspect("cart")

    def pay(ctx: PhaseContext[Any]) -> Done:
        return Done(result=ctx.state.currency)

    res = try_advance(job_id="cart", phases=[Phase("pay", pay, state_model=CartV2)], storage=storage,
                      scheduler=scheduler)
    assert res is AdvanceResult.FAILED
    job = storage.get_job("cart")
    assert job is not None and job.status is JobStatus.ERROR and job.error is not None
    assert job.error.startswith("StateValidationError: stored state does not validate against CartV2 for phase 'pay'")
    assert "currency" in job.error
    # The stored state is untouched, so a fixed deployment resumes it.
    assert job.checkpoint is not None and job.checkpoint.state == stored["record"]["checkpoint"]["state"]
    fixed = [Phase("pay", pay, state_model=CartV3)]
    run_pipeline(job_id="cart", phases=fixed, storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert storage.get_job("cart").result == "EUR"  # type: ignore[union-attr]


def test_validate_state_raises_state_validation_error() -> None:
    with pytest.raises(StateValidationError, match=r"(?s)CartV2 for phase 'pay'.*currency"):
        validate_state(Phase("pay", done_phase, state_model=CartV2), {"items": []})


# --- 7. oversized messages --------------------------------------------------------
def test_a_5_mb_message_is_under_the_limit_and_round_trips_unchanged() -> None:
    storage, scheduler, _ = memory()
    big = "x" * (5 * 1024 * 1024)
    model = ScriptedModel(["ok"])
    run_agent(**agent_kwargs(storage, scheduler, model=model, initial_messages=[big]))
    scheduler.drain()
    assert storage.messages("chat-1")[0]["content"] == big
    assert model.calls[0].messages[0]["content"] == big
    assert storage.get_job("chat-1").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_an_oversized_message_is_refused_naming_its_size_with_nothing_written() -> None:
    from pipelines.engine.errors import ValueTooLargeError

    storage, scheduler, _ = memory()
    big = "x" * (9 * 1024 * 1024)
    with pytest.raises(ValueTooLargeError, match=r"a transcript message is 9\.0 MiB of JSON, above the 8\.0 MiB"):
        run_agent(**agent_kwargs(storage, scheduler, model=ScriptedModel(["ok"]), initial_messages=[big]))
    assert storage.get_job("chat-1") is None and scheduler.pending() == 0


def test_an_oversized_step_result_fails_the_job_clearly_and_keeps_the_checkpoint() -> None:
    storage, scheduler, _ = memory()

    def fetch(ctx: PhaseContext[Any]) -> Done:
        ctx.step("download", lambda: "y" * (9 * 1024 * 1024))
        return Done()

    run_pipeline(job_id="big", phases=[Phase("fetch", fetch)], storage=storage, scheduler=scheduler,
                 initial_state={"n": 1})
    scheduler.drain()
    job = storage.get_job("big")
    assert job is not None and job.status is JobStatus.ERROR and job.checkpoint is not None
    assert job.error is not None and "result of step 'download' is 9.0 MiB" in job.error
    assert job.checkpoint.journal == {}


# --- 8. tools ------------------------------------------------------------------------
def _star_args(*items: int) -> int:
    return len(items)


def _star_kwargs(**items: int) -> int:
    return len(items)


def _untyped(x, y: int) -> int:  # type: ignore[no-untyped-def]
    return y


def _positional_only(a: int, /, b: int) -> int:
    return a + b


def _unresolvable(x: Nope) -> int:  # type: ignore[name-defined]  # noqa: F821
    return 1


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        pytest.param(_star_args, r"tool '_star_args': \*args/\*\*kwargs are not supported", id="var-positional"),
        pytest.param(_star_kwargs, r"tool '_star_kwargs': \*args/\*\*kwargs are not supported", id="var-keyword"),
        pytest.param(_untyped, "tool '_untyped': parameter 'x' needs a type annotation", id="missing-annotation"),
        pytest.param(_positional_only, "tool '_positional_only': positional-only parameter 'a' is not supported",
                     id="positional-only"),
        pytest.param(_unresolvable, "tool '_unresolvable': cannot resolve type annotations: name 'Nope'",
                     id="unresolvable-annotation"),
    ],
)
def test_unsupported_tool_signatures_name_the_tool_and_the_parameter(fn: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        tool(fn)


def _takes_lock(lock: threading.Lock) -> int:
    return 1


def test_a_tool_parameter_type_pydantic_cannot_handle_is_an_invalid_input_error() -> None:
    with pytest.raises(InvalidInputError, match=r"tool '_takes_lock'.*'lock'"):
        tool(_takes_lock)


@pytest.mark.parametrize("name", ["", "has space", "dot.name", "x" * 65, "caf\u00e9", "a/b", "semi;colon", None])
def test_a_bad_tool_name_is_named_in_the_error(name: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"must be 1-64 of \[A-Za-z0-9_-\]") as info:
        Tool(name=name, description="d", input_model=BaseModel, execute=lambda args: None)
    assert repr(name) in str(info.value)
    if isinstance(name, str) and name:

        def typed(a: int) -> int:
            return a

        with pytest.raises(InvalidInputError, match="must be 1-64"):
            tool(name=name)(typed)


def test_a_lambda_has_no_usable_tool_name() -> None:
    with pytest.raises(InvalidInputError, match="tool name '<lambda>'"):
        tool(lambda: None)  # no parameters to check; the name is what is wrong


def test_duplicate_tool_names_from_different_functions_are_rejected_and_nothing_written() -> None:
    @tool(name="lookup")
    def lookup_a(q: str) -> str:
        """A."""
        return q

    @tool(name="lookup")
    def lookup_b(q: str) -> str:
        """B."""
        return q

    storage, scheduler, _ = memory()
    with pytest.raises(InvalidInputError, match="duplicate tool name 'lookup'"):
        run_agent(**agent_kwargs(storage, scheduler, tools=[lookup_a, lookup_b]))
    assert_nothing_written(storage, scheduler)


def test_a_tools_dict_key_that_is_not_the_tool_name_is_rejected() -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidInputError, match="tools dict key 'plus' does not match the tool's name 'add'"):
        run_agent(**agent_kwargs(storage, scheduler, tools={"plus": add}))
    with pytest.raises(InvalidInputError, match=r"tools\['add'\] is a function, not a Tool"):
        run_agent(**agent_kwargs(storage, scheduler, tools={"add": done_phase}))
    assert_nothing_written(storage, scheduler)


def test_a_single_tool_instead_of_a_list_is_a_clear_error() -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidInputError, match="tools must be a list"):
        run_agent(**agent_kwargs(storage, scheduler, tools=add))
    assert_nothing_written(storage, scheduler)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on_interrupted": "maybe"}, "on_interrupted must be retry, fail, reconcile or ask"),
        ({"on_interrupted": "reconcile"}, "on_interrupted='reconcile' needs a reconcile function"),
        ({"input_model": dict}, "input_model must be a pydantic model class"),
        ({"execute": "not callable"}, "execute must be callable"),
    ],
)
def test_explicit_tool_options_are_checked_at_definition(kwargs: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"name": "t", "description": "d", "input_model": BaseModel, "execute": lambda a: None}
    with pytest.raises(InvalidInputError, match=f"tool 't': {message}"):
        Tool(**{**base, **kwargs})


def test_a_tool_context_parameter_is_not_a_model_argument() -> None:
    # Positive control for the signature checks: a ToolContext parameter is allowed and hidden from the schema.
    @tool
    def charge(amount: int, ctx: ToolContext) -> str:
        """Charge."""
        return ctx.idempotency_key

    assert set(charge.schema()["function"]["parameters"]["properties"]) == {"amount"}


# --- 9. agent limits and options ------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -3, True, False, 2.0, "3", None], ids=repr)
def test_max_turns_must_be_a_positive_int_and_nothing_is_written(bad: Any) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidInputError, match=f"max_turns must be a positive int, got {bad!r}"):
        run_agent(**agent_kwargs(storage, scheduler, max_turns=bad))
    assert_nothing_written(storage, scheduler)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": ""}, "model must be a litellm model string"),
        ({"model": object()}, "got object"),
        ({"system": 42}, "system must be a string, got int"),
        ({"name": ""}, "an agent needs a non-empty name"),
        ({"stop_when": "never"}, "stop_when must be a callable or a list of callables"),
    ],
)
def test_bad_agent_options_are_rejected_before_anything_is_written(kwargs: dict[str, Any], message: str) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidInputError, match=message):
        run_agent(**agent_kwargs(storage, scheduler, **kwargs))
    assert_nothing_written(storage, scheduler)


def test_a_non_callable_stop_when_is_a_clear_error() -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidInputError, match="stop_when must be a callable"):
        run_agent(**agent_kwargs(storage, scheduler, stop_when=5))
    assert_nothing_written(storage, scheduler)


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "abc", True])
def test_a_bad_continue_for_is_rejected_when_the_app_is_built(bad: object) -> None:
    # It was kept as given and checked at each advance: every job stayed running, failing at every delivery.
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidInputError, match="continue_for must be a finite number of seconds >= 0"):
        App(storage=storage, scheduler=scheduler, continue_for=bad)  # type: ignore[arg-type]
    assert App(storage=storage, scheduler=scheduler, continue_for=2).continue_for == 2.0
    assert_nothing_written(storage, scheduler)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, 0.2, 0.999])
def test_a_bad_lease_time_is_rejected_at_the_call(bad: float) -> None:
    # 0.2 s was taken and never held: its renewal came after it ran out, every turn fenced off and its tools run
    # again, for ever.
    storage, scheduler, _ = memory()
    # The lease is the App's setting (one place): a per-call value cannot silently replace it.
    with pytest.raises(InvalidInputError, match="lease_seconds"):
        App(storage=storage, scheduler=scheduler, lease_seconds=bad)
    assert_nothing_written(storage, scheduler)


# --- 10. retry_mode -----------------------------------------------------------------
@pytest.mark.parametrize("bad", ["resum", "FULL", "", True, 1], ids=repr)
def test_an_unknown_retry_mode_is_named_and_nothing_is_written(bad: Any) -> None:
    storage, scheduler, _ = memory()
    msg = f"retry_mode must be None, 'resume' or 'full', got {bad!r}"
    with pytest.raises(InvalidInputError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        run_pipeline(job_id="j", phases=ONE, storage=storage, scheduler=scheduler, retry_mode=bad)
    with pytest.raises(InvalidInputError, match="retry_mode"):
        run_agent(**agent_kwargs(storage, scheduler, retry_mode=bad))
    assert_nothing_written(storage, scheduler)


def test_an_unknown_retry_mode_on_a_failed_job_leaves_it_unchanged() -> None:
    storage, scheduler, _ = memory()
    before = errored_job(storage, scheduler)
    with pytest.raises(InvalidInputError, match="'restart'"):
        App(storage=storage, scheduler=scheduler, pipelines={"default": ONE}).run_pipeline(
            "default", job_id="j", retry_mode="restart")  # type: ignore[arg-type]
    assert storage.inspect("j") == before and scheduler.pending() == 0


def test_resume_of_a_job_that_does_not_exist_is_not_found() -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(JobNotFoundError, match="job 'ghost' does not exist; nothing to resume"):
        run_pipeline(job_id="ghost", phases=ONE, storage=storage, scheduler=scheduler, retry_mode="resume")
    assert_nothing_written(storage, scheduler)


# --- 11. initial messages ------------------------------------------------------------
@pytest.mark.parametrize(
    ("messages", "error", "message"),
    [
        pytest.param("just a string", InvalidInputError, "must be a list of messages", id="str"),
        pytest.param({"role": "user", "content": "hi"}, InvalidInputError, "must be a list of messages", id="dict"),
        pytest.param([{"content": "no role"}], InvalidInputError, "'no role'", id="no-role"),
        pytest.param([{"role": 1, "content": "x"}], InvalidInputError, "with a 'role'", id="role-not-str"),
        pytest.param([42], InvalidInputError, "got 42", id="int"),
        pytest.param([None], InvalidInputError, "got None", id="none"),
        pytest.param([{"role": "user", "content": math.nan}], InvalidInputError,
                     "a user message needs a 'content' \\(a string or a list of content parts\\)", id="nan-content"),
        pytest.param([{"role": "user", "content": {1, 2}}], InvalidInputError,
                     "a user message needs a 'content' \\(a string or a list of content parts\\)", id="set-content"),
        pytest.param([{"role": "user", "content": ["x", math.nan]}], StateNotSerializableError,
                     "initial messages of job 'chat-1'", id="nan-in-parts"),
    ],
)
def test_bad_initial_messages_are_named_and_nothing_is_written(messages: Any, error: type[Exception],
                                                              message: str) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(error, match=message):
        run_agent(**agent_kwargs(storage, scheduler, initial_messages=messages))
    assert_nothing_written(storage, scheduler)


@pytest.mark.parametrize("messages", [None, 42])
def test_initial_messages_that_are_not_iterable_are_a_clear_error(messages: Any) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidInputError, match="initial_messages must be a list"):
        run_agent(**agent_kwargs(storage, scheduler, initial_messages=messages))
    assert_nothing_written(storage, scheduler)


def test_new_messages_for_a_failed_job_are_a_conflict_and_change_nothing() -> None:
    storage, scheduler, _ = memory()
    model = ScriptedModel([reply(None, call("nope"))])  # unknown tool is fine; then the script runs out
    run_agent(**agent_kwargs(storage, scheduler, model=model))
    scheduler.drain()
    before = storage.inspect("chat-1")
    assert before["record"]["status"] == "error"
    with pytest.raises(JobConflictError, match="new messages only continue a complete job"):
        run_agent(**agent_kwargs(storage, scheduler, model=model, initial_messages=["more"]))
    assert storage.inspect("chat-1") == before and scheduler.pending() == 0


def test_a_tool_result_for_a_call_that_is_not_in_the_turn_is_named() -> None:
    storage, scheduler, _ = memory()
    before = errored_job(storage, scheduler)
    with pytest.raises(InvalidInputError, match="job 'j' has no tool call 'call_9' in its current turn"):
        record_tool_result("j", "call_9", {"ok": True}, storage=storage, scheduler=scheduler)
    with pytest.raises(JobNotFoundError, match="'ghost'"):
        record_tool_result("ghost", "call_9", {"ok": True}, storage=storage, scheduler=scheduler)
    assert storage.inspect("j") == before and scheduler.pending() == 0


# --- 12. Next(delay=...) and RetryLater ---------------------------------------------
@pytest.mark.parametrize("bad", [-1, -0.001, math.nan, "5", None, 1e10, math.inf], ids=repr)
def test_a_bad_next_delay_is_rejected_and_a_phase_returning_it_fails_the_job(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"Next\.delay must be a number of seconds from 0 to 315360000"):
        Next("b", delay=bad)
    storage, scheduler, _ = memory()

    def a(ctx: PhaseContext[Any]) -> Next:
        ctx.append_messages([{"role": "assistant", "content": "must not land"}])
        return Next("b", state={"n": 2}, delay=bad)

    run_pipeline(job_id="j", phases=[Phase("a", a), Phase("b", done_phase)], storage=storage, scheduler=scheduler,
                 initial_state={"n": 1})
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error is not None and "Next.delay must be a number of seconds from 0 to 315360000" in job.error
    assert job.checkpoint is not None and job.checkpoint.state == {"n": 1} and storage.messages("j") == []


@pytest.mark.parametrize(
    ("ending", "error"),
    [
        pytest.param(lambda: Fail(ValueError("upstream said no")), "ValueError: upstream said no", id="fail-exception"),
        pytest.param(lambda: Fail(42), "Fail(error) takes a message (a string) or an exception, got int",
                     id="fail-int"),
        pytest.param(lambda: _raise(FailJob(RuntimeError("card declined"))), "RuntimeError: card declined",
                     id="failjob-exception"),
        pytest.param(lambda: _raise(WaitForInput("ok?", details=[1])), "WaitForInput(details=) must be a dict",
                     id="wait-details-list"),
        pytest.param(lambda: _raise(WaitForInput(None)), "WaitForInput(reason) must be a string", id="wait-reason"),  # type: ignore[arg-type]
    ],
)
def test_a_phase_ending_with_a_wrong_type_fails_its_job_once(ending: Any, error: str) -> None:
    storage, scheduler, _ = memory()
    effects: list[int] = []

    def a(ctx: PhaseContext[Any]) -> Any:
        effects.append(1)  # a side effect: it must not run again at every sweep
        return ending()

    run_pipeline(job_id="j", phases=[Phase("a", a)], storage=storage, scheduler=scheduler, initial_state={"n": 1})
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.ERROR and error in (job.error or "")
    assert storage.due_jobs(math.inf) == [] and effects == [1]


def _raise(exc: BaseException) -> Any:
    raise exc


def test_the_sweep_goes_on_past_a_job_it_cannot_advance(monkeypatch: pytest.MonkeyPatch) -> None:
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, provenance=False,
              pipelines={"p": [Phase("a", done_phase)]})
    for job in ("a-bad", "b-good", "c-good"):
        app.run_pipeline("p", job_id=job, initial_state={})
    scheduler.drop_all()  # the queue lost the messages: the sweep is the safety net (I7)
    advance = app.controls.advance

    def broken(job_id: str) -> Any:
        if job_id == "a-bad":
            raise TypeError("a bug no check caught")
        return advance(job_id)

    monkeypatch.setattr(app.controls, "advance", broken)
    done = dict(app.advance_due())
    assert done["a-bad"] is AdvanceResult.UNREACHED
    assert done["b-good"] is AdvanceResult.COMPLETED and done["c-good"] is AdvanceResult.COMPLETED


@pytest.mark.parametrize("bad", [True, False, math.nan, "5", None], ids=repr)
def test_a_bad_retry_later_delay_is_an_invalid_input_error(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="RetryLater needs a delay in seconds"):
        RetryLater(bad)


def test_a_bad_next_delay_is_an_invalid_input_error() -> None:
    with pytest.raises(InvalidInputError, match="-1"):
        Next("b", delay=-1)


@pytest.mark.parametrize("delay", [math.inf, 1e10], ids=["inf", "centuries"])
@pytest.mark.parametrize("how", ["next", "retry_later"])
def test_an_infinite_delay_is_rejected_and_the_job_stays_readable(how: str, delay: float) -> None:
    # Past MAX_DELAY (ten years) a thread's wait overflows (~292 years) and a queue's datetime does (year 9999).
    storage, scheduler, _ = memory()

    def a(ctx: PhaseContext[Any]) -> Next:
        if how == "retry_later":
            raise RetryLater(delay)
        return Next("b", delay=delay)

    run_pipeline(job_id="j", phases=[Phase("a", a), Phase("b", done_phase)], storage=storage, scheduler=scheduler)
    try:
        scheduler.drain()
    finally:
        job = storage.get_job("j")  # today: pydantic ValidationError, the job is unreadable
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error is not None and "315360000 (ten years" in job.error


# --- 13. pipeline definitions ---------------------------------------------------------
@pytest.mark.parametrize(
    ("phases", "message"),
    [
        pytest.param(Phase("a", done_phase), "phases must be a list of Phase, got Phase", id="single-phase"),
        pytest.param([Phase("a", done_phase), done_phase], "phases must be Phase objects, got function",
                     id="function-in-list"),
        pytest.param("ab", "phases must be Phase objects, got str", id="str"),
    ],
)
def test_phases_that_are_not_a_list_of_phase_are_rejected(phases: Any, message: str) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidPipelineError, match=message):
        run_pipeline(job_id="j", phases=phases, storage=storage, scheduler=scheduler)
    assert_nothing_written(storage, scheduler)


def test_a_phase_needs_a_name_and_a_callable() -> None:
    with pytest.raises(InvalidPipelineError, match="a phase needs a non-empty name, got ''"):
        Phase("", done_phase)
    with pytest.raises(InvalidPipelineError, match="phase 'a': run must be callable, got str"):
        Phase("a", "done")  # type: ignore[arg-type]
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": ONE})
    with pytest.raises(InvalidPipelineError, match="pipeline 'p' is registered twice"):
        app.add_pipeline("p", ONE)


# --- 14. a job deleted while a worker holds its lease ---------------------------------
def _deleting(storage: MemoryStorage, where: str) -> Any:
    def a(ctx: PhaseContext[Any]) -> Next:
        storage.delete_job(ctx.job_id)  # an operator (another process) deletes the job mid-phase
        if where == "step":
            ctx.step("work", lambda: 1)
        elif where == "save_state":
            ctx.save_state({"n": 2})
        ctx.append_messages([{"role": "assistant", "content": "must not land"}])
        return Next("b", state={"n": 3})

    return a


@pytest.mark.parametrize("where", ["commit", "step", "save_state"])
def test_a_job_deleted_under_a_running_phase_stays_deleted(where: str) -> None:
    storage, scheduler, _ = memory()
    phases = [Phase("a", _deleting(storage, where)), Phase("b", done_phase)]
    run_pipeline(job_id="j", phases=phases, storage=storage, scheduler=scheduler, initial_state={"n": 1})
    scheduler.drop_all()
    assert try_advance(job_id="j", phases=phases, storage=storage, scheduler=scheduler) is AdvanceResult.STALE
    assert storage.get_job("j") is None and storage.inspect("j") == {}
    assert storage.due_jobs(1e12) == [] and storage.messages("j") == []
    assert scheduler.pending() == 0  # nothing enqueued for the deleted job
    assert try_advance(job_id="j", phases=phases, storage=storage, scheduler=scheduler) is AdvanceResult.UNKNOWN


def test_a_stale_worker_cannot_commit_into_a_job_recreated_under_the_same_id() -> None:
    storage, scheduler, _ = memory()

    def a(ctx: PhaseContext[Any]) -> Next:
        if ctx.state.get("gen") == 1:
            storage.delete_job(ctx.job_id)
            run_pipeline(job_id=ctx.job_id, phases=phases, storage=storage, scheduler=scheduler,
                         initial_state={"gen": 2})
            ctx.append_messages([{"role": "assistant", "content": "from the deleted run"}])
            return Next("b", state={"gen": "stale"})
        return Next("b")

    phases = [Phase("a", a), Phase("b", done_phase)]
    run_pipeline(job_id="j", phases=phases, storage=storage, scheduler=scheduler, initial_state={"gen": 1})
    scheduler.drop_all()
    result = try_advance(job_id="j", phases=phases, storage=storage, scheduler=scheduler)
    job = storage.get_job("j")
    assert job is not None and job.initial_state == {"gen": 2}
    assert job.checkpoint is not None and job.checkpoint.state == {"gen": 2}
    assert storage.messages("j") == []
    assert result is AdvanceResult.STALE


# --- 15. load_app ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.apps.memory_app", "app path must look like 'package.module:app'"),
        (":app", "app path must look like 'package.module:app'"),
        ("tests.apps.memory_app:", "app path must look like 'package.module:app'"),
        ("", "app path must look like"),
        ("tests.apps.no_such_module:app", "cannot import 'tests.apps.no_such_module'"),
        ("tests/apps/memory_app.py:app", "cannot import 'tests/apps/memory_app.py'"),
        ("tests.apps.memory_app:nothing", "module 'tests.apps.memory_app' has no attribute 'nothing'"),
        ("tests.apps.memory_app:app.", "has no attribute 'app.'"),
        ("tests.apps.memory_app:START", "'tests.apps.memory_app:START' is a float, not a pipelines.App"),
        ("tests.apps.memory_app:app.storage", "is a MemoryStorage, not a pipelines.App"),
    ],
)
def test_load_app_bad_paths_are_configuration_errors_naming_the_path(path: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace(".", r"\.")):
        load_app(path)


@pytest.mark.parametrize(
    "path",
    [None, 123, ".relative:app", "tests.apps.memory_app:App", "tests.apps.memory_app:_finish",
     "tests.apps.broken_app:app"],
    ids=["none", "int", "relative", "class-needing-args", "function-needing-args", "module-raises"],
)
def test_load_app_never_lets_a_raw_exception_escape(path: Any) -> None:
    with pytest.raises(ConfigurationError):
        load_app(path)


def test_a_commit_refuses_a_negative_cut_or_take_and_a_record_of_another_job() -> None:
    # What a storage would otherwise do differently (SQLite deleted the whole transcript for a cut of -1, the
    # memory storage its last message) or store under the wrong id: refused where the commit is made.
    from pydantic import ValidationError

    from pipelines.engine.models import Commit, JobRecord, JobStatus

    record = JobRecord(job_id="j", status=JobStatus.RUNNING, version=2)
    with pytest.raises(ValidationError, match="truncate_messages_to"):
        Commit(job_id="j", expected_version=1, token="t", record=record, truncate_messages_to=-1)
    with pytest.raises(ValidationError, match="take_inbox"):
        Commit(job_id="j", expected_version=1, token="t", record=record, take_inbox=-2)
    with pytest.raises(ValidationError, match="the commit of job 'k' holds the record of job 'j'"):
        Commit(job_id="k", expected_version=1, token="t", record=record)
    ok = Commit(job_id="j", expected_version=1, token="t", record=record, truncate_messages_to=0)
    assert ok.truncate_messages_to == 0 and ok.take_inbox == 0


class _Needs(BaseModel):
    n: int


class _Defaults(BaseModel):
    rows: list[int] = []


def _reads_n(ctx: Any) -> Done:
    return Done(result=ctx.state.n)


def _reads_rows(ctx: Any) -> Done:
    return Done(result=len(ctx.state.rows))


def test_an_initial_state_the_first_phase_cannot_read_is_refused_before_anything_is_written() -> None:
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    with pytest.raises(InvalidInputError, match=r"job 'a' needs an initial_state: the first phase reads a _Needs, "
                                                 r"which has required fields \(n: Field required\)"):
        run_pipeline(job_id="a", phases=[Phase("p", _reads_n)], state_model=_Needs, storage=storage,
                     scheduler=scheduler)
    with pytest.raises(InvalidInputError, match=r"initial_state of job 'b' does not validate against _Needs: n: "):
        run_pipeline(job_id="b", phases=[Phase("p", _reads_n)], state_model=_Needs, storage=storage,
                     scheduler=scheduler, initial_state={"n": "many"})
    assert storage.list_jobs() == [] and scheduler.pending() == 0
    # A state model whose fields all have defaults: no initial_state starts from them.
    run_pipeline(job_id="c", phases=[Phase("p", _reads_rows)], state_model=_Defaults, storage=storage,
                 scheduler=scheduler)
    scheduler.drain()
    rec = storage.get_job("c")
    assert rec is not None and rec.status is JobStatus.COMPLETE and rec.result == 0


def test_a_complete_conversation_started_again_with_nothing_new_is_refused_not_asked_again() -> None:
    model = ScriptedModel(["one", "two", "three"])
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[Agent(name="a", model=model)])
    app.run_agent("a", job_id="d", messages=["hi"]).wait()
    with pytest.raises(JobConflictError, match=r"job 'd' is complete: continue the conversation with new messages"):
        app.run_agent("a", job_id="d")
    assert [m["role"] for m in app.messages("d")] == ["user", "assistant"] and len(model.calls) == 1
    assert app.run_agent("a", job_id="d", user="more").wait().status is JobStatus.COMPLETE  # new messages: goes on


@pytest.mark.parametrize(("message", "says"), [
    ({"role": "bogus", "content": "x"}, "a message's role must be one of system, developer, user, assistant, tool"),
    ({"role": "user"}, "a user message needs a 'content'"),
    ({"role": "system", "content": None}, "a system message needs a 'content'"),
    ({"role": "tool", "content": "42"}, "a tool message needs the 'tool_call_id' of the call it answers"),
    ({"role": "assistant"}, "an assistant message needs a 'content' or 'tool_calls'"),
])
def test_a_message_no_model_could_read_is_refused_when_the_run_starts(message: dict[str, Any], says: str) -> None:
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    with pytest.raises(InvalidInputError, match=says):
        run_agent(job_id="m", model=ScriptedModel(["x"]), messages=["hi", message], storage=storage,
                  scheduler=scheduler)
    assert storage.get_job("m") is None


def test_messages_a_model_reads_are_taken_as_they_are() -> None:
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    given = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "ok"}, {"role": "user", "content": "and?"},
             {"role": "assistant", "refusal": "I can't help with that."},  # as the agent keeps a refusal
             {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
             {"role": "function", "name": "f", "content": "ok"}, {"role": "user", "content": "go on"}]
    run_agent(job_id="m", model=ScriptedModel(["x"]), messages=given, storage=storage, scheduler=scheduler)
    assert storage.messages("m") == given


def test_an_initial_state_over_half_the_limit_is_refused_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    # The record keeps it twice (a full retry's start, the state now): the error spoke of "the record",
    # twice the size the caller gave, and nothing said why.
    import pipelines.engine.models as models
    from pipelines.engine.errors import ValueTooLargeError

    monkeypatch.setattr(models, "MAX_VALUE_BYTES", 64 * 1024)
    storage, scheduler, _ = memory()
    room = (64 * 1024 - 4096) // 2
    for size in (40_000, room - 11 + 1):  # far over, and one byte over what fits with the record's other fields
        with pytest.raises(ValueTooLargeError, match=rf"initial_state of job 'j' is {size + 11:,} bytes of JSON; its "
                                                     rf"record keeps it twice .* at most {room:,} bytes"):
            run_pipeline(job_id="j", phases=[Phase("a", done_phase)], storage=storage, scheduler=scheduler,
                         initial_state={"blob": "x" * size})
    assert storage.get_job("j") is None
    run_pipeline(job_id="k", phases=[Phase("a", done_phase)], storage=storage, scheduler=scheduler,
                 initial_state={"blob": "x" * (room - 11)})  # {"blob":"..."} is 11 bytes around the text
    scheduler.drain()
    assert storage.get_job("k").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_a_schedulers_own_unavailable_error_keeps_its_message_when_the_commit_is_written() -> None:
    # A subclass written before ``fix`` existed, whose __init__ does not call the base one: reading its ``fix``
    # raised AttributeError and lost the message (the job written all the same).
    from pipelines.engine.errors import StorageUnavailableError

    class BrokerDownError(StorageUnavailableError):
        def __init__(self, broker: str) -> None:
            Exception.__init__(self, f"broker {broker} unreachable")

    class DownScheduler(MemoryScheduler):
        def schedule_advance(self, job_id: str, delay: float = 0.0, **kw: Any) -> None:
            raise BrokerDownError("amqp://mq")

    storage = MemoryStorage()
    with pytest.raises(StorageUnavailableError, match=r"broker amqp://mq unreachable; the job's commit is written"):
        run_pipeline(job_id="j", phases=[Phase("a", done_phase)], storage=storage, scheduler=DownScheduler())
    assert storage.get_job("j") is not None


def test_an_outcome_no_commit_can_be_built_of_fails_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.engine.runner import turn

    storage, scheduler, _ = memory()
    after_phase = turn.transitions.after_phase
    calls: list[int] = []

    def broken(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # the phase's own outcome; the failure built next goes through
            raise TypeError("unhashable type: 'list'")
        return after_phase(*args, **kw)

    monkeypatch.setattr(turn.transitions, "after_phase", broken)
    run_pipeline(job_id="j", phases=ONE, storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.ERROR
    assert "could not be committed: no commit could be built of it: TypeError: unhashable type" in (job.error or "")


def test_a_job_id_belongs_to_one_pipeline_or_agent_for_its_life() -> None:
    storage, scheduler, _ = memory()
    agent = Agent(name="a", model=ScriptedModel(lambda m: "the answer"), stream=False)
    other = Agent(name="b", model=ScriptedModel(lambda m: "another"), stream=False)
    app = App(storage=storage, scheduler=scheduler, provenance=False, agents=[agent, other],
              pipelines={"p": [Phase("x", done_phase)]})
    app.run_agent("a", job_id="chat", user="hi")
    app.run_pipeline("p", job_id="etl", initial_state={})
    app.drain()
    before = (storage.get_job("chat"), storage.messages("chat"))
    with pytest.raises(JobConflictError, match="job 'chat' is a job of 'a', not 'p'"):
        app.run_pipeline("p", job_id="chat", initial_state={})
    with pytest.raises(JobConflictError, match="job 'chat' is a job of 'a', not 'b'"):
        app.run_agent("b", job_id="chat", user="more")
    with pytest.raises(JobConflictError, match="job 'etl' is a job of 'p', not 'a'"):
        app.run_agent("a", job_id="etl", user="hi")
    assert (storage.get_job("chat"), storage.messages("chat")) == before  # nothing written
    # The same pipeline again on a complete job: refused, unless asked for in so many words.
    with pytest.raises(JobConflictError, match="job 'etl' is complete; run it again with retry_mode='full'"):
        app.run_pipeline("p", job_id="etl", initial_state={})
    app.run_pipeline("p", job_id="etl", initial_state={}, retry_mode="full")
    app.drain()
    job = storage.get_job("etl")
    assert job is not None and job.status is JobStatus.COMPLETE and job.version > 2


def test_a_full_retry_restarts_the_run_where_it_began() -> None:
    storage, scheduler, _ = memory()
    ran: list[str] = []

    def fetch(ctx: PhaseContext[Any]) -> Next:
        ran.append("fetch")
        return Next("report", state={"rows": []})

    def report(ctx: PhaseContext[Any]) -> Done:
        ran.append("report")
        if len(ran) == 1:
            raise RuntimeError("transient report failure")
        return Done(result={"n": len(ctx.state["rows"])})

    app = App(storage=storage, scheduler=scheduler, provenance=False,
              pipelines={"etl": [Phase("fetch", fetch), Phase("report", report)]})
    app.run_pipeline("etl", job_id="j", initial_state={"rows": [1, 2, 3]}, initial_phase="report")
    app.drain()
    assert app.get("j").status is JobStatus.ERROR  # type: ignore[union-attr]
    app.retry("j", mode="full")
    app.drain()
    job = storage.get_job("j")
    assert ran == ["report", "report"] and job is not None and job.result == {"n": 3}
    # A deploy renamed the phase the run began at: which phase takes its state is the caller's call.
    app.add_pipeline("etl", [Phase("download", fetch), Phase("summary", report)], replace=True)
    with pytest.raises(InvalidPipelineError, match=r"run began at phase 'report', which pipeline 'etl' no longer "
                                                   r"has .* initial_phase=\.\.\."):
        app.retry("j", mode="full")
    app.run_pipeline("etl", job_id="j", initial_state={"rows": [1]}, retry_mode="full", initial_phase="summary")
    app.drain()
    job = storage.get_job("j")
    assert ran[2:] == ["report"] and job is not None and job.result == {"n": 1}


# --- 16. model parameters each call sets itself --------------------------------------------
@pytest.mark.parametrize(("params", "named"), [
    ({"stream": True}, "'stream' is set by each call"), ({"stream": 1}, "'stream' is set by each call"),
    ({"messages": []}, "'messages' may not be passed"), ({"model": "openai/other"}, "'model' may not be passed"),
    ({"tools": []}, "'tools' may not be passed"), ({"max_retries": 3}, "'max_retries' may not be passed"),
    ({"num_retries": 3}, "'num_retries' may not be passed"),
], ids=lambda v: str(v)[:20])
def test_a_model_param_the_library_sets_itself_is_refused_when_the_agent_is_built(params: dict[str, Any],
                                                                                  named: str) -> None:
    # stream=True passed the Agent and failed every job at its first model call; the others were overridden unsaid.
    from pipelines import Agent

    with pytest.raises(InvalidInputError, match=named):
        Agent(name="a", model="openai/gpt-4o-mini", model_params={"api_key": "sk-x", **params})
    for plain in (False, None):  # the plain call, and a null from a config file: still taken
        Agent(name="a", model="openai/gpt-4o-mini", model_params={"stream": plain})


def test_a_requests_own_stream_param_is_a_permanent_error_naming_it() -> None:
    from phases.litellm_model import LiteLLMModel
    from phases.model import ModelRequest
    from pipelines.engine.errors import PermanentModelError

    with pytest.raises(PermanentModelError, match="model openai/gpt-4o-mini: 'stream' is set by each call"):
        LiteLLMModel("openai/gpt-4o-mini").complete(ModelRequest(messages=[{"role": "user", "content": "hi"}],
                                                                 params={"stream": True}))


@pytest.mark.parametrize("bad", ["It has shipped.", {"role": "assistant"}, 42, None], ids=repr)
def test_a_scripted_model_takes_a_list_or_a_function(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="ScriptedModel takes a list of replies or a function"):
        ScriptedModel(bad)


def test_odd_app_and_scheduler_arguments_get_errors_naming_them() -> None:
    from adapters.rq import RQScheduler

    storage, scheduler, _ = memory()
    with pytest.raises(ConfigurationError, match=r"for_storage needs a RedisStorage .* got MemoryStorage"):
        RQScheduler.for_storage(storage)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"pipelines must map names to phases .* got list"):
        App(storage=storage, scheduler=scheduler, pipelines=[Phase("a", done_phase)])  # type: ignore[arg-type]


@pytest.mark.parametrize(("typo", "meant"), [("system_prompt", "system"), ("max_turn", "max_turns"),
                                             ("temperature", "model_params"), ("zzz", None)])
def test_an_unknown_agent_option_is_named_with_the_option_meant_and_the_list(typo: str, meant: str | None) -> None:
    # It was AgentConfig.__init__()'s TypeError: an internal class's name and no list of the options.
    with pytest.raises(InvalidInputError) as raised:
        Agent(name="a", model=ScriptedModel(["hi"]), **{typo: "x"})
    said = str(raised.value)
    assert said.startswith(f"Agent: unknown option {typo!r}") and "AgentConfig" not in said
    assert (f"(did you mean {meant!r}?)" in said) if meant else "did you mean" not in said
    assert "the options are " in said and "max_turns" in said and "tmap" not in said

"""The transcript epoch (``Checkpoint.transcript_epoch``): drawn by every creation and every truncating commit,
carried by every other commit (what phases.history_cache relies on)."""

from __future__ import annotations

from pipelines.engine import transitions
from pipelines.engine.events import make_event
from pipelines.engine.models import JobRecord, Usage
from pipelines.engine.phase import Done, Fail, Next, PhaseOutput, RetryLater, WaitForInput


def epoch(rec: JobRecord) -> str:
    assert rec.checkpoint is not None
    return rec.checkpoint.transcript_epoch


def created(job_id: str = "j") -> JobRecord:
    return transitions.create(job_id, pipeline="p", first="turn", state=None, messages=[{"role": "user",
                              "content": "hi"}], options={}, now=1.0).record


def test_every_creation_draws_a_new_epoch_even_under_the_same_id() -> None:
    first, again = created("j"), created("j")
    assert epoch(first) and epoch(again) and epoch(first) != epoch(again)
    done = transitions.after_phase(first, Done(result="ok"), PhaseOutput(), owner="o", now=2.0).record
    continued = transitions.continue_conversation(done, first="turn", state=None, messages=[], pipeline="p",
                                                  options={}, now=3.0).record
    forked = transitions.fork(first, first.history[0], new_job_id="f", messages=[], options={}, run=True,
                              now=3.0).record
    assert len({epoch(first), epoch(again), epoch(continued), epoch(forked)}) == 4


def test_a_commit_that_truncates_the_transcript_draws_a_new_epoch_and_no_other_commit_does() -> None:
    rec = created()
    out = PhaseOutput(messages=[{"role": "assistant", "content": "a"}])
    keeps = {
        "next": transitions.after_phase(rec, Next("turn", state=None), out, owner="o", now=2.0),
        "retry_later": transitions.after_phase(rec, RetryLater(1.0), out, owner="o", now=2.0),
        "wait": transitions.after_phase(rec, WaitForInput("approve"), out, owner="o", now=2.0),
        "fail": transitions.after_phase(rec, Fail("boom"), out, owner="o", now=2.0),
        "save_state": transitions.save_state(rec, {"x": 1}, owner="o", now=2.0),
        "pause": transitions.pause(rec, owner="o", now=2.0),
        "cancel": transitions.cancel(rec, owner=None, now=2.0),
        "supply_inputs": transitions.supply_inputs(rec, {"tool:c": 1}, resume=True, now=2.0, why="x",
                                                   event=make_event("approved", 2.0)),
        "children_done": transitions.children_done(rec, {"child:c": 1}, Usage(), owner="o", now=2.0),
    }
    for name, commit in keeps.items():
        assert commit.truncate_messages_to is None, name
        assert epoch(commit.record) == epoch(rec), name
    paused = keeps["pause"].record
    assert epoch(transitions.resume(paused, now=3.0).record) == epoch(rec)
    failed = keeps["fail"].record
    assert epoch(transitions.retry_resume(failed, now=3.0).record) == epoch(rec)
    full = transitions.retry_full(failed, first="turn", state=None, now=3.0)
    assert full.truncate_messages_to == 1 and epoch(full.record) not in ("", epoch(rec))


def test_the_truncation_rule_holds_for_a_truncating_commit_that_keeps_its_checkpoint() -> None:
    # Not a transition today: the rule lives where truncation is expressed, so a future one inherits it.
    rec = created()
    assert rec.checkpoint is not None
    kept = rec.model_copy(update={"version": 2})
    commit = transitions._commit(rec, kept, "t", truncate_to=0)
    assert epoch(commit.record) not in ("", epoch(rec))
    assert epoch(transitions._commit(rec, kept, "t").record) == epoch(rec)


def test_a_record_from_before_epochs_reads_and_gets_one_at_its_next_turn() -> None:
    rec = created()
    data = rec.model_dump(mode="json", exclude_defaults=True)
    del data["checkpoint"]["transcript_epoch"]
    old = JobRecord.model_validate(data)
    assert epoch(old) == ""
    assert epoch(transitions.after_phase(old, RetryLater(1.0), PhaseOutput(), owner="o", now=2.0).record) == ""
    assert epoch(transitions.after_phase(old, Next("turn", state=None), PhaseOutput(), owner="o", now=2.0).record)

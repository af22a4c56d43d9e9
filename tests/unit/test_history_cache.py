"""The transcript cache's rules, each on its own, and the call ids it keeps (the end-to-end runs, two workers
alternating on memory and Redis, are in tests/integration/test_history_cache.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from phases.agent_config import AgentConfig
from phases.agent_run import extended_view, turn_messages, view_key
from phases.compaction import MARKER_KEY, marker, view_marker
from phases.history_cache import HistoryCache
from phases.tool_calls import call_ids, normalise_tool_calls
from pipelines import tool
from pipelines.engine.errors import PermanentModelError
from pipelines.engine.models import Checkpoint
from pipelines.testing import ScriptedModel


# --- the cache's rules, on a stand-in phase context -----------------------------------------------------
class Ctx:
    """What the cache uses of a PhaseContext: the job, its checkpoint, the transcript length, reads, on_commit."""

    def __init__(self, stored: list[dict[str, Any]], *, epoch: str, commit_id: str, n: int | None = None) -> None:
        self.job_id = "j"
        self.stored = stored
        self.transcript_len = len(stored) if n is None else n
        self.checkpoint = Checkpoint[Any](next_phase="turn", state=None, transcript_epoch=epoch, commit_id=commit_id)
        self.reads: list[int] = []
        self.hooks: list[Any] = []

    def messages(self, start: int = 0) -> list[dict[str, Any]]:
        self.reads.append(start)
        return [dict(m) for m in self.stored[start:self.transcript_len]]

    def on_commit(self, fn: Any, *, reads_only: bool = False) -> None:
        self.hooks.append(fn)


def msgs(n: int, *, tag: str = "m") -> list[dict[str, Any]]:
    """``n`` messages, every other one an assistant message with a call ``<tag><i>``."""
    return [{"role": "assistant", "content": None, "tool_calls": [{"id": f"{tag}{i}", "type": "function",
             "function": {"name": "add", "arguments": "{}"}}]} if i % 2 else {"role": "tool", "content": str(i),
             "tool_call_id": f"{tag}{i - 1}"} for i in range(n)]


def primed(stored: list[dict[str, Any]], *, epoch: str = "e1", commit_id: str = "c1") -> HistoryCache:
    cache = HistoryCache()
    ctx = Ctx(stored, epoch=epoch, commit_id=commit_id)
    assert cache.get(ctx).messages == stored and ctx.reads == [0]
    return cache


def test_under_the_same_epoch_only_the_missing_messages_are_read_and_their_call_ids_added() -> None:
    stored = msgs(10)
    cache = primed(stored[:4])
    ctx = Ctx(stored, epoch="e1", commit_id="c9")
    held = cache.get(ctx)
    assert ctx.reads == [4] and held.messages == stored and held.ids == call_ids(stored)
    again = Ctx(stored, epoch="e1", commit_id="c10")
    assert cache.get(again) is held and again.reads == []  # as many messages under the epoch: nothing to read


@pytest.mark.parametrize("case", ["other epoch", "shorter record", "no epoch, other commit", "short read"])
def test_anything_but_a_provable_prefix_reads_the_whole_transcript(case: str) -> None:
    stored = msgs(8, tag="new")
    cache = primed(msgs(6, tag="old"))
    ctx = {
        "other epoch": Ctx(stored, epoch="e2", commit_id="c2"),
        "shorter record": Ctx(stored[:4], epoch="e1", commit_id="c2"),  # a stale load, or storage rolled back
        "no epoch, other commit": Ctx(stored, epoch="", commit_id="c2"),
        "short read": Ctx(stored[:7], epoch="e1", commit_id="c2", n=8),  # storage holds less than its record says
    }[case]
    held = cache.get(ctx)
    assert ctx.reads[-1] == 0 and held.messages == ctx.stored[:ctx.transcript_len]
    assert held.ids == call_ids(held.messages)
    if case == "short read":
        assert ctx.reads == [6, 0]
        probe = Ctx(stored[:7], epoch="e1", commit_id="c3", n=7)
        cache.get(probe)
        assert probe.reads == [6]  # the short whole read was not kept: the old prefix still serves


def test_a_record_without_an_epoch_is_served_only_the_exact_commit_it_was_taken_at() -> None:
    stored = msgs(6)
    cache = primed(stored, epoch="", commit_id="c1")
    same = Ctx(stored, epoch="", commit_id="c1")
    assert cache.get(same).messages == stored and same.reads == []
    grown = Ctx([*stored, *msgs(2, tag="x")], epoch="", commit_id="c2")
    assert cache.get(grown).messages == grown.stored and grown.reads == [0]  # no epoch: no prefix is trusted


def test_an_entry_is_kept_after_the_commit_lands_under_the_new_checkpoints_epoch() -> None:
    cache = HistoryCache()
    ctx = Ctx(msgs(4), epoch="e1", commit_id="c1")
    after = msgs(6)
    cache.remember_after_commit(ctx, after, frozenset(call_ids(after)))  # type: ignore[arg-type]
    assert not cache._entries  # nothing is held for a commit that has not landed (it may be fenced off)
    ctx.hooks.pop()(Checkpoint[Any](next_phase="turn", state=None, transcript_epoch="e1", commit_id="c2"))
    later = Ctx([*after, *msgs(8)[6:]], epoch="e1", commit_id="c3")
    held = cache.get(later)
    assert later.reads == [6] and held.messages == msgs(8) and held.ids == call_ids(msgs(8))


# --- call ids: the kept set gives exactly what the scan of the whole transcript gives -------------------
def random_history(rng: random.Random, n: int) -> list[Any]:
    ids = ["c", "c_2", "call_3_0", "x", "", None, 7]
    out: list[Any] = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.5:
            calls = [{"id": rng.choice(ids), "function": {"name": "add", "arguments": "{}"}}
                     for _ in range(rng.randint(1, 3))]
            out.append({"role": "assistant", "content": None, "tool_calls": rng.choice([calls, calls[0], None])})
        elif kind < 0.9:
            out.append({"role": "tool", "tool_call_id": rng.choice(ids), "content": "1"})
        else:
            out.append(rng.choice(["junk", {"role": "user", "content": "hi"}]))
    return out


@pytest.mark.parametrize("seed", range(200))
def test_normalising_against_kept_ids_equals_normalising_against_the_whole_history(seed: int) -> None:
    rng = random.Random(seed)
    history = random_history(rng, rng.randint(0, 30))
    cut = rng.randint(0, len(history))
    kept = frozenset(call_ids(history[:cut])) | call_ids(history[cut:])  # the prefix's ids, then the new ones
    answer = random_history(rng, 1)[0]
    if not isinstance(answer, dict) or not answer.get("tool_calls"):
        answer = {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}, {"id": "c"}, {"id": None}]}
    turn = rng.randint(0, 9)
    if not isinstance(answer["tool_calls"], list):  # one call given bare: refused, never guessed at
        with pytest.raises(PermanentModelError, match="tool_calls as a dict"):
            normalise_tool_calls(answer, turn, history)
        return
    whole = normalise_tool_calls(answer, turn, history)
    assert normalise_tool_calls(answer, turn, taken=kept) == whole
    assert normalise_tool_calls(answer, turn, [{"role": "assistant", "tool_calls": [{"id": "ignored"}]}],
                                taken=kept) == whole  # given ids, the history is not read
    new = [c["id"] for c in whole.get("tool_calls") or []]
    assert len(set(new)) == len(new) and not set(new) & call_ids(history)
    given = [c.get("id") if isinstance(c, dict) else None for c in answer["tool_calls"]]
    assert new == reference_ids(given, turn, call_ids(history))


def reference_ids(given: list[Any], turn: int, earlier: set[str]) -> list[str]:
    """The id rule as first written (one set copied from the transcript's ids): the oracle for the faster one."""
    taken, kept = set(earlier), []
    for cid in given:
        ok = isinstance(cid, str) and cid != "" and cid not in taken
        kept.append(cid if ok else None)
        if ok:
            taken.add(cid)
    taken.update(c for c in given if isinstance(c, str))
    out = []
    for i, (cid, orig) in enumerate(zip(kept, given, strict=True)):
        if cid is None:
            base = orig if isinstance(orig, str) and orig else f"call_{turn}_{i}"
            cid, n = base, 1
            while cid in taken:
                n += 1
                cid = f"{base}_{n}"
            taken.add(cid)
        out.append(cid)
    return out



# --- the model view: extended by appended messages exactly when that is the view of the longer transcript ----
def random_transcript(rng: random.Random, n: int, start: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(start, start + n):
        kind = rng.random()
        if kind < 0.1:
            out.append({"role": "system", "content": f"s{i}"})
        elif kind < 0.17:
            out.append(marker(f"summary {i}", rng.randint(0, i)))
        elif kind < 0.22:
            out.append(view_marker([{"role": "system", "content": f"v{i}"}, {"role": "user", "content": "x"}],
                                   upto=rng.randint(0, i), version=str(i)))
        else:
            out.append({"role": rng.choice(["user", "assistant", "tool"]), "content": f"m{i}"})
    return out


@pytest.mark.parametrize("seed", range(300))
def test_an_extended_view_is_the_view_of_the_longer_transcript(seed: int) -> None:
    rng = random.Random(seed)
    cfg = AgentConfig(model=ScriptedModel([]), system=rng.choice([None, "now", "s0"]),
                      system_prompt_conflict=rng.choice(["keep", "use-current"]))
    past = random_transcript(rng, rng.randint(0, 12))
    new = random_transcript(rng, rng.randint(0, 4), start=len(past))
    grown = extended_view(turn_messages(cfg, past), new)
    plain = [m for m in new if m["role"] != "system" and MARKER_KEY not in m]
    assert (grown is None) == (plain != new)  # refused exactly when a marker or a system message is appended
    if grown is not None:
        assert grown == turn_messages(cfg, [*past, *new])


def test_no_view_is_kept_for_tools_with_previews() -> None:
    @tool(preview=10)
    def long(text: str) -> str:
        """Long results."""
        return text

    assert view_key(AgentConfig(model=ScriptedModel([]), tools=[long])) is None
    assert view_key(AgentConfig(model=ScriptedModel([]), system="s")) == ("s", "keep")

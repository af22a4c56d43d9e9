"""How the chaos checks explain a tool effect applied twice (bench.chaos_lib.check_effects)."""

from __future__ import annotations

from typing import Any

from bench.chaos_lib import OUTAGE_LEAD, Kill, check_effects
from tests.apps import chaos_app


class _Effects:
    """The two keys check_effects reads, for job "j" with two turns (one tool call: "j/call_1")."""

    def __init__(self, *applications: tuple[float, int]) -> None:
        self.log = [f"j/call_1 {pid} {t:.6f}".encode() for t, pid in applications]

    def lrange(self, key: str, start: int, stop: int) -> list[bytes]:
        assert key == chaos_app.APPLY_LOG
        return self.log

    def get(self, key: str) -> Any:
        assert key == chaos_app.APPLIED + "j/call_1"
        return str(len(self.log)).encode()


def _check(effects: _Effects, **kwargs: Any) -> Any:
    return check_effects(effects, ["j"], 2, **kwargs)  # type: ignore[arg-type]


def test_an_effect_applied_once_is_no_repeat() -> None:
    out = _check(_Effects((100.0, 1)))
    assert (out.keys, out.missing, out.repeated) == (1, 0, 0)


def test_a_repeat_after_the_first_process_was_killed_is_explained_by_the_kill() -> None:
    out = _check(_Effects((100.0, 1), (105.0, 2)), kills=[Kill(at=101.0, name="w0", pids=[1])])
    assert (out.repeats_after_kill, out.repeats_unexplained) == (1, 0)


def test_a_repeat_across_a_redis_outage_is_explained_by_it_only_when_applied_just_before() -> None:
    outage = (200.0, 202.0)
    out = _check(_Effects((199.0, 1), (203.0, 1)), outages=[outage])
    assert (out.repeats_after_outage, out.repeats_unexplained) == (1, 0)
    long_before = 200.0 - OUTAGE_LEAD - 1  # its journal write was long done: the outage cannot explain it
    out = _check(_Effects((long_before, 1), (203.0, 1)), outages=[outage])
    assert (out.repeats_after_outage, out.repeats_unexplained) == (0, 1)
    out = _check(_Effects((199.0, 1), (201.0, 1)), outages=[outage])  # repeated while Redis was still down?
    assert out.repeats_unexplained == 1


def test_a_repeat_with_nothing_to_explain_it_is_unexplained() -> None:
    out = _check(_Effects((100.0, 1), (105.0, 1)), kills=[Kill(at=101.0, name="w1", pids=[2])])
    assert (out.repeated, out.repeats_after_kill, out.repeats_after_outage, out.repeats_unexplained) == (1, 0, 0, 1)

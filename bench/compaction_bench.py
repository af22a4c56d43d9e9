"""Figure 8: a 1,000-turn conversation with compaction - per-turn time stays flat, the model view bounded.

    python -m bench.compaction_bench [--turns 1000] [--max-tokens 2000]

Memory adapters and a scripted model (no network): what is measured is the
library's own cost per turn as the stored transcript grows, and the largest
model view any turn sent. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from adapters.memory import MemoryScheduler, MemoryStorage
from phases.compaction import Compaction, estimate_tokens
from pipelines import Agent, App, tool
from pipelines.testing import ScriptedModel, call, reply


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


def _script(turns: int) -> Any:
    def answer(messages: list[dict[str, Any]]) -> Any:
        last = str(messages[-1].get("content") or "")
        if messages[-1]["role"] == "user" and last.startswith("Summarise"):
            sums = [json.loads(m["content"])["sum"] for m in messages if m["role"] == "tool"]
            return f"counted up to {max(sums) if sums else 0}"
        sums = [json.loads(m["content"])["sum"] for m in messages if m["role"] == "tool"]
        summary = next((str(m["content"]) for m in messages if "counted up to" in str(m.get("content"))), "")
        n = max([*sums, int(summary.split("counted up to ")[1].split()[0]) if summary else 0])
        return "done" if n >= turns else reply("adding one more " * 8, call("add", a=n, b=1))
    return answer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--turns", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=2000)
    args = p.parse_args(argv)
    model = ScriptedModel(_script(args.turns))
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    agent = Agent(name="long", model=model, tools=[add], system="You count.", max_turns=args.turns + 5,
                  compaction=Compaction(max_tokens=args.max_tokens, keep_recent=8), stream=False)
    app = App(storage=storage, scheduler=scheduler, agents=[agent])
    app.run_agent("long", job_id="long", messages=[f"count to {args.turns}"])
    times: list[float] = []
    while True:
        t0 = time.perf_counter()
        if not scheduler.run_next():
            break
        times.append(time.perf_counter() - t0)
    view = app.get("long")
    assert view is not None and view.status.value == "complete", view
    # Early turns send a small, growing view; once the view first reaches the threshold, every turn sends
    # about as much. Flat means: a turn near the end costs what one did right after that point.
    first = next((i for i, r in enumerate(model.calls) if "counted up to" in json.dumps(r.messages)), 0)
    early, late = statistics.median(times[first + 5:first + 25]), statistics.median(times[-20:])
    largest = max(estimate_tokens(r.messages) for r in model.calls)
    print(f"figure 8: {len(times)} turns with compaction (max_tokens={args.max_tokens}), memory adapters")
    print(f"8a turn {first + 5}-{first + 25} median {early * 1000:.3f} ms, last 20 {late * 1000:.3f} ms: "
          f"{late / early:.2f}x "
          f"(goal <= 1.1x: {'ok' if late / early <= 1.1 else 'MISS'})")
    print(f"8b largest model view sent: ~{largest} tokens (threshold {args.max_tokens}; one turn may add to it)")
    print(f"8c transcript kept whole: {len(app.messages('long'))} messages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

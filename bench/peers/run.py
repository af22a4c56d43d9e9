"""``make bench-peers``: workload W1 on phaserunner's memory adapters next to cl-pipelines and LangGraph.

    python bench/peers/run.py                        # 200 jobs x 10 turns, 3 rounds (~1 min on 2 cores)
    python bench/peers/run.py --jobs 50 --runs 5     # other sizes; --turns too
    python bench/peers/run.py --only ours,langgraph-memory

The peers, each given W1 exactly as bench/w1.py defines it (the same strings,
so the same message sizes; one ``add`` call per turn but the last; a
stateless scripted model; no network):

- ``cl-pipelines``: ``@claritylabs/cl-pipelines`` 0.1.0 (the npm name its docs
  import; the unscoped ``cl-pipelines`` is not published) with ``ai`` 7, on its
  memory storage and scheduler, the model the AI SDK's ``MockLanguageModelV4``
  (bench/peers/node/w1.mjs; pinned by its package-lock.json, installed with
  ``npm ci`` into bench/peers/node/node_modules).
- ``langgraph-memory`` / ``langgraph-sqlite``: a LangGraph ``StateGraph``
  agent -> tools loop with ``InMemorySaver`` / ``SqliteSaver`` on a temp file
  (bench/peers/langgraph_w1.py; pinned with hashes by
  bench/peers/requirements.txt, installed into bench/peers/.venv).

Ours on the embedded durable default (``P1q``) is ``bench/sqlite_bench.py``'s
run: ``SQLiteStorage`` with ``synchronous=FULL`` (the default) on a temp file
and one ``LocalScheduler`` worker thread, as ``SqliteSaver`` runs one
``graph.invoke`` at a time; its ratio to ``SqliteSaver`` has the issue's
target (>= 2x).

Ours is figure 1a of ``make bench`` (``Agent.run`` on ``MemoryStorage`` +
``MemoryScheduler``, then ``drain()``), timed in this process, once as 1a
runs it (``stream`` on, the default: each turn's text also goes to the job's
live stream) and once with ``stream=False``, which is what the peers do
(``generateText`` and ``graph.invoke`` publish no text as it arrives). Each round
runs every side once, one after the other, each peer in a fresh process
after its own warm-up; a ratio pairs round i of ours with round i of the
peer, so load from other work on the machine hits both sides of a ratio
alike. Nothing is asserted: this only prints. Installs (npm and PyPI only)
happen when their lock changed or the folder is missing; nothing else is
written inside the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import w1  # noqa: E402
from bench.run import Report, memory_run, say  # noqa: E402

NODE_DIR = HERE / "node"
VENV = HERE / ".venv"
STAMP = ".bench-peers-installed"  # holds the sha256 of the lock the folder was installed from
PEERS = ("cl-pipelines", "langgraph-memory", "langgraph-sqlite")
# Issue 33's goals for ours over a peer: (stream on, stream=False); None: no goal. Printed, never asserted.
RATIO_GOALS: dict[str, tuple[float | None, float | None]] = {
    "cl-pipelines": (1.5, 2.0),
    "langgraph-memory": (10.0, None),
}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _installed(folder: Path, lock: Path) -> bool:
    stamp = folder / STAMP
    return stamp.exists() and stamp.read_text().strip() == _digest(lock)


def ensure_node() -> str | None:
    """``npm ci`` into bench/peers/node/node_modules unless it holds package-lock.json already; None = ready."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "cl-pipelines skipped: node/npm not installed"
    lock, modules = NODE_DIR / "package-lock.json", NODE_DIR / "node_modules"
    if not _installed(modules, lock):
        say("bench-peers: npm ci (bench/peers/node/node_modules)")
        out = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR,
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            return f"cl-pipelines skipped: npm ci failed:\n{out.stderr[-2000:]}"
        (modules / STAMP).write_text(_digest(lock))
    return None


def ensure_venv() -> str | None:
    """A venv at bench/peers/.venv with requirements.txt installed ``--require-hashes``; None = ready."""
    lock = HERE / "requirements.txt"
    if not _installed(VENV, lock):
        say("bench-peers: venv + pip install --require-hashes (bench/peers/.venv)")
        if not (VENV / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
        out = subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", "--require-hashes",
                              "-r", str(lock)], capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            return f"LangGraph skipped: pip install failed:\n{out.stderr[-2000:]}"
        (VENV / STAMP).write_text(_digest(lock))
    return None


def peer_env() -> dict[str, str]:
    """W1's strings for the peers, and no tracing upload from LangChain whatever the caller's environment says."""
    env = {**os.environ, "BENCH_W1": json.dumps({"text": w1.TEXT, "user": w1.USER, "system": w1.SYSTEM})}
    env.update(LANGSMITH_TRACING="false", LANGCHAIN_TRACING_V2="false", LANGSMITH_TEST_TRACKING="false")
    return env


def run_peer(peer: str, a: argparse.Namespace) -> dict[str, Any]:
    """One timed run of ``peer`` in a fresh process (after its warm-up); its JSON line."""
    size = ["--jobs", str(a.jobs), "--turns", str(a.turns), "--runs", "1", "--warm", str(a.warm)]
    if peer == "cl-pipelines":
        cmd, cwd = ["node", "--expose-gc", "w1.mjs", *size], NODE_DIR
    else:
        cmd = [str(VENV / "bin" / "python"), str(HERE / "langgraph_w1.py"), "--saver", peer.split("-", 1)[1], *size,
               "--durability", a.durability]
        cwd = HERE
    out = subprocess.run(cmd, cwd=cwd, env=peer_env(), capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{peer} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def w1_agent(turns: int, stream: bool) -> Any:
    """bench/apps.py's W1 agent; ``stream=False`` turns off the live text stream, which no peer here has."""
    from bench.apps import w1_agent as make
    from pipelines import Agent
    from pipelines.testing import ScriptedModel

    if stream:
        return make(turns)  # exactly figure 1a's agent (the library's default: stream on)
    return Agent(name="w1", model=ScriptedModel(w1.reply_fn(turns)), tools=[w1.add], system=w1.SYSTEM,
                 max_turns=turns + 1, stream=False)


def ours(a: argparse.Namespace, tag: str, stream: bool) -> float:
    return a.jobs * a.turns / memory_run(a.jobs, a.turns, w1_agent(a.turns, stream), tag)


def ours_sqlite(a: argparse.Namespace) -> float:
    """W1 on SQLite FULL, one local worker thread (bench/sqlite_bench.py's run)."""
    from bench.sqlite_bench import run_sqlite

    return float(run_sqlite(a.jobs, a.turns, "FULL", workers=1)["turns/s"])


def _judged(goal: float | None) -> tuple[str, Callable[[float], bool] | None]:
    """A ratio row's target cell and verdict for ``goal`` (ours / the peer at least that; None: none)."""
    if goal is None:
        return "", None
    return f">= {goal:g}", lambda v: v >= goal


def report(a: argparse.Namespace, rates: dict[str, list[float]], info: dict[str, dict[str, Any]],
           notes: list[str]) -> Report:
    rep = Report(notes=notes)
    size = f"{a.jobs}x{a.turns}"
    rep.add("P1", f"phaserunner, memory adapters + ScriptedModel ({size}; = make bench 1a)", rates["ours"], "turns/s")
    rep.add("P1s", "phaserunner, the same with stream=False (no live text stream)", rates["ours-nostream"], "turns/s")
    if rates.get("ours-sqlite"):
        rep.add("P1q", "phaserunner, SQLite FULL (temp file) + LocalScheduler(workers=1), stream=False",
                rates["ours-sqlite"], "turns/s")
    names = {
        "cl-pipelines": "cl-pipelines {@claritylabs/cl-pipelines}, memory adapters + MockLanguageModelV4",
        "langgraph-memory": "LangGraph {langgraph}, StateGraph + InMemorySaver",
        "langgraph-sqlite": "LangGraph {langgraph}, StateGraph + SqliteSaver (temp file)",
    }
    present = [p for p in PEERS if rates.get(p)]
    for i, peer in enumerate(present):
        rep.add(f"P{i + 2}", names[peer].format_map(info[peer]["versions"]), rates[peer], "turns/s")
    for i, peer in enumerate(present):
        goal, goal_s = RATIO_GOALS.get(peer, (None, None))
        rep.ratio(f"R{i + 1}", f"phaserunner / {peer}", rates["ours"], rates[peer], *_judged(goal))
        rep.ratio(f"R{i + 1}s", f"phaserunner (stream=False) / {peer}", rates["ours-nostream"], rates[peer],
                  *_judged(goal_s))
    if rates.get("ours-sqlite") and rates.get("langgraph-sqlite"):
        rep.ratio("RQ", "phaserunner on SQLite FULL / langgraph-sqlite", rates["ours-sqlite"],
                  rates["langgraph-sqlite"], ">= 2", lambda v: v >= 2.0)
    for peer in present:
        v = info[peer]
        extra = f"; node {v['node']}" if "node" in v else f"; durability={v['durability']}"
        if "node" in v and int(v["node"].lstrip("v").split(".")[0]) < 22:
            extra += " (ai 7 declares node >= 22, npm only warns; each timed run checks two jobs' transcripts)"
        rep.notes.append(f"{peer}: {', '.join(f'{k} {n}' for k, n in v['versions'].items())}{extra}")
    return rep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=200, help="W1 jobs per run (default 200)")
    p.add_argument("--turns", type=int, default=10, help="W1 turns per job (default 10)")
    p.add_argument("--runs", type=int, default=3, help="rounds; every figure is their median (default 3)")
    p.add_argument("--warm", type=int, default=20, help="warm-up jobs before each timed run (default 20)")
    p.add_argument("--durability", choices=("sync", "async", "exit"), default="sync",
                   help="LangGraph's durability mode (default sync: each step persisted before the next)")
    p.add_argument("--only", default=",".join(PEERS), help=f"comma-separated peers (default: {','.join(PEERS)})")
    a = p.parse_args(argv)
    wanted = [x.strip() for x in a.only.split(",") if x.strip() in PEERS]
    notes: list[str] = []
    started = time.perf_counter()
    if "cl-pipelines" in wanted and (why := ensure_node()):
        notes.append(why)
        wanted.remove("cl-pipelines")
    if any(w.startswith("langgraph") for w in wanted) and (why := ensure_venv()):
        notes.append(why)
        wanted = [w for w in wanted if not w.startswith("langgraph")]
    say(f"bench-peers: W1 {a.jobs} jobs x {a.turns} turns, {a.runs} rounds of: ours, {', '.join(wanted)}")
    memory_run(a.warm, a.turns, w1_agent(a.turns, True), "warm")
    memory_run(a.warm, a.turns, w1_agent(a.turns, False), "warm-s")
    rates: dict[str, list[float]] = {"ours": [], "ours-nostream": [], "ours-sqlite": [], **{w: [] for w in wanted}}
    info: dict[str, dict[str, Any]] = {}
    for r in range(a.runs):
        rates["ours"].append(ours(a, f"r{r}", True))
        rates["ours-nostream"].append(ours(a, f"s{r}", False))
        if "langgraph-sqlite" in wanted:
            rates["ours-sqlite"].append(ours_sqlite(a))
        for peer in wanted:
            info[peer] = run_peer(peer, a)
            rates[peer].extend(info[peer]["turns_per_s"])
        # A side not run (ours on SQLite runs only beside langgraph-sqlite) has no rate to show.
        say(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items() if v) + " turns/s")
    rep = report(a, rates, info, notes)
    rounds = f"{a.runs} round{'s' if a.runs != 1 else ''}"
    rep.show(f"phaserunner next to its peers (W1 {a.jobs} jobs x {a.turns} turns; median of {rounds}, "
              f"spread min-max; {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

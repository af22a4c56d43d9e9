"""The layers, proven by an AST scan of every module of ``pipelines/``, ``phases/`` and ``adapters/``.

Each module sits on a floor; an import may go down or stay on its floor, never up. Every import counts:
at module level, inside a function (a lazy import is still a dependency) and under ``TYPE_CHECKING`` (a
type is a dependency too). The floors, lowest first:

0. **engine**: ``pipelines.engine`` and the ports it owns, ``adapters.base``;
1. **adapters and phases**: the storages and schedulers, the agent turn and its tools (each imports
   only the engine and the ports: ``test_public_api.py``);
2. **run support**: what the App hands out and records: ``pipelines.handle`` (``RunHandle``,
   ``JobView``), ``pipelines.streams`` (the live stream), ``pipelines.provenance`` (version tags),
   ``pipelines.errors`` (the public errors);
3. **the App**: ``pipelines.app`` (its face, registry, runs, controls, the read model, the queues' read
   model and the open turn's);
4. **what is built on the App**: ``pipelines.agent`` (an agent's ``run`` goes through an App),
   ``pipelines.lowlevel``, ``pipelines.worker``, ``pipelines.health``, ``pipelines.dev``,
   ``pipelines.testing``, ``pipelines.crash_harness`` and the package root ``pipelines`` (the public
   names, loaded lazily);
5. **the web page**: ``pipelines.web``;
6. **the command line**: ``pipelines.cli`` and ``pipelines.__main__`` (``pipelines ui`` and
   ``pipelines dev`` serve the web page, so the CLI sits above it).

Above the floors, the web page and the CLI read and steer runs through the App only: besides their own
package they import the App and its read model (``pipelines.app``), the public errors
(``pipelines.errors``) and the public names (``pipelines``), plus :data:`FACES_MAY_ALSO`, each with the
reason it is legitimate. Nothing else of the library, the engine and the adapters included.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("pipelines", "phases", "adapters")

# (floor, module prefixes); a module is on the floor of its longest matching prefix.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("engine", ("pipelines.engine", "adapters.base")),
    ("adapters and phases", ("adapters", "phases")),
    ("run support", ("pipelines.handle", "pipelines.streams", "pipelines.provenance", "pipelines.errors")),
    ("app", ("pipelines.app",)),
    ("built on the app", ("pipelines", "pipelines.agent", "pipelines.lowlevel", "pipelines.worker",
                          "pipelines.health", "pipelines.dev", "pipelines.testing", "pipelines.crash_harness")),
    ("web", ("pipelines.web",)),
    ("cli", ("pipelines.cli", "pipelines.__main__")),
]

# What the web page and the CLI import besides their own package, the App and the public errors and names.
FACES_ALLOWED = ("pipelines.app", "pipelines.errors")
FACES_MAY_ALSO: dict[str, dict[str, str]] = {
    "pipelines.web": {
        "pipelines.engine.models": "the records the read model hands out (JobRecord, Event, JobStatus, LogEntry, "
                                   "Message) and the job id check: the read model's vocabulary, public types",
    },
    "pipelines.cli": {
        "pipelines.engine.models": "as for the web page: the records the read model hands out",
        "pipelines.worker": "`pipelines worker` runs a worker, and every command loads its --app the way a worker "
                            "does (load_app, APP_ENV)",
        "pipelines.health": "`pipelines health` prints the health checks",
        "pipelines.dev": "`pipelines dev` builds the one-process SQLite app",
        "pipelines.agent": "`pipelines agent list` shows an Agent's model and tools",
        "pipelines.web": "`pipelines ui` and `pipelines dev` serve the web page",
    },
}

# Imports that break a rule above, each with its reason. Empty: every violation found was fixed by moving code.
EXCEPTIONS: dict[tuple[str, str], str] = {}

MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for top in OURS for p in sorted((ROOT / top).rglob("*.py"))}


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every module of ours that ``name`` imports, wherever the import statement is (module or function level)."""
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pipelines import streams` imports the module pipelines.streams
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base


def _ours(imported: str) -> bool:
    return imported.split(".")[0] in OURS


def _floor(module: str) -> int:
    best, floor = -1, -1
    for n, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), n
    assert floor >= 0, f"{module} is on no floor: add it to FLOORS"
    return floor


def _edges() -> list[tuple[str, str]]:
    return [(name, imported) for name, path in MODULES.items() for imported in _imports(name, path)
            if _ours(imported)]


def test_every_module_is_on_a_floor() -> None:
    for name in MODULES:
        _floor(name)


def test_no_module_imports_a_floor_above_its_own() -> None:
    upward = [f"{src} ({FLOORS[_floor(src)][0]}) imports {dst} ({FLOORS[_floor(dst)][0]})"
              for src, dst in _edges() if _floor(dst) > _floor(src) and (src, dst) not in EXCEPTIONS]
    assert upward == []


@pytest.mark.parametrize("face", sorted(FACES_MAY_ALSO))
def test_the_web_page_and_the_cli_import_only_the_app_its_read_model_and_the_public_errors(face: str) -> None:
    allowed = (face, *FACES_ALLOWED, *FACES_MAY_ALSO[face])
    bad = sorted({f"{src} imports {dst}" for src, dst in _edges()
                  if (src == face or src.startswith(face + ".")) and dst != "pipelines"
                  and not any(dst == a or dst.startswith(a + ".") for a in allowed)
                  and (src, dst) not in EXCEPTIONS})
    assert bad == []


def test_the_app_does_not_import_the_agent_module() -> None:
    # The agent <-> app circle: an Agent's low-level `run` goes through an App, so the App knows agents
    # only as PipelineSource (and TitledSource), never by their class.
    assert [(s, d) for s, d in _edges() if s.startswith("pipelines.app") and d == "pipelines.agent"] == []


def test_the_floors_match_the_tree() -> None:
    # One subpackage per layer where a layer has more than one module of its own.
    for package in ("pipelines/engine", "pipelines/app", "pipelines/web", "pipelines/cli"):
        assert (ROOT / package / "__init__.py").exists(), package
    assert not list((ROOT / "pipelines").glob("cli_*.py")), "the CLI's modules live in pipelines/cli/"
    assert not (ROOT / "pipelines" / "read_model.py").exists(), "the read model lives in pipelines/app/"


@pytest.mark.parametrize("top", ["pipelines", "phases", "adapters"])
def test_every_module_stays_under_the_size_limit(top: str) -> None:
    big = {str(p.relative_to(ROOT)): n for p in (ROOT / top).rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}

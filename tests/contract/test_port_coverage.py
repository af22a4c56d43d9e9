"""Every method of every port is exercised by the contract suites (issue 29 item 3).

The ports are the ``typing.Protocol`` classes of :mod:`adapters.base` and
:class:`~pipelines.engine.blobs.BlobStore`. A contract test declares what it
exercises with :func:`tests.contract.ports.covers`; this test reads those
declarations from the source of ``tests/contract/test_*.py`` and fails when

* a public member of a port (a method, or a data member such as
  ``Scheduler.precision``) is declared by no test,
* a declaration names no such member (a typo, or a method a port lost),
* a declaring test takes no backend fixture (:data:`~tests.contract.ports.BACKEND_FIXTURES`:
  it would not run on every backend), or
* a declaring test never calls the method (``.method(...)``; a data member:
  ``.member``) in its body or in a helper function of its module that it calls.

And every storage, blob store and scheduler class in ``adapters`` (wrappers
included) is built by the fixture of its suite, so a backend added later
runs the suites too.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import adapters.base as base
from pipelines.engine.blobs import BlobStore
from tests.contract.ports import BACKEND_FIXTURES

HERE = Path(__file__).resolve().parent


# What the App offers a scheduler it is built with: implemented by the App, not by an adapter (mypy checks
# App against it where the App binds itself), so no contract suite over adapters runs it.
APP_SIDE = {"SchedulerHost"}


def port_protocols() -> list[type]:
    """Every port: the protocols ``adapters.base`` exports (but the App's side), and the blob store's."""
    found = [getattr(base, name) for name in base.__all__ if name not in APP_SIDE]
    return [p for p in found if isinstance(p, type) and getattr(p, "_is_protocol", False)] + [BlobStore]


def port_members() -> dict[str, bool]:
    """``"Port.member"`` -> whether it is a method, for the public members each protocol declares itself
    (an inherited one is counted on the protocol that declares it)."""
    members: dict[str, bool] = {}
    for proto in port_protocols():
        for name, value in vars(proto).items():
            if not name.startswith("_") and inspect.isfunction(value):
                members[f"{proto.__name__}.{name}"] = True
        for name in inspect.get_annotations(proto):
            if not name.startswith("_"):
                members[f"{proto.__name__}.{name}"] = False
    return members


def _declared(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    out: list[str] = []
    for deco in fn.decorator_list:
        if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Name) and deco.func.id == "covers":
            for arg in deco.args:
                assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), \
                    f"{fn.name}: covers() takes string literals, got {ast.unparse(arg)}"
                out.append(arg.value)
    return out


def _reached(fn: ast.AST, helpers: dict[str, ast.AST], seen: set[str]) -> Iterator[ast.AST]:
    """Every node of ``fn`` and of the module's functions it calls by name (transitively)."""
    for node in ast.walk(fn):
        yield node
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name in helpers and name not in seen:
                seen.add(name)
                yield from _reached(helpers[name], helpers, seen)


def _uses(nodes: list[ast.AST], name: str, method: bool) -> bool:
    if method:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
                   for n in nodes)
    return any(isinstance(n, ast.Attribute) and n.attr == name for n in nodes)


def coverage() -> tuple[dict[str, list[str]], list[str]]:
    """``"Port.member"`` -> the contract tests that exercise it; and every broken declaration."""
    members = port_members()
    covered: dict[str, list[str]] = {m: [] for m in members}
    problems: list[str] = []
    for path in sorted(HERE.glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        helpers: dict[str, ast.AST] = {f.name: f for f in funcs}
        for fn in funcs:
            declared = _declared(fn)
            if not declared:
                continue
            where = f"{path.name}::{fn.name}"
            if not fn.name.startswith("test_"):
                problems.append(f"{where}: covers() on a function that is not a test")
                continue
            args = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
            if not args & BACKEND_FIXTURES:
                problems.append(f"{where}: takes none of the backend fixtures {sorted(BACKEND_FIXTURES)}")
                continue
            nodes = list(_reached(fn, helpers, {fn.name}))
            for member in declared:
                if member not in members:
                    problems.append(f"{where}: {member!r} is no member of a port")
                elif not _uses(nodes, member.partition(".")[2], members[member]):
                    problems.append(f"{where}: declares {member} but never "
                                    f"{'calls' if members[member] else 'reads'} .{member.partition('.')[2]}")
                else:
                    covered[member].append(where)
    return covered, problems


def test_the_ports_are_found() -> None:
    members = port_members()
    # A sample from each file, so a change to how ports are found cannot empty the check below.
    for member in ("JobStore.commit", "RunStore.publish", "FlowStore.take_slot", "Scheduler.precision",
                   "VersionedSchema.path", "RetentionStore.delete_job", "BlobStore.job_ids"):
        assert member in members
    assert {p.__name__ for p in port_protocols()} >= {"Storage", "JobStore", "BlobStore", "InProcessScheduler"}


def test_every_declaration_is_a_call_of_a_port_method_on_a_backend() -> None:
    _, problems = coverage()
    assert problems == []


def test_every_port_method_is_exercised_by_a_contract_test() -> None:
    covered, _ = coverage()
    missing = sorted(m for m, tests in covered.items() if not tests)
    assert missing == [], f"port members no contract test exercises: {missing}"



# --- every backend is under its suite ------------------------------------------------------------------
SUITES: dict[str, tuple[tuple[str, ...], str]] = {
    "storage": (("create_job", "get_job", "commit"), "conftest.py"),
    "blob store": (("put", "get", "job_ids"), "test_blob_contract.py"),
    "scheduler": (("schedule_advance", "requeue", "now"), "scheduler_fixtures.py"),
}
"""Each kind of backend: methods that make a class one (a wrapper passes the rest of its port through), and the
file whose fixture builds every backend of that kind."""


def adapter_classes() -> Iterator[type]:
    """Every public class defined in the ``adapters`` package (its modules and subpackages)."""
    import adapters

    for info in pkgutil.walk_packages(adapters.__path__, prefix="adapters."):
        with warnings.catch_warnings():  # a moved module's old path (an alias, tests/unit/test_moved_modules.py)
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(info.name)
        for name, cls in vars(module).items():
            if (isinstance(cls, type) and cls.__module__ == module.__name__ and not name.startswith("_")
                    and not getattr(cls, "_is_protocol", False)):
                yield cls


@pytest.mark.parametrize("kind", sorted(SUITES))
def test_every_adapter_of_a_port_is_built_by_its_contract_fixture(kind: str) -> None:
    methods, fixture_file = SUITES[kind]
    source = (HERE / fixture_file).read_text()
    found = sorted({cls.__name__ for cls in adapter_classes() if all(callable(getattr(cls, m, None)) for m in methods)})
    assert found, f"no {kind} found in adapters/"
    assert [name for name in found if name not in source] == [], \
        f"a {kind} the contract suite does not run on: add it to the fixture in tests/contract/{fixture_file}"

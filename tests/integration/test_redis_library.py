"""The turn's three scripts as Redis functions (adapters.redis.library): by FCALL where the server has them.

Most cases run a whole job against a real redis-server (or the Redis Cluster): the turn's calls go by a
9-character name, a server that lost its functions has them loaded again, and a server that cannot have
them (no FCALL, a user not allowed it or FUNCTION LOAD, a library of that name holding other code) runs
the same scripts by EVALSHA. Whatever way they ran, the job ends with the same record and transcript.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import tests.apps
from adapters.redis import RedisStorage
from adapters.redis.library import LIBRARY, library_code
from pipelines.engine.errors import StorageError
from pipelines.engine.models import JobStatus
from tests.integration.test_redis_record_format import TURNS, _app_on, _finish, _record, _same_run
from tests.redis_server import RedisServer, find_redis_server
from tests.redis_spy import spy_commands

pytestmark = pytest.mark.redis

NAME, CODE, NAMES, DIGEST = LIBRARY


class Calls:
    """The command name and first argument of every call a storage's client sends."""

    def __init__(self, storage: RedisStorage) -> None:
        self.sent: list[tuple[str, str]] = []

        def spy(send: Any, *args: Any) -> Any:
            self.sent.append((str(args[0]).upper(), str(args[1]) if len(args) > 1 else ""))
            return send(*args)

        spy_commands(storage, spy)

    def turn_calls(self, storage: RedisStorage) -> set[tuple[str, str]]:
        """The calls of the turn's three scripts, whichever way they went."""
        s = storage.scripts
        ours = {s.load.name, s.step.name, s.commit.name, s.load.sha, s.step.sha, s.commit.sha}
        return {(cmd, arg) for cmd, arg in self.sent if arg in ours}


def _run(url: str, **kw: Any) -> tuple[RedisStorage, Calls]:
    storage = RedisStorage.from_url(url, prefix=f"fn{uuid.uuid4().hex[:8]}", **kw)
    calls = Calls(storage)
    app = _app_on(storage)
    app.run_agent("a", job_id="j", messages=["count"])
    _finish(app, "j")
    assert _record(app).status is JobStatus.COMPLETE and len(app.messages("j")) == 2 * TURNS
    return storage, calls


def _reference(redis_url: str) -> Any:
    storage, _ = _run(redis_url)
    try:
        return _record(_app_on(storage)), storage.messages("j")
    finally:
        storage.close()


@pytest.fixture
def server() -> Iterator[Any]:
    """A redis-server of this test's own, started with ``extra`` arguments (``server(*extra)``)."""
    made: list[RedisServer] = []

    def start(*extra: str) -> RedisServer:
        binary = find_redis_server()
        assert binary is not None
        s = RedisServer(binary, extra_args=list(extra))
        s.start()
        made.append(s)
        return s

    yield start
    for s in made:
        s.cleanup()


def test_the_turn_calls_its_three_scripts_by_a_short_name_and_the_library_is_this_versions(redis_url: str) -> None:
    storage, calls = _run(redis_url)
    s = storage.scripts
    # The writes by FCALL; a read (app.get, no lease taken) by EVALSHA, which a server at maxmemory still runs.
    assert calls.turn_calls(storage) == {("FCALL", s.load.name), ("FCALL", s.step.name), ("FCALL", s.commit.name),
                                         ("EVALSHA", s.load.sha)}
    assert all(len(n) == 9 for n in NAMES.values()) and NAME.startswith("phaserunner_")
    [lib] = storage.client.function_list(library=NAME, withcode=True)
    info = dict(zip(lib[::2], lib[1::2], strict=True)) if isinstance(lib, list) else lib
    code = info.get(b"library_code", info.get("library_code"))
    assert code in (CODE, CODE.encode())
    storage.close()


def test_the_library_name_follows_its_code() -> None:
    other = library_code({"c": "return 1", "l": "return 2", "s": "return 3"})
    assert other.name != NAME and set(other.names.values()).isdisjoint(NAMES.values())
    assert library_code({"c": "return 1", "l": "return 2", "s": "return 3"}) == other


def test_a_server_that_lost_its_functions_loads_them_again_mid_job(redis_url: str) -> None:
    storage = RedisStorage.from_url(redis_url, prefix=f"fl{uuid.uuid4().hex[:8]}")
    app = _app_on(storage)
    admin = redis.Redis.from_url(redis_url)
    app.run_agent("a", job_id="j", messages=["count"])
    for _ in range(TURNS + 2):
        if app.get("j").status is not JobStatus.RUNNING:
            break
        admin.function_flush()  # a restart without persistence: every turn's first call finds nothing
        app.advance("j")
    assert _record(app).status is JobStatus.COMPLETE and storage.scripts.library.on
    want, messages = _reference(redis_url)
    _same_run(_record(app), want)
    assert storage.messages("j") == messages
    assert admin.function_list(library=NAME)  # loaded again
    admin.close()
    storage.close()


@pytest.mark.parametrize("how", ["no FCALL", "FCALL not allowed", "FUNCTION LOAD not allowed", "another library"])
def test_a_server_that_cannot_run_this_library_runs_the_same_scripts_by_evalsha(
        how: str, redis_url: str, server: Any, caplog: pytest.LogCaptureFixture) -> None:
    if how == "no FCALL":  # a server without the command ("unknown command 'FCALL'")
        url = server("--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "").url
    else:
        url = server().url
        admin = redis.Redis.from_url(url)
        if how == "another library":  # a clash of the 24-bit name: never run another version's code
            admin.function_load(CODE.replace(DIGEST, "0" * 40).replace("return reply('ok')", "return 'not ours'"))
        else:
            denied = "-fcall" if how == "FCALL not allowed" else "-function"
            admin.acl_setuser("w", enabled=True, passwords=["+pw"], keys=["~*"], channels=["&*"],
                              commands=["+@all", denied])
            url = url.replace("redis://", "redis://w:pw@")
        admin.close()
    with caplog.at_level(logging.WARNING, logger="adapters.redis.library"):
        storage, calls = _run(url)
    s = storage.scripts
    assert not s.library.on and "Redis functions not used" in caplog.text
    # Checked before the first call (function v, then FUNCTION LOAD): not one of the three went by FCALL.
    assert calls.turn_calls(storage) == {("EVALSHA", s.load.sha), ("EVALSHA", s.step.sha), ("EVALSHA", s.commit.sha)}
    want, messages = _reference(redis_url)
    _same_run(_record(_app_on(storage)), want)
    assert storage.messages("j") == messages
    storage.close()


def test_on_a_cluster_with_replicas_each_node_loads_it_again_and_every_write_is_waited_for(
        redis_cluster_url: str) -> None:
    storage = RedisStorage.from_url(redis_cluster_url, prefix=f"fc{uuid.uuid4().hex[:8]}", cluster=True,
                                    replicas=1)
    waits: list[list[str]] = []  # the commands of each pipeline that carries a write and its WAIT
    for node in storage.client.get_primaries():
        inner = node.redis_connection.pipeline

        def pipeline(*a: Any, _inner: Any = inner, **kw: Any) -> Any:
            pipe = _inner(*a, **kw)
            execute = pipe.execute

            def sent(*ea: Any, **ekw: Any) -> Any:
                waits.append([str(c[0][0]).upper() for c in pipe.command_stack])
                return execute(*ea, **ekw)

            pipe.execute = sent
            return pipe

        node.redis_connection.pipeline = pipeline
    app = _app_on(storage)
    app.run_agent("a", job_id="j", messages=["count"])
    for _ in range(TURNS + 2):
        if app.get("j").status is not JobStatus.RUNNING:
            break
        for node in storage.client.get_primaries():
            node.redis_connection.function_flush()  # and so on its replica
        app.advance("j")
    assert _record(app).status is JobStatus.COMPLETE and storage.scripts.library.on
    assert len(storage.messages("j")) == 2 * TURNS
    # Every write went with its WAIT. The turns' by FCALL: a load, two journal writes and a commit a turn
    # (the last turn one journal write), 31 in all, and each turn's first call again once the library it
    # found flushed was loaded. The create and the archive are scripts (EVALSHA).
    assert waits and all(len(cmds) == 2 and cmds[1] == "WAIT" for cmds in waits)
    assert [cmds[0] for cmds in waits].count("FCALL") >= 4 * TURNS
    primary = storage.client.get_node_from_key(storage.keys("j").record).redis_connection
    assert primary.function_list(library=NAME)  # loaded again where the job lives
    storage.close()


def _failing_fcall(storage: RedisStorage, error: Exception, times: int) -> list[str]:
    """Have the storage's client answer its next ``times`` FCALLs with ``error``; the names they called."""
    inner, failed = storage.client.fcall, []

    def fcall(name: str, *args: Any) -> Any:
        if len(failed) < times:
            failed.append(name)
            raise error
        return inner(name, *args)

    storage.client.fcall = fcall  # type: ignore[method-assign]
    return failed


@pytest.mark.parametrize("answer", ["unknown command `FCALL`, with args beginning with: ",  # Redis 6, Dragonfly
                                    "ERR no such command", "something this version never heard of"])
def test_a_server_answering_fcall_in_its_own_words_runs_the_scripts_by_evalsha(redis_url: str, answer: str) -> None:
    storage = RedisStorage.from_url(redis_url, prefix=f"fw{uuid.uuid4().hex[:8]}")
    failed = _failing_fcall(storage, redis.exceptions.ResponseError(answer), times=10**6)
    calls = Calls(storage)
    app = _app_on(storage)
    app.run_agent("a", job_id="j", messages=["count"])
    _finish(app, "j")
    assert _record(app).status is JobStatus.COMPLETE and not storage.scripts.library.on
    assert failed == [NAMES["v"]]  # asked once, before the first call: never again
    s = storage.scripts
    assert calls.turn_calls(storage) == {("EVALSHA", s.load.sha), ("EVALSHA", s.step.sha), ("EVALSHA", s.commit.sha)}
    storage.close()


@pytest.mark.parametrize("error", [redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
                                   redis.exceptions.ResponseError("BUSY Redis is busy running a script.")])
def test_a_server_not_ready_now_fails_the_call_and_keeps_functions_on(redis_url: str, error: Exception) -> None:
    storage = RedisStorage.from_url(redis_url, prefix=f"fb{uuid.uuid4().hex[:8]}")
    app = _app_on(storage)
    app.run_agent("a", job_id="j", messages=["count"])
    _failing_fcall(storage, error, times=1)
    with pytest.raises(StorageError):
        storage.acquire_lease("j", "w1", 30)  # as the call itself would fail: nothing concluded from it
    assert storage.scripts.library.on
    _finish(app, "j")  # the next calls check, and run by FCALL
    assert _record(app).status is JobStatus.COMPLETE and storage.scripts.library.on
    storage.close()


def test_reads_go_by_evalsha_and_work_on_a_server_out_of_memory(server: Any) -> None:
    url = server().url
    storage = RedisStorage.from_url(url, prefix="oom")
    app = _app_on(storage)
    app.run_agent("a", job_id="j", messages=["count"])
    app.advance("j")
    admin = redis.Redis.from_url(url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)  # every write refused from now on
    try:
        # Redis refuses a function that may write before it starts; a script only at its first write.
        assert _record(app).version == 2 and [j.job_id for j in storage.list_jobs()] == ["j"]
        with pytest.raises(StorageError, match="maxmemory"):
            storage.acquire_lease("j", "w1", 30)
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
    assert storage.scripts.library.on
    _finish(app, "j")
    assert _record(app).status is JobStatus.COMPLETE
    storage.close()


def test_a_worker_checks_the_library_before_it_forks_so_a_turn_does_not(redis_url: str) -> None:
    from pipelines.worker import prepare_parent

    storage = RedisStorage.from_url(redis_url, prefix=f"fp{uuid.uuid4().hex[:8]}")
    app = _app_on(storage)
    prepare_parent(app)
    calls = Calls(storage)
    app.run_agent("a", job_id="j", messages=["count"])
    _finish(app, "j")
    assert _record(app).status is JobStatus.COMPLETE
    sent = [name for cmd, name in calls.sent if cmd == "FCALL"]
    assert sent and NAMES["v"] not in sent  # checked once, in the parent: every horse inherits it
    storage.close()


def test_on_a_cluster_the_worker_checks_every_master_before_it_forks(redis_cluster_url: str) -> None:
    from pipelines.worker import prepare_parent

    storage = RedisStorage.from_url(redis_cluster_url, prefix=f"fq{uuid.uuid4().hex[:8]}", cluster=True)
    app = _app_on(storage)
    prepare_parent(app)
    sent: list[str] = []
    for node in storage.client.get_primaries():
        inner = node.redis_connection.execute_command

        def spy(*args: Any, _inner: Any = inner, **options: Any) -> Any:
            if str(args[0]).upper() == "FCALL":
                sent.append(str(args[1]))
            return _inner(*args, **options)

        node.redis_connection.execute_command = spy
    app.run_agent("a", job_id="j", messages=["count"])
    _finish(app, "j")
    assert _record(app).status is JobStatus.COMPLETE
    assert sent and NAMES["v"] not in sent  # every master checked at start: no turn asks
    older = library_code({"c": "return 1", "l": "return 2", "s": "return 3"})
    for node in storage.client.get_primaries():
        node.redis_connection.function_load(older.code)
    assert storage.conn.prune_libraries() == [older.name]  # from every master
    assert all(not node.redis_connection.function_list(library=older.name)
               and node.redis_connection.function_list(library=NAME) for node in storage.client.get_primaries())
    storage.close()
    # Every node's connections too (RedisCluster.close() leaves the pools it handed its node clients open).
    assert all(c._sock is None for node in storage.client.get_nodes()
               for c in node.redis_connection.connection_pool._available_connections)
    assert [j.job_id for j in storage.list_jobs()] == ["j"]  # and a later call opens new ones
    storage.close()


def test_pruning_deletes_other_versions_libraries_only_and_their_processes_load_theirs_again(
        app: Any, redis_url: str) -> None:
    import io

    from adapters.redis.library import Library
    from pipelines.cli import main

    storage = app.storage
    assert isinstance(storage, RedisStorage)
    admin = redis.Redis.from_url(redis_url)
    older = library_code({"c": "return 'older c'", "l": "return 'older l'", "s": "return 'older s'"})
    admin.function_load(older.code)  # an earlier version's, left behind by its last process
    admin.function_load("#!lua name=theirs\nredis.register_function('theirs_f', function() return 1 end)")
    # Named like ours, but not as library_code names them: someone's own, left alone too.
    admin.function_load("#!lua name=phaserunner_custom\nredis.register_function('prc_f', function() return 1 end)")
    storage.conn.check_library()  # this version's, loaded as a worker's start loads it
    ours = _app_on(storage)
    ours.run_agent("a", job_id="j", messages=["count"])
    ours.advance("j")
    out = io.StringIO()
    assert main(["prune-functions", "--app", "tests.apps.redis_app:app"], out=out, err=io.StringIO()) == 0
    assert f"deleted {older.name}" in out.getvalue() and f"kept {NAME}" in out.getvalue()
    names = {lib[1].decode() if isinstance(lib, list) else lib["library_name"] for lib in admin.function_list()}
    assert names == {NAME, "theirs", "phaserunner_custom"}  # someone else's library is not ours to delete
    # A process of the earlier version still running finds its library gone and loads it again.
    still = Library(older)
    assert still.ready(admin) and admin.fcall(older.names["c"], 0) == b"older c"
    out = io.StringIO()
    assert main(["prune-functions", "--app", "tests.apps.redis_app:app"], out=out, err=io.StringIO()) == 0
    assert f"deleted {older.name}" in out.getvalue()
    out = io.StringIO()
    assert main(["prune-functions", "--app", "tests.apps.redis_app:app"], out=out, err=io.StringIO()) == 0
    assert out.getvalue().startswith("nothing to delete")
    _finish(ours, "j")  # this version's library was kept: the job runs on by FCALL
    assert _record(ours).status is JobStatus.COMPLETE and storage.scripts.library.on
    err = io.StringIO()
    assert main(["prune-functions", "--app", "tests.apps.memory_app:app"], out=io.StringIO(), err=err) == 1
    assert "keeps no Redis functions" in err.getvalue()
    admin.function_delete("theirs")
    admin.function_delete("phaserunner_custom")
    admin.close()


def test_pruning_on_a_server_without_functions_says_so(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from pipelines import worker
    from pipelines.cli import main

    monkeypatch.setenv("REDIS_URL", server("--rename-command", "FUNCTION", "", "--rename-command", "FCALL", "").url)
    monkeypatch.delenv("FAKE_OPENAI_BASE", raising=False)
    # The app module reads REDIS_URL once, at import: imported afresh here, and put back as it was after.
    monkeypatch.delitem(sys.modules, "tests.apps.redis_app", raising=False)
    monkeypatch.delattr(tests.apps, "redis_app", raising=False)
    worker.forget_apps()
    out = io.StringIO()
    try:
        assert main(["prune-functions", "--app", "tests.apps.redis_app:app"], out=out, err=io.StringIO()) == 0
    finally:
        worker.forget_apps()
        loaded = sys.modules.get("tests.apps.redis_app")
        if loaded is not None:  # the one imported here (its queues share the storage's client): closed
            loaded.storage.close()
    assert out.getvalue().startswith("nothing to delete: this Redis server has no functions")


def test_a_server_busy_at_the_workers_start_has_the_library_checked_by_the_first_turn(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    from pipelines.worker import prepare_parent

    storage = RedisStorage.from_url(redis_url, prefix=f"fs{uuid.uuid4().hex[:8]}")
    app = _app_on(storage)
    failed = _failing_fcall(storage, redis.exceptions.ResponseError("BUSY Redis is busy running a script."), 1)
    with caplog.at_level(logging.WARNING, logger="pipelines.worker"):
        prepare_parent(app)  # the worker starts: nothing concluded from the answer
    assert failed == [NAMES["v"]] and "checked by the first turn instead" in caplog.text
    app.run_agent("a", job_id="j", messages=["count"])
    _finish(app, "j")
    assert _record(app).status is JobStatus.COMPLETE and storage.scripts.library.on
    storage.close()


def test_only_the_servers_answer_says_a_server_has_no_functions() -> None:
    # redis-py quotes a pipelined command's arguments in its error: a turn's own data must not read as the answer.
    from adapters.redis.library import Library

    lib = Library(library_code({"a": "return 1"}))
    quoted = redis.exceptions.ResponseError(
        "Command # 1 (FCALL prabc a 1 k unknown command 'fcall') of pipeline caused error: BUSY script running")
    assert not lib.unknown(quoted) and lib.on
    assert lib.unknown(redis.exceptions.ResponseError(
        "Command # 1 (FCALL prabc a 1 k) of pipeline caused error: unknown command 'fcall', with args")) and not lib.on
    assert Library(library_code({"a": "return 1"})).unknown(redis.exceptions.ResponseError(
        "unknown command 'FCALL', with args beginning with: 'prabc'"))

"""The ``pipelines`` command (also ``python -m pipelines``): workers, the cron sweep, job inspection.

Every command takes ``--app pkg.mod:app`` (or ``$PIPELINES_APP``) and works on
that app's storage and scheduler::

    pipelines worker    --app X [--queue Q] [--burst] [--simple] [--name N]
                        [--sweep-interval S] [--sweep-grace S] [--alive-ttl S]
    pipelines advance   --app X --due        # cron: advance every due job (I7)
    pipelines advance   --app X JOB          # advance one job now
    pipelines status    --app X JOB [--json]
    pipelines log       --app X JOB
    pipelines transcript --app X JOB [--pretty]
    pipelines retry     --app X JOB [--full]
    pipelines cancel    --app X JOB [--wait S] [--force]
    pipelines jobs      --app X [--status running] [--limit N] [--version] [--before CURSOR] [--count]
    pipelines reindex   --app X              # put jobs stored before the listing indexes into them
    pipelines upgrade-records --app X        # Redis: the newest record format (after every process upgraded)
    pipelines prune-functions --app X        # Redis: delete other versions' function libraries
    pipelines pause | resume --app X JOB
    pipelines approve   --app X JOB CALL
    pipelines reject    --app X JOB CALL --reason "..."
    pipelines tail      --app X JOB [--follow] [--after EVENT_ID]
    pipelines fork      --app X JOB --at-turn N --new-id ID [--run]
    pipelines delete    --app X JOB
    pipelines gc        --app X [--older-than S] [--scan] [--all-pipelines]
    pipelines ui        --app X [--host 127.0.0.1] [--port 8008] [--token-file F] [--read-only]
    pipelines dev       --app X [--db .phaserunner/dev.db] [--workers 4] [--port 8008]  # one process, SQLite
    pipelines migrate   --app X              # upgrade the schema of the app's SQLite file

Exit codes: 0 success, 1 an error explained on stderr in one line as ``error: ...``
with the fix when there is one (unknown job, bad app path, Redis unreachable, ...),
2 bad command-line usage, 141 the reader of the output went away (``| head``).

The worker is an RQ worker that also sweeps: every ``--sweep-interval``
seconds (default 2; 0 disables) a background thread re-enqueues the jobs that
have been due for ``--sweep-grace`` seconds (default 5) and are not leased
(a lost message, a dead worker's turn). So when a whole worker dies
mid-phase, another worker finishes the job once the lease expires, without
cron and without waiting for RQ's own cleanup (~11 minutes): with the default
10 s lease (renewed every third of it), the turn runs again ~7-12 s after
the kill. The grace is shorter than any lease a kill leaves behind, so it
never delays that; it keeps the sweep off a message that is merely waiting. The sweep only
enqueues; the advance runs in a work-horse as usual (running it in the
parent's thread deadlocked horses forked mid-import). ``pipelines advance
--due`` from cron advances due jobs in its own process, for when no worker
is running. What a worker runs is fixed when it starts (its ``--app`` and
its one entry point), and its horse and scheduler child end with it: see
:mod:`pipelines.worker`.

The package, one module per group of commands, each importing only the App,
its read model and the public errors (``tests/unit/test_layers.py``):
:mod:`~pipelines.cli.main` (the parser, :func:`main`), :mod:`~pipelines.cli.runs`
(one job), :mod:`~pipelines.cli.listing` (``jobs``), :mod:`~pipelines.cli.actions`,
:mod:`~pipelines.cli.agent`, :mod:`~pipelines.cli.dev`, :mod:`~pipelines.cli.health`;
:mod:`~pipelines.cli.loading`, :mod:`~pipelines.cli.args` and :mod:`~pipelines.cli.errors`
are what they share.
"""

from __future__ import annotations

from pipelines.cli.main import build_parser, main

__all__ = ["build_parser", "main"]

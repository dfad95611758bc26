# Two commands set everything up: `make demo` (the main job) and `make test`. Both create .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint format schemas browser bench clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: the local CPU wheel; a looser pin would pull gigabytes of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[service,dev]'
	touch $(STAMP)

browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

demo: $(STAMP)
	$(PY) -m examples.demo

# CI runs `make test`, so lint (format, style and types) gates it.
test: $(STAMP) lint browser
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy stratagem simulator trial_runner optimizer_service

schemas: $(STAMP)
	$(PY) -m stratagem.ir.schemas docs/schemas

bench: $(STAMP)
	for b in benchmarks/[a-z]*.py; do n=$$(basename $$b .py); echo "== $$n"; $(PY) -m benchmarks.$$n || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache

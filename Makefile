# One word per workflow.
PY ?= .venv/bin/python

.PHONY: dev test golden lint typecheck check bench

dev:
	python3 -m venv .venv
	$(PY) -m pip install -q -e '.[test,dev]'

test:
	$(PY) -m pytest -q

golden:
	$(PY) -m pytest -q tests/test_golden.py tests/test_diagnostics.py --update-golden
	git status --short tests/golden tests/diagnostics

lint:
	$(PY) -m ruff check tcdsl backends tests bench
	$(PY) -m ruff format --check tcdsl backends tests bench

# mypy cannot follow the editable-install hook that maps backends/ and grammar/ into the
# package, so type-check a regular install in a venv of its own.
typecheck:
	python3 -m venv .venv-typecheck
	.venv-typecheck/bin/python -m pip install -q . mypy
	cd /tmp && $(CURDIR)/.venv-typecheck/bin/python -m mypy --strict --ignore-missing-imports -p tcdsl

check: lint typecheck test

bench:
	$(PY) bench/compile_bench.py 1000 10000 50000

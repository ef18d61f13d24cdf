# One word per workflow.
PY ?= .venv/bin/python
# The same pin as the dev extra in setup.cfg.
RUFF_VERSION = 0.17.6

.PHONY: dev test golden lint typecheck check bench fuzz

dev:
	python3 -m venv .venv
	$(PY) -m pip install -q -e '.[test,dev]'

test:
	$(PY) -m pytest -q

golden:
	$(PY) -m pytest -q tests/test_golden.py tests/test_diagnostics.py tests/test_explain.py --update-golden
	git status --short tests/golden tests/golden_explain tests/diagnostics

# ruff is a dev extra; the README's venv (extras 'test' only) gets it here on first use.
lint:
	@$(PY) -m ruff --version >/dev/null 2>&1 || { \
		echo "make lint: installing ruff (a dev extra; 'make dev' installs all of them)"; \
		$(PY) -m pip install -q "ruff==$(RUFF_VERSION)"; }
	$(PY) -m ruff check tcdsl backends tests bench
	$(PY) -m ruff format --check tcdsl backends tests bench

# mypy cannot follow the editable-install hook that maps backends/ and grammar/ into the
# package, so type-check a regular install in a venv of its own.
typecheck:
	python3 -m venv .venv-typecheck
	.venv-typecheck/bin/python -m pip install -q . mypy
	cd /tmp && $(CURDIR)/.venv-typecheck/bin/python -m mypy --strict --ignore-missing-imports -p tcdsl

check: lint typecheck test

# Each prints its figures against its target (docs/scale.md, "Figures"); the kernel ones need
# root, and take about half an hour together on a 2-core machine.
bench:
	$(PY) bench/compile_bench.py --process 10000 1000 10000 50000
	$(PY) bench/table_bench.py 1000 10000 50000
	$(PY) bench/hash_bench.py
	$(PY) bench/ops_bench.py 1000 10000
	$(PY) bench/apply_bench.py --no-shell-above 2000 1000 10000
	$(PY) bench/mq_bench.py 50000 10000
	TCDSL_BENCH=1 $(PY) -m pytest -q -s -p no:cacheprovider tests/test_hash_kernel.py

# Generated policies against real kernels, many more than CI's 200 (host) and 100 (user-mode
# Linux), with fresh randomness each run: FUZZ_EXAMPLES host policies (~0.2 s each), a quarter
# of that in one user-mode Linux boot (~1.2 s each). A failure prints the policies the kernel
# disagrees with (a host one shrunk). Repeat the user-mode Linux batch with TCDSL_FUZZ_SEED=N
# (printed), the host run with FUZZ_ARGS=--hypothesis-seed=N.
FUZZ_EXAMPLES ?= 2000
fuzz:
	TCDSL_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -s -p no:cacheprovider \
		tests/test_verify_properties.py $(FUZZ_ARGS)

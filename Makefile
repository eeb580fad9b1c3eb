# `make test` is the project's test command and `make lint` its style check (`.ci/run` calls both); `make demo` is the
# quickstart.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

DEMO_VARIANTS := softmax ssmax lssa lssar
DEMO_RUNS := runs/demo
DEMO_REPORT := reports/demo
DEMO_TRAIN_FLAGS := --config.train.steps=200 --config.train.eval_every=100 --config.train.checkpoint_every=100
DEMO_EVAL_FLAGS := --switch=p=15 --eval_tokens=8200 --passkey_keys=2

.PHONY: install test lint format demo compile-check mutants

# uv installs the pinned set (bytecode compiled, as pip does) in a fraction of pip's time; pip stays the fallback.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	( $(PY) -m pip install -q -c constraints.txt uv && $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -c constraints.txt -e '.[test]' ) \
		|| $(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $@

install: $(VENV)/.installed

# three workers on two cores: the CLI, multi-host and kill -9 tests wait on their child processes, and a third worker
# fills those waits (the suite's CPU time stays the same; the wall time falls by about a sixth)
test: $(VENV)/.installed
	$(PY) -m pytest -q -n 3 --dist worksteal --durations=15

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(VENV)/.installed
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Each run resumes from its last checkpoint if interrupted; a finished run is marked and not redone.
$(DEMO_RUNS)/%/finished: | $(VENV)/.installed
	$(PY) train.py --config=$*:tiny --workdir=$(DEMO_RUNS)/$* $(DEMO_TRAIN_FLAGS)
	touch $@

$(DEMO_REPORT)/report.md: $(foreach v,$(DEMO_VARIANTS),$(DEMO_RUNS)/$(v)/finished)
	$(PY) eval.py $(foreach v,$(DEMO_VARIANTS),--workdir=$(DEMO_RUNS)/$(v)) $(DEMO_EVAL_FLAGS) --out=$(DEMO_REPORT)

demo: $(DEMO_REPORT)/report.md
	@echo "demo report: $(DEMO_REPORT)/report.md"

# The full compile matrix: every variant's kernels at 8K-128K on TPU v5e/v5p/v6e and H100/H200, without the
# chips (needs pip install -e '.[compile]'; tens of minutes on 2 cores). `make test` runs a small part of it.
compile-check: $(VENV)/.installed
	$(PY) -m pip install -q -c constraints.txt -e '.[compile]'
	$(PY) benchmarks/compile_matrix.py

# Each curated mutant (tests/mutation/) applied alone, its tests run, caught or survived printed (about 10 minutes
# of both cores; refuses to start while a target file has uncommitted changes). tests/mutation/test_catalogue.py keeps it runnable.
mutants: $(VENV)/.installed
	$(PY) -m tests.mutation.run

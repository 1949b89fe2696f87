# `make train` and `make test` each build .venv from this repository's own files first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test lint bench clean

$(STAMP): pyproject.toml setup.py geartrain-excepthook.pth constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# constraints.txt pins the CPU build of torch and every other package, so CI is fast and repeatable.
	PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/geartrain $(ARGS)

# The linters and their order are written once, in tests/test_lint.py.
lint: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_lint.py

# pytest-xdist: one worker per core (TEST_WORKERS=0 runs in this process). A file's tests stay together
# (--dist loadfile), so a module's shared process group or trained run is made once, by one worker.
TEST_WORKERS ?= 2

# ruff and mypy are tests of the suite (tests/test_lint.py), run beside the others rather than before them.
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) outputs multirun

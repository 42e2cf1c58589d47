# Fresh machine: `make demo` or `make test` creates .venv and installs everything first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := artifacts/demo-transformer-x86

.PHONY: setup demo test test-all clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Build a BERT-like encoder from the zoo, compile it for this CPU, check it, time it.
demo: setup
	$(BIN)/mlc models
	$(BIN)/mlc compile zoo:transformer --target x86 -o $(DEMO) --archive
	$(BIN)/mlc check $(DEMO)
	$(BIN)/mlc run $(DEMO) --warmup 3 --repeat 50

# What CI runs (.ci/run): everything but slow, GPU and tuning tests.
test: setup
	$(BIN)/python -m pytest -m "not slow and not gpu and not tune"

test-all: setup
	$(BIN)/python -m pytest

clean:
	rm -rf artifacts build *.egg-info .pytest_cache

# Fresh machine: `make demo` or `make test` creates .venv and installs everything first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := artifacts/demo-bert-tiny-x86

# Debian packages for ARM targets: the aarch64 cross compiler and qemu to verify its output here.
APT_PACKAGES := g++-aarch64-linux-gnu qemu-user
SYSTEM_TOOLS := aarch64-linux-gnu-g++ qemu-aarch64

.PHONY: setup system-deps suite-env demo lint test test-all clean

setup: $(STAMP) system-deps

# Installs the Debian packages when run as root (CI, containers); otherwise says what to run.
system-deps:
	@for tool in $(SYSTEM_TOOLS); do command -v $$tool >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $(APT_PACKAGES) (ARM cross-compilation and emulation)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	  else \
	    echo "note: ARM targets need: sudo apt-get install $(APT_PACKAGES) (their tests are skipped until then)"; \
	  fi; \
	fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# A bench-only venv for `mlc bench --suite timm` (never CI): timm imports torchvision, and PyPI's torchvision fails
# beside the pinned torch==2.13.0+cpu, so this venv takes torch 2.14.1 + torchvision 0.29.1 (a CUDA build, ~5.5 GB,
# runs on CPU; pip takes both from this machine's disk) first, then mlc with the `suites` extra, which leaves torch be.
SUITE_VENV ?= .venv-suites
SUITE_STAMP := $(SUITE_VENV)/.installed

suite-env: $(SUITE_STAMP)

$(SUITE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(SUITE_VENV)
	$(SUITE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SUITE_VENV)/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1 timm==1.0.31
	$(SUITE_VENV)/bin/python -m pip install --quiet -e '.[suites]' torch==2.14.1 torchvision==0.29.1
	$(SUITE_VENV)/bin/python -c "import timm; timm.create_model('resnet18', pretrained=False)"
	touch $(SUITE_STAMP)

# A BERT encoder built in PyTorch (seeded, from the zoo): export, compile for this CPU, check against
# torch's eager outputs, time it.
demo: setup
	$(BIN)/mlc models
	$(BIN)/mlc compile zoo:bert-tiny --framework torch --target x86 -o $(DEMO) --archive
	$(BIN)/mlc check $(DEMO)
	$(BIN)/mlc run $(DEMO) --warmup 3 --repeat 50

# Static checks (rules in pyproject.toml [tool.ruff]); CI runs it before the tests.
lint: $(STAMP)
	$(BIN)/ruff check mlc tests benchmarks

# What CI runs (.ci/run): everything but slow, GPU and tuning tests. The tests are single-threaded (a compile
# worker and its parent take turns), so TEST_WORKERS processes (pytest-xdist) each take whole files: module fixtures
# are built once. More workers than cores, or than ~10 GB of memory each, slow it down. A worker that dies ends the
# run (xdist hung after replacing one, its file's other tests unscheduled).
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --max-worker-restart 0 -m "not slow and not gpu and not tune"

test-all: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf artifacts build *.egg-info .pytest_cache

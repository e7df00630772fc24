# Fleet. `make run` tunes the matmul example on this machine; `make test` runs every test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
BASE   := $(VENV)/.installed-base
STAMP  := $(VENV)/.installed

.PHONY: run test check unit lint bench bench-tvm install services clean

# The base package alone: what `make run` needs, so that the first trial starts within a minute.
# editable_mode=compat puts the clone on sys.path, so that `import fleet` finds the package wherever Python runs:
# setuptools' default editable finder comes after the path search, which would take a clone named fleet/ in the
# current directory for a namespace package.
EDITABLE := --config-settings editable_mode=compat
$(BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(EDITABLE) -e .
	touch $(BASE)

# Everything the tests and benchmarks use: TVM, Optuna, Fabric, Flower, hypothesis, ruff, mypy.
$(STAMP): $(BASE) pyproject.toml
	$(BIN)/pip install --quiet --disable-pip-version-check $(EDITABLE) -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Tune examples/matmul-c on this machine: embedded database, broker and workers under ./.fleet/.
run: $(BASE)
	@command -v gcc >/dev/null || { echo "make run needs gcc (apt-get install gcc)"; exit 1; }
	$(BIN)/fleet tune examples/matmul-c/spec.json

## Every test, against a private Redis and PostgreSQL started on loopback for the run; ends with its wall time and
## the slowest 25 tests. The test files run side by side in TEST_PROCESSES processes (pytest-xdist), each file
## whole in one, the slowest files first (tests/durations.json; xdist's own order, most tests first, left the
## longest files to the end): most tests wait on workers and services, so more processes than cores pay.
## TEST_PROCESSES=0 runs them one after the other in this process.
TEST_PROCESSES ?= 4
PYTEST := $(BIN)/pytest -q -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder
test: $(STAMP) services lint
	FLEET_REQUIRE_SERVICES=1 $(PYTEST) --durations=25

## The edit-test loop: lint, format and types, then the unit tests (no service needed).
check: lint unit

unit: $(STAMP)
	$(PYTEST) tests/unit

services:
	scripts/install-services

## Lint, format and types: what CI enforces before the tests (make test runs it first).
lint: $(STAMP)
	$(BIN)/ruff check fleet tests
	$(BIN)/ruff format --check fleet tests
	$(BIN)/mypy

bench: $(STAMP) services
	$(BIN)/fleet bench dispatch
	$(BIN)/fleet bench search --space all
	$(BIN)/fleet bench search --history ../shared/tuning-spaces
	$(BIN)/fleet bench pareto --space all
	$(BIN)/fleet bench miopen
	$(BIN)/fleet bench history
	$(BIN)/fleet bench share
	$(BIN)/fleet bench scale
	$(BIN)/fleet bench pipeline
	$(BIN)/fleet bench chaos
	$(BIN)/fleet bench partition
	$(BIN)/fleet bench slurm
	$(BIN)/fleet bench systemd
	$(BIN)/fleet bench tvm

## A tuned 1024^3 matmul and an AlexNet conv2d (TVM) against the default schedule and NumPy.
bench-tvm: $(STAMP)
	$(BIN)/fleet bench tvm

clean:
	rm -rf .fleet build dist *.egg-info

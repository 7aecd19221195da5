# strom developer entry points. `make test` and `make demo` work on a fresh Debian machine:
# both run scripts/bootstrap.sh first, which installs apt packages and the virtualenv.
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONDONTWRITEBYTECODE := 1
# Optional parts the bootstrap installs beside the dev tools: PySpark (and a Java runtime) for
# the Spark connector, its tests and the demo. `make test STROM_EXTRAS=` skips it.
STROM_EXTRAS ?= spark
export STROM_EXTRAS

.PHONY: all setup test test-unit lint format protos check-protos generate bench bench-goals bench-spark demo demo-cluster lock clean chaos

all: test

setup:
	bash scripts/bootstrap.sh

## Runs the whole suite: lint, stub staleness, unit, property and integration tests.
test: setup
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25

## Randomized faults against a checked workload (tests/chaos): `make chaos DURATION=20m`,
## `make chaos SEED=1234` replays a run's fault schedule. Output under /tmp/strom-chaos.
DURATION ?= 20m
SEED ?=
chaos: setup
	$(PY) -m tests.chaos.run --duration $(DURATION) $(if $(SEED),--seed $(SEED))

test-unit: setup
	$(PY) -m pytest -q tests/unit

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## Regenerates the committed gRPC/protobuf stubs under services/strom/api/.
protos: setup
	$(PY) scripts/gen_protos.py

## Regenerates docs/metrics.md and the Grafana dashboard; copies the alert rules into the chart.
generate: setup
	$(PY) scripts/gen_metrics_doc.py
	$(PY) deploy/grafana/build_dashboard.py
	cp deploy/prometheus/strom-alerts.yml helm/strom/files/strom-alerts.yml

bench: setup
	$(VENV)/bin/strom bench record
	$(VENV)/bin/strom bench log --warm
	$(VENV)/bin/strom bench compaction

## Every goal of the performance issue, each by its documented command, on clusters of its own
## (5 minutes on the slower instance; docs/benchmarks.md, "Where each goal stands").
bench-goals: setup
	$(VENV)/bin/strom bench goals

## Spark connector throughput on local[2] beside an in-memory Arrow source (docs/benchmarks.md).
bench-spark: setup
	$(VENV)/bin/strom bench spark

## The main job: a local cluster and a Spark pipeline over it (strom_spark.demo).
demo: setup
	$(VENV)/bin/strom demo

## The cluster-internals demo: produce/consume, a controller and a node killed.
demo-cluster: setup
	$(VENV)/bin/strom demo --cluster

lock: setup
	$(PY) -m pip freeze --exclude-editable | grep -v '^pip=' > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info

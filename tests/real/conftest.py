"""Fixtures for the real-vLLM tier.

The first use builds the vLLM environment when it is missing (`scripts/real_vllm.py setup`, a few
minutes); if that fails, every test that needs it fails with the setup log. Nothing is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real.pipeline_support import pipeline_stack
from tests.real.vllm_server import SETUP_SCRIPT, RealVllmFactory, RealVllmServer
from tests.support.real_environment import ensure_environment

SETUP_TIMEOUT_S = 3600

__all__ = ["pipeline_stack"]  # the module-scoped alerting stack of the pipeline tests, by name
SETUP_LOG_TAIL_LINES = 120

# Servers started by the session fixture, so the per-test fixture can undo a test's damage
# without starting one itself.
_SESSION_SERVERS: list[RealVllmServer] = []


@pytest.fixture(scope="session")
def real_vllm_environment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Makes sure .venv-vllm and the tiny model exist (runs the setup if not); returns a log dir."""
    log_dir = tmp_path_factory.mktemp("real-vllm")
    ensure_environment(SETUP_SCRIPT, log_dir, "real vLLM", SETUP_TIMEOUT_S)
    return log_dir


@pytest.fixture(scope="session")
def real_vllm(real_vllm_environment: Path) -> Iterator[RealVllmServer]:
    """One default real vLLM server for the whole session (it takes ~40 s to start)."""
    yield from _for_the_session(RealVllmServer(real_vllm_environment, name="default"), True)


@pytest.fixture(scope="session")
def real_vllm_two_api_servers(real_vllm_environment: Path) -> Iterator[RealVllmServer]:
    """One real vLLM server with `--api-server-count 2` (multiprocess metrics) for the session."""
    arguments = ("--api-server-count", "2")
    server = RealVllmServer(real_vllm_environment, arguments, name="two-api-servers")
    yield from _for_the_session(server, False)


def _for_the_session(server: RealVllmServer, warm_up: bool) -> Iterator[RealVllmServer]:
    """Start `server`, keep it watched between tests (`_restore_session_servers`), stop it."""
    server.start(warm_up=warm_up)
    _SESSION_SERVERS.append(server)
    try:
        yield server
    finally:
        _SESSION_SERVERS.remove(server)
        server.stop()


@pytest.fixture(autouse=True)
def _restore_session_servers() -> Iterator[None]:
    """After each test: fail if a worker died under it; resume a stopped engine core, restart a
    server a test killed."""
    yield
    deaths = [
        f"{server.describe()}: a worker died ({death}); log {server.log_path}:\n{server.log_tail()}"
        for server in _SESSION_SERVERS
        if (death := server.worker_death()) is not None
    ]
    for server in _SESSION_SERVERS:
        server.recover()
    if deaths:
        pytest.fail("\n\n".join(deaths), pytrace=False)


@pytest.fixture
def real_vllm_factory(real_vllm_environment: Path) -> Iterator[RealVllmFactory]:
    """Starts extra real vLLM servers with extra arguments; stops all of them after the test."""
    started: list[RealVllmServer] = []

    def start(*extra_args: str, name: str = "extra") -> RealVllmServer:
        server = RealVllmServer(real_vllm_environment, extra_args, name=name)
        started.append(server)
        server.start()
        return server

    try:
        yield start
        for server in started:
            server.raise_if_worker_died()
    finally:
        for server in started:
            server.stop()

"""Fixtures for the real-vLLM tier.

The first use builds the vLLM environment when it is missing (`scripts/real_vllm.py setup`, a few
minutes); if that fails, every test that needs it fails with the setup log. Nothing is skipped.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real.vllm_server import SETUP_SCRIPT, RealVllmFactory, RealVllmServer

REAL_DIR = Path(__file__).resolve().parent
SETUP_TIMEOUT_S = 3600
SETUP_LOG_TAIL_LINES = 120

# Servers started by the session fixture, so the per-test fixture can undo a test's damage
# without starting one itself.
_SESSION_SERVERS: list[RealVllmServer] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_DIR in item.path.parents:
            item.add_marker(pytest.mark.real)


def _environment_is_complete() -> bool:
    status = subprocess.run(
        [sys.executable, str(SETUP_SCRIPT), "status"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    return status.returncode == 0


@pytest.fixture(scope="session")
def real_vllm_environment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Makes sure .venv-vllm and the tiny model exist (runs the setup if not); returns a log dir."""
    log_dir = tmp_path_factory.mktemp("real-vllm")
    if _environment_is_complete():
        return log_dir
    setup_log = log_dir / "setup.log"
    started = time.monotonic()
    with setup_log.open("wb") as log:
        try:
            result = subprocess.run(
                [sys.executable, str(SETUP_SCRIPT), "setup"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
                timeout=SETUP_TIMEOUT_S,
            )
            exit_code: int | str = result.returncode
        except subprocess.TimeoutExpired:
            exit_code = f"timeout after {SETUP_TIMEOUT_S} s"
    took = time.monotonic() - started
    if exit_code != 0 or not _environment_is_complete():
        tail = "\n".join(
            setup_log.read_text(encoding="utf-8", errors="replace").splitlines()[
                -SETUP_LOG_TAIL_LINES:
            ]
        )
        pytest.fail(
            f"real vLLM setup failed ({exit_code}) after {took:.0f} s; log {setup_log}:\n{tail}",
            pytrace=False,
        )
    print(f"\nreal vLLM environment set up in {took:.0f} s (log {setup_log})")
    return log_dir


@pytest.fixture(scope="session")
def real_vllm(real_vllm_environment: Path) -> Iterator[RealVllmServer]:
    """One default real vLLM server for the whole session (it takes ~40 s to start)."""
    server = RealVllmServer(real_vllm_environment, name="default")
    server.start(warm_up=True)
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

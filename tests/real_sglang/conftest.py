"""Fixtures for the real SGLang tier.

The tier runs where the recipe's wheels do (CPython 3.11 on Linux x86_64); elsewhere every test
is skipped, saying so. The first use builds the environment when it is missing
(`scripts/real_sglang.py setup`, a few minutes and about 6.5 GB); if that fails, the tests fail
with its log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.real_sglang.sglang_server import SETUP_SCRIPT, RealSglangServer, wait_until_quiet
from tests.support.real_environment import ensure_environment, load_setup_script

# The module-scoped servers, which one case hands on to the next.
SERVERS = ("real_sglang", "rust_sglang")
SETUP_TIMEOUT_S = 3600


@pytest.fixture(scope="session")
def real_sglang_environment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Skips where the recipe cannot run; builds .venv-sglang if missing; returns a log dir."""
    supported, why = load_setup_script(SETUP_SCRIPT).platform_supported()
    if not supported:
        pytest.skip(f"real SGLang tier skipped: {why}")
    log_dir = tmp_path_factory.mktemp("real-sglang")
    ensure_environment(SETUP_SCRIPT, log_dir, "real SGLang", SETUP_TIMEOUT_S)
    return log_dir


@pytest.fixture(scope="module")
def real_sglang(real_sglang_environment: Path) -> Iterator[RealSglangServer]:
    """One real SGLang server (Python frontend, `--sleep-on-idle`) for a test module."""
    server = RealSglangServer(real_sglang_environment)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
async def _quiet_before_each_test(request: pytest.FixtureRequest) -> None:
    """Each case starts on a server with nothing left of the last one."""
    server = next(
        (request.getfixturevalue(name) for name in SERVERS if name in request.fixturenames), None
    )
    if server is not None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            await wait_until_quiet(session, server.base_url)

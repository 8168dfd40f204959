"""A real HAProxy (Debian's package) in tests: `stallwatch.localstack.haproxy` started for the
block and stopped after it, and a bounded wait on its state."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from stallwatch.localstack.haproxy import BACKEND, HAProxy

__all__ = ["BACKEND", "HAProxy", "running_haproxy", "wait_for"]


async def wait_for(
    what: str, condition: Callable[[], bool], proxy: HAProxy, timeout: float = 30.0
) -> None:
    """Wait (bounded) until `condition()` holds; fail saying what did not happen."""
    deadline = time.monotonic() + timeout
    while not condition():
        proxy.process.check_alive()
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s; servers: {proxy.servers()}")
        await asyncio.sleep(0.05)


@contextlib.contextmanager
def running_haproxy(
    tmp_path: Path,
    servers: Sequence[tuple[str, str]],
    agent_port: int,
    *,
    agent_inter: str = "1s",
) -> Iterator[HAProxy]:
    """HAProxy in front of `servers`, its agent-check on `agent_port`; stopped and reaped."""
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed; `make test` installs it (Debian package haproxy)")
    proxy = HAProxy(tmp_path, servers, agent_port, agent_inter=agent_inter)
    try:
        yield proxy.start()
    finally:
        proxy.stop()

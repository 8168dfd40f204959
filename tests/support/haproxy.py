"""A real HAProxy (Debian's package) on loopback for tests: a frontend on a free port, one
backend of model servers with the restarter's agent-check, and its stats socket to read each
server's state and request count."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from stallwatch.localstack.processes import ManagedProcess, free_port

BACKEND = "llm"
STARTUP_SECONDS = 20.0


def haproxy_binary() -> str:
    path = shutil.which("haproxy")
    if path is None:
        pytest.fail("haproxy is not installed; `make test` installs it (Debian package haproxy)")
    return path


def config_text(
    frontend_port: int,
    servers: Sequence[tuple[str, str]],
    agent_port: int,
    stats_socket: Path,
    *,
    agent_inter: str = "1s",
) -> str:
    """An HAProxy config: `servers` are (name, host:port); each server's agent-check asks the
    restarter's agent port about `llm/NAME`."""
    lines = [
        "global",
        f"    stats socket {stats_socket} mode 600 level admin",
        "    maxconn 256",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 30s",
        "    timeout server 30s",
        "    timeout check 2s",
        "frontend users",
        f"    bind 127.0.0.1:{frontend_port}",
        f"    default_backend {BACKEND}",
        f"backend {BACKEND}",
        "    balance roundrobin",
        "    option httpchk GET /health",
    ]
    for name, address in servers:
        lines.append(
            f"    server {name} {address} check inter 1s agent-check agent-addr 127.0.0.1 "
            f'agent-port {agent_port} agent-send "{BACKEND}/{name}\\n" agent-inter {agent_inter}'
        )
    return "\n".join(lines) + "\n"


@dataclass
class HAProxy:
    """A running HAProxy: `url` is its frontend, `stats_socket` its admin socket."""

    process: ManagedProcess
    url: str
    stats_socket: Path

    def command(self, line: str) -> str:
        """One command on the stats socket; its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            sock.connect(str(self.stats_socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self) -> dict[str, dict[str, str]]:
        """`show stat` of the backend's servers, by server name."""
        text = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {
            row["svname"]: row
            for row in rows
            if row["pxname"] == BACKEND and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def status(self, server: str) -> str:
        return self.servers()[server]["status"]

    def sessions(self, server: str) -> int:
        """Connections HAProxy has sent to `server` so far (its `stot`)."""
        return int(self.servers()[server]["stot"])


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
    """HAProxy in the foreground (its own process group), stopped and reaped afterwards."""
    binary = haproxy_binary()
    port = free_port()
    stats_socket = tmp_path / "haproxy.sock"
    config = tmp_path / "haproxy.cfg"
    config.write_text(config_text(port, servers, agent_port, stats_socket, agent_inter=agent_inter))
    process = ManagedProcess(
        "haproxy", [binary, "-db", "-f", str(config)], tmp_path / "haproxy.log"
    )
    process.start()
    proxy = HAProxy(process, f"http://127.0.0.1:{port}", stats_socket)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            process.check_alive()
            with contextlib.suppress(OSError):
                if proxy.servers():
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"haproxy did not start:\n{process.log_tail()}")
            time.sleep(0.05)
        yield proxy
    finally:
        process.stop()
        stats_socket.unlink(missing_ok=True)

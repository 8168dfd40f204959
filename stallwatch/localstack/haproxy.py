"""A real HAProxy (Debian's package) on loopback, for the demo and the tests: one frontend, one
backend of model servers whose agent-check asks the restarter's agent port, and its stats socket
read for each server's state and the requests sent to it."""

from __future__ import annotations

import contextlib
import csv
import io
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from stallwatch.localstack.errors import LocalStackError, MissingBinaryError
from stallwatch.localstack.processes import STARTUP_TIMEOUT_SECONDS, ManagedProcess, free_port

BACKEND = "llm"
STATS_TIMEOUT_SECONDS = 5.0


def haproxy_config(
    frontend_port: int,
    servers: Sequence[tuple[str, str]],
    agent_port: int,
    stats_socket: Path,
    *,
    agent_inter: str = "1s",
    client_timeout: str = "60s",
) -> str:
    """HAProxy's config: `servers` are (name, host:port), each with its own HTTP health check
    (`GET /health`) and an agent-check that sends `llm/NAME` to the restarter's agent port."""
    lines = [
        "global",
        f"    stats socket {stats_socket} mode 600 level admin",
        "    maxconn 256",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        f"    timeout client {client_timeout}",
        f"    timeout server {client_timeout}",
        "    timeout check 2s",
        "frontend users",
        f"    bind 127.0.0.1:{frontend_port}",
        f"    default_backend {BACKEND}",
        f"backend {BACKEND}",
        "    balance roundrobin",
        "    option abortonclose",
        "    option httpchk GET /health",
    ]
    for name, address in servers:
        lines.append(
            f"    server {name} {address} check inter 1s agent-check agent-addr 127.0.0.1 "
            f'agent-port {agent_port} agent-send "{BACKEND}/{name}\\n" agent-inter {agent_inter}'
        )
    return "\n".join(lines) + "\n"


def haproxy_binary() -> str:
    path = shutil.which("haproxy")
    if path is None:
        raise MissingBinaryError(
            "haproxy is not on PATH; install Debian's haproxy package "
            "(`make demo` and `make test` do it when run as root)"
        )
    return path


class HAProxy:
    """HAProxy in the foreground, in a process group of its own; `url` is its frontend."""

    def __init__(
        self,
        workdir: Path,
        servers: Sequence[tuple[str, str]],
        agent_port: int,
        *,
        agent_inter: str = "1s",
        client_timeout: str = "60s",
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stats_socket = workdir / "haproxy.sock"
        config = workdir / "haproxy.cfg"
        config.write_text(
            haproxy_config(
                self.port,
                servers,
                agent_port,
                self.stats_socket,
                agent_inter=agent_inter,
                client_timeout=client_timeout,
            )
        )
        self.process = ManagedProcess(
            "haproxy", [haproxy_binary(), "-db", "-f", str(config)], workdir / "haproxy.log"
        )

    def start(self, timeout: float = STARTUP_TIMEOUT_SECONDS) -> HAProxy:
        """Start it and wait until its stats socket answers (blocking)."""
        self.process.start()
        deadline = time.monotonic() + timeout
        while True:
            self.process.check_alive()
            with contextlib.suppress(OSError):
                if self.servers():
                    return self
            if time.monotonic() > deadline:
                raise LocalStackError(
                    f"haproxy did not answer on its stats socket after {timeout:g} s:\n"
                    f"{self.process.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.stop()
        self.stats_socket.unlink(missing_ok=True)

    def command(self, line: str) -> str:
        """One command on the stats socket; its answer (blocking)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(STATS_TIMEOUT_SECONDS)
            sock.connect(str(self.stats_socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self) -> dict[str, dict[str, str]]:
        """`show stat` of the backend's servers, by name: `status` (`UP`, `DOWN (agent)`,
        `MAINT`...), `stot` (requests sent to it so far), `last_agt` (what the agent said)."""
        text = self.command("show stat").lstrip("# ")
        return {
            row["svname"]: row
            for row in csv.DictReader(io.StringIO(text))
            if row["pxname"] == BACKEND and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def status(self, server: str) -> str:
        return self.servers()[server]["status"]


def in_rotation(status: str) -> bool:
    """Whether HAProxy sends users to a server showing this `show stat` status: `UP`, and `UP
    2/3` (up, a health check failed since: "going down", still serving), not `DOWN (agent)`,
    `DOWN 1/2` (down, "going up"), `NOLB`, `DRAIN` or `MAINT`."""
    return status == "UP" or status.startswith("UP ")

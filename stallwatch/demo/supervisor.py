"""The demo's supervisor: restarts a simulator process on the restarter's behalf, and its client.

It plays what systemd or a container runtime does for a real server. The restarter's `command`
action runs `stallwatch demo restart-helper URL TOKEN_FILE`, which asks the supervisor to
restart the target named in STALLWATCH_TARGET and prints its answer once the new process is
listening.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from stallwatch import USER_AGENT
from stallwatch.demo.configs import SIMULATOR_FLAGS
from stallwatch.demo.timeline import Timeline
from stallwatch.localstack.errors import LocalStackError
from stallwatch.localstack.processes import ManagedProcess, free_port, wait_until_ready

STOP_TIMEOUT_SECONDS = 5.0
# A restart gives the old simulator this long after SIGTERM, then sends SIGKILL (and says so).
RESTART_STOP_SECONDS = 3.0


@dataclass
class ServerProcess:
    """A simulator process the supervisor owns, and the port it listens on."""

    name: str
    port: int
    process: ManagedProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Supervisor:
    """Owns the simulator processes; `POST /restart/{target}` stops one and starts it again.

    It plays what systemd or a container runtime does for a real server: the restarter's
    `command` action (`stallwatch demo restart-helper ...`) asks it to restart the
    target named in STALLWATCH_TARGET, and it answers once the new process is listening.
    """

    def __init__(self, workdir: Path, timeline: Timeline, token: str) -> None:
        self.workdir = workdir
        self.timeline = timeline
        self.token = token
        self.servers: dict[str, ServerProcess] = {}
        self.all_processes: list[ManagedProcess] = []
        self.restarts: list[tuple[str, float]] = []  # (target, monotonic time it was back)
        self.port = free_port()
        self._runner: web.AppRunner | None = None
        self._lock = asyncio.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn_server(self, name: str, port: int) -> ServerProcess:
        """Start `stallwatch sim` for `name` on `port` (returns at once; see `wait_ready`)."""
        process = ManagedProcess(
            f"sim-{name}",
            [sys.executable, "-m", "stallwatch", "sim", "--port", str(port), *SIMULATOR_FLAGS],
            self.workdir / f"sim-{name}.log",
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.all_processes.append(process)
        server = ServerProcess(name, port, process.start())
        self.servers[name] = server
        return server

    def wait_ready(self, server: ServerProcess) -> None:
        wait_until_ready(server.process, f"{server.url}/health")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/restart/{target}", self._handle_restart)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def stop_all(self) -> None:
        for process in self.all_processes:
            if process.running:
                process.signal_group(signal.SIGTERM)
        for process in self.all_processes:
            process.stop(STOP_TIMEOUT_SECONDS)

    async def restart(self, name: str) -> str:
        async with self._lock:
            old = self.servers[name]
            old_pid = old.process.pid
            started = time.monotonic()
            killed = await asyncio.to_thread(old.process.stop, RESTART_STOP_SECONDS)
            new = self.spawn_server(name, old.port)
            await asyncio.to_thread(self.wait_ready, new)
            self.restarts.append((name, time.monotonic()))
            stopped = (
                f"pid {old_pid} ignored SIGTERM: SIGKILL after {RESTART_STOP_SECONDS:g} s"
                if killed
                else f"stopped pid {old_pid}"
            )
            detail = (
                f"{stopped}, started pid {new.process.pid} on port {new.port}; "
                f"listening after {time.monotonic() - started:.1f} s"
            )
            self.timeline.emit(name, f"supervisor: {detail}", "good")
            return detail

    async def _handle_restart(self, request: web.Request) -> web.Response:
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, f"Bearer {self.token}".encode()):
            return web.Response(status=401, text="missing or wrong bearer token\n")
        name = request.match_info["target"]
        if name not in self.servers:
            return web.Response(status=404, text=f"no server named {name!r}\n")
        try:
            detail = await self.restart(name)
        except LocalStackError as error:
            return web.Response(status=500, text=f"restart failed: {error}\n")
        return web.Response(text=detail + "\n")


def restart_helper_argv(supervisor_url: str, token_file: Path) -> list[str]:
    """The restarter's `command` action that runs `stallwatch demo restart-helper`."""
    return [
        sys.executable, "-m", "stallwatch", "demo", "restart-helper",
        supervisor_url, str(token_file),
    ]  # fmt: skip


def ask_supervisor_to_restart(supervisor_url: str, token_file: Path) -> int:
    """The restarter's command action: ask the supervisor to restart $STALLWATCH_TARGET.

    Prints the supervisor's answer; the exit code is 0 once the new process is listening, 1
    when the supervisor refused or could not be reached, 2 when STALLWATCH_TARGET is unset.
    """
    target = os.environ.get("STALLWATCH_TARGET", "")
    if not target:
        print("STALLWATCH_TARGET is not set", file=sys.stderr)
        return 2
    token = token_file.read_text().strip()
    request = urllib.request.Request(
        f"{supervisor_url}/restart/{urllib.parse.quote(target, safe='')}",
        method="POST",
        headers={"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT},
    )
    try:
        with urllib.request.urlopen(request, timeout=50) as response:
            print(response.read().decode(errors="replace").strip())
            return 0
    except urllib.error.HTTPError as error:
        print(f"supervisor answered {error.code}: {error.read().decode(errors='replace')}")
    except (urllib.error.URLError, OSError) as error:
        print(f"supervisor unreachable: {error}")
    return 1

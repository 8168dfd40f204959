"""A protocol-level Docker Engine API for tests, on a Unix socket, whose containers are real
processes on this machine.

`POST /containers/{name}/restart?t=N` does what the engine does: SIGTERM to the container's
first process, SIGKILL to all of it after N seconds if it is still there, then the same
command again; each step is logged as the engine logs it (`kill` with its `signal`, `die`
with its `exitCode`, `start`, `restart`). `GET /events?since=&until=&filters=` answers those
events as JSON lines, filtered by container and type, and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.component.wedged import kill_group, wait_listening


@dataclass
class Container:
    """A container: a command run as the leader of its own process group, and its log."""

    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_listening(self.log, self.process)

    @property
    def id(self) -> str:
        return self.name.encode().hex().ljust(64, "0")[:64]


@dataclass
class FakeDockerEngine:
    containers: dict[str, Container] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def _event(self, container: Container, action: str, **attributes: str) -> None:
        now = time.time()
        self.events.append(
            {
                "status": action,
                "id": container.id,
                "from": "vllm",
                "Type": "container",
                "Action": action,
                "Actor": {
                    "ID": container.id,
                    "Attributes": {"image": "vllm", "name": container.name, **attributes},
                },
                "scope": "local",
                "time": int(now),
                "timeNano": int(now * 1e9),
            }
        )

    async def restart(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.rel_url}")
        container = self.containers.get(request.match_info["name"])
        if container is None:
            name = request.match_info["name"]
            return web.json_response({"message": f"No such container: {name}"}, status=404)
        grace = int(request.query.get("t", "10"))
        process = container.process
        assert process is not None
        if process.poll() is None:
            self._event(container, "kill", signal=str(int(signal.SIGTERM)))
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, grace)
            except subprocess.TimeoutExpired:
                self._event(container, "kill", signal=str(int(signal.SIGKILL)))
                kill_group(process.pid)
                await asyncio.to_thread(process.wait)
        kill_group(process.pid)  # the rest of the container goes with it
        code = process.returncode
        self._event(container, "die", exitCode=str(128 - code if code < 0 else code))
        await asyncio.to_thread(container.start)
        self._event(container, "start")
        self._event(container, "restart")
        return web.Response(status=204)

    async def list_events(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path}")
        since = float(request.query.get("since", "0"))
        until = float(request.query.get("until", str(time.time())))
        filters = json.loads(request.query.get("filters", "{}"))
        names = set(filters.get("container", []))
        types = set(filters.get("type", []))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for event in self.events:
            at = event["timeNano"] / 1e9
            if not since <= at <= until:
                continue
            if names and not names & {event["Actor"]["Attributes"]["name"], event["id"]}:
                continue
            if types and event["Type"] not in types:
                continue
            await response.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")
        await response.write_eof()
        return response


@contextlib.asynccontextmanager
async def fake_docker_engine(
    socket_path: Path, containers: dict[str, tuple[list[str], Path]]
) -> AsyncIterator[FakeDockerEngine]:
    """The engine on `socket_path`, each container (name: argv, log) running; all stopped after."""
    engine = FakeDockerEngine()
    app = web.Application()
    app.router.add_post("/containers/{name}/restart", engine.restart)
    app.router.add_get("/events", engine.list_events)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        for name, (argv, log) in containers.items():
            container = Container(name, argv, log)
            engine.containers[name] = container
            await asyncio.to_thread(container.start)
        await web.UnixSite(runner, str(socket_path)).start()
        yield engine
    finally:
        await runner.cleanup()
        for container in engine.containers.values():
            if container.process is not None:
                kill_group(container.process.pid)
                container.process.wait()

"""Starts every process of the demo on loopback, waits until the pipeline is live, stops them all.

The simulators (through the supervisor), the proxy, the exporter, the restarter, HAProxy in front
of the simulators (its agent-check asking the restarter), Prometheus and Alertmanager; their
configs and logs go to a temporary directory removed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from stallwatch.demo.configs import DEMO_TIMINGS, SERVERS, exporter_config, restarter_config
from stallwatch.demo.errors import DemoError
from stallwatch.demo.observer import Observer
from stallwatch.demo.supervisor import STOP_TIMEOUT_SECONDS, Supervisor, restart_helper_argv
from stallwatch.demo.timeline import Timeline
from stallwatch.localstack.errors import LocalStackError
from stallwatch.localstack.haproxy import HAProxy
from stallwatch.localstack.processes import ManagedProcess, free_port, wait_until_ready
from stallwatch.localstack.rewrite import ProjectFiles, ScrapeTargets, Webhook
from stallwatch.localstack.stack import LocalStack


class Pipeline:
    """Every process the demo starts, in a temporary working directory of its own."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.workdir = Path(tempfile.mkdtemp(prefix="stallwatch-demo-"))
        self.processes: list[ManagedProcess] = []
        self.supervisor = Supervisor(self.workdir, timeline, secrets.token_hex(16))
        self.stack: LocalStack | None = None
        self.haproxy: HAProxy | None = None  # in front of the simulators, for users

    def server_url(self, name: str) -> str:
        return self.supervisor.servers[name].url

    async def start(self, session: aiohttp.ClientSession, project_root: Path | None) -> Observer:
        """Start everything, wait until Prometheus scrapes and the exporter has read each server.

        Returns the observer, sampled once; the caller runs it.
        """
        timeline = self.timeline
        project = ProjectFiles.locate(project_root)
        timeline.emit(
            "story",
            "starting two simulated vLLM servers, a proxy, the exporter, "
            "the restarter, HAProxy, Prometheus and Alertmanager",
            "story",
        )
        servers = [self.supervisor.spawn_server(name, free_port()) for name in SERVERS]
        server_urls = {server.name: server.url for server in servers}
        proxy_port, exporter_port, restarter_port = free_port(), free_port(), free_port()
        agent_port = free_port()
        proxy_url = f"http://127.0.0.1:{proxy_port}"
        proxy = self._spawn(
            "proxy",
            [
                "sim", "proxy", "--port", str(proxy_port),
                *(arg for server in servers for arg in ("--backend", server.url)),
            ],
        )  # fmt: skip
        await self.supervisor.start()
        supervisor_token = self.workdir / "supervisor-token"
        write_secret(supervisor_token, self.supervisor.token)
        restarter_token_value = secrets.token_hex(16)
        restarter_token = self.workdir / "restarter-token"
        write_secret(restarter_token, restarter_token_value)
        exporter_file = self.workdir / "exporter.yml"
        exporter_file.write_text(
            yaml.safe_dump(
                exporter_config(f"127.0.0.1:{exporter_port}", server_urls, proxy_url),
                sort_keys=False,
            )
        )
        restarter_file = self.workdir / "restarter.yml"
        restarter_file.write_text(
            yaml.safe_dump(
                restarter_config(
                    f"127.0.0.1:{restarter_port}",
                    restarter_token,
                    self.workdir / "restarter-journal.sqlite",
                    server_urls,
                    restart_helper_argv(self.supervisor.url, supervisor_token),
                    f"127.0.0.1:{agent_port}",
                ),
                sort_keys=False,
            )
        )
        exporter = self._spawn("exporter", ["exporter", "--config", str(exporter_file)])
        restarter = self._spawn("restarter", ["restarter", "--config", str(restarter_file)])
        exporter_url = f"http://127.0.0.1:{exporter_port}"
        restarter_url = f"http://127.0.0.1:{restarter_port}"
        self.stack = LocalStack(
            self.workdir,
            scrape=ScrapeTargets(
                exporter=f"127.0.0.1:{exporter_port}", restarter=f"127.0.0.1:{restarter_port}"
            ),
            webhook=Webhook(url=f"{restarter_url}/alerts", token=restarter_token_value),
            timings=DEMO_TIMINGS,
            project=project,
        )
        stack = self.stack
        haproxy = HAProxy(
            self.workdir,
            [(name, url.removeprefix("http://")) for name, url in server_urls.items()],
            agent_port,
        )
        self.haproxy = haproxy
        self.processes.append(haproxy.process)

        def start_and_wait() -> None:
            for server in servers:
                self.supervisor.wait_ready(server)
            wait_until_ready(proxy, f"{proxy_url}/v1/models")
            wait_until_ready(exporter, f"{exporter_url}/-/healthy")
            wait_until_ready(restarter, f"{restarter_url}/-/healthy")
            haproxy.start()
            stack.start()

        await asyncio.to_thread(start_and_wait)
        for line in (
            "",
            f"  Prometheus    {stack.prometheus_url}/alerts",
            f"  Alertmanager  {stack.alertmanager_url}",
            f"  exporter      {exporter_url}/   ({exporter_url}/metrics)",
            f"  restarter     {restarter_url}/metrics   (journal: GET /journal with the token)",
            f"  gpu-a {server_urls['gpu-a']}   gpu-b {server_urls['gpu-b']}   "
            f"gateway (proxy) {proxy_url}",
            f"  HAProxy       {haproxy.url}   (users; its agent-check asks the restarter on "
            f"127.0.0.1:{agent_port})",
            "",
        ):
            timeline.say(line)
        observer = Observer(
            session, timeline, stack, exporter_url, restarter_url, restarter_token_value
        )

        def scraped() -> bool:
            results = stack.query('up{job=~"stallwatch-exporter|stallwatch-restarter"} == 1')
            return len(results) == 2

        await until(lambda: asyncio.to_thread(scraped), 30, "Prometheus' first scrapes")
        # Before its first scrape Prometheus sees no exporter: StallwatchExporterDown is
        # pending for a moment. Start the story once that has cleared.
        await until(lambda: asyncio.to_thread(lambda: not stack.alerts()), 20, "no pending alerts")
        await observer.sample()
        await observer.wait_for(
            lambda: all(observer.state_of(name) is not None for name in SERVERS),
            15,
            "the exporter's first polls",
        )

        def haproxy_up() -> bool:
            return all(row["status"] == "UP" for row in haproxy.servers().values())

        await until(lambda: asyncio.to_thread(haproxy_up), 15, "HAProxy's servers UP")
        timeline.emit(
            "story",
            "everything is up; Prometheus scrapes the exporter and the restarter every second",
            "story",
        )
        return observer

    async def shutdown(self) -> None:
        """Stop every process (simulators first), the supervisor, and remove the directory."""
        self.supervisor.stop_all()
        for process in self.processes:
            if process.running:
                process.signal_group(signal.SIGTERM)
        for process in self.processes:
            process.stop(STOP_TIMEOUT_SECONDS)
        if self.stack is not None:
            self.stack.stop()
        await self.supervisor.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def print_logs(self) -> None:
        for process in self.all_processes():
            if not process.started:
                continue
            self.timeline.say(f"--- {process.name} (pid {process.pid}) log:")
            self.timeline.say(process.log_tail(15))

    def process_list(self) -> list[dict[str, Any]]:
        return [
            {"name": process.name, "pid": process.pid, "argv": process.argv}
            for process in self.all_processes()
            if process.started
        ]

    def all_processes(self) -> list[ManagedProcess]:
        stack = self.stack.processes if self.stack is not None else []
        return [*self.supervisor.all_processes, *self.processes, *stack]

    def _spawn(self, name: str, args: list[str]) -> ManagedProcess:
        process = ManagedProcess(
            name,
            [sys.executable, "-m", "stallwatch", *args],
            self.workdir / f"{name}.log",
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.processes.append(process)
        return process.start()


async def until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Wait until `check` is true (a stack error or refused connection counts as false)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(LocalStackError, OSError, ValueError):
            if await check():
                return
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.2)


def write_secret(path: Path, value: str) -> None:
    path.touch(mode=0o600)
    path.write_text(value + "\n")

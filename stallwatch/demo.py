"""`stallwatch demo`: the whole pipeline on one machine, playing the incident stallwatch is for.

What runs (every process on loopback, in its own process group, stopped at the end):

- two simulated vLLM servers, `gpu-a` and `gpu-b` (`stallwatch sim`), and the simulator's
  least-connection proxy `gateway` in front of them;
- the exporter (`stallwatch exporter`, 1 s interval) watching both servers and the proxy;
- real Prometheus and Alertmanager (`stallwatch.localstack`) with the project's own rules and
  routing, rewritten only for timing and addresses;
- the restarter (`stallwatch restarter`) with a `command` action that asks the demo's small
  supervisor to stop the server's process and start a new one on the same port.

The story:

1. a batch job fills every slot of gpu-a with long generations. An old-style watchdog's test
   request queues behind them and times out; stallwatch reads `busy` and sends nothing;
2. a long prompt runs on gpu-b: a chunked prefill, engine step count flat, KV cache rising.
   stallwatch reads `busy`, never stuck;
3. gpu-b really hangs while serving traffic: the exporter reads `stalled`, LLMServerStuck fires
   after two stalled polls, Alertmanager routes it to the restarter, the restarter confirms
   with two fresh reads and runs its action, a new process comes up, the alert resolves.

A timeline is printed while it runs, a summary table at the end, and optionally a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO, TypeVar

import aiohttp
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from stallwatch import USER_AGENT, __version__
from stallwatch.localstack.errors import LocalStackError
from stallwatch.localstack.processes import ManagedProcess, free_port, wait_until_ready
from stallwatch.localstack.rewrite import ProjectFiles, ScrapeTargets, Timings, Webhook
from stallwatch.localstack.stack import LocalStack

T = TypeVar("T")

BATCH_TARGET = "gpu-a"
HUNG_TARGET = "gpu-b"
SERVERS = (BATCH_TARGET, HUNG_TARGET)
PROXY_TARGET = "gateway"
MODEL = "tiny"
WORK_STATES = frozenset({"busy", "stalled", "unknown"})
RESTART_ALERTS = ("LLMServerStuck", "LLMServerUnresponsive")
PREFILL_TOKENS_PER_SECOND = 1500
SIMULATOR_FLAGS = (
    "--model", MODEL,
    "--max-num-seqs", "4",
    "--tokens-per-second", "40",
    "--max-num-batched-tokens", "64",
    "--prefill-tokens-per-second", str(PREFILL_TOKENS_PER_SECOND),
    "--max-model-len", "32768",
    "--kv-cache-tokens", "32768",
)  # fmt: skip
# Timing rewrite for the demo: a restarted simulator is back in about a second, far below
# these, so only a real outage would page; the restart alerts have no `for:` to rewrite.
DEMO_TIMINGS = Timings(
    interval="1s",
    alert_for=MappingProxyType({"LLMServerDown": "30s", "StallwatchExporterDown": "10s"}),
)
OLD_WATCHDOG_TIMEOUT_SECONDS = 3.0
OLD_WATCHDOG_USER_AGENT = "old-watchdog/1.0"
SAMPLE_SECONDS = 0.25
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=3.0)
STOP_TIMEOUT_SECONDS = 5.0


class DemoError(RuntimeError):
    """The demo could not run (a component did not start) or its story did not happen."""


class DemoInterrupted(Exception):
    """SIGTERM stopped the demo (everything it started is stopped too)."""


@dataclass(frozen=True)
class Script:
    """How long each act lasts and how big its work is."""

    name: str
    batch_max_tokens: int
    batch_alone_seconds: float  # the batch job alone before the old watchdog's request
    long_prompt_tokens: int
    traffic_concurrency: int
    traffic_max_tokens: int
    traffic_before_hang_seconds: float
    after_recovery_seconds: float
    wind_down_seconds: float
    heartbeat_seconds: float  # a status line this often (0: never)
    recovery_timeout_seconds: float = 60.0


FULL_SCRIPT = Script(
    name="full",
    batch_max_tokens=8000,
    batch_alone_seconds=20.0,
    long_prompt_tokens=30000,
    traffic_concurrency=2,
    traffic_max_tokens=400,
    traffic_before_hang_seconds=15.0,
    after_recovery_seconds=25.0,
    wind_down_seconds=10.0,
    heartbeat_seconds=10.0,
)
SHORT_SCRIPT = Script(
    name="short",
    batch_max_tokens=8000,
    batch_alone_seconds=3.0,
    long_prompt_tokens=9000,
    traffic_concurrency=2,
    traffic_max_tokens=400,
    traffic_before_hang_seconds=3.0,
    after_recovery_seconds=4.0,
    wind_down_seconds=3.0,
    heartbeat_seconds=0.0,
)


# --- generated configs (pure) --------------------------------------------------------------------


def exporter_config(
    listen: str, servers: Mapping[str, str], proxy_url: str, interval: str = "1s"
) -> dict[str, Any]:
    """The exporter's config: each server read directly, the proxy as `kind: proxy`."""
    return {
        "listen": listen,
        "interval": interval,
        "timeout": "800ms",
        "probe": {"enabled": True, "endpoint": "completions", "timeout": "2s"},
        "targets": [
            *({"name": name, "url": url} for name, url in servers.items()),
            {"name": PROXY_TARGET, "url": proxy_url, "kind": "proxy"},
        ],
    }


def restarter_config(
    listen: str,
    token_file: Path,
    journal: Path,
    servers: Mapping[str, str],
    action_argv: Sequence[str],
) -> dict[str, Any]:
    """The restarter's config: every server with the same command action (the demo's supervisor).

    Cooldown, budget and fleet limits keep their defaults; only the confirmation gap is short.
    """
    return {
        "listen": listen,
        "token_file": str(token_file),
        "journal": str(journal),
        "restart_alerts": list(RESTART_ALERTS),
        "confirm": {"gap": "1s", "timeout": "1s"},
        "targets": [
            {
                "name": name,
                "metrics_url": f"{url}/metrics",
                "action": {"kind": "command", "argv": list(action_argv)},
                "action_timeout": "60s",
            }
            for name, url in servers.items()
        ],
    }


# --- reading the exporter (pure) -----------------------------------------------------------------


@dataclass(frozen=True)
class TargetView:
    """What the exporter's /metrics says about one target."""

    state: str | None = None
    state_polls: int = 0
    polls: int = 0
    probes: int = 0
    up: bool = False
    running: float | None = None
    waiting: float | None = None
    steps_per_second: float | None = None
    tokens_per_second: float | None = None
    restarts_detected: int = 0


def parse_exporter_metrics(text: str) -> dict[str, TargetView]:
    """Per-target views from an exporter /metrics body."""
    fields: dict[str, dict[str, Any]] = {}
    scalar: dict[str, tuple[str, Callable[[float], Any]]] = {
        "stallwatch_target_state_polls": ("state_polls", int),
        "stallwatch_polls_total": ("polls", int),
        "stallwatch_probe_requests_total": ("probes", int),
        "stallwatch_target_up": ("up", lambda v: v == 1),
        "stallwatch_requests_running": ("running", float),
        "stallwatch_requests_waiting": ("waiting", float),
        "stallwatch_engine_steps_per_second": ("steps_per_second", float),
        "stallwatch_generation_tokens_per_second": ("tokens_per_second", float),
        "stallwatch_restarts_detected_total": ("restarts_detected", int),
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            target = sample.labels.get("target")
            if target is None:
                continue
            view = fields.setdefault(target, {})
            if sample.name == "stallwatch_target_state":
                if sample.value == 1:
                    view["state"] = sample.labels.get("state")
            elif sample.name in scalar:
                name, convert = scalar[sample.name]
                view[name] = convert(sample.value)
    return {target: TargetView(**values) for target, values in fields.items()}


def probes_while_busy(previous: TargetView, current: TargetView) -> tuple[int, int]:
    """(test requests sent, of which while the target had work) between two exporter reads.

    The exporter sends a test request only in a poll whose result is idle or unresponsive, so a
    request counted in a poll that read busy, stalled or unknown was sent to a server with
    work. When more than one poll happened between the two reads, a request counts as sent
    while busy only if both reads show work (then every poll in between did too: a server
    leaving work is first read idle from its completions, which sends nothing).
    """
    sent = max(0, current.probes - previous.probes)
    if sent == 0:
        return 0, 0
    polls = current.polls - previous.polls
    current_work = current.state in WORK_STATES
    if polls <= 1:
        return sent, sent if current_work else 0
    return sent, sent if current_work and previous.state in WORK_STATES else 0


# --- the summary (pure) --------------------------------------------------------------------------


@dataclass
class TargetTally:
    """What the demo saw of one target (updated as the timeline runs)."""

    name: str
    kind: str
    state: str | None = None
    state_since: float = 0.0
    busy_seconds: float = 0.0
    test_requests: int = 0
    test_requests_while_busy: int = 0
    requests_in_run: int = 0
    stalls_detected: int = 0
    stuck_alerts: int = 0
    new_processes_seen: int = 0
    restarts: int = 0
    false_restarts: int = 0
    skips: dict[str, int] = field(default_factory=dict)
    # Ground truth from the simulator: test requests (User-Agent stallwatch/...) it received
    # while the demo itself kept it busy.
    sim_test_requests_while_busy: int = 0
    hung_at: float | None = None
    alert_fired_at: float | None = None
    restart_decided_at: float | None = None
    restarted_at: float | None = None
    resolved_at: float | None = None

    def since_hang(self, moment: float | None) -> float | None:
        if self.hung_at is None or moment is None:
            return None
        return round(moment - self.hung_at, 2)

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "busy_seconds": round(self.busy_seconds, 1),
            "test_requests": self.test_requests,
            "test_requests_while_busy": self.test_requests_while_busy,
            "sim_test_requests_while_busy": self.sim_test_requests_while_busy,
            "stalls_detected": self.stalls_detected,
            "stuck_alerts": self.stuck_alerts,
            "new_processes_seen": self.new_processes_seen,
            "restarts": self.restarts,
            "false_restarts": self.false_restarts,
            "skips": dict(self.skips),
            "stall_to_alert_seconds": self.since_hang(self.alert_fired_at),
            "stall_to_restart_seconds": self.since_hang(self.restarted_at),
            "stall_to_resolved_seconds": self.since_hang(self.resolved_at),
        }


def story_problems(tallies: Mapping[str, TargetTally], hung: str) -> list[str]:
    """What went wrong with the story; empty when it happened as it should."""
    problems = []
    for tally in tallies.values():
        if tally.test_requests_while_busy or tally.sim_test_requests_while_busy:
            problems.append(
                f"{tally.name}: test requests sent while busy "
                f"(exporter {tally.test_requests_while_busy}, "
                f"simulator {tally.sim_test_requests_while_busy})"
            )
        if tally.false_restarts:
            problems.append(f"{tally.name}: {tally.false_restarts} false restarts")
    stuck = tallies[hung]
    if stuck.stalls_detected < 1:
        problems.append(f"{hung}: the stall was not detected")
    if stuck.restarts != 1:
        problems.append(f"{hung}: expected exactly one restart, got {stuck.restarts}")
    if stuck.resolved_at is None:
        problems.append(f"{hung}: LLMServerStuck did not resolve")
    return problems


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def format_summary_table(tallies: Sequence[TargetTally]) -> str:
    header = (
        "server",
        "kind",
        "time busy",
        "test requests",
        "while busy",
        "stalls",
        "restarts",
        "false restarts",
        "stall → alert",
        "stall → restart",
    )
    rows = [header]
    for tally in tallies:
        rows.append(
            (
                tally.name,
                tally.kind,
                _seconds(tally.busy_seconds) if tally.kind != "proxy" else "-",
                str(tally.test_requests),
                str(tally.test_requests_while_busy),
                str(tally.stalls_detected),
                str(tally.restarts),
                str(tally.false_restarts),
                _seconds(tally.since_hang(tally.alert_fired_at)),
                _seconds(tally.since_hang(tally.restarted_at)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for index, row in enumerate(rows):
        cells = [
            cell.ljust(width) if column < 2 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells))
        if index == 0:
            lines.append("  " + "  ".join("-" * width for width in widths))
    return "\n".join(lines)


# --- the timeline ------------------------------------------------------------------------------


class Timeline:
    """One line per event, with the time since the demo started."""

    COLORS: Mapping[str, str] = MappingProxyType(
        {"story": "1", "problem": "1;31", "good": "32", "alert": "33", "restarter": "36"}
    )

    def __init__(self, out: TextIO, started: float, color: bool) -> None:
        self.out = out
        self.started = started
        self.color = color
        self.events: list[dict[str, Any]] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def emit(self, source: str, message: str, tone: str = "") -> None:
        elapsed = self.elapsed()
        self.events.append({"t": round(elapsed, 2), "source": source, "message": message})
        line = f"{elapsed:7.1f}s  {source:<12} {message}"
        code = self.COLORS.get(tone)
        if self.color and code:
            line = f"\033[{code}m{line}\033[0m"
        print(line, file=self.out, flush=True)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)


# --- the supervisor: restarts a simulator process on the restarter's behalf ---------------------


@dataclass
class ServerProcess:
    name: str
    port: int
    process: ManagedProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Supervisor:
    """Owns the simulator processes; `POST /restart/{target}` stops one and starts it again.

    It plays what systemd or a container runtime does for a real server: the restarter's
    `command` action (`python -m stallwatch.demo restart-helper ...`) asks it to restart the
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
            await asyncio.to_thread(old.process.stop, 3.0)
            new = self.spawn_server(name, old.port)
            await asyncio.to_thread(self.wait_ready, new)
            self.restarts.append((name, time.monotonic()))
            detail = (
                f"stopped pid {old_pid}, started pid {new.process.pid} on port {new.port}; "
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


def restart_helper(argv: Sequence[str]) -> int:
    """The restarter's command action: ask the supervisor to restart $STALLWATCH_TARGET."""
    parser = argparse.ArgumentParser(prog="python -m stallwatch.demo restart-helper")
    parser.add_argument("supervisor_url")
    parser.add_argument("token_file", type=Path)
    args = parser.parse_args(argv)
    target = os.environ.get("STALLWATCH_TARGET", "")
    if not target:
        print("STALLWATCH_TARGET is not set", file=sys.stderr)
        return 2
    token = args.token_file.read_text().strip()
    request = urllib.request.Request(
        f"{args.supervisor_url}/restart/{urllib.parse.quote(target, safe='')}",
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


# --- watching the pipeline ---------------------------------------------------------------------


class Observer:
    """Samples the exporter, Prometheus, Alertmanager and the restarter's journal; tells the story.

    Every SAMPLE_SECONDS: state changes per target and test requests (exporter /metrics),
    alerts pending, firing and resolved (Prometheus /api/v1/alerts), their routing
    (Alertmanager /api/v2/alerts), and the restarter's decisions (GET /journal).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        timeline: Timeline,
        stack: LocalStack,
        exporter_url: str,
        restarter_url: str,
        restarter_token: str,
    ) -> None:
        self.session = session
        self.timeline = timeline
        self.stack = stack
        self.exporter_url = exporter_url
        self.restarter_url = restarter_url
        self.restarter_token = restarter_token
        self.tallies: dict[str, TargetTally] = {name: TargetTally(name, "vllm") for name in SERVERS}
        self.tallies[PROXY_TARGET] = TargetTally(PROXY_TARGET, "proxy")
        self.views: dict[str, TargetView] = {}
        self.firing: dict[tuple[str, str], str] = {}  # (alertname, target) -> state
        self.routed: set[tuple[str, str, str]] = set()
        self.journal_seen = 0
        self.journal_entries: list[dict[str, Any]] = []
        self.last_sample = time.monotonic()

    async def run(self, heartbeat_seconds: float = 0.0) -> None:
        next_heartbeat = time.monotonic() + heartbeat_seconds
        while True:
            await self.sample()
            if heartbeat_seconds and time.monotonic() >= next_heartbeat:
                self.heartbeat()
                next_heartbeat += heartbeat_seconds
            await asyncio.sleep(SAMPLE_SECONDS)

    def heartbeat(self) -> None:
        """One status line: each server's state and the test requests sent to it."""
        parts = []
        for name in SERVERS:
            tally = self.tallies[name]
            view = self.views.get(name)
            polls = f" for {view.state_polls} polls" if view is not None else ""
            parts.append(
                f"{name} {tally.state}{polls}, {tally.test_requests} test requests "
                f"({tally.test_requests_while_busy} while busy)"
            )
        self.timeline.emit("status", "; ".join(parts))

    async def sample(self) -> None:
        views, alerts, am_alerts, journal = await asyncio.gather(
            self._exporter(), self._prometheus(), self._alertmanager(), self._journal()
        )
        now = time.monotonic()
        if views is not None:
            self._on_views(views, now)
        if alerts is not None:
            self._on_alerts(alerts, now)
        if am_alerts is not None:
            self._on_am_alerts(am_alerts)
        if journal is not None:
            self._on_journal(journal, now)
        self.last_sample = now

    # Sources (None when one does not answer, e.g. while it starts).

    async def _exporter(self) -> dict[str, TargetView] | None:
        try:
            async with self.session.get(f"{self.exporter_url}/metrics") as response:
                if response.status != 200:
                    return None
                return parse_exporter_metrics(await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def _prometheus(self) -> list[dict[str, Any]] | None:
        return await self._get_json(f"{self.stack.prometheus_url}/api/v1/alerts", "data", "alerts")

    async def _alertmanager(self) -> list[dict[str, Any]] | None:
        return await self._get_json(f"{self.stack.alertmanager_url}/api/v2/alerts")

    async def _journal(self) -> list[dict[str, Any]] | None:
        return await self._get_json(
            f"{self.restarter_url}/journal?limit=200",
            "entries",
            headers={"Authorization": f"Bearer {self.restarter_token}"},
        )

    async def _get_json(
        self, url: str, *path: str, headers: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]] | None:
        try:
            async with self.session.get(url, headers=headers) as response:
                if response.status != 200:
                    return None
                body: Any = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        for key in path:
            if not isinstance(body, dict):
                return None
            body = body.get(key)
        return body if isinstance(body, list) else None

    # Events.

    def _on_views(self, views: dict[str, TargetView], now: float) -> None:
        for name, view in views.items():
            tally = self.tallies.get(name)
            if tally is None or view.state is None:
                continue
            previous = self.views.get(name)
            if tally.state == "busy":
                tally.busy_seconds += now - self.last_sample
            if previous is not None:
                sent, while_busy = probes_while_busy(previous, view)
                tally.test_requests += sent
                tally.test_requests_while_busy += while_busy
                if while_busy:
                    self.timeline.emit(
                        name,
                        f"TEST REQUEST SENT WHILE {view.state.upper()}: {while_busy}",
                        "problem",
                    )
                elif sent and tally.requests_in_run == 0 and view.state is not None:
                    self.timeline.emit(
                        name,
                        f"test request sent (max_tokens 1): read {view.state}, no work "
                        "in flight, nothing completed",
                    )
                tally.requests_in_run += sent
                new_processes = view.restarts_detected - previous.restarts_detected
                if new_processes > 0:
                    tally.new_processes_seen += new_processes
                    self.timeline.emit(name, "exporter: a new process (counters started over)")
            if view.state != tally.state:
                self._on_state_change(tally, previous, view, now)
            self.views[name] = view

    def _on_state_change(
        self, tally: TargetTally, previous: TargetView | None, view: TargetView, now: float
    ) -> None:
        assert view.state is not None
        before = tally.state or "-"
        run = ""
        if tally.state is not None:
            run = f" after {now - tally.state_since:.0f} s"
            if tally.requests_in_run:
                run += f", {tally.requests_in_run} test requests"
            elif tally.state in WORK_STATES:
                run += ", 0 test requests"
        detail = describe_view(view)
        if tally.kind == "proxy" and view.state == "no_metrics":
            detail = " (a proxy: checked through /v1/models only, never restarted)"
        tone = "problem" if view.state in ("stalled", "unresponsive", "down") else ""
        self.timeline.emit(tally.name, f"{before} → {view.state}{run}{detail}", tone)
        if view.state == "stalled":
            tally.stalls_detected += 1
        tally.state = view.state
        tally.state_since = now
        tally.requests_in_run = 0

    def _on_alerts(self, alerts: list[dict[str, Any]], now: float) -> None:
        current: dict[tuple[str, str], str] = {}
        values: dict[tuple[str, str], str] = {}
        for alert in alerts:
            labels = alert.get("labels", {})
            key = (str(labels.get("alertname", "")), str(labels.get("target", "")))
            current[key] = str(alert.get("state", ""))
            values[key] = str(alert.get("value", ""))
        for key, state in current.items():
            if self.firing.get(key) == state:
                continue
            alertname, target = key
            value = values[key]
            suffix = f" (value {float(value):g})" if _is_number(value) else ""
            if state == "pending" and alertname in DEMO_TIMINGS.alert_for:
                suffix += f", fires after {DEMO_TIMINGS.alert_for[alertname]}"
            self.timeline.emit("prometheus", f"{alertname} {state} for {target}{suffix}", "alert")
            tally = self.tallies.get(target)
            if state == "firing" and tally is not None and alertname in RESTART_ALERTS:
                tally.stuck_alerts += 1
                if tally.alert_fired_at is None:
                    tally.alert_fired_at = now
        for key in set(self.firing) - set(current):
            alertname, target = key
            self.timeline.emit("prometheus", f"{alertname} resolved for {target}", "good")
            tally = self.tallies.get(target)
            if tally is not None and alertname in RESTART_ALERTS and tally.resolved_at is None:
                tally.resolved_at = now
        self.firing = current

    def _on_am_alerts(self, alerts: list[dict[str, Any]]) -> None:
        for alert in alerts:
            labels = alert.get("labels", {})
            key = (
                str(labels.get("alertname", "")),
                str(labels.get("target", "")),
                str(alert.get("startsAt", "")),
            )
            if key in self.routed or alert.get("status", {}).get("state") != "active":
                continue
            self.routed.add(key)
            receivers = ", ".join(str(r.get("name")) for r in alert.get("receivers", []))
            self.timeline.emit("alertmanager", f"{key[0]} for {key[1]} → {receivers}", "alert")

    def _on_journal(self, entries: list[dict[str, Any]], now: float) -> None:
        for entry in sorted(entries, key=lambda e: int(e.get("id", 0))):
            if int(entry.get("id", 0)) <= self.journal_seen:
                continue
            self.journal_seen = int(entry["id"])
            self.journal_entries.append(entry)
            target = str(entry.get("target", ""))
            tally = self.tallies.get(target)
            decision = entry.get("decision")
            alertname = entry.get("alertname", "")
            detail = str(entry.get("detail", "")).replace(sys.executable, "python")
            if decision == "restart":
                self.timeline.emit(
                    "restarter", f"{target}: RESTART ({alertname}) {detail}", "restarter"
                )
                if tally is not None:
                    tally.restarts += 1
                    if tally.hung_at is None or target != HUNG_TARGET:
                        tally.false_restarts += 1
                    if tally.restart_decided_at is None:
                        tally.restart_decided_at = now
            elif decision == "skip":
                reason = str(entry.get("reason", ""))
                self.timeline.emit(
                    "restarter",
                    f"{target}: skip ({alertname}), reason {reason}: {detail}",
                    "restarter",
                )
                if tally is not None:
                    tally.skips[reason] = tally.skips.get(reason, 0) + 1
            elif decision == "action_result":
                duration = entry.get("duration_seconds")
                took = f" in {duration:.1f} s" if isinstance(duration, int | float) else ""
                self.timeline.emit(
                    "restarter",
                    f"{target}: action {entry.get('result')}{took}: {detail}",
                    "restarter",
                )
            elif decision == "resolved":
                self.timeline.emit(
                    "restarter", f"{target}: {alertname} resolved (journaled)", "restarter"
                )

    # Waiting for the story to move on.

    async def wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout:g} s waiting for {what}")
            await asyncio.sleep(0.1)

    def state_of(self, name: str) -> str | None:
        return self.tallies[name].state


def describe_view(view: TargetView) -> str:
    parts = []
    if view.running is not None:
        parts.append(f"running {view.running:g}")
    if view.waiting is not None:
        parts.append(f"waiting {view.waiting:g}")
    if view.steps_per_second is not None and view.state in WORK_STATES:
        parts.append(f"{view.steps_per_second:.1f} steps/s")
    if view.tokens_per_second is not None and view.state in WORK_STATES:
        parts.append(f"{view.tokens_per_second:.0f} tokens/s")
    return f" ({', '.join(parts)})" if parts else ""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# --- clients that keep a server busy ------------------------------------------------------------


class KeepBusy:
    """`concurrency` long completions (`ignore_eos`) in flight against one server until `stop()`.

    Plays a batch job or user traffic, and counts what happened to its requests: a false
    restart would show here as failures.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        *,
        concurrency: int,
        prompt_tokens: int,
        max_tokens: int,
        user_agent: str,
    ) -> None:
        self.session = session
        self.url = url
        self.concurrency = concurrency
        self.payload = {
            "model": MODEL,
            "prompt": " ".join(["hello"] * prompt_tokens),
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        self.user_agent = user_agent
        self.sent = 0
        self.completed = 0
        self.failed: dict[str, int] = {}  # reached the server, then failed
        self.refused = 0  # no connection: the server was not listening
        self._workers: list[asyncio.Task[None]] = []

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.concurrency)]

    async def stop(self) -> None:
        """Stop sending; requests still in flight are abandoned (neither done nor failed)."""
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    def as_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "completed": self.completed,
            "failed": dict(self.failed),
            "refused": self.refused,
        }

    async def _work(self) -> None:
        while True:
            self.sent += 1
            try:
                async with self.session.post(
                    f"{self.url}/v1/completions",
                    json=self.payload,
                    headers={"User-Agent": self.user_agent},
                    timeout=aiohttp.ClientTimeout(total=600),
                ) as response:
                    await response.read()
                    if response.status == 200:
                        self.completed += 1
                        continue
                    reason = f"HTTP {response.status}"
            except aiohttp.ClientConnectorError:
                self.refused += 1
                await asyncio.sleep(0.5)
                continue
            except (aiohttp.ClientError, TimeoutError) as error:
                reason = type(error).__name__
            self.failed[reason] = self.failed.get(reason, 0) + 1
            await asyncio.sleep(0.2)


# --- the demo ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoOptions:
    script: Script = FULL_SCRIPT
    json_summary: Path | None = None
    project_root: Path | None = None
    color: bool = False


@dataclass
class DemoReport:
    ok: bool
    problems: list[str]
    summary: dict[str, Any]


class Demo:
    def __init__(self, options: DemoOptions, out: TextIO) -> None:
        self.options = options
        self.script = options.script
        self.out = out
        self.started = time.monotonic()
        self.timeline = Timeline(out, self.started, options.color)
        self.workdir = Path(tempfile.mkdtemp(prefix="stallwatch-demo-"))
        self.processes: list[ManagedProcess] = []
        self.supervisor = Supervisor(self.workdir, self.timeline, secrets.token_hex(16))
        self.stack: LocalStack | None = None
        self.observer: Observer | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.batch: KeepBusy | None = None
        self.traffic: KeepBusy | None = None
        self.old_watchdog = ""
        self.long_prompt = ""
        self.failure: str | None = None
        self.observer_task: asyncio.Task[None] | None = None
        self.batch_window_start = 0

    # Life.

    async def run(self) -> DemoReport:
        try:
            async with aiohttp.ClientSession(
                timeout=HTTP_TIMEOUT, headers={"User-Agent": f"stallwatch-demo/{__version__}"}
            ) as session:
                try:
                    await self._run(session)
                except (DemoError, LocalStackError) as error:
                    self.failure = str(error)
                    self.timeline.emit("problem", str(error), "problem")
                    self._print_logs()
                finally:
                    await self._stop_clients()
                    await self._cancel_tasks()
            return self._report()
        finally:
            await self._shutdown()

    async def _cancel_tasks(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()

    async def _shutdown(self) -> None:
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

    def _print_logs(self) -> None:
        for process in self.all_processes():
            if not process.started:
                continue
            self.timeline.say(f"--- {process.name} (pid {process.pid}) log:")
            self.timeline.say(process.log_tail(15))

    def _process_list(self) -> list[dict[str, Any]]:
        return [
            {"name": process.name, "pid": process.pid, "argv": process.argv}
            for process in self.all_processes()
            if process.started
        ]

    def all_processes(self) -> list[ManagedProcess]:
        stack = self.stack.processes if self.stack is not None else []
        return [*self.supervisor.all_processes, *self.processes, *stack]

    # The pipeline.

    async def _start_pipeline(self, session: aiohttp.ClientSession) -> Observer:
        timeline = self.timeline
        project = ProjectFiles.locate(self.options.project_root)
        timeline.emit(
            "story",
            "starting two simulated vLLM servers, a proxy, the exporter, "
            "the restarter, Prometheus and Alertmanager",
            "story",
        )
        servers = [self.supervisor.spawn_server(name, free_port()) for name in SERVERS]
        server_urls = {server.name: server.url for server in servers}
        proxy_port, exporter_port, restarter_port = free_port(), free_port(), free_port()
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
        _write_secret(supervisor_token, self.supervisor.token)
        restarter_token_value = secrets.token_hex(16)
        restarter_token = self.workdir / "restarter-token"
        _write_secret(restarter_token, restarter_token_value)
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
                    [
                        sys.executable, "-m", "stallwatch.demo", "restart-helper",
                        self.supervisor.url, str(supervisor_token),
                    ],
                ),
                sort_keys=False,
            )
        )  # fmt: skip
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

        def start_and_wait() -> None:
            for server in servers:
                self.supervisor.wait_ready(server)
            wait_until_ready(proxy, f"{proxy_url}/v1/models")
            wait_until_ready(exporter, f"{exporter_url}/-/healthy")
            wait_until_ready(restarter, f"{restarter_url}/-/healthy")
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
            "",
        ):
            timeline.say(line)
        observer = Observer(
            session, timeline, stack, exporter_url, restarter_url, restarter_token_value
        )

        def scraped() -> bool:
            results = stack.query('up{job=~"stallwatch-exporter|stallwatch-restarter"} == 1')
            return len(results) == 2

        await self._until(lambda: asyncio.to_thread(scraped), 30, "Prometheus' first scrapes")
        # Before its first scrape Prometheus sees no exporter: StallwatchExporterDown is
        # pending for a moment. Start the story once that has cleared.
        await self._until(
            lambda: asyncio.to_thread(lambda: not stack.alerts()), 20, "no pending alerts"
        )
        await observer.sample()
        await observer.wait_for(
            lambda: all(observer.state_of(name) is not None for name in SERVERS),
            15,
            "the exporter's first polls",
        )
        timeline.emit(
            "story",
            "everything is up; Prometheus scrapes the exporter and the restarter every second",
            "story",
        )
        return observer

    def _spawn(self, name: str, args: list[str]) -> ManagedProcess:
        process = ManagedProcess(
            name,
            [sys.executable, "-m", "stallwatch", *args],
            self.workdir / f"{name}.log",
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.processes.append(process)
        return process.start()

    async def _until(self, check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(LocalStackError, OSError, ValueError):
                if await check():
                    return
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout:g} s waiting for {what}")
            await asyncio.sleep(0.2)

    # The story.

    async def _run(self, session: aiohttp.ClientSession) -> None:
        self.timeline.say(
            f"stallwatch {__version__} demo ({self.script.name}): the incident "
            "that stallwatch was made for, on this machine, with no Docker"
        )
        observer = await self._start_pipeline(session)
        self.observer = observer
        self.observer_task = asyncio.create_task(observer.run(self.script.heartbeat_seconds))
        self.tasks.append(self.observer_task)
        await self._act_batch_job(session, observer)
        await self._act_long_prompt(session, observer)
        await self._act_hang(session, observer)
        await self._wind_down(observer)

    def _server_url(self, name: str) -> str:
        return self.supervisor.servers[name].url

    async def _sim_stats(self, session: aiohttp.ClientSession, name: str) -> dict[str, Any]:
        async with session.get(f"{self._server_url(name)}/sim/stats") as response:
            stats: dict[str, Any] = await response.json()
            return stats

    async def _sim_test_requests(self, session: aiohttp.ClientSession, name: str) -> int:
        stats = await self._sim_stats(session, name)
        return int(stats["completions_by_user_agent"].get(USER_AGENT, 0))

    async def _wait_sim_work(
        self, session: aiohttp.ClientSession, name: str, at_least: int, timeout: float = 15
    ) -> None:
        async def check() -> bool:
            stats = await self._sim_stats(session, name)
            return int(stats["running"]) + int(stats["waiting"]) >= at_least

        await self._until(check, timeout, f"{name} to have {at_least} requests")

    async def _act_batch_job(self, session: aiohttp.ClientSession, observer: Observer) -> None:
        script, timeline = self.script, self.timeline
        timeline.emit(
            "story",
            f"ACT 1: a batch job fills all 4 slots of {BATCH_TARGET} with long generations "
            f"(ignore_eos, {script.batch_max_tokens} tokens each, 10 tokens/s each)",
            "story",
        )

        self.batch = KeepBusy(
            session,
            self._server_url(BATCH_TARGET),
            concurrency=4,
            prompt_tokens=32,
            max_tokens=script.batch_max_tokens,
            user_agent="batch-job/1.0",
        )
        self.batch.start()
        await self._wait_sim_work(session, BATCH_TARGET, 4)
        await observer.wait_for(
            lambda: observer.state_of(BATCH_TARGET) == "busy", 15, f"{BATCH_TARGET} busy"
        )
        # Ground truth from here on: the simulator counts every stallwatch request it gets.
        # (A test request sent by the last idle poll, just before the work arrived, is
        # counted before this point: the exporter sends it right after its read.)
        self.batch_window_start = await self._sim_test_requests(session, BATCH_TARGET)
        await asyncio.sleep(script.batch_alone_seconds)
        timeline.emit(
            "story",
            f"an old-style watchdog sends its test request to {BATCH_TARGET} "
            f"(max_tokens 1, timeout {OLD_WATCHDOG_TIMEOUT_SECONDS:g} s)",
            "story",
        )
        started = time.monotonic()
        try:
            async with session.post(
                f"{self._server_url(BATCH_TARGET)}/v1/completions",
                json={"model": MODEL, "prompt": "ping", "max_tokens": 1},
                headers={"User-Agent": OLD_WATCHDOG_USER_AGENT},
                timeout=aiohttp.ClientTimeout(total=OLD_WATCHDOG_TIMEOUT_SECONDS),
            ) as response:
                await response.read()
                self.old_watchdog = (
                    f"answered {response.status} in {time.monotonic() - started:.1f} s"
                )
        except TimeoutError:
            self.old_watchdog = (
                f"timed out after {time.monotonic() - started:.1f} s, queued behind 4 running "
                "requests: the old watchdog would now restart a healthy server and fail them all"
            )
        timeline.emit("story", f"old-style test request: {self.old_watchdog}", "story")
        timeline.emit(
            "story",
            f"stallwatch reads {BATCH_TARGET}'s counters instead: "
            f"{observer.state_of(BATCH_TARGET)}, "
            f"{observer.tallies[BATCH_TARGET].test_requests} test requests sent to it so far",
            "story",
        )

    async def _act_long_prompt(self, session: aiohttp.ClientSession, observer: Observer) -> None:
        script, timeline = self.script, self.timeline
        name = HUNG_TARGET
        timeline.emit(
            "story",
            f"ACT 2: a {script.long_prompt_tokens}-token prompt on {name}: a long chunked "
            "prefill (64-token chunks) — no output steps, only the KV cache grows",
            "story",
        )
        before = await self._engine_counters(session, name)

        async def long_prompt() -> None:
            async with session.post(
                f"{self._server_url(name)}/v1/completions",
                json={
                    "model": MODEL,
                    "prompt": " ".join(["context"] * script.long_prompt_tokens),
                    "max_tokens": 8,
                },
                headers={"User-Agent": "long-prompt/1.0"},
                timeout=aiohttp.ClientTimeout(total=120),
            ) as response:
                await response.read()

        task = asyncio.create_task(long_prompt())
        self.tasks.append(task)
        await self._wait_sim_work(session, name, 1)
        await observer.wait_for(lambda: observer.state_of(name) == "busy", 15, f"{name} busy")
        window_start = await self._sim_test_requests(session, name)
        await asyncio.sleep(script.long_prompt_tokens / PREFILL_TOKENS_PER_SECOND / 2)
        during = await self._engine_counters(session, name)
        window_end = await self._sim_test_requests(session, name)
        observer.tallies[name].sim_test_requests_while_busy += max(0, window_end - window_start)
        self.long_prompt = (
            f"output steps {before[0]:.0f} → {during[0]:.0f}, "
            f"KV cache {before[1]:.0%} → {during[1]:.0%}"
        )
        timeline.emit(
            "story",
            f"{name}'s own counters during the prefill: {self.long_prompt}; a step-count "
            f"watchdog would call it stuck, stallwatch reads {observer.state_of(name)}",
            "story",
        )
        await task
        timeline.emit("story", f"the long prompt finished on {name}", "story")
        await observer.wait_for(
            lambda: observer.state_of(name) not in WORK_STATES, 10, f"{name} done"
        )

    async def _engine_counters(
        self, session: aiohttp.ClientSession, name: str
    ) -> tuple[float, float]:
        """(output steps, KV-cache usage) from the server's own /metrics."""
        async with session.get(f"{self._server_url(name)}/metrics") as response:
            text = await response.text()
        steps = usage = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:iteration_tokens_total_count":
                    steps = sample.value
                elif sample.name == "vllm:kv_cache_usage_perc":
                    usage = sample.value
        return steps, usage

    async def _act_hang(self, session: aiohttp.ClientSession, observer: Observer) -> None:
        script, timeline = self.script, self.timeline
        name = HUNG_TARGET
        tally = observer.tallies[name]
        timeline.emit(
            "story",
            f"ACT 3: user traffic on {name} ({script.traffic_concurrency} requests at a time), "
            "then its engine really hangs",
            "story",
        )

        self.traffic = KeepBusy(
            session,
            self._server_url(name),
            concurrency=script.traffic_concurrency,
            prompt_tokens=64,
            max_tokens=script.traffic_max_tokens,
            user_agent="user-traffic/1.0",
        )
        self.traffic.start()
        await self._wait_sim_work(session, name, script.traffic_concurrency)
        await observer.wait_for(lambda: observer.state_of(name) == "busy", 15, f"{name} busy")
        window_start = await self._sim_test_requests(session, name)
        await asyncio.sleep(script.traffic_before_hang_seconds)
        window_end = await self._sim_test_requests(session, name)
        tally.sim_test_requests_while_busy += max(0, window_end - window_start)
        async with session.post(
            f"{self._server_url(name)}/sim/fault", json={"fault": "hang"}
        ) as response:
            response.raise_for_status()
        tally.hung_at = time.monotonic()
        timeline.emit(
            "story",
            f"{name}'s engine core hangs with {script.traffic_concurrency} requests in flight "
            "(/health still 200, /metrics frozen)",
            "problem",
        )
        await observer.wait_for(
            lambda: (
                tally.resolved_at is not None
                and any(target == name for target, _ in self.supervisor.restarts)
            ),
            script.recovery_timeout_seconds,
            f"{name} to be restarted and LLMServerStuck to resolve",
        )
        tally.restarted_at = next(t for target, t in self.supervisor.restarts if target == name)
        await observer.wait_for(
            lambda: observer.state_of(name) == "busy", 20, f"{name} serving again"
        )
        timeline.emit("story", f"{name} serves its users again", "good")
        await asyncio.sleep(script.after_recovery_seconds)

    async def _wind_down(self, observer: Observer) -> None:
        batch_end = await self._sim_test_requests(observer.session, BATCH_TARGET)
        observer.tallies[BATCH_TARGET].sim_test_requests_while_busy += max(
            0, batch_end - self.batch_window_start
        )
        await asyncio.sleep(self.script.wind_down_seconds)
        await observer.sample()
        await self._stop_clients()
        self.timeline.emit("story", "the end: stopping everything", "story")

    async def _stop_clients(self) -> None:
        for client in (self.batch, self.traffic):
            if client is not None:
                await client.stop()

    # The end.

    def _report(self) -> DemoReport:
        observer = self.observer
        elapsed = time.monotonic() - self.started
        if observer is None:
            problems = [self.failure or "the demo did not get to its story"]
            return DemoReport(
                False,
                problems,
                {
                    "version": __version__,
                    "ok": False,
                    "problems": problems,
                    "duration_seconds": round(elapsed, 1),
                    "processes": self._process_list(),
                    "timeline": self.timeline.events,
                },
            )
        for name, tally in observer.tallies.items():
            restarted_by_supervisor = sum(
                1 for target, _ in self.supervisor.restarts if target == name
            )
            if name != HUNG_TARGET:
                tally.false_restarts = max(tally.false_restarts, restarted_by_supervisor)
        tallies = observer.tallies
        problems = ([self.failure] if self.failure else []) + story_problems(tallies, HUNG_TARGET)
        ok = not problems
        batch, traffic = self.batch, self.traffic
        summary = {
            "version": __version__,
            "script": self.script.name,
            "ok": ok,
            "problems": problems,
            "duration_seconds": round(elapsed, 1),
            "hung_target": HUNG_TARGET,
            "targets": {name: tally.as_json() for name, tally in tallies.items()},
            "batch_job": batch.as_json() if batch is not None else None,
            "user_traffic": traffic.as_json() if traffic is not None else None,
            "old_watchdog_request": self.old_watchdog,
            "long_prompt": self.long_prompt,
            "journal": observer.journal_entries,
            "processes": self._process_list(),
            "timeline": self.timeline.events,
        }
        say = self.timeline.say
        say("")
        say(format_summary_table([tallies[name] for name in (*SERVERS, PROXY_TARGET)]))
        say("")
        if batch is not None:
            say(
                f"  batch job on {BATCH_TARGET}: {batch.sent} long requests, {batch.failed_total} "
                "failed (a false restart would have failed all 4 in flight)"
            )
        if traffic is not None:
            say(
                f"  user traffic on {HUNG_TARGET}: {traffic.completed} requests done, "
                f"{traffic.failed_total} failed (in flight on the hung process when it was "
                f"replaced), {traffic.refused} refused while the new process started"
            )
        say(f"  old-style test request to {BATCH_TARGET}: {self.old_watchdog}")
        say(f"  long prompt on {HUNG_TARGET}: {self.long_prompt}; read busy, never stuck")
        if ok:
            say(
                f"  0 test requests to busy servers, 0 false restarts, the real stall on "
                f"{HUNG_TARGET} restarted once. Total {elapsed:.0f} s."
            )
        else:
            for problem in problems:
                say(f"  PROBLEM: {problem}")
        return DemoReport(ok, problems, summary)


def _write_secret(path: Path, value: str) -> None:
    path.touch(mode=0o600)
    path.write_text(value + "\n")


async def _run_with_signals(demo: Demo) -> DemoReport:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    return await demo.run()


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> DemoReport:
    """Run the demo to its end (or until it fails or is interrupted); leave nothing running."""
    demo = Demo(options, out)
    try:
        report = asyncio.run(_run_with_signals(demo))
    except asyncio.CancelledError:
        raise DemoInterrupted("terminated") from None
    if options.json_summary is not None:
        options.json_summary.write_text(json.dumps(report.summary, indent=2) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m stallwatch.demo restart-helper URL TOKEN_FILE` (the restarter's action)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["restart-helper"]:
        print("usage: python -m stallwatch.demo restart-helper URL TOKEN_FILE", file=sys.stderr)
        return 2
    return restart_helper(args[1:])


if __name__ == "__main__":
    sys.exit(main())

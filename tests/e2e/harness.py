"""Real Prometheus and Alertmanager on loopback, running stallwatch's own rules and routing.

One `AlertingStack` per test session (Prometheus needs about 5 s to discover its targets, so
tests change what an existing target serves instead of adding targets):

- Prometheus scrapes job `stallwatch-exporter` at 127.0.0.1:`exporter_port` and job
  `stallwatch-restarter` at 127.0.0.1:`restarter_port`. Nothing listens there until a test
  starts its exporter (real or fake) on that port.
- Alertmanager sends the restarter's notifications to `receiver`, a recording webhook server
  that requires the bearer token, the stand-in for the restarter.

The project's files are copied with a small rewrite that changes only timing and addresses:

- prometheus/prometheus.yml: scrape and evaluation interval 1 s (scrape timeout 1 s), the three
  scrape jobs and the Alertmanager pointed at loopback ports, rule files at the rewritten copies.
- prometheus/alerts.yml and recording.yml: only the `for:` durations in `FOR_OVERRIDES`
  (LLMServerDown 10m -> 3s, StallwatchExporterDown 1m -> 2s); every expression, label and
  annotation is unchanged. The restart alerts have no `for:` (they count exporter polls).
- alertmanager/alertmanager.yml: `group_wait` 0s and `group_interval` 1s on every route that
  sets them, the restarter webhook URL and its token file. Routes and receivers are unchanged.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp import web

T = TypeVar("T")

SCRAPE_INTERVAL = "1s"
FOR_OVERRIDES = {"LLMServerDown": "3s", "StallwatchExporterDown": "2s"}
ROUTE_TIMER_OVERRIDES = {"group_wait": "0s", "group_interval": "1s"}
EXPORTER_JOB = "stallwatch-exporter"
RESTARTER_JOB = "stallwatch-restarter"
RESTARTER_RECEIVER = "stallwatch-restarter"
WEBHOOK_PATH = "/alerts"
HTTP_TIMEOUT_SECONDS = 5.0
STARTUP_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0


class MissingBinaryError(RuntimeError):
    """A Prometheus or Alertmanager binary is not installed."""


class StackError(RuntimeError):
    """A process of the stack failed to start or answer."""


def find_binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    raise MissingBinaryError(
        f"none of {', '.join(names)} is on PATH; `make test` installs Debian's prometheus "
        "and prometheus-alertmanager packages"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- config rewrites (pure) ------------------------------------------------------------------


def rewrite_prometheus_config(
    document: dict[str, Any],
    *,
    rule_files: list[str],
    targets_by_job: dict[str, str],
    alertmanager_address: str,
) -> dict[str, Any]:
    """Intervals to 1 s; every job in `targets_by_job` and the Alertmanager to loopback."""
    result = dict(document)
    result["global"] = {
        **document.get("global", {}),
        "scrape_interval": SCRAPE_INTERVAL,
        "scrape_timeout": SCRAPE_INTERVAL,
        "evaluation_interval": SCRAPE_INTERVAL,
    }
    if len(document["rule_files"]) != len(rule_files):
        raise StackError(f"prometheus.yml loads {document['rule_files']}, expected {rule_files}")
    result["rule_files"] = rule_files
    result["alerting"] = {
        "alertmanagers": [{"static_configs": [{"targets": [alertmanager_address]}]}]
    }
    jobs = {job["job_name"]: job for job in document["scrape_configs"]}
    missing = set(targets_by_job) - set(jobs)
    if missing:
        raise StackError(f"prometheus.yml has no scrape job named {sorted(missing)}")
    result["scrape_configs"] = [
        {**job, "static_configs": [{"targets": [targets_by_job[name]]}]}
        for name, job in jobs.items()
        if name in targets_by_job
    ]
    return result


def rewrite_alert_rules(document: dict[str, Any], for_overrides: dict[str, str]) -> dict[str, Any]:
    """Replace the `for:` of the named alerts; nothing else changes."""
    seen: set[str] = set()
    groups = []
    for group in document["groups"]:
        rules = []
        for rule in group["rules"]:
            name = rule.get("alert")
            if name in for_overrides:
                if "for" not in rule:
                    raise StackError(f"alert {name} has no `for:` to shorten")
                rule = {**rule, "for": for_overrides[name]}
                seen.add(name)
            rules.append(rule)
        groups.append({**group, "rules": rules})
    if seen != set(for_overrides):
        raise StackError(f"alerts not found: {sorted(set(for_overrides) - seen)}")
    return {**document, "groups": groups}


def _rewrite_route_timers(route: dict[str, Any], is_root: bool) -> dict[str, Any]:
    result = dict(route)
    for key, value in ROUTE_TIMER_OVERRIDES.items():
        if is_root or key in route:
            result[key] = value
    if "routes" in route:
        result["routes"] = [_rewrite_route_timers(child, False) for child in route["routes"]]
    return result


def rewrite_alertmanager_config(
    document: dict[str, Any], *, webhook_url: str, credentials_file: str
) -> dict[str, Any]:
    """Short grouping timers; the restarter webhook to `webhook_url` with `credentials_file`."""
    receivers = []
    rewritten = 0
    for receiver in document["receivers"]:
        if receiver["name"] == RESTARTER_RECEIVER:
            webhooks = []
            for webhook in receiver["webhook_configs"]:
                authorization = webhook["http_config"]["authorization"]
                webhooks.append(
                    {
                        **webhook,
                        "url": webhook_url,
                        "http_config": {
                            **webhook["http_config"],
                            "authorization": {
                                **authorization,
                                "credentials_file": credentials_file,
                            },
                        },
                    }
                )
                rewritten += 1
            receiver = {**receiver, "webhook_configs": webhooks}
        receivers.append(receiver)
    if rewritten != 1:
        raise StackError(f"expected one webhook in receiver {RESTARTER_RECEIVER}, got {rewritten}")
    return {
        **document,
        "route": _rewrite_route_timers(document["route"], True),
        "receivers": receivers,
    }


# --- the restarter stand-in --------------------------------------------------------------------


@dataclass(frozen=True)
class Notification:
    """One webhook POST that carried the right bearer token."""

    payload: dict[str, Any]
    authorization: str
    user_agent: str
    received_at: float  # time.time()
    received_monotonic: float  # time.monotonic(), comparable with the test's own clock

    def matches(self, alertname: str, target: str, status: str) -> bool:
        return any(
            alert.get("status") == status
            and alert.get("labels", {}).get("alertname") == alertname
            and alert.get("labels", {}).get("target") == target
            for alert in self.payload.get("alerts", [])
        )


class RecordingReceiver:
    """A real aiohttp webhook server on loopback, in its own thread, recording every payload."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.port = 0
        self._condition = threading.Condition()
        self._notifications: list[Notification] = []
        self._rejected = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="recording-receiver", daemon=True
        )
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{WEBHOOK_PATH}"

    @property
    def notifications(self) -> list[Notification]:
        with self._condition:
            return list(self._notifications)

    @property
    def rejected(self) -> int:
        """POSTs refused for a missing or wrong bearer token."""
        with self._condition:
            return self._rejected

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(HTTP_TIMEOUT_SECONDS)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(
                HTTP_TIMEOUT_SECONDS
            )
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(HTTP_TIMEOUT_SECONDS)
        self._loop.close()

    def clear(self) -> None:
        with self._condition:
            self._notifications.clear()
            self._rejected = 0

    def find(self, alertname: str, target: str, status: str = "firing") -> Notification | None:
        with self._condition:
            for notification in self._notifications:
                if notification.matches(alertname, target, status):
                    return notification
        return None

    async def wait_for(
        self, alertname: str, target: str, status: str = "firing", timeout: float = 30.0
    ) -> Notification:
        """The first notification with an alert of that name, target and status."""

        async def check() -> Notification | None:
            return self.find(alertname, target, status)

        return await poll(check, timeout, f"webhook {alertname}{{target={target!r}}} {status}")

    def wait_for_blocking(
        self, alertname: str, target: str, status: str = "firing", timeout: float = 30.0
    ) -> Notification:
        deadline = time.monotonic() + timeout
        with self._condition:
            while True:
                for notification in self._notifications:
                    if notification.matches(alertname, target, status):
                        return notification
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no webhook {alertname}{{target={target!r}}} {status}")
                self._condition.wait(remaining)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post(WEBHOOK_PATH, self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def _handle(self, request: web.Request) -> web.Response:
        received_at, received_monotonic = time.time(), time.monotonic()
        authorization = request.headers.get("Authorization", "")
        if not secrets.compare_digest(authorization, f"Bearer {self.token}"):
            with self._condition:
                self._rejected += 1
            return web.Response(status=401, text="missing or wrong bearer token\n")
        try:
            payload = json.loads(await request.read())
        except (UnicodeDecodeError, json.JSONDecodeError):
            return web.Response(status=400, text="body is not JSON\n")
        if not isinstance(payload, dict):
            return web.Response(status=400, text="body is not a JSON object\n")
        notification = Notification(
            payload=payload,
            authorization=authorization,
            user_agent=request.headers.get("User-Agent", ""),
            received_at=received_at,
            received_monotonic=received_monotonic,
        )
        with self._condition:
            self._notifications.append(notification)
            self._condition.notify_all()
        return web.Response(status=200)


async def poll(check: Callable[[], Awaitable[T | None]], timeout: float, what: str) -> T:
    """Call `check` every 50 ms until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


# --- the stack ---------------------------------------------------------------------------------


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response:
        return json.load(response)


def _log_tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class AlertingStack:
    """Prometheus + Alertmanager + recording receiver, started with `start()`, ended with `stop()`.

    Synchronous helpers (`query`, `alerts`, `am_alerts`) answer in milliseconds; the async
    `wait_for_*` helpers poll them without blocking the test's event loop.
    """

    def __init__(self, workdir: Path, repo: Path) -> None:
        self.workdir = workdir
        self.repo = repo
        self.prometheus_port = free_port()
        self.alertmanager_port = free_port()
        self.exporter_port = free_port()
        self.restarter_port = free_port()
        self.token = secrets.token_hex(16)
        self.receiver = RecordingReceiver(self.token)
        self._processes: list[tuple[subprocess.Popen[bytes], Path]] = []

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"

    @property
    def exporter_address(self) -> str:
        return f"127.0.0.1:{self.exporter_port}"

    @property
    def restarter_address(self) -> str:
        return f"127.0.0.1:{self.restarter_port}"

    def start(self) -> None:
        prometheus = find_binary("prometheus")
        alertmanager = find_binary("alertmanager", "prometheus-alertmanager")
        self.receiver.start()
        try:
            prometheus_config, alertmanager_config = self._write_configs()
            self._spawn(
                "alertmanager",
                [
                    alertmanager,
                    f"--config.file={alertmanager_config}",
                    f"--storage.path={self.workdir / 'alertmanager-data'}",
                    f"--web.listen-address=127.0.0.1:{self.alertmanager_port}",
                    f"--web.external-url={self.alertmanager_url}/",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
            )
            self._spawn(
                "prometheus",
                [
                    prometheus,
                    f"--config.file={prometheus_config}",
                    f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
                    f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                    f"--web.external-url={self.prometheus_url}/",
                    "--log.level=warn",
                ],
            )
            self._wait_ready(self.alertmanager_url, self._processes[0])
            self._wait_ready(self.prometheus_url, self._processes[1])
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for process, _log in self._processes:
            if process.poll() is None:
                process.terminate()
        for process, _log in self._processes:
            try:
                process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_SECONDS)
        self._processes.clear()
        if self.receiver.port:
            self.receiver.stop()

    def logs(self) -> str:
        """The tail of each process' log, for failure messages."""
        return "\n".join(f"--- {log.name}\n{_log_tail(log)}" for _process, log in self._processes)

    # Prometheus and Alertmanager APIs.

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The result of an instant query: a list of {metric, value}."""
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = _get_json(url)
        if body.get("status") != "success":
            raise StackError(f"query {promql!r} failed: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Prometheus' pending and firing alerts (GET /api/v1/alerts)."""
        alerts: list[dict[str, Any]] = _get_json(f"{self.prometheus_url}/api/v1/alerts")["data"][
            "alerts"
        ]
        return alerts

    def am_alerts(self) -> list[dict[str, Any]]:
        """Alertmanager's alerts, with their receivers (GET /api/v2/alerts)."""
        alerts: list[dict[str, Any]] = _get_json(f"{self.alertmanager_url}/api/v2/alerts")
        return alerts

    async def wait_for_query(self, promql: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The first non-empty result of `promql`."""

        async def check() -> list[dict[str, Any]] | None:
            return await asyncio.to_thread(self.query, promql) or None

        return await poll(check, timeout, f"a result for {promql!r}")

    async def wait_for_alert(
        self, alertname: str, target: str, state: str = "firing", timeout: float = 30.0
    ) -> dict[str, Any]:
        """The Prometheus alert with that name and target, once it is in `state`."""

        async def check() -> dict[str, Any] | None:
            for alert in await asyncio.to_thread(self.alerts):
                labels = alert["labels"]
                if (labels.get("alertname"), labels.get("target"), alert["state"]) == (
                    alertname,
                    target,
                    state,
                ):
                    return alert
            return None

        return await poll(check, timeout, f"Prometheus alert {alertname}{{target={target!r}}}")

    async def wait_for_am_alert(
        self, alertname: str, target: str, timeout: float = 30.0
    ) -> dict[str, Any]:
        """The active Alertmanager alert with that name and target."""

        async def check() -> dict[str, Any] | None:
            for alert in await asyncio.to_thread(self.am_alerts):
                labels = alert["labels"]
                if (labels.get("alertname"), labels.get("target"), alert["status"]["state"]) == (
                    alertname,
                    target,
                    "active",
                ):
                    return alert
            return None

        return await poll(check, timeout, f"Alertmanager alert {alertname}{{target={target!r}}}")

    # Internals.

    def _write_configs(self) -> tuple[Path, Path]:
        config_dir = self.workdir / "config"
        config_dir.mkdir()
        source = self.repo / "prometheus"
        prometheus_document = yaml.safe_load((source / "prometheus.yml").read_text())
        rule_files = []
        for name in prometheus_document["rule_files"]:
            rules = yaml.safe_load((source / name).read_text())
            overrides = {
                alert: duration
                for alert, duration in FOR_OVERRIDES.items()
                if any(rule.get("alert") == alert for g in rules["groups"] for rule in g["rules"])
            }
            if overrides:
                rules = rewrite_alert_rules(rules, overrides)
            path = config_dir / Path(name).name
            path.write_text(yaml.safe_dump(rules, sort_keys=False))
            rule_files.append(str(path))
        prometheus_config = config_dir / "prometheus.yml"
        prometheus_config.write_text(
            yaml.safe_dump(
                rewrite_prometheus_config(
                    prometheus_document,
                    rule_files=rule_files,
                    targets_by_job={
                        "prometheus": f"127.0.0.1:{self.prometheus_port}",
                        EXPORTER_JOB: self.exporter_address,
                        RESTARTER_JOB: self.restarter_address,
                    },
                    alertmanager_address=f"127.0.0.1:{self.alertmanager_port}",
                ),
                sort_keys=False,
            )
        )
        token_file = config_dir / "restarter-token"
        token_file.write_text(self.token + "\n")
        token_file.chmod(0o600)
        alertmanager_config = config_dir / "alertmanager.yml"
        alertmanager_document = yaml.safe_load(
            (self.repo / "alertmanager" / "alertmanager.yml").read_text()
        )
        alertmanager_config.write_text(
            yaml.safe_dump(
                rewrite_alertmanager_config(
                    alertmanager_document,
                    webhook_url=self.receiver.url,
                    credentials_file=str(token_file),
                ),
                sort_keys=False,
            )
        )
        return prometheus_config, alertmanager_config

    def _spawn(self, name: str, command: list[str]) -> None:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as log_file:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        self._processes.append((process, log))

    def _wait_ready(self, base_url: str, entry: tuple[subprocess.Popen[bytes], Path]) -> None:
        process, log = entry
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise StackError(f"{log.stem} exited with {process.returncode}:\n{_log_tail(log)}")
            try:
                with urllib.request.urlopen(f"{base_url}/-/ready", timeout=1.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise StackError(
            f"{log.stem} not ready after {STARTUP_TIMEOUT_SECONDS} s:\n{_log_tail(log)}"
        )

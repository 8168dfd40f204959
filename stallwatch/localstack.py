"""Real Prometheus and Alertmanager on loopback, running stallwatch's own rules and routing.

Used by `stallwatch demo` and by the end-to-end tests' harness. It starts the binaries of
Debian's `prometheus` and `prometheus-alertmanager` packages (Prometheus >= 2.42, Alertmanager
>= 0.25) on free loopback ports, with temporary storage and clustering off.

The project's files are copied with a rewrite that changes only timing and addresses, never
logic (every expression, label, annotation, route and receiver stays as written):

- prometheus/prometheus.yml: scrape and evaluation interval (default 1 s; the scrape timeout
  equals the interval), the `prometheus`, `stallwatch-exporter` and `stallwatch-restarter` jobs
  and the Alertmanager pointed at loopback ports, the rule files at the rewritten copies.
- prometheus/alerts.yml and recording.yml: only the `for:` durations of the alerts named in
  `Timings.alert_for` (by default LLMServerDown 10m -> 3s, StallwatchExporterDown 1m -> 2s). The
  restart alerts have no `for:`: they count exporter polls.
- alertmanager/alertmanager.yml: `group_wait` and `group_interval` (default 0s and 1s) on the
  root route and on every route that sets them; the restarter webhook's URL and token file.

A scrape job, receiver or alert that the rewrite names but the project's files no longer define
is a LocalStackError, never a silent skip.

Usage::

    with LocalStack(workdir, scrape=ScrapeTargets(exporter="127.0.0.1:9732",
                                                  restarter="127.0.0.1:9733"),
                    webhook=Webhook(url="http://127.0.0.1:9733/alerts", token=token)) as stack:
        stack.query('stallwatch_target_state{state="stalled"} == 1')
        stack.alerts()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any

import yaml

EXPORTER_JOB = "stallwatch-exporter"
RESTARTER_JOB = "stallwatch-restarter"
PROMETHEUS_JOB = "prometheus"
RESTARTER_RECEIVER = "stallwatch-restarter"
HTTP_TIMEOUT_SECONDS = 5.0
STARTUP_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0

DEFAULT_ALERT_FOR: Mapping[str, str] = MappingProxyType(
    {"LLMServerDown": "3s", "StallwatchExporterDown": "2s"}
)
DEFAULT_ROUTE_TIMERS: Mapping[str, str] = MappingProxyType(
    {"group_wait": "0s", "group_interval": "1s"}
)


class LocalStackError(RuntimeError):
    """A process of the stack failed to start or answer, or a config file is not as expected."""


class MissingBinaryError(LocalStackError):
    """A Prometheus or Alertmanager binary is not installed."""


class ProjectFilesNotFoundError(LocalStackError):
    """The project's prometheus/ and alertmanager/ files are not where a checkout has them."""


# --- finding things ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectFiles:
    """The project's Prometheus and Alertmanager files (as in a source checkout)."""

    root: Path

    @property
    def prometheus_dir(self) -> Path:
        return self.root / "prometheus"

    @property
    def prometheus_config(self) -> Path:
        return self.prometheus_dir / "prometheus.yml"

    @property
    def alertmanager_config(self) -> Path:
        return self.root / "alertmanager" / "alertmanager.yml"

    @property
    def required(self) -> tuple[Path, ...]:
        return (
            self.prometheus_config,
            self.prometheus_dir / "alerts.yml",
            self.prometheus_dir / "recording.yml",
            self.alertmanager_config,
        )

    @classmethod
    def locate(cls, root: Path | None = None) -> ProjectFiles:
        """The files under `root`, by default the parent of the `stallwatch` package directory.

        Raises ProjectFilesNotFoundError naming every missing file.
        """
        files = cls(root if root is not None else Path(__file__).resolve().parent.parent)
        missing = [str(path) for path in files.required if not path.is_file()]
        if missing:
            raise ProjectFilesNotFoundError(
                "the project's Prometheus and Alertmanager files were not found: "
                + ", ".join(missing)
                + ". Run this from a source checkout of stallwatch (`make demo`), where "
                "prometheus/ and alertmanager/ sit next to the stallwatch/ package."
            )
        return files


def find_binary(*names: str) -> str:
    """The first of `names` found on PATH."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    raise MissingBinaryError(
        f"none of {', '.join(names)} is on PATH; install Debian's prometheus and "
        "prometheus-alertmanager packages (`make demo` and `make test` do it when run as root)"
    )


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- config rewrites (pure) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Timings:
    """What the rewrite changes: intervals, `for:` durations and Alertmanager route timers."""

    interval: str = "1s"
    alert_for: Mapping[str, str] = field(default_factory=lambda: DEFAULT_ALERT_FOR)
    route_timers: Mapping[str, str] = field(default_factory=lambda: DEFAULT_ROUTE_TIMERS)


@dataclass(frozen=True)
class ScrapeTargets:
    """`host:port` of the exporter and the restarter, as Prometheus should scrape them."""

    exporter: str
    restarter: str


@dataclass(frozen=True)
class Webhook:
    """Where Alertmanager sends the restart alerts, and the bearer token it sends."""

    url: str
    token: str


def rewrite_prometheus_config(
    document: Mapping[str, Any],
    *,
    interval: str,
    rule_files: Sequence[str],
    targets_by_job: Mapping[str, str],
    alertmanager_address: str,
) -> dict[str, Any]:
    """Intervals to `interval`; every job in `targets_by_job` and the Alertmanager to loopback."""
    result = dict(document)
    result["global"] = {
        **document.get("global", {}),
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "evaluation_interval": interval,
    }
    if len(document["rule_files"]) != len(rule_files):
        raise LocalStackError(
            f"prometheus.yml loads {document['rule_files']}, expected {list(rule_files)}"
        )
    result["rule_files"] = list(rule_files)
    result["alerting"] = {
        "alertmanagers": [{"static_configs": [{"targets": [alertmanager_address]}]}]
    }
    jobs = {job["job_name"]: job for job in document["scrape_configs"]}
    missing = set(targets_by_job) - set(jobs)
    if missing:
        raise LocalStackError(f"prometheus.yml has no scrape job named {sorted(missing)}")
    result["scrape_configs"] = [
        {**job, "static_configs": [{"targets": [targets_by_job[name]]}]}
        for name, job in jobs.items()
        if name in targets_by_job
    ]
    return result


def rewrite_alert_rules(
    document: Mapping[str, Any], for_overrides: Mapping[str, str]
) -> dict[str, Any]:
    """Replace the `for:` of the named alerts that this file defines; nothing else changes."""
    groups = []
    for group in document["groups"]:
        rules = []
        for rule in group["rules"]:
            name = rule.get("alert")
            if name in for_overrides:
                if "for" not in rule:
                    raise LocalStackError(f"alert {name} has no `for:` to shorten")
                rule = {**rule, "for": for_overrides[name]}
            rules.append(rule)
        groups.append({**group, "rules": rules})
    return {**document, "groups": groups}


def alert_names(document: Mapping[str, Any]) -> set[str]:
    """The names of the alerts a rule file defines."""
    return {
        rule["alert"]
        for group in document.get("groups", [])
        for rule in group.get("rules", [])
        if "alert" in rule
    }


def rewrite_rule_files(
    documents: Mapping[str, Mapping[str, Any]], for_overrides: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """Each rule file (by name) with the `for:` of the named alerts it defines replaced.

    Every alert in `for_overrides` must be defined by one of the files: a renamed alert is an
    error, not a rewrite that silently keeps its long `for:`.
    """
    defined = {alert for document in documents.values() for alert in alert_names(document)}
    unknown = set(for_overrides) - defined
    if unknown:
        raise LocalStackError(f"alerts not found in the rule files: {sorted(unknown)}")
    return {
        name: rewrite_alert_rules(
            document,
            {
                alert: duration
                for alert, duration in for_overrides.items()
                if alert in alert_names(document)
            },
        )
        for name, document in documents.items()
    }


def _rewrite_route_timers(
    route: Mapping[str, Any], timers: Mapping[str, str], is_root: bool
) -> dict[str, Any]:
    result = dict(route)
    for key, value in timers.items():
        if is_root or key in route:
            result[key] = value
    if "routes" in route:
        result["routes"] = [
            _rewrite_route_timers(child, timers, False) for child in route["routes"]
        ]
    return result


def rewrite_alertmanager_config(
    document: Mapping[str, Any],
    *,
    route_timers: Mapping[str, str],
    webhook_url: str,
    credentials_file: str,
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
        raise LocalStackError(
            f"expected one webhook in receiver {RESTARTER_RECEIVER}, got {rewritten}"
        )
    return {
        **document,
        "route": _rewrite_route_timers(document["route"], route_timers, True),
        "receivers": receivers,
    }


# --- processes ----------------------------------------------------------------------------------


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file."""
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class ManagedProcess:
    """A subprocess in its own process group, its output in a log file.

    Its own session keeps a Ctrl-C in the terminal from reaching it directly, so the owner
    decides the order of shutdown; `stop()` ends the whole group (terminate, wait, kill).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise LocalStackError(f"{self.name} was not started")
        return self._process.pid

    @property
    def started(self) -> bool:
        return self._process is not None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def start(self) -> ManagedProcess:
        with self.log_path.open("ab") as log_file:
            self._process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self._cwd,
                env=self._env,
                start_new_session=True,
            )
        return self

    def signal_group(self, signum: int) -> None:
        """Send `signum` to the process group (if any of it is left)."""
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signum)

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS, *, kill_first: bool = False) -> None:
        """Terminate the group (or kill it right away), wait, kill what is left; always reap."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self.signal_group(signal.SIGKILL if kill_first else signal.SIGTERM)
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self._process.wait(timeout)
        # Anything the leader left behind in its group goes too.
        self.signal_group(signal.SIGKILL)

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def check_alive(self) -> None:
        """Raise LocalStackError with the log's tail if the process has exited."""
        code = self.returncode
        if code is not None:
            raise LocalStackError(f"{self.name} exited with {code}:\n{self.log_tail()}")


def http_get(url: str, timeout: float = HTTP_TIMEOUT_SECONDS) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


def wait_until_ready(
    process: ManagedProcess, url: str, timeout: float = STARTUP_TIMEOUT_SECONDS
) -> None:
    """Poll `url` until it answers 200; fail early if `process` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        process.check_alive()
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise LocalStackError(
        f"{process.name} not ready at {url} after {timeout:g} s:\n{process.log_tail()}"
    )


# --- the stack ----------------------------------------------------------------------------------


class LocalStack:
    """Prometheus + Alertmanager, started by `start()` (or `with`), ended by `stop()`.

    `workdir` must exist; the stack writes its configs, storage and logs under it (the caller
    removes it). `scrape`, `webhook` and `timings` are read by `start()`, so an owner that
    learns an address late (a webhook server on port 0) may set them until then. Synchronous
    helpers (`query`, `alerts`, `am_alerts`) answer in milliseconds.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        scrape: ScrapeTargets,
        webhook: Webhook,
        timings: Timings | None = None,
        project: ProjectFiles | None = None,
        prometheus_port: int | None = None,
        alertmanager_port: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.scrape = scrape
        self.webhook = webhook
        self.timings = timings if timings is not None else Timings()
        self.project = project if project is not None else ProjectFiles.locate()
        self.prometheus_port = prometheus_port if prometheus_port is not None else free_port()
        self.alertmanager_port = alertmanager_port if alertmanager_port is not None else free_port()
        self.processes: list[ManagedProcess] = []

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes if process.started]

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Write the configs, start both processes and wait until both are ready."""
        try:
            prometheus = find_binary("prometheus")
            alertmanager = find_binary("alertmanager", "prometheus-alertmanager")
            prometheus_config, alertmanager_config = self.write_configs()
            am = self._spawn(
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
            prom = self._spawn(
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
            wait_until_ready(am, f"{self.alertmanager_url}/-/ready")
            wait_until_ready(prom, f"{self.prometheus_url}/-/ready")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Terminate both, wait, kill whatever is left. Safe to call more than once."""
        for process in self.processes:
            if process.running:
                process.signal_group(signal.SIGTERM)
        for process in self.processes:
            process.stop()

    def logs(self) -> str:
        """The tail of each process' log, for error messages."""
        return "\n".join(f"--- {process.name}\n{process.log_tail()}" for process in self.processes)

    # Prometheus and Alertmanager APIs.

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The result of an instant query: a list of {metric, value}."""
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = json.loads(http_get(url))
        if body.get("status") != "success":
            raise LocalStackError(f"query {promql!r} failed: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Prometheus' pending and firing alerts (GET /api/v1/alerts)."""
        body = json.loads(http_get(f"{self.prometheus_url}/api/v1/alerts"))
        alerts: list[dict[str, Any]] = body["data"]["alerts"]
        return alerts

    def am_alerts(self) -> list[dict[str, Any]]:
        """Alertmanager's alerts, with their receivers (GET /api/v2/alerts)."""
        alerts: list[dict[str, Any]] = json.loads(
            http_get(f"{self.alertmanager_url}/api/v2/alerts")
        )
        return alerts

    # Internals.

    def write_configs(self) -> tuple[Path, Path]:
        """Write the rewritten configs and the token file; return the two config paths."""
        config_dir = self.workdir / "config"
        config_dir.mkdir(exist_ok=True)
        prometheus_document = yaml.safe_load(self.project.prometheus_config.read_text())
        rules_by_name = rewrite_rule_files(
            {
                name: yaml.safe_load((self.project.prometheus_dir / name).read_text())
                for name in prometheus_document["rule_files"]
            },
            self.timings.alert_for,
        )
        rule_files = []
        for name, rules in rules_by_name.items():
            path = config_dir / Path(name).name
            path.write_text(yaml.safe_dump(rules, sort_keys=False))
            rule_files.append(str(path))
        prometheus_config = config_dir / "prometheus.yml"
        prometheus_config.write_text(
            yaml.safe_dump(
                rewrite_prometheus_config(
                    prometheus_document,
                    interval=self.timings.interval,
                    rule_files=rule_files,
                    targets_by_job={
                        PROMETHEUS_JOB: f"127.0.0.1:{self.prometheus_port}",
                        EXPORTER_JOB: self.scrape.exporter,
                        RESTARTER_JOB: self.scrape.restarter,
                    },
                    alertmanager_address=f"127.0.0.1:{self.alertmanager_port}",
                ),
                sort_keys=False,
            )
        )
        token_file = config_dir / "alertmanager-restarter-token"
        token_file.touch(mode=0o600)
        token_file.write_text(self.webhook.token + "\n")
        alertmanager_config = config_dir / "alertmanager.yml"
        alertmanager_document = yaml.safe_load(self.project.alertmanager_config.read_text())
        alertmanager_config.write_text(
            yaml.safe_dump(
                rewrite_alertmanager_config(
                    alertmanager_document,
                    route_timers=self.timings.route_timers,
                    webhook_url=self.webhook.url,
                    credentials_file=str(token_file),
                ),
                sort_keys=False,
            )
        )
        return prometheus_config, alertmanager_config

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        process = ManagedProcess(name, argv, self.workdir / f"{name}.log", cwd=self.workdir)
        self.processes.append(process)
        return process.start()

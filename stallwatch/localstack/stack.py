"""`LocalStack`: Prometheus and Alertmanager started on loopback with the rewritten configs."""

from __future__ import annotations

import json
import signal
import urllib.parse
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from stallwatch.localstack.errors import LocalStackError
from stallwatch.localstack.processes import (
    ManagedProcess,
    find_binary,
    free_port,
    http_get,
    wait_until_ready,
)
from stallwatch.localstack.rewrite import (
    EXPORTER_JOB,
    PROMETHEUS_JOB,
    RESTARTER_JOB,
    ProjectFiles,
    ScrapeTargets,
    Timings,
    Webhook,
    rewrite_alertmanager_config,
    rewrite_prometheus_config,
    rewrite_rule_files,
)

START_ATTEMPTS = 3
ADDRESS_IN_USE = "address already in use"


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
        self._ports_chosen_here = prometheus_port is None and alertmanager_port is None
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
        """Write the configs, start both processes and wait until both are ready.

        Ports this stack chose itself are chosen again if another process took one first.
        """
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_once()
                return
            except BaseException as error:
                self._stop_processes()
                lost_a_port = isinstance(error, LocalStackError) and ADDRESS_IN_USE in str(error)
                if not (lost_a_port and self._ports_chosen_here and attempt < START_ATTEMPTS):
                    self.stop()
                    raise
                self.processes = []
                self.prometheus_port, self.alertmanager_port = free_port(), free_port()

    def _start_once(self) -> None:
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

    def stop(self) -> None:
        """Terminate both, wait, kill whatever is left. Safe to call more than once."""
        self._stop_processes()

    def _stop_processes(self) -> None:
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

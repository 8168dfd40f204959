"""A stack for fleet mode: Prometheus runs the shipped `/probe` jobs (file_sd, hashmod shards).

`FleetStack` is the harness' stack with the scrape jobs of `prometheus/probe-file-sd.yml` and
`prometheus/probe-sharded.yml` added, rewritten only in addresses and timing: the discovery
files point into the stack's workdir (`sd_file` for the single exporter, `shard_sd_file` for the
two shards), the exporter address of each job to a loopback port, and the scrape timeout to the
1 s interval. Alertmanager's restarter webhook points at the real restarter's port. A second
Prometheus with the same config can be started for the HA pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import yaml

from stallwatch.common.exporter_config import ExporterConfig, exporter_config_from_mapping
from stallwatch.exporter.app import running_exporter
from stallwatch.exporter.service import ExporterService
from stallwatch.localstack.processes import find_binary, free_port, http_get, wait_until_ready
from tests.support.alerting_stack import WEBHOOK_PATH, AlertingStack, RecordingReceiver

PROBE_JOB = "stallwatch-exporter-probe"
SHARD_JOBS = ("stallwatch-exporter-probe-shard-0", "stallwatch-exporter-probe-shard-1")
SD_REFRESH = "5s"
MODULE = "vllm"


class RestarterWebhook(RecordingReceiver):
    """Gives Alertmanager the real restarter's webhook URL instead of the recording server's."""

    def __init__(self, token: str, url: str) -> None:
        super().__init__(token)
        self._restarter_url = url

    @property
    def url(self) -> str:
        return self._restarter_url


def _job(document: dict[str, Any], name: str) -> dict[str, Any]:
    for job in document["scrape_configs"]:
        if job["job_name"] == name:
            return dict(job)
    raise AssertionError(f"no scrape job {name} in the shipped file")


def rewrite_probe_job(job: dict[str, Any], sd_file: Path, exporter: str) -> dict[str, Any]:
    """The shipped job with its discovery file, exporter address and timeout made local."""
    relabels = []
    exporters = 0
    for rule in job["relabel_configs"]:
        if rule.get("target_label") == "__address__" and "replacement" in rule:
            rule = {**rule, "replacement": exporter}
            exporters += 1
        relabels.append(rule)
    assert exporters == 1, job
    (sd,) = job["file_sd_configs"]
    return {
        **job,
        "scrape_timeout": "1s",
        "file_sd_configs": [{**sd, "files": [str(sd_file)], "refresh_interval": SD_REFRESH}],
        "relabel_configs": relabels,
    }


class FleetStack(AlertingStack):
    """The harness' stack plus the shipped `/probe` jobs and a webhook to the real restarter."""

    def __init__(self, workdir: Path, repo: Path) -> None:
        super().__init__(workdir, repo)
        self.receiver = RestarterWebhook(
            self.token, f"http://{self.restarter_address}{WEBHOOK_PATH}"
        )
        self.repo = repo
        sd_dir = workdir / "sd"
        sd_dir.mkdir(exist_ok=True)
        self.sd_file = sd_dir / "servers.yml"
        self.shard_sd_file = sd_dir / "shard-servers.yml"
        self.shard_ports = (free_port(), free_port())
        self.second_prometheus_port = free_port()
        write_sd(self.sd_file, [])
        write_sd(self.shard_sd_file, [])

    def write_configs(self) -> tuple[Path, Path]:
        prometheus_config, alertmanager_config = super().write_configs()
        written = yaml.safe_load(prometheus_config.read_text())
        single = yaml.safe_load((self.repo / "prometheus" / "probe-file-sd.yml").read_text())
        sharded = yaml.safe_load((self.repo / "prometheus" / "probe-sharded.yml").read_text())
        written["scrape_configs"] += [
            rewrite_probe_job(_job(single, PROBE_JOB), self.sd_file, self.exporter_address),
            *(
                rewrite_probe_job(_job(sharded, name), self.shard_sd_file, f"127.0.0.1:{port}")
                for name, port in zip(SHARD_JOBS, self.shard_ports, strict=True)
            ),
        ]
        prometheus_config.write_text(yaml.safe_dump(written, sort_keys=False))
        return prometheus_config, alertmanager_config

    @property
    def second_prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.second_prometheus_port}"

    def start_second_prometheus(self) -> None:
        """A second Prometheus with the same config (an HA pair), stopped with the stack."""
        config = self.workdir / "config" / "prometheus.yml"
        process = self._spawn(
            "prometheus-2",
            [
                find_binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'prometheus-2-data'}",
                f"--web.listen-address=127.0.0.1:{self.second_prometheus_port}",
                "--log.level=warn",
            ],
        )
        wait_until_ready(process, f"{self.second_prometheus_url}/-/ready")

    def query_second(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.second_prometheus_url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        result: list[dict[str, Any]] = json.loads(http_get(url))["data"]["result"]
        return result


def write_sd(path: Path, addresses: Iterable[str]) -> None:
    """Write a file_sd file atomically (Prometheus may read it at any moment)."""
    document = [{"targets": sorted(addresses), "labels": {"fleet": "e2e"}}]
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(document))  # JSON is YAML
    temporary.replace(path)


def fleet_config(port: int, *, test_request: dict[str, Any] | None = None) -> ExporterConfig:
    """An exporter with only a module, allowed to read loopback, at the stack's 1 s interval."""
    module: dict[str, Any] = {"allow": ["127.0.0.1"], "interval": "1s", "timeout": "500ms"}
    if test_request is not None:
        module["test_request"] = test_request
    return exporter_config_from_mapping(
        {"listen": f"127.0.0.1:{port}", "modules": {MODULE: module}}, "exporter.yml"
    )


@contextlib.asynccontextmanager
async def fleet_exporter(
    port: int, *, test_request: dict[str, Any] | None = None
) -> AsyncIterator[ExporterService]:
    """The real exporter, in this event loop, with the module, on `port`."""
    config = fleet_config(port, test_request=test_request)
    async with running_exporter(config, Path("exporter.yml"), port=port) as (service, _url):
        yield service


async def wait_gone(stack: AlertingStack, promql: str, timeout: float) -> None:
    """Until `promql` has no result."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await asyncio.to_thread(stack.query, promql):
        if loop.time() > deadline:
            raise AssertionError(f"{promql} still has a result after {timeout} s")
        await asyncio.sleep(0.2)

"""Helpers for the pipeline scenarios: the real exporter on the stack's port, Prometheus checks.

The negative scenarios ("fires nothing") rest on three helpers:

- `rules_evaluated_after(stack, moment)` waits until Prometheus has evaluated the target
  rules after `moment`, so the last scraped samples have gone through the rules;
- `restart_alerts_over_window(stack, target)` reads every LLMServerStuck, LLMServerHung or
  LLMServerUnresponsive series of the target, pending or firing, over the last two minutes
  (`max_over_time(ALERTS{...}[2m])`), so an alert that came and went is caught;
- `state_samples(stack, target, state)` counts the scrapes that saw the target in a state,
  which proves Prometheus saw the scenario the test set up.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from stallwatch.common.exporter_config import ExporterConfig, IdleTestRequestConfig, TargetConfig
from stallwatch.core.classify import State
from stallwatch.core.history import TargetHistory
from stallwatch.exporter.app import running_exporter
from stallwatch.exporter.service import ExporterService
from tests.support.alerting_stack import HTTP_TIMEOUT_SECONDS, AlertingStack, poll
from tests.support.exporter import record_histories

POLL_INTERVAL = 0.5
TIMEOUT = 30.0
RESTART_ALERTS = "LLMServerStuck|LLMServerUnresponsive|LLMServerHung"
TARGET_RULE_GROUP = "stallwatch-targets"
WINDOW = "2m"


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def target(name: str, url: str, interval: float = POLL_INTERVAL) -> TargetConfig:
    """A target polled every `interval` seconds, with a short idle test request timeout."""
    return TargetConfig(
        name=name,
        url=url,
        interval_seconds=interval,
        timeout_seconds=min(interval, 1.0),
        test_request=IdleTestRequestConfig(timeout_seconds=0.5),
    )


@contextlib.asynccontextmanager
async def exporter_on_stack(
    stack: AlertingStack, *targets: TargetConfig
) -> AsyncIterator[ExporterService]:
    """The real exporter, in this event loop, on the port the stack scrapes."""
    config = ExporterConfig(
        targets=targets, listen_host="127.0.0.1", listen_port=stack.exporter_port
    )
    async with running_exporter(
        config, Path("exporter.yml"), host="127.0.0.1", port=stack.exporter_port
    ) as (service, _url):
        yield service


def restart_alerts_over_window(stack: AlertingStack, target_name: str) -> list[str]:
    """Every restart alert of the target, pending or firing, seen in the last two minutes."""
    result = stack.query(
        f'max_over_time(ALERTS{{alertname=~"{RESTART_ALERTS}",target="{target_name}"}}[{WINDOW}])'
    )
    return sorted(
        f"{series['metric']['alertname']} {series['metric']['alertstate']}" for series in result
    )


def state_samples(stack: AlertingStack, target_name: str, state: str) -> int:
    """How many scrapes in the last two minutes saw the target in `state`."""
    result = stack.query(
        f'sum_over_time(stallwatch_target_state{{target="{target_name}",state="{state}"}}'
        f"[{WINDOW}])"
    )
    return int(float(result[0]["value"][1])) if result else 0


async def seen_in_state(stack: AlertingStack, target_name: str, state: str) -> None:
    """Wait until Prometheus has scraped the target in `state`."""
    await stack.wait_for_query(
        f'stallwatch_target_state{{target="{target_name}",state="{state}"}} == 1', TIMEOUT
    )


def _last_evaluation(stack: AlertingStack, group_name: str) -> float:
    url = f"{stack.prometheus_url}/api/v1/rules?type=alert"
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response:
        body = json.load(response)
    for group in body["data"]["groups"]:
        if group["name"] == group_name:
            stamp = datetime.datetime.fromisoformat(group["lastEvaluation"])
            return stamp.timestamp()
    raise AssertionError(f"Prometheus has no rule group {group_name}")


async def rules_evaluated_after(stack: AlertingStack, moment: float) -> None:
    """Wait until the target rules were evaluated twice after `moment` (unix time).

    Two evaluations: the first may have started before the last scrape was stored.
    """
    first = await poll(
        lambda: _evaluated_after(stack, moment), TIMEOUT, "a rule evaluation after the scenario"
    )
    await poll(lambda: _evaluated_after(stack, first), TIMEOUT, "a second rule evaluation")


async def _evaluated_after(stack: AlertingStack, moment: float) -> float | None:
    evaluated = await asyncio.to_thread(_last_evaluation, stack, TARGET_RULE_GROUP)
    return evaluated if evaluated > moment else None


def notifications_about(stack: AlertingStack, target_name: str) -> list[str]:
    """Every alert the recording receiver got for the target, as "alertname status"."""
    return [
        f"{alert['labels'].get('alertname')} {alert.get('status')}"
        for notification in stack.receiver.notifications
        for alert in notification.payload.get("alerts", [])
        if alert.get("labels", {}).get("target") == target_name
    ]


async def record_polls(
    service: ExporterService, name: str, until: Callable[[TargetHistory], bool], timeout: float
) -> list[tuple[State | None, int]]:
    """Every (state, state_polls) the exporter reports for `name`, one per poll, until `until`."""
    polls = await record_histories(service, name, until=until, timeout=timeout)
    return [(current.state, current.state_polls) for current in polls]


@dataclass
class Restarter:
    """A `stallwatch restarter` subprocess and how to read it."""

    process: asyncio.subprocess.Process
    url: str
    token: str
    log: Path

    async def journal(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with session.get(self.url + "/journal?limit=1000", headers=headers) as response:
            assert response.status == 200, await response.text()
            entries: list[dict[str, Any]] = (await response.json())["entries"]
            return entries[::-1]  # oldest first

    async def metrics(self, session: aiohttp.ClientSession) -> str:
        async with session.get(self.url + "/metrics") as response:
            assert response.status == 200
            return await response.text()

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


@contextlib.asynccontextmanager
async def restarter_process(
    config: dict[str, Any], workdir: Path, *, url: str, token: str, timeout: float
) -> AsyncIterator[Restarter]:
    """`stallwatch restarter --config FILE` with `config`, healthy at `url`, stopped at the end."""
    config_file = workdir / "restarter.yml"
    config_file.write_text(json.dumps(config))  # JSON is YAML
    log = workdir / "restarter.log"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "stallwatch", "restarter", "--config", str(config_file)),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    restarter = Restarter(process, url, token, log)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:

            async def healthy() -> bool | None:
                assert process.returncode is None, f"the restarter exited:\n{restarter.log_tail()}"
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(restarter.url + "/-/healthy") as response:
                        return response.status == 200 or None
                return None

            await poll(healthy, timeout, "the restarter's /-/healthy")
        yield restarter
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()

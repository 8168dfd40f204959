"""The restarter in tests: a fake vLLM /metrics, configs, alert payloads, a running restarter."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from stallwatch.common.config_files import load_restarter_config as load_config
from stallwatch.common.restarter_config import RestarterConfig
from stallwatch.core.alerts import Alert
from stallwatch.restarter.app import RESTARTER_KEY, Restarter, build_app
from stallwatch.restarter.journal import Journal

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STARTS_AT = "2026-11-30T05:29:50.914142978Z"

# The lines of a real vLLM 0.32 payload that the decision reads
# (from fixtures/real-metrics/vllm-0.32.0-cpu-busy-1.txt).
METRICS_TEMPLATE = """\
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.79601717646e+09
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} 0.003296300817970943
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="tiny"}} 6086.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {generated}
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="length",model_name="tiny"}} 4.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_count{{engine="0",model_name="tiny"}} {steps}
"""


class FakeVllm:
    """A vLLM-like /metrics whose behaviour a test sets: stalled, progress, idle or down."""

    def __init__(self, mode: str = "stalled") -> None:
        self.mode = mode
        self.reads = 0
        self._counter = itertools.count(1)  # a first read in progress mode has moved already
        self.app = web.Application()
        self.app.router.add_get("/metrics", self.metrics)
        self.server = TestServer(self.app, host="127.0.0.1")

    async def metrics(self, request: web.Request) -> web.Response:
        self.reads += 1
        if self.mode == "down":
            return web.Response(status=503, text="engine dead")
        moved = next(self._counter) if self.mode == "progress" else 0
        running = "0.0" if self.mode == "idle" else "4.0"
        text = METRICS_TEMPLATE.format(
            running=running, generated=2730.0 + moved, steps=690.0 + moved
        )
        return web.Response(text=text, content_type="text/plain")

    @property
    def url(self) -> str:
        return str(self.server.make_url("/metrics"))


@contextlib.asynccontextmanager
async def fake_vllm(mode: str = "stalled") -> AsyncIterator[FakeVllm]:
    fake = FakeVllm(mode)
    await fake.server.start_server()
    try:
        yield fake
    finally:
        await fake.server.close()


def marker_argv(marker: Path) -> list[str]:
    """A command action that appends $STALLWATCH_TARGET to `marker` (one line per run)."""
    code = (
        "import os, sys\n"
        "with open(sys.argv[1], 'a') as f: f.write(os.environ['STALLWATCH_TARGET'] + '\\n')\n"
    )
    return [sys.executable, "-c", code, str(marker)]


def target_entry(
    name: str, metrics_url: str, action: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return {"name": name, "metrics_url": metrics_url, "action": action, **extra}


def write_config(tmp_path: Path, targets: list[dict[str, Any]], **top: Any) -> RestarterConfig:
    """Write a restarter.yml with short test intervals and load it as the CLI would."""
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "token").chmod(0o600)  # the restarter refuses a token others can read
    document: dict[str, Any] = {
        "token_file": "token",
        "journal": "journal.sqlite",
        "confirm": {"gap": "1s", "timeout": "2s"},
        # No restart window unless a test asks for one: these tests are about what comes after.
        "restart_after": "0s",
        "targets": targets,
    }
    document.update(top)
    path = tmp_path / "restarter.yml"
    path.write_text(yaml.safe_dump(document))
    return load_config(path)


def alert(
    target: str | None = "gpu1",
    *,
    alertname: str = "LLMServerStuck",
    status: str = "firing",
    fingerprint: str = "1a2b3c4d5e6f7a8b",
    starts_at: str = STARTS_AT,
) -> dict[str, Any]:
    labels = {"alertname": alertname, "severity": "critical"}
    if target is not None:
        labels["target"] = target
    return {
        "status": status,
        "labels": labels,
        "annotations": {"summary": "stuck"},
        "startsAt": starts_at,
        "endsAt": "2026-11-30T05:33:50.914Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fingerprint,
    }


def payload(
    *alerts: dict[str, Any],
    receiver: str = "restarter",
    external_url: str = "http://alertmanager-a:9093",
) -> dict[str, Any]:
    first_labels = alerts[0]["labels"] if alerts else {}
    return {
        "receiver": receiver,
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "alerts": list(alerts),
        "groupLabels": {"alertname": first_labels.get("alertname", "")},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": external_url,
        "version": "4",
        "groupKey": '{}:{alertname="LLMServerStuck"}',
        "truncatedAlerts": 0,
    }


@contextlib.asynccontextmanager
async def running_restarter(
    config: RestarterConfig,
) -> AsyncIterator[tuple[TestClient[Any, Any], Restarter]]:
    """The restarter app on a loopback port, with a client; cleaned up afterwards."""
    app = build_app(config)
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield client, app[RESTARTER_KEY]
    finally:
        await client.close()


async def post_alerts(client: TestClient[Any, Any], body: dict[str, Any]) -> dict[str, Any]:
    """POST a payload with the right token; return the JSON answer (status must be 200)."""
    response = await client.post("/alerts", json=body, headers=AUTH)
    assert response.status == 200, await response.text()
    answer: dict[str, Any] = await response.json()
    return answer


def marker_lines(marker: Path) -> list[str]:
    return marker.read_text().splitlines() if marker.exists() else []


async def settle(restarter: Restarter) -> None:
    """Let background actions finish and journal their results."""
    await asyncio.wait_for(restarter.wait_for_actions(), timeout=30)


def command_target(name: str, url: str, marker: Path, **extra: Any) -> dict[str, Any]:
    return target_entry(name, url, {"kind": "command", "argv": marker_argv(marker)}, **extra)


def damage(journal: Path) -> None:
    """Overwrite the pages after the first two with garbage, as a bad disk would."""
    data = bytearray(journal.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[2 * page :] = b"\xa5" * (len(data) - 2 * page)
    journal.write_bytes(bytes(data))


def filled_journal(path: Path) -> Path:
    """A journal with enough rows to span several pages, checkpointed into the main file."""
    journal = Journal.open(path)
    for index in range(400):
        journal.record_decision(alert_object(f"fp{index}"), None, 1.0e9 + index)
    journal.close()
    return path


def alert_object(fingerprint: str, status: Literal["firing", "resolved"] = "resolved") -> Alert:
    return Alert(status, {"alertname": "LLMServerStuck", "target": "gpu1"}, fingerprint, "x")

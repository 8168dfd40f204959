"""The documented bare-metal path, followed with real processes: a stuck server is restarted once.

docs/operator.md takes an operator from the install to the chain working on their own hosts.
This follows it with the repository's virtualenv as the install and only the documented files:

- the exporter and the restarter run as `stallwatch exporter` / `stallwatch restarter` processes
  of this virtualenv, with `examples/exporter.yml` and `examples/restarter.yml`;
- an operator's own Prometheus and Alertmanager configs get the entries of
  `examples/wiring/prometheus.yml` and `examples/wiring/alertmanager.yml`, added as the docs
  say (rule files copied from `prometheus/`, the routes first among the operator's routes);
- the model server is the simulator, started and restarted by
  `examples/actions/restart-process-group.sh`, as the example's command target does.

What changes is what `stallwatch.localstack.rewrite` changes for the e2e tier: addresses,
ports and paths (loopback ports, files under a temporary directory), and timing (1 s polls,
scrapes and evaluations, Alertmanager's group timers, the confirmation's gap). The targets
keep the example's names except that the exporter's one takes the restarter's target name,
the one rule the docs give for them. Nothing else is edited.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stallwatch.localstack.processes import (
    ManagedProcess,
    find_binary,
    free_port,
    wait_until_ready,
)
from stallwatch.localstack.rewrite import (
    DEFAULT_ROUTE_TIMERS,
    EXPORTER_JOB,
    RESTARTER_JOB,
    RESTARTER_RECEIVER,
    rewrite_alertmanager_config,
)
from stallwatch.simulator.load import run_load

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
WIRING = EXAMPLES / "wiring"
# The install: the `stallwatch` command of the virtualenv running these tests.
STALLWATCH = str(Path(sys.executable).parent / "stallwatch")
INTERVAL = "1s"
# The example's 5m window, scaled to 1 s polls as the intervals are.
RESTART_AFTER = "5s"
TIMEOUT = 60.0
TOKEN = "bare-metal-token-0123456789abcdef"


@dataclass(frozen=True)
class Ports:
    prometheus: int
    alertmanager: int
    exporter: int
    restarter: int
    server: int


@dataclass(frozen=True)
class Layout:
    """Where the operator's files go: /etc/... and /var/... under a temporary directory."""

    root: Path

    def path(self, name: str) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def write(path: Path, document: Any) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def private_file(path: Path, text: str) -> Path:
    path.touch(mode=0o600)
    path.write_text(text)
    return path


def server_command(ports: Ports) -> list[str]:
    return [STALLWATCH, "sim", "--port", str(ports.server)]


def restart_command(layout: Layout, ports: Ports) -> list[str]:
    """The example command target's argv: the script, its pid and log files, the server."""
    (command_target,) = [
        t for t in load(EXAMPLES / "restarter.yml")["targets"] if t["action"]["kind"] == "command"
    ]
    script, _pidfile, _logfile, *_server = command_target["action"]["argv"]
    return [
        str(EXAMPLES / script),
        str(layout.path("run/model-server.pgid")),
        str(layout.path("log/model-server.log")),
        *server_command(ports),
    ]


def write_restarter_config(layout: Layout, ports: Ports) -> tuple[Path, str]:
    """examples/restarter.yml with its command target only; addresses, paths and gap local."""
    document = load(EXAMPLES / "restarter.yml")
    (target,) = [t for t in document["targets"] if t["action"]["kind"] == "command"]
    target = {
        **target,
        "url": f"http://127.0.0.1:{ports.server}",
        "action": {**target["action"], "argv": restart_command(layout, ports)},
    }
    document.update(
        listen=f"127.0.0.1:{ports.restarter}",
        token_file=str(private_file(layout.path("etc/stallwatch/restarter.token"), TOKEN + "\n")),
        journal=str(layout.path("var/lib/stallwatch/journal.sqlite")),
        confirm={**document["confirm"], "gap": INTERVAL},
        restart_after=RESTART_AFTER,
        targets=[target],
    )
    return write(layout.path("etc/stallwatch/restarter.yml"), document), target["name"]


def write_exporter_config(layout: Layout, ports: Ports, name: str) -> Path:
    """examples/exporter.yml with its first target, named as the restarter's, on the server."""
    document = load(EXAMPLES / "exporter.yml")
    first = document["targets"][0]
    document.update(
        listen=f"127.0.0.1:{ports.exporter}",
        interval=INTERVAL,
        timeout=INTERVAL,
        targets=[{**first, "name": name, "url": f"http://127.0.0.1:{ports.server}"}],
    )
    return write(layout.path("etc/stallwatch/exporter.yml"), document)


def write_prometheus_config(layout: Layout, ports: Ports) -> Path:
    """An operator's prometheus.yml, with the snippet's rule files and scrape jobs added."""
    snippet = load(WIRING / "prometheus.yml")
    rule_files = []
    for documented in snippet["rule_files"]:  # step 1: copy the project's rules there
        copy = layout.path("etc/prometheus" + documented.removeprefix("/etc/prometheus"))
        shutil.copy(REPO / "prometheus" / Path(documented).name, copy)
        rule_files.append(str(copy))
    addresses = {EXPORTER_JOB: ports.exporter, RESTARTER_JOB: ports.restarter}
    jobs = [
        {**job, "static_configs": [{"targets": [f"127.0.0.1:{addresses[job['job_name']]}"]}]}
        for job in snippet["scrape_configs"]
    ]
    existing = {
        "global": {
            "scrape_interval": INTERVAL,
            "scrape_timeout": INTERVAL,
            "evaluation_interval": INTERVAL,
        },
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{ports.alertmanager}"]}]}
            ]
        },
        "scrape_configs": [
            {
                "job_name": "prometheus",
                "static_configs": [{"targets": [f"127.0.0.1:{ports.prometheus}"]}],
            }
        ],
    }
    existing["rule_files"] = rule_files
    existing["scrape_configs"] += jobs
    return write(layout.path("etc/prometheus/prometheus.yml"), existing)


def write_alertmanager_config(layout: Layout, ports: Ports) -> Path:
    """An operator's alertmanager.yml (one receiver for people), with the snippet's routes put
    first among its routes and its receiver added; the webhook and token file made local."""
    snippet = load(WIRING / "alertmanager.yml")
    routes = snippet["route"]["routes"]
    (receiver,) = [r for r in snippet["receivers"] if r["name"] == RESTARTER_RECEIVER]
    existing: dict[str, Any] = {
        "route": {
            "receiver": "people",
            "group_by": ["alertname"],
            "routes": [{"receiver": "people", "matchers": ['severity="critical"']}],
        },
        "receivers": [{"name": "people"}],
    }
    existing["route"]["routes"][:0] = routes
    existing["receivers"].append(receiver)
    token = private_file(layout.path("etc/alertmanager/stallwatch-restarter.token"), TOKEN + "\n")
    document = rewrite_alertmanager_config(
        existing,
        route_timers=DEFAULT_ROUTE_TIMERS,
        webhook_url=f"http://127.0.0.1:{ports.restarter}/alerts",
        credentials_file=str(token),
    )
    return write(layout.path("etc/alertmanager/alertmanager.yml"), document)


def get_json(url: str, token: str | None = None) -> Any:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=5.0) as response:
        return json.load(response)


def post_json(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5.0) as response:
        assert response.status == 200


async def wait_for(what: str, check: Any, processes: list[ManagedProcess]) -> Any:
    """Poll `check()` (run in a thread) until it returns something true; fail with the logs."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        for process in processes:
            process.check_alive()
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
            result = await asyncio.to_thread(check)
            if result:
                return result
        await asyncio.sleep(0.2)
    logs = "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in processes)
    raise AssertionError(f"not within {TIMEOUT:g} s: {what}\n{logs}")


def kill_group_in(pidfile: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.killpg(int(pidfile.read_text()), signal.SIGKILL)


@dataclass
class BareMetal:
    layout: Layout
    ports: Ports
    target: str
    processes: list[ManagedProcess]
    pidfile: Path

    @property
    def prometheus(self) -> str:
        return f"http://127.0.0.1:{self.ports.prometheus}"

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self.ports.server}"

    @property
    def restarter(self) -> str:
        return f"http://127.0.0.1:{self.ports.restarter}"

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        result: list[dict[str, Any]] = get_json(url)["data"]["result"]
        return result

    def journal(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = get_json(f"{self.restarter}/journal?limit=100", TOKEN)[
            "entries"
        ]
        return entries


@pytest.fixture
def bare_metal(tmp_path: Path) -> Iterator[BareMetal]:
    """Prometheus, Alertmanager, the model server, the exporter and the restarter, each a real
    process, configured as the operator's page says; all stopped afterwards."""
    ports = Ports(*(free_port() for _ in range(5)))
    layout = Layout(tmp_path)
    restarter_config, target = write_restarter_config(layout, ports)
    exporter_config = write_exporter_config(layout, ports, target)
    prometheus_config = write_prometheus_config(layout, ports)
    alertmanager_config = write_alertmanager_config(layout, ports)
    start_server = restart_command(layout, ports)
    pidfile = Path(start_server[1])
    processes: list[ManagedProcess] = []

    def spawn(name: str, argv: list[str], ready: str) -> None:
        process = ManagedProcess(name, argv, layout.path(f"log/{name}.log"), cwd=tmp_path)
        processes.append(process)
        process.start()
        wait_until_ready(process, ready)

    try:
        for check in (
            [STALLWATCH, "exporter", "--config", str(exporter_config), "--config.check"],
            [STALLWATCH, "restarter", "--config", str(restarter_config), "--config.check"],
        ):
            checked = subprocess.run(check, capture_output=True, text=True, timeout=60)
            assert checked.returncode == 0, checked.stdout + checked.stderr
        # The model server, started the way the restart command will start it again.
        started = subprocess.run(start_server, capture_output=True, text=True, timeout=60)
        assert started.returncode == 0, started.stdout + started.stderr
        spawn(
            "alertmanager",
            [
                find_binary("alertmanager", "prometheus-alertmanager"),
                f"--config.file={alertmanager_config}",
                f"--storage.path={layout.path('var/lib/alertmanager')}",
                f"--web.listen-address=127.0.0.1:{ports.alertmanager}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            f"http://127.0.0.1:{ports.alertmanager}/-/ready",
        )
        spawn(
            "prometheus",
            [
                find_binary("prometheus"),
                f"--config.file={prometheus_config}",
                f"--storage.tsdb.path={layout.path('var/lib/prometheus')}",
                f"--web.listen-address=127.0.0.1:{ports.prometheus}",
                "--log.level=warn",
            ],
            f"http://127.0.0.1:{ports.prometheus}/-/ready",
        )
        spawn(
            "restarter",
            [STALLWATCH, "restarter", "--config", str(restarter_config), "--log-format", "json"],
            f"http://127.0.0.1:{ports.restarter}/-/healthy",
        )
        spawn(
            "exporter",
            [STALLWATCH, "exporter", "--config", str(exporter_config), "--log-format", "json"],
            f"http://127.0.0.1:{ports.exporter}/metrics",
        )
        yield BareMetal(layout, ports, target, processes, pidfile)
    finally:
        for process in reversed(processes):
            process.stop()
        kill_group_in(pidfile)


async def test_a_stuck_server_is_restarted_once_on_the_documented_path(
    bare_metal: BareMetal,
) -> None:
    """Busy, then its engine hangs: LLMServerStuck fires in Prometheus, Alertmanager routes it
    through the snippet's route to the restarter, which confirms it and runs the example
    restart script once: a new server process answers, and the journal holds one restart."""
    target = bare_metal.target
    everything = bare_metal.processes
    await wait_for(
        "Prometheus scrapes both jobs of the snippet",
        lambda: (
            len(bare_metal.query('up{job=~"stallwatch-exporter|stallwatch-restarter"} == 1')) == 2
        ),
        everything,
    )
    first_server = int(bare_metal.pidfile.read_text())
    stop_load = asyncio.Event()
    load = asyncio.create_task(
        run_load(
            bare_metal.server,
            concurrency=4,
            prompt_tokens=32,
            max_tokens=1000,
            duration=600,
            stop=stop_load,
        )
    )
    try:
        await wait_for(
            "the exporter reads the server busy",
            lambda: bare_metal.query(
                f'stallwatch_target_state{{target="{target}",state="busy"}} == 1'
            ),
            everything,
        )
        await asyncio.to_thread(post_json, bare_metal.server + "/sim/fault", {"fault": "hang"})
        await wait_for(
            "LLMServerStuck fires",
            lambda: bare_metal.query(
                f'ALERTS{{alertname="LLMServerStuck",alertstate="firing",target="{target}"}}'
            ),
            everything,
        )
        results = await wait_for(
            "the restarter journals the restart's result",
            lambda: [e for e in bare_metal.journal() if e["decision"] == "action_result"],
            everything,
        )
    finally:
        stop_load.set()
        load.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await load
    assert [(e["target"], e["result"]) for e in results] == [(target, "success")], results
    new_server = int(bare_metal.pidfile.read_text())
    assert new_server != first_server
    health = await wait_for(
        "the new server answers",
        lambda: get_json(bare_metal.server + "/v1/models"),
        everything,
    )
    assert health["data"]
    # The episode ends: the alert resolves and the restarter hears it, having restarted once.
    await wait_for(
        "the restarter journals the resolved LLMServerStuck",
        lambda: [e for e in bare_metal.journal() if e["decision"] == "resolved"],
        everything,
    )
    journal = bare_metal.journal()
    restarts = [e for e in journal if e["decision"] == "restart"]
    assert [(e["target"], e["alertname"]) for e in restarts] == [(target, "LLMServerStuck")]
    assert [e for e in journal if e["decision"] == "action_result"] == results

"""examples/wiring/haproxy.cfg passes `haproxy -c` and asks the restarter's agent about each
server by its own name; examples/wiring/envoy-cluster.yaml is a cluster whose every endpoint's
health check asks the restarter's /routable with the endpoint's target name as its Host."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stallwatch.core.routing_answers import agent_target

REPO = Path(__file__).resolve().parents[2]
HAPROXY_CFG = REPO / "examples" / "wiring" / "haproxy.cfg"
ENVOY_CLUSTER = REPO / "examples" / "wiring" / "envoy-cluster.yaml"
SERVER_LINE = re.compile(r"^\s*server\s+(\S+)\s+\S+.*agent-send\s+\"([^\"]*)\"", re.MULTILINE)


def test_the_haproxy_example_passes_haproxy_check() -> None:
    """`haproxy -c -f examples/wiring/haproxy.cfg` says the configuration is valid."""
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.fail("haproxy is not installed; `make test` installs it (Debian package haproxy)")
    result = subprocess.run(
        [binary, "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout + result.stderr


def test_each_haproxy_server_asks_the_agent_about_itself() -> None:
    """Every server sends a newline-terminated agent line naming that server as the target,
    and the agent-check is on for all of them."""
    text = HAPROXY_CFG.read_text()
    servers = SERVER_LINE.findall(text)
    assert len(servers) == 2
    for name, line in servers:
        assert line.endswith("\\n"), line
        assert agent_target(line.removesuffix("\\n"), set()) == name
    assert re.search(r"default-server .*agent-check .*agent-addr \S+ .*agent-port 9734", text)


def envoy_cluster() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(ENVOY_CLUSTER.read_text())
    return document


def test_the_envoy_cluster_health_checks_routable_on_the_restarter() -> None:
    """The cluster's HTTP health check asks /routable, and fails open in panic (threshold > 0)."""
    cluster = envoy_cluster()
    (check,) = cluster["health_checks"]
    assert check["http_health_check"]["path"] == "/routable"
    assert "host" not in check["http_health_check"]  # each endpoint's hostname is the Host
    assert cluster["common_lb_config"]["healthy_panic_threshold"]["value"] > 0


def test_every_envoy_endpoint_names_its_target_and_the_restarter() -> None:
    """Each endpoint's health_check_config has the restarter's address and its own hostname."""
    endpoints = [
        lb["endpoint"]
        for group in envoy_cluster()["load_assignment"]["endpoints"]
        for lb in group["lb_endpoints"]
    ]
    assert len(endpoints) == 2
    hostnames = set()
    for endpoint in endpoints:
        config = endpoint["health_check_config"]
        restarter = config["address"]["socket_address"]
        assert (restarter["address"], restarter["port_value"]) == ("127.0.0.1", 9733)
        assert config["address"] != endpoint["address"]
        hostnames.add(config["hostname"])
    assert hostnames == {"gpu-a", "gpu-b"}

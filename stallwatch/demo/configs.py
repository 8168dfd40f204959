"""The demo's stack: its servers, the simulator's flags, and the configs made for them (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from stallwatch.localstack.rewrite import Timings

BATCH_TARGET = "gpu-a"
HUNG_TARGET = "gpu-b"
SERVERS = (BATCH_TARGET, HUNG_TARGET)
PROXY_TARGET = "gateway"
MODEL = "tiny"
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
# The shipped 60s is four polls of the default 15s; the demo keeps that ratio to its 1s polls,
# so an idle server's test requests are as sparse as in production, on the demo's clock.
DEMO_TEST_REQUEST_MIN_INTERVAL = "4s"


def exporter_config(
    listen: str, servers: Mapping[str, str], proxy_url: str, interval: str = "1s"
) -> dict[str, Any]:
    """The exporter's config: each server read directly, the proxy as `kind: proxy`."""
    return {
        "listen": listen,
        "interval": interval,
        "timeout": "800ms",
        "test_request": {
            "enabled": True,
            "endpoint": "completions",
            "timeout": "2s",
            "min_interval": DEMO_TEST_REQUEST_MIN_INTERVAL,
        },
        "targets": [
            *({"name": name, "url": url} for name, url in servers.items()),
            {"name": PROXY_TARGET, "url": proxy_url, "kind": "proxy"},
        ],
    }


# How long the demo's restarter must itself see a stall before it restarts: the shipped 5m
# shortened for the demo's 1 s polls, still longer than act 2's silence.
DEMO_RESTART_AFTER = "10s"


def restarter_config(
    listen: str,
    token_file: Path,
    journal: Path,
    servers: Mapping[str, str],
    action_argv: Sequence[str],
    agent_listen: str,
) -> dict[str, Any]:
    """The restarter's config: every server with the same command action (the demo's supervisor).

    Cooldown, budget and fleet limits keep their defaults; the confirmation gap and the restart
    window are short, in step with the demo's 1 s polls (a model server keeps the 5 m default).
    A quarantined server is looked at every second, and HAProxy's agent-check asks the
    restarter on `agent_listen`.
    """
    return {
        "listen": listen,
        "token_file": str(token_file),
        "journal": str(journal),
        "restart_alerts": list(RESTART_ALERTS),
        "confirm": {"gap": "1s", "timeout": "1s"},
        "restart_after": DEMO_RESTART_AFTER,
        "quarantine": {"agent_listen": agent_listen, "check_interval": "1s"},
        "targets": [
            {
                "name": name,
                "url": url,
                "action": {"kind": "command", "argv": list(action_argv)},
                "action_timeout": "60s",
            }
            for name, url in servers.items()
        ],
    }

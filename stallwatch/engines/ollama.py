"""Ollama (to v0.33): no Prometheus endpoint, so stallwatch can only say it has no metrics.

Read in ollama/ollama `server/routes.go` (v0.33.0-rc2): no `/metrics` route. Such a server
reads `no_metrics` and is never restarted on stallwatch's evidence.
"""

from __future__ import annotations

from stallwatch.engines.profile import Endpoint, EngineProfile

PROFILE = EngineProfile(
    kind="ollama",
    title="Ollama",
    series={},
    stall_unprovable="Ollama publishes no metrics",
    safe_endpoints=(
        Endpoint("GET", "/", '"Ollama is running"'),
        Endpoint("GET", "/api/version", "version only"),
        Endpoint("GET", "/api/ps", "loaded models"),
        Endpoint("GET", "/v1/models", "model list"),
    ),
    flat_while_legit="everything (no metrics)",
    restart_signal="none",
)

"""The project's Prometheus and Alertmanager files, and their rewrite for a local stack (pure).

The rewrite changes only timing and addresses, never logic: every expression, label,
annotation, route and receiver stays as written. A scrape job, receiver or alert that it names
but the project's files no longer define is a LocalStackError, never a silent skip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from stallwatch.localstack.errors import LocalStackError, ProjectFilesNotFoundError

EXPORTER_JOB = "stallwatch-exporter"
RESTARTER_JOB = "stallwatch-restarter"
PROMETHEUS_JOB = "prometheus"
RESTARTER_RECEIVER = "stallwatch-restarter"


DEFAULT_ALERT_FOR: Mapping[str, str] = MappingProxyType(
    {"LLMServerDown": "3s", "StallwatchExporterDown": "2s"}
)
DEFAULT_ROUTE_TIMERS: Mapping[str, str] = MappingProxyType(
    {"group_wait": "0s", "group_interval": "1s"}
)


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
        files = cls(root if root is not None else Path(__file__).resolve().parents[2])
        missing = [str(path) for path in files.required if not path.is_file()]
        if missing:
            raise ProjectFilesNotFoundError(
                "the project's Prometheus and Alertmanager files were not found: "
                + ", ".join(missing)
                + ". Run this from a source checkout of stallwatch (`make demo`), where "
                "prometheus/ and alertmanager/ sit next to the stallwatch/ package."
            )
        return files


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

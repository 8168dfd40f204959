"""Watches the running pipeline and tells the story: state changes, test requests, alerts, restarts.

Reads the exporter's /metrics (pure parsing here too), Prometheus' and Alertmanager's alerts,
and the restarter's journal, and keeps a tally per target for the summary.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.demo.configs import (
    DEMO_TIMINGS,
    HUNG_TARGET,
    PROXY_TARGET,
    RESTART_ALERTS,
    SERVERS,
)
from stallwatch.demo.errors import DemoError
from stallwatch.demo.summary import TargetTally
from stallwatch.demo.timeline import Timeline
from stallwatch.localstack.stack import LocalStack

WORK_STATES = frozenset({"busy", "stalled", "unknown"})
SAMPLE_SECONDS = 0.25


@dataclass(frozen=True)
class TargetView:
    """What the exporter's /metrics says about one target."""

    state: str | None = None
    state_polls: int = 0
    polls: int = 0
    test_requests: int = 0
    up: bool = False
    running: float | None = None
    waiting: float | None = None
    steps_per_second: float | None = None
    tokens_per_second: float | None = None
    restarts_detected: int = 0


def parse_exporter_metrics(text: str) -> dict[str, TargetView]:
    """Per-target views from an exporter /metrics body."""
    fields: dict[str, dict[str, Any]] = {}
    scalar: dict[str, tuple[str, Callable[[float], Any]]] = {
        "stallwatch_target_state_polls": ("state_polls", int),
        "stallwatch_polls_total": ("polls", int),
        "stallwatch_test_requests_total": ("test_requests", int),
        "stallwatch_target_up": ("up", lambda v: v == 1),
        "stallwatch_requests_running": ("running", float),
        "stallwatch_requests_waiting": ("waiting", float),
        "stallwatch_engine_steps_per_second": ("steps_per_second", float),
        "stallwatch_generation_tokens_per_second": ("tokens_per_second", float),
        "stallwatch_restarts_detected_total": ("restarts_detected", int),
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            target = sample.labels.get("target")
            if target is None:
                continue
            view = fields.setdefault(target, {})
            if sample.name == "stallwatch_target_state":
                if sample.value == 1:
                    view["state"] = sample.labels.get("state")
            elif sample.name in scalar:
                name, convert = scalar[sample.name]
                view[name] = convert(sample.value)
    return {target: TargetView(**values) for target, values in fields.items()}


def requests_sent_while_busy(previous: TargetView, current: TargetView) -> tuple[int, int]:
    """(test requests sent, of which while the target had work) between two exporter reads.

    The exporter sends a test request only in a poll whose result is idle or unresponsive, so a
    request counted in a poll that read busy, stalled or unknown was sent to a server with
    work. When more than one poll happened between the two reads, a request counts as sent
    while busy only if both reads show work (then every poll in between did too: a server
    leaving work is first read idle from its completions, which sends nothing).
    """
    sent = max(0, current.test_requests - previous.test_requests)
    if sent == 0:
        return 0, 0
    polls = current.polls - previous.polls
    current_work = current.state in WORK_STATES
    if polls <= 1:
        return sent, sent if current_work else 0
    return sent, sent if current_work and previous.state in WORK_STATES else 0


class Observer:
    """Samples the exporter, Prometheus, Alertmanager and the restarter's journal; tells the story.

    Every SAMPLE_SECONDS: state changes per target and test requests (exporter /metrics),
    alerts pending, firing and resolved (Prometheus /api/v1/alerts), their routing
    (Alertmanager /api/v2/alerts), and the restarter's decisions (GET /journal).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        timeline: Timeline,
        stack: LocalStack,
        exporter_url: str,
        restarter_url: str,
        restarter_token: str,
    ) -> None:
        self.session = session
        self.timeline = timeline
        self.stack = stack
        self.exporter_url = exporter_url
        self.restarter_url = restarter_url
        self.restarter_token = restarter_token
        self.tallies: dict[str, TargetTally] = {name: TargetTally(name, "vllm") for name in SERVERS}
        self.tallies[PROXY_TARGET] = TargetTally(PROXY_TARGET, "proxy")
        self.views: dict[str, TargetView] = {}
        self.firing: dict[tuple[str, str], str] = {}  # (alertname, target) -> state
        self.routed: set[tuple[str, str, str]] = set()
        self.journal_seen = 0
        self.journal_entries: list[dict[str, Any]] = []
        self.last_sample = time.monotonic()

    async def run(self, heartbeat_seconds: float = 0.0) -> None:
        next_heartbeat = time.monotonic() + heartbeat_seconds
        while True:
            await self.sample()
            if heartbeat_seconds and time.monotonic() >= next_heartbeat:
                self.heartbeat()
                next_heartbeat += heartbeat_seconds
            await asyncio.sleep(SAMPLE_SECONDS)

    def heartbeat(self) -> None:
        """One status line: each server's state and the test requests sent to it."""
        parts = []
        for name in SERVERS:
            tally = self.tallies[name]
            view = self.views.get(name)
            polls = f" for {view.state_polls} polls" if view is not None else ""
            parts.append(
                f"{name} {tally.state}{polls}, {tally.test_requests} test requests "
                f"({tally.requests_sent_while_busy} while busy)"
            )
        self.timeline.emit("status", "; ".join(parts))

    async def sample(self) -> None:
        views, alerts, am_alerts, journal = await asyncio.gather(
            self._exporter(), self._prometheus(), self._alertmanager(), self._journal()
        )
        now = time.monotonic()
        if views is not None:
            self._on_views(views, now)
        if alerts is not None:
            self._on_alerts(alerts, now)
        if am_alerts is not None:
            self._on_am_alerts(am_alerts)
        if journal is not None:
            self._on_journal(journal, now)
        self.last_sample = now

    # Sources (None when one does not answer, e.g. while it starts).

    async def _exporter(self) -> dict[str, TargetView] | None:
        try:
            async with self.session.get(f"{self.exporter_url}/metrics") as response:
                if response.status != 200:
                    return None
                return parse_exporter_metrics(await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def _prometheus(self) -> list[dict[str, Any]] | None:
        return await self._get_json(f"{self.stack.prometheus_url}/api/v1/alerts", "data", "alerts")

    async def _alertmanager(self) -> list[dict[str, Any]] | None:
        return await self._get_json(f"{self.stack.alertmanager_url}/api/v2/alerts")

    async def _journal(self) -> list[dict[str, Any]] | None:
        return await self._get_json(
            f"{self.restarter_url}/journal?limit=200",
            "entries",
            headers={"Authorization": f"Bearer {self.restarter_token}"},
        )

    async def _get_json(
        self, url: str, *path: str, headers: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]] | None:
        try:
            async with self.session.get(url, headers=headers) as response:
                if response.status != 200:
                    return None
                body: Any = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        for key in path:
            if not isinstance(body, dict):
                return None
            body = body.get(key)
        return body if isinstance(body, list) else None

    # Events.

    def _on_views(self, views: dict[str, TargetView], now: float) -> None:
        for name, view in views.items():
            tally = self.tallies.get(name)
            if tally is None or view.state is None:
                continue
            previous = self.views.get(name)
            if tally.state == "busy":
                tally.busy_seconds += now - self.last_sample
            if previous is not None:
                sent, while_busy = requests_sent_while_busy(previous, view)
                tally.test_requests += sent
                tally.requests_sent_while_busy += while_busy
                if while_busy:
                    self.timeline.emit(
                        name,
                        f"TEST REQUEST SENT WHILE {view.state.upper()}: {while_busy}",
                        "problem",
                    )
                elif sent and tally.requests_in_run == 0 and view.state is not None:
                    self.timeline.emit(
                        name,
                        f"test request sent (max_tokens 1): read {view.state}, no work "
                        "in flight, nothing completed",
                    )
                tally.requests_in_run += sent
                new_processes = view.restarts_detected - previous.restarts_detected
                if new_processes > 0:
                    tally.new_processes_seen += new_processes
                    self.timeline.emit(name, "exporter: a new process (counters started over)")
            if view.state != tally.state:
                self._on_state_change(tally, previous, view, now)
            self.views[name] = view

    def _on_state_change(
        self, tally: TargetTally, previous: TargetView | None, view: TargetView, now: float
    ) -> None:
        assert view.state is not None
        before = tally.state or "-"
        run = ""
        if tally.state is not None:
            run = f" after {now - tally.state_since:.0f} s"
            if tally.requests_in_run:
                run += f", {tally.requests_in_run} test requests"
            elif tally.state in WORK_STATES:
                run += ", 0 test requests"
        detail = describe_view(view)
        if tally.kind == "proxy" and view.state == "no_metrics":
            detail = " (a proxy: checked through /v1/models only, never restarted)"
        tone = "problem" if view.state in ("stalled", "unresponsive", "down") else ""
        self.timeline.emit(tally.name, f"{before} → {view.state}{run}{detail}", tone)
        if view.state == "stalled":
            tally.stalls_detected += 1
        tally.state = view.state
        tally.state_since = now
        tally.requests_in_run = 0

    def _on_alerts(self, alerts: list[dict[str, Any]], now: float) -> None:
        current: dict[tuple[str, str], str] = {}
        values: dict[tuple[str, str], str] = {}
        for alert in alerts:
            labels = alert.get("labels", {})
            key = (str(labels.get("alertname", "")), str(labels.get("target", "")))
            current[key] = str(alert.get("state", ""))
            values[key] = str(alert.get("value", ""))
        for key, state in current.items():
            if self.firing.get(key) == state:
                continue
            alertname, target = key
            value = values[key]
            suffix = f" (value {float(value):g})" if _is_number(value) else ""
            if state == "pending" and alertname in DEMO_TIMINGS.alert_for:
                suffix += f", fires after {DEMO_TIMINGS.alert_for[alertname]}"
            self.timeline.emit("prometheus", f"{alertname} {state} for {target}{suffix}", "alert")
            tally = self.tallies.get(target)
            if state == "firing" and tally is not None and alertname in RESTART_ALERTS:
                tally.stuck_alerts += 1
                if tally.alert_fired_at is None:
                    tally.alert_fired_at = now
        for key in set(self.firing) - set(current):
            alertname, target = key
            self.timeline.emit("prometheus", f"{alertname} resolved for {target}", "good")
            tally = self.tallies.get(target)
            if tally is not None and alertname in RESTART_ALERTS and tally.resolved_at is None:
                tally.resolved_at = now
        self.firing = current

    def _on_am_alerts(self, alerts: list[dict[str, Any]]) -> None:
        for alert in alerts:
            labels = alert.get("labels", {})
            key = (
                str(labels.get("alertname", "")),
                str(labels.get("target", "")),
                str(alert.get("startsAt", "")),
            )
            if key in self.routed or alert.get("status", {}).get("state") != "active":
                continue
            self.routed.add(key)
            receivers = ", ".join(str(r.get("name")) for r in alert.get("receivers", []))
            self.timeline.emit("alertmanager", f"{key[0]} for {key[1]} → {receivers}", "alert")

    def _on_journal(self, entries: list[dict[str, Any]], now: float) -> None:
        for entry in sorted(entries, key=lambda e: int(e.get("id", 0))):
            if int(entry.get("id", 0)) <= self.journal_seen:
                continue
            self.journal_seen = int(entry["id"])
            self.journal_entries.append(entry)
            target = str(entry.get("target", ""))
            tally = self.tallies.get(target)
            decision = entry.get("decision")
            alertname = entry.get("alertname", "")
            detail = str(entry.get("detail", "")).replace(sys.executable, "python")
            if decision == "restart":
                self.timeline.emit(
                    "restarter", f"{target}: RESTART ({alertname}) {detail}", "restarter"
                )
                if tally is not None:
                    tally.restarts += 1
                    if tally.hung_at is None or target != HUNG_TARGET:
                        tally.false_restarts += 1
                    if tally.restart_decided_at is None:
                        tally.restart_decided_at = now
            elif decision == "skip":
                reason = str(entry.get("reason", ""))
                self.timeline.emit(
                    "restarter",
                    f"{target}: skip ({alertname}), reason {reason}: {detail}",
                    "restarter",
                )
                if tally is not None:
                    tally.skips[reason] = tally.skips.get(reason, 0) + 1
            elif decision == "action_result":
                duration = entry.get("duration_seconds")
                took = f" in {duration:.1f} s" if isinstance(duration, int | float) else ""
                self.timeline.emit(
                    "restarter",
                    f"{target}: action {entry.get('result')}{took}: {detail}",
                    "restarter",
                )
            elif decision == "resolved":
                self.timeline.emit(
                    "restarter", f"{target}: {alertname} resolved (journaled)", "restarter"
                )

    # Waiting for the story to move on.

    async def wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout:g} s waiting for {what}")
            await asyncio.sleep(0.1)

    def state_of(self, name: str) -> str | None:
        return self.tallies[name].state


def describe_view(view: TargetView) -> str:
    parts = []
    if view.running is not None:
        parts.append(f"running {view.running:g}")
    if view.waiting is not None:
        parts.append(f"waiting {view.waiting:g}")
    if view.steps_per_second is not None and view.state in WORK_STATES:
        parts.append(f"{view.steps_per_second:.1f} steps/s")
    if view.tokens_per_second is not None and view.state in WORK_STATES:
        parts.append(f"{view.tokens_per_second:.0f} tokens/s")
    return f" ({', '.join(parts)})" if parts else ""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

"""What the demo saw of each target, whether the story went as it should, and the table (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TargetTally:
    """What the demo saw of one target (updated as the timeline runs)."""

    name: str
    kind: str
    state: str | None = None
    state_since: float = 0.0
    busy_seconds: float = 0.0
    test_requests: int = 0
    requests_sent_while_busy: int = 0
    requests_in_run: int = 0
    stalls_detected: int = 0
    stuck_alerts: int = 0
    new_processes_seen: int = 0
    restarts: int = 0
    false_restarts: int = 0
    skips: dict[str, int] = field(default_factory=dict)
    # Ground truth from the simulator: test requests (User-Agent stallwatch/...) it received
    # while the demo itself kept it busy.
    sim_test_requests_while_busy: int = 0
    hung_at: float | None = None
    alert_fired_at: float | None = None
    restart_decided_at: float | None = None
    restarted_at: float | None = None
    resolved_at: float | None = None

    def since_hang(self, moment: float | None) -> float | None:
        if self.hung_at is None or moment is None:
            return None
        return round(moment - self.hung_at, 2)

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "busy_seconds": round(self.busy_seconds, 1),
            "test_requests": self.test_requests,
            "requests_sent_while_busy": self.requests_sent_while_busy,
            "sim_test_requests_while_busy": self.sim_test_requests_while_busy,
            "stalls_detected": self.stalls_detected,
            "stuck_alerts": self.stuck_alerts,
            "new_processes_seen": self.new_processes_seen,
            "restarts": self.restarts,
            "false_restarts": self.false_restarts,
            "skips": dict(self.skips),
            "stall_to_alert_seconds": self.since_hang(self.alert_fired_at),
            "stall_to_restart_seconds": self.since_hang(self.restarted_at),
            "stall_to_resolved_seconds": self.since_hang(self.resolved_at),
        }


@dataclass
class RotationTally:
    """What HAProxy did with the hung server (its `stot`, requests sent to it, at each moment;
    times on the demo's monotonic clock)."""

    name: str
    hung_at: float | None = None
    out_at: float | None = None  # HAProxy first showed it DOWN by the agent
    back_at: float | None = None  # HAProxy first showed it UP again
    sent_at_hang: int | None = None
    sent_at_out: int | None = None
    sent_last_out: int | None = None  # at the last look while it was out
    sent_at_end: int | None = None

    def _between(self, first: int | None, last: int | None) -> int | None:
        return None if first is None or last is None else last - first

    @property
    def hang_to_out(self) -> int | None:
        """Requests HAProxy sent it between the hang and its quarantine (lost with it)."""
        return self._between(self.sent_at_hang, self.sent_at_out)

    @property
    def while_out(self) -> int | None:
        return self._between(self.sent_at_out, self.sent_last_out)

    @property
    def after_back(self) -> int | None:
        return self._between(self.sent_last_out, self.sent_at_end)

    def as_json(self) -> dict[str, Any]:
        def since_hang(moment: float | None) -> float | None:
            if self.hung_at is None or moment is None:
                return None
            return round(moment - self.hung_at, 2)

        return {
            "target": self.name,
            "hang_to_out_of_rotation_seconds": since_hang(self.out_at),
            "hang_to_back_in_rotation_seconds": since_hang(self.back_at),
            "requests_before_hang": self.sent_at_hang,
            "requests_from_hang_to_quarantine": self.hang_to_out,
            "requests_while_out_of_rotation": self.while_out,
            "requests_after_back_in_rotation": self.after_back,
        }


def rotation_problems(rotation: RotationTally) -> list[str]:
    """What went wrong with HAProxy's part of the story; empty when it went as it should."""
    if rotation.out_at is None:
        return [f"{rotation.name}: never left HAProxy's rotation after its hang"]
    problems = []
    if rotation.while_out:
        problems.append(
            f"{rotation.name}: HAProxy sent it {rotation.while_out} requests while it was "
            "out of rotation"
        )
    if rotation.back_at is None:
        problems.append(f"{rotation.name}: never came back into HAProxy's rotation")
    return problems


def story_problems(tallies: Mapping[str, TargetTally], hung: str) -> list[str]:
    """What went wrong with the story; empty when it happened as it should."""
    problems = []
    for tally in tallies.values():
        if tally.requests_sent_while_busy or tally.sim_test_requests_while_busy:
            problems.append(
                f"{tally.name}: test requests sent while busy "
                f"(exporter {tally.requests_sent_while_busy}, "
                f"simulator {tally.sim_test_requests_while_busy})"
            )
        if tally.false_restarts:
            problems.append(f"{tally.name}: {tally.false_restarts} false restarts")
    for tally in tallies.values():
        if tally.name != hung and tally.stuck_alerts and not tally.skips.get("recovered_in_window"):
            problems.append(f"{tally.name}: a silence that ended by itself was not a near miss")
    stuck = tallies[hung]
    if stuck.stalls_detected < 1:
        problems.append(f"{hung}: the stall was not detected")
    if stuck.restarts != 1:
        problems.append(f"{hung}: expected exactly one restart, got {stuck.restarts}")
    if stuck.resolved_at is None:
        problems.append(f"{hung}: LLMServerStuck did not resolve")
    return problems


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def format_summary_table(tallies: Sequence[TargetTally]) -> str:
    header = (
        "server",
        "kind",
        "time busy",
        "test requests",
        "while busy",
        "stalls",
        "restarts",
        "false restarts",
        "stall → alert",
        "stall → restart",
    )
    rows = [header]
    for tally in tallies:
        rows.append(
            (
                tally.name,
                tally.kind,
                _seconds(tally.busy_seconds) if tally.kind != "proxy" else "-",
                str(tally.test_requests),
                str(tally.requests_sent_while_busy),
                str(tally.stalls_detected),
                str(tally.restarts),
                str(tally.false_restarts),
                _seconds(tally.since_hang(tally.alert_fired_at)),
                _seconds(tally.since_hang(tally.restarted_at)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for index, row in enumerate(rows):
        cells = [
            cell.ljust(width) if column < 2 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells))
        if index == 0:
            lines.append("  " + "  ".join("-" * width for width in widths))
    return "\n".join(lines)

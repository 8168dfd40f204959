"""The restart policy as a table: every skip reason, and the restart case."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import get_args

import pytest

from stallwatch.common.restart_limits import Budget, CooldownAuto
from stallwatch.common.restarter_config import (
    CommandAction,
    ConfirmSettings,
    FleetWindow,
    RestarterConfig,
    Target,
)
from stallwatch.core.alerts import Alert
from stallwatch.core.confirmation import Confirmation, judge_reads
from stallwatch.core.fleet import Controls
from stallwatch.core.holds import Hold
from stallwatch.core.policy import (
    CHECKS_PASSED,
    CONFIRMED,
    Decision,
    History,
    PastDecision,
    PastRestart,
    SkipReason,
    alert_key,
    decide,
    lookback_seconds,
    with_confirmation,
)
from stallwatch.core.reading import parse_reading
from tests.support.real_payloads import real_payload
from tests.unit.restart_window_cases import WINDOW_CASES

NOW = 1_800_000_000.0
STARTS_AT = "2026-11-30T05:29:50.914142978Z"


def target(name: str) -> Target:
    return Target(
        name=name,
        metrics_url=f"http://{name}:8000/metrics",
        action=CommandAction(argv=("true",)),
        cooldown=600.0,
        budget=Budget(max_restarts=3, window=3600.0),
        action_timeout=120.0,
    )


AUTO = replace(target("gpu5"), cooldown_auto=CooldownAuto(floor=600.0, factor=3.0, max=7200.0))
CONFIG = RestarterConfig(
    targets=(target("gpu1"), target("gpu2"), target("gpu3"), target("gpu4"), AUTO),
    journal="journal.sqlite",
    token="secret",
    confirm=ConfirmSettings(gap=0.1, timeout=1.0),
    max_in_flight=1,
    fleet_window=FleetWindow(max_targets=2, window=900.0),
)


def alert(
    alertname: str = "LLMServerStuck", target_name: str | None = "gpu1", fingerprint: str = "f1"
) -> Alert:
    labels = {"alertname": alertname, "severity": "critical"}
    if target_name is not None:
        labels["target"] = target_name
    return Alert(status="firing", labels=labels, fingerprint=fingerprint, starts_at=STARTS_AT)


def restarted(name: str, ago: float, took: float | None = 5.0) -> PastRestart:
    finished = None if took is None else NOW - ago + took
    return PastRestart(target=name, decided_at=NOW - ago, finished_at=finished)


def blocked(name: str, ago: float) -> PastRestart:
    """A restart whose eviction a PodDisruptionBudget refused."""
    return replace(restarted(name, ago), blocked=True)


CHEAP_CASES: list[tuple[str, Alert, History, str]] = [
    ("not a restart alert", alert("LLMServerDown"), History(), "not_restart_alert"),
    ("slow, not stuck", alert("LLMServerDegraded"), History(), "degradation_alert"),
    ("queue not admitted", alert("LLMServerAdmissionStalled"), History(), "degradation_alert"),
    ("no target label", alert(target_name=None), History(), "no_target_label"),
    ("target not in config", alert(target_name="gpu9"), History(), "unknown_target"),
    (
        "same fingerprint and startsAt already restarted",
        alert(),
        History(same_alert=(PastDecision(NOW - 2, "restart", CONFIRMED),)),
        "duplicate",
    ),
    (
        "same alert already acted on in dry-run mode",
        alert(),
        History(same_alert=(PastDecision(NOW - 2, "skip", "dry_run"),)),
        "duplicate",
    ),
    (
        "same alert refused by confirmation within the cooldown",
        alert(),
        History(same_alert=(PastDecision(NOW - 60, "skip", "not_confirmed_progress"),)),
        "duplicate",
    ),
    (
        "same alert restarted by the replica that held the Lease before (from the ledger)",
        alert(),
        History(
            restarts=(replace(restarted("gpu1", 4000), alert=alert_key(alert())),),
        ),
        "duplicate",
    ),
    (
        "same alert's restart blocked by a PodDisruptionBudget within the cooldown",
        alert(),
        History(same_alert=(PastDecision(NOW - 60, "restart", CONFIRMED, blocked=True),)),
        "duplicate",
    ),
    (
        "its target is held (a weight sync said so)",
        alert(),
        History(holds=MappingProxyType({"gpu1": Hold("gpu1", NOW - 10, NOW + 290, "sync")})),
        "on_hold",
    ),
    ("restarted 5 minutes ago", alert(), History(restarts=(restarted("gpu1", 300),)), "cooldown"),
    (
        "cooldown counts from the end of a long action",
        alert(),
        History(restarts=(restarted("gpu1", 700, took=200),)),
        "cooldown",
    ),
    (
        "three restarts in the last hour",
        alert(),
        History(restarts=tuple(restarted("gpu1", ago) for ago in (3000, 2000, 1000))),
        "budget_exhausted",
    ),
    (
        "another target's restart still running",
        alert(),
        History(restarts=(restarted("gpu2", 30, took=None),)),
        "fleet_in_flight",
    ),
    (
        "paused for maintenance",
        alert(),
        History(controls=Controls(paused_until=NOW + 60, pause_detail="upgrade")),
        "paused",
    ),
    (
        "paused until resumed",
        alert(),
        History(controls=Controls(paused_until=float("inf"))),
        "paused",
    ),
    (
        "the breaker is open",
        alert(),
        History(controls=Controls(breaker_opened_at=NOW - 600, breaker_detail="mass stall")),
        "breaker_open",
    ),
    (
        "three of the five configured targets stalled at once",
        alert(),
        History(stalled=frozenset({"gpu1", "gpu2", "gpu3"})),
        "mass_stall",
    ),
    (
        "three of four covered targets stalled at once (a rule covers four)",
        alert(),
        History(stalled=frozenset({"gpu1", "gpu2", "gpu3"}), covered=4),
        "mass_stall",
    ),
    (
        "cooldown auto follows the measured load time (3 x 300 s)",
        alert(target_name="gpu5"),
        History(
            restarts=(restarted("gpu5", 800),),
            load_seconds=MappingProxyType({"gpu5": 300.0}),
        ),
        "cooldown",
    ),
    (
        "two other targets restarted in the fleet window",
        alert(),
        History(restarts=(restarted("gpu2", 600), restarted("gpu3", 300))),
        "fleet_window",
    ),
]


@pytest.mark.parametrize(
    ("case", "the_alert", "history", "reason"), CHEAP_CASES, ids=[c[0] for c in CHEAP_CASES]
)
def test_cheap_checks_skip(case: str, the_alert: Alert, history: History, reason: str) -> None:
    """Each cheap check skips with its own reason, before any confirmation is spent."""
    decision = decide(the_alert, CONFIG, history, NOW)
    assert decision == Decision("skip", reason, decision.detail), case
    assert decision.detail


PASSING_CASES: list[tuple[str, Alert, History]] = [
    ("nothing in the journal", alert(), History()),
    ("unresponsive alert", alert("LLMServerUnresponsive"), History()),
    (
        "same fingerprint, new episode (another startsAt) after the cooldown",
        alert(),
        History(restarts=(restarted("gpu1", 1200),)),
    ),
    (
        "confirmation refused longer ago than the cooldown",
        alert(),
        History(same_alert=(PastDecision(NOW - 900, "skip", "not_confirmed_progress"),)),
    ),
    (
        "two restarts in the last hour: budget left",
        alert(),
        History(restarts=(restarted("gpu1", 3000), restarted("gpu1", 1500))),
    ),
    (
        "an old restart outside the budget window",
        alert(),
        History(restarts=tuple(restarted("gpu1", ago) for ago in (4000, 3000, 2000))),
    ),
    (
        "a restart that left no result and is older than its action timeout",
        alert(),
        History(restarts=(restarted("gpu2", 200, took=None),)),
    ),
    (
        "one other target in the fleet window",
        alert(),
        History(restarts=(restarted("gpu2", 300),)),
    ),
    (
        "skipped decisions about the same alert are not acted ones",
        alert(),
        History(same_alert=(PastDecision(NOW - 5, "skip", "cooldown"),)),
    ),
    ("a pause that has ended", alert(), History(controls=Controls(paused_until=NOW - 1))),
    (
        "same alert's restart blocked by a PodDisruptionBudget longer ago than the cooldown",
        alert(),
        History(same_alert=(PastDecision(NOW - 900, "restart", CONFIRMED, blocked=True),)),
    ),
    (
        "blocked restarts spend no budget and start no cooldown",
        alert(),
        History(restarts=tuple(blocked("gpu1", ago) for ago in (3000, 2000, 1000, 60))),
    ),
    (
        "other targets' blocked restarts do not fill the fleet window",
        alert(),
        History(restarts=(blocked("gpu2", 600), blocked("gpu3", 300))),
    ),
    (
        "half the fleet stalled is not more than half",
        alert(),
        History(stalled=frozenset({"gpu1", "gpu2", "gpu3"}), covered=6),
    ),
    (
        "fewer stalled than min_stalled, however large the share",
        alert(),
        History(stalled=frozenset({"gpu1", "gpu2"}), covered=2),
    ),
    (
        "three of eight covered targets stalled",
        alert(),
        History(stalled=frozenset({"gpu1", "gpu2", "gpu3"}), covered=8),
    ),
    (
        "cooldown auto with no measurement uses its floor (10 min)",
        alert(target_name="gpu5"),
        History(restarts=(restarted("gpu5", 800),)),
    ),
    (
        "cooldown auto with a short load time uses its floor",
        alert(target_name="gpu5"),
        History(restarts=(restarted("gpu5", 800),), load_seconds=MappingProxyType({"gpu5": 60.0})),
    ),
]


@pytest.mark.parametrize(
    ("case", "the_alert", "history"), PASSING_CASES, ids=[c[0] for c in PASSING_CASES]
)
def test_cheap_checks_pass(case: str, the_alert: Alert, history: History) -> None:
    """When no check objects, the decision is a restart pending confirmation."""
    assert decide(the_alert, CONFIG, history, NOW).reason == CHECKS_PASSED, case


PENDING = Decision("restart", CHECKS_PASSED, "")

CONFIRM_CASES: list[tuple[str, str, Confirmation, RestarterConfig, str, str]] = [
    (
        "confirmed stall restarts",
        "LLMServerStuck",
        Confirmation(True, None, "stalled"),
        CONFIG,
        "restart",
        CONFIRMED,
    ),
    (
        "progress vetoes",
        "LLMServerStuck",
        Confirmation(False, "progress", "busy"),
        CONFIG,
        "skip",
        "not_confirmed_progress",
    ),
    (
        "idle vetoes a stuck alert",
        "LLMServerStuck",
        Confirmation(False, "idle", "idle"),
        CONFIG,
        "skip",
        "not_confirmed_idle",
    ),
    (
        "idle confirms an unresponsive alert",
        "LLMServerUnresponsive",
        Confirmation(False, "idle", "idle"),
        CONFIG,
        "restart",
        CONFIRMED,
    ),
    (
        "down vetoes",
        "LLMServerUnresponsive",
        Confirmation(False, "down", "refused"),
        CONFIG,
        "skip",
        "not_confirmed_down",
    ),
    (
        "an unreadable answer vetoes",
        "LLMServerStuck",
        Confirmation(False, "error", "no_metrics"),
        CONFIG,
        "skip",
        "not_confirmed_error",
    ),
    (
        "dry run journals instead of acting",
        "LLMServerStuck",
        Confirmation(True, None, "stalled"),
        replace(CONFIG, dry_run=True),
        "skip",
        "dry_run",
    ),
]


@pytest.mark.parametrize(
    ("case", "alertname", "confirmation", "config", "action", "reason"),
    CONFIRM_CASES,
    ids=[c[0] for c in CONFIRM_CASES],
)
def test_confirmation_step(
    case: str,
    alertname: str,
    confirmation: Confirmation,
    config: RestarterConfig,
    action: str,
    reason: str,
) -> None:
    """The two fresh reads veto or confirm; dry run comes last."""
    decision = with_confirmation(PENDING, alert(alertname), config, confirmation)
    assert (decision.action, decision.reason) == (action, reason), case


def test_confirmation_never_turns_a_skip_into_a_restart() -> None:
    """A skip from the cheap checks stays a skip whatever the confirmation says."""
    skip = Decision("skip", "cooldown", "recent")
    assert with_confirmation(skip, alert(), CONFIG, Confirmation(True, None, "stalled")) == skip


def test_every_skip_reason_is_covered_by_the_tables() -> None:
    """The tables above exercise every skip reason the policy itself gives."""
    covered = (
        {case[3] for case in CHEAP_CASES}
        | {case[5] for case in CONFIRM_CASES}
        | {case[-1] for case in WINDOW_CASES}
        # Refused before the policy, by the Kubernetes side: test_restarter_pod_names.py.
        | {"invalid_pod_name"}
    )
    assert set(get_args(SkipReason)) <= covered


def test_lookback_spans_every_window() -> None:
    """The journal is read far enough back for the longest window in the config."""
    assert lookback_seconds(replace(CONFIG, targets=CONFIG.targets[:4])) == 3600.0
    assert lookback_seconds(CONFIG) == 7200.0  # the longest auto cooldown
    longer = replace(CONFIG, fleet_window=FleetWindow(max_targets=2, window=7200.0))
    assert lookback_seconds(longer) == 7200.0


BUSY = real_payload("vllm-0.32.0-cpu-busy-1.txt")
IDLE = real_payload("vllm-0.32.0-cpu-idle-1.txt")
# The counters whose standstill is the evidence of a stall, and every engine counter.
PROGRESS_PREFIXES = ("vllm:iteration_tokens_total", "vllm:generation_tokens_total")
COUNTER_PREFIXES = (
    *PROGRESS_PREFIXES,
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
)


def without(payload: str, *prefixes: str) -> str:
    return "\n".join(line for line in payload.splitlines() if not line.startswith(prefixes))


READ_CASES = [
    # (case, first payload, second payload, confirmed, refusal)
    ("work and frozen counters: a stall", BUSY, BUSY, True, None),
    ("progress counters never there", without(BUSY, *PROGRESS_PREFIXES),
     without(BUSY, *PROGRESS_PREFIXES), False, "error"),
    ("progress counters gone by the second read", BUSY, without(BUSY, *PROGRESS_PREFIXES),
     False, "error"),
    ("one progress counter gone by the second read", BUSY,
     without(BUSY, "vllm:generation_tokens_total"), False, "error"),
    ("only the step counter there, in both: still a stall",
     without(BUSY, "vllm:generation_tokens_total"),
     without(BUSY, "vllm:generation_tokens_total"), True, None),
    ("idle with its counters: idle", IDLE, IDLE, False, "idle"),
    ("idle with no counter at all: no evidence", without(IDLE, *COUNTER_PREFIXES),
     without(IDLE, *COUNTER_PREFIXES), False, "error"),
    ("idle whose completions vanished: no evidence", IDLE,
     without(IDLE, "vllm:request_success_total"), False, "error"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "first", "second", "confirmed", "refusal"),
    READ_CASES,
    ids=[c[0] for c in READ_CASES],
)
def test_absent_counters_are_no_evidence_of_a_stall(
    case: str, first: str, second: str, confirmed: bool, refusal: str | None
) -> None:
    """Two reads confirm a stall (or an idle server) only from counters present in both."""
    judged = judge_reads(
        parse_reading(first, taken_at=NOW), parse_reading(second, taken_at=NOW + 5)
    )
    assert (judged.confirmed, judged.refusal) == (confirmed, refusal), (case, judged.detail)


def test_a_degradation_alert_is_refused_even_where_the_config_lists_it() -> None:
    """A config that names LLMServerDegraded among its restart alerts still restarts nothing
    for it: slow is never a restart, and the skip says why."""
    config = replace(CONFIG, restart_alerts=(*CONFIG.restart_alerts, "LLMServerDegraded"))
    decision = decide(alert("LLMServerDegraded"), config, History(), NOW)
    assert (decision.action, decision.reason) == ("skip", "degradation_alert")
    assert "slow, not stuck" in decision.detail
    assert decide(alert("LLMServerStuck"), config, History(), NOW).reason == CHECKS_PASSED

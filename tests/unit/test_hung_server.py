"""A hung server (connected, no answer) is told from a down one, counted, alerted and confirmed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from stallwatch.common.exporter_config import ExporterConfig, TargetConfig
from stallwatch.common.restarter_config import CommandAction, RestarterConfig, Target
from stallwatch.core.alerts import Alert
from stallwatch.core.classify import State, Verdict, hung
from stallwatch.core.confirmation import (
    Confirmation,
    FailedRead,
    ReadAttempt,
    judge_attempts,
    worth_a_second_read,
)
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.policy import CONFIRMED, History, decide_confirmed
from stallwatch.core.poll_plan import (
    unread_verdict,
)
from stallwatch.core.reading import parse_reading
from stallwatch.core.reads import (
    ReadResult,
)
from stallwatch.core.rules import HUNG_ALERT, STUCK_ALERT, UNRESPONSIVE_ALERT, restart_alerts
from stallwatch.exporter.check_cli import EXIT_DOWN, EXIT_STUCK, exit_code_for
from stallwatch.exporter.collector import TargetCollector
from stallwatch.restarter.confirm import attempt
from tests.support.real_payloads import real_payload

RECORDING_RULES = Path(__file__).resolve().parents[2] / "prometheus" / "recording.yml"
BUSY_1 = parse_reading(real_payload("vllm-0.32.0-cpu-busy-1.txt"), taken_at=100.0)
BUSY_2 = parse_reading(real_payload("vllm-0.32.0-cpu-busy-2.txt"), taken_at=105.0)
FROZEN = parse_reading(real_payload("vllm-0.32.0-cpu-busy-2.txt"), taken_at=110.0)
IDLE = parse_reading(real_payload("vllm-0.32.0-cpu-idle-1.txt"), taken_at=110.0)

NO_ANSWER = ReadResult(None, "timeout", "connected, no answer within 3 s")
REFUSED = ReadResult(None, "connection", "ClientConnectorError: connection refused")
NOT_CONNECTED = ReadResult(None, "connection", "not connected within 1.5 s")
RESET = ReadResult(None, "connection", "ServerDisconnectedError: Server disconnected")
ERROR_STATUS = ReadResult(None, "http_status", "HTTP 500", status=500)
TOO_LARGE = ReadResult(None, "too_large", "payload larger than 8 bytes")

# (case, what the /metrics read gave, the state the exporter publishes)
READ_OUTCOMES: list[tuple[str, ReadResult, State]] = [
    ("connected, no answer in time", NO_ANSWER, State.HUNG),
    ("connection refused", REFUSED, State.DOWN),
    ("not connected in time", NOT_CONNECTED, State.DOWN),
    ("connection reset before an answer", RESET, State.DOWN),
    ("an error status is an answer", ERROR_STATUS, State.DOWN),
    ("a payload too large is an answer", TOO_LARGE, State.DOWN),
]


@pytest.mark.parametrize(
    ("case", "read", "state"), READ_OUTCOMES, ids=[case[0] for case in READ_OUTCOMES]
)
def test_a_read_without_reading_is_hung_only_when_it_connected_and_got_no_answer(
    case: str, read: ReadResult, state: State
) -> None:
    """Refused, reset or not connected is down; connected with no answer in time is hung."""
    verdict = unread_verdict(read)
    assert verdict.state == state, case
    assert read.detail in verdict.reason


def advance(history: TargetHistory, verdict: Verdict, at: float) -> TargetHistory:
    return history.advance(
        PollOutcome(verdict=verdict, reading=None, finished_at=at, duration_seconds=0.0)
    )


BUSY = Verdict(State.BUSY, "moving", running=2.0, progressed=True)
DOWN = unread_verdict(REFUSED)
HUNG = unread_verdict(NO_ANSWER)


@pytest.mark.parametrize(
    ("case", "verdicts", "polls", "fires"),
    [
        ("one poll with no answer", [BUSY, HUNG], 1, False),
        ("two polls in a row with no answer", [BUSY, HUNG, HUNG], 2, True),
        ("an answer in between", [HUNG, BUSY, HUNG], 1, False),
        ("a refused connection in between", [HUNG, DOWN, HUNG], 1, False),
        ("refused twice is down, not hung", [DOWN, DOWN], 2, False),
    ],
)
def test_hung_polls_are_counted_in_a_row_and_fire_at_two(
    case: str, verdicts: list[Verdict], polls: int, fires: bool
) -> None:
    """state_polls counts hung polls in a row; LLMServerHung fires at two, never across a gap."""
    history = TargetHistory()
    for at, verdict in enumerate(verdicts):
        history = advance(history, verdict, float(at))
    assert history.state_polls == polls, case
    alerts = restart_alerts(history.state, history.state_polls)
    assert alerts[HUNG_ALERT] is fires, case
    assert not alerts[STUCK_ALERT], case
    assert not alerts[UNRESPONSIVE_ALERT], case
    assert (exit_code_for(history) == EXIT_STUCK) is fires, case


def test_check_exits_stuck_on_two_hung_polls_and_down_on_two_refused() -> None:
    """`stallwatch check` exits 1 (stuck) for hung twice, 2 (down) for refused twice."""
    hung_twice = advance(advance(TargetHistory(), HUNG, 1.0), HUNG, 2.0)
    down_twice = advance(advance(TargetHistory(), DOWN, 1.0), DOWN, 2.0)
    assert exit_code_for(hung_twice) == EXIT_STUCK
    assert exit_code_for(down_twice) == EXIT_DOWN


def test_a_hung_target_is_published_as_hung_and_not_up() -> None:
    """The state set carries `hung` like every other state, and stallwatch_target_up reads 0."""
    config = ExporterConfig(targets=(TargetConfig(name="gpu-h", url="http://127.0.0.1:1"),))
    history = advance(TargetHistory(), hung("/metrics: connected, no answer"), 1.0)
    collector = TargetCollector(lambda: config, lambda: {"gpu-h": history})
    samples = {
        (sample.name, sample.labels.get("state")): sample.value
        for family in collector.collect()
        for sample in family.samples
        if sample.labels.get("target") == "gpu-h"
    }
    assert samples[("stallwatch_target_state", "hung")] == 1
    assert samples[("stallwatch_target_state", "down")] == 0
    assert samples[("stallwatch_target_state_polls", None)] == 1
    assert samples[("stallwatch_target_up", None)] == 0


def test_every_state_has_a_code_in_the_recording_rule() -> None:
    """The dashboard's state code covers every state the exporter publishes, hung included."""
    expr = next(
        rule["expr"]
        for group in yaml.safe_load(RECORDING_RULES.read_text())["groups"]
        for rule in group["rules"]
        if rule.get("record") == "target:stallwatch_target_state_code:max"
    )
    assert set(re.findall(r'state="(\w+)"', expr)) == {state.value for state in State}


# (case, what the read gave, what the restarter's confirmation makes of it)
ATTEMPTS: list[tuple[str, ReadResult, ReadAttempt]] = [
    ("no answer", NO_ANSWER, FailedRead("no_answer", NO_ANSWER.detail)),
    ("refused", REFUSED, FailedRead("unreachable", REFUSED.detail)),
    ("not connected in time", NOT_CONNECTED, FailedRead("unreachable", NOT_CONNECTED.detail)),
    ("reset", RESET, FailedRead("unreachable", RESET.detail)),
    ("error status", ERROR_STATUS, FailedRead("unusable", ERROR_STATUS.detail)),
    ("too large", TOO_LARGE, FailedRead("unusable", TOO_LARGE.detail)),
    ("a reading", ReadResult(IDLE), IDLE),
]


@pytest.mark.parametrize(("case", "read", "expected"), ATTEMPTS, ids=[c[0] for c in ATTEMPTS])
def test_the_restarter_reads_a_read_as_the_exporter_does(
    case: str, read: ReadResult, expected: ReadAttempt
) -> None:
    """The confirmation tells no answer from not connected exactly where the exporter does."""
    assert attempt(read) == expected, case
    if read.reading is None:
        hung_to_the_exporter = unread_verdict(read).state == State.HUNG
        assert hung_to_the_exporter is (expected == FailedRead("no_answer", read.detail)), case


A_NO_ANSWER = FailedRead("no_answer", "connected, no answer within 3 s")
A_REFUSED = FailedRead("unreachable", "connection refused")
A_ERROR = FailedRead("unusable", "HTTP 500")

# (case, first read, second read (None: not made), refusal (None: confirmed))
JUDGEMENTS: list[tuple[str, ReadAttempt, ReadAttempt | None, str | None]] = [
    ("both connect and get no answer", A_NO_ANSWER, A_NO_ANSWER, "no_answer"),
    ("first refused: no second read", A_REFUSED, None, "down"),
    ("first an error status: no second read", A_ERROR, None, "down"),
    ("no answer, then refused", A_NO_ANSWER, A_REFUSED, "down"),
    ("no answer, then an error status", A_NO_ANSWER, A_ERROR, "down"),
    ("no answer, then an answer", A_NO_ANSWER, IDLE, "down"),
    ("an answer, then no answer", IDLE, A_NO_ANSWER, "down"),
    ("two answers with progress", BUSY_1, BUSY_2, "progress"),
    ("two answers, stalled", BUSY_2, FROZEN, None),
]


@pytest.mark.parametrize(
    ("case", "first", "second", "refusal"), JUDGEMENTS, ids=[c[0] for c in JUDGEMENTS]
)
def test_judge_attempts(
    case: str, first: ReadAttempt, second: ReadAttempt | None, refusal: str | None
) -> None:
    """Only two reads that both connect and get no answer are a hang; any answer or a refused
    connection is not."""
    assert worth_a_second_read(first) is (second is not None), case
    confirmation = judge_attempts(first, second)
    assert confirmation.refusal == refusal, case
    assert confirmation.confirmed is (refusal is None), case


CONFIG = RestarterConfig(
    targets=(Target("gpu-h", "http://gpu-h:8000/metrics", CommandAction(argv=("true",))),),
    journal="journal.sqlite",
    insecure_no_auth=True,
)


def alert(alertname: str) -> Alert:
    labels = {"alertname": alertname, "target": "gpu-h", "severity": "critical"}
    return Alert(status="firing", labels=labels, fingerprint="f1", starts_at="2026-11-30T05:29:50Z")


NO_ANSWER_TWICE = judge_attempts(A_NO_ANSWER, A_NO_ANSWER)
STALLED_ANSWER = judge_attempts(BUSY_2, FROZEN)
IDLE_ANSWER = Confirmation(False, "idle", "idle: no work")

# (case, alert, confirmation, action, reason)
DECISIONS: list[tuple[str, str, Confirmation, str, str]] = [
    ("no answer twice confirms the hung alert", HUNG_ALERT, NO_ANSWER_TWICE, "restart", CONFIRMED),
    (
        "no answer twice is down for the stuck alert",
        STUCK_ALERT,
        NO_ANSWER_TWICE,
        "skip",
        "not_confirmed_down",
    ),
    (
        "no answer twice is down for the unresponsive alert",
        UNRESPONSIVE_ALERT,
        NO_ANSWER_TWICE,
        "skip",
        "not_confirmed_down",
    ),
    ("refused is down", HUNG_ALERT, judge_attempts(A_REFUSED, None), "skip", "not_confirmed_down"),
    (
        "an answer in between is not a hang",
        HUNG_ALERT,
        judge_attempts(A_NO_ANSWER, IDLE),
        "skip",
        "not_confirmed_down",
    ),
    ("an idle answer is not a hang", HUNG_ALERT, IDLE_ANSWER, "skip", "not_confirmed_idle"),
    ("a stalled answer is not a hang", HUNG_ALERT, STALLED_ANSWER, "skip", "not_confirmed_error"),
    ("a stalled answer still confirms stuck", STUCK_ALERT, STALLED_ANSWER, "restart", CONFIRMED),
]


@pytest.mark.parametrize(
    ("case", "alertname", "confirmation", "action", "reason"),
    DECISIONS,
    ids=[c[0] for c in DECISIONS],
)
def test_only_the_hung_alert_is_confirmed_by_no_answer(
    case: str, alertname: str, confirmation: Confirmation, action: str, reason: str
) -> None:
    """Two unanswered reads restart for LLMServerHung only; any answer refuses it."""
    decision = decide_confirmed(alert(alertname), CONFIG, History(), 1e9, confirmation)
    assert (decision.action, decision.reason) == (action, reason), (case, decision.detail)

"""`stallwatch check URL`: one verdict for people without Prometheus (cron, systemd, scripts).

It reads the server like the exporter does and waits for two intervals when it sees work
without progress, so a single slow interval never reads as stuck.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from typing import Any, cast

import aiohttp

from stallwatch import USER_AGENT
from stallwatch.common.cli import EXIT_USAGE, positive_duration
from stallwatch.common.config import check_url
from stallwatch.common.exporter_config import (
    MIN_INTERVAL_SECONDS,
    MIN_TEST_REQUEST_TIMEOUT_SECONDS,
    IdleTestRequestConfig,
    TargetConfig,
    TestRequestEndpoint,
    metrics_in_base_url,
)
from stallwatch.core.classify import State
from stallwatch.core.history import TargetHistory
from stallwatch.core.rules import POLLS_TO_FIRE, RESTART_ALERT_STATES, restart_alerts
from stallwatch.engines import AUTO, TARGET_KINDS, default_metrics_path
from stallwatch.exporter.poll import poll_once
from stallwatch.net.fetch import DEFAULT_MAX_BYTES

EXIT_OK = 0
EXIT_STUCK = 1
EXIT_DOWN = 2
EXIT_UNKNOWN = 3
HEALTHY = frozenset({State.IDLE, State.BUSY, State.SLEEPING})
# Reads that need one more read before a verdict: nothing to compare with, or one bad interval.
MAX_POLLS = 5


@dataclass(frozen=True)
class CheckResult:
    exit_code: int
    history: TargetHistory
    url: str

    @property
    def stuck(self) -> bool:
        return self.exit_code == EXIT_STUCK

    def as_json(self) -> dict[str, Any]:
        verdict = self.history.verdict
        return {
            "url": self.url,
            "state": verdict.state.value if verdict else None,
            "stuck": self.stuck,
            "reason": verdict.reason if verdict else "",
            "running": verdict.running if verdict else None,
            "waiting": verdict.waiting if verdict else None,
            "steps_per_second": verdict.steps_per_second if verdict else None,
            "tokens_per_second": verdict.tokens_per_second if verdict else None,
            "engine": engine_of(self.history),
            "restart_detected": self.history.restarts_detected > 0,
            "test_requests_sent": self.history.test_requests,
            # The key before 0.2, kept until 0.3.
            "probe_requests_sent": self.history.test_requests,
            "polls": self.history.polls,
            "exit_code": self.exit_code,
        }


def engine_of(history: TargetHistory) -> str:
    """The engine the last reading was read as; empty when none was recognised."""
    reading = history.baseline
    return reading.engine_kind or "" if reading is not None else ""


def _needs_another_poll(history: TargetHistory) -> bool:
    state = history.state
    if state in RESTART_ALERT_STATES.values():
        return history.state_polls < POLLS_TO_FIRE
    return state in (State.UNKNOWN, State.RESTARTED) or (history.polls == 1 and state is None)


def exit_code_for(history: TargetHistory) -> int:
    state = history.state
    if state in HEALTHY:
        return EXIT_OK
    if any(restart_alerts(state, history.state_polls).values()):
        return EXIT_STUCK
    if state == State.DOWN:
        return EXIT_DOWN
    return EXIT_UNKNOWN


async def run_check(
    target: TargetConfig, *, max_payload_bytes: int = DEFAULT_MAX_BYTES
) -> CheckResult:
    """Poll until the verdict is settled: at most MAX_POLLS reads, `interval` apart."""
    history = TargetHistory()
    async with aiohttp.ClientSession(headers={"User-Agent": USER_AGENT}) as session:
        for poll in range(MAX_POLLS):
            if poll:
                await asyncio.sleep(target.interval_seconds)
            outcome = await poll_once(
                session, target, history.baseline, max_payload_bytes=max_payload_bytes
            )
            history = history.advance(outcome, target.degraded)
            if not _needs_another_poll(history):
                break
    return CheckResult(exit_code_for(history), history, target.url)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "check",
        help="one-shot verdict on one server (exit 0 healthy, 1 stuck, 2 down, 3 cannot judge)",
        description=(
            "Read a model server's /metrics like the exporter does and print its state. "
            "Work without progress is read again after --interval; only two stalled "
            "intervals in a row are stuck. A test request is sent only to a server with no "
            "work. Exit codes: 0 idle, busy or sleeping; 1 stuck (stalled in two intervals) "
            "or unresponsive (idle test request failed twice) or hung (connected, and "
            "/metrics did not answer, twice); 2 down (not connected); 3 cannot judge; "
            f"{EXIT_USAGE} usage error. Durations are written as in the config files: "
            "500ms, 5s, 1m."
        ),
    )
    parser.add_argument("url", help="base URL of the server, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--interval",
        type=positive_duration,
        default=15.0,
        help="time between reads (default 15s)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_duration,
        default=5.0,
        help="timeout of each /metrics read (default 5s)",
    )
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument(
        "--no-test-request",
        action="store_true",
        help="never send a test request, even to an idle server",
    )
    parser.add_argument("--test-request-model", default=None, help="model for the test request")
    parser.add_argument(
        "--test-request-endpoint",
        default="completions",
        choices=("completions", "chat"),
        help="endpoint of the test request (default completions)",
    )
    parser.add_argument(
        "--test-request-timeout",
        type=positive_duration,
        default=10.0,
        help="timeout of the test request (default 10s)",
    )
    # The spellings before 0.2 ("probe" is /probe's word): still read, with a warning, until 0.3.
    for old_flag, new_flag, extra in (
        ("--no-probe", "--no-test-request", {"nargs": 0}),
        ("--probe-model", "--test-request-model", {}),
        ("--probe-endpoint", "--test-request-endpoint", {"choices": ("completions", "chat")}),
        ("--probe-timeout", "--test-request-timeout", {"type": positive_duration}),
    ):
        parser.add_argument(
            old_flag,
            dest=new_flag.removeprefix("--").replace("-", "_"),
            action=_OldSpelling,
            new_flag=new_flag,
            help=argparse.SUPPRESS,
            **extra,
        )
    parser.add_argument(
        "--kind",
        default=AUTO,
        choices=TARGET_KINDS,
        help=(
            "the server's engine, or auto to identify it from /v1/models, then its metrics "
            "(default auto)"
        ),
    )
    parser.set_defaults(handler=run)


class _OldSpelling(argparse.Action):
    """A flag's spelling before 0.2: it sets the new flag's value and says so on stderr."""

    def __init__(self, option_strings: list[str], dest: str, *, new_flag: str, **kwargs: Any):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(
            f"stallwatch check: warning: {option_string} is deprecated (removed in 0.3): "
            f"use {self.new_flag}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def run(args: argparse.Namespace) -> int:
    problem = check_url(args.url) or metrics_in_base_url(args.url)
    if problem:
        print(f"stallwatch check: error: URL: {problem}", file=sys.stderr)
        return EXIT_USAGE
    for flag, seconds, minimum in (
        ("--interval", args.interval, MIN_INTERVAL_SECONDS),
        ("--timeout", args.timeout, MIN_INTERVAL_SECONDS),
        ("--test-request-timeout", args.test_request_timeout, MIN_TEST_REQUEST_TIMEOUT_SECONDS),
    ):
        if seconds < minimum:
            print(
                f"stallwatch check: error: {flag} must be at least {minimum * 1000:g}ms",
                file=sys.stderr,
            )
            return EXIT_USAGE
    target = TargetConfig(
        name="check",
        url=args.url,
        kind=args.kind,
        metrics_path=default_metrics_path(args.kind),
        interval_seconds=args.interval,
        timeout_seconds=min(args.timeout, args.interval),
        test_request=IdleTestRequestConfig(
            enabled=not args.no_test_request,
            model=args.test_request_model,
            endpoint=cast(TestRequestEndpoint, args.test_request_endpoint),
            timeout_seconds=args.test_request_timeout,
        ),
    )
    result = asyncio.run(run_check(target))
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        report = result.as_json()
        label = "STUCK" if result.stuck else str(report["state"]).upper()
        print(f"{label}: {report['reason']}")
        print(
            f"running={report['running']} waiting={report['waiting']} "
            f"steps/s={report['steps_per_second']} tokens/s={report['tokens_per_second']} "
            f"restart_detected={report['restart_detected']} "
            f"test_requests_sent={report['test_requests_sent']}"
        )
    sys.stdout.flush()
    return result.exit_code

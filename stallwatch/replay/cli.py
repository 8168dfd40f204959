"""`stallwatch replay`: one day on one model server, the old way vs stallwatch, in virtual time."""

from __future__ import annotations

import argparse
import json
import time

from stallwatch.replay.config import ReplayConfig
from stallwatch.replay.day import run_replay
from stallwatch.replay.report import format_result, result_document


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay one day of the incident in virtual time: old watchdogs vs stallwatch",
        description=(
            "Simulate one day on one model server (deterministic, virtual time, a few seconds) "
            "twice: watched by request-sending watchdogs, and watched by stallwatch's own "
            "decision code. Prints restarts, failed requests, test requests sent to a busy "
            "server, downtime, and how fast real hangs were caught."
        ),
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--hours", type=_positive, default=24.0, help="length of the day in hours (default 24)"
    )
    parser.add_argument(
        "--load",
        type=_non_negative,
        default=1.0,
        help="batch job intensity: 1 = two to four long requests for half the day (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=_run)


def _positive(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    result = run_replay(ReplayConfig(seed=args.seed, hours=args.hours, load=args.load))
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps(result_document(result), indent=2))
    else:
        print(format_result(result, elapsed))
    return 0

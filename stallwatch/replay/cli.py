"""`stallwatch replay`: one day on one model server, the old way vs stallwatch, in virtual time."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from stallwatch.common.cli import EXIT_USAGE
from stallwatch.replay.config import ReplayConfig
from stallwatch.replay.day import run_replay
from stallwatch.replay.fleet import run_fleet
from stallwatch.replay.fleet_plan import FleetConfig
from stallwatch.replay.fleet_report import fleet_document, format_fleet
from stallwatch.replay.report import format_result, result_document


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay the incident in virtual time, on one server or a fleet: old way vs stallwatch",
        description=(
            "Simulate one day on one model server (deterministic, virtual time, a few seconds), "
            "with real hangs and legitimate silences (compiles, weight syncs, autotune): watched "
            "by request-sending watchdogs, and by stallwatch's own decision code with its "
            "restart window and with the old two-poll rule. Prints restarts (false ones, and "
            "those in a silence), failed requests, test requests sent to a busy server, "
            "downtime, how fast real hangs were caught, and near misses. With --servers N and "
            "--days D: a fleet with correlated faults (network blips, exporter restarts, bad "
            "nodes) and silences, watched by stallwatch with its fleet rules (window and "
            "two-poll rule) and without them, a kubelet /health probe and a canary-on-idle "
            "watchdog."
        ),
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--hours",
        type=_positive,
        default=None,
        help="length of the day in hours (default 24; one server only)",
    )
    parser.add_argument(
        "--load",
        type=_non_negative,
        default=None,
        help="batch job intensity: 1 = two to four long requests for half the day (default 1)",
    )
    parser.add_argument(
        "--servers",
        type=_whole_positive,
        default=1,
        help="replay a fleet of this many servers, watched five ways (default 1: one server)",
    )
    parser.add_argument(
        "--days",
        type=_positive,
        default=None,
        help="length of the fleet replay in days (default 7; implies the fleet replay)",
    )
    parser.add_argument(
        "--restart-after",
        type=_non_negative,
        default=None,
        metavar="SECONDS",
        help="stallwatch's restart window (default 300, the restarter's; 0: the two-poll rule; "
        "the report always shows the two-poll rule beside it)",
    )
    parser.add_argument(
        "--no-silences",
        action="store_true",
        help="no legitimate silences (compiles, weight syncs, autotune): the replays as they "
        "were before they modelled them",
    )
    parser.add_argument(
        "--no-degraded",
        action="store_true",
        help="no degraded periods (slow, not stuck) on the one server: the day as it was "
        "before they were modelled",
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


def _whole_positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _run(args: argparse.Namespace) -> int:
    if args.servers > 1 or args.days is not None:
        if args.hours is not None or args.load is not None:
            print(
                "stallwatch replay: --hours and --load set the one-server replay; "
                "the fleet replay (--servers, --days) takes neither",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return _run_fleet(args)
    hours = 24.0 if args.hours is None else args.hours
    load = 1.0 if args.load is None else args.load
    started = time.perf_counter()
    config = replace(
        ReplayConfig(seed=args.seed, hours=hours, load=load),
        legitimate_silences=not args.no_silences,
    )
    if args.no_degraded:
        config = replace(config, degraded_per_day=0.0)
    if args.restart_after is not None:
        config = replace(config, restart_after=args.restart_after)
    result = run_replay(config)
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps(result_document(result), indent=2))
    else:
        print(format_result(result, elapsed))
    return 0


def _run_fleet(args: argparse.Namespace) -> int:
    days = 7.0 if args.days is None else args.days
    started = time.perf_counter()
    config = replace(
        FleetConfig(seed=args.seed, servers=args.servers, days=days),
        legitimate_silences=not args.no_silences,
    )
    if args.restart_after is not None:
        config = replace(config, restart_after=args.restart_after)
    result = run_fleet(config)
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps(fleet_document(result), indent=2))
    else:
        print(format_fleet(result, elapsed))
    return 0

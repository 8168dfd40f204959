"""`stallwatch demo`: run the whole pipeline locally and play the incident stallwatch is for.

`stallwatch demo restart-helper` is the demo restarter's `command` action (see
`stallwatch.demo.supervisor`); it is run by the restarter, not by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from stallwatch.demo.errors import DemoInterrupted
from stallwatch.demo.run import DemoOptions, run_demo
from stallwatch.demo.script import FULL_SCRIPT, SHORT_SCRIPT
from stallwatch.demo.supervisor import ask_supervisor_to_restart
from stallwatch.localstack.errors import LocalStackError


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline locally (no Docker) and play a short scripted incident",
        description=(
            "Start two simulated vLLM servers, a proxy, the exporter, the restarter and real "
            "Prometheus and Alertmanager (Debian's prometheus and prometheus-alertmanager) on "
            "loopback, then play the incident stallwatch was made for: a batch job keeps one "
            "server busy (no test requests, no restart), a long prompt runs (busy, never "
            "stuck), then a server really hangs and is restarted once. Prints a timeline and a "
            "summary table; everything it started is stopped at the end, also on Ctrl-C. "
            "Runs from a source checkout (`make demo`). Exit code 0 when the story happened "
            "as it should."
        ),
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="a shorter script (about a minute instead of about two), for tests",
    )
    parser.add_argument(
        "--json-summary",
        type=Path,
        metavar="FILE",
        help="also write the summary (per server, the journal, the timeline, the PIDs of "
        "every process started) as JSON to FILE",
    )
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="color the timeline (default: auto, when stdout is a terminal and NO_COLOR unset)",
    )
    parser.set_defaults(handler=run)
    commands = parser.add_subparsers(
        dest="demo_command",
        metavar="[COMMAND]",
        title="commands",
        description="without a command, run the demo",
    )
    helper = commands.add_parser(
        "restart-helper",
        help="the demo restarter's command action (run by the restarter, not by hand)",
        description=(
            "Ask the demo's supervisor at SUPERVISOR_URL to restart the simulated server named "
            "in $STALLWATCH_TARGET (the restarter sets it for its command action), with the "
            "bearer token read from TOKEN_FILE. Prints the supervisor's answer once the new "
            "process is listening. Exit code 0 on success, 1 when the supervisor refused or "
            "could not be reached, 2 when STALLWATCH_TARGET is not set."
        ),
    )
    helper.add_argument("supervisor_url", metavar="SUPERVISOR_URL")
    helper.add_argument("token_file", type=Path, metavar="TOKEN_FILE")
    helper.set_defaults(handler=run_restart_helper)


def run(args: argparse.Namespace) -> int:
    color = args.color == "always" or (
        args.color == "auto" and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    )
    options = DemoOptions(
        script=SHORT_SCRIPT if args.short else FULL_SCRIPT,
        json_summary=args.json_summary,
        color=color,
    )
    try:
        report = run_demo(options)
    except KeyboardInterrupt:
        print("\ninterrupted; everything the demo started is stopped", file=sys.stderr)
        return 130
    except DemoInterrupted:
        print("\nterminated; everything the demo started is stopped", file=sys.stderr)
        return 143
    except LocalStackError as error:
        print(f"stallwatch demo: {error}", file=sys.stderr)
        return 1
    return 0 if report.ok else 1


def run_restart_helper(args: argparse.Namespace) -> int:
    return ask_supervisor_to_restart(args.supervisor_url, args.token_file)

"""`stallwatch restarter`: the Alertmanager webhook receiver that restarts stuck model servers."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from stallwatch import USER_AGENT
from stallwatch.common.cli import EXIT_USAGE, add_service_arguments, setup_logging
from stallwatch.common.config import ConfigError, parse_duration
from stallwatch.common.config_files import empty_on_reload
from stallwatch.common.config_files import load_restarter_config as load_config
from stallwatch.common.restarter_config import RestarterConfig
from stallwatch.common.text import printable
from stallwatch.core.holds import hold_refusal
from stallwatch.core.kube_routing import LabelSelectorConflict
from stallwatch.net.fetch import read_metrics
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.journal_reader import (
    JournalEntry,
    JournalError,
    JournalReader,
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "restarter",
        help="Alertmanager webhook receiver: the only component that restarts a model server",
        description=(
            "Receive Alertmanager webhooks (POST /alerts, payload version 4, bearer token) and "
            "restart a target only when every safety rule agrees: a restart alert, a target "
            "from the config, not a duplicate, not in cooldown, within its budget, within the "
            "fleet limits, confirmed by two fresh reads of its /metrics, and not dry-run. "
            "Every decision is journaled in SQLite before the webhook answers. "
            "Also serves GET /journal (authenticated), GET /metrics and GET /-/healthy."
        ),
    )
    parser.add_argument("--config", type=Path, metavar="FILE", help="YAML config file (required)")
    add_service_arguments(
        parser, log_help="log level (default: info); one line is logged per decision"
    )
    parser.add_argument(
        "--config.check-targets",
        dest="config_check_targets",
        action="store_true",
        help="as --config.check, and read each target's /metrics once: exit 1 if any target "
        "cannot be read or carries no engine metrics (its stalls could never be confirmed)",
    )
    parser.set_defaults(handler=run)
    commands = parser.add_subparsers(dest="restarter_command", metavar="COMMAND")
    journal = commands.add_parser(
        "journal",
        help="print the latest decisions from the journal and exit",
        description="Read the journal file named in the config and print its latest rows.",
    )
    journal.add_argument(
        "--config",
        dest="journal_config",
        type=Path,
        metavar="FILE",
        help="YAML config file (its `journal` path is read); or --config before `journal`",
    )
    journal.add_argument(
        "--limit",
        type=int,
        default=20,
        metavar="N",
        help="number of rows to show, newest first (default: 20)",
    )
    journal.add_argument(
        "--target",
        metavar="NAME",
        help="only the rows about this target (its name as in the config and the alerts)",
    )
    journal.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per row and line, every column, the detail unescaped "
        "(a command's whole output, newlines included, is one field)",
    )
    journal.set_defaults(handler=run_journal)
    pause = _journal_command(
        commands,
        "pause",
        help="pause restarts (maintenance) until resumed or for a while; written to the journal",
        description="Write a pause into the journal named in the config: the running restarter "
        "restarts nothing until `resume` (or until --for has passed). Survives its restarts.",
    )
    pause.add_argument(
        "--for", dest="pause_for", metavar="DURATION", help="e.g. 2h (default: until resumed)"
    )
    pause.set_defaults(handler=run_control, control="paused")
    resume = _journal_command(
        commands,
        "resume",
        help="close the latched breaker and end a pause; written to the journal",
        description="Write a resume into the journal named in the config: the breaker closes "
        "and any pause ends. Resume once the cause of a mass stall or of failed actions is fixed.",
    )
    resume.set_defaults(handler=run_control, control="resumed")
    hold = _journal_command(
        commands,
        "hold",
        target=True,
        help="say that one target will be silent for a while (a weight sync, maintenance)",
        description="Write a hold into the journal named in the config: the running restarter "
        "acts on no restart alert of TARGET until the hold ends (at most the config's max_hold) "
        "or `unhold`. A server still silent after its hold is judged as usual.",
    )
    hold.add_argument("--for", dest="hold_for", metavar="DURATION", required=True, help="e.g. 5m")
    hold.set_defaults(handler=run_hold, control="hold")
    unhold = _journal_command(
        commands, "unhold", target=True, help="end a target's hold now; written to the journal"
    )
    unhold.set_defaults(handler=run_hold, control="hold_released")


def _journal_command(
    commands: argparse._SubParsersAction[Any],
    name: str,
    *,
    help: str,
    description: str | None = None,
    target: bool = False,
) -> argparse.ArgumentParser:
    """A command that writes one row into the config's journal: [TARGET] --config FILE
    [--reason TEXT]."""
    command: argparse.ArgumentParser = commands.add_parser(name, help=help, description=description)
    if target:
        command.add_argument("target", metavar="TARGET", help="a target of the config")
    command.add_argument(
        "--config",
        dest="control_config",
        type=Path,
        metavar="FILE",
        help=f"YAML config file (its `journal` path is written); or --config before `{name}`",
    )
    command.add_argument("--reason", default="", help="why, for the journal")
    return command


def _command_config(args: argparse.Namespace, own: Path | None) -> Path | None:
    """A command's config file: its own --config, or the one given before the command
    (`stallwatch restarter --config FILE journal`); None, said on stderr, when neither or two
    different ones were given."""
    before: Path | None = args.config
    if own is not None and before is not None and own != before:
        print(
            f"stallwatch restarter {args.restarter_command}: two configs given, "
            f"{before} and {own}: give one --config",
            file=sys.stderr,
        )
        return None
    path = own or before
    if path is None:
        print(
            f"stallwatch restarter {args.restarter_command}: --config FILE is required "
            "(before or after the command)",
            file=sys.stderr,
        )
    return path


def _load(path: Path) -> RestarterConfig | None:
    try:
        config = load_config(path)
    except ConfigError as error:
        print(f"invalid config: {error}", file=sys.stderr)
        return None
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return config


def describe(config: RestarterConfig) -> list[str]:
    mode = "DRY RUN" if config.dry_run else "live"
    auth = "NO AUTHENTICATION" if config.token is None else "bearer token"
    lines = [
        f"listen {config.listen} ({auth}{', TLS' if config.tls_cert_file else ''}), {mode}",
        f"journal {config.journal}",
        f"restart alerts: {', '.join(config.restart_alerts)}",
        f"fleet: {config.max_in_flight} in flight, {config.fleet_window.max_targets} targets "
        f"per {config.fleet_window.window:g} s",
    ]
    for target in config.targets:
        lines.append(
            f"  {target.name}: {target.action.kind}, cooldown {target.cooldown:g} s, "
            f"budget {target.budget.max_restarts} per {target.budget.window:g} s, "
            f"confirm at {target.metrics_url}"
        )
    for rule in config.rules:
        selector = ",".join(f"{key}={value}" for key, value in rule.selector)
        lines.append(
            f"  rule {rule.name}: {rule.action.kind} {rule.action.mode} pods in "
            f"{', '.join(rule.namespaces)} labelled {selector}, cooldown {rule.cooldown:g} s, "
            f"confirm at the pod's port {rule.metrics_port}{rule.metrics_path}"
        )
    lines.extend(config.quarantine_summary())
    lease = config.kubernetes.lease if config.kubernetes else None
    if lease is not None:
        lines.append(
            f"lease {lease.namespace}/{lease.name} as {lease.identity}: only its holder acts"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    if args.config is None:
        print("stallwatch restarter: --config FILE is required", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(args.log_level, args.log_format)
    config = _load(args.config)
    if config is None:
        return 1
    if args.config_check or args.config_check_targets:
        empty = empty_on_reload(args.config)
        if empty:
            print(f"warning: {empty}", file=sys.stderr)
        print(f"{args.config}: valid, {len(config.targets)} targets")
        for line in describe(config):
            print(f"  {line}")
        if args.config_check_targets:
            return 0 if asyncio.run(check_targets(config)) else 1
        return 0
    try:
        asyncio.run(_serve_until_signal(config, args.config))
    except OSError as error:
        print(f"stallwatch restarter: cannot listen on {config.listen}: {error}", file=sys.stderr)
        return 1
    except sqlite3.Error as error:
        print(
            f"stallwatch restarter: cannot open journal {config.journal}: {error}", file=sys.stderr
        )
        return 1
    except (JournalError, LabelSelectorConflict) as error:
        print(f"stallwatch restarter: {error}", file=sys.stderr)
        return 1
    return 0


async def check_targets(config: RestarterConfig) -> bool:
    """Read each target's metrics URL once, as the confirmation will; print what each gave."""
    print("reading each target's metrics once:")
    usable = True
    async with aiohttp.ClientSession(headers={"User-Agent": USER_AGENT}) as session:
        results = await asyncio.gather(
            *(
                read_metrics(session, target.metrics_url, timeout=config.confirm.timeout)
                for target in config.targets
            )
        )
    for target, result in zip(config.targets, results, strict=True):
        if result.reading is None:
            usable = False
            print(f"  {target.name}: PROBLEM: {target.metrics_url}: {result.detail}")
        elif not result.reading.has_engines:
            usable = False
            print(
                f"  {target.name}: PROBLEM: {target.metrics_url} answers, but with no engine "
                "metrics (is it a model server's /metrics?): no stall could ever be confirmed, "
                "every restart would be skipped"
            )
        else:
            models = ", ".join(result.reading.model_names) or "unnamed model"
            print(f"  {target.name}: ok, {len(result.reading.engines)} engine(s), {models}")
    return usable


async def _serve_until_signal(config: RestarterConfig, config_path: Path) -> None:
    from stallwatch.restarter.app import serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await serve(config, stop=stop, config_path=config_path)


def format_table(entries: list[JournalEntry]) -> str:
    """The journal rows as a table for a terminal, newest first."""
    header = ("time (UTC)", "target", "alert", "decision", "reason", "detail")
    rows = [header]
    for entry in entries:
        when = datetime.datetime.fromtimestamp(entry.time, tz=datetime.UTC)
        detail = printable(entry.detail)
        if entry.duration_seconds is not None:
            detail = f"{entry.duration_seconds:.1f} s: {detail}"
        rows.append(
            (
                when.strftime("%Y-%m-%d %H:%M:%S"),
                printable(entry.target) or "-",
                printable(entry.alertname) or "-",
                printable(entry.decision),
                printable(entry.reason),
                detail if len(detail) <= 80 else detail[:79] + "…",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
        + "  "
        + row[-1]
        for row in rows
    )


def _write(config: RestarterConfig, row: Callable[[Journal], object]) -> bool:
    """Write one row into the config's journal; whether it was written (else: said why)."""
    try:
        journal = Journal.open(config.journal)
    except JournalError as error:
        print(error, file=sys.stderr)
        return False
    try:
        row(journal)
    except JournalError as error:
        print(error, file=sys.stderr)
        return False
    finally:
        journal.close()
    return True


def run_control(args: argparse.Namespace) -> int:
    """`pause` / `resume`: one control row in the journal; the restarter reads it at once."""
    path = _command_config(args, args.control_config)
    if path is None:
        return EXIT_USAGE
    config = _load(path)
    if config is None:
        return 1
    duration: float | None = None
    if args.control == "paused" and args.pause_for is not None:
        try:
            duration = parse_duration(args.pause_for)
        except ValueError as error:
            print(f"--for: {error}", file=sys.stderr)
            return EXIT_USAGE
        if duration <= 0:
            print("--for: must be longer than zero", file=sys.stderr)
            return EXIT_USAGE
    reason = args.reason or f"{args.control} from the command line"
    if not _write(
        config, lambda j: j.record_control(args.control, reason, time.time(), duration=duration)
    ):
        return 1
    if args.control == "resumed":
        print(
            f"resumed: breaker closed and pause ended (journal {config.journal}); "
            "a running restarter judges the alerts it held again within seconds"
        )
    else:
        length = "until resumed" if duration is None else f"for {args.pause_for}"
        print(f"paused {length} (journal {config.journal})")
    return 0


def run_hold(args: argparse.Namespace) -> int:
    """`hold` / `unhold`: one hold row in the journal; the restarter reads it at its next
    decision."""
    path = _command_config(args, args.control_config)
    if path is None:
        return EXIT_USAGE
    config = _load(path)
    if config is None:
        return 1
    target: str = args.target
    if config.target(target) is None and not config.rules:
        print(f"{target!r} is not a target of {path}", file=sys.stderr)
        return EXIT_USAGE
    duration = 0.0
    if args.control == "hold":
        try:
            duration = parse_duration(args.hold_for)
        except ValueError as error:
            print(f"--for: {error}", file=sys.stderr)
            return EXIT_USAGE
        refusal = hold_refusal(duration, config.max_hold)
        if refusal is not None:
            print(f"--for: {refusal}", file=sys.stderr)
            return EXIT_USAGE
    reason = args.reason or f"{args.control} from the command line"
    if not _write(
        config,
        lambda j: j.record_hold(args.control, target, reason, time.time(), duration=duration),
    ):
        return 1
    if args.control == "hold":
        print(f"{target} held for {args.hold_for} (journal {config.journal})")
    else:
        print(
            f"{target}: hold ended (journal {config.journal}); a running restarter judges "
            "its held alerts again within seconds"
        )
    return 0


def run_journal(args: argparse.Namespace) -> int:
    path = _command_config(args, args.journal_config)
    if path is None:
        return EXIT_USAGE
    config = _load(path)
    if config is None:
        return 1
    if args.limit < 1:
        print("--limit: expected a positive integer", file=sys.stderr)
        return EXIT_USAGE
    try:
        journal = JournalReader.open_read_only(config.journal)
    except FileNotFoundError as error:
        print(f"{error} (the restarter has not written anything yet)", file=sys.stderr)
        return 1
    except JournalError as error:
        print(error, file=sys.stderr)
        return 1
    try:
        entries = journal.recent(args.limit, target=args.target)
    except JournalError as error:
        print(f"{error} (is it damaged, or not a journal?)", file=sys.stderr)
        return 1
    finally:
        journal.close()
    if args.json:
        for entry in entries:
            print(json.dumps(entry.as_json(), ensure_ascii=True))
        return 0
    if not entries:
        print("the journal is empty" if args.target is None else f"no rows about {args.target}")
        return 0
    print(format_table(entries))
    return 0

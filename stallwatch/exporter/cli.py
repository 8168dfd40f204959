"""`stallwatch exporter`: poll every configured target and publish its health for Prometheus."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from stallwatch.common.cli import add_service_arguments, setup_logging
from stallwatch.common.config import ConfigError, parse_listen
from stallwatch.common.config_files import empty_on_reload, load_exporter_config
from stallwatch.common.event_loop import (
    EVENT_LOOPS,
    EventLoopUnavailable,
    choose_event_loop,
    run_on,
)
from stallwatch.common.garbage import set_for_service
from stallwatch.exporter.app import ListenError, serve
from stallwatch.exporter.supervisor import supervise, worker_command
from stallwatch.exporter.web_config import describe as describe_web_config
from stallwatch.exporter.web_config import load_web_config
from stallwatch.exporter.workers import WorkerShare, cores_here

# More workers than this is a mistake, not a machine.
MAX_WORKERS = 256

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "exporter",
        help="poll model servers' own /metrics and publish derived health gauges",
        description=(
            "Poll every target in the config on its own interval, classify it "
            "(down, no_metrics, restarted, sleeping, busy, stalled, idle, unresponsive, unknown) "
            "from the server's own counters, and publish the result at /metrics. "
            "SIGHUP or POST /-/reload reloads the config; a bad file is refused and the "
            "running config is kept."
        ),
    )
    parser.add_argument("--config", required=True, type=Path, help="YAML config file")
    parser.add_argument(
        "--listen",
        "--web.listen-address",
        dest="listen",
        default=None,
        help="override the config's listen address (host:port)",
    )
    parser.add_argument(
        "--web.config.file",
        dest="web_config_file",
        type=Path,
        metavar="FILE",
        help="TLS and basic auth for the exporter's own endpoint, in the Prometheus "
        "exporter-toolkit format (tls_server_config, basic_auth_users with bcrypt hashes); "
        "read at start",
    )
    parser.add_argument(
        "--workers",
        type=workers_argument,
        default=1,
        metavar="N",
        help="worker processes behind the one listening address, each owning a share of the "
        "targets (a target's history stays in one; a /probe reaching another is handed to "
        "it); 'auto': the cores this process may use (affinity and cgroup quota). Default 1",
    )
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default="auto",
        help="the event loop: uvloop (less CPU per read) or asyncio's own; 'auto', the "
        "default: uvloop where it is installed",
    )
    # How the supervisor starts a worker: not for people.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--worker-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-restarts", type=int, default=0, help=argparse.SUPPRESS)
    add_service_arguments(parser, log_help="log level (default: info)")
    parser.set_defaults(handler=run)


def workers_argument(text: str) -> int:
    """--workers: a number of processes, at least 1, or `auto`."""
    if text == "auto":
        return cores_here()
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'auto'") from None
    if not 1 <= count <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_WORKERS}, not {count}")
    return count


def worker_share(args: argparse.Namespace) -> WorkerShare:
    """The share the supervisor gave this worker (--worker=INDEX/COUNT and its companions)."""
    index, _, count = str(args.worker).partition("/")
    return WorkerShare(int(index), int(count), Path(args.worker_dir), args.worker_restarts)


def worker_argv(args: argparse.Namespace) -> list[str]:
    """How the supervisor starts each worker: this command, less --workers and --listen."""
    argv = [*worker_command(), "exporter", "--config", str(args.config)]
    argv += ["--event-loop", args.event_loop]
    if args.web_config_file is not None:
        argv += ["--web.config.file", str(args.web_config_file)]
    return [*argv, f"--log.level={args.log_level}", f"--log.format={args.log_format}"]


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    try:
        config = load_exporter_config(args.config)
        if args.listen is not None:
            try:
                host, port = parse_listen(args.listen)
            except ValueError as error:
                raise ConfigError("--listen", "", str(error)) from error
            config = dataclasses.replace(config, listen_host=host, listen_port=port)
        web_config = None
        if args.web_config_file is not None:
            web_config = load_web_config(args.web_config_file)
    except ConfigError as error:
        print(f"invalid config: {error}", file=sys.stderr)
        return 1
    if args.config_check:
        empty = empty_on_reload(Path(args.config))
        for warning in (*config.warnings, *([empty] if empty else [])):
            print(f"warning: {warning}", file=sys.stderr)
        print(f"{args.config}: valid, {len(config.targets)} targets")
        if web_config is not None:
            print(f"{args.web_config_file}: valid, {describe_web_config(web_config)}")
        for target in config.targets:
            print(
                f"  {target.name}: {target.kind} {target.url} every {target.interval_seconds:g} s"
            )
        for module in config.modules.values():
            print(
                f"  module {module.name}: {module.kind} /probe every "
                f"{module.interval_seconds:g} s at most, allow {', '.join(module.allow)}"
            )
        return 0
    try:
        loop = choose_event_loop(args.event_loop)
    except EventLoopUnavailable as error:
        print(f"stallwatch exporter: {error}", file=sys.stderr)
        return 1
    if args.worker is None:
        for warning in config.warnings:
            log.warning("%s", warning)
        log.info("event loop: %s", loop.describe())
    set_for_service()
    try:
        if args.worker is not None:
            sock = socket.socket(fileno=args.worker_fd)
            run_on(
                loop,
                serve(config, args.config, web_config, sock=sock, workers=worker_share(args)),
            )
        elif args.workers > 1:
            scheme = "https" if web_config is not None and web_config.tls else "http"
            run_on(loop, supervise(config, args.config, worker_argv(args), args.workers, scheme))
        else:
            run_on(loop, serve(config, args.config, web_config))
    except ListenError as error:
        print(f"stallwatch exporter: {error}", file=sys.stderr)
        return 1
    return 0

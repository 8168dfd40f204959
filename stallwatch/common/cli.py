"""What every command line of stallwatch shares: flags, durations, logging and the usage exit."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from stallwatch.common.config import parse_duration

# A usage error (unknown flag, bad value) exits with sysexits' EX_USAGE: 1, 2 and 3 are verdicts
# of `stallwatch check` (stuck, down, cannot judge), so argparse's usual 2 would read as "down".
EXIT_USAGE = 64


class UsageErrorParser(argparse.ArgumentParser):
    """An argument parser whose usage errors exit with EXIT_USAGE instead of 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def positive_duration(text: str) -> float:
    """An argparse type: a duration as in the config files (`5s`, `1m30s`, `500ms`), above zero."""
    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than zero, got {text!r}")
    return seconds


def add_service_arguments(parser: argparse.ArgumentParser, *, log_help: str) -> None:
    """The flags every long-running component shares: --config.check and --log-level."""
    parser.add_argument(
        "--config.check",
        dest="config_check",
        action="store_true",
        help="validate the config file, print a summary and exit (0 valid, 1 invalid)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help=log_help,
    )


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

"""What every long-running component's command line shares: --config.check, --log-level, logging."""

from __future__ import annotations

import argparse
import logging


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

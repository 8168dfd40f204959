"""What every command line of stallwatch shares: flags, durations, logging and the usage exit."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import re
import sys
from typing import Any, NoReturn

from stallwatch import __version__
from stallwatch.common.config import parse_duration

# A usage error (unknown flag, bad value) exits with sysexits' EX_USAGE: 1, 2 and 3 are verdicts
# of `stallwatch check` (stuck, down, cannot judge), so argparse's usual 2 would read as "down".
EXIT_USAGE = 64
LOG_FORMATS = ("text", "json", "logfmt")
# The attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(
    set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
)


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


def duration_or_seconds(text: str) -> float:
    """An argparse type: a duration as in the config files (`30s`, `10m`, `1h30m`), or, for the
    options that took one before durations did, a plain number of seconds (`30`, `0.5`); >= 0."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds) or seconds < 0:
            raise argparse.ArgumentTypeError(
                f"expected a duration (30s, 10m) or a number of seconds >= 0, got {text!r}"
            )
        return seconds
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}, or a number of seconds") from None


def add_service_arguments(parser: argparse.ArgumentParser, *, log_help: str) -> None:
    """The flags every long-running component shares: --config.check, --log-level, --log-format,
    --version."""
    parser.add_argument("--version", action="version", version=f"stallwatch {__version__}")
    parser.add_argument(
        "--config.check",
        dest="config_check",
        action="store_true",
        help="validate the config file, print a summary and exit (0 valid, 1 invalid)",
    )
    add_logging_arguments(parser, log_help=log_help)


def add_logging_arguments(
    parser: argparse.ArgumentParser, *, log_help: str, default_level: str = "info"
) -> None:
    """--log-level and --log-format (or, as Prometheus spells them, --log.level and
    --log.format), for any command that logs while it runs."""
    parser.add_argument(
        "--log-level",
        "--log.level",
        dest="log_level",
        default=default_level,
        choices=("debug", "info", "warning", "error"),
        help=log_help,
    )
    add_log_format_argument(parser)


def add_log_format_argument(parser: argparse.ArgumentParser) -> None:
    """--log-format (or --log.format): text lines (default), one JSON object per line, or
    logfmt."""
    parser.add_argument(
        "--log-format",
        "--log.format",
        dest="log_format",
        default="text",
        choices=LOG_FORMATS,
        help="log line format (default: text): json writes one object per line with time, "
        "level, logger, message and the record's fields; logfmt writes key=value pairs",
    )


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record_fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, Any]:
    """A record as flat fields: time, level, logger, message, the `extra` ones, any exception."""
    fields: dict[str, Any] = {
        "time": _timestamp(record),
        "level": record.levelname.lower(),
        "logger": record.name,
        "message": record.getMessage(),
    }
    for name, value in vars(record).items():
        if name not in _RECORD_ATTRIBUTES and name not in fields:
            fields[name] = value
    if record.exc_info:
        fields["exception"] = formatter.formatException(record.exc_info)
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a multi-line message or exception stays in its field."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_fields(record, self), default=str, ensure_ascii=False)


_LOGFMT_BARE = re.compile(r"[^\s\"=\\]+")


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if _LOGFMT_BARE.fullmatch(text) and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)


class LogfmtFormatter(logging.Formatter):
    """One `key=value` line per record (values with spaces, quotes or newlines quoted)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record, self)
        return " ".join(f"{name}={_logfmt_value(value)}" for name, value in fields.items())


def setup_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at `level`, as text lines, JSON objects or logfmt lines."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}, expected one of {LOG_FORMATS}")
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    elif log_format == "logfmt":
        handler.setFormatter(LogfmtFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])

"""--log-format: text, one JSON object per line, or logfmt, for every long-running component."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys

import pytest

from stallwatch.cli import build_parser
from stallwatch.common.cli import JsonFormatter, LogfmtFormatter, setup_logging


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord(
        "stallwatch.restarter", logging.WARNING, "x.py", 1, message, args, None
    )
    made.created = 1_780_000_000.25
    for name, value in extra.items():
        setattr(made, name, value)
    return made


def test_json_lines_carry_time_level_logger_message_and_extra_fields() -> None:
    """A record becomes one JSON object with the four fixed fields and each `extra` field."""
    line = JsonFormatter().format(record("restart target=%s", "gpu1", client="10.0.0.9", n=3))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2026-05-28T20:26:40.250Z",
        "level": "warning",
        "logger": "stallwatch.restarter",
        "message": "restart target=gpu1",
        "client": "10.0.0.9",
        "n": 3,
    }


def test_a_multi_line_message_and_its_exception_stay_in_one_json_line() -> None:
    """Newlines in the message and a traceback are escaped inside their fields."""
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failing = record("first line\nsecond line")
        failing.exc_info = sys.exc_info()
    line = JsonFormatter().format(failing)
    assert len(line.splitlines()) == 1
    fields = json.loads(line)
    assert fields["message"] == "first line\nsecond line"
    assert "RuntimeError: boom" in fields["exception"]


def test_logfmt_quotes_values_with_spaces_quotes_or_newlines() -> None:
    """logfmt keeps bare words bare and quotes the rest, so the line splits back into pairs."""
    line = LogfmtFormatter().format(record('said "hi"\nthen left', path="/alerts", count=2))
    assert len(line.splitlines()) == 1
    pairs = dict(part.split("=", 1) for part in shlex.split(line.replace("\\n", " ")))
    assert pairs["level"] == "warning"
    assert pairs["logger"] == "stallwatch.restarter"
    assert pairs["path"] == "/alerts"
    assert pairs["count"] == "2"
    assert line.startswith("time=2026-05-28T20:26:40.250Z level=warning ")
    assert 'message="said \\"hi\\"\\nthen left"' in line


@pytest.mark.parametrize(
    "argv",
    [
        ["exporter", "--config", "x.yml"],
        ["restarter", "--config", "x.yml"],
        ["sim"],
    ],
)
@pytest.mark.parametrize("log_format", ["text", "json", "logfmt"])
def test_every_long_running_component_takes_log_format(argv: list[str], log_format: str) -> None:
    """The exporter, the restarter and the simulator accept --log-format text|json|logfmt."""
    args = build_parser().parse_args([*argv, "--log-format", log_format])
    assert isinstance(args, argparse.Namespace)
    assert args.log_format == log_format


def test_an_unknown_log_format_is_a_usage_error() -> None:
    """--log-format xml exits with the usage code, not a verdict's."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["exporter", "--config", "x.yml", "--log-format", "xml"])
    assert exit_info.value.code == 64


def test_setup_logging_refuses_an_unknown_format() -> None:
    """A format the formatters do not know is a clear error, not a silent text log."""
    with pytest.raises(ValueError, match="unknown log format"):
        setup_logging("info", "yaml")

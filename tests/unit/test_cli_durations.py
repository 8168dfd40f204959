"""Every command line option that takes a duration reads Prometheus durations (`60s`, `1m30s`),
as the config files do; the simulator's, which took seconds before, still take a number."""

from __future__ import annotations

import argparse
import re

import pytest

from stallwatch.cli import build_parser
from stallwatch.common.cli import EXIT_USAGE, duration_or_seconds, positive_duration

URL = "http://127.0.0.1:9"
# Words in an option's name that say it takes a time.
TIME_WORDS = re.compile(r"duration|interval|timeout|seconds|delay|wait_for|_for$|after|period")


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60s", 60.0), ("1m30s", 90.0), ("500ms", 0.5), ("2h", 7200.0), ("60", 60.0), ("0.5", 0.5)],
)
def test_sim_load_duration_takes_a_duration_or_seconds(text: str, seconds: float) -> None:
    """`stallwatch sim load --duration 60s` is 60 s, as `--duration 60` still is."""
    assert parse("sim", "load", URL, "--duration", text).duration == seconds


@pytest.mark.parametrize("text", ["1.5m", "-1", "nan", "inf", "60x", "", "1m 30s"])
def test_bad_durations_are_usage_errors_naming_the_option(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value that is neither a duration nor a number of seconds exits 64 and names the flag."""
    with pytest.raises(SystemExit) as raised:
        parse("sim", "load", URL, "--duration", text)
    assert raised.value.code == EXIT_USAGE
    assert "argument --duration:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30.0), ("30", 30.0), ("-1", -1.0), ("0", 0.0), ("2m", 120.0)]
)
def test_sim_sleep_idle_takes_a_duration_seconds_or_never(text: str, seconds: float) -> None:
    """`--sleep-idle-seconds` takes a duration or seconds; a negative number still means never."""
    assert parse("sim", "--sleep-idle-seconds", text).sleep_idle_seconds == seconds


def test_check_takes_the_same_durations() -> None:
    """`stallwatch check --interval 60s --timeout 1m30s --test-request-timeout 2s` parses."""
    args = parse(
        "check", URL, "--interval", "60s", "--timeout", "1m30s", "--test-request-timeout", "2s"
    )
    assert (args.interval, args.timeout, args.test_request_timeout) == (60.0, 90.0, 2.0)


def _options(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, f"{path} {name}")
        elif action.option_strings:
            found.append((f"{path} {action.option_strings[0]}", action))
    return found


def test_no_time_option_takes_a_bare_float() -> None:
    """No option whose name says it takes a time parses with plain float or int (the walk sees
    every subcommand: it finds the options above)."""
    options = _options(build_parser(), "stallwatch")
    timed = [(where, a) for where, a in options if TIME_WORDS.search(a.dest)]
    assert {"stallwatch sim load --duration", "stallwatch check --interval"} <= {
        where for where, _ in timed
    }
    bare = [where for where, action in timed if action.type in (float, int)]
    assert bare == []
    typed = {where for where, a in timed if a.type in (positive_duration, duration_or_seconds)}
    assert "stallwatch sim load --duration" in typed


def test_the_old_test_request_flags_still_work_and_say_they_are_deprecated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--no-probe` and `--probe-timeout` set the new flags and warn on stderr (until 0.3)."""
    args = parse("check", URL, "--no-probe", "--probe-timeout", "3s")
    assert (args.no_test_request, args.test_request_timeout) == (True, 3.0)
    err = capsys.readouterr().err
    assert "--no-probe is deprecated (removed in 0.3): use --no-test-request" in err
    assert "--probe-timeout is deprecated (removed in 0.3): use --test-request-timeout" in err

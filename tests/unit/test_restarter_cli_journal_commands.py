"""The restarter's journal-writing commands (pause, resume, hold, unhold) take --config and
--reason alike, from one helper."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from stallwatch.cli import build_parser, main
from stallwatch.common.cli import EXIT_USAGE


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "control"),
    [
        (("pause",), "paused"),
        (("pause", "--for", "2h"), "paused"),
        (("resume",), "resumed"),
        (("hold", "gpu1", "--for", "5m"), "hold"),
        (("unhold", "gpu1"), "hold_released"),
    ],
)
def test_each_takes_config_and_reason(argv: tuple[str, ...], control: str) -> None:
    """Each command reads `--config FILE` and `--reason TEXT` into the same fields."""
    args = parse("restarter", *argv, "--config", "r.yml", "--reason", "maintenance")
    assert (str(args.control_config), args.reason, args.control) == (
        "r.yml",
        "maintenance",
        control,
    )


@pytest.mark.parametrize(
    "argv", [("pause",), ("resume",), ("hold", "gpu1", "--for", "5m"), ("unhold", "gpu1")]
)
def test_each_needs_its_config(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    """Without --config, before or after the command, each is a usage error naming the option."""
    assert main(["restarter", *argv]) == EXIT_USAGE
    assert "--config FILE is required (before or after the command)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [("pause",), ("resume",), ("hold", "gpu1", "--for", "5m"), ("unhold", "gpu1"), ("journal",)],
)
def test_config_before_the_command_is_taken(argv: tuple[str, ...]) -> None:
    """`stallwatch restarter --config FILE COMMAND` reads FILE, as `COMMAND --config FILE` does."""
    args = parse("restarter", "--config", "r.yml", *argv)
    assert str(args.config) == "r.yml"
    assert getattr(args, "control_config", None) is None
    assert getattr(args, "journal_config", None) is None


def test_two_different_configs_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A --config before the command and another after it: a usage error naming both."""
    assert main(["restarter", "--config", "a.yml", "journal", "--config", "b.yml"]) == EXIT_USAGE
    assert "two configs given, a.yml and b.yml" in capsys.readouterr().err


def test_the_reason_defaults_to_empty() -> None:
    """No --reason: an empty reason (the command then writes one of its own)."""
    assert parse("restarter", "unhold", "gpu1", "--config", "r.yml").reason == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("hold", "gpu1", "--for", "2h"), "--for: "),
        (("hold", "nosuch", "--for", "5m"), "'nosuch' is not a target"),
        (("pause", "--for", "0s"), "--for: must be longer than zero"),
        (("journal", "--limit", "0"), "--limit: expected a positive integer"),
    ],
)
def test_a_bad_argument_is_a_usage_error(
    argv: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hold past max_hold, an unknown target, a zero pause, a limit of 0: exit 64 (usage), not
    2, with the option named."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    config = tmp_path / "restarter.yml"
    config.write_text(
        "token_file: token\njournal: journal.sqlite\nmax_hold: 1h\ntargets:\n"
        "  - {name: gpu1, url: 'http://127.0.0.1:8000', action: {kind: command, argv: ['true']}}\n"
    )
    assert main(["restarter", "--config", str(config), *argv]) == EXIT_USAGE
    assert message in capsys.readouterr().err

"""A config file with several mistakes is refused with every one of them, each with its field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stallwatch.common.config import ConfigError, ConfigErrors
from stallwatch.common.config_files import load_exporter_config, load_restarter_config

EXPORTER = """\
listen: localhost
interval: 15 seconds
colour: blue
targets:
  - name: gpu1
    url: http://127.0.0.1:8000/metrics
  - name: gpu2
    url: http://127.0.0.1:8001
    timeout: 30s
  - url: http://127.0.0.1:8002
  - name: gpu1
    url: http://127.0.0.1:8003
    test_request: {enabled: maybe}
modules:
  vllm:
    allow: []
"""
# In the order they are read: a mapping's unknown keys first, then its fields.
EXPORTER_ERRORS = [
    (
        "colour",
        "unknown key (known keys: degraded, interval, listen, max_payload_bytes, modules, probe, "
        "targets, test_request, timeout)",
    ),
    ("listen", "expected host:port, e.g. 127.0.0.1:9732, got 'localhost'"),
    ("interval", "expected a duration like 15s, 10m or 1h, got '15 seconds'"),
    ("targets[0].url", "'http://127.0.0.1:8000/metrics' points into /metrics"),
    ("targets[1].timeout", "must not be longer than the interval"),
    ("targets[2].name", "is required"),
    ("targets[3].test_request.enabled", "expected true or false, got 'maybe'"),
    ("targets[3].name", "duplicate target name 'gpu1'"),
    ("modules.vllm.allow", "required: the hosts or networks /probe may read"),
]

RESTARTER = """\
journal: journal.sqlite
confirm: {gap: 500ms}
dry_run: perhaps
targets:
  - name: gpu1
    url: http://127.0.0.1:8000
    action: {kind: ssh, host: gpu1}
  - name: gpu2
    url: http://127.0.0.1:8001
    cooldown: 10 minutes
    action: {kind: command, argv: []}
  - name: gpu3
    url: http://127.0.0.1:8002
    budget: {max_restarts: 0}
    action: {kind: docker, container: vllm-3, stop_timeout: 5m}
"""
RESTARTER_ERRORS = [
    ("token_file", "is required (or set insecure_no_auth: true)"),
    ("dry_run", "expected true or false, got 'perhaps'"),
    ("confirm.gap", "must be at least 1s"),
    (
        "targets[0].action.kind",
        "expected one of command, docker, systemd, http, kubernetes, got 'ssh'",
    ),
    ("targets[1].action.argv", "expected at least the program"),
    ("targets[1].cooldown", "expected a duration like 15s, 10m or 1h, got '10 minutes'"),
    ("targets[2].action.stop_timeout", "must be shorter than the target's action_timeout"),
    ("targets[2].budget.max_restarts", "expected an integer >= 1, got 0"),
]


def _errors(raised: ConfigError) -> list[tuple[str, str]]:
    assert isinstance(raised, ConfigErrors)
    return [(error.field, error.message) for error in raised.errors]


def _matches(found: list[tuple[str, str]], expected: list[tuple[str, str]]) -> None:
    assert [field for field, _ in found] == [field for field, _ in expected]
    for (_, message), (_, start) in zip(found, expected, strict=True):
        assert message.startswith(start), message


def test_an_exporter_config_reports_every_error_at_once(tmp_path: Path) -> None:
    """Nine mistakes across the top, four targets and a module: all nine, in reading order."""
    path = tmp_path / "exporter.yml"
    path.write_text(EXPORTER)
    with pytest.raises(ConfigError) as raised:
        load_exporter_config(path)
    _matches(_errors(raised.value), EXPORTER_ERRORS)
    assert isinstance(raised.value, ConfigErrors)
    assert {error.source for error in raised.value.errors} == {str(path)}


def test_a_restarter_config_reports_every_error_at_once(tmp_path: Path) -> None:
    """Eight mistakes at the top and in three targets' actions and limits: all eight."""
    path = tmp_path / "restarter.yml"
    path.write_text(RESTARTER)
    with pytest.raises(ConfigError) as raised:
        load_restarter_config(path)
    _matches(_errors(raised.value), RESTARTER_ERRORS)


def test_several_errors_print_as_one_line_each_under_the_file(tmp_path: Path) -> None:
    """The message names the file and the count once, then one `field: message` line each."""
    path = tmp_path / "exporter.yml"
    path.write_text("listen: localhost\ncolour: blue\n")
    with pytest.raises(ConfigError) as raised:
        load_exporter_config(path)
    lines = str(raised.value).splitlines()
    assert lines[0] == f"{path}: 2 errors"
    assert lines[1].startswith("  colour: unknown key (known keys: ")
    assert lines[2] == "  listen: expected host:port, e.g. 127.0.0.1:9732, got 'localhost'"


def test_one_error_reads_as_before(tmp_path: Path) -> None:
    """A file with one mistake gets the one line `FILE: FIELD: MESSAGE`, no count."""
    path = tmp_path / "exporter.yml"
    path.write_text("interval: 0s\n")
    with pytest.raises(ConfigError) as raised:
        load_exporter_config(path)
    assert str(raised.value) == f"{path}: interval: must be at least 50ms, got 0s"


def test_the_config_check_prints_every_error(tmp_path: Path) -> None:
    """`stallwatch exporter --config.check` lists all the mistakes and exits 1."""
    path = tmp_path / "exporter.yml"
    path.write_text(EXPORTER)
    result = subprocess.run(
        [sys.executable, "-m", "stallwatch", "exporter", "--config", str(path), "--config.check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert f"{path}: {len(EXPORTER_ERRORS)} errors" in result.stderr
    for field, _ in EXPORTER_ERRORS:
        assert f"\n  {field}: " in result.stderr

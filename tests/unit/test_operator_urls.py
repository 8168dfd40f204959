"""The URLs operators write: base URLs that point into /metrics, and the restarter's url."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from stallwatch.common.config import ConfigError
from stallwatch.common.config_files import load_restarter_config
from stallwatch.common.exporter_config import exporter_config_from_mapping, metrics_in_base_url
from stallwatch.common.restarter_config import CommandAction


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://h:8000/metrics", "http://h:8000"),
        ("http://h:8000/metrics/", "http://h:8000"),
        ("http://h:8000/metrics/v1", "http://h:8000"),
        ("https://gw.example/vllm-a/metrics", "https://gw.example/vllm-a"),
    ],
)
def test_a_url_into_metrics_is_named_with_its_base(url: str, base: str) -> None:
    """A base URL through /metrics is a problem whose message gives the base URL to write."""
    problem = metrics_in_base_url(url)
    assert problem.startswith(f"{url!r} points into /metrics: give the server's base URL, {base!r}")


@pytest.mark.parametrize(
    "url", ["http://h:8000", "http://h:8000/", "https://gw.example/vllm-a", "http://h/metricsx"]
)
def test_base_urls_pass(url: str) -> None:
    """Base URLs, with or without a path prefix, are not refused."""
    assert metrics_in_base_url(url) == ""


def test_exporter_refuses_a_url_ending_in_metrics() -> None:
    """The exporter's `url: .../metrics` is refused, naming the file, the field and the fix."""
    document = {"targets": [{"name": "gpu1", "url": "http://10.0.0.1:8000/metrics"}]}
    with pytest.raises(ConfigError) as raised:
        exporter_config_from_mapping(document, "exporter.yml")
    assert str(raised.value).startswith(
        "exporter.yml: targets[0].url: 'http://10.0.0.1:8000/metrics' points into /metrics: "
        "give the server's base URL, 'http://10.0.0.1:8000'"
    )


def write(tmp_path: Path, target: dict[str, Any]) -> Path:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    target = {"name": "gpu1", "action": {"kind": "command", "argv": ["true"]}, **target}
    path = tmp_path / "restarter.yml"
    document = {"token_file": "token", "journal": "j.sqlite", "targets": [target]}
    path.write_text(yaml.safe_dump(document))
    return path


def load_target_error(tmp_path: Path, target: dict[str, Any]) -> str:
    path = write(tmp_path, target)
    with pytest.raises(ConfigError) as raised:
        load_restarter_config(path)
    return str(raised.value).removeprefix(f"{path}: ")


def test_restarter_url_is_a_base_url_like_the_exporters(tmp_path: Path) -> None:
    """The restarter's `url` is the base URL; the confirmation reads url + metrics_path."""
    config = load_restarter_config(write(tmp_path, {"url": "http://10.0.0.1:8000/"}))
    assert config.targets[0].metrics_url == "http://10.0.0.1:8000/metrics"
    assert config.warnings == ()
    custom = {"url": "https://gw/vllm-a", "metrics_path": "/custom/metrics"}
    config = load_restarter_config(write(tmp_path, custom))
    assert config.targets[0].metrics_url == "https://gw/vllm-a/custom/metrics"


def test_restarter_metrics_url_still_works_with_a_deprecation_warning(tmp_path: Path) -> None:
    """`metrics_url` keeps working for one version and says what to write instead."""
    path = write(tmp_path, {"metrics_url": "http://10.0.0.1:8000/metrics"})
    config = load_restarter_config(path)
    assert config.targets[0].metrics_url == "http://10.0.0.1:8000/metrics"
    assert config.warnings == (
        f"{path}: targets[0].metrics_url: deprecated (to be removed in 0.3): "
        "write url: http://10.0.0.1:8000 instead, as in the exporter's targets",
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            {"metrics_url": "http://10.0.0.1:8000"},
            "targets[0].metrics_url: 'http://10.0.0.1:8000' is a base URL, not a /metrics "
            "endpoint: write url: http://10.0.0.1:8000 instead",
        ),
        (
            {"metrics_url": "http://h:1/metrics", "url": "http://h:1"},
            "targets[0].metrics_url: give url (and metrics_path), not metrics_url too",
        ),
        (
            {"url": "http://10.0.0.1:8000/metrics"},
            "targets[0].url: 'http://10.0.0.1:8000/metrics' points into /metrics",
        ),
        ({"url": "http://h:1", "metrics_path": "metrics"}, "targets[0].metrics_path: must start"),
        ({}, "targets[0].url: is required"),
    ],
)
def test_restarter_urls_that_cannot_confirm_are_refused(
    tmp_path: Path, target: dict[str, Any], message: str
) -> None:
    """A base URL given as metrics_url, both keys, a /metrics base URL: each refused by name."""
    assert load_target_error(tmp_path, target).startswith(message)


def test_command_program_not_on_path_is_refused(tmp_path: Path) -> None:
    """argv[0] that is not on the PATH is a config error, not a failure at restart time."""
    target = {"url": "http://h:1", "action": {"kind": "command", "argv": ["restart-vllm-nope"]}}
    assert load_target_error(tmp_path, target) == (
        "targets[0].action.argv: program 'restart-vllm-nope' not found on the PATH"
    )


def test_command_program_path_must_exist_and_be_executable(tmp_path: Path) -> None:
    """argv[0] given as a path must be an executable file."""
    missing = {"url": "http://h:1", "action": {"kind": "command", "argv": ["/nonexistent/x"]}}
    assert load_target_error(tmp_path, missing) == (
        "targets[0].action.argv: program not found: /nonexistent/x"
    )
    script = tmp_path / "restart.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    plain = {"url": "http://h:1", "action": {"kind": "command", "argv": [str(script)]}}
    assert load_target_error(tmp_path, plain) == (
        f"targets[0].action.argv: {script} is not executable (chmod +x)"
    )


def test_relative_program_path_is_taken_next_to_the_config(tmp_path: Path) -> None:
    """A relative argv[0] resolves next to the config file, like every other path in it."""
    (tmp_path / "actions").mkdir()
    script = tmp_path / "actions" / "restart.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    target = {"url": "http://h:1", "action": {"kind": "command", "argv": ["actions/restart.sh"]}}
    config = load_restarter_config(write(tmp_path, target))
    assert config.targets[0].action == CommandAction(argv=(str(script),))


def test_program_on_path_is_kept_as_a_name(tmp_path: Path) -> None:
    """A program found on the PATH is kept as its name (looked up again when run)."""
    assert shutil.which("true") is not None
    config = load_restarter_config(write(tmp_path, {"url": "http://h:1"}))
    assert config.targets[0].action == CommandAction(argv=("true",))

"""Restarter config: defaults, and errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from stallwatch.restarter.config import (
    CommandAction,
    ConfigError,
    DockerAction,
    HttpAction,
    SystemdAction,
    load_config,
    parse_duration,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "restarter.yml"


def write_config(tmp_path: Path, document: dict[str, Any]) -> Path:
    (tmp_path / "token").write_text("s3cret\n")
    path = tmp_path / "restarter.yml"
    path.write_text(yaml.safe_dump(document))
    return path


def minimal(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "token_file": "token",
        "journal": "journal.sqlite",
        "targets": [
            {
                "name": "gpu1",
                "metrics_url": "http://127.0.0.1:8000/metrics",
                "action": {"kind": "command", "argv": ["true"]},
            }
        ],
    }
    document.update(changes)
    return document


def test_defaults(tmp_path: Path) -> None:
    """A minimal config gets the documented defaults, and paths resolve next to the file."""
    config = load_config(write_config(tmp_path, minimal()))
    assert config.listen == "127.0.0.1:9733"
    assert config.token == "s3cret"
    assert config.restart_alerts == ("LLMServerStuck", "LLMServerUnresponsive")
    assert config.journal == str(tmp_path / "journal.sqlite")
    assert config.confirm.gap == 5.0
    assert config.max_in_flight == 1
    assert (config.fleet_window.max_targets, config.fleet_window.window) == (2, 900.0)
    target = config.targets[0]
    assert (target.cooldown, target.action_timeout) == (600.0, 120.0)
    assert (target.budget.max_restarts, target.budget.window) == (3, 3600.0)
    assert target.action == CommandAction(argv=("true",))


def test_every_action_kind_parses(tmp_path: Path) -> None:
    """The four action kinds parse into their dataclasses."""
    (tmp_path / "supervisor.token").write_text("t")
    targets = [
        {
            "name": "a",
            "metrics_url": "http://h:1/metrics",
            "action": {"kind": "command", "argv": ["x", "y"]},
        },
        {
            "name": "b",
            "metrics_url": "http://h:2/metrics",
            "action": {"kind": "docker", "container": "vllm-b", "stop_timeout": "20s"},
        },
        {
            "name": "c",
            "metrics_url": "http://h:3/metrics",
            "action": {"kind": "systemd", "unit": "vllm.service"},
        },
        {
            "name": "d",
            "metrics_url": "https://h:4/metrics",
            "action": {
                "kind": "http",
                "url": "http://sup/restart",
                "bearer_token_file": "supervisor.token",
            },
        },
    ]
    config = load_config(write_config(tmp_path, minimal(targets=targets)))
    actions = [target.action for target in config.targets]
    assert actions[0] == CommandAction(argv=("x", "y"))
    assert actions[1] == DockerAction(container="vllm-b", stop_timeout=20.0)
    assert actions[2] == SystemdAction(unit="vllm.service")
    assert actions[3] == HttpAction(
        url="http://sup/restart", bearer_token_file=str(tmp_path / "supervisor.token")
    )


ERROR_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown top-level key", minimal(colour="blue"), "restarter.yml: colour: unknown key"),
    (
        "unknown key in a target",
        minimal(targets=[{**minimal()["targets"][0], "cooldwn": "5m"}]),
        "restarter.yml: targets[0].cooldwn: unknown key",
    ),
    (
        "bad duration",
        minimal(
            targets=[
                minimal()["targets"][0],
                {**minimal()["targets"][0], "name": "gpu2", "cooldown": "10 minutes"},
            ]
        ),
        'restarter.yml: targets[1].cooldown: expected a duration like "10m"',
    ),
    (
        "missing token file",
        minimal(token_file="missing.token"),
        "restarter.yml: token_file: file not found: missing.token",
    ),
    (
        "no token and no explicit insecure mode",
        {k: v for k, v in minimal().items() if k != "token_file"},
        "restarter.yml: token_file: required",
    ),
    (
        "duplicate target names",
        minimal(targets=[minimal()["targets"][0], minimal()["targets"][0]]),
        "restarter.yml: targets[1].name: duplicate target name 'gpu1'",
    ),
    (
        "unknown action kind",
        minimal(targets=[{**minimal()["targets"][0], "action": {"kind": "ssh"}}]),
        "restarter.yml: targets[0].action.kind: expected one of",
    ),
    (
        "command given as a shell string",
        minimal(
            targets=[{**minimal()["targets"][0], "action": {"kind": "command", "argv": "x y"}}]
        ),
        "restarter.yml: targets[0].action.argv: expected a list of strings",
    ),
    (
        "docker stop timeout longer than the action timeout",
        minimal(
            targets=[
                {
                    **minimal()["targets"][0],
                    "action_timeout": "30s",
                    "action": {"kind": "docker", "container": "c", "stop_timeout": "1m"},
                }
            ]
        ),
        "restarter.yml: targets[0].action.stop_timeout: must be shorter",
    ),
    (
        "metrics URL without a scheme",
        minimal(targets=[{**minimal()["targets"][0], "metrics_url": "gpu1:8000/metrics"}]),
        "restarter.yml: targets[0].metrics_url: expected an http:// or https:// URL",
    ),
    (
        "budget below one",
        minimal(targets=[{**minimal()["targets"][0], "budget": {"max_restarts": 0}}]),
        "restarter.yml: targets[0].budget.max_restarts: expected an integer >= 1",
    ),
    (
        "listen without a port",
        minimal(listen="localhost"),
        "restarter.yml: listen: expected HOST:PORT",
    ),
    ("no targets", minimal(targets=[]), "restarter.yml: targets: expected a non-empty list"),
    (
        "a certificate without its key",
        minimal(tls_cert_file="token"),
        "restarter.yml: tls_cert_file: tls_cert_file and tls_key_file go together",
    ),
]


@pytest.mark.parametrize(
    ("case", "document", "message"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES]
)
def test_config_errors_name_file_and_field(
    tmp_path: Path, case: str, document: dict[str, Any], message: str
) -> None:
    """A bad config is refused with a message that starts with the file and the field path."""
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path, document))
    assert str(caught.value).startswith(message), case


def test_insecure_mode_needs_no_token(tmp_path: Path) -> None:
    """`insecure_no_auth: true` is the only way to run without a token."""
    document = {k: v for k, v in minimal().items() if k != "token_file"}
    config = load_config(write_config(tmp_path, {**document, "insecure_no_auth": True}))
    assert config.token is None
    assert config.insecure_no_auth


def test_empty_token_file_is_refused(tmp_path: Path) -> None:
    """An empty token file would make every request authentic; it is an error."""
    path = write_config(tmp_path, minimal())
    (tmp_path / "token").write_text("\n")
    with pytest.raises(ConfigError, match=r"^restarter.yml: token_file: token is empty"):
        load_config(path)


def test_not_yaml(tmp_path: Path) -> None:
    """A file that is not YAML is refused with its name."""
    path = tmp_path / "restarter.yml"
    path.write_text("targets: [\n")
    with pytest.raises(ConfigError, match=r"^restarter.yml: not valid YAML"):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("10m", 600.0), ("1h", 3600.0), ("1h30m", 5400.0), ("200ms", 0.2), ("0s", 0.0)],
)
def test_durations(text: str, seconds: float) -> None:
    """Prometheus-style durations convert to seconds."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "m", "1.5h", "10 m", "1x", "-5s", "5s "])
def test_bad_durations(text: str) -> None:
    """Anything else is refused."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_example_config_is_valid(tmp_path: Path) -> None:
    """examples/restarter.yml loads (with its token file present)."""
    example = yaml.safe_load(EXAMPLE.read_text())
    example["token_file"] = "token"
    example["targets"] = [
        {**t, "action": {**t["action"], "bearer_token_file": "token"}}
        if t["action"].get("bearer_token_file")
        else t
        for t in example["targets"]
    ]
    config = load_config(write_config(tmp_path, example))
    assert {t.action.kind for t in config.targets} == {"command", "docker", "systemd", "http"}

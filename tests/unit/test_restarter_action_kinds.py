"""The action kinds: one table in the config, one of runners, the same keys in both."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from stallwatch.common.config import ConfigError
from stallwatch.common.config_files import load_restarter_config
from stallwatch.common.restarter_config import ACTION_KINDS, Action
from stallwatch.restarter.actions import RUNNERS


def _kind_of(action_type: type[Any]) -> str:
    (kind,) = (f.default for f in fields(action_type) if f.name == "kind")
    return str(kind)


def test_config_kinds_and_runners_have_the_same_keys() -> None:
    """Every kind the config parses has a runner and every runner a kind the config parses."""
    assert set(ACTION_KINDS) == set(RUNNERS)


def test_each_action_class_has_its_row_in_both_tables() -> None:
    """Each class of the Action union is the one its kind's runner takes, under its own kind."""
    kinds = {_kind_of(action_type): action_type for action_type in get_args(Action)}
    assert set(kinds) == set(ACTION_KINDS)
    for kind, action_type in kinds.items():
        assert RUNNERS[kind].action_type is action_type
        assert "kind" in ACTION_KINDS[kind].keys


def _write(tmp_path: Path, action: object) -> Path:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    path = tmp_path / "restarter.yml"
    document = {
        "token_file": "token",
        "journal": "journal.sqlite",
        "targets": [{"name": "gpu1", "url": "http://127.0.0.1:8000", "action": action}],
    }
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (
            {"kind": "ssh", "host": "gpu1"},
            "targets[0].action.kind: expected one of command, docker, systemd, http, "
            "kubernetes, got 'ssh'",
        ),
        (
            {"url": "http://127.0.0.1:9000/restart"},
            "targets[0].action.kind: expected one of command, docker, systemd, http, "
            "kubernetes, got None",
        ),
        ("restart-gpu1", "targets[0].action: expected a mapping, got str"),
    ],
    ids=["unknown", "missing", "not-a-mapping"],
)
def test_an_action_without_a_known_kind_is_a_config_error(
    tmp_path: Path, action: object, message: str
) -> None:
    """An unknown or missing kind is refused naming the file and the field, never run as http."""
    path = _write(tmp_path, action)
    with pytest.raises(ConfigError) as raised:
        load_restarter_config(path)
    assert str(raised.value) == f"{path}: {message}"

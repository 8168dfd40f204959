"""Hostile config files: invalid Unicode, control characters, alias bombs, huge values and an
empty file are each one config error naming the file and the field or position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallwatch.cli import main
from stallwatch.common.config import ConfigError
from stallwatch.common.config_files import (
    EMPTY_ON_RELOAD,
    MAX_ALIAS_EXPANSION,
    load_exporter_config,
    load_restarter_config,
)


def _write(tmp_path: Path, text: str, name: str = "exporter.yml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def _refusal(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as raised:
        load_exporter_config(path)
    return raised.value


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (
            "targets:\n  - name: a\n    url: http://127.0.0.1:8000\n"
            '    labels: {team: "\\ud800"}\n',
            "targets[0].labels.team",
        ),
        (
            'targets:\n  - name: "gpu\\udfff"\n    url: http://127.0.0.1:8000\n',
            "targets[0].name",
        ),
        (
            'targets:\n  - name: a\n    url: http://127.0.0.1:8000\n    labels: {"\\ud800": x}\n',
            "targets[0].labels.\\ud800",
        ),
    ],
    ids=["label-value", "target-name", "label-name"],
)
def test_a_lone_surrogate_is_refused_at_load_naming_the_field(
    tmp_path: Path, text: str, field: str
) -> None:
    """A YAML \\ud800 escape in a label or a target name is refused at load, naming the field,
    and the message itself can be printed as UTF-8."""
    error = _refusal(_write(tmp_path, text))
    assert error.field == field
    assert "not valid Unicode" in error.message
    str(error).encode("utf-8")


def test_an_emoji_written_by_json_dumps_is_refused_naming_the_field(tmp_path: Path) -> None:
    """A config written by json.dumps holds an emoji as two \\u escapes, which YAML reads as two
    lone halves: refused at load, naming the target's name, with how to write it."""
    document = {"targets": [{"name": "gpu-\U0001f680", "url": "http://127.0.0.1:8000"}]}
    error = _refusal(_write(tmp_path, json.dumps(document)))
    assert error.field == "targets[0].name"
    assert "lone surrogate U+D83D" in error.message


def test_a_restarter_target_name_that_is_not_unicode_is_refused(tmp_path: Path) -> None:
    """The restarter's loader refuses a lone surrogate too, naming the field."""
    path = _write(
        tmp_path,
        'journal: j.sqlite\ntargets:\n  - name: "x\\ud800"\n    metrics_url: http://a/metrics\n',
        "restarter.yml",
    )
    with pytest.raises(ConfigError) as raised:
        load_restarter_config(path)
    assert raised.value.field == "targets[0].name"


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("interval: 15s  # ring \x07\ntargets: []\n", "line 1, column 23"),
        ("targets:\n  - name: gpu\x00a\n    url: http://127.0.0.1:8000\n", "line 2, column 14"),
        ("targets: []\n\x1b[31m: x\n", "line 2, column 1"),
    ],
    ids=["bel-in-comment", "nul-in-name", "escape"],
)
def test_a_control_character_is_one_error_line_with_file_and_position(
    tmp_path: Path, text: str, position: str
) -> None:
    """A control character anywhere in the file is one ConfigError line naming the file, the
    line and column, and the character (it was a PyYAML traceback without the file's name)."""
    path = _write(tmp_path, text)
    error = _refusal(path)
    assert str(error).startswith(f"{path}: not valid YAML: {position}: character U+")
    assert "\n" not in str(error)


def test_config_check_prints_one_line_for_a_control_character(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stallwatch exporter --config.check` on a file with a BEL: exit 1, one line, no traceback."""
    path = _write(tmp_path, "interval: 15s # \x07\n")
    assert main(["exporter", "--config", str(path), "--config.check"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert str(path) in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "text",
    [
        "interval: 2026-13-45\n",  # a timestamp PyYAML cannot build
        "targets: " + "[" * 2000 + "]" * 2000 + "\n",  # nested deeper than the parser recurses
        "a: &a [*a]\n",  # an alias inside its own anchor
    ],
    ids=["bad-timestamp", "deep-nesting", "self-alias"],
)
def test_every_other_loader_error_is_one_config_error_line(tmp_path: Path, text: str) -> None:
    """Whatever the YAML loader raises is a ConfigError of one line naming the file."""
    path = _write(tmp_path, text)
    error = _refusal(path)
    assert str(error).startswith(f"{path}: ")
    assert "\n" not in str(error)


def _alias_bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        previous = f"*a{level - 1}"
        lines.append(f"a{level}: &a{level} [{', '.join([previous] * 9)}]")
    lines.append(f"interval: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_with_a_short_message(tmp_path: Path) -> None:
    """500 bytes of nested aliases (billions of values) are refused at load as an alias bomb,
    in a message of one short line (it was 312 MB)."""
    text = _alias_bomb(10)
    assert len(text) < 800
    error = _refusal(_write(tmp_path, text))
    assert "alias" in error.message
    assert len(str(error)) < 1000


def test_aliases_that_expand_within_the_bound_still_load(tmp_path: Path) -> None:
    """An anchor shared by many targets (one test_request written once) loads as before."""
    first = (
        "  - name: gpu0\n    url: http://127.0.0.1:8000\n"
        "    test_request: &shared {timeout: 7s, min_interval: 2m}\n"
    )
    others = "".join(
        f"  - name: gpu{index}\n    url: http://127.0.0.1:{8000 + index}\n"
        "    test_request: *shared\n"
        for index in range(1, 300)
    )
    config = load_exporter_config(_write(tmp_path, "targets:\n" + first + others))
    assert len(config.targets) == 300
    assert {target.test_request.timeout_seconds for target in config.targets} == {7.0}
    assert MAX_ALIAS_EXPANSION >= 100_000


@pytest.mark.parametrize(
    "text",
    [
        "interval: " + "9" * 1_000_000 + "s\n",
        "interval: [" + ", ".join(["x" * 100] * 10_000) + "]\n",
        "x" * 200_000 + ": 1\n",
    ],
    ids=["huge-string", "huge-list", "huge-key"],
)
def test_a_huge_value_is_quoted_bounded(tmp_path: Path, text: str) -> None:
    """The value or key a message quotes is cut short, however big it is in the file."""
    error = _refusal(_write(tmp_path, text))
    assert len(str(error)) < 2000


def test_an_empty_file_is_refused_on_reload_and_loads_at_start(tmp_path: Path) -> None:
    """A file with nothing in it (or only comments) is refused on reload, saying why and how to
    ask for no targets; at start it still reads as no targets; `targets: []` reloads."""
    for text in ("", "# being written\n", "---\n"):
        path = _write(tmp_path, text)
        with pytest.raises(ConfigError) as raised:
            load_exporter_config(path, reloading=True)
        assert raised.value.message == EMPTY_ON_RELOAD
        assert load_exporter_config(path).targets == ()
    assert load_exporter_config(_write(tmp_path, "targets: []\n"), reloading=True).targets == ()


def test_config_check_warns_of_an_empty_file_that_a_reload_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--config.check` of an empty file passes (a start takes it) and warns that a reload
    refuses it; `targets: []` gets no warning."""
    empty = _write(tmp_path, "# being written\n")
    assert main(["exporter", "--config", str(empty), "--config.check"]) == 0
    assert EMPTY_ON_RELOAD in capsys.readouterr().err
    explicit = _write(tmp_path, "targets: []\n")
    assert main(["exporter", "--config", str(explicit), "--config.check"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "text", "field"),
    [
        (
            "exporter.yml",
            "targets:\n  - name: a\n    url: http://bob:s3cret@127.0.0.1:8000\n",
            "targets[0].url",
        ),
        (
            "restarter.yml",
            "token_file: t\njournal: j.sqlite\ntargets:\n  - name: a\n"
            "    url: https://bob:s3cret@gpu.example:8000\n"
            "    action: {kind: http, url: 'http://127.0.0.1:1/restart'}\n",
            "targets[0].url",
        ),
        (
            "restarter.yml",
            "token_file: t\njournal: j.sqlite\ntargets:\n  - name: a\n"
            "    url: http://127.0.0.1:8000\n"
            "    action: {kind: http, url: 'http://:s3cret@127.0.0.1:1/restart'}\n",
            "targets[0].action.url",
        ),
    ],
    ids=["exporter-target", "restarter-target", "http-action"],
)
def test_user_info_in_a_url_is_refused_without_repeating_the_password(
    tmp_path: Path, name: str, text: str, field: str
) -> None:
    """A static target's URL (or an action's) with user:password@ is refused at load, as a
    /probe target is, naming the field and where credentials go, and the refusal does not
    repeat the password (it was sent, and published in stallwatch_target_info{url})."""
    (tmp_path / "t").write_text("token\n")
    (tmp_path / "t").chmod(0o600)
    path = _write(tmp_path, text, name)
    loader = load_exporter_config if name == "exporter.yml" else load_restarter_config
    with pytest.raises(ConfigError) as raised:
        loader(path)
    errors = getattr(raised.value, "errors", (raised.value,))
    mine = [error for error in errors if error.field == field]
    assert mine, str(raised.value)
    assert "user info (user:password@) is not allowed" in mine[0].message
    assert "credentials go in their own config fields" in mine[0].message
    assert "s3cret" not in str(raised.value)

"""`test_request:` configures the idle test request; its old name `probe:` still works until 0.3,
with a warning naming the file and the key's place, and the two at once are an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.common.config import ConfigError
from stallwatch.common.config_files import load_exporter_config

# The same settings at the top, in a target and in a module, under the key `KEY`.
EVERY_PLACE = """\
KEY: {endpoint: chat, timeout: 3s}
targets:
  - name: a
    url: http://127.0.0.1:8000
    KEY: {enabled: false, min_interval: 2m}
modules:
  fleet:
    allow: [127.0.0.1]
    KEY: {enabled: true, model: tiny}
"""


def write(tmp_path: Path, key: str) -> Path:
    path = tmp_path / "exporter.yml"
    path.write_text(EVERY_PLACE.replace("KEY", key), encoding="utf-8")
    return path


@pytest.mark.parametrize("key", ["test_request", "probe"])
def test_either_name_configures_the_test_request_everywhere(tmp_path: Path, key: str) -> None:
    """`test_request:` and the old `probe:` set the same fields, at the top and below."""
    config = load_exporter_config(write(tmp_path, key))
    (target,) = config.targets
    assert (target.test_request.endpoint, target.test_request.timeout_seconds) == ("chat", 3.0)
    assert (target.test_request.enabled, target.test_request.min_interval_seconds) == (False, 120.0)
    module = config.modules["fleet"]
    assert (
        module.test_request.enabled,
        module.test_request.model,
        module.test_request.endpoint,
    ) == (
        True,
        "tiny",
        "chat",
    )


def test_the_new_name_warns_of_nothing(tmp_path: Path) -> None:
    """A file written with `test_request:` loads with no warning."""
    assert load_exporter_config(write(tmp_path, "test_request")).warnings == ()


def test_the_old_name_warns_naming_the_file_and_each_place(tmp_path: Path) -> None:
    """Each `probe:` is one warning naming the file and its place, and saying what to write."""
    path = write(tmp_path, "probe")
    warnings = load_exporter_config(path).warnings
    places = ["probe", "targets[0].probe", "modules.fleet.probe"]
    assert [w.split(": ")[:2] for w in warnings] == [[str(path), place] for place in places]
    assert all(
        "deprecated (to be removed in 0.3): write test_request: instead" in w for w in warnings
    )


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("test_request: {enabled: true}\nprobe: {enabled: false}\n", "probe"),
        (
            "targets:\n  - name: a\n    url: http://127.0.0.1:8000\n"
            "    probe: {}\n    test_request: {}\n",
            "targets[0].probe",
        ),
        (
            "modules:\n  fleet:\n    allow: [127.0.0.1]\n"
            "    probe: {enabled: true}\n    test_request: {enabled: true}\n",
            "modules.fleet.probe",
        ),
    ],
    ids=["top", "target", "module"],
)
def test_both_names_in_one_place_is_an_error_naming_file_and_field(
    tmp_path: Path, text: str, field: str
) -> None:
    """`probe:` beside `test_request:` is refused naming the file and the field, in every place."""
    path = tmp_path / "exporter.yml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_exporter_config(path)
    assert (raised.value.source, raised.value.field) == (str(path), field)
    assert "keep test_request only" in raised.value.message

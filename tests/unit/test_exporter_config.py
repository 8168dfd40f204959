"""Exporter config: typed, strict, and every error names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.common.config import ConfigError, parse_duration
from stallwatch.exporter.config import load_config

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exporter.yml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_config_is_valid() -> None:
    """The shipped example loads, with defaults filled in per target."""
    config = load_config(REPO / "examples" / "exporter.yml")
    assert [t.name for t in config.targets] == ["gpu-a", "gpu-b", "gateway"]
    gpu_a, gpu_b, gateway = config.targets
    assert gpu_a.interval_seconds == 15.0
    assert gpu_b.interval_seconds == 10.0
    assert gpu_b.probe.model == "tiny"
    assert gpu_a.probe.timeout_seconds == 10.0
    assert gateway.kind == "proxy"
    assert dict(gpu_a.labels) == {"host": "gpu-a"}
    assert gpu_a.metrics_url == "http://127.0.0.1:8000/metrics"


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (
            "targets:\n- {name: a, url: http://x:1, intervl: 5s}\n",
            "targets[0].intervl",
            "unknown key",
        ),
        ("targets:\n- {name: a}\n", "targets[0].url", "is required"),
        ("targets:\n- {name: a, url: ftp://x}\n", "targets[0].url", "http(s) URL"),
        ("targets:\n- {name: a, url: http://x:1, kind: ollama}\n", "targets[0].kind", "one of"),
        ("interval: soon\n", "interval", "duration"),
        ("listen: nowhere\n", "listen", "host:port"),
        (
            "targets:\n- {name: a, url: http://x:1}\n- {name: a, url: http://y:1}\n",
            "targets[1].name",
            "duplicate",
        ),
        (
            "targets:\n- {name: a, url: http://x:1, probe: {endpoint: grpc}}\n",
            "targets[0].probe.endpoint",
            "one of",
        ),
        (
            "targets:\n- {name: a, url: http://x:1, labels: {target: x}}\n",
            "targets[0].labels",
            "cannot be used",
        ),
        (
            "targets:\n- {name: a, url: http://x:1, interval: 1s, timeout: 5s}\n",
            "targets[0].timeout",
            "longer than the interval",
        ),
        ("- just a list\n", "", "mapping"),
        ("targets: [\n", "", "not valid YAML"),
    ],
)
def test_bad_config_names_file_and_field(
    tmp_path: Path, text: str, field: str, message: str
) -> None:
    """Each mistake is refused with the file, the field path and what was expected."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert raised.value.source == str(path)
    assert raised.value.field == field
    assert message in str(raised.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A missing file is reported as such, not as a traceback."""
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yml")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15.0), ("1m30s", 90.0), ("2h", 7200.0), ("500ms", 0.5), (3, 3.0), ("1d", 86400.0)],
)
def test_durations(text: object, seconds: float) -> None:
    """Prometheus-style durations and plain numbers are seconds."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "s", "1x", "-5s", True, None, "5s 3m"])
def test_bad_durations(text: object) -> None:
    """Anything else is refused."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)

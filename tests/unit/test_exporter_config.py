"""Exporter config: typed, strict, and every error names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.common.config import ConfigError, parse_duration, parse_listen
from stallwatch.common.config_files import load_exporter_config

REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO / "tests" / "testdata" / "config"

# tests/testdata/config/exporter-invalid-NAME.yml -> the exact message after "FILE: ".
INVALID: dict[str, str] = {
    "duplicate-key-nested": "targets[0].labels: line 5: duplicate key (first on line 4)",
    "duplicate-key": "interval: line 3: duplicate key (first on line 1)",
    "duplicate-target": "targets[1].name: duplicate target name 'a'",
    "interval-fraction": "interval: expected a duration like 15s, 10m or 1h, got '1.5h'",
    "interval-inf": "interval: expected a duration like 15s, 10m or 1h, got inf",
    "interval-nan": "interval: expected a duration like 15s, 10m or 1h, got nan",
    "interval-negative": "interval: expected a duration like 15s, 10m or 1h, got '-5s'",
    "interval-number": "interval: expected a duration like 15s, 10m or 1h, got 15",
    "interval-zero": "interval: must be at least 50ms, got 0s",
    "kind": (
        "targets[0].kind: expected one of auto, vllm, sglang, tgi, llamacpp, lmdeploy, "
        "trtllm, triton, proxy, got 'ollama'"
    ),
    "label-name": "targets[0].labels: 'target' cannot be used as a label name",
    "listen-ipv6": "listen: write an IPv6 address in brackets, e.g. [::1]:9732, got '::1:9732'",
    "listen": "listen: expected host:port, e.g. 127.0.0.1:9732, got 'nowhere'",
    "max-payload": "max_payload_bytes: expected an integer >= 1024, got 10",
    "metrics-path": "targets[0].metrics_path: must start with /",
    "missing-url": "targets[0].url: is required",
    "null-key": "(top level): line 1: key ~ is not a string (quote it if it is meant as one)",
    "number-key": (
        "targets[0].labels: line 5: key 1 is not a string (quote it if it is meant as one)"
    ),
    "test-request-endpoint": (
        "targets[0].test_request.endpoint: expected one of completions, chat, got 'grpc'"
    ),
    "test-request-min-interval": (
        "targets[0].test_request.min_interval: expected a duration like 15s, 10m or 1h, got '-1m'"
    ),
    "test-request-timeout-zero": "test_request.timeout: must be at least 100ms, got 0s",
    "test-request-twice": (
        "targets[0].probe: the old name of targets[0].test_request, given beside it: "
        "keep test_request only"
    ),
    "timeout-nan": "targets[0].timeout: expected a duration like 15s, 10m or 1h, got nan",
    "timeout-over-interval": "targets[0].timeout: must not be longer than the interval",
    "top-level-list": "expected a mapping at the top level, got list",
    "unknown-key": (
        "targets[0].intervl: unknown key (known keys: degraded, interval, kind, labels, "
        "metrics_path, name, probe, test_request, timeout, url)"
    ),
    "degraded-factor": (
        "targets[0].degraded.collapse_factor: must be above 0 and at most 1, got 1.5"
    ),
    "degraded-min-samples": (
        "degraded.baseline_min_samples: must be from 1 to baseline_samples (10), got 20"
    ),
    "degraded-window": (
        "targets[0].degraded.admission_window: expected a duration like 15s, 10m or 1h, got 10"
    ),
    "degraded-unknown": (
        "degraded.restart: unknown key (known keys: admission_window, baseline_min_samples, "
        "baseline_samples, collapse_factor, collapse_window, enabled, kv_cache_full, "
        "preemption_window, preemptions_per_second, queue_time, queue_time_window)"
    ),
    "url-ipv6": "targets[0].url: not a valid URL (Invalid IPv6 URL): 'http://[::1'",
    "url-port": (
        "targets[0].url: the port must be a number from 1 to 65535, got 'http://127.0.0.1:99999'"
    ),
    "url-scheme": (
        "targets[0].url: expected an http:// or https:// URL with a host, got 'ftp://127.0.0.1/'"
    ),
    "yaml": "not valid YAML: line 2, column 1: expected the node content, but found '<stream end>'",
}


def test_every_invalid_file_has_its_expected_message() -> None:
    """The table and the files agree: no bad config goes untested, no case lacks its file."""
    files = {p.name for p in TESTDATA.glob("exporter-invalid-*.yml")}
    assert files == {f"exporter-invalid-{name}.yml" for name in INVALID}


@pytest.mark.parametrize(("name", "message"), INVALID.items(), ids=list(INVALID))
def test_invalid_config_is_refused_with_its_exact_message(name: str, message: str) -> None:
    """Each bad file is refused with one line: the file, the field path and what was expected."""
    path = TESTDATA / f"exporter-invalid-{name}.yml"
    with pytest.raises(ConfigError) as raised:
        load_exporter_config(path)
    assert str(raised.value) == f"{path}: {message}"
    assert raised.value.source == str(path)


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("valid-exporter-*.yml")), ids=str)
def test_valid_files_load(path: Path) -> None:
    """Every valid-exporter-*.yml loads, with nothing deprecated in it."""
    config = load_exporter_config(path)
    assert config.targets
    assert config.warnings == ()


def test_full_valid_file_reads_every_field() -> None:
    """Each field of the full example lands in the dataclasses, durations in seconds."""
    config = load_exporter_config(TESTDATA / "valid-exporter-full.yml")
    assert (config.listen_host, config.listen_port) == ("::1", 9732)
    assert config.max_payload_bytes == 1_048_576
    gpu_a, gpu_b, gateway = config.targets
    assert (gpu_a.interval_seconds, gpu_a.timeout_seconds) == (90.0, 0.5)
    assert (gpu_a.test_request.endpoint, gpu_a.test_request.timeout_seconds) == ("chat", 10.0)
    assert gpu_a.test_request.min_interval_seconds == 120.0
    assert gpu_b.test_request.min_interval_seconds == 0.0  # zero: a test request on every idle poll
    assert (gpu_b.interval_seconds, gpu_b.timeout_seconds) == (0.05, 0.05)
    assert gpu_b.test_request.enabled is False
    assert gpu_b.test_request.model == "tiny"
    assert gpu_b.metrics_url == "https://gpu-b.example:8443/custom/metrics"
    assert gateway.kind == "proxy"
    assert gateway.interval_seconds == 7 * 86400


def test_degraded_thresholds_are_read_with_top_level_defaults() -> None:
    """`degraded:` at the top sets every target's and module's defaults; a target overrides."""
    config = load_exporter_config(TESTDATA / "valid-exporter-degraded.yml")
    a, b = config.targets
    assert (a.degraded.collapse_factor, a.degraded.admission_window_seconds) == (0.3, 900.0)
    assert a.degraded.enabled is True
    assert b.degraded.enabled is False
    assert b.degraded.collapse_factor == 0.3
    assert (b.degraded.queue_time_seconds, b.degraded.preemptions_per_second) == (60.0, 2.0)
    assert (b.degraded.kv_cache_full, b.degraded.baseline_samples) == (0.9, 40)
    assert b.degraded.baseline_min_samples == 10
    assert (b.degraded.collapse_window_seconds, b.degraded.preemption_window_seconds) == (
        300.0,
        120.0,
    )
    assert b.degraded.queue_time_window_seconds == 600.0
    module = config.modules["fleet"]
    assert module.degraded.collapse_factor == 0.2
    assert module.target("x", "http://127.0.0.1:1").degraded == module.degraded


def test_example_config_is_valid() -> None:
    """The shipped example loads, with defaults filled in per target and nothing deprecated."""
    config = load_exporter_config(REPO / "examples" / "exporter.yml")
    assert config.warnings == ()
    assert [t.name for t in config.targets] == ["gpu-a", "gpu-b", "gateway"]
    gpu_a, gpu_b, gateway = config.targets
    assert gpu_a.interval_seconds == 15.0
    assert gpu_b.interval_seconds == 10.0
    assert gpu_b.test_request.model == "tiny"
    assert gpu_a.test_request.timeout_seconds == 10.0
    assert gpu_a.test_request.min_interval_seconds == 60.0
    assert gateway.kind == "proxy"
    assert dict(gpu_a.labels) == {"host": "gpu-a"}
    assert gpu_a.metrics_url == "http://127.0.0.1:8000/metrics"


@pytest.mark.parametrize("name", ["exporter-sim.yml", "exporter-vllm.yml"])
def test_deploy_configs_are_valid(name: str) -> None:
    """The compose stack's exporter configs load, with nothing deprecated in them."""
    config = load_exporter_config(REPO / "deploy" / name)
    assert config.targets
    assert config.warnings == ()


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A missing file is reported as such, not as a traceback."""
    path = tmp_path / "absent.yml"
    with pytest.raises(ConfigError) as raised:
        load_exporter_config(path)
    assert str(raised.value) == f"{path}: cannot read: No such file or directory"


def test_file_that_is_not_text_is_a_config_error(tmp_path: Path) -> None:
    """A binary file is refused with its name, not a UnicodeDecodeError."""
    path = tmp_path / "exporter.yml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=r"cannot read"):
        load_exporter_config(path)


def test_empty_file_means_no_targets(tmp_path: Path) -> None:
    """An empty file is the defaults with no target, as before."""
    path = tmp_path / "exporter.yml"
    path.write_text("")
    config = load_exporter_config(path)
    assert config.targets == ()
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9732)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15s", 15.0),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        ("500ms", 0.5),
        ("1d", 86400.0),
        ("1w", 604800.0),
        ("1y", 365 * 86400.0),
        ("1h30m", 5400.0),
        ("0s", 0.0),
        ("0", 0.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    """Prometheus durations are seconds."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "15",
        "s",
        "1x",
        "-5s",
        "1.5h",
        "0.3s",
        "10 m",
        "5s ",
        "30s1m",
        "1s1s",
        "9999999999999999999y",
        "\uff12h",  # a fullwidth 2: Prometheus takes ASCII digits only
        "\u0661\u0665m",  # Arabic-Indic 15
        "5m\n",
        3,
        1.5,
        float("nan"),
        float("inf"),
        True,
        None,
    ],
)
def test_bad_durations(value: object) -> None:
    """Anything else is refused: fractions, plain numbers, NaN, infinity, units out of order."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9732", ("127.0.0.1", 9732)),
        (":9732", ("0.0.0.0", 9732)),
        ("[::1]:9732", ("::1", 9732)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    """One listen grammar for both components: host:port, [v6]:port, :port for every address."""
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["nowhere", "host:", "host:65536", "::1:9732", "host:-1"])
def test_bad_listen_addresses(text: str) -> None:
    """A listen address without a usable port, or an IPv6 one without brackets, is refused."""
    with pytest.raises(ValueError, match=r"host:port|brackets"):
        parse_listen(text)

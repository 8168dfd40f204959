"""The exporter's `modules:` key: what `/probe` reads with, and its errors naming the field."""

from __future__ import annotations

import pytest

from stallwatch.common.config import ConfigError
from stallwatch.common.exporter_config import (
    DEFAULT_FORGET_AFTER_SECONDS,
    MAX_PROBE_TARGETS,
    ExporterConfig,
    exporter_config_from_mapping,
    module_max_targets,
)


def load(modules: object, **top: object) -> object:
    return exporter_config_from_mapping({"modules": modules, **top}, "exporter.yml")


def test_a_module_takes_the_target_settings_and_defaults() -> None:
    """A module reads like a target: kind, path, interval, timeout; the test request is off."""
    config = exporter_config_from_mapping(
        {
            "interval": "30s",
            "test_request": {"enabled": True, "min_interval": "2m"},
            "modules": {
                "vllm": {"allow": ["10.0.0.0/8"]},
                "trt": {
                    "allow": ["*.svc:8000"],
                    "kind": "trtllm",
                    "interval": "15s",
                    "timeout": "3s",
                    "forget_after": "1h",
                    "test_request": {"enabled": True, "endpoint": "chat"},
                },
            },
        },
        "exporter.yml",
    )
    vllm, trt = config.modules["vllm"], config.modules["trt"]
    assert vllm.interval_seconds == 30.0
    assert vllm.timeout_seconds == 5.0
    assert vllm.test_request.enabled is False  # never inherited: /probe opts in per module
    assert vllm.test_request.min_interval_seconds == 120.0
    assert vllm.forget_after_seconds == DEFAULT_FORGET_AFTER_SECONDS
    assert trt.metrics_path == "/prometheus/metrics"
    assert (trt.interval_seconds, trt.timeout_seconds, trt.forget_after_seconds) == (15, 3, 3600)
    assert trt.test_request.enabled
    assert trt.test_request.endpoint == "chat"
    target = trt.target("pod-a:8000", "http://pod-a:8000")
    assert target.metrics_url == "http://pod-a:8000/prometheus/metrics"


@pytest.mark.parametrize(
    ("modules", "message"),
    [
        ({"m": {}}, "modules.m.allow: required: the hosts or networks /probe may read"),
        ({"m": {"allow": []}}, "modules.m.allow: required: the hosts or networks /probe may read"),
        (
            {"m": {"allow": ["10.0.0.0/8:http"]}},
            "modules.m.allow[0]: the port must be a number or a glob like 80*, got "
            "'10.0.0.0/8:http'",
        ),
        (
            {"m": {"allow": ["x"], "interval": "10s", "timeout": "20s"}},
            "modules.m.timeout: must not be longer than the interval",
        ),
        (
            {"m": {"allow": ["x"], "interval": "1m", "forget_after": "1m"}},
            "modules.m.forget_after: must be at least two intervals",
        ),
        ({"m": {"allow": ["x"], "targets": []}}, "modules.m.targets: unknown key"),
        ({"a b": {"allow": ["x"]}}, "modules.a b: a module name is letters"),
        (["m"], "modules: expected a mapping of module names to modules"),
        ({"m": {"allow": ["x"], "max_targets": 0}}, "modules.m.max_targets: expected an integer"),
        (
            {"a": {"allow": ["x"], "max_targets": 8000}, "b": {"allow": ["x"]}},
            "modules.a.max_targets: the modules' max_targets add up to 13000 (a module without"
            " one takes 5000",
        ),
    ],
)
def test_bad_modules_name_the_field(modules: object, message: str) -> None:
    """Every module error names the file and the dotted field."""
    with pytest.raises(ConfigError) as raised:
        load(modules)
    assert str(raised.value).startswith(f"exporter.yml: {message}")


def test_static_targets_and_modules_together() -> None:
    """The static list and the modules load side by side."""
    config = exporter_config_from_mapping(
        {
            "targets": [{"name": "a", "url": "http://127.0.0.1:8000"}],
            "modules": {"m": {"allow": ["127.0.0.1"]}},
        },
        "exporter.yml",
    )
    assert [t.name for t in config.targets] == ["a"]
    assert list(config.modules) == ["m"]


def test_each_module_remembers_its_share_of_the_targets_by_default() -> None:
    """Without max_targets a module may remember an equal share of the total; with it, its own."""
    config = load({"a": {"allow": ["x"]}, "b": {"allow": ["x"]}, "c": {"allow": ["x"]}})
    assert isinstance(config, ExporterConfig)
    shares = {name: module_max_targets(config.modules, name) for name in config.modules}
    assert shares == dict.fromkeys("abc", MAX_PROBE_TARGETS // 3)
    config = load({"a": {"allow": ["x"], "max_targets": 100}, "b": {"allow": ["x"]}})
    assert isinstance(config, ExporterConfig)
    assert module_max_targets(config.modules, "a") == 100
    assert module_max_targets(config.modules, "b") == MAX_PROBE_TARGETS // 2

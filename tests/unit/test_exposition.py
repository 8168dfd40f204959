"""The exporter's own exposition writer writes what prometheus_client's `generate_latest` writes."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from stallwatch.common.exporter_config import ExporterConfig, TargetConfig
from stallwatch.core.classify import State, Verdict, classify, down, hung
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.reading import parse_reading
from stallwatch.exporter.answer import MAX_SAMPLE_NAMES, AnswerWriter
from stallwatch.exporter.collector import TargetCollector
from stallwatch.exporter.exposition import UnsupportedFamily, exposition, go_float

REAL_METRICS = Path(__file__).resolve().parents[1] / "testdata" / "real-metrics"
ENGINE_PREFIXES = ("vllm", "llamacpp", "sglang")


class _Fixed:
    """A collector that yields the families it was given."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _reference(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    return generate_latest(registry)


def _histories() -> Iterator[tuple[str, TargetHistory]]:
    """Histories built from every run of captured payloads of one engine, and from failures."""
    for prefix in ENGINE_PREFIXES:
        payloads = sorted(REAL_METRICS.glob(f"{prefix}-*.txt"))
        history = TargetHistory()
        for index, path in enumerate(payloads):
            reading = parse_reading(path.read_text(encoding="utf-8"), taken_at=1e9 + 15 * index)
            verdict = classify(history.baseline, reading)
            outcome = PollOutcome(verdict, reading, reading.taken_at, 0.0123 * (index + 1))
            history = history.advance(outcome)
            yield f"{prefix} after {path.name}", history
    failures: list[tuple[Verdict, str | None]] = [
        (down("connection refused"), "connection"),
        (hung("no answer within 5 s"), "timeout"),
        (Verdict(State.NO_METRICS, "no engine"), None),
    ]
    history = TargetHistory()
    for verdict, reason in failures:
        history = history.advance(PollOutcome(verdict, None, 2e9, 5.0, error_reason=reason))
        yield f"after {verdict.state}", history


def _targets() -> list[TargetConfig]:
    plain = TargetConfig(name="gpu-1", url="http://10.0.0.1:8000")
    labelled = TargetConfig(
        name='odd "name"\\ with\nnewline',
        url="http://[::1]:8000/",
        kind="vllm",
        labels=MappingProxyType({"zone": 'a"b', "rack": "r\\1\n", "team": "ü-ops"}),
    )
    return [plain, labelled]


def _families_of(target: TargetConfig, history: TargetHistory) -> list[Metric]:
    config = ExporterConfig(targets=(target,))
    return list(TargetCollector(lambda: config, lambda: {target.name: history}).collect())


CASES = list(itertools.product(_targets(), list(_histories())))


@pytest.mark.parametrize(
    ("target", "named_history"), CASES, ids=[f"{t.name[:5]}-{h[0]}" for t, h in CASES]
)
def test_a_targets_answer_is_byte_for_byte_what_generate_latest_writes(
    target: TargetConfig, named_history: tuple[str, TargetHistory]
) -> None:
    """Every target series, over real-payload and failure histories, labels escaped, matches."""
    config = ExporterConfig(targets=(target,))
    collector = TargetCollector(lambda: config, lambda: {target.name: named_history[1]})
    families = list(collector.collect())

    assert exposition(families) == _reference(families)


@pytest.mark.parametrize("target", _targets(), ids=lambda t: t.name[:5])
def test_one_writer_through_every_history_writes_what_generate_latest_writes(
    target: TargetConfig,
) -> None:
    """A target's answer writer, kept from read to read through every history (its sample
    names reused, new ones added), writes each answer as the reference writes it."""
    writer = AnswerWriter(target)
    for _, history in [*_histories(), *_histories()]:
        families = _families_of(target, history)

        assert writer.write(history) == _reference(families)


def test_a_writer_that_met_too_many_sample_names_starts_over_and_still_writes_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past MAX_SAMPLE_NAMES the writer's kept names are dropped, and the answers stay right."""
    target = _targets()[1]
    monkeypatch.setattr("stallwatch.exporter.answer.MAX_SAMPLE_NAMES", 8)
    writer = AnswerWriter(target)
    for _, history in _histories():
        families = _families_of(target, history)

        assert writer.write(history) == _reference(families)
        assert len(writer._names) <= 8
    assert MAX_SAMPLE_NAMES > 8


def test_many_targets_with_different_labels_match_too() -> None:
    """A collector over several targets (extra label columns filled with "") matches as well."""
    targets = tuple(_targets())
    histories = dict(zip((t.name for t in targets), (h for _, h in _histories()), strict=False))
    config = ExporterConfig(targets=targets)
    families = list(TargetCollector(lambda: config, lambda: histories).collect())

    assert exposition(families) == _reference(families)


@pytest.mark.parametrize(
    "value", [0.0, 1.0, -2.5, 1e-9, 123456789.0, 1.7e9, 1e22, float("inf"), float("-inf")]
)
def test_values_are_written_as_go_writes_them(value: float) -> None:
    """Small, large, negative and infinite values are formatted as the reference formats them."""
    gauge = GaugeMetricFamily("stallwatch_x", "doc\\with\nnewline", labels=["target"])
    gauge.add_metric(["t"], value)
    counter = CounterMetricFamily("stallwatch_y", "a counter", value=value)

    assert exposition([gauge, counter]) == _reference([gauge, counter])


def test_a_family_it_does_not_write_is_refused_not_written_wrong() -> None:
    """A histogram or a timestamped sample raises instead of being written differently."""
    histogram = HistogramMetricFamily("stallwatch_h", "h", buckets=[("+Inf", 1)], sum_value=1)
    stamped = GaugeMetricFamily("stallwatch_t", "t", labels=["target"])
    stamped.add_metric(["x"], 1.0, timestamp=5.0)

    with pytest.raises(UnsupportedFamily):
        exposition([histogram])
    with pytest.raises(UnsupportedFamily):
        exposition([stamped])


GO_FLOAT_VALUES = (
    0.0,
    -0.0,
    0,
    False,
    True,
    1,
    1.0,
    -1.0,
    15.0,
    4095.0,
    4096.0,
    18102.0,
    0.5,
    1e-06,
    1.7966767101362453e09,
    1e16,
    123456789.0,
    float("inf"),
    float("-inf"),
    float("nan"),
)


@pytest.mark.parametrize("value", GO_FLOAT_VALUES, ids=repr)
def test_go_float_writes_a_value_as_the_reference_does(value: float) -> None:
    """The looked-up whole numbers and every other value are written as floatToGoString does."""
    assert go_float(value) == floatToGoString(value)


@settings(max_examples=500, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**53), 2**53))
def test_go_float_agrees_with_the_reference_on_any_value(value: float) -> None:
    """Any float or whole number, written as floatToGoString writes it."""
    assert go_float(value) == floatToGoString(value)

"""Render a vLLM 0.32 `/metrics` payload from engine state, in prometheus_client's text format.

Family names, types, HELP texts, labels and buckets come from `vllm_0_32_families.json`,
extracted from real payloads by `simulator.extract_families`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString as _untyped_float_to_go_string

from stallwatch.simulator.engine import BLOCK_SIZE
from stallwatch.simulator.engine_stats import EngineStats

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"
FAMILIES_RESOURCE = "vllm_0_32_families.json"


@cache
def load_families() -> list[dict[str, Any]]:
    """The vLLM 0.32 metric families (package data), in the order vLLM exports them."""
    text = (
        resources.files("stallwatch.simulator")
        .joinpath(FAMILIES_RESOURCE)
        .read_text(encoding="utf-8")
    )
    families: list[dict[str, Any]] = json.loads(text)
    return families


@dataclass(frozen=True)
class EngineView:
    """What the renderer needs from one engine core."""

    engine_label: str
    stats: EngineStats
    sleep_level: int
    kv_cache_tokens: int


@dataclass(frozen=True)
class RenderOptions:
    model_name: str
    multiprocess: bool
    vllm_metrics: bool
    process_start_time: float


def floatToGoString(value: float) -> str:
    """Format a sample value exactly as prometheus_client does."""
    text: str = _untyped_float_to_go_string(value)  # type: ignore[no-untyped-call]
    return text


def _labels(pairs: dict[str, str]) -> str:
    if not pairs:
        return ""
    body = ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(pairs.items()))
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _line(name: str, labels: dict[str, str], value: float) -> str:
    return f"{name}{_labels(labels)} {floatToGoString(value)}\n"


def _header(name: str, help_text: str, kind: str) -> str:
    help_escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_escaped}\n# TYPE {name} {kind}\n"


class _StartTimeProcessCollector:
    """prometheus_client's process collector, reporting the simulated process's start time."""

    def __init__(self, start_time: float) -> None:
        self._inner = ProcessCollector(registry=None)
        self._start_time = start_time

    def collect(self) -> Iterable[Metric]:
        for metric in self._inner.collect():
            if metric.name == "process_start_time_seconds":
                metric.samples = [
                    Sample(s.name, s.labels, self._start_time, s.timestamp, s.exemplar)
                    for s in metric.samples
                ]
            yield metric


def render_process_families(start_time: float) -> str:
    """The python_* and process_* families of a single-process prometheus_client registry."""
    registry = CollectorRegistry(auto_describe=False)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(_StartTimeProcessCollector(start_time))
    return generate_latest(registry).decode("utf-8")


def _extra_values(family: dict[str, Any]) -> list[str | None]:
    values: list[str | None] = list(family["extra_values"]) if family["extra_label"] else [None]
    return values


def _counter_value(family: dict[str, Any], stats: EngineStats, extra: str | None) -> float:
    name = family["name"]
    if extra is None:
        return stats.counters.get(name, 0.0)
    return stats.labelled_counters.get(name, {}).get(extra, 0.0)


def _gauge_value(family: dict[str, Any], view: EngineView, extra: str | None) -> float | None:
    name = family["name"]
    gauges = view.stats.gauges
    if name == "vllm:engine_sleep_state":
        level = view.sleep_level
        return {
            "awake": 1.0 if level == 0 else 0.0,
            "weights_offloaded": 1.0 if level == 1 else 0.0,
            "discard_all": 1.0 if level == 2 else 0.0,
        }[str(extra)]
    if name == "vllm:num_requests_waiting_by_reason":
        waiting = gauges.get("vllm:num_requests_waiting")
        if waiting is None:
            return None
        return waiting if extra == "capacity" else 0.0
    if name == "vllm:cache_config_info":
        return 1.0
    return gauges.get(name, 0.0)


def _info_labels(family: dict[str, Any], view: EngineView) -> dict[str, str]:
    labels = {str(k): str(v) for k, v in family["info_labels"].items()}
    labels["kv_cache_size_tokens"] = str(view.kv_cache_tokens)
    labels["num_gpu_blocks"] = str(view.kv_cache_tokens // BLOCK_SIZE)
    labels["block_size"] = str(BLOCK_SIZE)
    return labels


def _render_family(
    family: dict[str, Any], views: Sequence[EngineView], options: RenderOptions
) -> Iterator[str]:
    name: str = family["name"]
    kind: str = family["type"]
    help_text: str = family["help"]
    per_engine = "engine" in family["labels"]
    engine_views = views if per_engine else views[:1]
    created_lines: list[str] = []

    def base_labels(view: EngineView, extra: str | None) -> dict[str, str]:
        labels: dict[str, str] = {}
        if "model_name" in family["labels"]:
            labels["model_name"] = options.model_name
        if per_engine:
            labels["engine"] = view.engine_label
        if extra is not None:
            labels[family["extra_label"]] = extra
        return labels

    if kind == "counter":
        lines = [_header(name + "_total", help_text, "counter")]
        for view in engine_views:
            for extra in _extra_values(family):
                labels = base_labels(view, extra)
                value = _counter_value(family, view.stats, extra) if per_engine else 0.0
                lines.append(_line(name + "_total", labels, value))
                created_lines.append(_line(name + "_created", labels, view.stats.created))
    elif kind == "gauge":
        lines = [_header(name, help_text, "gauge")]
        for view in engine_views:
            for extra in _extra_values(family):
                labels = base_labels(view, extra)
                if family["info_labels"] is not None:
                    labels.update(_info_labels(family, view))
                gauge = _gauge_value(family, view, extra)
                if gauge is not None:
                    lines.append(_line(name, labels, gauge))
    elif kind == "histogram":
        lines = [_header(name, help_text, "histogram")]
        for view in engine_views:
            labels = base_labels(view, None)
            histogram = view.stats.histograms[name]
            for bound, cumulative in zip(histogram.bounds, histogram.cumulative(), strict=True):
                lines.append(
                    _line(name + "_bucket", {**labels, "le": floatToGoString(bound)}, cumulative)
                )
            lines.append(_line(name + "_bucket", {**labels, "le": "+Inf"}, histogram.count))
            lines.append(_line(name + "_count", labels, histogram.count))
            lines.append(_line(name + "_sum", labels, histogram.total))
            created_lines.append(_line(name + "_created", labels, view.stats.created))
    else:
        raise ValueError(f"unsupported metric type {kind!r} for {name}")
    yield "".join(lines)
    if created_lines and not options.multiprocess:
        yield _header(name + "_created", help_text, "gauge") + "".join(created_lines)


def render_payload(views: Sequence[EngineView], options: RenderOptions) -> str:
    """The whole `/metrics` body as vLLM 0.32 serves it."""
    parts: list[str] = []
    if not options.multiprocess:
        parts.append(render_process_families(options.process_start_time))
    if options.vllm_metrics:
        for family in load_families():
            parts.extend(_render_family(family, views, options))
    return "".join(parts)

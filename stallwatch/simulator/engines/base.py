"""What every simulated non-vLLM engine shares: the flavour interface and the exposition helpers.

A flavour owns an engine's metric model (fed by the engine cores' step records), its `/metrics`
body and headers, and its own endpoints (health, slots, props, ...). The scheduler itself is the
vLLM-like `simulator.engine.Engine`; only what each server publishes and answers differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from stallwatch.simulator.engine import Engine, StepRecord
from stallwatch.simulator.metrics import floatToGoString

if TYPE_CHECKING:
    from stallwatch.simulator.host import FlavourHost

PROMETHEUS_CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"


@dataclass(frozen=True)
class MetricsResponse:
    """A `/metrics` answer: body, content type, and extra headers."""

    body: str
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Series:
    """One sample of a family: its labels and value."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class HistogramSeries:
    """One histogram child: cumulative counts per upper bound (+Inf is `count`)."""

    labels: Mapping[str, str]
    bounds: Sequence[float]
    cumulative: Sequence[int]
    count: int
    total: float


@dataclass(frozen=True)
class FamilyDump:
    """One family as a prometheus_client registry would collect it (name without `_total`)."""

    name: str
    kind: str  # counter | gauge | histogram
    help: str
    series: Sequence[Series | HistogramSeries]


class _Collected:
    def __init__(self, families: Iterable[FamilyDump]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        for family in self._families:
            metric = Metric(family.name, family.help, family.kind)
            suffix = "_total" if family.kind == "counter" else ""
            for series in family.series:
                labels = dict(series.labels)
                if isinstance(series, Series):
                    metric.add_sample(family.name + suffix, labels, series.value)
                    continue
                for bound, count in zip(series.bounds, series.cumulative, strict=True):
                    le = floatToGoString(bound)
                    metric.add_sample(family.name + "_bucket", {**labels, "le": le}, count)
                metric.add_sample(family.name + "_bucket", {**labels, "le": "+Inf"}, series.count)
                metric.add_sample(family.name + "_count", labels, series.count)
                metric.add_sample(family.name + "_sum", labels, series.total)
            yield metric


def prometheus_client_text(families: Iterable[FamilyDump]) -> str:
    """The families in prometheus_client's text format (multiprocess style: no `_created`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collected(families))
    return generate_latest(registry).decode("utf-8")


def plain_number(value: float) -> str:
    """A number as Rust's `f64` Display and prometheus-cpp print it: integers without `.0`."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Flavour:
    """One engine's face: metrics, endpoints, and how its numbers move. Subclass per engine."""

    name: ClassVar[str] = ""
    metrics_path: ClassVar[str] = "/metrics"
    # The `owned_by` of its `/v1/models` cards; empty: the model's own name (TGI does that).
    models_owner: ClassVar[str] = ""
    # False: no `/v1/models` at all (Triton's metrics port serves only `/metrics`).
    serves_models: ClassVar[bool] = True

    def __init__(self, server: FlavourHost) -> None:
        self.server = server

    @property
    def engines(self) -> list[Engine]:
        return self.server.engines

    def reset(self, now: float) -> None:
        """A (re)boot: every counter starts over; listen to the new engine cores."""
        for engine in self.engines:
            engine.step_listeners.append(self.on_step)

    def on_step(self, record: StepRecord) -> None:
        """One engine step happened (called from the engine core)."""

    def tick(self, now: float) -> None:
        """Time passed while the server is neither hung nor dead."""

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """The engine's own endpoints, besides the OpenAI ones and `/sim/*`."""
        router.add_get(self.metrics_path, self.handle_metrics)

    def render(self) -> MetricsResponse:
        raise NotImplementedError

    async def handle_metrics(self, request: web.Request) -> web.Response:
        answer = self.render()
        response = web.Response(body=answer.body.encode("utf-8"))
        response.headers["Content-Type"] = answer.content_type
        for key, value in answer.headers:
            response.headers[key] = value
        return response

    def before_generation(self) -> None:
        """A generation request arrived (a sleeping server may wake up)."""

    def stats(self) -> dict[str, Any]:
        """Extra entries for `/sim/stats`."""
        return {}

    # --- shared bits ---------------------------------------------------------------------

    def running(self) -> int:
        return sum(len(engine.running) for engine in self.engines)

    def waiting(self) -> int:
        return sum(len(engine.waiting) for engine in self.engines)

    def unavailable(self) -> bool:
        return self.server.unavailable()

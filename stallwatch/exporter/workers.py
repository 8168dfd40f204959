"""Worker processes, the pure part: which worker owns a target, each worker's share of the
limits, and `/metrics` merged from every worker's families.

With `--workers N` (N > 1) the exporter runs N worker processes behind one listening socket
(`exporter.supervisor`). Each target's history lives in exactly one worker, its owner, chosen
by a stable hash: a `/probe` that reaches another worker is handed to the owner over a local
socket (`exporter.peers`), so a target is read once per interval whichever worker Prometheus'
connection lands on. `/metrics` is answered by whichever worker receives it, with every
worker's families merged: per-target series side by side (each target has one owner),
counters summed, gauges summed or taken at their least or most (`GAUGE_MERGE`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

# Sample of a family as it travels between workers: (sample name, labels, value).
SampleData = tuple[str, dict[str, str], float]


@dataclass(frozen=True)
class FamilyData:
    """One metric family, as data: what a worker sends of its `/metrics` to another."""

    name: str
    type: str
    documentation: str
    samples: tuple[SampleData, ...]


@dataclass(frozen=True)
class WorkerShare:
    """This process's place among the workers: its index, how many there are, where their
    local sockets are, and how many times this index was started again after dying."""

    index: int
    count: int
    socket_dir: Path
    restarts: int = 0

    def socket_path(self, index: int) -> Path:
        return self.socket_dir / f"worker-{index}.sock"

    def owns(self, key: str) -> bool:
        return owner(key, self.count) == self.index


def owner(key: str, workers: int) -> int:
    """The worker (0 to `workers` - 1) that owns `key`: the same in every worker, in every
    run, whatever the Python hash seed."""
    return zlib.crc32(key.encode("utf-8", errors="surrogatepass")) % workers


def probe_key(module: str, target_url: str) -> str:
    """What a `/probe` target's owner is chosen by: its module and its normalised URL (the
    key its history is kept under)."""
    return f"{module}\0{target_url}"


def share(total: int, workers: int) -> int:
    """Each worker's share of a limit on the whole exporter (rounded up: the sum of the shares
    is never less than the limit)."""
    return max(1, math.ceil(total / workers))


RESTART_DELAY_SECONDS = 1.0
RESTART_DELAY_MAX_SECONDS = 30.0
# A worker that ran this long before it died was not crash-looping: its next start waits the
# first delay again.
STABLE_RUN_SECONDS = 60.0


def restart_delay(ran_seconds: float, previous_delay: float) -> float:
    """How long to wait before starting a dead worker again: a second after a worker that ran
    for a while; twice the previous wait (at most RESTART_DELAY_MAX_SECONDS) after one that
    died soon after it started, so a worker that cannot start costs little."""
    if ran_seconds >= STABLE_RUN_SECONDS or previous_delay <= 0:
        return RESTART_DELAY_SECONDS
    return min(RESTART_DELAY_MAX_SECONDS, 2 * previous_delay)


def usable_cores(
    affinity: int | None = None, cpu_max: str | None = None, os_count: int | None = None
) -> int:
    """The cores this process may use: its CPU affinity, lowered by a cgroup v2 CPU quota
    (`cpu.max`, "QUOTA PERIOD" or "max PERIOD"), at least 1."""
    cores = affinity if affinity is not None else (os_count or 1)
    if cpu_max:
        fields = cpu_max.split()
        if len(fields) == 2 and fields[0] != "max":
            try:
                quota, period = int(fields[0]), int(fields[1])
            except ValueError:
                return max(1, cores)
            if quota > 0 and period > 0:
                cores = min(cores, math.ceil(quota / period))
    return max(1, cores)


def cores_here() -> int:
    """`usable_cores` of this process, read from the system."""
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        cpu_max = Path("/sys/fs/cgroup/cpu.max").read_text(encoding="ascii")
    except OSError:
        cpu_max = None
    return usable_cores(affinity, cpu_max, os.cpu_count())


Merge = Literal["sum", "min", "max"]
# How a gauge that several workers publish with the same labels is merged (counters are
# summed; a gauge not named here is summed: a share of a whole, like targets or memory).
GAUGE_MERGE: Mapping[str, Merge] = {
    "process_start_time_seconds": "min",
    "process_max_fds": "max",
    "python_info": "max",
    "stallwatch_build_info": "max",
    "stallwatch_exporter_workers": "max",
    "stallwatch_config_last_reload_successful": "min",
    "stallwatch_config_last_reload_success_timestamp_seconds": "min",
}
_MERGE: Mapping[Merge, Callable[[list[float]], float]] = {"sum": sum, "min": min, "max": max}


def family_data(families: Iterable[Metric]) -> list[FamilyData]:
    """A worker's families as data."""
    return [
        FamilyData(
            family.name,
            family.type,
            family.documentation,
            tuple((s.name, dict(s.labels), float(s.value)) for s in family.samples),
        )
        for family in families
    ]


def families_json(families: Iterable[FamilyData]) -> bytes:
    """Families as JSON, for another worker (`families_from_json` reads it back)."""
    return json.dumps([dataclasses.astuple(family) for family in families]).encode("utf-8")


def families_from_json(body: bytes) -> list[FamilyData]:
    """What `families_json` wrote."""
    return [
        FamilyData(name, kind, doc, tuple((n, labels, v) for n, labels, v in samples))
        for name, kind, doc, samples in json.loads(body)
    ]


def merged(per_worker: Sequence[Sequence[FamilyData]]) -> list[Metric]:
    """One set of families from every worker's: families in the order first seen, samples
    with the same name and labels merged (counters and `_created` alike: summed, the least
    creation time)."""
    order: list[str] = []
    kinds: dict[str, tuple[str, str]] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]] = {}
    for families in per_worker:
        for family in families:
            if family.name not in kinds:
                order.append(family.name)
                kinds[family.name] = (family.type, family.documentation)
                values[family.name] = {}
            samples = values[family.name]
            for name, labels, value in family.samples:
                samples.setdefault((name, tuple(sorted(labels.items()))), []).append(value)
    result = []
    for family_name in order:
        kind, documentation = kinds[family_name]
        metric = Metric(family_name, documentation, kind)
        for (name, label_pairs), found in values[family_name].items():
            how: Merge = "sum"
            if name.endswith("_created"):
                how = "min"
            elif kind != "counter":
                how = GAUGE_MERGE.get(family_name, "sum")
            metric.samples.append(Sample(name, dict(label_pairs), _MERGE[how](found)))
        result.append(metric)
    return result

"""The workers' pure part: a target's owner, each worker's share, the cores, merged families."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from stallwatch.cli import build_parser
from stallwatch.exporter.cli import worker_argv, workers_argument
from stallwatch.exporter.workers import (
    FamilyData,
    families_from_json,
    families_json,
    family_data,
    merged,
    owner,
    probe_key,
    restart_delay,
    share,
    usable_cores,
)


def test_a_targets_owner_is_fixed_and_the_targets_spread_evenly() -> None:
    """The owner depends on the key only (the same in every process and run: known values),
    and 10 000 targets spread over 4 workers within 5 % of an even share."""
    assert owner(probe_key("vllm", "http://10.0.0.1:8000"), 4) == owner(
        probe_key("vllm", "http://10.0.0.1:8000"), 4
    )
    assert [owner(f"t{n}", 3) for n in range(6)] == [owner(f"t{n}", 3) for n in range(6)]
    assert owner("", 7) == 0  # crc32 of nothing is 0: no hash seed
    counts = Counter(
        owner(probe_key("m", f"http://10.0.{n // 250}.{n % 250}:8000"), 4) for n in range(10_000)
    )
    assert set(counts) == {0, 1, 2, 3}
    assert all(abs(count - 2_500) < 125 for count in counts.values()), counts


def test_the_same_url_in_two_modules_may_have_two_owners_but_never_two_in_one() -> None:
    """The module is part of the key: one (module, URL) pair, one owner."""
    keys = {probe_key(module, "http://10.0.0.1:8000") for module in ("a", "b")}
    assert len(keys) == 2
    assert probe_key("a", "http://x:1").split("\0") == ["a", "http://x:1"]


@pytest.mark.parametrize(
    ("total", "workers", "each"), [(10_000, 1, 10_000), (10_000, 3, 3_334), (5, 2, 3), (1, 4, 1)]
)
def test_each_workers_share_rounds_up(total: int, workers: int, each: int) -> None:
    """A limit on the whole exporter, split: the shares add up to at least the limit."""
    assert share(total, workers) == each
    assert share(total, workers) * workers >= total


@pytest.mark.parametrize(
    ("affinity", "cpu_max", "cores"),
    [
        (8, None, 8),
        (8, "max 100000\n", 8),
        (8, "200000 100000\n", 2),
        (8, "150000 100000", 2),
        (8, "50000 100000", 1),
        (2, "800000 100000", 2),
        (8, "garbage", 8),
        (8, "x 100000", 8),
        (0, None, 1),
    ],
)
def test_usable_cores_are_the_affinity_lowered_by_a_cgroup_quota(
    affinity: int, cpu_max: str | None, cores: int
) -> None:
    """`--workers auto`: the cores in the affinity mask, at most the cgroup's quota (rounded
    up), at least one."""
    assert usable_cores(affinity, cpu_max) == cores


@pytest.mark.parametrize("text", ["0", "-1", "x", "1.5", "100000"])
def test_a_bad_workers_argument_is_a_usage_error(text: str) -> None:
    """--workers takes 1 to 256 or `auto`."""
    with pytest.raises(argparse.ArgumentTypeError):
        workers_argument(text)


def test_workers_auto_is_at_least_one() -> None:
    """--workers auto gives a count of processes."""
    assert workers_argument("auto") >= 1
    assert workers_argument("3") == 3


def test_workers_run_on_the_event_loop_the_supervisor_was_given() -> None:
    """A worker's command carries the supervisor's --event-loop (and its config)."""
    for loop in ("asyncio", "uvloop", "auto"):
        args = build_parser().parse_args(
            ["exporter", "--config", "x.yml", "--workers=2", f"--event-loop={loop}"]
        )
        argv = worker_argv(args)
        assert argv[argv.index("--event-loop") + 1] == loop
        assert argv[argv.index("--config") + 1] == "x.yml"


def _worker(
    polls: float, reads: float, started: float, targets: float, target: str
) -> list[FamilyData]:
    state = GaugeMetricFamily("stallwatch_target_state", "s", labels=["target", "state"])
    state.add_metric([target, "busy"], 1)
    counter = CounterMetricFamily("stallwatch_probe_reads", "r", value=reads)
    start = GaugeMetricFamily("process_start_time_seconds", "st", value=started)
    remembered = GaugeMetricFamily("stallwatch_probe_targets", "t", labels=["module"])
    remembered.add_metric(["vllm"], targets)
    build = GaugeMetricFamily("stallwatch_build_info", "b", labels=["version"])
    build.add_metric(["1.0"], 1)
    polled = CounterMetricFamily("stallwatch_polls", "p", labels=["target"])
    polled.add_metric([target], polls)
    return family_data([state, counter, start, remembered, build, polled])


def test_merged_families_sum_counters_keep_each_target_and_merge_gauges_by_rule() -> None:
    """Counters add up; each target's series appear once (one owner); the process' start is
    the earliest, the build info stays 1, remembered targets add up."""
    families = merged([_worker(3, 10, 100.0, 2, "a"), _worker(5, 7, 90.0, 4, "b")])
    by_name = {family.name: family for family in families}

    def values(name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {tuple(sorted(s.labels.items())): s.value for s in by_name[name].samples}

    assert [family.name for family in families][:2] == [
        "stallwatch_target_state",
        "stallwatch_probe_reads",
    ]
    assert values("stallwatch_probe_reads") == {(): 17}
    assert values("stallwatch_polls") == {(("target", "a"),): 3, (("target", "b"),): 5}
    assert values("stallwatch_target_state") == {
        (("state", "busy"), ("target", "a")): 1,
        (("state", "busy"), ("target", "b")): 1,
    }
    assert values("process_start_time_seconds") == {(): 90.0}
    assert values("stallwatch_build_info") == {(("version", "1.0"),): 1}
    assert values("stallwatch_probe_targets") == {(("module", "vllm"),): 6}


def test_families_travel_between_workers_unchanged() -> None:
    """A worker's families, written as JSON and read back by another, are the same data."""
    families = _worker(3, 10, 100.0, 2, 'a "quoted"\nname')
    assert families_from_json(families_json(families)) == families


def test_a_worker_that_keeps_dying_at_start_waits_longer_each_time() -> None:
    """1 s after any death of a worker that had run a minute; 1, 2, 4, … 30 s while it keeps
    dying within a minute of its start; back to 1 s once it runs a minute."""
    delays = []
    delay = 0.0
    for _ in range(8):
        delay = restart_delay(0.5, delay)
        delays.append(delay)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert restart_delay(60.0, 30.0) == 1.0
    assert restart_delay(3600.0, 0.0) == 1.0
    assert restart_delay(59.9, 1.0) == 2.0

"""The peer benchmark's rounds: their order, and how one exporter's rounds pool into one row."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.peer import PeerRun, pooled, round_order
from benchmarks.peer_exporters import PEERS


def _run(peer: str = "stallwatch", **fields: float) -> PeerRun:
    values: dict[str, object] = {
        "peer": peer,
        "targets": 2500,
        "seconds": 30.0,
        "scrapes_due": 5000,
        "scrapes": 5000,
        "failed_scrapes": 0,
        "reads": 5000,
        "p50_scrape_seconds": 0.01,
        "p99_scrape_seconds": 0.1,
        "exporter_cpu": 10.0,
        "scraper_cpu": 3.0,
        "servers_cpu": 4.0,
        "rss_bytes": 100,
        "load_mean": 1.0,
        "load_max": 1.5,
    }
    values.update(fields)
    return PeerRun(**values)  # type: ignore[arg-type]


def test_rounds_alternate_forward_and_backward() -> None:
    """Round one runs the peers in the table's order, round two in reverse, then forward."""
    assert round_order(0) == PEERS
    assert round_order(1) == tuple(reversed(PEERS))
    assert round_order(2) == PEERS


def test_cpu_per_read_pools_cpu_over_reads_not_the_rounds_mean() -> None:
    """A round with more reads weighs more: the pooled figure is total CPU over total reads."""
    one = _run(exporter_cpu=10.0, reads=5000)
    two = _run(exporter_cpu=30.0, reads=10000)
    row = pooled([one, two])
    assert row.cpu_per_read == pytest.approx(40.0 / 15000)
    assert row.rounds_cpu_per_read == (one.cpu_per_read, two.cpu_per_read)
    assert (row.reads, row.scrapes, row.seconds) == (15000, 10000, 60.0)


def test_the_worst_round_gives_p99_rss_and_load_peak() -> None:
    """Failed scrapes add up; p99, RSS and the load's peak are the worst round's; the load's
    mean is weighted by each round's time."""
    one = _run(p99_scrape_seconds=0.2, rss_bytes=300, load_max=1.0, failed_scrapes=2)
    two = _run(p99_scrape_seconds=0.1, rss_bytes=100, load_max=3.0, load_mean=3.0, seconds=90.0)
    row = pooled([one, two])
    assert (row.p99_scrape_seconds, row.rss_bytes, row.load_max) == (0.2, 300, 3.0)
    assert row.failed_scrapes == 2
    assert row.load_mean == pytest.approx((1.0 * 30 + 3.0 * 90) / 120)


def test_one_round_pools_to_itself() -> None:
    """A single round's row is that round's figures."""
    one = _run()
    assert dataclasses.replace(pooled([one]), rounds_cpu_per_read=()) == one


@pytest.mark.parametrize(
    "runs", [[], [_run("stallwatch"), _run("bare aiohttp")], [_run(), _run(targets=5000)]]
)
def test_only_one_exporters_rounds_at_one_size_pool(runs: list[PeerRun]) -> None:
    """No rounds, two exporters, or two sizes are refused, not averaged together."""
    with pytest.raises(ValueError, match="one exporter at one size"):
        pooled(runs)
